"""Suite-wide settings: markers, tool discovery, and the one-line skip reasons.

Markers (declared in pytest.ini, `--strict-markers` is on):
  gpu      needs an NVIDIA GPU with the CUDA checkpoint API (the lent H200)
  cluster  needs a running Kubernetes cluster with podsnap's images (KUBECONFIG or `make cluster-up`)
  slow     takes more than a few seconds; runs by default, deselect with -m "not slow"
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS_BIN = REPO / ".tools" / "bin"


def tool(name: str) -> str | None:
    """Path of a pinned tool from `make setup`, else one on PATH, else None."""
    candidate = TOOLS_BIN / name
    if candidate.exists() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def require_tool(name: str) -> str:
    path = tool(name)
    if path is None:
        pytest.skip(f"{name} not installed: run `make setup`")
    return path


def gpu_missing_reason() -> str | None:
    if not Path("/dev/nvidiactl").exists():
        return "no NVIDIA GPU on this machine (/dev/nvidiactl missing)"
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        return "cuda-bindings not installed (pip install podsnap[gpu])"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_missing_reason()
    if reason is not None:
        skip_gpu = pytest.mark.skip(reason=reason)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
