"""Shared helpers for the chart suite: the real helm binaries and a renderer."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "podsnap"
RELEASE = "podsnap"
NAMESPACE = "podsnap-system"

Docs = list[dict[str, Any]]


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], text=True, capture_output=True, check=check)


def render(helm: str, *args: str, chart: Path = CHART) -> Docs:
    proc = run_helm(helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE, *args, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args)} failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


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
