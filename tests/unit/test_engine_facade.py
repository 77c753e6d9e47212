"""The engine's public surface: `__all__` is exactly what the facade exports, and importing it pulls in
neither Kubernetes nor CUDA (the agent imports it on every node, the CLI on CPU machines)."""

from __future__ import annotations

import subprocess
import sys

from podsnap import engine

EXPECTED = {
    "capture",
    "restore",
    "CaptureOptions",
    "RestoreOptions",
    "CaptureResult",
    "RestoreResult",
    "CriuOptions",
    "Progress",
    "EngineError",
    "CriuError",
    "CudaError",
    "ArtifactError",
    "CompatibilityError",
    "CaptureError",
    "RestoreError",
}


def test_all_lists_exactly_the_public_names() -> None:
    public = {n for n in vars(engine) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(engine, n)).__name__ == "module"}
    assert set(engine.__all__) == public - modules - {"annotations"}
    assert len(engine.__all__) == len(set(engine.__all__))
    assert set(engine.__all__) >= EXPECTED
    for name in engine.__all__:
        assert getattr(engine, name) is not None


def test_error_tree() -> None:
    for name in ("CriuError", "CudaError", "ArtifactError", "CompatibilityError", "CaptureError", "RestoreError"):
        assert issubclass(getattr(engine, name), engine.EngineError)
    assert issubclass(engine.EngineError, Exception)


def test_import_pulls_in_no_kubernetes_and_no_cuda() -> None:
    code = (
        "import sys, podsnap.engine, podsnap.cli; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kopf', 'cuda', 'pynvml', 'torch')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
