"""The SDK against a pod serving mutual TLS and requiring the cluster's token."""

import subprocess

import grpc
import numpy as np
import pytest

from conftest import REPO, Proc, binary
from elastic_ps import PsClient, PsError
from elastic_ps.security import Security

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured_pod(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secured")
    certs = tmp / "certs"
    subprocess.run([str(REPO / "scripts" / "make-certs.sh"), str(certs)], check=True,
                   capture_output=True)
    token = tmp / "token"
    token.write_text("s3cret-token\n")
    port_file = tmp / "ps.port"
    pod = Proc("ps-server", [
        binary("ps-server", "PS_SERVER_BINARY"), "--host=127.0.0.1", "--port=0",
        f"--port_file={port_file}", "--num_vshards=64", f"--tls_cert={certs}/server.crt",
        f"--tls_key={certs}/server.key", f"--tls_ca={certs}/ca.crt",
        f"--auth_token_file={token}"], tmp / "ps.log", port_file).start()
    yield pod, certs
    pod.stop()


def _security(certs, token="s3cret-token", client_cert=True):
    return Security(ca_file=str(certs / "ca.crt"),
                    cert_file=str(certs / "client.crt") if client_cert else "",
                    key_file=str(certs / "client.key") if client_cert else "",
                    auth_token=token)


def _client(pod, security):
    return PsClient(servers=[pod.address], num_vshards=64, security=security, deadline_s=2.0,
                    max_attempts=2, connect_timeout_s=3.0)


def test_tls_client_with_token_trains(secured_pod):
    pod, certs = secured_pod
    with _client(pod, _security(certs)) as ps:
        ps.create_table("secure", 4, optimizer="sgd", learning_rate=1.0, initializer="zeros")
        ps.push("secure", [1, 2], np.ones((2, 4), np.float32))
        np.testing.assert_array_equal(ps.pull("secure", [1, 2]), -np.ones((2, 4), np.float32))


def test_wrong_token_is_unauthenticated(secured_pod):
    pod, certs = secured_pod
    with pytest.raises(PsError) as err:
        with _client(pod, _security(certs, token="wrong")) as ps:
            ps.pull("secure", [1])
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_plain_text_client_is_refused(secured_pod):
    pod, _ = secured_pod
    with pytest.raises(PsError) as err:
        with _client(pod, Security(auth_token="s3cret-token")) as ps:
            ps.pull("secure", [1])
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate(secured_pod):
    pod, certs = secured_pod
    with pytest.raises(PsError) as err:
        with _client(pod, _security(certs, client_cert=False)) as ps:
            ps.pull("secure", [1])
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


def test_security_from_environment(tmp_path):
    token = tmp_path / "t"
    token.write_text("  abc \n")
    s = Security.from_env({"PS_TLS_CA": "/ca.crt", "PS_AUTH_TOKEN_FILE": str(token)})
    assert s.tls and s.ca_file == "/ca.crt" and s.auth_token == "abc"
    assert not Security.from_env({}).tls
    with pytest.raises(ValueError):
        Security(cert_file="/c.crt")  # a certificate without its key


def test_vanished_tls_files_refuse_to_connect(secured_pod, tmp_path):
    # The C++ client reads the files when it connects: a missing CA or key is an error
    # naming the file, never a plain-text channel without the token.
    pod, certs = secured_pod
    for missing in ("ca.crt", "client.key"):
        copy = tmp_path / missing.split(".")[0]
        copy.mkdir()
        for f in ("ca.crt", "client.crt", "client.key"):
            (copy / f).write_bytes((certs / f).read_bytes())
        (copy / missing).unlink()
        with pytest.raises(PsError) as err:
            _client(pod, _security(copy))
        assert err.value.code == grpc.StatusCode.NOT_FOUND and missing in err.value.message
