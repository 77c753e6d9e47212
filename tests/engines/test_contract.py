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
from types import SimpleNamespace
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
    calls = [s.do for s in steps] + [undo for s in reversed(steps) for undo in s.undos]
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
VLLM_WEIGHTS_CALLS = [
    ("sleep", (), {"level": 2, "mode": "abort"}),
    ("wake_up", (), {"tags": ["weights"]}),
    ("collective_rpc", ("reload_weights",), {}),
    ("wake_up", (), {"tags": ["kv_cache"]}),
]


@pytest.mark.parametrize("mode", ["kv", "level1", "weights"])
@pytest.mark.parametrize("pause_mode", ["abort", "wait", "keep"])
def test_vllm_async_llm_has_every_call(sources: SourceTree, mode: str, pause_mode: str) -> None:
    calls: Calls = []
    async_llm = Recorder(sources.cls("vllm.v1.engine.async_llm", "AsyncLLM"), calls)
    run_steps(VllmAdapter(async_llm, mode=mode, pause_mode=pause_mode).steps())  # type: ignore[arg-type]
    names = [c[1] for c in calls]
    assert names[0] == "pause_generation" and names[-1] == "resume_generation"
    assert ("release_kv_cache_memory" in names) == (mode == "kv")
    assert ("collective_rpc" in names) == (mode == "weights")
    assert pause_mode in sources.literal("vllm.v1.engine", "PauseMode")


@pytest.mark.parametrize("engine", ["AsyncLLM", "LLMEngine"])
def test_vllm_weights_mode_calls_are_the_ones_vllms_own_snapshot_server_makes(sources: SourceTree, engine: str) -> None:
    """vLLM 0.33 ships its own snapshot server (vllm/snapshot/server.py) that discards and reloads the
    weights with exactly these calls, in this order: the adapter follows the engine's own recipe."""
    module = {"AsyncLLM": "vllm.v1.engine.async_llm", "LLMEngine": "vllm.v1.engine.llm_engine"}[engine]
    calls: Calls = []
    run_steps(VllmAdapter(Recorder(sources.cls(module, engine), calls), mode="weights").steps())
    assert [c[1:] for c in calls[1:-1]] == VLLM_WEIGHTS_CALLS
    _, server = sources.module("vllm.snapshot.server")
    recipe: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    for name in ("_release_reloadable_state", "_restore_reloadable_state"):
        fn = next(n for n in server.body if isinstance(n, ast.AsyncFunctionDef) and n.name == name)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                recipe.append(
                    (
                        node.func.attr,
                        tuple(ast.literal_eval(a) for a in node.args),
                        {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg},
                    )
                )
    # vLLM's server sleeps with the default mode; the adapter passes its pause mode explicitly
    assert recipe[0] == ("sleep", (), {"level": 2})
    assert recipe[1:] == VLLM_WEIGHTS_CALLS[1:]


def test_vllm_workers_reload_weights_takes_no_required_argument(sources: SourceTree) -> None:
    """`collective_rpc("reload_weights")` runs `Worker.reload_weights()` on every worker, which passes
    its arguments to the model runner's `reload_weights` (both runners: v1 and v2): none is required,
    and with none it loads from the model's own path."""
    worker = sources.cls("vllm.v1.worker.gpu_worker", "Worker")
    worker.methods["reload_weights"].signature.bind(None)
    worker_src = (sources.root / "vllm/v1/worker/gpu_worker.py").read_text()
    assert "self.model_runner.reload_weights(*args, **kwargs)" in worker_src
    for module in ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"):
        runner = sources.cls(module, "GPUModelRunner")
        runner.methods["reload_weights"].signature.bind(None)
    inplace = (sources.root / "vllm/model_executor/model_loader/reload/inplace.py").read_text()
    assert "Use path of original model if neither is provided." in inplace
    # level 2 is what discards the weights (and saves the model's buffers to host memory first)
    assert "if level == 2:" in worker_src and "self._sleep_saved_buffers" in worker_src


@pytest.mark.parametrize("mode", ["kv", "level1", "weights"])
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
    "vllm.entrypoints.serve.dev.rpc.api_router",
    "vllm.entrypoints.rl.online.api_router",
]


def _body_keys(route: Route) -> set[str]:
    """Keys a handler that parses the JSON body itself reads: `body.get("KEY")`."""
    return {
        node.args[0].value
        for node in ast.walk(route.function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "body"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


@pytest.mark.parametrize("mode", ["kv", "level1", "weights"])
def test_vllm_http_routes_exist_with_their_query_parameters(
    sources: SourceTree, http_stand_in: HttpStandIn, mode: str
) -> None:
    run_steps(VllmAdapter.http(http_stand_in.url, mode=mode).steps())  # type: ignore[arg-type]
    assert http_stand_in.requests, "the adapter made no request"
    for method, path, query, body in http_stand_in.requests:
        route = _route(sources, VLLM_ROUTERS, method, path)
        assert set(query) <= _query_names(route), f"{method} {path}: {set(query) - _query_names(route)} not read"
        if body is not None:
            assert set(body) <= _body_keys(route), f"{method} {path}: {set(body) - _body_keys(route)} not read"
    if mode == "weights":
        assert ("POST", "/collective_rpc", {}, {"method": "reload_weights"}) in http_stand_in.requests
        sleep = (sources.root / "vllm/entrypoints/serve/dev/sleep/api_router.py").read_text()
        assert "level: Annotated[int, Query(ge=0, le=2)]" in sleep, "POST /sleep no longer takes level=2"
    # the routers are mounted only in dev mode: the docs say so, the source must agree
    routers = (sources.root / "vllm/entrypoints/launchers/api_server/routers.py").read_text()
    assert "if envs.VLLM_SERVER_DEV_MODE:" in routers
    assert "register_vllm_dev_api_routers(app)" in routers and "register_rl_api_routers(app)" in routers
    dev = (sources.root / "vllm/entrypoints/serve/__init__.py").read_text()
    assert "attach_rpc_router(app)" in dev and "attach_sleep_router(app)" in dev


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


def test_sglang_engine_reload_weights_calls_and_tags(sources: SourceTree) -> None:
    calls: Calls = []
    surface = sources.cls("sglang.srt.entrypoints.engine", "Engine")
    assert "server_args" in surface.attributes, "Engine no longer holds self.server_args (the default model path)"
    engine = Recorder(surface, calls, server_args=SimpleNamespace(model_path="/models/m"))
    run_steps(SglangAdapter(engine, reload_weights=True).steps())
    assert [c[1:] for c in calls] == [
        ("release_memory_occupation", (), {"tags": ["kv_cache", "weights"]}),
        ("resume_memory_occupation", (), {"tags": ["weights"]}),
        ("update_weights_from_disk", (), {"model_path": "/models/m"}),
        ("resume_memory_occupation", (), {"tags": ["kv_cache"]}),
    ]
    known = {v for k, v in sources.constants(SGLANG_CONSTANTS).items() if k.startswith("GPU_MEMORY_TYPE_")}
    assert {t for c in calls if "tags" in c[3] for t in c[3]["tags"]} <= known
    # ServerArgs is assembled from field namespaces (msgspec.defstruct); `Model` is one and holds model_path
    assert "model_path" in sources.fields("sglang.srt.arg_groups.fields.model", "Model")
    server_args = (sources.root / "sglang/srt/server_args.py").read_text()
    assert "from sglang.srt.arg_groups.fields.model import" in server_args
    calls.clear()
    run_steps(SglangAdapter(engine, reload_weights=True, model_path="/m2", load_format="safetensors").steps())
    assert calls[2][1:] == ("update_weights_from_disk", (), {"model_path": "/m2", "load_format": "safetensors"})


def test_sglang_reports_a_failed_load_as_success_false_which_the_adapter_reads(sources: SourceTree) -> None:
    """SGLang does not raise when its loader fails: Engine returns the tokenizer manager's
    `(success, message, num_paused_requests)` and the HTTP route answers 400."""
    _, tree = sources.module("sglang.srt.managers.tokenizer_manager")
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "update_weights_from_disk")
    returns = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)]
    assert returns and all(isinstance(r.elts[0], ast.Name) and r.elts[0].id == "success" for r in returns)
    engine_src = (sources.root / "sglang/srt/entrypoints/engine.py").read_text()
    assert "self.tokenizer_manager.update_weights_from_disk(obj, None)" in engine_src
    route = _route(sources, ["sglang.srt.entrypoints.http_server"], "POST", "/update_weights_from_disk")
    assert "HTTPStatus.BAD_REQUEST" in ast.unparse(route.function)


def test_sglang_reload_over_http_fits_the_routes_and_request_types(
    sources: SourceTree, http_stand_in: HttpStandIn
) -> None:
    adapter = SglangAdapter.http(http_stand_in.url, reload_weights=True, model_path="/m", load_format="auto")
    run_steps(adapter.steps())
    assert [r[1] for r in http_stand_in.requests] == [
        "/pause_generation",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/update_weights_from_disk",
        "/resume_memory_occupation",
        "/continue_generation",
    ]
    for method, path, _query, body in http_stand_in.requests:
        _check_sglang_body(sources, method, path, body)


def _check_sglang_body(sources: SourceTree, method: str, path: str, body: Any) -> None:
    route = _route(sources, ["sglang.srt.entrypoints.http_server"], method, path)
    obj = next(a for a in route.function.args.args if a.arg == "obj")
    request_type = next(n.id for n in ast.walk(obj.annotation) if isinstance(n, ast.Name) and n.id.endswith("ReqInput"))
    fields = sources.fields(SGLANG_IO, request_type)
    assert set(body) <= set(fields), f"{path}: {set(body) - set(fields)} not fields of {request_type}"
    required = {k for k, _ in fields.items() if k not in _defaulted(sources, request_type)}
    assert required <= set(body), f"{path}: {request_type} requires {required - set(body)}"
    if "mode" in body:
        allowed = {c.value for c in ast.walk(fields["mode"]) if isinstance(c, ast.Constant)}
        assert body["mode"] in allowed


def _defaulted(sources: SourceTree, cls: str) -> set[str]:
    _, tree = sources.module(SGLANG_IO)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {
        item.target.id
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None
    }


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
        _check_sglang_body(sources, method, path, body)


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
