"""A pytest plugin: the run ends with a count of the faults survived.

Tests marked `fault(name)` (the e2e suite's fault tests: tests/e2e/test_faults.py, test_failures.py) are
faults the system must survive; the terminal summary says how many of those that ran passed, and names
the rest with their outcome:

    faults survived: 7 of 8 (corrupt artifact, ...; not survived: agent absent during deletion (xfailed))

A fault whose test did not run (skipped: no cluster) is counted apart. Registered in tests/conftest.py.
"""

from __future__ import annotations

import pytest

#: nodeid -> the fault's name (the marker's argument, else the test's name), for tests marked `fault`
_FAULT_NAMES: dict[str, str] = {}
#: nodeid -> passed | failed | xfailed | skipped
_FAULT_OUTCOMES: dict[str, str] = {}


def fault_name(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("fault")
    if marker is None:
        return None
    name = str(marker.args[0]) if marker.args else item.name.split("[")[0].removeprefix("test_").replace("_", " ")
    callspec = getattr(item, "callspec", None)
    return f"{name} [{callspec.id}]" if callspec is not None else name


def pytest_collection_finish(session: pytest.Session) -> None:
    # the items left after -k/-m deselection
    for item in session.items:
        name = fault_name(item)
        if name is not None:
            _FAULT_NAMES[item.nodeid] = name


def fault_outcome(report: pytest.TestReport, before: str | None) -> str | None:
    """The fault test's outcome so far, after this phase's report (a failed teardown fails a passed test)."""
    if report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else before or "skipped"
    if report.failed:
        return "failed"
    if report.when == "call":
        return "passed"
    return before


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid in _FAULT_NAMES:
        outcome = fault_outcome(report, _FAULT_OUTCOMES.get(report.nodeid))
        if outcome is not None:
            _FAULT_OUTCOMES[report.nodeid] = outcome


def faults_line(names: dict[str, str], outcomes: dict[str, str]) -> str | None:
    """`faults survived: N of M (names; not survived: name (outcome), ...)`; None when no fault test was selected."""
    if not names:
        return None
    ran = {n: o for n, o in outcomes.items() if o != "skipped" and n in names}
    survived = [names[n] for n, o in ran.items() if o == "passed"]
    others = [f"{names[n]} ({o})" for n, o in ran.items() if o != "passed"]
    detail = ", ".join(survived) or "none"
    if others:
        detail += "; not survived: " + ", ".join(others)
    skipped = len(names) - len(ran)
    if skipped:
        detail += f"; {skipped} not run"
    return f"faults survived: {len(survived)} of {len(ran)} ({detail})"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    line = faults_line(_FAULT_NAMES, _FAULT_OUTCOMES)
    if line is not None:
        terminalreporter.section("podsnap faults")
        terminalreporter.write_line(line)
