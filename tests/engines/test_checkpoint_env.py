"""The checkpoint-safe environment: its content, how it merges into a container, and its docs."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import podsnap.workload.engines
from podsnap.workload.engines import checkpoint_env as se

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("engine", se.ENGINES)
def test_every_engine_gets_collectives_on_loopback_cumem_ib_and_hub_off(engine: str) -> None:
    env = se.safe_env(engine)
    assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["NCCL_CUMEM_ENABLE"] == "0"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_engine_specific_variables() -> None:
    assert se.safe_env("vllm")["VLLM_NO_USAGE_STATS"] == "1"
    assert se.safe_env("trtllm")["TLLM_NCCL_SYMMETRIC_ZERO_COPY"] == "0"
    assert "VLLM_NO_USAGE_STATS" not in se.safe_env("sglang")


def test_an_unknown_engine_is_refused_naming_the_annotation_and_choices() -> None:
    with pytest.raises(ValueError, match=r"podsnap.io/engine must be one of vllm, sglang, trtllm"):
        se.safe_env("llama.cpp")


def test_the_containers_own_entries_win_overrides_beat_defaults_and_none_opts_out() -> None:
    container = [
        {"name": "HF_HUB_OFFLINE", "value": "0"},
        {"name": "NCCL_SOCKET_IFNAME", "valueFrom": {"configMapKeyRef": {"name": "net", "key": "if"}}},
    ]
    merged = se.merge_env(
        container, se.safe_env("vllm"), overrides={"NCCL_IB_DISABLE": "0", "VLLM_NO_USAGE_STATS": None}
    )
    by_name = {e["name"]: e for e in merged}
    assert merged[:2] == container  # untouched, in place
    assert by_name["HF_HUB_OFFLINE"]["value"] == "0"
    assert "value" not in by_name["NCCL_SOCKET_IFNAME"]
    assert by_name["NCCL_IB_DISABLE"]["value"] == "0"
    assert "VLLM_NO_USAGE_STATS" not in by_name
    assert by_name["GLOO_SOCKET_IFNAME"]["value"] == "lo"
    assert [e["name"] for e in merged].count("HF_HUB_OFFLINE") == 1


def test_safe_env_module_imports_only_the_standard_library() -> None:
    """The operator's webhook imports it: it must pull in nothing of the SDK or any engine."""
    tree = ast.parse((REPO / "python/podsnap/workload/engines/checkpoint_env.py").read_text())
    imported = {
        (n.module or "").split(".")[0] if isinstance(n, ast.ImportFrom) else a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


@pytest.mark.parametrize("engine", se.ENGINES)
def test_docs_show_each_engines_table_as_the_code_has_it(engine: str) -> None:
    docs = (REPO / "docs" / "engines.md").read_text()
    assert se.table(engine) in docs, f"docs/engines.md is out of date for {engine}: paste safe_env.table({engine!r})"


def test_public_names_are_exactly_the_documented_surface() -> None:
    exported = set(podsnap.workload.engines.__all__)
    public = {n for n in dir(podsnap.workload.engines) if not n.startswith("_")}
    public -= {"checkpoint_env", "vllm", "sglang", "trtllm"}  # submodules show up once imported
    assert exported == public
