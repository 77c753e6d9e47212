"""podsnap.kube.tokens: a token verifies only as minted, under the key it was minted with."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.kube.env import ConfigError
from podsnap.kube.tokens import (
    CAPTURE,
    KEY_FILE,
    RESTORE,
    Claims,
    InvalidToken,
    TokenKey,
    capture_claims,
    restore_claims,
)

KEY = TokenKey(b"0123456789abcdef0123456789abcdef")
CLAIMS = Claims(RESTORE, "team-a", "main", "golden", skip_compat=True)


def pod(namespace: str, **annotations: str) -> dict[str, object]:
    return {"metadata": {"namespace": namespace, "name": "p", "annotations": annotations}}


def test_round_trip_and_claims_are_readable() -> None:
    token = KEY.mint(CLAIMS)
    assert KEY.verify(token) == CLAIMS
    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert payload["namespace"] == "team-a" and payload["skip_compat"] is True


def _claims_rewritten(token: str) -> str:
    """The same MAC over claims someone edited (another namespace)."""
    version, payload, mac = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    edited = base64.urlsafe_b64encode(json.dumps({**claims, "namespace": "team-b"}).encode()).decode().rstrip("=")
    return f"{version}.{edited}.{mac}"


def _mac_flipped(token: str) -> str:
    return token[:-2] + ("BB" if token.endswith("AA") else "AA")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda t: t.replace("v1.", "v2.", 1), "not a podsnap token"),
        (lambda t: t.rsplit(".", 1)[0], "not a podsnap token"),
        (_claims_rewritten, "not signed"),
        (_mac_flipped, "not signed"),
        (lambda t: "", "it has none"),
    ],
)
def test_any_change_is_refused(change: Callable[[str], str], why: str) -> None:
    with pytest.raises(InvalidToken, match=why):
        KEY.verify(change(KEY.mint(CLAIMS)))


def test_another_key_is_refused() -> None:
    other = TokenKey(b"fedcba9876543210fedcba9876543210")
    with pytest.raises(InvalidToken, match="not signed with this installation's key"):
        other.verify(KEY.mint(CLAIMS))


def test_pod_checks_name_what_does_not_match() -> None:
    token = KEY.mint(CLAIMS)
    ok = pod("team-a", **{c.ANNOTATION_RESTORE_TOKEN: token})
    assert restore_claims(KEY, ok, snapshot="golden", container="main").skip_compat is True
    with pytest.raises(InvalidToken, match="issued in namespace team-a, not team-b"):
        restore_claims(KEY, pod("team-b", **{c.ANNOTATION_RESTORE_TOKEN: token}), snapshot="golden", container="main")
    with pytest.raises(InvalidToken, match="for 'golden', not 'other'"):
        restore_claims(KEY, ok, snapshot="other", container="main")
    with pytest.raises(InvalidToken, match="a restore token, not a capture token"):
        capture_claims(KEY, pod("team-a", **{c.ANNOTATION_CAPTURE_TOKEN: token}), "main")
    capture = KEY.mint(Claims(CAPTURE, "team-a", "main", "job"))
    with pytest.raises(InvalidToken, match="it has none"):
        capture_claims(KEY, pod("team-a", **{c.ANNOTATION_RESTORE_TOKEN: capture}), "main")


def test_key_loading_names_the_variable_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"{c.ENV_TOKEN_KEY_DIR}=.*cannot read.*token-key Secret"):
        TokenKey.load(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"short\n")
    with pytest.raises(ConfigError, match="holds 5 bytes"):
        TokenKey.load(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"0123456789abcdef0123456789abcdef\n")
    assert TokenKey.load(tmp_path).verify(KEY.mint(CLAIMS)) == CLAIMS, "the trailing newline is not part of the key"
