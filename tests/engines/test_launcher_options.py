"""The launcher's weight options build the adapter the docs describe (no server is started)."""

from __future__ import annotations

import pytest

from podsnap.workload.engines.__main__ import build_parser, command_option, make_adapter
from podsnap.workload.engines.sglang import SglangAdapter
from podsnap.workload.engines.vllm import VllmAdapter

URL = "http://127.0.0.1:1"


def test_vllm_mode_weights_builds_the_reloading_adapter() -> None:
    adapter = make_adapter(build_parser().parse_args(["vllm", "--vllm-mode", "weights"]), URL)
    assert isinstance(adapter, VllmAdapter) and adapter.weights == "released"
    names = [c.name for s in adapter.steps() for c in (s.do, *s.undos)]
    assert 'POST /collective_rpc {"method": "reload_weights"}' in names


@pytest.mark.parametrize(
    "cmd",
    [
        ["python", "-m", "sglang.launch_server", "--model-path", "/models/m", "--port", "30000"],
        ["python", "-m", "sglang.launch_server", "--model-path=/models/m"],
    ],
)
def test_sglang_reload_weights_takes_the_model_path_from_the_server_command(cmd: list[str]) -> None:
    adapter = make_adapter(build_parser().parse_args(["sglang", "--sglang-reload-weights"]), URL, cmd)
    assert isinstance(adapter, SglangAdapter)
    assert (adapter.weights, adapter.model_path) == ("released", "/models/m")


def test_sglang_model_path_option_wins_and_a_missing_path_names_the_fix() -> None:
    args = build_parser().parse_args(["sglang", "--sglang-reload-weights", "--sglang-model-path", "/local/m"])
    adapter = make_adapter(args, URL, ["sglang", "--model-path", "/models/m"])
    assert isinstance(adapter, SglangAdapter) and adapter.model_path == "/local/m"
    with pytest.raises(SystemExit, match="--sglang-model-path"):
        make_adapter(build_parser().parse_args(["sglang", "--sglang-reload-weights"]), URL, ["sglang"])


def test_release_and_reload_of_sglang_weights_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sglang", "--sglang-release-weights", "--sglang-reload-weights"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_command_option_reads_both_spellings_and_nothing_else() -> None:
    assert command_option(["x", "--model-path", "/a"], "--model-path") == "/a"
    assert command_option(["x", "--model-path=/b"], "--model-path") == "/b"
    assert command_option(["x", "--model-path-extra", "/c"], "--model-path") is None
    assert command_option(["x", "--model-path"], "--model-path") is None
