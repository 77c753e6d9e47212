#!/usr/bin/env python3
"""Generates the Kubernetes types of charts/podsnap/values.schema.json.

values.schema.json is written by hand except its definitions named `io.k8s.*`. A value that becomes
part of a Kubernetes object refers to one of them (`agent.tolerations` items to
`io.k8s.api.core.v1.Toleration`, `agent.affinity` to `io.k8s.api.core.v1.Affinity`, ...), and this
script writes each one and everything it refers to:
- from the OpenAPI definitions that PyPI `kubernetes-validate` ships, strict flavour, for the oldest
  and newest Kubernetes versions the chart's objects are validated against (OLDEST, NEWEST): only the
  fields both know, `additionalProperties: false` where Kubernetes is strict, descriptions dropped;
- plus what the API server checks that OpenAPI does not say (RULES): enums, name and label patterns,
  non-negative quantities, fields that exclude each other. Each rule names the Kubernetes validation
  it copies. A value that OpenAPI and these rules accept, Kubernetes accepts.

The roots are the `#/definitions/io.k8s.*` references of the hand-written part, so a value starts to
use a Kubernetes type by referring to it. `--check` exits 1 when the file is stale (tests/chart runs
the same comparison).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "charts" / "podsnap" / "values.schema.json"
OLDEST, NEWEST = "1.27.0", "1.37.0"
PREFIX = "io.k8s."
DROP = {"description", "format", "$schema", "$id"}

Node = dict[str, Any]

# Kubernetes' name and value syntaxes (k8s.io/apimachinery/pkg/util/validation)
QUALIFIED_NAME = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# validation.IsEnvVarName before 1.30 relaxed it: the chart installs on 1.20
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
# resource.Quantity without a sign: requests and limits must not be negative
QUANTITY = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
# a standard resource, or an extended one with a domain (validateResourceName)
RESOURCE_NAME = (
    r"^(cpu|memory|ephemeral-storage|hugepages-[A-Za-z0-9.]+|"
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$"
)
PERCENT = r"^(100|[1-9]?[0-9])%$"
QUANTITY_DEF = "io.k8s.apimachinery.pkg.api.resource.Quantity"
# the downward API fields an env var may read (validEnvDownwardAPIFieldPathExpressions)
FIELD_PATH = (
    r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]|"
    r"spec\.(nodeName|serviceAccountName)|status\.(hostIP|podIP|podIPs))$"
)
CONTAINER_RESOURCE = r"^(limits|requests)\.(cpu|memory|ephemeral-storage|hugepages-[A-Za-z0-9.]+)$"


def ref(name: str) -> Node:
    return {"$ref": f"#/definitions/{name}"}


def string(pattern: str, max_length: int | None = None, nullable: bool = True) -> Node:
    node: Node = {"type": ["string", "null"] if nullable else "string", "pattern": pattern}
    if max_length is not None:
        node["maxLength"] = max_length
    return node


def enum(*values: str) -> Node:
    return {"type": ["string", "null"], "enum": [*values, None]}


def when(prop: str, values: list[Any], then: Node) -> Node:
    """then applies when prop is one of values."""
    return {"if": {"required": [prop], "properties": {prop: {"enum": values}}}, "then": then}


def label_map() -> Node:
    # patternProperties, not propertyNames: Helm 4 reports a bad property name at a wrong location
    return {
        "type": ["object", "null"],
        "patternProperties": {QUALIFIED_NAME: string(LABEL_VALUE, 63, nullable=False)},
        "additionalProperties": False,
    }


def selector_values(operators_with: list[str], operators_without: list[str]) -> list[Node]:
    """validateLabelSelectorRequirement / validateNodeSelectorRequirement: values for In and NotIn,
    none for Exists and DoesNotExist."""
    return [
        when("operator", operators_with, {"required": ["values"], "properties": {"values": {"minItems": 1}}}),
        when("operator", operators_without, {"properties": {"values": {"maxItems": 0}}}),
    ]


#: per definition: property patches (merged), `allOf` rules (appended), properties to `drop`, or a
#: whole `replace`ment
RULES: dict[str, Node] = {
    # intstr.IntOrString and resource.Quantity are oneOf(string|null, number|null): a null matches both
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"replace": {"type": ["integer", "string", "null"]}},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "replace": {"type": ["string", "number", "null"], "pattern": QUANTITY, "minimum": 0}
    },
    # core/validation ValidateTolerations
    "io.k8s.api.core.v1.Toleration": {
        "properties": {
            "key": string(f"({QUALIFIED_NAME})|^$", 317),
            "operator": enum("", "Exists", "Equal"),
            "value": string(LABEL_VALUE, 63),
            "effect": enum("", "NoSchedule", "PreferNoSchedule", "NoExecute"),
        },
        "allOf": [
            when("operator", ["Exists"], {"properties": {"value": {"maxLength": 0}}}),
            {
                "if": {"not": {"required": ["key"], "properties": {"key": {"minLength": 1}}}},
                "then": {"required": ["operator"], "properties": {"operator": {"const": "Exists"}}},
            },
            {
                "if": {"required": ["tolerationSeconds"], "properties": {"tolerationSeconds": {"type": "integer"}}},
                "then": {"required": ["effect"], "properties": {"effect": {"const": "NoExecute"}}},
            },
        ],
    },
    # apps/validation ValidateDaemonSetUpdateStrategy, ValidateRollingUpdateDaemonSet
    "io.k8s.api.apps.v1.DaemonSetUpdateStrategy": {"properties": {"type": enum("RollingUpdate", "OnDelete")}},
    "io.k8s.api.apps.v1.RollingUpdateDaemonSet": {
        "properties": {
            "maxUnavailable": {"type": ["integer", "string", "null"], "minimum": 0, "pattern": PERCENT},
            "maxSurge": {"type": ["integer", "string", "null"], "minimum": 0, "pattern": PERCENT},
        },
        "allOf": [
            # both zero (an absent maxSurge is zero) would never roll
            {
                "if": {"required": ["maxUnavailable"], "properties": {"maxUnavailable": {"enum": [0, "0%"]}}},
                "then": {"required": ["maxSurge"], "properties": {"maxSurge": {"not": {"enum": [0, "0%", None]}}}},
            }
        ],
    },
    # meta/v1/validation ValidateLabelSelector
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector": {"properties": {"matchLabels": label_map()}},
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement": {
        "properties": {
            "key": string(QUALIFIED_NAME, 317, nullable=False),
            "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
            "values": {"type": ["array", "null"], "items": string(LABEL_VALUE, 63, nullable=False)},
        },
        "allOf": selector_values(["In", "NotIn"], ["Exists", "DoesNotExist"]),
    },
    # core/validation ValidateNodeSelector, validateNodeSelectorTerm, ValidateNodeSelectorRequirement
    "io.k8s.api.core.v1.NodeSelector": {"properties": {"nodeSelectorTerms": {"minItems": 1}}},
    "io.k8s.api.core.v1.NodeSelectorRequirement": {
        "properties": {
            "key": string(QUALIFIED_NAME, 317, nullable=False),
            "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]},
            "values": {"type": ["array", "null"], "items": {"type": "string"}},
        },
        "allOf": [
            *selector_values(["In", "NotIn"], ["Exists", "DoesNotExist"]),
            when(
                "operator",
                ["Gt", "Lt"],
                {
                    "required": ["values"],
                    "properties": {"values": {"minItems": 1, "maxItems": 1, "items": {"pattern": r"^-?[0-9]+$"}}},
                },
            ),
        ],
    },
    # validateNodeFieldSelectorRequirement: only metadata.name, In or NotIn, one node name
    "io.k8s.api.core.v1.NodeSelectorTerm": {
        "properties": {
            "matchFields": {
                "type": ["array", "null"],
                "items": {
                    "properties": {
                        "key": {"const": "metadata.name"},
                        "operator": {"enum": ["In", "NotIn"]},
                        "values": {"minItems": 1, "maxItems": 1, "items": string(DNS_SUBDOMAIN, 253, nullable=False)},
                    },
                },
            }
        }
    },
    # core/validation: weights 1-100, a non-empty topologyKey, namespace names
    "io.k8s.api.core.v1.PreferredSchedulingTerm": {"properties": {"weight": {"minimum": 1, "maximum": 100}}},
    "io.k8s.api.core.v1.WeightedPodAffinityTerm": {"properties": {"weight": {"minimum": 1, "maximum": 100}}},
    "io.k8s.api.core.v1.PodAffinityTerm": {
        "properties": {
            "topologyKey": string(QUALIFIED_NAME, 317, nullable=False),
            "namespaces": {"type": ["array", "null"], "items": string(DNS_LABEL, 63, nullable=False)},
        }
    },
    # core/validation ValidateEnv, validateEnvVarValueFrom and the selectors it checks
    "io.k8s.api.core.v1.EnvVar": {
        "properties": {"name": string(ENV_NAME, nullable=False)},
        "allOf": [
            {
                "if": {"required": ["value"], "properties": {"value": {"type": "string", "minLength": 1}}},
                "then": {"not": {"required": ["valueFrom"]}},
            }
        ],
    },
    "io.k8s.api.core.v1.EnvVarSource": {"minProperties": 1, "maxProperties": 1},
    "io.k8s.api.core.v1.ObjectFieldSelector": {
        "properties": {"fieldPath": string(FIELD_PATH, nullable=False), "apiVersion": enum("v1")}
    },
    "io.k8s.api.core.v1.ResourceFieldSelector": {
        "properties": {"resource": string(CONTAINER_RESOURCE, nullable=False), "containerName": string(DNS_LABEL, 63)}
    },
    "io.k8s.api.core.v1.ConfigMapKeySelector": {
        "required": ["key", "name"],
        "properties": {
            "key": string(CONFIG_KEY, 253, nullable=False),
            "name": string(DNS_SUBDOMAIN, 253, nullable=False),
        },
    },
    "io.k8s.api.core.v1.SecretKeySelector": {
        "required": ["key", "name"],
        "properties": {
            "key": string(CONFIG_KEY, 253, nullable=False),
            "name": string(DNS_SUBDOMAIN, 253, nullable=False),
        },
    },
    # an image pull secret is named
    "io.k8s.api.core.v1.LocalObjectReference": {
        "required": ["name"],
        "properties": {"name": string(DNS_SUBDOMAIN, 253, nullable=False)},
    },
    # core/validation ValidateResourceRequirements; `claims` needs the pod's resourceClaims, which the
    # chart does not render
    "io.k8s.api.core.v1.ResourceRequirements": {
        "drop": ["claims"],
        "properties": {
            "requests": {"patternProperties": {RESOURCE_NAME: ref(QUANTITY_DEF)}, "additionalProperties": False},
            "limits": {"patternProperties": {RESOURCE_NAME: ref(QUANTITY_DEF)}, "additionalProperties": False},
        },
    },
}


def definitions(version: str) -> dict[str, Node]:
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"
    defs: dict[str, Node] = json.loads((base / "_definitions.json").read_text())["$defs"]
    return defs


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rsplit("/", 1)[1]
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def refs_with_siblings(node: Any, where: str) -> Iterator[str]:
    if isinstance(node, dict):
        if "$ref" in node and len(node) > 1:
            yield where
        for key, value in node.items():
            yield from refs_with_siblings(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from refs_with_siblings(item, f"{where}/{i}")


def clean(node: Any, newest: Any) -> Any:
    """node without documentation, with `#/definitions/` references, and only properties `newest` has."""
    if isinstance(node, list):
        return [clean(item, None) for item in node]
    if not isinstance(node, dict):
        return node
    out: Node = {}
    for key, value in node.items():
        if key in DROP or key.startswith("x-kubernetes-"):
            continue
        if key == "$ref":
            out[key] = "#/definitions/" + value.rsplit("/", 1)[1]
        elif key == "properties":
            theirs = (newest or {}).get("properties", value)
            out[key] = {p: clean(v, theirs.get(p)) for p, v in value.items() if p in theirs}
        else:
            out[key] = clean(value, (newest or {}).get(key) if isinstance(newest, dict) else None)
    if "required" in out and "properties" in out:
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    return out


def merge(into: Node, patch: Node) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            if "$ref" in into[key] and "$ref" not in value:
                # a reference takes no sibling keywords in draft-07: refine it through allOf
                into[key] = {"allOf": [into[key]]}
            merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def apply_rule(name: str, node: Node) -> Node:
    rule = RULES.get(name)
    if rule is None:
        return node
    if "replace" in rule:
        return copy.deepcopy(rule["replace"])
    node = copy.deepcopy(node)
    for prop in rule.get("drop", []):
        node["properties"].pop(prop)
    for prop, patch in rule.get("properties", {}).items():
        if prop not in node.get("properties", {}):
            raise SystemExit(f"RULES[{name}]: Kubernetes {OLDEST}..{NEWEST} has no property {prop}")
        merge(node["properties"], {prop: patch})
    for key in ("required", "minProperties", "maxProperties"):
        if key in rule:
            node[key] = copy.deepcopy(rule[key])
    if "allOf" in rule:
        node["allOf"] = copy.deepcopy(rule["allOf"])
    return node


def generated(schema: Node) -> dict[str, Node]:
    """The io.k8s.* definitions the hand-written part of schema refers to, with their closure."""
    own = {k: v for k, v in schema.get("definitions", {}).items() if not k.startswith(PREFIX)}
    hand = {**schema, "definitions": own}
    oldest, newest = definitions(OLDEST), definitions(NEWEST)
    todo = sorted({r for r in refs(hand) if r.startswith(PREFIX)} | {r for r in refs(RULES) if r.startswith(PREFIX)})
    out: dict[str, Node] = {}
    while todo:
        name = todo.pop()
        if name in out:
            continue
        if name not in oldest or name not in newest:
            raise SystemExit(f"{name} is not a definition of both Kubernetes {OLDEST} and {NEWEST}")
        node = apply_rule(name, clean(oldest[name], newest[name]))
        out[name] = node
        todo += [r for r in refs(node) if r not in out]
    for name, node in out.items():
        for where in refs_with_siblings(node, name):
            raise SystemExit(f"{where}: a $ref with sibling keywords, which draft-07 ignores (use allOf)")
    unused = set(RULES) - set(out)
    if unused:
        raise SystemExit(f"RULES for definitions nothing refers to: {sorted(unused)}")
    return dict(sorted(out.items()))


def schema_text(schema: Node) -> str:
    own = {k: v for k, v in schema.get("definitions", {}).items() if not k.startswith(PREFIX)}
    out = {**schema, "definitions": {**own, **generated(schema)}}
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when values.schema.json is stale")
    args = parser.parse_args(argv)
    current = SCHEMA.read_text()
    wanted = schema_text(json.loads(current))
    if current == wanted:
        return 0
    if args.check:
        print(f"stale: {SCHEMA.relative_to(REPO)} (run: python hack/chart_schema.py)", file=sys.stderr)
        return 1
    SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
