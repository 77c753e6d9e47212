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

`reload_weights=True` (start SGLang WITHOUT `--enable-weights-cpu-backup`): the tags "kv_cache" and
"weights" are released with nothing copied, so the checkpoint holds neither. On resume
`resume_memory_occupation(["weights"])` maps the weights' memory back (same addresses, no content),
`update_weights_from_disk(model_path)` loads them again in place with SGLang's own loader, then
`resume_memory_occupation(["kv_cache"])` and generation continues. The reload costs what the loader
costs (page cache or disk of the restore node). `model_path` defaults to the in-process engine's
`server_args.model_path`; the HTTP way needs it given. SGLang answers a failed load with
`success: false` (HTTP 400), which becomes an `EngineResumeError` naming the call.
`reload=` (with `reload_weights=True`) replaces `update_weights_from_disk` with the worker's own
function of no arguments, which must refill every parameter in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal

from podsnap.workload.engines._adapter import Call, Checked, HttpAdmin, Step, hook_call, method_call

CHECKED: Final = (
    Checked(
        "0.5.23",
        "contract test (tests/engines/test_contract.py) on the PyPI wheel's sources: every method, keyword, "
        "request field and HTTP route used here, read with `ast`, never imported",
    ),
)

PauseMode = Literal["abort", "retract", "in_place"]


def _succeeded(call: Call) -> Call:
    """`call`, raising when the engine answers `(False, message, ...)` instead of raising itself."""

    def fn() -> object:
        result = call.fn()
        if isinstance(result, tuple | list) and result and result[0] is False:
            detail = result[1] if len(result) > 1 else "no message"
            raise RuntimeError(f"the engine reported failure: {detail}")
        return result

    return Call(call.name, fn)


class SglangAdapter:
    engine = "sglang"
    checked = CHECKED

    def __init__(
        self,
        engine: object,
        *,
        release_weights: bool = False,
        pause_mode: PauseMode = "abort",
        reload_weights: bool = False,
        model_path: str | None = None,
        load_format: str | None = None,
        reload: Callable[[], object] | None = None,
    ) -> None:
        if pause_mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause_mode={pause_mode!r}: expected 'abort', 'retract' or 'in_place'")
        if release_weights and reload_weights:
            raise ValueError(
                "release_weights=True (weights to host, --enable-weights-cpu-backup) and reload_weights=True "
                "(weights discarded and reloaded) exclude each other: pick one"
            )
        if (reload is not None or model_path is not None or load_format is not None) and not reload_weights:
            raise ValueError("reload=, model_path= and load_format= are used only with reload_weights=True")
        if reload_weights and reload is None and model_path is None:
            server_args = getattr(engine, "server_args", None)
            model_path = getattr(server_args, "model_path", None)
            if not isinstance(model_path, str):
                raise ValueError(
                    "reload_weights=True needs model_path= (the path the server was started with, "
                    "e.g. /models/MODEL): the engine's server_args.model_path is not there to read"
                )
        self._obj = engine
        self._http: HttpAdmin | None = None
        self.release_weights = release_weights
        self.reload_weights = reload_weights
        self.model_path = model_path
        self.load_format = load_format
        self.reload = reload
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
        reload_weights: bool = False,
        model_path: str | None = None,
        load_format: str | None = None,
        reload: Callable[[], object] | None = None,
    ) -> SglangAdapter:
        if reload_weights and reload is None and model_path is None:
            raise ValueError(
                "SglangAdapter.http(..., reload_weights=True) needs model_path= (the --model-path the server was "
                "started with) or reload="
            )
        adapter = cls(
            object(),
            release_weights=release_weights,
            pause_mode=pause_mode,
            reload_weights=reload_weights,
            model_path=model_path,
            load_format=load_format,
            reload=reload,
        )
        adapter._http = HttpAdmin(base_url, timeout_s=timeout_s, headers=headers)
        return adapter

    @property
    def tags(self) -> list[str]:
        return ["kv_cache", "weights"] if self.release_weights or self.reload_weights else ["kv_cache"]

    @property
    def weights(self) -> str:
        return "host" if self.release_weights else "released" if self.reload_weights else "gpu"

    def _disk(self) -> dict[str, str]:
        """The reload request's fields: the model path, and the load format only when given."""
        assert self.model_path is not None  # the constructor found one, or reload= replaces this call
        fields = {"model_path": self.model_path}
        if self.load_format is not None:
            fields["load_format"] = self.load_format
        return fields

    def steps(self) -> Sequence[Step]:
        if self._http is not None:
            admin = self._http
            if self.reload_weights:
                memory = Step(
                    admin.call("POST", "/release_memory_occupation", body={"tags": self.tags}),
                    admin.call("POST", "/resume_memory_occupation", body={"tags": ["weights"]}),
                    then=(
                        self._reload(lambda: admin.call("POST", "/update_weights_from_disk", body=self._disk())),
                        admin.call("POST", "/resume_memory_occupation", body={"tags": ["kv_cache"]}),
                    ),
                )
            else:
                memory = Step(
                    admin.call("POST", "/release_memory_occupation", body={"tags": self.tags}),
                    admin.call("POST", "/resume_memory_occupation", body={"tags": self.tags}),
                )
            return (
                Step(
                    admin.call("POST", "/pause_generation", body={"mode": self.pause_mode}),
                    admin.call("POST", "/continue_generation", body={}),
                ),
                memory,
            )
        obj = self._obj
        if self.reload_weights:
            return (
                Step(
                    method_call(obj, "release_memory_occupation", tags=self.tags),
                    method_call(obj, "resume_memory_occupation", tags=["weights"]),
                    then=(
                        self._reload(lambda: _succeeded(method_call(obj, "update_weights_from_disk", **self._disk()))),
                        method_call(obj, "resume_memory_occupation", tags=["kv_cache"]),
                    ),
                ),
            )
        return (
            Step(
                method_call(obj, "release_memory_occupation", tags=self.tags),
                method_call(obj, "resume_memory_occupation", tags=self.tags),
            ),
        )

    def _reload(self, engine_reload: Callable[[], Call]) -> Call:
        return hook_call(self.reload, "reload") if self.reload is not None else engine_reload()
