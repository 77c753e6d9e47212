"""Marks a namespace user cannot forge: which pods podsnap made capture sources, and which it shaped for
restore.

Labels, annotations and ownerReferences are all writable by whoever may create or patch pods, so none
of them can tell the agent "podsnap made this pod". A token can: an HMAC-SHA256, under a key that
only the operator and the agents hold (a Secret the chart creates and mounts into those two alone),
over what the pod is for. The operator puts one on the pod template of every capture Job
(`podsnap.io/capture-token`), its webhook puts one on every pod it shapes for restore
(`podsnap.io/restore-token`), and the agent acts on a pod only when the pod's token verifies and
names exactly what the agent is asked to do:

  capture  namespace, container, and the SnapshotJob it was made for
  restore  namespace, container, the PodSnapshot to restore, and whether the soft compatibility
           gates are skipped (set from the SnapshotPolicy, never from the pod's own annotations)

A token is readable by anyone who can read the pod, and can be copied. A capture token serves only the
PodSnapshot of its own SnapshotJob (which the SnapshotJob names after itself), so copied onto another pod
it does not make that pod capturable by any other PodSnapshot. Copied within its namespace it
gains nothing else: placing it on a pod takes create or patch rights on pods there, which already give
everything a capture or a restore could (run any image with any of the namespace's ServiceAccounts and
Secrets, replace a container's image, delete the pod), and a restore only ever reads artifacts captured
in that same namespace. Copied to another namespace it fails: the namespace is part of what is signed.

Format: `v1.<claims: base64url JSON>.<mac: base64url HMAC-SHA256(key, "podsnap.io/token/v1." + claims)>`;
the claims are readable (they say what the pod was made for) and the MAC proves who wrote them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from podsnap import contract as c
from podsnap.kube.env import ConfigError

VERSION = "v1"
DOMAIN = f"{c.GROUP}/token/{VERSION}."
KEY_FILE = "key"
#: at least 128 bits of key
MIN_KEY_BYTES = 16
#: far above any token podsnap mints (names are at most 253 characters each): a longer one is refused unread
MAX_TOKEN_CHARS = 4096

_B64URL = re.compile(r"[A-Za-z0-9_-]+")

CAPTURE = "capture"
RESTORE = "restore"


class InvalidToken(ValueError):
    """A token that is missing, malformed, not signed with podsnap's key, or for something else."""


@dataclass(frozen=True)
class Claims:
    """What a token says its pod is for."""

    kind: str
    namespace: str
    container: str
    #: capture: the SnapshotJob; restore: the PodSnapshot
    subject: str
    #: restore only: skip the soft compatibility gates (the SnapshotPolicy's skipCompatCheck)
    skip_compat: bool = False


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenKey:
    """The shared secret of the operator and the agents."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a token key needs at least {MIN_KEY_BYTES} bytes, got {len(key)}")
        self._key = key

    @classmethod
    def load(cls, directory: Path, variable: str = c.ENV_TOKEN_KEY_DIR) -> TokenKey:
        """The key in `directory/key` (the chart mounts its Secret there); ConfigError names the fix."""
        path = Path(directory) / KEY_FILE
        try:
            key = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(
                f"{variable}={directory}: cannot read {path} ({exc.strerror}); mount the chart's token-key Secret "
                "there: the operator and the agent need the same key to mark and recognise podsnap's pods"
            ) from None
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"{variable}={directory}: {path} holds {len(key)} bytes; a key needs {MIN_KEY_BYTES}")
        return cls(key)

    def _mac(self, payload: str) -> bytes:
        return hmac.new(self._key, (DOMAIN + payload).encode(), hashlib.sha256).digest()

    def mint(self, claims: Claims) -> str:
        payload = _b64(json.dumps(asdict(claims), sort_keys=True, separators=(",", ":")).encode())
        return f"{VERSION}.{payload}.{_b64(self._mac(payload))}"

    def verify(self, token: str | None) -> Claims:
        """The claims of a token podsnap signed; InvalidToken otherwise.

        Nothing of a token is parsed before its MAC verifies: the claims are read only once they are known to
        be podsnap's own (a crafted payload, say JSON nested a million deep, never reaches the parser), and a
        token longer than any podsnap mints is refused unread. Every failure is an InvalidToken, so a caller
        that handles that handles every token a user can write."""
        if not token:
            raise InvalidToken("it has none")
        if len(token) > MAX_TOKEN_CHARS:
            raise InvalidToken(f"it is {len(token)} characters long; podsnap's are under {MAX_TOKEN_CHARS}")
        parts = token.strip().split(".")
        if len(parts) != 3 or parts[0] != VERSION or not all(_B64URL.fullmatch(part) for part in parts[1:]):
            raise InvalidToken("it is not a podsnap token")
        try:
            mac = _unb64(parts[2])
        except (binascii.Error, ValueError):
            raise InvalidToken("it is not a podsnap token") from None
        if not hmac.compare_digest(mac, self._mac(parts[1])):
            raise InvalidToken("it is not signed with this installation's key")
        try:
            data: Any = json.loads(_unb64(parts[1]))
        except (binascii.Error, ValueError, RecursionError):
            raise InvalidToken("it is not a podsnap token") from None
        if not isinstance(data, dict):
            raise InvalidToken("it is not a podsnap token")
        try:
            return Claims(
                kind=str(data["kind"]),
                namespace=str(data["namespace"]),
                container=str(data["container"]),
                subject=str(data["subject"]),
                skip_compat=bool(data.get("skip_compat", False)),
            )
        except KeyError as exc:
            raise InvalidToken(f"it lacks {exc.args[0]!r}") from None


def _check(claims: Claims, *, kind: str, namespace: str, container: str, subject: str | None) -> None:
    if claims.kind != kind:
        raise InvalidToken(f"it is a {claims.kind} token, not a {kind} token")
    if claims.namespace != namespace:
        raise InvalidToken(f"it was issued in namespace {claims.namespace}, not {namespace}")
    if claims.container != container:
        raise InvalidToken(f"it is for container {claims.container!r}, not {container!r}")
    if subject is not None and claims.subject != subject:
        raise InvalidToken(f"it is for {claims.subject!r}, not {subject!r}")


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def capture_claims(key: TokenKey, pod: Mapping[str, Any], container: str, *, job: str) -> Claims:
    """The capture token of `pod`, valid for its namespace, `container` and SnapshotJob `job` (the one whose
    PodSnapshot asks for the capture: a SnapshotJob names its PodSnapshot after itself); InvalidToken says
    why not."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    claims = key.verify(_annotations(pod).get(c.ANNOTATION_CAPTURE_TOKEN))
    _check(claims, kind=CAPTURE, namespace=namespace, container=container, subject=job)
    return claims


def restore_claims(key: TokenKey, pod: Mapping[str, Any], *, snapshot: str, container: str) -> Claims:
    """The restore token of `pod`, valid for its namespace, `snapshot` and `container`."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    claims = key.verify(_annotations(pod).get(c.ANNOTATION_RESTORE_TOKEN))
    _check(claims, kind=RESTORE, namespace=namespace, container=container, subject=snapshot)
    return claims


def not_a_capture_source(namespace: str, pod: str, why: InvalidToken) -> str:
    """The condition message for a pod no SnapshotJob made a capture source."""
    return (
        f"pod {namespace}/{pod} is not a capture source podsnap made: its {c.ANNOTATION_CAPTURE_TOKEN} "
        f"is not valid ({why}); capture through a SnapshotJob or a SnapshotPolicy"
    )


def not_shaped(namespace: str, pod: str, why: InvalidToken) -> str:
    """The condition message for a restore pod podsnap's webhook did not shape."""
    return (
        f"pod {namespace}/{pod} was not shaped for restore by podsnap: its {c.ANNOTATION_RESTORE_TOKEN} "
        f"is not valid ({why}); restore pods come from a SnapshotPolicy's workload"
    )
