"""Kubernetes access of the operator and the agent: credentials (for kopf and the `kubernetes` client
alike), the typed API groups over one client, idempotent create, and status writes with optimistic
concurrency."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException

from podsnap import contract as c

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONFLICT_RETRIES = 8
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Credentials:
    """One identity against one API server: a bearer token (ServiceAccount) or client certificates.

    A token from a file (a pod's ServiceAccount token, a kubeconfig's `tokenFile`) is read again for
    every request: the kubelet replaces a projected token before it expires (the agent's is bound to
    its pod and lives about an hour), and a token read once would fail every call after that."""

    server: str
    ca_path: str | None = None
    #: a fixed token (a kubeconfig's `token`)
    static_token: str | None = None
    #: a file holding the current token, read at each use
    token_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    namespace: str = "default"

    @property
    def token(self) -> str | None:
        """The token to send now."""
        if self.token_path:
            return Path(self.token_path).read_text().strip()
        return self.static_token

    @classmethod
    def load(cls, kubeconfig: str | os.PathLike[str] | None = None) -> Credentials:
        """From a kubeconfig (its current context) if given, else from the pod's ServiceAccount."""
        if kubeconfig:
            return cls._from_kubeconfig(Path(kubeconfig))
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (SA_DIR / "token").exists():
            raise RuntimeError(
                "no Kubernetes credentials: pass --kubeconfig (or set KUBECONFIG), or run in a pod with a ServiceAccount"
            )
        ns_file = SA_DIR / "namespace"
        return cls(
            server=f"https://{host}:{port}",
            ca_path=str(SA_DIR / "ca.crt"),
            token_path=str(SA_DIR / "token"),
            namespace=ns_file.read_text().strip() if ns_file.exists() else "default",
        )

    @classmethod
    def _from_kubeconfig(cls, path: Path) -> Credentials:
        doc = yaml.safe_load(path.read_text())
        ctx_name = doc.get("current-context")
        ctx = next((x["context"] for x in doc.get("contexts", []) if x["name"] == ctx_name), None)
        if ctx is None:
            raise RuntimeError(f"{path}: current-context {ctx_name!r} not found")
        cluster = next(x["cluster"] for x in doc["clusters"] if x["name"] == ctx["cluster"])
        user = next(x["user"] for x in doc["users"] if x["name"] == ctx["user"])
        if "certificate-authority-data" in cluster or "client-certificate-data" in user:
            raise RuntimeError(f"{path}: inline *-data entries are not supported; reference files instead")
        return cls(
            server=cluster["server"],
            ca_path=cluster.get("certificate-authority"),
            static_token=user.get("token"),
            token_path=None if user.get("token") else user.get("tokenFile"),
            cert_path=user.get("client-certificate"),
            key_path=user.get("client-key"),
            namespace=ctx.get("namespace") or "default",
        )

    def connection_info(self) -> kopf.ConnectionInfo:
        # kopf calls the login handler again after a 401: it then gets the token the file holds now
        token = self.token
        return kopf.ConnectionInfo(
            server=self.server,
            ca_path=self.ca_path,
            scheme="Bearer" if token else None,
            token=token,
            certificate_path=self.cert_path,
            private_key_path=self.key_path,
            default_namespace=self.namespace,
        )

    def _refresh(self, conf: kubernetes.client.Configuration) -> None:
        conf.api_key["authorization"] = f"Bearer {self.token}"

    def api_client(self) -> kubernetes.client.ApiClient:
        conf = kubernetes.client.Configuration()
        conf.host = self.server
        conf.ssl_ca_cert = self.ca_path
        if self.token_path or self.static_token:
            conf.api_key = {"authorization": f"Bearer {self.token}"}
        if self.token_path:
            conf.refresh_api_key_hook = self._refresh  # type: ignore[assignment]  # the client declares None
        conf.cert_file = self.cert_path
        conf.key_file = self.key_path
        return kubernetes.client.ApiClient(conf)


class Kube:
    """The typed API groups one component uses, over one ApiClient."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        # typed as Any: podsnap passes plain dicts as bodies (the client accepts them) and reads results
        # through sanitize(), so the client's model types would only get in the way
        self.client: Any = client
        self.core: Any = kubernetes.client.CoreV1Api(client)
        self.apps: Any = kubernetes.client.AppsV1Api(client)
        self.batch: Any = kubernetes.client.BatchV1Api(client)
        self.custom: Any = kubernetes.client.CustomObjectsApi(client)

    def sanitize(self, obj: Any) -> dict[str, Any]:
        return dict(self.client.sanitize_for_serialization(obj))

    # --- custom objects ------------------------------------------------------------------------
    def get_cr(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            if namespace is None:
                return dict(self.custom.get_cluster_custom_object(c.GROUP, c.VERSION, plural, name))
            return dict(self.custom.get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, plural, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_cr(self, plural: str, body: dict[str, Any], namespace: str | None = None) -> tuple[dict[str, Any], bool]:
        """Create, or return the existing object of that name: (object, created)."""
        name = body["metadata"]["name"]
        try:
            if namespace is None:
                return dict(self.custom.create_cluster_custom_object(c.GROUP, c.VERSION, plural, body)), True
            return dict(self.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, namespace, plural, body)), True
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = self.get_cr(plural, name, namespace)
        if existing is None:
            raise kopf.TemporaryError(f"{plural}/{name} exists and vanished; retrying", delay=1)
        return existing, False

    def delete_cr(self, plural: str, name: str, namespace: str | None = None) -> bool:
        try:
            if namespace is None:
                self.custom.delete_cluster_custom_object(c.GROUP, c.VERSION, plural, name)
            else:
                self.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, namespace, plural, name)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def update_cr_status(
        self,
        plural: str,
        name: str,
        namespace: str | None,
        mutate: Callable[[dict[str, Any]], bool],
    ) -> dict[str, Any] | None:
        """Read, let `mutate` change `status` in place (it returns False for "nothing to do"), and write it
        back as a JSON patch guarded by the read resourceVersion (so only the `patch` verb is needed); a
        conflict re-reads and re-runs `mutate`. None when the object is gone."""
        for _ in range(CONFLICT_RETRIES):
            obj = self.get_cr(plural, name, namespace)
            if obj is None:
                return None
            had_status = "status" in obj
            obj.setdefault("status", {})
            if not mutate(obj):
                return obj
            ops = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
                {"op": "replace" if had_status else "add", "path": "/status", "value": obj["status"]},
            ]
            try:
                if namespace is None:
                    result = self.custom.patch_cluster_custom_object_status(
                        c.GROUP, c.VERSION, plural, name, ops, _content_type=JSON_PATCH
                    )
                else:
                    result = self.custom.patch_namespaced_custom_object_status(
                        c.GROUP, c.VERSION, namespace, plural, name, ops, _content_type=JSON_PATCH
                    )
                return dict(result)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                # a failed "test" op is a bare 422; it is a conflict only if the object moved on meanwhile
                fresh = self.get_cr(plural, name, namespace) if exc.status == 422 else None
                moved = fresh is None or fresh["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]
                if exc.status != 409 and not (exc.status == 422 and moved):
                    raise RuntimeError(f"writing {plural}/{name} status: {exc.status} {exc.body}") from exc
            time.sleep(0.05)
        raise kopf.TemporaryError(f"{plural}/{name}: status kept conflicting; retrying", delay=1)


def require_ns(namespace: str | None) -> str:
    if not namespace:
        raise kopf.PermanentError("a namespaced object arrived without a namespace")
    return namespace


def get_or_none(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
