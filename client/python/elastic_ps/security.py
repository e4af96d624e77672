"""Transport security of the Python SDK: TLS, mutual TLS and the cluster's bearer token.

The same settings as the C++ ChannelSecurity (common/rpc/transport_security.h):
- `ca_file` set: TLS, the servers' certificates verified against that CA bundle.
- `cert_file` + `key_file`: the client certificate, for a cluster that requires mutual TLS.
- `server_name`: the name to check the servers' certificates for instead of the host dialed.
- `auth_token`: sent as `authorization: Bearer <token>` with every call; servers started
  with --auth_token_file refuse calls without it (UNAUTHENTICATED).

`Security.from_env()` reads the variables the Kubernetes manifests give workers:
PS_TLS_CA, PS_TLS_CERT, PS_TLS_KEY, PS_TLS_SERVER_NAME and PS_AUTH_TOKEN_FILE (a file whose
content, surrounding whitespace trimmed, is the token). PsClient and Worker use it when no
`security` is passed, so a worker configured by its environment needs no code change.

The channels are the C++ client library's (common/rpc/transport_security.h ChannelMaker),
made from these settings: a certificate file that cannot be read fails the connection
(PsError NOT_FOUND naming the file), never a plain-text fallback.
"""

import dataclasses
import os

import grpc


@dataclasses.dataclass(frozen=True)
class Security:
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    auth_token: str = ""

    @staticmethod
    def from_env(env=None):
        """The settings of PS_TLS_CA, PS_TLS_CERT, PS_TLS_KEY, PS_TLS_SERVER_NAME and
        PS_AUTH_TOKEN_FILE (all optional; none set: plain text without a token)."""
        env = os.environ if env is None else env
        token_file = env.get("PS_AUTH_TOKEN_FILE", "")
        return Security(ca_file=env.get("PS_TLS_CA", ""), cert_file=env.get("PS_TLS_CERT", ""),
                        key_file=env.get("PS_TLS_KEY", ""),
                        server_name=env.get("PS_TLS_SERVER_NAME", ""),
                        auth_token=read_token_file(token_file) if token_file else "")

    def __post_init__(self):
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs both cert_file and key_file")
        if self.cert_file and not self.ca_file:
            raise ValueError("a client certificate (mutual TLS) needs ca_file too")

    @property
    def tls(self):
        return bool(self.ca_file)


    def to_core(self):
        """The C++ ChannelSecurity (common/rpc/transport_security.h) of these settings."""
        from ._native import core

        c = core.ChannelSecurity()
        c.ca_file, c.cert_file, c.key_file = self.ca_file, self.cert_file, self.key_file
        c.server_name, c.auth_token = self.server_name, self.auth_token
        return c


def read_token_file(path):
    """The token in `path`, surrounding whitespace trimmed (the C++ ReadAuthTokenFile):
    OSError when it cannot be read, ValueError when it is empty or holds spaces."""
    from ._native import core
    from .errors import PsError

    try:
        return core.read_auth_token_file(str(path))
    except PsError as e:
        if e.code == grpc.StatusCode.INVALID_ARGUMENT:
            raise ValueError(e.message) from None
        raise OSError(e.message) from None
