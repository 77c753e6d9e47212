"""A pytest plugin: a run fails when a required suite was selected but every one of its tests skipped.

A skip is the right answer for a test that cannot run here, and the wrong one for a whole suite in CI:
a `make test` whose e2e suite skipped because the cluster was down, or whose engine suite skipped for
want of root, proves nothing about that suite yet passes. So at the end of the run each required suite
(tests/<suite>/) that had tests selected must have run at least one of them; otherwise the run fails,
naming the suite and why its tests skipped.

A machine that cannot run a suite says so explicitly:

    PODSNAP_ALLOW_SKIPPED_SUITES=e2e,engine make test

Suites not selected at all (a path or `-m` that leaves them out) are not checked.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from pathlib import PurePosixPath

import pytest

REQUIRED_SUITES = ("chart", "engine", "operator", "e2e")
ENV_ALLOW = "PODSNAP_ALLOW_SKIPPED_SUITES"

_ran: set[str] = set()
_skipped: defaultdict[str, Counter[str]] = defaultdict(Counter)
_unrun: list[tuple[str, Counter[str]]] = []


def suite_of(nodeid: str) -> str | None:
    parts = PurePosixPath(nodeid.split("::", 1)[0]).parts
    if len(parts) >= 3 and parts[0] == "tests" and parts[1] in REQUIRED_SUITES:
        return parts[1]
    return None


def allowed() -> set[str]:
    return {s.strip() for s in os.environ.get(ENV_ALLOW, "").split(",") if s.strip()}


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    suite = suite_of(report.nodeid)
    if suite is None:
        return
    if report.skipped:
        _skipped[suite][_reason(report)] += 1
    elif report.when == "call" or report.failed:  # passed or failed, or an error in setup/teardown
        _ran.add(suite)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _unrun.clear()
    for suite in REQUIRED_SUITES:
        if suite in _skipped and suite not in _ran and suite not in allowed():
            _unrun.append((suite, _skipped[suite]))
    if _unrun and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _unrun:
        return
    terminalreporter.section("required suites that did not run", sep="=", red=True, bold=True)
    for suite, reasons in _unrun:
        why = "; ".join(f"{reason} ({n})" for reason, n in reasons.most_common(3))
        terminalreporter.line(f"tests/{suite}: every test skipped: {why}", red=True)
    names = ",".join(s for s, _ in _unrun)
    terminalreporter.line(f"fix the cause, or on a machine that cannot run them: {ENV_ALLOW}={names}")
