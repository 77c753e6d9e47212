"""The layers of `.importlinter` hold on the code, and the checker `make lint` runs catches a violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / ".importlinter"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the `podsnap` package found in `package_parent` (ahead of the installed one)."""
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter not installed: run `make setup-python`")
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(CONFIG)],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_code_keeps_every_layer() -> None:
    got = lint_imports(REPO / "python")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "0 broken" in got.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("agent/on_pod.py", "from podsnap.operator import policy", "The agent does not import the operator"),
        ("operator/policy.py", "from podsnap import engine", "The operator imports neither the engine nor the agent"),
        ("engine/_host.py", "import kubernetes", "The engine imports no Kubernetes and nothing above it"),
        ("workload/_identity.py", "import kopf", "The workload SDK imports nothing Kubernetes"),
        ("kube/events.py", "from podsnap.agent import executor", "The Kubernetes layer imports neither process"),
        (
            "agent/executor.py",
            "from podsnap.engine._criu_runner import Criu",
            "only its facade podsnap.engine is imported",
        ),
    ],
)
def test_a_planted_violation_fails_the_check(tmp_path: Path, module: str, planted: str, contract: str) -> None:
    copy = tmp_path / "podsnap"
    shutil.copytree(REPO / "python" / "podsnap", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(f"{target.read_text()}\n{planted}  # noqa\n")
    got = lint_imports(tmp_path)
    assert got.returncode != 0, got.stdout
    broken = got.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, got.stdout
