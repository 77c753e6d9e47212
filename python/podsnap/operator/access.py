"""Would the requester be allowed to do it themselves? SubjectAccessReview (authorization.k8s.io/v1, on
every supported server, 1.20 included) asks the API server's own authorizers the question for another
user, so the answer is exactly what RBAC (or any other authorizer the cluster runs) would say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import kubernetes

from podsnap.kube.client import Kube
from podsnap.kube.identity import Requester


@dataclass(frozen=True)
class Right:
    """One verb on one resource (optionally one object of it), in one namespace."""

    verb: str
    resource: str
    group: str = ""
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    def describe(self) -> str:
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.subresource:
            what += f"/{self.subresource}"
        if self.name:
            what += f" {self.name!r}"
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.verb} {what}{where}"

    def attributes(self) -> dict[str, str]:
        attrs = {"verb": self.verb, "group": self.group, "resource": self.resource}
        for key, value in (("namespace", self.namespace), ("name", self.name), ("subresource", self.subresource)):
            if value:
                attrs[key] = value
        return attrs


def allowed(kube: Kube, who: Requester, right: Right) -> bool:
    """The API server's answer for `who`; an API error propagates (the webhook then denies)."""
    body: dict[str, Any] = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who.username,
            "groups": list(who.groups),
            "extra": {k: list(v) for k, v in who.extra.items()},
            "resourceAttributes": right.attributes(),
        },
    }
    if who.uid:
        body["spec"]["uid"] = who.uid
    api: Any = kubernetes.client.AuthorizationV1Api(kube.client)  # plain dicts as bodies, as in podsnap.kube
    review = api.create_subject_access_review(body)
    status = kube.sanitize(review).get("status") or {}
    return bool(status.get("allowed")) and not status.get("denied")


def missing(kube: Kube, who: Requester, rights: list[Right]) -> list[Right]:
    """The rights of `rights` that `who` does not have, in order."""
    return [r for r in rights if not allowed(kube, who, r)]
