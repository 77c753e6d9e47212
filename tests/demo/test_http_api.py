"""The demo worker's HTTP API against a real worker process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import DemoWorker, start_worker


def test_answers_are_deterministic_and_carry_the_init_id_and_pid(demo: DemoWorker) -> None:
    a = demo.chat("What is the capital of France?")
    b = demo.chat("What is the capital of France?")
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["choices"][0]["message"]["role"] == "assistant"
    assert a["object"] == "chat.completion"
    assert a["model"] == "podsnap-demo"
    assert a["usage"]["completion_tokens"] == 16
    assert a["podsnap"]["init_id"] == b["podsnap"]["init_id"] == demo.init_id
    assert a["podsnap"]["pid"] == demo.pid
    assert a["id"] != b["id"]


def test_different_prompts_give_different_answers(demo: DemoWorker) -> None:
    answers = {demo.chat(p)["choices"][0]["message"]["content"] for p in ("hello", "why is the sky blue", "2+2=?")}
    assert len(answers) > 1


def test_max_tokens_is_honoured(demo: DemoWorker) -> None:
    body = demo.chat("count", max_tokens=5)
    assert len(body["choices"][0]["message"]["content"].split()) == 5
    assert body["usage"]["completion_tokens"] == 5


def test_models_lists_the_served_model(demo: DemoWorker) -> None:
    status, body, headers = demo.get("/v1/models")
    assert status == 200
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["podsnap-demo"]
    assert headers["X-Podsnap-Init-Id"] == demo.init_id
    assert headers["X-Podsnap-Pid"] == str(demo.pid)


def test_health_reports_init_phases_and_a_stable_checksum(demo: DemoWorker) -> None:
    status, body, _ = demo.get("/health?checksum=1")
    assert status == 200
    assert body["status"] == "ok"
    assert body["device"] == "cpu"
    assert body["init_id"] == demo.init_id
    assert body["weights_bytes"] == 16 << 20
    assert set(body["phases_s"]) >= {"load", "warmup", "cold_start"}
    assert body["phases_s"]["cold_start"] >= body["phases_s"]["load"] > 0
    assert body["restored"] is False
    _, again, _ = demo.get("/health?checksum=1")
    assert len(body["weights_checksum"]) == 32
    assert again["weights_checksum"] == body["weights_checksum"]
    _, plain, _ = demo.get("/health")
    assert "weights_checksum" not in plain


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"[1, 2]", 400, None, "JSON object"),
        ({"messages": []}, 400, "messages", "'messages' must be a non-empty list"),
        ({"messages": [{"role": "user"}]}, 400, "messages[0]", "'messages[0]'"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens", "from 1 to 512"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}, 400, "max_tokens", "integer"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, 400, "stream", "not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "model", "'gpt-9' does not exist"),
    ],
)
def test_bad_requests_get_a_clear_error_naming_the_field(
    demo: DemoWorker, body: bytes | dict[str, object], status: int, param: str | None, message: str
) -> None:
    got, payload, _ = demo.post("/v1/chat/completions", body)
    assert got == status
    assert payload["error"]["param"] == param
    assert message in payload["error"]["message"]
    assert payload["podsnap"]["init_id"] == demo.init_id


def test_unknown_routes_are_404(demo: DemoWorker) -> None:
    status, body, _ = demo.get("/v1/completions")
    assert status == 404
    assert "no route GET /v1/completions" in body["error"]["message"]


def test_same_seed_same_answers_new_init_id_and_another_seed_changes_them(demo: DemoWorker, tmp_path: Path) -> None:
    prompt = "Tell me about checkpoints."
    reference = demo.chat(prompt)["choices"][0]["message"]["content"]
    twin = start_worker(tmp_path / "twin", ["--device", "cpu", "--no-snapshot", "--warmup-requests", "0"])
    other = start_worker(tmp_path / "other", ["--device", "cpu", "--no-snapshot", "--seed", "7"])
    try:
        assert twin.init_id != demo.init_id
        assert twin.chat(prompt)["choices"][0]["message"]["content"] == reference
        assert (
            twin.get("/health?checksum=1")[1]["weights_checksum"]
            == demo.get("/health?checksum=1")[1]["weights_checksum"]
        )
        assert (
            other.get("/health?checksum=1")[1]["weights_checksum"]
            != demo.get("/health?checksum=1")[1]["weights_checksum"]
        )
    finally:
        assert twin.stop() == 0
        other.stop()


def test_sigterm_stops_the_worker_cleanly(tmp_path: Path) -> None:
    w = start_worker(tmp_path, ["--device", "cpu", "--no-snapshot"])
    assert w.stop() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu", "--dtype", "bfloat16"], "numpy has no bfloat16"),
        (["--device", "cpu", "--compile"], "--compile needs --device cuda"),
        (["--device", "cpu", "--weights-gib", "0.0001"], "--weights-gib 0.0001 is too small"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(tmp_path: Path, args: list[str], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        start_worker(tmp_path, args)


def test_weights_file_shorter_than_the_size_is_refused(tmp_path: Path) -> None:
    short = tmp_path / "w.bin"
    short.write_bytes(os.urandom(1024))
    with pytest.raises(AssertionError, match="holds 1024 bytes"):
        start_worker(tmp_path, ["--device", "cpu", "--weights-file", str(short), "--weights-gib", "0.001"])
