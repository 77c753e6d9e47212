"""docs/security.md cannot rot: every file it names exists, and every test it cites as proof of a finding
(`tests/x.py::test_name`, or `::test_name` after a file) is a test function of that file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "security.md"

#: `path`, `path::test`, or `::test` (the last path's) in inline code
CITED = re.compile(r"`((?:python|tests|charts|hack)/[\w./-]+)?(?:::(test_\w+))?`")


def citations(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    paths: set[str] = set()
    tests: set[tuple[str, str]] = set()
    last = ""
    for path, test in CITED.findall(text):
        if path:
            paths.add(path)
            last = path
        if test:
            tests.add((path or last, test))
    return paths, tests


def functions_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_cited_file_and_test_exists() -> None:
    paths, tests = citations(DOC.read_text())
    assert len(tests) >= 30, "each finding cites the tests that perform its attack"
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"docs/security.md names files that do not exist: {missing}"
    absent = sorted(f"{f}::{t}" for f, t in tests if t not in functions_of(REPO / f))
    assert not absent, f"docs/security.md cites tests that do not exist: {absent}"


def test_every_finding_has_a_section_with_its_enforcement_and_tests() -> None:
    sections = re.split(r"^### ", DOC.read_text(), flags=re.M)[1:]
    assert [int(s.split(".", 1)[0]) for s in sections] == list(range(1, len(sections) + 1))
    assert len(sections) >= 14
    for section in sections:
        assert "Enforced in:" in section and "Tests:" in section, section.splitlines()[0]


def test_a_wrong_citation_is_caught() -> None:
    _, tests = citations("`tests/unit/test_security_doc.py::test_nothing_here`, `::test_a_wrong_citation_is_caught`")
    assert tests == {
        ("tests/unit/test_security_doc.py", "test_nothing_here"),
        ("tests/unit/test_security_doc.py", "test_a_wrong_citation_is_caught"),
    }
    assert "test_nothing_here" not in functions_of(REPO / "tests/unit/test_security_doc.py")
