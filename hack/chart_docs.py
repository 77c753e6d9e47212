#!/usr/bin/env python3
"""Generates the chart's values documentation and default-values template from values.yaml.

values.yaml is the one documentation source (cert-manager style): the comment block right above a
key documents it, `# +docs:section=NAME` starts a README section. This writes
- the values table of charts/podsnap/README.md, between the AUTO-GENERATED markers;
- charts/podsnap/templates/_defaults.tpl, what podsnap.init fills into keys missing from .Values (an
  older release's values on `helm upgrade --reuse-values`): the defaults, and for each list or map
  whose default is not empty, the keys that tell "the user removed it with null" from "the release's
  chart did not have it" (see removable).
`--check` exits 1 when either file is stale; tests/chart runs the same comparison.

A key is a row of the table when its value is not a mapping, or a mapping none of whose children is
documented (e.g. `agent.nodeSelector`). Every row must be documented.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "podsnap"
VALUES = CHART / "values.yaml"
README = CHART / "README.md"
DEFAULTS = CHART / "templates" / "_defaults.tpl"
#: the values.yaml of every earlier chart version, comments stripped (tests/chart/test_upgrade.py checks
#: that it holds every version in git and the current one)
HISTORY = REPO / "tests" / "chart" / "upgrade-snapshots"
#: at most this many witnesses per removable key (any one present is enough)
WITNESSES = 3
BEGIN = "<!-- AUTO-GENERATED: values table (python hack/chart_docs.py) -->"
END = "<!-- /AUTO-GENERATED -->"

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?:\s|$)")
SECTION = re.compile(r"^#\s*\+docs:section=(?P<name>.+)$")


@dataclass
class Key:
    path: tuple[str, ...]
    doc: str
    section: str


def documented_keys(text: str) -> list[Key]:
    """Keys of values.yaml with the comment block directly above them, in file order."""
    keys: list[Key] = []
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            match = SECTION.match(stripped)
            if match:
                section, comment = match.group("name").strip(), []
            else:
                comment.append(stripped.lstrip("#").strip())
            continue
        if not stripped:
            comment = []
            continue
        match = KEY_LINE.match(line)
        if match is None or stripped.startswith("- "):
            comment = []
            continue
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group("key")))
        if comment:
            keys.append(Key(tuple(k for _, k in stack), " ".join(c for c in comment if c), section))
        comment = []
    return keys


def lookup(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = values
    for part in path:
        node = node[part]
    return node


def rows(text: str) -> list[Key]:
    """The table rows: documented keys that are leaves (see the module docstring)."""
    keys = documented_keys(text)
    documented = {k.path for k in keys}
    return [k for k in keys if not any(p[: len(k.path)] == k.path and p != k.path for p in documented)]


def undocumented(text: str) -> list[str]:
    """Keys that should have a comment and lack one: children of a group, and top-level keys."""
    values = yaml.safe_load(text)
    documented = {k.path for k in documented_keys(text)}
    groups = {p[:i] for p in documented for i in range(1, len(p))}
    missing: list[str] = []

    def walk(node: dict[str, Any], prefix: tuple[str, ...]) -> None:
        for key, value in node.items():
            path = (*prefix, key)
            if path in groups and isinstance(value, dict):
                walk(value, path)
            elif path not in documented:
                missing.append(".".join(path))

    walk(values, ())
    return missing


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(text: str) -> str:
    values = yaml.safe_load(text)
    out: list[str] = []
    section = None
    for key in rows(text):
        if key.section != section:
            section = key.section
            out += ["", f"### {section}", "", "| Key | Type | Default | Description |", "|---|---|---|---|"]
        value = lookup(values, key.path)
        default = json.dumps(value, separators=(", ", ": "))
        out.append(f"| `{'.'.join(key.path)}` | {type_name(value)} | `{cell(default)}` | {cell(key.doc)} |")
    return "\n".join(out).strip("\n") + "\n"


def readme_text(readme: str, values_text: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"{README}: markers {BEGIN!r} and {END!r} missing")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{table(values_text)}\n{END}{tail}"


def fill_values(values_text: str) -> dict[str, Any]:
    """What podsnap.init fills into a key missing from .Values that the release's chart did not have:
    the default, lists and maps included."""
    result: dict[str, Any] = yaml.safe_load(values_text)
    return result


Path_ = tuple[str, ...]


def has_path(values: Any, path: Path_) -> bool:
    for part in path:
        if not isinstance(values, dict) or part not in values:
            return False
        values = values[part]
    return True


def removable(values_text: str, history: list[dict[str, Any]]) -> dict[str, list[str]]:
    """For each row whose default is a non-empty list or map: scalar keys ("witnesses") that were in
    every earlier values.yaml that had the row, and only in those.

    Helm deletes a key the user sets to null (its only way to clear a default map), and with
    `--reuse-values` it renders the new chart with the old chart's values, where keys added since are
    missing too. podsnap.init tells the two apart: the row is missing while a witness is present, so
    the release's chart had the row and the user removed it (it stays empty); no witness is present,
    so the chart was older than the row (it gets the default). A present null is always the user's.
    """
    values = yaml.safe_load(values_text)
    sets = [*history, values]
    all_rows = [k.path for k in rows(values_text)]

    def seen_in(path: Path_) -> frozenset[int]:
        return frozenset(i for i, s in enumerate(sets) if has_path(s, path))

    scalars = [p for p in all_rows if not isinstance(lookup(values, p), dict | list)]
    out: dict[str, list[str]] = {}
    for path in all_rows:
        default = lookup(values, path)
        if not isinstance(default, dict | list) or not default:
            continue
        need = seen_in(path)
        fitting = [w for w in scalars if seen_in(w) <= need]
        # first the witnesses seen exactly where the row is, nearest to it in values.yaml (same group)
        fitting.sort(key=lambda w: (seen_in(w) != need, -len(seen_in(w)), -shared_prefix(w, path)))
        chosen: list[Path_] = []
        covered: frozenset[int] = frozenset()
        for w in fitting:
            if len(chosen) < WITNESSES and (seen_in(w) - covered or seen_in(w) == need):
                chosen.append(w)
                covered |= seen_in(w)
        if covered != need:
            raise SystemExit(
                f"values.yaml: {'.'.join(path)} has a non-empty default, but no scalar key came with it into "
                "values.yaml, so a --reuse-values upgrade cannot tell whether the user removed it: add a "
                "scalar key with it (e.g. an `enabled` switch)"
            )
        out[".".join(path)] = [".".join(w) for w in chosen]
    return out


def shared_prefix(a: Path_, b: Path_) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def history_sets() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) or {} for p in sorted(HISTORY.glob("*.yaml"))]


def defaults_text(values_text: str, history: list[dict[str, Any]]) -> str:
    body = yaml.safe_dump(fill_values(values_text), sort_keys=True, default_flow_style=False)
    witnesses = yaml.safe_dump(removable(values_text, history), sort_keys=True, default_flow_style=False)
    if "{{" in body + witnesses or "}}" in body + witnesses:
        raise SystemExit("values.yaml defaults must not contain template delimiters")
    return (
        "{{- /* Generated by hack/chart_docs.py from values.yaml and the values of earlier versions\n"
        "(tests/chart/upgrade-snapshots); do not edit. See podsnap.init in _helpers.tpl. */}}\n"
        "{{- /* The defaults, filled into keys the release's chart did not have. */}}\n"
        '{{- define "podsnap.defaults" -}}\n' + body + "{{- end }}\n\n"
        "{{- /* Lists and maps with a non-empty default: the keys that show the release's chart had them. */}}\n"
        '{{- define "podsnap.removable" -}}\n' + witnesses + "{{- end }}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md or _defaults.tpl is stale")
    args = parser.parse_args(argv)
    values_text = VALUES.read_text()
    missing = undocumented(values_text)
    if missing:
        print(f"values.yaml: undocumented keys: {', '.join(missing)}", file=sys.stderr)
        return 1
    wanted = {
        README: readme_text(README.read_text(), values_text),
        DEFAULTS: defaults_text(values_text, history_sets()),
    }
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(REPO)} (run: python hack/chart_docs.py)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
    return 0


if __name__ == "__main__":
    sys.exit(main())
