"""SGLang: pause generation, release memory occupation (KV cache; weights only on request), resume
memory occupation, continue generation.

Two ways in:
- `SglangAdapter(engine)`: an in-process `sglang.Engine`. Its `release_memory_occupation(tags)` and
  `resume_memory_occupation(tags)` are the calls; `Engine` has no pause of its own (generation runs
  only inside your calls), and SGLang refuses to release memory unless the scheduler is idle, so the
  controller must run between warm-up and serving, as it must anyway;
- `SglangAdapter.http("http://127.0.0.1:30000")`: a `sglang.launch_server`: POST /pause_generation,
  /release_memory_occupation, /resume_memory_occupation, /continue_generation (admin-level routes:
  pass `headers={"Authorization": "Bearer <admin key>"}` when the server has an admin API key).
Both need `--enable-memory-saver` (`enable_memory_saver=True`): SGLang then allocates through
torch_memory_saver, which keeps virtual addresses while it frees and re-maps the physical memory.

What travels in the checkpoint: by default only the tag "kv_cache" is released, so the KV cache is
neither captured nor restored and the weights stay on the GPU (captured by the CUDA checkpoint).
`release_weights=True` adds the tag "weights": start SGLang with `--enable-weights-cpu-backup`, so it
copies the weights to host memory first (CRIU captures them there) and copies them back on resume;
without that flag SGLang discards them and the restored worker would serve from garbage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

from podsnap.workload.engines._adapter import Checked, HttpAdmin, Step, method_call

CHECKED: Final = (
    Checked(
        "0.5.23",
        "contract test (tests/engines/test_contract.py) on the PyPI wheel's sources: every method, keyword, "
        "request field and HTTP route used here, read with `ast`, never imported",
    ),
)

PauseMode = Literal["abort", "retract", "in_place"]


class SglangAdapter:
    engine = "sglang"
    checked = CHECKED

    def __init__(self, engine: object, *, release_weights: bool = False, pause_mode: PauseMode = "abort") -> None:
        if pause_mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause_mode={pause_mode!r}: expected 'abort', 'retract' or 'in_place'")
        self._obj = engine
        self._http: HttpAdmin | None = None
        self.release_weights = release_weights
        self.pause_mode: PauseMode = pause_mode

    @classmethod
    def http(
        cls,
        base_url: str,
        *,
        release_weights: bool = False,
        pause_mode: PauseMode = "abort",
        timeout_s: float = 300.0,
        headers: Mapping[str, str] | None = None,
    ) -> SglangAdapter:
        adapter = cls(object(), release_weights=release_weights, pause_mode=pause_mode)
        adapter._http = HttpAdmin(base_url, timeout_s=timeout_s, headers=headers)
        return adapter

    @property
    def tags(self) -> list[str]:
        return ["kv_cache", "weights"] if self.release_weights else ["kv_cache"]

    @property
    def weights(self) -> str:
        return "host" if self.release_weights else "gpu"

    def steps(self) -> Sequence[Step]:
        if self._http is not None:
            admin = self._http
            return (
                Step(
                    admin.call("POST", "/pause_generation", body={"mode": self.pause_mode}),
                    admin.call("POST", "/continue_generation", body={}),
                ),
                Step(
                    admin.call("POST", "/release_memory_occupation", body={"tags": self.tags}),
                    admin.call("POST", "/resume_memory_occupation", body={"tags": self.tags}),
                ),
            )
        return (
            Step(
                method_call(self._obj, "release_memory_occupation", tags=self.tags),
                method_call(self._obj, "resume_memory_occupation", tags=self.tags),
            ),
        )
