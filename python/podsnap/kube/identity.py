"""Who is asking: the requester of an admission request (its `userInfo`), and this process's own name.

The API server authenticates every request and hands the webhook the result in `request.userInfo`
(username, groups, uid, extra). A ServiceAccount token that is bound to a pod (a projected token, or
one from the TokenRequest API) adds the pod it was issued for to `extra`, so a webhook can tell which
pod, and therefore which node, a request comes from. Checked against a real kube-apiserver 1.20:
a bound token's user carries `authentication.kubernetes.io/pod-name` and `.../pod-uid` (the node name
joined them only in 1.30), and a legacy Secret-based token carries neither.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SA_PREFIX = "system:serviceaccount:"
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"


def service_account_username(namespace: str, name: str) -> str:
    return f"{SA_PREFIX}{namespace}:{name}"


@dataclass(frozen=True)
class Requester:
    """An authenticated user as the API server describes it in an admission request."""

    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @classmethod
    def from_userinfo(cls, info: Mapping[str, Any] | None) -> Requester:
        info = info or {}
        extra = {str(k): [str(x) for x in (v or [])] for k, v in (info.get("extra") or {}).items()}
        return cls(
            username=str(info.get("username") or ""),
            groups=tuple(str(g) for g in info.get("groups") or ()),
            uid=str(info.get("uid") or ""),
            extra=extra,
        )

    def _one(self, key: str) -> str | None:
        values = list(self.extra.get(key) or ())
        return values[0] if len(values) == 1 and values[0] else None

    @property
    def pod_name(self) -> str | None:
        """The pod a bound ServiceAccount token was issued for; None for any other credential."""
        return self._one(EXTRA_POD_NAME)

    @property
    def pod_uid(self) -> str | None:
        return self._one(EXTRA_POD_UID)

    @property
    def service_account(self) -> tuple[str, str] | None:
        """(namespace, name) when the requester is a ServiceAccount."""
        if not self.username.startswith(SA_PREFIX):
            return None
        namespace, _, name = self.username[len(SA_PREFIX) :].partition(":")
        return (namespace, name) if namespace and name else None

    def describe(self) -> str:
        return f"user {self.username or '(anonymous)'}"


def username_from_token(token: str | None) -> str | None:
    """The `sub` of a ServiceAccount JWT (legacy or bound), read without verifying it.

    Only used to recognise this process's own requests when they come back through admission: a wrong
    answer makes the operator check its own requests like anyone else's, never the reverse.
    """
    if not token or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) and sub.startswith(SA_PREFIX) else None
