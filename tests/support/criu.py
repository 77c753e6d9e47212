"""The one CRIU fixture: real CRIU (>= 4, from `make setup` or PODSNAP_CRIU) as root, else a one-line skip.

Use it from a conftest with `from tests.support.criu import criu  # noqa: F401` (a pytest fixture),
or call `criu_or_skip()` where a fixture does not fit.
"""

from __future__ import annotations

import os

import pytest

from podsnap.engine import Criu, CriuError, find_binary


def criu_or_skip() -> Criu:
    if os.geteuid() != 0:
        pytest.skip("CRIU needs root")
    try:
        runner = Criu(find_binary())
        runner.version()
    except CriuError as exc:
        pytest.skip(f"CRIU unusable: {str(exc).splitlines()[0]}")
    return runner


@pytest.fixture(scope="session")
def criu() -> Criu:
    return criu_or_skip()
