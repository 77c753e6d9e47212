"""A deterministic fuzz of values.yaml: every documented key, and every field of the Kubernetes content a
key carries (affinity, tolerations, env, resources, update strategy, selectors), mutated.

Kinds of mutation: a wrong type, an unknown key beside it, a bad enum value, a negative number, a
misspelled nested key, a key that is not a qualified name in a label or annotation map, a huge string,
a string with a newline. Each is rendered with `helm template`, Helm 4 and Helm 3:
- a mutation that can never be valid (wrong type, unknown or misspelled key, bad enum, a negative
  number where Kubernetes forbids one) must fail, and the message must name its key;
- any other mutation that fails must name its key too;
- what renders must be valid: every object that differs from the default render passes
  `kubernetes-validate --strict` for Kubernetes 1.27 and 1.37, and a server-side dry run on a real
  kube-apiserver (1.20), which applies the API server's own checks (names, label syntax, enums).

To keep this to a few hundred renders instead of thousands, mutations of different places are
rendered together: a batch holds mutations whose paths do not overlap. Schema validation reports every
violation, so each mutation must be named at its own path in the batch's message. A mutation named
is done; the rest are rendered again without it, until they render (and are validated) or fail on
their own; a batch whose message names none of them is taken apart. An invalid object is reported
with the mutations of its render; Kubernetes' message names the field.
"""

from __future__ import annotations

import copy
import json
import random
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.conftest import CHART, DOCS, FIGURES, NAMESPACE, RELEASE, Doc, parallel, run
from tests.chart.history import get_path
from tests.conftest import require_tool
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.slow

SEED = 20261201
#: longer than any Kubernetes name or label value (63, 253 characters)
HUGE = "x" * 70_000
#: longer than all of an object's annotations may be (256 KiB)
HUGE_ANNOTATION = "x" * 300_000
K8S_VERSIONS = ("1.27.0", "1.37.0")
FOREIGN_KINDS = {"Certificate", "Issuer", "ServiceMonitor"}
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
ROWS = [key.path for key in DOCS.rows((CHART / "values.yaml").read_text())]

Path_ = tuple[str | int, ...]

#: valid content for keys whose default is empty or too small to mutate; each field of it is mutated
EXAMPLES: dict[str, Any] = {
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [{"key": "gpu.type", "operator": "In", "values": ["h200"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]}],
                    }
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}
            ],
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "labelSelector": {
                            "matchLabels": {"app": "worker"},
                            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}],
                        },
                        "namespaces": ["ml"],
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        },
    },
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute", "tolerationSeconds": 30}
    ],
    "extraEnv": [
        {"name": "A", "value": "1"},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token", "optional": True}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
    ],
    "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "2Gi", "nvidia.com/gpu": 1}},
    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
    "objectSelector": {
        "matchLabels": {"app": "worker"},
        "matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}],
    },
    "imagePullSecrets": [{"name": "regcred"}],
    "issuerRef": {"kind": "ClusterIssuer", "name": "my-ca", "group": "cert-manager.io"},
    "extraArgs": ["--flag=1"],
}
#: maps whose keys are the user's (labels, annotations, node selectors, resource names, variable names)
FREE_KEYS = {
    "commonLabels", "nodeSelector", "podAnnotations", "podLabels", "annotations", "labels", "requests", "limits",
    "matchLabels", "env",
}  # fmt: skip
#: maps of label values (syntax-checked by Kubernetes), as opposed to annotations (any string)
LABEL_MAPS = {"commonLabels", "nodeSelector", "podLabels", "labels", "matchLabels"}
ANNOTATION_MAPS = {"podAnnotations", "annotations"}
ENUM_KEYS = {"operator", "effect", "type", "kind", "apiVersion"}
#: numbers Kubernetes allows below zero (a negative tolerationSeconds means: evict at once)
NEGATIVE_OK = {"tolerationSeconds"}
#: a value that makes the keys below a prefix take effect, so that their content reaches an object
CONTEXT: dict[str, tuple[Path_, Any]] = {
    "webhook.certManager": (("webhook", "certManager", "enabled"), True),
    "metrics.serviceMonitor": (("metrics", "serviceMonitor", "enabled"), True),
    "storage.pvc.existingClaim": (("storage", "pvc", "create"), False),
}
#: the Kubernetes types fuzzed in depth under one component only (the other gets the top level)
DEEP_UNDER = {"affinity": "agent", "tolerations": "operator", "extraEnv": "agent", "resources": "operator"}


@dataclass
class Mutation:
    row: tuple[str, ...]  # the documented key it mutates
    kind: str
    path: Path_  # where it changes the values: the node set, or the map a key is added to or renamed in
    value: Any = None  # set: the new value; add: the new key's value
    old_key: str | None = None  # rename: the key renamed
    new_key: str | None = None  # add / rename: the key that appears
    must_fail: bool = True
    outcome: dict[str, str] = field(default_factory=dict)  # helm binary -> "rendered" | error message

    @property
    def name(self) -> str:
        where = dotted(self.path) + (f".{self.new_key}" if self.new_key else "")
        return f"{where}: {self.kind}"

    @property
    def target(self) -> Path_:
        return (*self.path, self.old_key if self.old_key is not None else self.new_key) if self.new_key else self.path


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def overlaps(a: Path_, b: Path_) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def misspell(word: str, rng: random.Random) -> str:
    while True:
        i = rng.randrange(len(word))
        out = word[:i] + word[i + 1 :] if rng.random() < 0.5 else word[:i] + word[i] + word[i:]
        if out and out != word:
            return out


def schema_for(path: tuple[str, ...]) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for part in path:
        node = node["properties"][part]
        while "$ref" in node:
            node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def example_of(row: tuple[str, ...]) -> Any:
    default = get_path(VALUES, row)
    if row[-1] in EXAMPLES:
        return EXAMPLES[row[-1]]
    if row[-1] in FREE_KEYS:
        return default or {"team": "ml"}
    assert default, f"{dotted(row)}: give the fuzz a valid example of it (EXAMPLES)"
    return default


def content(
    row: tuple[str, ...], node: Any, path: Path_, rng: random.Random, *, enum: bool, deep: bool
) -> Iterator[Mutation]:
    """Mutations of every node of a row's example; path is the node's place in the values."""
    last = path[-1]
    depth = len(path) - len(row)
    if depth > 1 and not deep:
        return
    if isinstance(node, dict):
        if last in FREE_KEYS:
            yield Mutation(row, "bad key", path, "x", new_key="bad key!")
        else:
            yield Mutation(row, "unknown key", path, 1, new_key=f"bogus{rng.randrange(10**6)}")
            for key in node:
                yield Mutation(row, "misspelled key", path, old_key=key, new_key=misspell(key, rng))
        for key, value in node.items():
            yield from content(row, value, (*path, key), rng, enum=key in ENUM_KEYS, deep=deep)
        yield Mutation(row, "wrong type", path, ["x"])
    elif isinstance(node, list):
        yield Mutation(row, "wrong type", path, "x")
        for i, item in enumerate(node):
            yield from content(row, item, (*path, i), rng, enum=enum, deep=deep)
    elif isinstance(node, bool):
        yield Mutation(row, "wrong type", path, "yes")
    elif isinstance(node, int):
        yield Mutation(row, "wrong type", path, ["x"])
        yield Mutation(row, "negative", path, -1, must_fail=last not in NEGATIVE_OK)
    elif isinstance(node, str):
        parent = path[-2] if len(path) >= 2 else None
        labels, annotations = parent in LABEL_MAPS, parent in ANNOTATION_MAPS
        yield Mutation(row, "wrong type", path, ["x"])
        huge = HUGE_ANNOTATION if annotations else HUGE
        yield Mutation(row, "huge string", path, huge, must_fail=labels or annotations)
        yield Mutation(row, "newline", path, node + "\nx: y", must_fail=labels)
        if enum or last in ENUM_KEYS:
            yield Mutation(row, "bad enum", path, "Bogus")


def mutations() -> list[Mutation]:
    rng = random.Random(SEED)
    out: list[Mutation] = []
    for row in ROWS:
        default = get_path(VALUES, row)
        out.append(Mutation(row, "unknown key", row[:-1], 1, new_key=f"{row[-1]}Typo"))
        if isinstance(default, bool):
            out += [Mutation(row, "wrong type", row, "yes"), Mutation(row, "wrong type", row, 1)]
        elif isinstance(default, int):
            out += [Mutation(row, "wrong type", row, "abc"), Mutation(row, "wrong type", row, 1.5)]
            out.append(Mutation(row, "negative", row, -1))
        elif isinstance(default, str):
            out += [Mutation(row, "wrong type", row, 12345), Mutation(row, "wrong type", row, ["x"])]
            out.append(Mutation(row, "huge string", row, HUGE, must_fail=False))
            out.append(Mutation(row, "newline", row, (default or "a") + "\nx: y", must_fail=False))
            if "enum" in schema_for(row):
                out.append(Mutation(row, "bad enum", row, "Bogus"))
        else:
            deep = DEEP_UNDER.get(row[-1], row[0]) == row[0]
            items_enum = "enum" in (schema_for(row).get("items") or {})
            out += list(content(row, example_of(row), row, rng, enum=items_enum, deep=deep))
    return out


MUTATIONS = mutations()


def rows_with_content(batch: list[Mutation]) -> set[tuple[str, ...]]:
    """Rows whose example must be in the values: those mutated below their own level."""
    return {m.row for m in batch if len(m.target) > len(m.row)}


def values_of(batch: list[Mutation]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    targets = [m.target for m in batch]
    for m in batch:
        for prefix, (path, value) in CONTEXT.items():
            if dotted(m.row).startswith(prefix) and not any(overlaps(t, path) for t in targets):
                _set(values, path, value)
    for row in rows_with_content(batch):
        _set(values, row, copy.deepcopy(example_of(row)))
    for m in batch:
        if m.old_key is not None:
            node = _get(values, m.path)
            items = list(node.items())
            node.clear()
            node.update({(m.new_key if k == m.old_key else k): v for k, v in items})
        elif m.new_key is not None:
            _ensure(values, m.path)[m.new_key] = m.value
        else:
            _set(values, m.path, copy.deepcopy(m.value))
    return values


def _get(values: Any, path: Path_) -> Any:
    for part in path:
        values = values[part]
    return values


def _ensure(values: dict[str, Any], path: Path_) -> dict[str, Any]:
    node: Any = values
    for part in path:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    return node  # type: ignore[no-any-return]


def _set(values: dict[str, Any], path: Path_, value: Any) -> None:
    _ensure(values, path[:-1])[path[-1]] = value  # type: ignore[index]


#: huge strings per batch: several in one object would pass Kubernetes' request size limit together
HUGE_PER_BATCH = 3


def batches(muts: list[Mutation]) -> list[list[Mutation]]:
    """First fit: each mutation into the first batch none of whose targets overlaps its own."""
    out: list[list[Mutation]] = []
    for m in muts:
        for batch in out:
            huge = m.kind == "huge string" and sum(o.kind == "huge string" for o in batch) >= HUGE_PER_BATCH
            if not huge and not any(overlaps(m.target, other.target) for other in batch):
                batch.append(m)
                break
        else:
            out.append([m])
    return out


def _forms(path: Path_) -> tuple[str, str]:
    """How Helm 3 (`a.b.0.c`) and Helm 4 (`/a/b/0/c`, JSON pointer) name a place."""
    pointer = "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path) if path else ""
    return dotted(path), pointer


def is_named(m: Mutation, message: str) -> bool:
    """A line of the message names the mutation's place (and the key it added or misspelled)."""
    place = m.path if m.new_key else m.target
    helm3, helm4 = _forms(place)
    for line in message.splitlines():
        if m.new_key and m.new_key not in line:
            continue
        if not place:
            return True
        if re.search(rf"(^|[\s'\"]){re.escape(helm3)}([:\s'\"]|$)", line) or f"'{helm4}'" in line:
            return True
    return False


def render(helm: str, values: dict[str, Any], work: Path, name: str) -> subprocess.CompletedProcess[str]:
    file = work / f"{name}.json"  # JSON is YAML, and far faster to write with huge strings
    file.write_text(json.dumps(values))
    return run(
        [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(file)], check=False, timeout=300
    )


@dataclass
class Rendered:
    mutations: list[Mutation]
    docs: list[Doc]


def run_batch(
    helm: str, batch: list[Mutation], work: Path, *, label: str, renders: list[Rendered], count: list[int]
) -> None:
    binary = Path(helm).name
    remaining = list(batch)
    while remaining:
        count[0] += 1
        proc = render(helm, values_of(remaining), work, f"{label}-{count[0]}")
        if proc.returncode == 0:
            for m in remaining:
                m.outcome[binary] = "rendered"
            renders.append(Rendered(remaining, [d for d in yaml.load_all(proc.stdout, Loader=yaml.CSafeLoader) if d]))
            return
        named = [m for m in remaining if is_named(m, proc.stderr)]
        for m in named:
            m.outcome[binary] = proc.stderr
        if not named:
            if len(remaining) == 1:
                remaining[0].outcome[binary] = proc.stderr
                return
            for i, m in enumerate(remaining):  # take the batch apart
                run_batch(helm, [m], work, label=f"{label}-{i}", renders=renders, count=count)
            return
        remaining = [m for m in remaining if m not in named]


@dataclass
class Fuzz:
    renders: dict[str, list[Rendered]]
    helm_runs: dict[str, int]
    seconds: float


@pytest.fixture(scope="module")
def fuzz(helm: str, helm3: str) -> Fuzz:
    start = time.monotonic()
    renders: dict[str, list[Rendered]] = {}
    runs: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for binary in (helm, helm3):
            renders[Path(binary).name], runs[Path(binary).name] = run_all(binary, Path(tmp))
    return Fuzz(renders, runs, time.monotonic() - start)


def run_all(helm: str, work: Path) -> tuple[list[Rendered], int]:
    groups = batches(MUTATIONS)
    renders: list[Rendered] = []
    counts = [[0] for _ in groups]
    name = Path(helm).name
    parallel(
        lambda i: run_batch(helm, groups[i], work, label=f"{name}-b{i}", renders=renders, count=counts[i]),
        range(len(groups)),
    )
    return renders, sum(c[0] for c in counts)


def test_the_fuzz_mutates_every_documented_key_and_is_deterministic() -> None:
    assert {m.row for m in MUTATIONS} == set(ROWS)
    assert {m.kind for m in MUTATIONS} == {
        "wrong type", "unknown key", "bad enum", "negative", "misspelled key", "huge string", "newline", "bad key",
    }  # fmt: skip
    assert [m.name for m in mutations()] == [m.name for m in MUTATIONS]
    # a batch never holds two mutations of one place
    for batch in batches(MUTATIONS):
        targets = [m.target for m in batch]
        assert all(not overlaps(a, b) for i, a in enumerate(targets) for b in targets[i + 1 :])


def test_bad_values_fail_naming_their_key(fuzz: Fuzz) -> None:
    problems = []
    for m in MUTATIONS:
        for binary, outcome in m.outcome.items():
            if outcome == "rendered":
                if m.must_fail:
                    problems.append(f"{binary}: {m.name}: rendered, but it can never be valid")
            elif not is_named(m, outcome):
                problems.append(f"{binary}: {m.name}: the error does not name it: {outcome[:400]}")
    assert all(len(m.outcome) == 2 for m in MUTATIONS)
    failed = sum(1 for m in MUTATIONS for o in m.outcome.values() if o != "rendered")
    FIGURES["values fuzz"] = (
        f"{len(MUTATIONS)} mutations (seed {SEED}), each rendered by Helm 4 and Helm 3: {failed} of "
        f"{2 * len(MUTATIONS)} rejected naming the key, the rest rendered and validated; "
        f"{sum(fuzz.helm_runs.values())} helm runs in {fuzz.seconds:.0f} s"
    )
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


def masked(doc: Doc) -> str:
    """A document without the per-render webhook certificate, for comparison."""
    doc = copy.deepcopy(doc)
    if doc["kind"] == "Secret":
        doc["data"] = {}
    for hook in doc.get("webhooks", []):
        hook["clientConfig"].pop("caBundle", None)
    return json.dumps(doc, sort_keys=True)


@pytest.fixture(scope="module")
def changed(fuzz: Fuzz, helm: str) -> list[tuple[Rendered, list[Doc]]]:
    """Each render, with only the objects that differ from the default render (unique across renders)."""
    default = run([helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]).stdout
    seen = {masked(d) for d in yaml.safe_load_all(default) if d}
    out = []
    for rendered in [r for renders in fuzz.renders.values() for r in renders]:
        docs = []
        for doc in rendered.docs:
            key = masked(doc)
            if key not in seen:
                seen.add(key)
                docs.append(doc)
        out.append((rendered, docs))
    return out


def test_what_renders_passes_kubernetes_validate_strict(changed: list[tuple[Rendered, list[Doc]]]) -> None:
    start = time.monotonic()
    problems, checked = [], 0
    for rendered, docs in changed:
        for doc in docs:
            if doc["kind"] in FOREIGN_KINDS:
                continue
            for version in K8S_VERSIONS:
                checked += 1
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    names = ", ".join(m.name for m in rendered.mutations)
                    problems.append(f"{doc['kind']} invalid for {version} ({names}): {exc.message[:300]}")
    FIGURES["values fuzz: kubernetes-validate --strict"] = (
        f"{checked} changed objects x versions in {time.monotonic() - start:.1f} s"
    )
    assert checked > 0
    assert not problems, "\n".join(problems[:20])


def test_what_renders_is_accepted_by_a_real_api_server(
    changed: list[tuple[Rendered, list[Doc]]], control_plane: ControlPlane
) -> None:
    """The API server's own validation, which its OpenAPI schema does not carry: a server-side dry run
    (on the session's shared control plane: a dry run persists nothing)."""
    start = time.monotonic()
    cp = control_plane
    kubectl = require_tool("kubectl")
    argv = [kubectl, "--kubeconfig", str(cp.kubeconfig)]
    if subprocess.run([*argv, "get", "namespace", NAMESPACE], capture_output=True, check=False).returncode:
        subprocess.run([*argv, "create", "namespace", NAMESPACE], check=True, capture_output=True)
    owner: dict[str, str] = {}
    batch: list[Doc] = []
    for i, (rendered, docs) in enumerate(changed):
        for doc in docs:
            if doc["kind"] in FOREIGN_KINDS or doc["kind"] == "CustomResourceDefinition":
                continue
            renamed = copy.deepcopy(doc)
            renamed["metadata"]["name"] = f"{doc['metadata']['name']}-r{i}"  # one name per render
            owner[renamed["metadata"]["name"]] = ", ".join(m.name for m in rendered.mutations)
            batch.append(renamed)
    proc = subprocess.run(
        [kubectl, "--kubeconfig", str(cp.kubeconfig), "create", "--dry-run=server", "--validate=false", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": batch}),
        check=False,
        text=True,
        capture_output=True,
        timeout=600,
    )
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    accepted = proc.stdout.count("(server dry run)")
    FIGURES["values fuzz: server-side dry run (kube-apiserver 1.20)"] = (
        f"{accepted} of {len(batch)} changed objects accepted in {time.monotonic() - start:.1f} s"
    )
    named = [f"{e[:400]}\n  (render of: {owner[n][:400]})" for e in errors for n in owner if f'"{n}"' in e]
    assert not errors, f"{len(errors)} lines of errors:\n" + "\n".join((named or errors)[:20])
    assert accepted == len(batch) > 0
