"""TensorRT-LLM: put the KV cache to sleep through the engine's collective RPC, wake it on resume.

The shape follows Dynamo's TRT-LLM snapshot entrypoint (ai-dynamo/dynamo PR #9280 and its
sleep/wake handler): only the KV cache sleeps, through `LLM._collective_rpc("sleep", (["kv_cache"],))`,
which runs the worker's `sleep(sleep_tags)` on every rank; `wakeup` maps it back. TRT-LLM releases
the tagged virtual-memory allocations and keeps their addresses, so CUDA graphs stay valid. The
weights stay on the GPU and travel through the CUDA checkpoint; TRT-LLM has no generation pause,
so the controller must run after warm-up and before the worker accepts requests.

Two ways in:
- `TrtllmAdapter(llm)`: an in-process `tensorrt_llm.LLM` (PyTorch backend) built with sleep enabled
  (`enable_sleep=True` in 1.1/1.2, `sleep_config=SleepConfig()` in later versions) and an executor
  that serves collective RPC (the Ray executor in 1.2; later versions also the single-rank one);
- `TrtllmAdapter.http("http://127.0.0.1:8000")`: `trtllm-serve`'s RL control routes POST
  /release_memory and /resume_memory with `{"tags": ["kv_cache"]}`. They exist only where the server
  runs an AsyncLLM (Ray) and, in later versions, only with the RL control endpoints enabled and an
  API key (`headers={"Authorization": "Bearer <key>"}`). Experimental (docs/engines.md: 🚧).

TensorRT-LLM's wheels are not on PyPI (its sdist there is a 10 KB stub that fetches the wheel from
NVIDIA's own index at build time), so no test installs it. The calls below were checked by reading
the engine's source (commits in CHECKED), and tests/engines/test_contract.py checks them against a
wheel when one is placed in the cache by hand (PODSNAP_TRTLLM_WHEEL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from podsnap.workload.engines._adapter import Checked, HttpAdmin, Step, method_call

CHECKED: Final = (
    Checked(
        "1.2.0rc2",
        "source read (not installed): NVIDIA/TensorRT-LLM b35ac1b6 tensorrt_llm/_torch/virtual_memory.py "
        "(release_with_tag/materialize_with_tag by tag); tensorrt_llm/llmapi/llm.py 4c05a748 "
        "`_collective_rpc(method, args=(), kwargs=None, non_block=False, unique_reply_rank=None, target_ranks=None)`; "
        "executor/ray_gpu_worker.py `sleep(sleep_tags: List[str])`, `wakeup(wakeup_tags: List[str])`; "
        "ExecutorMemoryType.KV_CACHE == 'kv_cache'; serve/openai_server.py routes POST /release_memory, /resume_memory",
    ),
)

KV_CACHE_TAGS: Final = ("kv_cache",)


class TrtllmAdapter:
    engine = "trtllm"
    checked = CHECKED
    weights = "gpu"

    def __init__(self, llm: object) -> None:
        self._obj = llm
        self._http: HttpAdmin | None = None

    @classmethod
    def http(
        cls, base_url: str, *, timeout_s: float = 300.0, headers: Mapping[str, str] | None = None
    ) -> TrtllmAdapter:
        adapter = cls(object())
        adapter._http = HttpAdmin(base_url, timeout_s=timeout_s, headers=headers)
        return adapter

    def steps(self) -> Sequence[Step]:
        tags = list(KV_CACHE_TAGS)
        if self._http is not None:
            return (
                Step(
                    self._http.call("POST", "/release_memory", body={"tags": tags}),
                    self._http.call("POST", "/resume_memory", body={"tags": tags}),
                ),
            )
        return (
            Step(
                method_call(self._obj, "_collective_rpc", "sleep", args=(tags,)),
                method_call(self._obj, "_collective_rpc", "wakeup", args=(tags,)),
            ),
        )
