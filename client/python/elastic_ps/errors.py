"""The exceptions of the SDK. A failed call raises PsError with the gRPC status code
(`code`, a grpc.StatusCode) and the message of the C++ client library, which raises them
through error_from_status (elastic_ps._core)."""

import grpc

_CODES = {c.value[0]: c for c in grpc.StatusCode}


class PsError(Exception):
    """A failed parameter-server call: `code` (grpc.StatusCode) and the server's message.
    `wrong_shard` is (epoch, vshard) when a pod refused ids of a vshard it does not own at
    that map epoch (read from the refusal's detail, never its text), else None."""

    wrong_shard = None

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class TableConflictError(PsError):
    """create_table / create_dense of a name that exists with a different spec."""


def error_from_status(code, message):
    """The exception for a status code (an int, google.rpc.Code) and message."""
    c = _CODES.get(int(code), grpc.StatusCode.UNKNOWN)
    cls = TableConflictError if c == grpc.StatusCode.ALREADY_EXISTS else PsError
    return cls(c, message)
