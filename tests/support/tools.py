"""Where the tests find the repository and the pinned tools of `make setup`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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
