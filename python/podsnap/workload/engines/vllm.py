"""vLLM: pause generation, release the KV cache (or sleep at level 1 or 2), wake up, resume generation.

Two ways in:
- `VllmAdapter(engine)`: the engine's Python object: `AsyncLLM` (coroutines; run the controller with
  `await controller.arun()` on the engine's loop), `LLMEngine`, or `LLM` (its `llm_engine` is used);
- `VllmAdapter.http("http://127.0.0.1:8000")`: a `vllm serve` started with VLLM_SERVER_DEV_MODE=1,
  which mounts the admin routes (/pause, /resume, /sleep, /wake_up, /release_kv_cache_memory,
  /collective_rpc).
  Those routes are unauthenticated: keep the port off the Service or prefer the in-process way.
Both need `--enable-sleep-mode` (`enable_sleep_mode=True`): vLLM then allocates weights and KV cache
through its CuMem allocator, whose tagged pools are what it frees and maps back.

Modes (`mode=`):
- "kv" (default): pause, `release_kv_cache_memory()` (the KV cache's GPU memory is unmapped, weights
  stay resident), then on resume `wake_up(tags=["kv_cache"])` and resume generation. The KV cache is
  neither captured nor restored; the weights stay on the GPU and travel through the CUDA checkpoint
  (podsnap's transparent path).
- "level1": pause, `sleep(level=1)`: vLLM copies the weights into pinned host memory and discards the
  KV cache; on resume `wake_up()` copies them back. The GPU image is almost empty, so the CUDA
  checkpoint and restore are short; the weights travel in CRIU's host image instead and the wake-up
  pays the host-to-device copy. Needs host memory (and a pod memory limit) for a second copy of the
  weights during the capture.
- "weights": pause, `sleep(level=2)`: weights and KV cache are discarded (vLLM keeps only the
  model's buffers, copied to host memory). The checkpoint holds neither. On resume
  `wake_up(tags=["weights"])` maps the weights' memory back (same addresses, no content),
  `collective_rpc("reload_weights")` makes every worker load them again from the model path with
  vLLM's own loader (`Worker.reload_weights` -> `GPUModelRunner.reload_weights()`, in place), then
  `wake_up(tags=["kv_cache"])` and resume generation. This is the sequence vLLM's own snapshot
  server runs (`vllm/snapshot/server.py`, `_restore_reloadable_state`). The reload costs what the
  loader costs (page cache or disk of the restore node); the capture and the restore no longer move
  the weights at all. `reload=` replaces the reload call with the worker's own function (below).

`reload=` (mode "weights" only): a function with no arguments the adapter calls between the two
wake-ups instead of `collective_rpc("reload_weights")`; it may return an awaitable (awaited under
`arun()`). It must refill every parameter on every worker, in place: e.g.
`lambda: llm.collective_rpc("reload_weights", kwargs={"weights_path": "/local/copy"})`, or a
function sent to the workers with `LLMEngine.collective_rpc(fn)` that hands `reload_weights` an
iterator of checkpoint-format tensors (vLLM processes them into its fused layout). Its failure is an
`EngineResumeError` naming the hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Literal

from podsnap.workload.engines._adapter import Call, Checked, HttpAdmin, Step, hook_call, method_call

CHECKED: Final = (
    Checked(
        "0.33.0",
        "contract test (tests/engines/test_contract.py) on the PyPI wheel's sources: every method, keyword and "
        "HTTP route used here, read with `ast`, never imported",
    ),
)

Mode = Literal["kv", "level1", "weights"]
MODES: Final = ("kv", "level1", "weights")
PauseMode = Literal["abort", "wait", "keep"]


class VllmAdapter:
    engine = "vllm"
    checked = CHECKED

    def __init__(
        self,
        engine: object,
        *,
        mode: Mode = "kv",
        pause_mode: PauseMode = "abort",
        reload: Callable[[], object] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(
                f"mode={mode!r}: expected 'kv' (release the KV cache only), 'level1' (weights to host) "
                "or 'weights' (weights discarded and reloaded after the restore)"
            )
        if reload is not None and mode != "weights":
            raise ValueError(f"reload= is used only with mode='weights' (got mode={mode!r}): the weights stay loaded")
        if pause_mode not in ("abort", "wait", "keep"):
            raise ValueError(f"pause_mode={pause_mode!r}: expected 'abort', 'wait' or 'keep'")
        # `LLM` holds its engine; the engine has every call used here
        self._obj = getattr(engine, "llm_engine", engine)
        self._http: HttpAdmin | None = None
        self.mode: Mode = mode
        self.pause_mode: PauseMode = pause_mode
        self.reload = reload

    @classmethod
    def http(
        cls,
        base_url: str,
        *,
        mode: Mode = "kv",
        pause_mode: PauseMode = "abort",
        timeout_s: float = 300.0,
        reload: Callable[[], object] | None = None,
    ) -> VllmAdapter:
        adapter = cls(object(), mode=mode, pause_mode=pause_mode, reload=reload)
        adapter._http = HttpAdmin(base_url, timeout_s=timeout_s)
        return adapter

    @property
    def weights(self) -> str:
        return {"kv": "gpu", "level1": "host", "weights": "released"}[self.mode]

    def _reload(self, engine_reload: Call) -> Call:
        return hook_call(self.reload, "reload") if self.reload is not None else engine_reload

    def steps(self) -> Sequence[Step]:
        if self._http is not None:
            return self._http_steps(self._http)
        obj = self._obj
        if hasattr(obj, "pause_generation"):  # AsyncLLM
            pause = Step(
                method_call(obj, "pause_generation", mode=self.pause_mode, clear_cache=True),
                method_call(obj, "resume_generation"),
            )
        else:  # LLMEngine: level 0 is "pause scheduling only"; waking the "scheduling" tag resumes it
            pause = Step(
                method_call(obj, "sleep", level=0, mode=self.pause_mode),
                method_call(obj, "wake_up", tags=["scheduling"]),
            )
        if self.mode == "kv":
            memory = Step(method_call(obj, "release_kv_cache_memory"), method_call(obj, "wake_up", tags=["kv_cache"]))
        elif self.mode == "level1":
            memory = Step(method_call(obj, "sleep", level=1, mode=self.pause_mode), method_call(obj, "wake_up"))
        else:
            memory = Step(
                method_call(obj, "sleep", level=2, mode=self.pause_mode),
                method_call(obj, "wake_up", tags=["weights"]),
                then=(
                    self._reload(method_call(obj, "collective_rpc", "reload_weights")),
                    method_call(obj, "wake_up", tags=["kv_cache"]),
                ),
            )
        return (pause, memory)

    def _http_steps(self, admin: HttpAdmin) -> Sequence[Step]:
        pause = Step(admin.call("POST", "/pause", query={"mode": self.pause_mode}), admin.call("POST", "/resume"))
        if self.mode == "kv":
            memory = Step(
                admin.call("POST", "/release_kv_cache_memory"),
                admin.call("POST", "/wake_up", query={"tags": ["kv_cache"]}),
            )
        elif self.mode == "level1":
            memory = Step(
                admin.call("POST", "/sleep", query={"level": "1", "mode": self.pause_mode}),
                admin.call("POST", "/wake_up"),
            )
        else:
            memory = Step(
                admin.call("POST", "/sleep", query={"level": "2", "mode": self.pause_mode}),
                admin.call("POST", "/wake_up", query={"tags": ["weights"]}),
                then=(
                    self._reload(admin.call("POST", "/collective_rpc", body={"method": "reload_weights"})),
                    admin.call("POST", "/wake_up", query={"tags": ["kv_cache"]}),
                ),
            )
        return (pause, memory)
