"""The webhook server, with its serving certificate reloaded in place when the files change.

cert-manager renews the certificate and the kubelet swaps the mounted Secret's files; a server that
read them once keeps presenting the old certificate until it expires, and then the API server's calls
fail TLS: new pods start cold (the pod webhook ignores failures) and podsnap objects are refused (the
validating webhook does not). kopf's own server notices changed files only by restarting its listener,
which leaves a moment with nothing listening. This one keeps the listener and its SSL context and loads
the new pair into that context: the next handshake presents the new certificate, and no connection is
refused.

Every admission request's object (and old object) is handed to the handlers with the request's own
namespace in its metadata (with_request_namespace): kopf takes its `namespace` from the object, which before
Kubernetes 1.24 holds whatever the client sent (kubectl run sends none), while the request's namespace is the
one the API server authorised.

A pair is only ever loaded into the live context after it loaded cleanly into a scratch one (a failed
load leaves an OpenSSL context without a usable key), and both loads read the same bytes: the files
are read once into an in-memory file (memfd), so a writer that replaces the certificate and the key
one after the other can never hand the live context a mismatched pair. Until a good pair appears the
old one is served, and a warning says why.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kopf

log = logging.getLogger(__name__)

#: kopf's own file watch is left with nothing to notice (its "files" are an unchanging memfd)
KOPF_FILE_CHECK_S = 3600.0


class CertificateError(ValueError):
    """The certificate and key on disk do not make a usable pair (the message says why)."""


@contextmanager
def _pem_file(data: bytes) -> Any:
    """`data` as a readable path that lives only in memory (no private key on disk, read-only root is fine)."""
    fd = os.memfd_create("podsnap-webhook-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def read_pair(cert: Path, key: Path) -> bytes:
    return cert.read_bytes() + b"\n" + key.read_bytes()


def load_pair(context: ssl.SSLContext, pem: bytes) -> None:
    """Load certificate chain + key into `context`, first proving them on a scratch context."""
    with _pem_file(pem) as path:
        scratch = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        try:
            scratch.load_cert_chain(path)
        except (ssl.SSLError, ValueError) as exc:
            raise CertificateError(str(exc)) from exc
        context.load_cert_chain(path)


def with_request_namespace(fn: Any) -> Any:
    """kopf's webhook function `fn`, given each review with `request.namespace` written over the namespace of
    its object and old object (cluster-scoped objects, which have none, are left as they are)."""

    async def served(request: Any, *args: Any, **kwargs: Any) -> Any:
        payload = request.get("request") if isinstance(request, dict) else None
        namespace = payload.get("namespace") if isinstance(payload, dict) else None
        if namespace and isinstance(payload, dict):
            for key in ("object", "oldObject"):
                obj = payload.get(key)
                if isinstance(obj, dict):
                    meta = obj.get("metadata")
                    obj["metadata"] = {**(meta if isinstance(meta, dict) else {}), "namespace": namespace}
        return await fn(request, *args, **kwargs)

    return served


class ReloadingWebhookServer(kopf.WebhookServer):
    """kopf's WebhookServer whose certificate follows `certfile`/`pkeyfile` on disk, checked every `interval`."""

    def __init__(self, *, certfile: Path, pkeyfile: Path, interval: float = 10.0, **kwargs: Any) -> None:
        self.cert_path, self.key_path, self.interval = Path(certfile), Path(pkeyfile), interval
        self.live = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        pem = read_pair(self.cert_path, self.key_path)
        load_pair(self.live, pem)  # a bad pair at start stops the operator with the reason
        self.digest = hashlib.sha256(pem).hexdigest()
        self.reloads = 0
        # kopf builds its listener from `context` and loads certfile/pkeyfile into it once; give it the same
        # pair through memfds that never change, so its own watch never restarts the listener
        self._initial = [self._frozen(self.cert_path.read_bytes()), self._frozen(self.key_path.read_bytes())]
        cert, key = (f"/proc/self/fd/{fd}" for fd in self._initial)
        super().__init__(
            context=self.live, certfile=cert, pkeyfile=key, file_check_interval=KOPF_FILE_CHECK_S, **kwargs
        )

    @staticmethod
    def _frozen(data: bytes) -> int:
        fd = os.memfd_create("podsnap-webhook-tls-initial", os.MFD_CLOEXEC)
        os.write(fd, data)
        return fd

    def check_files(self) -> bool:
        """Reload the pair if it changed; True when a new one is now served."""
        try:
            pem = read_pair(self.cert_path, self.key_path)
        except OSError as exc:
            log.warning("webhook certificate unreadable (%s); still serving the previous one", exc)
            return False
        digest = hashlib.sha256(pem).hexdigest()
        if digest == self.digest:
            return False
        try:
            load_pair(self.live, pem)
        except CertificateError as exc:
            # e.g. the certificate was replaced and the key not yet: the next check sees the finished pair
            log.warning("webhook certificate changed but does not load (%s); still serving the previous one", exc)
            return False
        self.digest = digest
        self.reloads += 1
        log.info("webhook serving certificate reloaded from %s", self.cert_path)
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check_files()

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        watcher = asyncio.create_task(self._watch())
        try:
            async for client_config in super().__call__(with_request_namespace(fn)):
                yield client_config
        finally:
            watcher.cancel()
