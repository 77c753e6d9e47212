"""Namespace users for attack tests: a ServiceAccount with exactly the Role rules a test gives it, and an API
client that authenticates as it (its token), so requests go through authentication, RBAC and admission
like any tenant's."""

from __future__ import annotations

import base64
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from podsnap.kube.client import Kube
from podsnap.kube.identity import service_account_username
from tests.support.harness import Cluster
from tests.support.waiting import wait_for


def rule(verbs: str, resources: str, group: str = "") -> dict[str, Any]:
    """`rule("create get", "pods pods/exec")`: one Role rule from space-separated words."""
    return {"apiGroups": [group], "resources": resources.split(), "verbs": verbs.split()}


def _token(cluster: Cluster, namespace: str, name: str) -> str:
    def find() -> str | None:
        for secret in cluster.kube.core.list_namespaced_secret(namespace).items:
            annotations = secret.metadata.annotations or {}
            if (
                secret.type == "kubernetes.io/service-account-token"
                and annotations.get("kubernetes.io/service-account.name") == name
                and (secret.data or {}).get("token")
            ):
                return base64.b64decode(secret.data["token"]).decode()
        return None

    return str(wait_for(find, what=f"token of {namespace}/{name}"))


def client_with_token(cluster: Cluster, token: str) -> Kube:
    admin = cluster.kube.client.configuration
    conf = kubernetes.client.Configuration()
    conf.host = admin.host
    conf.ssl_ca_cert = admin.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    return Kube(kubernetes.client.ApiClient(conf))


class User:
    """A namespace user: `grant()` replaces its Role's rules; `kube` acts as it."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.username = service_account_username(namespace, name)
        core, rbac = cluster.kube.core, kubernetes.client.RbacAuthorizationV1Api(cluster.kube.client)
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": []})
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        )
        self.kube = client_with_token(cluster, _token(cluster, namespace, name))

    def grant(self, *rules: dict[str, Any]) -> None:
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.cluster.kube.client)
        rbac.patch_namespaced_role(self.name, self.namespace, {"rules": list(rules)})
        last = rules[-1] if rules else None
        if last is not None:  # RBAC caches are updated from a watch: wait until the last rule is in force
            verb, resource = last["verbs"][0], last["resources"][0]
            group, name = last["apiGroups"][0], (last.get("resourceNames") or [""])[0]
            wait_for(
                lambda: self.can(verb, resource.split("/")[0], group, resource.partition("/")[2], name),
                what=f"{self.username} may {verb} {resource}",
            )

    def can(self, verb: str, resource: str, group: str = "", subresource: str = "", name: str = "") -> bool:
        attrs = {"namespace": self.namespace, "verb": verb, "resource": resource, "group": group}
        if subresource:
            attrs["subresource"] = subresource
        if name:
            attrs["name"] = name
        review = kubernetes.client.AuthorizationV1Api(self.kube.client).create_self_subject_access_review(
            {"spec": {"resourceAttributes": attrs}}
        )
        return bool(review.status.allowed)


def denied(call: Any, *args: Any, **kwargs: Any) -> ApiException:
    """Run an API call that must be refused; return the refusal."""
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        return exc
    raise AssertionError(f"{getattr(call, '__name__', call)} was allowed")
