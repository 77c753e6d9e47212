"""The podsnap protocol: every name that crosses a process or API boundary.

Operator, agent, engine and workload SDK all import these names from here, and the chart's CRDs are
checked against them by tests, so a rename is one edit. Parsers ignore unknown keys, so an older
reader survives a newer writer. File and env names match NVIDIA Dynamo's snapshot contract, so
Dynamo-instrumented workers work unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

# --- Kubernetes API -------------------------------------------------------------------------
GROUP: Final = "podsnap.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

KIND_SNAPSHOT_JOB: Final = "SnapshotJob"
KIND_POD_SNAPSHOT: Final = "PodSnapshot"
KIND_POD_SNAPSHOT_CONTENT: Final = "PodSnapshotContent"
KIND_SNAPSHOT_POLICY: Final = "SnapshotPolicy"

PLURAL_SNAPSHOT_JOBS: Final = "snapshotjobs"
PLURAL_POD_SNAPSHOTS: Final = "podsnapshots"
PLURAL_POD_SNAPSHOT_CONTENTS: Final = "podsnapshotcontents"
PLURAL_SNAPSHOT_POLICIES: Final = "snapshotpolicies"

#: kind -> (plural, singular, short names, namespaced)
CRDS: Final[dict[str, tuple[str, str, tuple[str, ...], bool]]] = {
    KIND_SNAPSHOT_JOB: (PLURAL_SNAPSHOT_JOBS, "snapshotjob", ("snapjob",), True),
    KIND_POD_SNAPSHOT: (PLURAL_POD_SNAPSHOTS, "podsnapshot", ("podsnap",), True),
    KIND_POD_SNAPSHOT_CONTENT: (PLURAL_POD_SNAPSHOT_CONTENTS, "podsnapshotcontent", ("podsnapcontent",), False),
    KIND_SNAPSHOT_POLICY: (PLURAL_SNAPSHOT_POLICIES, "snapshotpolicy", ("snappolicy",), True),
}

# Finalizers (under podsnap's own API group).
FINALIZER_SNAPSHOT: Final = f"{GROUP}/snapshot-protection"
FINALIZER_CONTENT_ARTIFACT: Final = f"{GROUP}/artifact-cleanup"

#: PodSnapshotContent objects are named from the PodSnapshot UID.
CONTENT_NAME_PREFIX: Final = "podsnapshotcontent-"


def content_name(snapshot_uid: str) -> str:
    return f"{CONTENT_NAME_PREFIX}{snapshot_uid}"


# --- labels and annotations -----------------------------------------------------------------
LABEL_SNAPSHOT_NODE: Final = f"{GROUP}/snapshot-node"
LABEL_SNAPSHOT_JOB: Final = f"{GROUP}/snapshot-job"
LABEL_CHECKPOINT_SOURCE: Final = f"{GROUP}/checkpoint-source"
LABEL_POLICY: Final = f"{GROUP}/snapshot-policy"
LABEL_TEMPLATE_HASH: Final = f"{GROUP}/template-hash"
#: set by the webhook on pods it shaped for restore, so agents can select them cheaply
LABEL_RESTORE: Final = f"{GROUP}/restore"

ANNOTATION_RESTORE_FROM: Final = f"{GROUP}/restore-from"
ANNOTATION_SKIP_COMPAT_CHECK: Final = f"{GROUP}/skip-compat-check"
ANNOTATION_RESTORED_CONTAINER_IDS: Final = f"{GROUP}/restored-container-ids"
ANNOTATION_RESTORE_CONTAINER: Final = f"{GROUP}/restore-container"

#: scheduling gate used by startupPolicy WaitForCheckpoint where the server supports gates
SCHEDULING_GATE_WAIT: Final = f"{GROUP}/wait-for-checkpoint"

# --- conditions and reasons -----------------------------------------------------------------
POD_CONDITION_RESTORED: Final = f"{GROUP}/Restored"
REASON_RESTORE_IN_PROGRESS: Final = "RestoreInProgress"
REASON_RESTORE_SUCCEEDED: Final = "RestoreSucceeded"
REASON_RESTORE_FAILED: Final = "RestoreFailed"
REASON_RESTORE_INCOMPATIBLE: Final = "RestoreIncompatible"

COND_READY: Final = "Ready"
COND_FAILED: Final = "Failed"
COND_RUNNING: Final = "Running"
COND_CAPTURED: Final = "Captured"
COND_COMPLETED: Final = "Completed"

REASON_PENDING: Final = "Pending"
REASON_POD_PENDING: Final = "PodPending"
REASON_POD_READY: Final = "PodReady"
REASON_CAPTURE_IN_PROGRESS: Final = "CaptureInProgress"
REASON_CAPTURE_COMPLETED: Final = "CaptureCompleted"
REASON_JOB_COMPLETED: Final = "JobCompleted"
REASON_CAPTURE_FAILED: Final = "CaptureFailed"
REASON_DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
REASON_SOURCE_COMPLETED_WITHOUT_CAPTURE: Final = "SourceCompletedWithoutCapture"
REASON_INVALID_SPEC: Final = "InvalidSpec"
#: Event: the capture pod keeps the template's own Localhost seccomp profile (io_uring is up to it)
REASON_SECCOMP_PROFILE_KEPT: Final = "SeccompProfileKept"

# --- workload contract (file and env names shared with Dynamo) ------------------------------
CONTROL_DIR_DEFAULT: Final = "/snapshot-control"
CONTROL_VOLUME_NAME: Final = "snapshot-control"
ENV_CONTROL_DIR: Final = "SNAPSHOT_CONTROL_DIR"
ENV_CONTROL_DIR_DYNAMO: Final = "DYN_SNAPSHOT_CONTROL_DIR"
ENV_RESTORE_STANDBY: Final = "SNAPSHOT_RESTORE_STANDBY"
FILE_READY_FOR_SNAPSHOT: Final = "ready-for-snapshot"
FILE_RESTORE_COMPLETE: Final = "restore-complete"
FILE_RESTORE_CONTEXT: Final = "restore-context.json"
RESTORE_CONTEXT_VERSION: Final = 1


@dataclass(frozen=True)
class RestoreContext:
    """What the restored worker learns about its NEW pod (`restore-context.json`)."""

    env: dict[str, str] = field(default_factory=dict)
    version: int = RESTORE_CONTEXT_VERSION

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "env": dict(self.env)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RestoreContext:
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("restore-context.json: expected a JSON object")
        version = data.get("version", RESTORE_CONTEXT_VERSION)
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"restore-context.json: 'version' must be a positive integer, got {version!r}")
        env = data.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("restore-context.json: 'env' must map strings to strings")
        # unknown keys are ignored on purpose: a newer agent may add fields
        return cls(env=dict(env), version=version)


def is_truthy(value: str | None) -> bool:
    """Annotation and env flags: "true", "1", "yes" (any case) are true; anything else is false."""
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


# --- operator and agent (added for issue 5; additive) ---------------------------------------
#: the replica count a Deployment/StatefulSet had before WaitForCheckpoint held it at zero
ANNOTATION_HELD_REPLICAS: Final = f"{GROUP}/held-replicas"

REASON_POD_NOT_FOUND: Final = "PodNotFound"
REASON_POD_UID_MISMATCH: Final = "PodUIDMismatch"
REASON_CONTAINER_NOT_FOUND: Final = "ContainerNotFound"
REASON_CHECKPOINT_READY: Final = "CheckpointReady"
REASON_CHECKPOINT_PENDING: Final = "CheckpointPending"
REASON_CHECKPOINT_FAILED: Final = "CheckpointFailed"
REASON_TARGET_NOT_FOUND: Final = "TargetNotFound"

STARTUP_POLICY_IMMEDIATE: Final = "Immediate"
STARTUP_POLICY_WAIT: Final = "WaitForCheckpoint"
DELETION_POLICY_DELETE: Final = "Delete"
DELETION_POLICY_RETAIN: Final = "Retain"

# --- deployment: what the chart passes to the operator and the agent ------------------------
#: where the agent container mounts the artifact PVC (only the agent mounts it)
ARTIFACT_ROOT_DEFAULT: Final = "/var/lib/podsnap/artifacts"
#: where the operator container finds the webhook serving certificate (tls.crt, tls.key, ca.crt)
WEBHOOK_CERT_DIR_DEFAULT: Final = "/etc/podsnap/webhook-tls"
#: where the agent container mounts the host's cgroup filesystem (its own /sys/fs/cgroup is its container's)
CGROUP_ROOT_IN_AGENT: Final = "/host/sys/fs/cgroup"
#: where the operator and the agent find the key of podsnap's pod tokens (file `key`; issue 10)
TOKEN_KEY_DIR_DEFAULT: Final = "/etc/podsnap/token-key"
#: the chart's key for each path it mounts into a container -> the path
CHART_PATHS: Final[dict[str, str]] = {
    "artifactRoot": ARTIFACT_ROOT_DEFAULT,
    "webhookCertDir": WEBHOOK_CERT_DIR_DEFAULT,
    "cgroupRoot": CGROUP_ROOT_IN_AGENT,
    "tokenKeyDir": TOKEN_KEY_DIR_DEFAULT,
}
#: namespaces labelled `podsnap.io/webhook: disabled` are never sent to the pod webhook
LABEL_WEBHOOK: Final = f"{GROUP}/webhook"
LABEL_WEBHOOK_DISABLED_VALUE: Final = "disabled"

# Environment of the operator and the agent. The chart takes these names from here: its helper template
# `templates/_env.tpl` is generated from CHART_ENV by `hack/chart_env.py` (a test checks for drift),
# and every variable the chart passes changes what the process does (tests/operator/test_config.py).
ENV_NODE_NAME: Final = "NODE_NAME"  # the agent's node (downward API spec.nodeName)
ENV_LOG_LEVEL: Final = "PODSNAP_LOG_LEVEL"  # debug | info | warning | error
ENV_METRICS_PORT: Final = "PODSNAP_METRICS_PORT"  # "0": metrics off
ENV_HEALTH_PORT: Final = "PODSNAP_HEALTH_PORT"  # serves /healthz (liveness and readiness probes)
ENV_SECCOMP_PROFILE: Final = "PODSNAP_SECCOMP_PROFILE"  # localhostProfile of capture pods; "" = none
ENV_WEBHOOK_PORT: Final = "PODSNAP_WEBHOOK_PORT"  # "0": webhook off (new pods start cold)
ENV_WEBHOOK_PATH: Final = "PODSNAP_WEBHOOK_PATH"  # the path the webhook configuration calls
ENV_WEBHOOK_CERT_DIR: Final = "PODSNAP_WEBHOOK_CERT_DIR"  # tls.crt and tls.key of the webhook server
ENV_ARTIFACT_ROOT: Final = "PODSNAP_ARTIFACT_ROOT"  # where the agent mounts the artifact volume
ENV_TOKEN_KEY_DIR: Final = "PODSNAP_TOKEN_KEY_DIR"  # holds `key`, the HMAC key of podsnap's pod tokens
ENV_CGROUP_ROOT: Final = "PODSNAP_CGROUP_ROOT"  # the host's /sys/fs/cgroup as mounted in the agent
#: not passed by the chart (set it through operator.extraEnv): "auto" (pod scheduling gates where the
#: server has them), "on", "off" (hold replicas at zero)
ENV_SCHEDULING_GATES: Final = "PODSNAP_SCHEDULING_GATES"

COMPONENT_OPERATOR: Final = "operator"
COMPONENT_AGENT: Final = "agent"
#: the chart's key for each variable it passes -> (name, components it passes it to)
CHART_ENV: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "nodeName": (ENV_NODE_NAME, (COMPONENT_AGENT,)),
    "logLevel": (ENV_LOG_LEVEL, (COMPONENT_OPERATOR, COMPONENT_AGENT)),
    "metricsPort": (ENV_METRICS_PORT, (COMPONENT_OPERATOR, COMPONENT_AGENT)),
    "healthPort": (ENV_HEALTH_PORT, (COMPONENT_OPERATOR, COMPONENT_AGENT)),
    "seccompProfile": (ENV_SECCOMP_PROFILE, (COMPONENT_OPERATOR,)),
    "webhookPort": (ENV_WEBHOOK_PORT, (COMPONENT_OPERATOR,)),
    "webhookPath": (ENV_WEBHOOK_PATH, (COMPONENT_OPERATOR,)),
    "webhookCertDir": (ENV_WEBHOOK_CERT_DIR, (COMPONENT_OPERATOR,)),
    "artifactRoot": (ENV_ARTIFACT_ROOT, (COMPONENT_AGENT,)),
    "cgroupRoot": (ENV_CGROUP_ROOT, (COMPONENT_AGENT,)),
    "tokenKeyDir": (ENV_TOKEN_KEY_DIR, (COMPONENT_OPERATOR, COMPONENT_AGENT)),
}


def chart_env(component: str) -> dict[str, str]:
    """The variables the chart passes to `component`: name -> the chart's key."""
    return {name: key for key, (name, components) in CHART_ENV.items() if component in components}


# --- timings on the objects (added for issue 13; additive) -----------------------------------
#: on a restored pod, written by the agent: the restore's phases as compact JSON {"phase": milliseconds}
ANNOTATION_RESTORE_TIMINGS: Final = f"{GROUP}/restore-timings"
#: the key, in a timings map, of the agent's own wall time: the engine's phases plus what the agent does
#: around them (reading the objects, finding the processes, the control dir). The engine's own sum is "total".
TIMING_AGENT_TOTAL: Final = "agent_total"


def format_timings(timings_ms: Mapping[str, float]) -> str:
    """A timings map as the compact JSON the annotation carries (0.1 ms resolution, keys sorted)."""
    return json.dumps({k: round(float(v), 1) for k, v in timings_ms.items()}, sort_keys=True, separators=(",", ":"))


def parse_timings(text: str | None) -> dict[str, float]:
    """The timings map of an annotation; {} when absent or malformed, entries that are not numbers dropped
    (a newer agent may add other fields)."""
    try:
        data: Any = json.loads(text or "{}")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}


# --- restore pods: the placeholder and the agent (issue 16; additive) -------------------------
#: podsnap's own files in a restore pod's control dir (beside Dynamo's), between the agent and the
#: placeholder command the webhook gives the target container (operator/placeholder.py)
FILE_WORKER_PID: Final = "podsnap-worker-pid"  # agent: the restored worker's PID in the pod, before restore-complete
FILE_RESTORE_FAILED: Final = "podsnap-restore-failed"  # agent: the restore will not happen ("Reason: message")
FILE_RESTORING: Final = "podsnap-restoring"  # agent: a restore is under way (the placeholder must not go cold)
FILE_STARTED_COLD: Final = "podsnap-started-cold"  # placeholder: it started the original command cold
FILE_PLACEHOLDER_STARTED: Final = "podsnap-placeholder-started"  # placeholder: its first start (a second goes cold)
FILE_WORKER_EXITED: Final = "podsnap-worker-exited"  # placeholder: the restored worker exited
#: env of a restore pod's target container (the user may set it): seconds the placeholder waits for the agent
#: before it starts the original command cold
ENV_RESTORE_TIMEOUT: Final = "PODSNAP_RESTORE_TIMEOUT_S"
RESTORE_TIMEOUT_DEFAULT_S: Final = 600
REASON_ALREADY_COLD: Final = "StartedCold"


# --- tenant isolation (issue 10; additive) ---------------------------------------------------
#: HMAC tokens (podsnap.kube.tokens) a namespace user cannot forge: the operator marks the pod template of
#: every capture Job, its webhook every pod it shapes for restore; the agent acts only on marked pods
ANNOTATION_CAPTURE_TOKEN: Final = f"{GROUP}/capture-token"
ANNOTATION_RESTORE_TOKEN: Final = f"{GROUP}/restore-token"
#: a PodSnapshot names a pod that no SnapshotJob made a capture source (no valid capture token)
REASON_NOT_A_CAPTURE_SOURCE: Final = "NotACaptureSource"
#: a restore pod that podsnap did not shape (no valid restore token); terminal, like RestoreIncompatible
REASON_RESTORE_REFUSED: Final = "RestoreRefused"
#: a Ready snapshot whose artifact went missing or failed verification: it is Failed from then on
REASON_ARTIFACT_LOST: Final = "ArtifactLost"
#: the pod's status names a container the agent cannot tie to the pod itself (not a whole container ID, or its
#: processes lie under another pod's cgroup): nothing is captured, restored or killed; terminal
REASON_CONTAINER_REFUSED: Final = "ContainerRefused"


# --- node-local artifact cache and prefetch (issue 9; additive) ------------------------------
#: on a PodSnapshotContent, set by the operator while a Ready SnapshotPolicy restores from it: every agent
#: copies its artifact into its node-local cache before the first restore pod arrives
LABEL_PREFETCH: Final = f"{GROUP}/prefetch"
#: on a prefetched content: the policies (`namespace/name`, comma-separated) that keep the label on it
ANNOTATION_PREFETCH_FOR: Final = f"{GROUP}/prefetch-for"
REASON_PREFETCHED: Final = "Prefetched"
REASON_PREFETCH_FAILED: Final = "PrefetchFailed"
#: where the agent container mounts its node-local cache volume
CACHE_DIR_IN_AGENT: Final = "/var/lib/podsnap/cache"
ENV_CACHE_DIR: Final = "PODSNAP_CACHE_DIR"  # the cache's directory in the agent; "" = no cache
ENV_CACHE_MAX_SIZE: Final = "PODSNAP_CACHE_MAX_SIZE"  # a Kubernetes quantity, e.g. 200Gi
ENV_CACHE_MIN_FREE_PERCENT: Final = "PODSNAP_CACHE_MIN_FREE_PERCENT"  # of the cache's filesystem, kept free
ENV_PREFETCH_CONCURRENCY: Final = "PODSNAP_PREFETCH_CONCURRENCY"  # artifacts copied at once; "0" = no prefetch
CHART_PATHS["cacheDir"] = CACHE_DIR_IN_AGENT
CHART_ENV.update(
    {
        "cacheDir": (ENV_CACHE_DIR, (COMPONENT_AGENT,)),
        "cacheMaxSize": (ENV_CACHE_MAX_SIZE, (COMPONENT_AGENT,)),
        "cacheMinFreePercent": (ENV_CACHE_MIN_FREE_PERCENT, (COMPONENT_AGENT,)),
        "prefetchConcurrency": (ENV_PREFETCH_CONCURRENCY, (COMPONENT_AGENT,)),
    }
)


# --- checkpoint-safe environment (issue 11; additive) ------------------------------------------
#: JSON `{"enabled": bool, "env": {name: value}}` (values.yaml `workload.checkpointEnv`): the variables the pod
#: webhook sets on the target container of capture and restore pods (operator/safe_env.py)
ENV_CHECKPOINT_ENV: Final = "PODSNAP_CHECKPOINT_ENV"
CHART_ENV["checkpointEnv"] = (ENV_CHECKPOINT_ENV, (COMPONENT_OPERATOR,))
#: on a pod (template): "off" keeps the webhook from setting the checkpoint-safe environment on it
ANNOTATION_CHECKPOINT_ENV: Final = f"{GROUP}/checkpoint-env"
CHECKPOINT_ENV_OFF: Final = "off"
# --- when a restore cannot work (issue 12; additive) ----------------------------------------------
#: pod condition reason: the restore did not happen and the worker was started cold in the same pod; the
#: message starts with the cause's own reason (e.g. "RestoreIncompatible: gate kernel: ...")
REASON_FELL_BACK_TO_COLD_START: Final = "FellBackToColdStart"
#: SnapshotPolicy.spec.restoreFailurePolicy, and the per-pod annotation below
RESTORE_FAILURE_COLD_START: Final = "ColdStart"
RESTORE_FAILURE_FAIL: Final = "Fail"
RESTORE_FAILURE_POLICIES: Final = (RESTORE_FAILURE_COLD_START, RESTORE_FAILURE_FAIL)
#: on a pod (its author may set it in the pod template; the webhook writes the effective value): what the pod
#: does when its restore fails. Not a security control: it decides only whether this pod's own container runs
#: its own command, which its author can already make it do (see docs/troubleshooting.md)
ANNOTATION_RESTORE_FAILURE_POLICY: Final = f"{GROUP}/restore-failure-policy"
#: env of a restore pod's target container, set by the webhook: the restore failure policy
ENV_RESTORE_FAILURE_POLICY: Final = "PODSNAP_RESTORE_FAILURE_POLICY"
#: env of a restore pod's target container, set by the webhook: seconds a restore that has begun may take;
#: then the container exits (the runtime kills whatever was restored into it) and its restart starts cold
ENV_RESTORE_MAX: Final = "PODSNAP_RESTORE_MAX_S"
RESTORE_MAX_DEFAULT_S: Final = 900
#: placeholder: the restore that had begun did not finish within PODSNAP_RESTORE_MAX_S
FILE_RESTORE_TIMED_OUT: Final = "podsnap-restore-timed-out"
#: the cause in a FellBackToColdStart message when the node agent restarted in the middle of the restore
REASON_AGENT_RESTARTED: Final = "AgentRestarted"
#: a capture refused, before it touched the source, or rolled back when a write found the volume full, for
#: want of room on the artifact volume
REASON_STORAGE_FULL: Final = "StorageFull"
#: what the operator's webhook gives every restore pod (unless the container sets them itself): the chart's
#: restore.pickupTimeoutSeconds and restore.timeoutSeconds, under the names the container reads
CHART_ENV.update(
    {
        "restorePickupTimeout": (ENV_RESTORE_TIMEOUT, (COMPONENT_OPERATOR,)),
        "restoreTimeout": (ENV_RESTORE_MAX, (COMPONENT_OPERATOR,)),
    }
)


# --- cleanup when a node or its agent is gone (issue 12; additive) ----------------------------------
#: operator env: seconds a PodSnapshotContent being deleted waits for the agent of its node, which still
#: exists but runs no Ready agent; then the agent of another node removes its artifact (values.yaml
#: cleanup.handoverAfterSeconds). A content of a node that is gone is handed over at once.
ENV_CLEANUP_HANDOVER: Final = "PODSNAP_CLEANUP_HANDOVER_S"
CLEANUP_HANDOVER_DEFAULT_S: Final = 600
#: on a content the operator handed to another node's agent for deletion: the node it was on
ANNOTATION_HANDED_OVER_FROM: Final = f"{GROUP}/handed-over-from"
CHART_ENV["cleanupHandover"] = (ENV_CLEANUP_HANDOVER, (COMPONENT_OPERATOR,))

# --- placement: restore pods only where the artifact can restore (issue 12; additive) -------------
#: labels the agent keeps on its own Node: the facts the restore gates compare (engine/_compat.py), in the
#: label-safe form of podsnap.kube.placement_labels; the webhook requires the artifact's values of them
LABEL_NODE_ARCH: Final = f"{GROUP}/arch"  # CPU architecture (gate arch)
LABEL_NODE_KERNEL: Final = f"{GROUP}/kernel"  # kernel release (gate kernel)
LABEL_NODE_DRIVER: Final = f"{GROUP}/nvidia-driver"  # NVIDIA driver version, exact (gate driver)
LABEL_NODE_GPU_PRODUCT: Final = f"{GROUP}/gpu-product"  # the node's GPU model(s) (gate gpu-model)
LABEL_NODE_GPU_COUNT: Final = f"{GROUP}/gpu-count"  # how many GPUs the node has (gate gpu-count)
NODE_FACT_LABELS: Final = (
    LABEL_NODE_ARCH,
    LABEL_NODE_KERNEL,
    LABEL_NODE_DRIVER,
    LABEL_NODE_GPU_PRODUCT,
    LABEL_NODE_GPU_COUNT,
)
#: on a pod the webhook could not place (no Ready node carries the artifact's facts): the reason, so the
#: operator can select those pods, and ANNOTATION_PLACEMENT_MESSAGE says which facts no node matches
LABEL_PLACEMENT: Final = f"{GROUP}/placement"
ANNOTATION_PLACEMENT_MESSAGE: Final = f"{GROUP}/placement-message"
#: no Ready node carries the artifact's facts: the pod starts cold (ColdStart) or stays Pending (Fail)
REASON_NO_COMPATIBLE_NODE: Final = "NoCompatibleNode"
#: "false": the agent labels no node and the webhook adds no node affinity (values.yaml placement.enabled)
ENV_PLACEMENT: Final = "PODSNAP_PLACEMENT"
CHART_ENV["placement"] = (ENV_PLACEMENT, (COMPONENT_OPERATOR, COMPONENT_AGENT))

# --- node-local agent state (issue: the capture journal off the shared volume; additive) ------------
#: where the agent container mounts its node-local state directory (values.yaml agent.stateDir, a hostPath
#: only this node's agent mounts): the capture journal lives there, never on the artifact volume, which
#: every node's agent (and whoever else can write the claim) writes
STATE_DIR_IN_AGENT: Final = "/var/lib/podsnap/state"
ENV_STATE_DIR: Final = "PODSNAP_STATE_DIR"  # the state directory in the agent
CHART_PATHS["stateDir"] = STATE_DIR_IN_AGENT
CHART_ENV["stateDir"] = (ENV_STATE_DIR, (COMPONENT_AGENT,))
