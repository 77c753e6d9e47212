#!/usr/bin/env python3
"""The one source of podsnap's CustomResourceDefinitions; writes them into the chart as templates.

The schemas live here as Python structures, and `python hack/chart_crds.py` writes
`charts/podsnap/templates/crd-podsnap.io_<plural>.yaml`, wrapped the cert-manager way in
`crds.enabled` (install/upgrade them with the release) and `crds.keep` (`helm.sh/resource-policy:
keep`, so an uninstall never deletes every user object with them). `--check` exits 1 when the
chart's copies differ from what this file would write; tests/chart runs the same comparison.

Kinds, plurals, short names and scope come from `podsnap.contract`, so a rename there is one edit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from podsnap import contract  # noqa: E402

TEMPLATES = REPO / "charts" / "podsnap" / "templates"

Schema = dict[str, Any]

# --- reusable pieces ---------------------------------------------------------------------------

#: metav1.Condition, exactly as controller-gen emits it for `[]metav1.Condition`
CONDITIONS: Schema = {
    "type": "array",
    "description": "Standard metav1.Condition list; one entry per condition type.",
    "items": {
        "type": "object",
        "required": ["lastTransitionTime", "message", "reason", "status", "type"],
        "properties": {
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "message": {"type": "string", "maxLength": 32768},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "reason": {
                "type": "string",
                "maxLength": 1024,
                "minLength": 1,
                "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
            },
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "type": {
                "type": "string",
                "maxLength": 316,
                "pattern": (
                    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                ),
            },
        },
    },
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}

IMMUTABLE: list[dict[str, str]] = [{"rule": "self == oldSelf", "message": "spec is immutable"}]
#: CEL validation rules are on by default from Kubernetes 1.25; older API servers (and clients that
#: validate against their OpenAPI) reject the field, so the template emits it only where it works
CEL_MIN_VERSION = ">=1.25.0-0"
CEL_PLACEHOLDER = "__cel_rules__"

#: object names are DNS subdomains
NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 253}
UID: Schema = {"type": "string", "minLength": 1, "maxLength": 128}
TIMESTAMP: Schema = {"type": "string", "format": "date-time"}
CONTAINER_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 63}


def target_containers(description: str) -> Schema:
    # exactly one container in v1alpha1; a list so that v1 can allow more without a new field
    return {
        "type": "array",
        "description": description,
        "items": CONTAINER_NAME,
        "minItems": 1,
        "maxItems": 1,
        "default": ["main"],
    }


def obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    out: Schema = {"type": "object"}
    out.update(extra)
    if required:
        out["required"] = required
    out["properties"] = properties
    return out


ARTIFACT_STATUS: Schema = obj(
    {
        "sizeBytes": {"type": "integer", "format": "int64", "minimum": 0},
        "digest": {"type": "string", "description": "sha256 of the artifact manifest, e.g. sha256:<hex>."},
    },
    description="The captured artifact on the artifact volume.",
)

SOURCE_STATUS: Schema = obj(
    {
        "node": {"type": "string"},
        "kernel": {"type": "string"},
        "arch": {"type": "string"},
        "glibc": {"type": "string"},
        "driver": {"type": "string", "description": "NVIDIA driver version; empty on CPU-only captures."},
        "imageID": {
            "type": "string",
            "description": "Image ID (digest) of the captured container; restore containers must run the same (gate image-digest).",
        },
        "memoryLimitBytes": {
            "type": "integer",
            "format": "int64",
            "minimum": 0,
            "description": "Memory limit of the captured container; restore containers need at least this (gate memory-limit).",
        },
        "cudaGpus": {
            "type": "array",
            "items": {"type": "string"},
            "description": (
                "Models of the GPUs whose CUDA state the capture holds (one entry per GPU; empty: no CUDA state). "
                "Restore pods are placed on nodes with the same driver and these GPUs (placement)."
            ),
        },
        "gpus": {
            "type": "array",
            "items": obj(
                {
                    "index": {"type": "integer", "minimum": 0},
                    "uuid": {"type": "string"},
                    "name": {"type": "string"},
                    "memoryTotalBytes": {"type": "integer", "format": "int64", "minimum": 0},
                    "migMode": {"type": "boolean"},
                }
            ),
        },
    },
    description="Facts about the node and GPUs the capture ran on; restores are checked against them.",
)

CAPTURE_TIMINGS: Schema = {
    "type": "object",
    "description": (
        "Milliseconds per capture phase as the engine measured them (e.g. cuda_checkpoint, criu_dump, total), "
        "plus agent_total: the agent's wall time for the whole capture."
    ),
    "additionalProperties": {"type": "number"},
}

POD_REF: Schema = obj(
    {
        "name": {**NAME, "description": "Name of the source pod."},
        "uid": {**UID, "description": "UID of the source pod; a pod recreated under the same name is not captured."},
        "containers": target_containers("The container to capture (exactly one)."),
    },
    required=["name"],
)


def column(name: str, path: str, type_: str = "string", priority: int = 0, description: str = "") -> Schema:
    col: Schema = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        col["priority"] = priority
    if description:
        col["description"] = description
    return col


def cond(type_: str, field: str = "status") -> str:
    return f'.status.conditions[?(@.type=="{type_}")].{field}'


AGE = column("Age", ".metadata.creationTimestamp", "date")

#: a workload's override of the checkpoint-safe environment (operator/safe_env.py, docs/engines.md)
CHECKPOINT_ENV: Schema = obj(
    {
        "enabled": {
            "type": "boolean",
            "description": "false: the webhook sets none of the checkpoint-safe environment on this workload's pods.",
        },
        "env": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Variables to set, or to set to another value than the installation's defaults "
            "(values.yaml workload.checkpointEnv.env). A variable the container sets itself still wins.",
        },
        "omit": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": "Default variables (or the engine's, from podsnap.io/engine) not to set.",
        },
    },
    description="The checkpoint-safe environment the pod webhook sets on the target container of capture "
    "and restore pods: the installation's defaults, plus the engine's own variables when the pod template "
    "names its engine in the podsnap.io/engine annotation, changed by this.",
)

# --- the four kinds ----------------------------------------------------------------------------

SNAPSHOT_JOB_SPEC: Schema = obj(
    {
        "podTemplate": {
            "type": "object",
            "description": (
                "A core/v1 PodTemplateSpec for the capture pod. The operator runs it as a batch/v1 Job "
                "(backoffLimit 0, restartPolicy Never) with the control volume, readiness probe and "
                "seccomp profile injected."
            ),
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "activeDeadlineSeconds": {
            "type": "integer",
            "format": "int64",
            "minimum": 1,
            "default": 3600,
            "description": "Seconds the capture may take from job creation before it fails with DeadlineExceeded.",
        },
        "podSnapshotTemplate": obj(
            {"targetContainers": target_containers("Container of podTemplate to capture; must exist in it.")},
            default={},
            description="How the PodSnapshot for the capture pod is made.",
        ),
        "checkpointEnv": CHECKPOINT_ENV,
    },
    required=["podTemplate"],
    description="What to run and capture. Immutable.",
)

SNAPSHOT_JOB_STATUS: Schema = obj(
    {
        "podSnapshotName": {"type": "string"},
        "podSnapshotUID": {"type": "string"},
        "jobName": {"type": "string", "description": "The batch/v1 Job running the capture pod."},
        "podName": {"type": "string", "description": "The capture pod."},
        "startedAt": TIMESTAMP,
        "completedAt": TIMESTAMP,
        "observedGeneration": {"type": "integer", "format": "int64"},
        "conditions": CONDITIONS,
    }
)

POD_SNAPSHOT_SPEC: Schema = obj(
    {"source": obj({"podRef": POD_REF}, required=["podRef"], description="The running pod to capture.")},
    required=["source"],
    description="Which pod and container to capture. Immutable.",
)

POD_SNAPSHOT_STATUS: Schema = obj(
    {
        "boundSnapshotContentName": {"type": "string"},
        "artifact": ARTIFACT_STATUS,
        "source": SOURCE_STATUS,
        "capturedAt": TIMESTAMP,
        "captureTimingsMs": CAPTURE_TIMINGS,
        "observedGeneration": {"type": "integer", "format": "int64"},
        "conditions": CONDITIONS,
    }
)

POD_SNAPSHOT_CONTENT_SPEC: Schema = obj(
    {
        "podSnapshotRef": obj(
            {"namespace": NAME, "name": NAME, "uid": UID},
            required=["namespace", "name"],
            description="The PodSnapshot this content is bound to.",
        ),
        "source": obj(
            {
                "podRef": obj(
                    {
                        "namespace": NAME,
                        "name": NAME,
                        "uid": UID,
                        "containers": target_containers("The container to capture (exactly one)."),
                    },
                    required=["namespace", "name"],
                )
            },
            required=["podRef"],
        ),
        "nodeName": {**NAME, "description": "The node whose agent captures; also the podsnap.io/snapshot-node label."},
        "artifactPath": {
            "type": "string",
            "minLength": 1,
            "maxLength": 1024,
            "pattern": "^[A-Za-z0-9][A-Za-z0-9._/-]*$",
            "description": "Artifact directory relative to the artifact root on the PVC.",
        },
        "deletionPolicy": {
            "type": "string",
            "enum": ["Delete", "Retain"],
            "default": "Delete",
            "description": "Delete removes the artifact directory with the content; Retain keeps it.",
        },
    },
    required=["podSnapshotRef", "source", "nodeName"],
    description="Work order for one node's agent. Created by the operator only. Immutable.",
)

POD_SNAPSHOT_CONTENT_STATUS: Schema = obj(
    {
        "artifact": ARTIFACT_STATUS,
        "source": SOURCE_STATUS,
        "capturedAt": TIMESTAMP,
        "captureTimingsMs": CAPTURE_TIMINGS,
        "observedGeneration": {"type": "integer", "format": "int64"},
        "conditions": CONDITIONS,
    }
)

SNAPSHOT_POLICY_SPEC: Schema = obj(
    {
        "targetRef": obj(
            {
                "kind": {"type": "string", "enum": ["Deployment", "StatefulSet"]},
                "name": NAME,
            },
            required=["kind", "name"],
            description="The workload (apps/v1) in this namespace whose pods are captured and restored.",
        ),
        "startupPolicy": {
            "type": "string",
            "enum": ["Immediate", "WaitForCheckpoint"],
            "default": "Immediate",
            "description": "Immediate: pods start cold until the checkpoint is Ready. WaitForCheckpoint: new pods wait for it.",
        },
        "deletionPolicy": {
            "type": "string",
            "enum": ["Delete", "Retain"],
            "default": "Delete",
            "description": "What happens to the captured PodSnapshot and artifact when the policy is deleted.",
        },
        "restoreFailurePolicy": {
            "type": "string",
            "enum": list(contract.RESTORE_FAILURE_POLICIES),
            "default": contract.RESTORE_FAILURE_COLD_START,
            "description": (
                "What a restore pod does when its restore cannot work (failed, refused by a gate, timed out). "
                "ColdStart: it runs its own command cold in the same pod (Restored=False, reason "
                "FellBackToColdStart). Fail: it stays un-Ready with the cause as the reason. A pod's "
                "podsnap.io/restore-failure-policy annotation overrides it."
            ),
        },
        "targetContainerName": {**CONTAINER_NAME, "default": "main"},
        "skipCompatCheck": {
            "type": "boolean",
            "description": (
                "Restore even where the soft compatibility gates (image digest, memory limit, GPU model...) "
                "refuse. The webhook carries it in the restore pod's signed token; the pod's own "
                "podsnap.io/skip-compat-check annotation is not honoured."
            ),
        },
        "checkpointRef": obj(
            {"name": NAME},
            required=["name"],
            description="Use this existing PodSnapshot (same namespace) instead of capturing.",
        ),
        "checkpointEnv": CHECKPOINT_ENV,
    },
    required=["targetRef"],
    description="Which workload to snapshot and how its pods start. Immutable.",
)

SNAPSHOT_POLICY_STATUS: Schema = obj(
    {
        "checkpointName": {"type": "string", "description": "The PodSnapshot new pods restore from."},
        "ready": {"type": "boolean", "description": "True once the checkpoint is Ready."},
        "templateHash": {"type": "string", "description": "Hash of the pod template the checkpoint was taken from."},
        "snapshotJobName": {"type": "string", "description": "The SnapshotJob of the current capture attempt."},
        "captureAttempt": {
            "type": "integer",
            "minimum": 1,
            "description": "The capture attempt for the current template (a failed capture or a lost artifact "
            "is retried with a growing delay).",
        },
        "nextCaptureAt": {
            "type": "string",
            "format": "date-time",
            "description": "When attempt captureAttempt starts, while a retry waits.",
        },
        "lastFailure": {"type": "string", "description": "Why the last capture attempt failed, in one line."},
        "holding": {
            "type": "boolean",
            "description": "WaitForCheckpoint is holding new pods (nothing serves yet and the checkpoint is "
            "not Ready); the pod webhook gates them.",
        },
        "observedGeneration": {"type": "integer", "format": "int64"},
        "conditions": CONDITIONS,
    }
)

SPECS: dict[str, tuple[Schema, Schema, list[Schema], str]] = {
    contract.KIND_SNAPSHOT_JOB: (
        SNAPSHOT_JOB_SPEC,
        SNAPSHOT_JOB_STATUS,
        [
            column("Snapshot", ".status.podSnapshotName"),
            column("Captured", cond(contract.COND_CAPTURED)),
            column("Completed", cond(contract.COND_COMPLETED)),
            column("Failed", cond(contract.COND_FAILED, "reason"), description="Reason of the Failed condition."),
            AGE,
        ],
        "Runs a pod template to readiness once and captures it into a PodSnapshot.",
    ),
    contract.KIND_POD_SNAPSHOT: (
        POD_SNAPSHOT_SPEC,
        POD_SNAPSHOT_STATUS,
        [
            column("Ready", cond(contract.COND_READY)),
            column("Reason", cond(contract.COND_READY, "reason")),
            column("Node", ".status.source.node"),
            column("Size", ".status.artifact.sizeBytes", "integer"),
            column("Content", ".status.boundSnapshotContentName", priority=1),
            AGE,
        ],
        "A checkpoint of one container of a running pod; new pods restore from it.",
    ),
    contract.KIND_POD_SNAPSHOT_CONTENT: (
        POD_SNAPSHOT_CONTENT_SPEC,
        POD_SNAPSHOT_CONTENT_STATUS,
        [
            column("Ready", cond(contract.COND_READY)),
            column("Reason", cond(contract.COND_READY, "reason")),
            column("Node", ".spec.nodeName"),
            column("Size", ".status.artifact.sizeBytes", "integer"),
            column("Snapshot", ".spec.podSnapshotRef.name"),
            column("Namespace", ".spec.podSnapshotRef.namespace", priority=1),
            AGE,
        ],
        "Cluster-scoped binding of a PodSnapshot to a node and an artifact directory.",
    ),
    contract.KIND_SNAPSHOT_POLICY: (
        SNAPSHOT_POLICY_SPEC,
        SNAPSHOT_POLICY_STATUS,
        [
            column("Kind", ".spec.targetRef.kind"),
            column("Target", ".spec.targetRef.name"),
            column("Startup", ".spec.startupPolicy"),
            column("Ready", ".status.ready", "boolean"),
            column("Checkpoint", ".status.checkpointName"),
            AGE,
        ],
        "Snapshots a Deployment or StatefulSet and starts its new pods from the checkpoint.",
    ),
}


def allow_empty_strings(node: Any) -> Any:
    """A copy of a schema whose free-form strings (no minLength, enum, pattern or format) are `nullable`.

    Kubernetes 1.20 as built here (Debian's source package, the API server the tests and the local
    cluster run) rejects an empty string in a typed CR field as `Invalid value: "null"`, which
    would make e.g. a condition with `message: ""` unwritable. `nullable` lets "" through (it is
    stored as "") and is harmless on servers without the bug.
    """
    if isinstance(node, list):
        return [allow_empty_strings(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: allow_empty_strings(v) for k, v in node.items()}
    if out.get("type") == "string" and not {"minLength", "enum", "pattern", "format"} & out.keys():
        out["nullable"] = True
    return out


def crd(kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of `kind`, without the chart's labels and annotations."""
    plural, singular, short, namespaced = contract.CRDS[kind]
    spec, status, columns, description = SPECS[kind]
    status = allow_empty_strings(status)
    spec = {**spec, "x-kubernetes-validations": IMMUTABLE}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{contract.GROUP}"},
        "spec": {
            "group": contract.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short),
                "categories": ["podsnap-all"],
            },
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": contract.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": obj(
                            {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                            required=["spec"],
                            description=description,
                        )
                    },
                }
            ],
        },
    }


def template_path(kind: str) -> Path:
    plural = contract.CRDS[kind][0]
    return TEMPLATES / f"crd-{contract.GROUP}_{plural}.yaml"


HEADER = """\
{{- /* Generated by hack/chart_crds.py from its Python structures. Do not edit: change the script and run it. */}}
{{- include "podsnap.init" . }}
{{- if .Values.crds.enabled }}
"""

FOOTER = "{{- end }}\n"


def render(kind: str) -> str:
    """The chart template for `kind`: the CRD with templated labels and the keep annotation."""
    body = crd(kind)
    spec = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec.pop("x-kubernetes-validations")
    spec["x-kubernetes-validations"] = CEL_PLACEHOLDER
    meta = yaml.safe_dump({"metadata": body.pop("metadata")}, sort_keys=False).rstrip("\n")
    head = yaml.safe_dump({k: body.pop(k) for k in ("apiVersion", "kind")}, sort_keys=False)
    rest = yaml.safe_dump(body, sort_keys=False, width=120)
    meta += (
        "\n  {{- if .Values.crds.keep }}"
        "\n  annotations:\n    helm.sh/resource-policy: keep\n  {{- end }}"
        '\n  labels:\n    {{- include "podsnap.crdLabels" . | nindent 4 }}\n'
    )
    return HEADER + head + meta + cel_block(rest, rules) + FOOTER


def cel_block(text: str, rules: list[dict[str, str]]) -> str:
    """Puts the CEL rules behind a server-version check where the placeholder is."""
    out = []
    for line in text.splitlines(keepends=True):
        key, sep, value = line.partition(": ")
        if sep and value.strip() == CEL_PLACEHOLDER:
            indent = key[: len(key) - len(key.lstrip())]
            block = yaml.safe_dump({"x-kubernetes-validations": rules}, sort_keys=False)
            out.append(f'{indent}{{{{- if semverCompare "{CEL_MIN_VERSION}" .Capabilities.KubeVersion.Version }}}}\n')
            out += [indent + b + "\n" for b in block.splitlines()]
            out.append(f"{indent}{{{{- end }}}}\n")
        else:
            out.append(line)
    if len(out) == len(text.splitlines()):
        raise AssertionError("CEL placeholder not found in the CRD body")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the chart's CRD templates are stale")
    args = parser.parse_args(argv)
    stale = []
    for kind in contract.CRDS:
        path, text = template_path(kind), render(kind)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
    for path in stale:
        print(f"stale: {path.relative_to(REPO)} (run: python hack/chart_crds.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
