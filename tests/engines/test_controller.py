"""Behaviour of the engine controller against engine STAND-INS (tests/engines/standin.py).

The test plays the node agent on a real control dir: it waits for `ready-for-snapshot`, notes it in
the same journal the stand-in engine writes, and writes `restore-complete`. A process cannot be
restored here without CRIU, so the in-process tests take the "source released, resume" path, which
runs the same resume calls; the exit paths run in real subprocesses.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from podsnap import contract
from podsnap.workload import QuiesceError, ResumeError, SnapshotControl, SnapshotError
from podsnap.workload.engines import (
    EXIT_RESTORE_TIMEOUT,
    EngineQuiesceError,
    EngineResumeError,
    EngineSnapshot,
    OutsideConnectionError,
)
from podsnap.workload.engines.sglang import SglangAdapter
from podsnap.workload.engines.trtllm import TrtllmAdapter
from podsnap.workload.engines.vllm import VllmAdapter
from tests.engines.conftest import HttpStandIn
from tests.engines.standin import (
    EngineFault,
    Journal,
    SglangEngineStandIn,
    TrtllmLLMStandIn,
    VllmAsyncStandIn,
    VllmEngineStandIn,
)

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 30.0


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.01)


class Agent:
    """Plays the node agent in a thread: on ready-for-snapshot, journal it and release the worker."""

    def __init__(self, control_dir: Path, journal: Journal) -> None:
        self.control_dir = control_dir
        self.journal = journal
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        ready = self.control_dir / contract.FILE_READY_FOR_SNAPSHOT
        wait_for(ready.exists, "ready-for-snapshot")
        self.journal.add("agent: ready-for-snapshot")
        (self.control_dir / contract.FILE_RESTORE_CONTEXT).write_text(
            contract.RestoreContext(env={"POD_NAME": "restored-0", "POD_IP": "10.9.8.7"}).to_json()
        )
        (self.control_dir / contract.FILE_RESTORE_COMPLETE).write_text("1\n")
        self.journal.add("agent: restore-complete")

    def __enter__(self) -> Agent:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(timeout=WAIT_S)


@pytest.fixture
def control_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = tmp_path / "snapshot-control"
    d.mkdir()
    for name in ("POD_NAME", "POD_IP"):
        monkeypatch.delenv(name, raising=False)
    yield d


def no_exit(status: int) -> NoReturn:
    raise AssertionError(f"the controller exited with {status}")


def controller(adapter: object, control_dir: Path, **kw: object) -> EngineSnapshot:
    control = SnapshotControl(control_dir, poll_interval_s=0.01)
    kw.setdefault("on_source_released", "resume")
    kw.setdefault("exit", no_exit)
    # this pytest process may still hold connections other suites opened (an API server's pool):
    # the connection check is exercised in clean subprocesses below
    kw.setdefault("outside", "ignore")
    return EngineSnapshot(adapter, control=control, **kw)  # type: ignore[arg-type]


# --- order ------------------------------------------------------------------------------------
def test_vllm_quiesces_before_the_checkpoint_and_resumes_in_reverse_after_it(control_dir: Path) -> None:
    journal = Journal()
    seen: list[str] = []
    ctl = controller(
        VllmAdapter(VllmEngineStandIn(journal)),
        control_dir,
        on_restore=lambda info: seen.append(os.environ["POD_NAME"]),
    )
    with Agent(control_dir, journal):
        outcome = ctl.run()
    assert journal.events == [
        "sleep(level=0, mode='abort')",
        "release_kv_cache_memory()",
        "agent: ready-for-snapshot",
        "agent: restore-complete",
        "wake_up(tags=['kv_cache'])",
        "wake_up(tags=['scheduling'])",
    ]
    # the new pod's identity is in the environment by the time the worker's own hook runs
    assert seen == ["restored-0"]
    assert ctl.state == "resumed"
    assert list(outcome.call_seconds) == [
        "sleep(level=0, mode='abort')",
        "release_kv_cache_memory()",
        "wake_up(tags=['kv_cache'])",
        "wake_up(tags=['scheduling'])",
    ]


def test_vllm_level1_sleeps_and_wakes_everything(control_dir: Path) -> None:
    journal = Journal()
    with Agent(control_dir, journal):
        controller(VllmAdapter(VllmEngineStandIn(journal), mode="level1"), control_dir).run()
    assert journal.events == [
        "sleep(level=0, mode='abort')",
        "sleep(level=1, mode='abort')",
        "agent: ready-for-snapshot",
        "agent: restore-complete",
        "wake_up(tags=None)",
        "wake_up(tags=['scheduling'])",
    ]


def test_async_vllm_runs_on_the_engines_loop(control_dir: Path) -> None:
    journal = Journal()
    engine = VllmAsyncStandIn(journal)
    with Agent(control_dir, journal):
        asyncio.run(controller(VllmAdapter(engine, pause_mode="wait"), control_dir).arun())
    assert journal.events == [
        "pause_generation(mode='wait', clear_cache=True)",
        "release_kv_cache_memory()",
        "agent: ready-for-snapshot",
        "agent: restore-complete",
        "wake_up(tags=['kv_cache'])",
        "resume_generation()",
    ]


def test_sglang_and_trtllm_release_only_the_kv_cache_by_default(control_dir: Path) -> None:
    journal = Journal()
    with Agent(control_dir, journal):
        controller(SglangAdapter(SglangEngineStandIn(journal)), control_dir).run()
    for f in control_dir.iterdir():
        f.unlink()
    with Agent(control_dir, journal):
        controller(TrtllmAdapter(TrtllmLLMStandIn(journal)), control_dir).run()
    assert [e for e in journal.events if not e.startswith("agent")] == [
        "release_memory_occupation(tags=['kv_cache'])",
        "resume_memory_occupation(tags=['kv_cache'])",
        "_collective_rpc:sleep(['kv_cache'])",
        "_collective_rpc:wakeup(['kv_cache'])",
    ]


def test_http_admin_endpoints_are_called_in_order(control_dir: Path, http_stand_in: HttpStandIn) -> None:
    journal = Journal()
    with Agent(control_dir, journal):
        controller(SglangAdapter.http(http_stand_in.url, release_weights=True), control_dir).run()
    assert [(r[1], r[3]) for r in http_stand_in.requests] == [
        ("/pause_generation", {"mode": "abort"}),
        ("/release_memory_occupation", {"tags": ["kv_cache", "weights"]}),
        ("/resume_memory_occupation", {"tags": ["kv_cache", "weights"]}),
        ("/continue_generation", {}),
    ]


def test_without_a_control_dir_the_engine_is_not_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.ENV_CONTROL_DIR, raising=False)
    monkeypatch.delenv(contract.ENV_CONTROL_DIR_DYNAMO, raising=False)
    engine = VllmEngineStandIn()
    outcome = EngineSnapshot(VllmAdapter(engine), exit=no_exit).run()
    assert (outcome.restored, engine.journal.events) == (False, [])


# --- errors -----------------------------------------------------------------------------------
def test_a_failing_quiesce_call_names_engine_and_call_and_undoes_what_was_done(control_dir: Path) -> None:
    engine = VllmEngineStandIn(fail={"release_kv_cache_memory": EngineFault("CUDA out of memory")})
    with pytest.raises(EngineQuiesceError) as caught:
        controller(VllmAdapter(engine), control_dir).run()
    err = caught.value
    assert (err.engine, err.call, err.phase) == ("vllm", "release_kv_cache_memory()", "quiesce")
    assert isinstance(err, QuiesceError) and isinstance(err, SnapshotError)
    assert isinstance(err.__cause__, EngineFault)
    assert "vllm: release_kv_cache_memory() failed during quiesce" in str(err) and "CUDA out of memory" in str(err)
    # the pause was undone; nothing was offered for capture
    assert engine.journal.events == [
        "sleep(level=0, mode='abort')",
        "release_kv_cache_memory()",
        "wake_up(tags=['scheduling'])",
    ]
    assert not (control_dir / contract.FILE_READY_FOR_SNAPSHOT).exists()


def test_a_failing_resume_call_is_a_resume_error_naming_engine_and_call(control_dir: Path) -> None:
    journal = Journal()
    engine = TrtllmLLMStandIn(journal, fail={"_collective_rpc:wakeup": EngineFault("NCCL error")})
    with Agent(control_dir, journal), pytest.raises(EngineResumeError) as caught:
        controller(TrtllmAdapter(engine), control_dir).run()
    err = caught.value
    assert (err.engine, err.call, err.phase) == ("trtllm", "_collective_rpc('wakeup', args=(['kv_cache'],))", "resume")
    assert isinstance(err, ResumeError)


def test_an_http_error_from_the_engine_is_typed_and_names_the_route(
    control_dir: Path, http_stand_in: HttpStandIn
) -> None:
    http_stand_in.fail["/release_kv_cache_memory"] = (500, '{"error": "not sleeping-capable"}')
    with pytest.raises(EngineQuiesceError) as caught:
        controller(VllmAdapter.http(http_stand_in.url), control_dir).run()
    assert caught.value.call == "POST /release_kv_cache_memory"
    assert "HTTP 500" in str(caught.value) and "not sleeping-capable" in str(caught.value)
    assert [r[1] for r in http_stand_in.requests] == ["/pause", "/release_kv_cache_memory", "/resume"]


def test_a_coroutine_engine_under_run_is_refused_with_the_fix(control_dir: Path) -> None:
    with pytest.raises(EngineQuiesceError, match=r"arun\(\)"):
        controller(VllmAdapter(VllmAsyncStandIn()), control_dir).run()


# --- weights discarded at quiesce, reloaded at resume (vLLM mode="weights", SGLang reload_weights) ---
VLLM_WEIGHTS_RESUME = [
    "wake_up(tags=['weights'])",
    "collective_rpc:reload_weights()",
    "wake_up(tags=['kv_cache'])",
]


def test_vllm_weights_mode_discards_the_weights_and_reloads_them_after_the_checkpoint(control_dir: Path) -> None:
    journal = Journal()
    adapter = VllmAdapter(VllmEngineStandIn(journal), mode="weights")
    with Agent(control_dir, journal):
        outcome = controller(adapter, control_dir).run()
    assert journal.events == [
        "sleep(level=0, mode='abort')",
        "sleep(level=2, mode='abort')",
        "agent: ready-for-snapshot",
        "agent: restore-complete",
        *VLLM_WEIGHTS_RESUME,
        "wake_up(tags=['scheduling'])",
    ]
    assert adapter.weights == "released"
    # the reload is timed on its own: it is the cost of this mode
    assert "collective_rpc('reload_weights')" in outcome.call_seconds


def test_async_vllm_weights_mode_awaits_the_reload_on_the_engines_loop(control_dir: Path) -> None:
    journal = Journal()
    with Agent(control_dir, journal):
        asyncio.run(controller(VllmAdapter(VllmAsyncStandIn(journal), mode="weights"), control_dir).arun())
    assert [e for e in journal.events if not e.startswith("agent")] == [
        "pause_generation(mode='abort', clear_cache=True)",
        "sleep(level=2, mode='abort')",
        *VLLM_WEIGHTS_RESUME,
        "resume_generation()",
    ]


def test_a_reload_hook_replaces_the_engines_reload_between_the_two_wake_ups(control_dir: Path) -> None:
    journal = Journal()

    async def stream_weights() -> None:
        journal.add("hook: weights streamed")

    with Agent(control_dir, journal):
        outcome = asyncio.run(
            controller(
                VllmAdapter(VllmAsyncStandIn(journal), mode="weights", reload=stream_weights), control_dir
            ).arun()
        )
    resumed = journal.events[journal.events.index("agent: restore-complete") + 1 :]
    assert resumed == [
        "wake_up(tags=['weights'])",
        "hook: weights streamed",
        "wake_up(tags=['kv_cache'])",
        "resume_generation()",
    ]
    assert any(name.startswith("reload hook ") and "stream_weights" in name for name in outcome.call_seconds)


def test_an_engine_error_mid_reload_is_a_resume_error_and_nothing_after_it_runs(control_dir: Path) -> None:
    journal = Journal()
    engine = VllmEngineStandIn(journal, fail={"collective_rpc:reload_weights": EngineFault("no such file")})
    ctl = controller(VllmAdapter(engine, mode="weights"), control_dir)
    with Agent(control_dir, journal), pytest.raises(EngineResumeError) as caught:
        ctl.run()
    err = caught.value
    assert (err.engine, err.call, err.phase) == ("vllm", "collective_rpc('reload_weights')", "resume")
    assert isinstance(err, ResumeError) and isinstance(err.__cause__, EngineFault)
    assert "no such file" in str(err) and "the engine is not serving" in str(err)
    # neither the KV cache nor generation comes back on a model without weights
    assert journal.events[-2:] == ["wake_up(tags=['weights'])", "collective_rpc:reload_weights()"]
    assert ctl.state == "quiesced"


def test_a_failing_reload_hook_is_a_resume_error_naming_the_hook(control_dir: Path) -> None:
    journal = Journal()

    def stream_weights() -> None:
        raise OSError("weights file changed since the capture")

    with Agent(control_dir, journal), pytest.raises(EngineResumeError) as caught:
        controller(VllmAdapter(VllmEngineStandIn(journal), mode="weights", reload=stream_weights), control_dir).run()
    assert caught.value.call.startswith("reload hook ") and "stream_weights" in caught.value.call
    assert "weights file changed" in str(caught.value)
    assert journal.events[-1] == "wake_up(tags=['weights'])"


def test_a_failed_level2_sleep_undoes_only_the_pause_and_reloads_nothing(control_dir: Path) -> None:
    class Level2Fails(VllmEngineStandIn):
        def sleep(self, level: int = 1, mode: str = "abort") -> None:
            super().sleep(level, mode)
            if level == 2:
                raise EngineFault("sleep mode is not enabled")

    engine = Level2Fails()
    with pytest.raises(EngineQuiesceError) as caught:
        controller(VllmAdapter(engine, mode="weights"), control_dir).run()
    assert caught.value.call == "sleep(level=2, mode='abort')"
    # the weights were never released: no wake-up, no reload, only the pause is undone
    assert engine.journal.events == [
        "sleep(level=0, mode='abort')",
        "sleep(level=2, mode='abort')",
        "wake_up(tags=['scheduling'])",
    ]
    assert not (control_dir / contract.FILE_READY_FOR_SNAPSHOT).exists()


def test_a_failing_quiesce_hook_after_level2_sleep_reloads_the_weights_before_resuming(control_dir: Path) -> None:
    journal = Journal()
    control = SnapshotControl(control_dir, poll_interval_s=0.01)

    def broken_hook() -> None:
        raise RuntimeError("worker's own quiesce hook failed")

    control.on_quiesce(broken_hook)
    ctl = EngineSnapshot(
        VllmAdapter(VllmEngineStandIn(journal), mode="weights"), control=control, outside="ignore", exit=no_exit
    )
    with pytest.raises(SnapshotError):
        ctl.run()
    # the engine must not stay without weights: the whole undo ran, reload included
    assert journal.events == [
        "sleep(level=0, mode='abort')",
        "sleep(level=2, mode='abort')",
        *VLLM_WEIGHTS_RESUME,
        "wake_up(tags=['scheduling'])",
    ]


def test_a_reload_failing_while_undoing_a_failed_quiesce_hook_stops_the_undo_and_says_so(control_dir: Path) -> None:
    journal = Journal()
    control = SnapshotControl(control_dir, poll_interval_s=0.01)

    def broken_hook() -> None:
        raise RuntimeError("worker's own quiesce hook failed")

    control.on_quiesce(broken_hook)
    engine = VllmEngineStandIn(journal, fail={"collective_rpc:reload_weights": EngineFault("disk gone")})
    ctl = EngineSnapshot(VllmAdapter(engine, mode="weights"), control=control, outside="ignore", exit=no_exit)
    with pytest.raises(SnapshotError) as caught:
        ctl.run()
    # generation is not resumed on a model without weights
    assert journal.events[-1] == "collective_rpc:reload_weights()"
    assert "wake_up(tags=['scheduling'])" not in journal.events
    notes = getattr(caught.value, "__notes__", [])
    assert any("collective_rpc('reload_weights')" in n and "disk gone" in n for n in notes), notes


def test_under_arun_a_failing_undo_also_stops_and_is_noted(control_dir: Path) -> None:
    journal = Journal()
    control = SnapshotControl(control_dir, poll_interval_s=0.01)

    def broken_hook() -> None:
        raise RuntimeError("worker's own quiesce hook failed")

    control.on_quiesce(broken_hook)
    engine = VllmAsyncStandIn(journal, fail={"wake_up": EngineFault("cuMemMap failed")})
    ctl = EngineSnapshot(VllmAdapter(engine, mode="weights"), control=control, outside="ignore", exit=no_exit)
    with pytest.raises(SnapshotError) as caught:
        asyncio.run(ctl.arun())
    assert journal.events == [
        "pause_generation(mode='abort', clear_cache=True)",
        "sleep(level=2, mode='abort')",
        "wake_up(tags=['weights'])",
    ]
    assert any("wake_up(tags=['weights'])" in n for n in getattr(caught.value, "__notes__", []))


def test_sglang_reload_weights_releases_both_and_reloads_from_the_model_path(control_dir: Path) -> None:
    journal = Journal()
    adapter = SglangAdapter(SglangEngineStandIn(journal), reload_weights=True)
    with Agent(control_dir, journal):
        controller(adapter, control_dir).run()
    assert journal.events == [
        "release_memory_occupation(tags=['kv_cache', 'weights'])",
        "agent: ready-for-snapshot",
        "agent: restore-complete",
        "resume_memory_occupation(tags=['weights'])",
        "update_weights_from_disk(model_path='/models/stand-in')",
        "resume_memory_occupation(tags=['kv_cache'])",
    ]
    assert adapter.weights == "released"


def test_sglang_reporting_a_failed_load_is_a_resume_error_naming_the_call(control_dir: Path) -> None:
    journal = Journal()
    engine = SglangEngineStandIn(journal)
    engine.load_fails = "Failed to get weights iterator: no safetensors in /models/stand-in."
    with Agent(control_dir, journal), pytest.raises(EngineResumeError) as caught:
        controller(SglangAdapter(engine, reload_weights=True), control_dir).run()
    assert (caught.value.engine, caught.value.call) == (
        "sglang",
        "update_weights_from_disk(model_path='/models/stand-in')",
    )
    assert "no safetensors" in str(caught.value)
    assert journal.events[-1] == "update_weights_from_disk(model_path='/models/stand-in')"


def test_sglang_reload_over_http_in_order_and_a_400_is_typed(control_dir: Path, http_stand_in: HttpStandIn) -> None:
    journal = Journal()
    adapter = SglangAdapter.http(http_stand_in.url, reload_weights=True, model_path="/models/m")
    with Agent(control_dir, journal):
        controller(adapter, control_dir).run()
    assert [(r[1], r[3]) for r in http_stand_in.requests] == [
        ("/pause_generation", {"mode": "abort"}),
        ("/release_memory_occupation", {"tags": ["kv_cache", "weights"]}),
        ("/resume_memory_occupation", {"tags": ["weights"]}),
        ("/update_weights_from_disk", {"model_path": "/models/m"}),
        ("/resume_memory_occupation", {"tags": ["kv_cache"]}),
        ("/continue_generation", {}),
    ]
    for f in control_dir.iterdir():
        f.unlink()
    http_stand_in.requests.clear()
    http_stand_in.fail["/update_weights_from_disk"] = (400, '{"success": false, "message": "Failed to update"}')
    with Agent(control_dir, journal), pytest.raises(EngineResumeError) as caught:
        controller(
            SglangAdapter.http(http_stand_in.url, reload_weights=True, model_path="/models/m"), control_dir
        ).run()
    assert caught.value.call == 'POST /update_weights_from_disk {"model_path": "/models/m"}'
    assert "HTTP 400" in str(caught.value)
    assert http_stand_in.requests[-1][1] == "/update_weights_from_disk"


def test_vllm_weights_mode_over_http_calls_the_rpc_route_between_the_wake_ups(
    control_dir: Path, http_stand_in: HttpStandIn
) -> None:
    journal = Journal()
    with Agent(control_dir, journal):
        controller(VllmAdapter.http(http_stand_in.url, mode="weights"), control_dir).run()
    assert [(r[1], r[2], r[3]) for r in http_stand_in.requests] == [
        ("/pause", {"mode": ["abort"]}, None),
        ("/sleep", {"level": ["2"], "mode": ["abort"]}, None),
        ("/wake_up", {"tags": ["weights"]}, None),
        ("/collective_rpc", {}, {"method": "reload_weights"}),
        ("/wake_up", {"tags": ["kv_cache"]}, None),
        ("/resume", {}, None),
    ]


def test_weights_options_refuse_bad_combinations_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="mode='weights'"):
        VllmAdapter(VllmEngineStandIn(), mode="kv", reload=lambda: None)
    with pytest.raises(ValueError, match="exclude each other"):
        SglangAdapter(SglangEngineStandIn(), release_weights=True, reload_weights=True)
    with pytest.raises(ValueError, match="model_path="):
        SglangAdapter(object(), reload_weights=True)
    with pytest.raises(ValueError, match="model_path="):
        SglangAdapter.http("http://127.0.0.1:1", reload_weights=True)


# --- exits (real processes) --------------------------------------------------------------------
def start_worker(control_dir: Path, journal: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, contract.ENV_CONTROL_DIR: str(control_dir), "PYTHONPATH": f"{REPO}:{REPO / 'python'}"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.engines.standin_worker", str(journal), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_restore_that_never_comes_ends_in_a_clean_exit(control_dir: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    worker = start_worker(control_dir, journal, "0.5")
    _, err = worker.communicate(timeout=WAIT_S)
    assert worker.returncode == EXIT_RESTORE_TIMEOUT
    assert err.strip() == "podsnap: vllm: no restore within 0.5s after ready-for-snapshot; exiting"
    assert journal.read_text().split("\n")[:2] == ["sleep(level=0, mode='abort')", "release_kv_cache_memory()"]
    assert "serving" not in journal.read_text()


def test_weights_mode_keeps_the_timeout_exit_and_reloads_nothing(control_dir: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    worker = start_worker(control_dir, journal, "0.5", "weights")
    _, err = worker.communicate(timeout=WAIT_S)
    assert worker.returncode == EXIT_RESTORE_TIMEOUT
    assert err.strip() == "podsnap: vllm: no restore within 0.5s after ready-for-snapshot; exiting"
    assert journal.read_text().splitlines() == ["sleep(level=0, mode='abort')", "sleep(level=2, mode='abort')"]


def test_weights_mode_source_exits_once_its_snapshot_is_complete_without_reloading(
    control_dir: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    worker = start_worker(control_dir, journal, "-", "weights")
    wait_for((control_dir / contract.FILE_READY_FOR_SNAPSHOT).exists, "ready-for-snapshot")
    (control_dir / contract.FILE_RESTORE_COMPLETE).write_text("1\n")
    _, err = worker.communicate(timeout=WAIT_S)
    assert worker.returncode == 0
    assert err.strip() == "podsnap: vllm: snapshot complete; the source exits"
    assert journal.read_text().splitlines() == ["sleep(level=0, mode='abort')", "sleep(level=2, mode='abort')"]


def test_the_source_exits_cleanly_once_its_snapshot_is_complete(control_dir: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    worker = start_worker(control_dir, journal)
    wait_for((control_dir / contract.FILE_READY_FOR_SNAPSHOT).exists, "ready-for-snapshot")
    (control_dir / contract.FILE_RESTORE_COMPLETE).write_text("1\n")
    _, err = worker.communicate(timeout=WAIT_S)
    assert worker.returncode == 0
    assert err.strip() == "podsnap: vllm: snapshot complete; the source exits"
    # not woken up: the engine's copy lives on in the checkpoint, this process just ends
    assert journal.read_text().splitlines() == ["sleep(level=0, mode='abort')", "release_kv_cache_memory()"]


# --- outside connections -----------------------------------------------------------------------
OUTSIDE_SCRIPT = """
import socket, sys
from podsnap.workload import SnapshotControl
from podsnap.workload.engines import EngineSnapshot, OutsideConnectionError
from podsnap.workload.engines.vllm import VllmAdapter
from tests.engines.standin import VllmEngineStandIn
server = socket.socket(); server.bind(("192.0.2.1", 0)); server.listen()
client = socket.create_connection(server.getsockname()); accepted, _ = server.accept()
engine = VllmEngineStandIn()
try:
    EngineSnapshot(VllmAdapter(engine), control=SnapshotControl(sys.argv[1])).run()
except OutsideConnectionError as e:
    print(e.connections, engine.journal.events)
"""


def test_an_outside_connection_is_refused_before_anything_is_quiesced(control_dir: Path) -> None:
    """A private network namespace gives the process a non-loopback address of its own (192.0.2.1,
    TEST-NET-1, on its own lo): the connection never leaves this machine."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip for a private network namespace")
    shell = f"ip link set lo up && ip addr add 192.0.2.1/32 dev lo && exec {sys.executable} -c '{OUTSIDE_SCRIPT}' {control_dir}"
    out = subprocess.run(
        ["unshare", "--net", "sh", "-c", shell],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'python'}"},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    )
    connections, events = out.stdout.strip().split("] ")
    assert connections.startswith("['192.0.2.1:")
    assert events == "[]"
    assert not (control_dir / contract.FILE_READY_FOR_SNAPSHOT).exists()


LOOPBACK_SCRIPT = """
import socket, sys, threading, time
from pathlib import Path
from podsnap import contract
from podsnap.workload import SnapshotControl
from podsnap.workload.engines import EngineSnapshot
from podsnap.workload.engines.vllm import VllmAdapter
from tests.engines.standin import VllmEngineStandIn
control = Path(sys.argv[1])
def agent():
    while not (control / contract.FILE_READY_FOR_SNAPSHOT).exists():
        time.sleep(0.01)
    (control / contract.FILE_RESTORE_COMPLETE).write_text("1\\n")
threading.Thread(target=agent, daemon=True).start()
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
client = socket.create_connection(server.getsockname()); accepted, _ = server.accept()
engine = VllmEngineStandIn()
outcome = EngineSnapshot(VllmAdapter(engine), control=SnapshotControl(control, poll_interval_s=0.01),
                         on_source_released="resume").run()
print(outcome.restored, client.fileno() > 0, engine.journal.events)
"""


def test_loopback_connections_and_our_own_clients_are_fine(control_dir: Path) -> None:
    """In a fresh process (the default outside='fail') whose only connection is on loopback."""
    out = subprocess.run(
        [sys.executable, "-c", LOOPBACK_SCRIPT, str(control_dir)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'python'}"},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    )
    assert (control_dir / contract.FILE_READY_FOR_SNAPSHOT).exists()
    restored, client_open, events = out.stdout.strip().split(" ", 2)
    assert (restored, client_open) == ("False", "True")  # the source was released and resumed in place
    assert "sleep" in events, out.stdout


def test_outside_connection_error_is_a_quiesce_error() -> None:
    err = OutsideConnectionError("sglang", ["192.0.2.7:4222"])
    assert isinstance(err, QuiesceError) and err.engine == "sglang" and "192.0.2.7:4222" in str(err)


# --- the launcher around an unmodified engine server (real process tree) ------------------------
def test_launcher_quiesces_a_server_over_http_and_ends_the_tree_once_the_snapshot_is_complete(
    control_dir: Path, tmp_path: Path
) -> None:
    from tests.support.controlplane import free_port

    port, journal = free_port(), tmp_path / "journal"
    env = {**os.environ, contract.ENV_CONTROL_DIR: str(control_dir), "PYTHONPATH": f"{REPO}:{REPO / 'python'}"}
    server = [sys.executable, "-m", "tests.engines.standin_server", str(port), str(journal)]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "podsnap.workload.engines", "vllm", "--url", f"http://127.0.0.1:{port}", "--", *server],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for((control_dir / contract.FILE_READY_FOR_SNAPSHOT).exists, "ready-for-snapshot")
    assert journal.read_text().splitlines() == ["POST /pause?mode=abort", "POST /release_kv_cache_memory"]
    (control_dir / contract.FILE_RESTORE_COMPLETE).write_text("1\n")
    _, err = launcher.communicate(timeout=WAIT_S)
    assert launcher.returncode == 0, err
    assert "snapshot complete" in err
    # the server went with it: its port is free again
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine, a listener is not
        s.bind(("127.0.0.1", port))
        s.listen()
