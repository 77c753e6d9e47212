"""Finding 9 (issue 10): the webhook's serving certificate is renewed under a running operator (as cert-manager
and the kubelet do it: new files in the mounted Secret), and the real API server's next admission call
succeeds against the new certificate, with no restart and no moment without a listener."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from podsnap import contract as c
from podsnap.operator.webhook_server import ReloadingWebhookServer
from tests.support.operator_env import Env, snapshot_job
from tests.support.users import denied
from tests.support.waiting import wait_for
from tests.support.webhooks import validating_served_by


def replace(path: Path, data: bytes) -> None:
    """An atomic replacement, as the kubelet's swap of a Secret volume's files is."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_bytes(data)
    tmp.replace(path)


def served_der(port: int) -> bytes:
    """The certificate the server on `port` presents now (no verification: only which one it is)."""
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port), timeout=2))


def der_of(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n")


def test_renewed_certificate_is_served_and_the_api_server_calls_succeed(env: Env, ns: str, tmp_path: Path) -> None:
    cert_dir = env.operator_ctx.config.webhook_cert_dir
    old_cert, old_key = (cert_dir / "tls.crt").read_bytes(), (cert_dir / "tls.key").read_bytes()
    renewed_ca = trustme.CA()  # a renewal under a new CA: only the new certificate can satisfy the API server
    renewed = renewed_ca.issue_cert("127.0.0.1", "localhost")
    ca_file = tmp_path / "renewed-ca.crt"
    renewed_ca.cert_pem.write_to_path(str(ca_file))
    assert served_der(env.webhook_port) == der_of(old_cert)
    try:
        with validating_served_by(env.cluster, f"https://127.0.0.1:{env.webhook_port}", ca_file):
            # the API server now trusts only the renewed CA, and the operator still serves the old certificate
            exc = wait_for(
                lambda: denied(env.cluster.create, c.PLURAL_SNAPSHOT_JOBS, snapshot_job("before"), ns),
                what="a refusal for the old certificate",
            )
            assert exc.status == 500 and "x509" in str(exc.body), exc.body
            replace(cert_dir / "tls.crt", renewed.cert_chain_pems[0].bytes())
            replace(cert_dir / "tls.key", renewed.private_key_pem.bytes())
            wait_for(lambda: served_der(env.webhook_port) == der_of(renewed.cert_chain_pems[0].bytes()), what="renewal")
            created = env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("after"), ns)
            assert created["metadata"]["name"] == "after"
    finally:
        replace(cert_dir / "tls.crt", old_cert)
        replace(cert_dir / "tls.key", old_key)
        wait_for(lambda: served_der(env.webhook_port) == der_of(old_cert), what="the session's certificate again")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[ReloadingWebhookServer, int, Path, trustme.CA]]:
    """A ReloadingWebhookServer's live context behind a real TLS listener (no kopf loop, no API server)."""
    ca = trustme.CA()
    first = ca.issue_cert("127.0.0.1")
    first.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    first.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    server = ReloadingWebhookServer(certfile=tmp_path / "tls.crt", pkeyfile=tmp_path / "tls.key", addr="127.0.0.1")
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                server.live.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server, listener.getsockname()[1], tmp_path, ca
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def handshake(port: int, ca: trustme.CA) -> bytes:
    client = ssl.create_default_context()
    ca.configure_trust(client)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def test_a_half_written_renewal_keeps_the_old_certificate_serving(
    tls_server: tuple[ReloadingWebhookServer, int, Path, trustme.CA], caplog: pytest.LogCaptureFixture
) -> None:
    """Certificate replaced, key not yet: loading that pair into a live OpenSSL context would leave it
    without a usable key (every handshake fails). The server proves a pair on a scratch context first."""
    server, port, cert_dir, ca = tls_server
    old = handshake(port, ca)
    renewed = ca.issue_cert("127.0.0.1")
    replace(cert_dir / "tls.crt", renewed.cert_chain_pems[0].bytes())
    with caplog.at_level(logging.WARNING):
        assert server.check_files() is False
    assert "does not load" in caplog.text
    assert handshake(port, ca) == old, "the previous pair keeps serving"
    replace(cert_dir / "tls.key", renewed.private_key_pem.bytes())
    assert server.check_files() is True and server.reloads == 1
    assert handshake(port, ca) == der_of(renewed.cert_chain_pems[0].bytes())
    assert server.check_files() is False, "an unchanged pair is not reloaded again"
