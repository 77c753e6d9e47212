"""The test support itself: waits fail fast on the test's own errors, and a run whose required suite
skipped entirely fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException
from tests.support.required_suites import ENV_ALLOW
from tests.support.tools import REPO
from tests.support.waiting import wait_for


def test_wait_for_raises_the_tests_own_error_at_once() -> None:
    calls = []

    def typo() -> bool:
        calls.append(1)
        return undefined_name  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(NameError):
        wait_for(typo, timeout=30, what="a typo")
    assert len(calls) == 1, "a NameError is not 'not yet': no retry, no 30 s timeout"


def test_wait_for_treats_api_and_connection_errors_as_not_yet() -> None:
    answers: list[BaseException | str] = [ApiException(status=404), ConnectionRefusedError(), "done"]

    def poll() -> str:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert wait_for(poll, timeout=30, interval=0.01) == "done"


def test_wait_for_timeout_names_what_and_the_last_thing_seen() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the answer: last='ApiException: \(404\)'"):
        wait_for(lambda: (_ for _ in ()).throw(ApiException(status=404)), timeout=0.2, interval=0.05, what="the answer")


def run_suites(tmp_path: Path, files: dict[str, str], allow: str = "") -> subprocess.CompletedProcess[str]:
    """pytest with the plugin over a throwaway tree of suites (tests/<suite>/test_*.py)."""
    for rel, text in files.items():
        path = tmp_path / "tests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV_ALLOW: allow}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.required_suites", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


SKIPS = "import pytest\n\ndef test_a():\n    pytest.skip('CRIU needs root')\n\ndef test_b():\n    pytest.skip('CRIU needs root')\n"
PASSES = "def test_ok():\n    pass\n"


def test_a_required_suite_skipped_entirely_fails_the_run_naming_it_and_why(tmp_path: Path) -> None:
    got = run_suites(tmp_path, {"engine/test_e.py": SKIPS, "unit/test_u.py": PASSES})
    assert got.returncode == 1, got.stdout
    assert "tests/engine: every test skipped: CRIU needs root (2)" in got.stdout
    assert f"{ENV_ALLOW}=engine" in got.stdout


def test_a_suite_with_one_test_run_or_an_explicit_opt_out_passes(tmp_path: Path) -> None:
    partly = run_suites(tmp_path / "a", {"engine/test_e.py": SKIPS + PASSES})
    assert partly.returncode == 0, partly.stdout
    allowed = run_suites(tmp_path / "b", {"engine/test_e.py": SKIPS}, allow="e2e,engine")
    assert allowed.returncode == 0, allowed.stdout
    other = run_suites(tmp_path / "c", {"demo/test_d.py": SKIPS})  # not a required suite
    assert other.returncode == 0, other.stdout


FAULTS = """import pytest

pytestmark = pytest.mark.fault

@pytest.mark.fault("agent killed")
def test_survived():
    pass

@pytest.mark.fault("volume full")
def test_not_survived():
    assert False

@pytest.mark.parametrize("how", ["delete", "truncate"])
def test_artifact_lost(how):
    pass

@pytest.mark.xfail(strict=True, reason="not built yet")
@pytest.mark.fault("agent absent")
def test_pending():
    assert False

def test_no_cluster():
    pytest.skip("no cluster")

@pytest.mark.fault("broken teardown")
def test_teardown_fails(broken):
    pass

@pytest.fixture
def broken():
    yield
    raise RuntimeError("teardown")
"""


def test_a_run_with_fault_tests_ends_with_the_count_of_faults_survived_naming_the_rest(tmp_path: Path) -> None:
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "test_f.py").write_text(FAULTS)
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_u.py").write_text(PASSES)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    fault(name): a fault\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.fault_count", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    line = next((x for x in got.stdout.splitlines() if x.startswith("faults survived:")), None)
    assert line == (
        "faults survived: 3 of 6 (agent killed, artifact lost [delete], artifact lost [truncate]; not survived: "
        "volume full (failed), agent absent (xfailed), broken teardown (failed); 1 not run)"
    ), got.stdout
    # a run that selects no fault test says nothing about faults
    unit = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.fault_count", "-p", "no:cacheprovider", "tests/unit"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert unit.returncode == 0 and "faults survived" not in unit.stdout, unit.stdout
