#!/usr/bin/env python3
"""Generates the chart's values documentation and default-values template from values.yaml.

values.yaml is the one documentation source (cert-manager style): the comment block right above a
key documents it, `# +docs:section=NAME` starts a README section. This writes
- the values table of charts/podsnap/README.md, between the AUTO-GENERATED markers;
- charts/podsnap/templates/_defaults.tpl, the values podsnap.init fills into keys missing from
  .Values (an older release's values on `helm upgrade --reuse-values`; see fill_values).
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
    """What podsnap.init fills into keys missing from .Values: the defaults, except that a map or
    list that is a single value (a table row, e.g. `agent.nodeSelector`) fills in empty.

    A key is missing for one of two reasons: the values come from an older chart that lacked it
    (`--reuse-values`), or the user removed it with `null`, which is Helm's only way to clear a
    default map (a `{}` override is merged with the default, not put in its place). Filling scalars
    and settings groups with defaults serves the first case; filling collections with empties
    serves the second, and still renders in the first.
    """
    values = yaml.safe_load(values_text)
    for key in rows(values_text):
        parent = lookup(values, key.path[:-1])
        if isinstance(parent[key.path[-1]], dict | list):
            parent[key.path[-1]] = type(parent[key.path[-1]])()
    result: dict[str, Any] = values
    return result


def defaults_text(values_text: str) -> str:
    body = yaml.safe_dump(fill_values(values_text), sort_keys=True, default_flow_style=False)
    if "{{" in body or "}}" in body:
        raise SystemExit("values.yaml defaults must not contain template delimiters")
    return (
        "{{- /* Generated by hack/chart_docs.py from values.yaml; do not edit. */}}\n"
        '{{- define "podsnap.defaults" -}}\n' + body + "{{- end }}\n"
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
    wanted = {README: readme_text(README.read_text(), values_text), DEFAULTS: defaults_text(values_text)}
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
