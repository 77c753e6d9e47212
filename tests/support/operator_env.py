"""The operator and one node agent against a real kube-apiserver (the chart's CRDs, RBAC and webhook
configuration, each component under its own ServiceAccount's token), with the kubelet's part played by
the tests (tests/support/harness.py), and the objects and steps the operator tests share."""

from __future__ import annotations

import base64
import contextlib
import datetime
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from podsnap import contract as c
from podsnap.agent import main as agent_main
from podsnap.agent.config import AgentConfig
from podsnap.agent.runtime import AgentContext
from podsnap.kube.client import Credentials, Kube, get_or_none
from podsnap.kube.conditions import now_rfc3339, parse_time
from podsnap.kube.tokens import CAPTURE, KEY_FILE, RESTORE, Claims
from podsnap.operator import main as operator_main
from podsnap.operator.agent_absence import ABSENCE_CONFIGMAP
from podsnap.operator.config import OperatorConfig
from podsnap.operator.on_agent_requests import AGENT_LABELS
from podsnap.operator.runtime import OperatorContext
from tests.support.controlplane import ControlPlane, free_port
from tests.support.harness import RELEASE_NS, Cluster, ContainerProcess, KopfThread, cond_is, render_chart
from tests.support.recording import SOURCE, RecordingExecutor
from tests.support.tools import REPO, require_tool
from tests.support.waiting import wait_for

NODE = "node-a"
OTHER_NODE = "node-b"
OPERATOR_SA = "podsnap-operator"
AGENT_SA = "podsnap-agent"
#: short, so that tests see a failed capture retried and a lost artifact noticed within their waits
RETRY_BASE_S = 3.0
VERIFY_INTERVAL_S = 1.0
#: short, so that a deletion on a node without a running agent is handed over (or released) within the waits
CLEANUP_HANDOVER_S = 3
READY_CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
    "lastHeartbeatTime": "2026-12-01T00:00:00Z",
    "lastTransitionTime": "2026-12-01T00:00:00Z",
}
#: what the kubelet reports a node can hold (a scheduler, tests/support/scheduler.py, needs room on it)
ALLOCATABLE = {"cpu": "16", "memory": "64Gi", "pods": "110"}
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@dataclass
class Env:
    cluster: Cluster
    operator: KopfThread
    agent: KopfThread
    executor: RecordingExecutor
    artifact_root: Path
    operator_kubeconfig: Path
    agent_kubeconfig: Path
    webhook_port: int
    chart_docs: list[dict[str, Any]]
    #: the control plane's admin credentials (for parts the tests play: a scheduler)
    admin_kubeconfig: Path | None = None

    @property
    def operator_ctx(self) -> OperatorContext:
        ctx = self.operator.ctx
        assert isinstance(ctx, OperatorContext)
        return ctx

    @property
    def agent_ctx(self) -> AgentContext:
        ctx = self.agent.ctx
        assert isinstance(ctx, AgentContext)
        return ctx

    def stop(self) -> None:
        self.agent.stop()
        self.operator.stop()
        self.cluster.cleanup()


def _apply(cp: ControlPlane, docs: list[dict[str, Any]]) -> None:
    # --validate=false: kubectl checks against the 1.20 server's OpenAPI, which predates x-kubernetes-validations
    # (the server itself drops that field; the operator re-checks immutability)
    got = cp.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert got.returncode == 0, f"kubectl apply failed: {got.stderr}"


def start_env(cp: ControlPlane, tmp: Path) -> Env:
    """Install the chart's CRDs, RBAC and webhook configuration into `cp`; start the operator and the agent."""
    helm = require_tool("helm")
    require_tool("kubectl")
    docs = render_chart(helm, REPO / "charts" / "podsnap")
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    _apply(cp, crds)
    for crd in crds:
        cp.kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=30s")
    cp.kubectl("create", "namespace", RELEASE_NS)
    _apply(cp, [d for d in docs if d["kind"] in RBAC_KINDS])

    admin = Kube(Credentials.load(cp.kubeconfig).api_client())
    cluster = Cluster(kube=admin, kubectl=cp.kubectl)
    for node in (NODE, OTHER_NODE):  # the kubelet registers its Node and reports it Ready
        admin.core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
        admin.core.patch_node_status(
            node, {"status": {"conditions": [READY_CONDITION], "capacity": ALLOCATABLE, "allocatable": ALLOCATABLE}}
        )
        # the API server tainted it not-ready when it was created; the node lifecycle controller (not run here)
        # lifts that once the node is Ready
        admin.core.patch_node(node, {"spec": {"taints": None}})

    op_kc = cp.token_kubeconfig(
        cp.service_account_token(RELEASE_NS, OPERATOR_SA), tmp / "operator.kubeconfig", "operator"
    )
    legacy_kc = cp.token_kubeconfig(cp.service_account_token(RELEASE_NS, AGENT_SA), tmp / "legacy.kubeconfig", "agent")
    agent_kc = agent_kubeconfig(cluster, NODE, legacy_kc, tmp / "agent.kubeconfig")
    # node-a's agent runs (in a thread), so its kubelet reports its pod Ready; node-b runs none
    set_agent_ready(cluster, NODE, True)

    # webhook TLS for 127.0.0.1 (the chart's own certificate names the Service, which has no endpoint here)
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_dir = tmp / "webhook-tls"
    cert_dir.mkdir()
    cert.cert_chain_pems[0].write_to_path(str(cert_dir / "tls.crt"))
    cert.private_key_pem.write_to_path(str(cert_dir / "tls.key"))
    port = free_port()
    webhooks = [d for d in docs if d["kind"] in WEBHOOK_KINDS]
    assert {d["kind"] for d in webhooks} == set(WEBHOOK_KINDS)
    for config in webhooks:
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca.cert_pem.bytes()).decode(),
            }
            if config["kind"] == "MutatingWebhookConfiguration":
                assert hook["failurePolicy"] == "Ignore"
    _apply(cp, webhooks)

    # the key of podsnap's pod tokens, shared by the operator and the agent as the chart's Secret is
    token_key_dir = tmp / "token-key"
    token_key_dir.mkdir()
    (token_key_dir / KEY_FILE).write_bytes(secrets.token_hex(32).encode())
    op_config = OperatorConfig(
        kubeconfig=str(op_kc),
        token_key_dir=token_key_dir,
        seccomp_profile="podsnap/checkpoint.json",
        webhook_port=port,
        webhook_host="127.0.0.1",
        webhook_cert_dir=cert_dir,
        webhook_cert_check_s=0.5,  # a renewal test waits for the reload
        metrics_port=0,
        health_port=0,
        capture_retry_base_s=RETRY_BASE_S,
        cleanup_handover_s=CLEANUP_HANDOVER_S,
    )
    artifact_root = tmp / "artifacts"
    executor = RecordingExecutor()
    agent_config = AgentConfig(
        node_name=NODE,
        kubeconfig=str(agent_kc),
        artifact_root=artifact_root,
        token_key_dir=token_key_dir,
        metrics_port=0,
        health_port=0,
        verify_interval_s=VERIFY_INTERVAL_S,
        state_dir=tmp / "agent-state",  # node-local, as the chart's hostPath: not on the artifact volume
    )
    operator = KopfThread(
        "operator", operator_main.run, operator_main.build_context(op_config), listens_on=port
    ).start()
    # node-a's host has the facts the recording executor's captures record, so its restore pods are placed there
    context = agent_main.build_context(agent_config, executor, node_facts=lambda: dict(SOURCE))
    agent = KopfThread("agent", agent_main.run, context).start()
    return Env(cluster, operator, agent, executor, artifact_root, op_kc, agent_kc, port, docs, cp.kubeconfig)


def set_agent_ready(cluster: Cluster, node: str, ready: bool) -> None:
    """Play the kubelet of the agent pod of `node` (agent_pod made it): its Ready condition, changed now (the
    operator counts an agent's absence from this lastTransitionTime, operator/agent_absence.py)."""
    cond = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_rfc3339()}
    status = {"phase": "Running", "conditions": [cond]}
    cluster.kube.core.patch_namespaced_pod_status(f"{AGENT_SA}-{node}", RELEASE_NS, {"status": status})


@contextlib.contextmanager
def no_ready_agent(cluster: Cluster) -> Iterator[None]:
    """Node-a's agent pod reports not Ready meanwhile (its agent still runs): no node has a Ready agent."""
    set_agent_ready(cluster, NODE, False)
    try:
        yield
    finally:
        set_agent_ready(cluster, NODE, True)


def agent_pod(cluster: Cluster, node: str) -> Any:
    """The agent pod of `node` as the DaemonSet makes it (the kubelet's part, its status, is set_agent_ready's)."""
    name = f"{AGENT_SA}-{node}"
    pod = get_or_none(cluster.kube.core.read_namespaced_pod, name, RELEASE_NS)
    if pod is None:
        body = {
            "metadata": {"name": name, "labels": dict(AGENT_LABELS)},
            "spec": {
                "serviceAccountName": AGENT_SA,
                "automountServiceAccountToken": False,
                "nodeName": node,
                "containers": [{"name": "agent", "image": "podsnap-agent"}],
            },
        }
        pod = cluster.kube.core.create_namespaced_pod(RELEASE_NS, body)
    return pod


def remove_agent_pod(env: Env, node: str) -> None:
    """The DaemonSet takes its agent off `node` (say, its nodeSelector changed): the pod goes."""
    with contextlib.suppress(ApiException):
        env.cluster.kube.core.delete_namespaced_pod(f"{AGENT_SA}-{node}", RELEASE_NS, grace_period_seconds=0)
    wait_for(lambda: get_or_none(env.cluster.kube.core.read_namespaced_pod, f"{AGENT_SA}-{node}", RELEASE_NS) is None,
             what=f"the agent pod of {node} gone")  # fmt: skip


def recorded_absence(env: Env, node: str) -> datetime.datetime | None:
    """Since when the operator has recorded `node` without a Ready agent (operator/agent_absence.py)."""
    cm = get_or_none(env.cluster.kube.core.read_namespaced_config_map, ABSENCE_CONFIGMAP, RELEASE_NS)
    return parse_time(((cm and cm.data) or {}).get(node))


def age_s(when: datetime.datetime | str | None) -> float:
    moment = parse_time(when) if isinstance(when, str) or when is None else when
    assert moment is not None
    return (datetime.datetime.now(datetime.UTC) - moment).total_seconds()


def agent_kubeconfig(cluster: Cluster, node: str, template: Path, path: Path) -> Path:
    """The agent's credentials as the chart gives them: a token bound to an agent pod on `node` (the API
    server names that pod in each request; the operator's webhook takes the agent's node from it).
    `template` is any kubeconfig of this control plane; its token is replaced."""
    name = f"{AGENT_SA}-{node}"
    pod = agent_pod(cluster, node)
    bound = {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": pod.metadata.uid}
    request = {"spec": {"audiences": [], "expirationSeconds": 86400, "boundObjectRef": bound}}
    token = cluster.kube.core.create_namespaced_service_account_token(AGENT_SA, RELEASE_NS, request).status.token
    doc = yaml.safe_load(template.read_text())
    for user in doc["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(doc))
    return path


# --- objects ----------------------------------------------------------------------------------------


def snapshot_job(name: str, *, containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": "worker"}},
        "spec": {
            "containers": containers
            or [
                {
                    "name": "main",
                    "image": "worker:1",
                    "command": ["python", "-m", "worker"],
                    "livenessProbe": {"httpGet": {"path": "/health", "port": 8000}},
                    "startupProbe": {"httpGet": {"path": "/health", "port": 8000}},
                }
            ]
        },
    }
    return {"kind": c.KIND_SNAPSHOT_JOB, "metadata": {"name": name}, "spec": {"podTemplate": template, **spec}}


def capture_pod(env: Env, ns: str, job: str) -> dict[str, Any]:
    pods = wait_for(lambda: env.cluster.pods(ns, f"{c.LABEL_SNAPSHOT_JOB}={job}"), timeout=30, what="capture pod")
    return pods[0]


def kubelet_starts_capture_pod(env: Env, ns: str, job: str, *, ready: bool = True) -> tuple[dict[str, Any], Any]:
    """The kubelet's part: bind the Job's pod to NODE, run its container, report it Ready."""
    pod = capture_pod(env, ns, job)
    name = pod["metadata"]["name"]
    env.cluster.kubelet_bind(ns, name, NODE)
    proc = env.cluster.kubelet_container()
    env.cluster.kubelet_run(ns, name, ready=ready, container_ids={"main": proc.container_id})
    return pod, proc


def capture_token(env: Env, ns: str, container: str = "main", job: str = "s") -> str:
    """What the operator puts on a SnapshotJob's pod template: the mark of a capture source, for the
    PodSnapshot of SnapshotJob `job` (which a SnapshotJob names after itself)."""
    return env.operator_ctx.tokens.mint(Claims(CAPTURE, ns, container, job))


def restore_token(env: Env, ns: str, snapshot: str, container: str = "main", *, skip_compat: bool = False) -> str:
    """What the webhook puts on a pod it shapes for restore."""
    return env.operator_ctx.tokens.mint(Claims(RESTORE, ns, container, snapshot, skip_compat))


def running_pod(
    env: Env,
    ns: str,
    name: str,
    node: str = NODE,
    *,
    ready: bool = True,
    token: str | None = "mint",
    job: str = "s",
) -> tuple[dict[str, Any], Any]:
    """A pod the kubelet (played here) has started on `node`; returns (pod, its container process). It carries a
    valid capture token (as a SnapshotJob's pod does), for PodSnapshot `job`, unless `token` is None or another
    value."""
    minted = capture_token(env, ns, job=job) if token == "mint" else token
    annotations = {} if minted is None else {c.ANNOTATION_CAPTURE_TOKEN: minted}
    env.cluster.kube.core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "worker:1"}]},
        },
    )
    env.cluster.kubelet_bind(ns, name, node)
    proc = env.cluster.kubelet_container()
    env.cluster.kubelet_run(ns, name, ready=ready, container_ids={"main": proc.container_id})
    pod = env.cluster.pod(ns, name)
    assert pod is not None
    return pod, proc


def podsnapshot(name: str, pod: str, uid: str | None = None, container: str = "main") -> dict[str, Any]:
    ref: dict[str, Any] = {"name": pod, "containers": [container]}
    if uid:
        ref["uid"] = uid
    return {"kind": c.KIND_POD_SNAPSHOT, "metadata": {"name": name}, "spec": {"source": {"podRef": ref}}}


def get_snap(env: Env, ns: str, name: str) -> dict[str, Any] | None:
    return env.cluster.get(c.PLURAL_POD_SNAPSHOTS, name, ns)


def failed_with(env: Env, ns: str, name: str, reason: str) -> dict[str, Any]:
    return wait_for(
        lambda: cond_is(s := get_snap(env, ns, name), c.COND_FAILED, reason=reason) and s,
        what=f"{name} Failed/{reason}",
    )


def pod_template(app: str, control_dir: Path, image: str = "worker:1") -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["python", "-m", "worker"],
                    "env": [{"name": c.ENV_CONTROL_DIR, "value": str(control_dir)}, {"name": "MODEL", "value": "tiny"}],
                }
            ]
        },
    }


def deployment(name: str, replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template,
        },
    }


def policy(name: str, kind: str, target: str, **spec: Any) -> dict[str, Any]:
    return {
        "kind": c.KIND_SNAPSHOT_POLICY,
        "metadata": {"name": name},
        "spec": {"targetRef": {"kind": kind, "name": target}, **spec},
    }


def get_policy(env: Env, ns: str, name: str) -> dict[str, Any] | None:
    return env.cluster.get(c.PLURAL_SNAPSHOT_POLICIES, name, ns)


def ready_policy(env: Env, ns: str, name: str) -> dict[str, Any]:
    return wait_for(
        lambda: ((p := get_policy(env, ns, name)) or {}).get("status", {}).get("ready") and p,
        timeout=30,
        what=f"policy {name} ready",
    )


def kubelet_runs_restore_pod(env: Env, ns: str, pod: dict[str, Any], control_dir: Path) -> ContainerProcess:
    """The kubelet's part for a restore pod: bind it, run its placeholder container, report it running (not Ready)."""
    name = pod["metadata"]["name"]
    env.cluster.kubelet_bind(ns, name, NODE)
    proc = env.cluster.kubelet_container({c.ENV_CONTROL_DIR: str(control_dir), "MODEL": "tiny"})
    env.cluster.kubelet_run(ns, name, ready=False, container_ids={"main": proc.container_id})
    return proc


def shaped(pod: dict[str, Any]) -> bool:
    return c.ANNOTATION_RESTORE_FROM in (pod["metadata"].get("annotations") or {})


def golden(env: Env, ns: str) -> None:
    running_pod(env, ns, "source", job="golden")
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("golden", "source"), ns)
    wait_for(lambda: cond_is(env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "golden", ns), c.COND_READY), what="golden Ready")


def ready_policy_of(env: Env, ns: str, template: dict[str, Any]) -> dict[str, Any]:
    """Deployment `web` of `template` (no replicas yet) with SnapshotPolicy `pol` on checkpoint `golden`
    (captured here), the policy Ready; returns the Deployment's ReplicaSet as an ownerReference (the
    controller flag left to the caller)."""
    golden(env, ns)
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, template))
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", checkpointRef={"name": "golden"}), ns
    )
    ready_policy(env, ns, "pol")
    rs = wait_for(lambda: env.cluster.kube.apps.list_namespaced_replica_set(ns).items, what="the ReplicaSet")[0]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs.metadata.name, "uid": rs.metadata.uid}
