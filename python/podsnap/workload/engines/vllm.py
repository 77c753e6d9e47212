"""vLLM: pause generation, release the KV cache (or sleep at level 1), wake up, resume generation.

Two ways in:
- `VllmAdapter(engine)`: the engine's Python object: `AsyncLLM` (coroutines; run the controller with
  `await controller.arun()` on the engine's loop), `LLMEngine`, or `LLM` (its `llm_engine` is used);
- `VllmAdapter.http("http://127.0.0.1:8000")`: a `vllm serve` started with VLLM_SERVER_DEV_MODE=1,
  which mounts the admin routes (/pause, /resume, /sleep, /wake_up, /release_kv_cache_memory).
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
Level 2 (weights discarded) is not offered: the restored engine would need its weights reloaded,
which is the SDK's cooperative weight path (docs/engines.md, "weights").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from podsnap.workload.engines._adapter import Checked, HttpAdmin, Step, method_call

CHECKED: Final = (
    Checked(
        "0.33.0",
        "contract test (tests/engines/test_contract.py) on the PyPI wheel's sources: every method, keyword and "
        "HTTP route used here, read with `ast`, never imported",
    ),
)

Mode = Literal["kv", "level1"]
PauseMode = Literal["abort", "wait", "keep"]


class VllmAdapter:
    engine = "vllm"
    checked = CHECKED

    def __init__(self, engine: object, *, mode: Mode = "kv", pause_mode: PauseMode = "abort") -> None:
        if mode not in ("kv", "level1"):
            raise ValueError(f"mode={mode!r}: expected 'kv' (release the KV cache only) or 'level1' (weights to host)")
        if pause_mode not in ("abort", "wait", "keep"):
            raise ValueError(f"pause_mode={pause_mode!r}: expected 'abort', 'wait' or 'keep'")
        # `LLM` holds its engine; the engine has every call used here
        self._obj = getattr(engine, "llm_engine", engine)
        self._http: HttpAdmin | None = None
        self.mode: Mode = mode
        self.pause_mode: PauseMode = pause_mode

    @classmethod
    def http(
        cls, base_url: str, *, mode: Mode = "kv", pause_mode: PauseMode = "abort", timeout_s: float = 300.0
    ) -> VllmAdapter:
        adapter = cls(object(), mode=mode, pause_mode=pause_mode)
        adapter._http = HttpAdmin(base_url, timeout_s=timeout_s)
        return adapter

    @property
    def weights(self) -> str:
        return "gpu" if self.mode == "kv" else "host"

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
        else:
            memory = Step(method_call(obj, "sleep", level=1, mode=self.pause_mode), method_call(obj, "wake_up"))
        return (pause, memory)

    def _http_steps(self, admin: HttpAdmin) -> Sequence[Step]:
        pause = Step(admin.call("POST", "/pause", query={"mode": self.pause_mode}), admin.call("POST", "/resume"))
        if self.mode == "kv":
            memory = Step(
                admin.call("POST", "/release_kv_cache_memory"),
                admin.call("POST", "/wake_up", query={"tags": ["kv_cache"]}),
            )
        else:
            memory = Step(
                admin.call("POST", "/sleep", query={"level": "1", "mode": self.pause_mode}),
                admin.call("POST", "/wake_up"),
            )
        return (pause, memory)
