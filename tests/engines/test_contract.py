"""Contract tests: every call, keyword, value and HTTP route each adapter uses exists in the pinned
engine's real source (the PyPI wheel's .py files, cached by hack/engines.sh, read with `ast`).

The adapters run their quiesce and resume calls against `Recorder`s built from the engine's classes,
so these tests follow the adapter code itself, not a list kept beside it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
from pathlib import Path
from typing import Any

import pytest

from podsnap.workload.engines import Step
from podsnap.workload.engines import sglang as sglang_adapter
from podsnap.workload.engines import vllm as vllm_adapter
from podsnap.workload.engines.sglang import SglangAdapter
from podsnap.workload.engines.trtllm import TrtllmAdapter
from podsnap.workload.engines.vllm import VllmAdapter
from tests.engines.apisurface import Recorder, Route, SourceTree
from tests.engines.conftest import HttpStandIn

pytestmark = pytest.mark.engines

Calls = list[tuple[str, str, tuple[Any, ...], dict[str, Any]]]


def run_steps(steps: list[Step] | tuple[Step, ...]) -> None:
    """Every quiesce call, then every undo in reverse: what the controller does on a restore."""
    calls = [s.do for s in steps] + [s.undo for s in reversed(steps) if s.undo is not None]
    for call in calls:
        result = call.fn()
        if inspect.isawaitable(result):
            asyncio.run(_await(result))


async def _await(result: Any) -> None:
    await result


def versions(engine_src: Path) -> dict[str, str]:
    lines = (engine_src / ".versions").read_text().split("\n")
    return dict(line.split()[0].split("==") for line in lines if line.strip())


def test_adapters_declare_the_versions_the_cache_holds(engine_src: Path) -> None:
    cached = versions(engine_src)
    assert [c.version for c in vllm_adapter.CHECKED] == [cached["vllm"]]
    assert [c.version for c in sglang_adapter.CHECKED] == [cached["sglang"]]


# --- vLLM -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["kv", "level1"])
@pytest.mark.parametrize("pause_mode", ["abort", "wait", "keep"])
def test_vllm_async_llm_has_every_call(sources: SourceTree, mode: str, pause_mode: str) -> None:
    calls: Calls = []
    async_llm = Recorder(sources.cls("vllm.v1.engine.async_llm", "AsyncLLM"), calls)
    run_steps(VllmAdapter(async_llm, mode=mode, pause_mode=pause_mode).steps())  # type: ignore[arg-type]
    names = [c[1] for c in calls]
    assert names[0] == "pause_generation" and names[-1] == "resume_generation"
    assert ("release_kv_cache_memory" in names) == (mode == "kv")
    assert pause_mode in sources.literal("vllm.v1.engine", "PauseMode")


@pytest.mark.parametrize("mode", ["kv", "level1"])
def test_vllm_llm_and_llm_engine_have_every_call(sources: SourceTree, mode: str) -> None:
    calls: Calls = []
    llm_engine = Recorder(sources.cls("vllm.v1.engine.llm_engine", "LLMEngine"), calls)
    llm_surface = sources.cls("vllm.entrypoints.llm", "LLM")
    assert "llm_engine" in llm_surface.attributes, "LLM no longer holds its engine as self.llm_engine"
    llm = Recorder(llm_surface, calls, llm_engine=llm_engine)
    run_steps(VllmAdapter(llm, mode=mode).steps())
    assert {c[0] for c in calls} == {"LLMEngine"}
    # level 0 pauses scheduling only; the "scheduling" tag is what wakes it (vllm/v1/engine/core.py)
    assert calls[0][1:] == ("sleep", (), {"level": 0, "mode": "abort"})
    assert calls[-1][1:] == ("wake_up", (), {"tags": ["scheduling"]})
    core = (sources.root / "vllm/v1/engine/core.py").read_text()
    assert '"scheduling" in tags' in core


def test_vllm_memory_tags_are_the_ones_the_worker_allocates_under(sources: SourceTree) -> None:
    worker = (sources.root / "vllm/v1/worker/gpu_worker.py").read_text()
    for tag in ("kv_cache", "weights"):
        assert f'_maybe_get_memory_pool_context(tag="{tag}")' in worker


def _route(sources: SourceTree, modules: list[str], method: str, path: str) -> Route:
    for module in modules:
        for route in sources.routes(module):
            if route.method == method and route.path == path:
                return route
    raise AssertionError(f"no route {method} {path} in {modules}")


def _query_names(route: Route) -> set[str]:
    """Parameters FastAPI binds from the query, plus names the handler reads from query_params itself."""
    read = {
        node.args[0].value
        for node in ast.walk(route.function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "query_params"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    return route.params | read


VLLM_ROUTERS = [
    "vllm.entrypoints.serve.dev.sleep.api_router",
    "vllm.entrypoints.rl.online.api_router",
]


@pytest.mark.parametrize("mode", ["kv", "level1"])
def test_vllm_http_routes_exist_with_their_query_parameters(
    sources: SourceTree, http_stand_in: HttpStandIn, mode: str
) -> None:
    run_steps(VllmAdapter.http(http_stand_in.url, mode=mode).steps())  # type: ignore[arg-type]
    assert http_stand_in.requests, "the adapter made no request"
    for method, path, query, body in http_stand_in.requests:
        route = _route(sources, VLLM_ROUTERS, method, path)
        assert set(query) <= _query_names(route), f"{method} {path}: {set(query) - _query_names(route)} not read"
        assert body is None
    # both routers are mounted only in dev mode: the docs say so, the source must agree
    routers = (sources.root / "vllm/entrypoints/launchers/api_server/routers.py").read_text()
    assert "if envs.VLLM_SERVER_DEV_MODE:" in routers
    assert "register_vllm_dev_api_routers(app)" in routers and "register_rl_api_routers(app)" in routers


# --- SGLang -----------------------------------------------------------------------------------
SGLANG_CONSTANTS = "sglang.srt.constants"
SGLANG_IO = "sglang.srt.managers.io_struct"


@pytest.mark.parametrize("release_weights", [False, True])
def test_sglang_engine_has_every_call_and_tag(sources: SourceTree, release_weights: bool) -> None:
    calls: Calls = []
    engine = Recorder(sources.cls("sglang.srt.entrypoints.engine", "Engine"), calls)
    adapter = SglangAdapter(engine, release_weights=release_weights)
    run_steps(adapter.steps())
    assert [c[1] for c in calls] == ["release_memory_occupation", "resume_memory_occupation"]
    known = {v for k, v in sources.constants(SGLANG_CONSTANTS).items() if k.startswith("GPU_MEMORY_TYPE_")}
    assert set(adapter.tags) <= known, f"tags {set(adapter.tags) - known} are not GPU memory types of SGLang"


@pytest.mark.parametrize("pause_mode", ["abort", "retract", "in_place"])
def test_sglang_http_routes_exist_and_bodies_fit_their_request_types(
    sources: SourceTree, http_stand_in: HttpStandIn, pause_mode: str
) -> None:
    run_steps(SglangAdapter.http(http_stand_in.url, release_weights=True, pause_mode=pause_mode).steps())  # type: ignore[arg-type]
    assert [r[1] for r in http_stand_in.requests] == [
        "/pause_generation",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/continue_generation",
    ]
    for method, path, _query, body in http_stand_in.requests:
        route = _route(sources, ["sglang.srt.entrypoints.http_server"], method, path)
        obj = next(a for a in route.function.args.args if a.arg == "obj")
        request_type = next(
            n.id for n in ast.walk(obj.annotation) if isinstance(n, ast.Name) and n.id.endswith("ReqInput")
        )
        fields = sources.fields(SGLANG_IO, request_type)
        assert set(body) <= set(fields), f"{path}: {set(body) - set(fields)} not fields of {request_type}"
        if "mode" in body:
            allowed = {c.value for c in ast.walk(fields["mode"]) if isinstance(c, ast.Constant)}
            assert body["mode"] in allowed


# --- TensorRT-LLM -----------------------------------------------------------------------------
def trtllm_sources() -> SourceTree | None:
    """TensorRT-LLM is not on PyPI; a wheel unpacked by hand into PODSNAP_TRTLLM_SRC is checked."""
    root = os.environ.get("PODSNAP_TRTLLM_SRC", "")
    return SourceTree(Path(root)) if root and (Path(root) / "tensorrt_llm").is_dir() else None


def test_trtllm_collective_rpc_and_worker_sleep_exist() -> None:
    src = trtllm_sources()
    if src is None:
        pytest.skip(
            "tensorrt-llm has no wheel on PyPI (a stub sdist only); unpack one into PODSNAP_TRTLLM_SRC to check it"
        )
    calls: Calls = []
    llm = Recorder(src.cls("tensorrt_llm.llmapi.llm", "_TorchLLM"), calls)
    run_steps(TrtllmAdapter(llm).steps())
    assert [(c[1], c[2][0]) for c in calls] == [("_collective_rpc", "sleep"), ("_collective_rpc", "wakeup")]
    worker_methods = {
        name
        for path in (src.root / "tensorrt_llm" / "executor").rglob("*.py")
        for name in ("sleep", "wakeup")
        if f"def {name}(self" in path.read_text()
    }
    assert worker_methods == {"sleep", "wakeup"}
