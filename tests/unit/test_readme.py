"""The README cannot rot: every repository path it names exists, every link it makes resolves, every
`make` target it names is in the Makefile, and every `podsnap` command it names is one the CLI has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from podsnap.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: `inline code` and [text](target) links of a markdown file (code blocks excluded from the first)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: a token that looks like a path into the repository: segments joined by "/", no spaces, no scheme;
#: a first segment with a dot and a letter-only suffix is a domain (podsnap.io/restored, ghcr.io/x), not a dir
PATHLIKE = re.compile(r"^\.?[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*/?$")
DOMAIN = re.compile(r"^[a-z0-9\-]+\.[a-z]+/")


def prose(text: str) -> str:
    """The markdown without fenced code blocks (commands and sample output are not path claims)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def ignored(path: str) -> bool:
    """Paths `make setup` creates (.venv/, .tools/) are git-ignored and absent from a fresh clone."""
    return subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", path], check=False).returncode == 0


def path_claims(text: str) -> set[str]:
    claims = set()
    for raw in CODE.findall(prose(text)):
        token = raw.strip()
        if not PATHLIKE.match(token) or DOMAIN.match(token):
            continue
        if "/" in token or token.startswith(".") or re.search(r"\.(md|py|ya?ml|toml|json|sh|tpl)$", token):
            claims.add(token)
    return claims


def test_every_path_the_readme_names_exists() -> None:
    claims = path_claims(README.read_text())
    assert "python/podsnap/contract.py" in claims, "the path heuristic found nothing: fix the test"
    missing = sorted(p for p in claims if not (REPO / p).exists() and not ignored(p))
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_every_link_of_the_readme_resolves() -> None:
    links = [t for t in LINK.findall(README.read_text()) if not re.match(r"^[a-z]+:", t)]
    assert "docs/design.md" in links
    dead = sorted(t for t in links if not (REPO / t.split("#")[0]).exists())
    assert not dead, f"README.md links to files that do not exist: {dead}"


def test_every_make_target_the_readme_names_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, flags=re.M))
    text = README.read_text()
    named = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", text))
    # the "one suite each" row lists further targets after the first `make test-unit`
    named |= set(re.findall(r"`((?:test|cluster|kind)-[a-z-]+)`", text))
    assert {"demo", "test"} <= named
    assert not named - targets, f"README.md names make targets the Makefile lacks: {sorted(named - targets)}"


def test_every_podsnap_command_the_readme_names_exists() -> None:
    text = README.read_text()
    code = "\n".join(re.findall(r"^```.*?^```", text, flags=re.S | re.M) + CODE.findall(text))
    named = set(re.findall(r"(?<![\w./-])podsnap ([a-z]+)\b", code))
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    commands = set(sub.choices or ())
    assert {"capture", "restore", "status"} <= named
    assert not named - commands, f"README.md names podsnap commands the CLI lacks: {sorted(named - commands)}"


@pytest.mark.parametrize("broken", ["`python/podsnap/cli.py`", "[x](docs/nowhere.md)"])
def test_the_checks_catch_a_dead_path(broken: str) -> None:
    """What the README once said (python/podsnap/cli.py) is caught."""
    if broken.startswith("["):
        assert LINK.findall(broken) == ["docs/nowhere.md"] and not (REPO / "docs/nowhere.md").exists()
    else:
        [claim] = path_claims(broken)
        assert not (REPO / claim).exists() and not ignored(claim)
