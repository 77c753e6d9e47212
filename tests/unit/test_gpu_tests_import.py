"""The GPU tests run on the lent GPU machine, which has torch and the CUDA packages but no Kubernetes
client and no kopf (nothing there can reach a cluster): every module under tests/gpu must import without
them, or the whole file errors at collection there and nothing of it runs (it happened once)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.tools import REPO

BLOCKED = ("kubernetes", "kopf", "aiohttp")


def test_every_gpu_test_module_imports_without_the_kubernetes_client() -> None:
    modules = sorted(f"tests.gpu.{p.stem}" for p in (REPO / "tests" / "gpu").glob("test_*.py"))
    assert modules, "no GPU test modules found"
    code = (
        "import importlib, sys\n"
        f"for name in {BLOCKED!r}: sys.modules[name] = None\n"  # an import of it raises ImportError
        f"for m in {modules!r}: importlib.import_module(m)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
