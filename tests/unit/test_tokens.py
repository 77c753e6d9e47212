"""podsnap.kube.tokens: a token verifies only as minted, under the key it was minted with."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.kube.env import ConfigError
from podsnap.kube.tokens import (
    CAPTURE,
    DOMAIN,
    KEY_FILE,
    MAX_TOKEN_CHARS,
    RESTORE,
    VERSION,
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
        capture_claims(KEY, pod("team-a", **{c.ANNOTATION_CAPTURE_TOKEN: token}), "main", job="golden")
    capture = KEY.mint(Claims(CAPTURE, "team-a", "main", "job"))
    with pytest.raises(InvalidToken, match="it has none"):
        capture_claims(KEY, pod("team-a", **{c.ANNOTATION_RESTORE_TOKEN: capture}), "main", job="job")


def test_a_capture_token_serves_only_its_own_snapshotjob() -> None:
    """Finding 10: the SnapshotJob a capture token was minted for is checked, so a token copied onto
    another pod of the namespace does not make it capturable by any other PodSnapshot."""
    marked = pod("team-a", **{c.ANNOTATION_CAPTURE_TOKEN: KEY.mint(Claims(CAPTURE, "team-a", "main", "job"))})
    assert capture_claims(KEY, marked, "main", job="job").subject == "job"
    with pytest.raises(InvalidToken, match="it is for 'job', not 'steal'"):
        capture_claims(KEY, marked, "main", job="steal")


def _signed(payload: bytes, key: TokenKey = KEY) -> str:
    """A token with a valid MAC over any payload: what only a holder of the key could write."""
    body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    mac = hmac.new(key._key, (DOMAIN + body).encode(), hashlib.sha256).digest()
    return f"{VERSION}.{body}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


@pytest.mark.parametrize(
    "payload",
    [b"[" * 1400 + b"]" * 1400, b"\xff\xfe not json", b"[1, 2]"],
    ids=["nested-deeper-than-the-parser-recurses", "not-utf8", "not-an-object"],
)
def test_any_payload_is_invalid_token_never_another_error(payload: bytes) -> None:
    """Finding 10: a payload JSON cannot parse (nested deeper than the parser's recursion) was a RecursionError,
    which escaped every caller's `except InvalidToken` (the pod webhook admitted the pod unshaped; the agent's
    handler was retried forever). Whatever a token holds, verify raises InvalidToken."""
    if payload.startswith(b"[["):
        with pytest.raises(RecursionError):
            json.loads(payload)  # what the parser does with it
    forged = KEY.mint(CLAIMS).split(".")
    forged[1] = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    with pytest.raises(InvalidToken, match="not signed"):
        KEY.verify(".".join(forged))  # a forged MAC: refused before the payload is parsed
    token = _signed(payload)
    assert len(token) < MAX_TOKEN_CHARS
    with pytest.raises(InvalidToken, match="not a podsnap token"):
        KEY.verify(token)  # even signed with the key: parsed, and refused as InvalidToken


def test_a_huge_token_with_a_forged_mac_is_refused_before_any_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A megabyte of payload is neither decoded nor parsed: the size cap refuses it first, and under the cap a
    forged MAC is refused before json sees a byte."""
    parsed: list[object] = []
    real = json.loads

    def recording(*args: object, **kwargs: object) -> object:
        parsed.append(args[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("podsnap.kube.tokens.json.loads", recording)
    huge = f"{VERSION}.{'W' * 1_000_000}.{'A' * 43}"
    with pytest.raises(InvalidToken, match=f"podsnap's are under {MAX_TOKEN_CHARS}"):
        KEY.verify(huge)
    nested = base64.urlsafe_b64encode(b"[" * 1400 + b"]" * 1400).rstrip(b"=").decode()
    with pytest.raises(InvalidToken, match="not signed"):
        KEY.verify(f"{VERSION}.{nested}.{'A' * 43}")
    assert parsed == []
    with pytest.raises(InvalidToken, match="not a podsnap token"):
        KEY.verify(f"{VERSION}.{nested[:100]}\ud800.{'A' * 43}")  # no character outside base64url gets through


def test_key_loading_names_the_variable_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"{c.ENV_TOKEN_KEY_DIR}=.*cannot read.*token-key Secret"):
        TokenKey.load(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"short\n")
    with pytest.raises(ConfigError, match="holds 5 bytes"):
        TokenKey.load(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"0123456789abcdef0123456789abcdef\n")
    assert TokenKey.load(tmp_path).verify(KEY.mint(CLAIMS)) == CLAIMS, "the trailing newline is not part of the key"
