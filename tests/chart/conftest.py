"""Shared fixtures of the chart suite: the real helm binaries, the values scenarios, one render of the
whole matrix per session (timed), and figures printed at the end of the run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import yaml

from tests.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "podsnap"
RELEASE = "podsnap"
NAMESPACE = "podsnap-system"
SCENARIOS = sorted(p.stem.removesuffix("-values") for p in (CHART / "ci").glob("*-values.yaml"))
SNAPSHOTS = sorted((Path(__file__).parent / "upgrade-snapshots").glob("*.yaml"))


def load_hack(name: str) -> ModuleType:
    """A generator script of hack/ as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "hack" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


DOCS = load_hack("chart_docs")

Doc = dict[str, Any]
Docs = list[Doc]

#: figures the suite reports at the end (render time of the matrix, counts)
FIGURES: dict[str, str] = {}

T = TypeVar("T")
R = TypeVar("R")


def parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """fn over items in threads: each call waits on a helm/kubectl process, so a few overlap well."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(fn, items))


def run(argv: list[str], check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, capture_output=True, check=check, timeout=timeout)


def scenario_file(name: str) -> Path:
    return CHART / "ci" / f"{name}-values.yaml"


def render(helm: str, *args: str, chart: Path = CHART) -> Docs:
    proc = run([helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE, *args], check=False)
    if proc.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args)} failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_error(helm: str, *args: str) -> str:
    """stderr of a render that must fail."""
    proc = run([helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args], check=False)
    assert proc.returncode != 0, f"helm template {' '.join(args)} should have failed, rendered:\n{proc.stdout[:2000]}"
    return proc.stderr


def find(docs: Docs, kind: str, name: str | None = None) -> Doc:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in hits]}"
    return hits[0]


def kinds(docs: Docs) -> list[str]:
    return sorted(d["kind"] for d in docs)


def container(doc: Doc, name: str) -> Doc:
    spec = doc["spec"]["template"]["spec"]
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        if c["name"] == name:
            return dict(c)
    raise AssertionError(f"no container {name} in {doc['kind']} {doc['metadata']['name']}")


def env_of(c: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@pytest.fixture(scope="session")
def helm() -> str:
    return require_tool("helm")


@pytest.fixture(scope="session")
def helm3() -> str:
    return require_tool("helm3")


@pytest.fixture(scope="session")
def helm_template(helm: str) -> Callable[..., Docs]:
    def template(*args: str) -> Docs:
        return render(helm, *args)

    return template


@pytest.fixture(scope="session")
def matrix(helm: str) -> dict[str, Docs]:
    """Every ci/ scenario rendered once with Helm 4; the wall time is reported at the end."""
    start = time.monotonic()
    out = dict(zip(SCENARIOS, parallel(lambda n: render(helm, "-f", str(scenario_file(n))), SCENARIOS), strict=True))
    elapsed = time.monotonic() - start
    objects = sum(len(d) for d in out.values())
    FIGURES["render matrix (helm 4)"] = f"{len(out)} scenarios, {objects} objects in {elapsed:.2f} s"
    return out


@pytest.fixture(scope="session")
def default_docs(matrix: dict[str, Docs]) -> Docs:
    return matrix["default"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("podsnap chart figures")
        for key, value in FIGURES.items():
            terminalreporter.write_line(f"{key}: {value}")
