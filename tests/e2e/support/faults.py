"""What the fault tests share: a new replica after a scale-up and its restore verdict, a pod serving cold
after a restore that could not work (and nothing else of the worker left in it), and the clean-up after
which the artifact volume must hold nothing of the test's namespace."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client as kclient

from podsnap import contract
from tests.e2e.support import artifacts
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import CONTAINER, init_id, restored, serving_pods, worker_health
from tests.e2e.support.k8s import Cluster, Pending, condition, pod_condition, pod_ready, wait_until


def new_pod_after_scale(
    cluster: Cluster, cfg: E2EConfig, namespace: str, app: str, *, known: set[str], replicas: int
) -> str:
    """Scales the Deployment to `replicas`; the name of a pod of it not in `known`."""
    cluster.apps.patch_namespaced_deployment_scale(app, namespace, {"spec": {"replicas": replicas}})

    def created() -> str | None:
        fresh = [p.metadata.name for p in serving_pods(cluster, namespace, app) if p.metadata.name not in known]
        return fresh[0] if fresh else None

    return str(wait_until(created, timeout=cfg.timeout_s, what=f"a new pod of {namespace}/{app}"))


def restore_verdict(cluster: Cluster, cfg: E2EConfig, namespace: str, pod: str) -> str:
    """The pod's Restored condition once it is past RestoreInProgress, as "Status/Reason"."""

    def terminal() -> str | None:
        state = restored(cluster.core.read_namespaced_pod(pod, namespace))
        return state if state and not state.endswith(contract.REASON_RESTORE_IN_PROGRESS) else None

    return str(wait_until(terminal, timeout=cfg.timeout_s, what=f"a restore verdict on pod {pod}"))


def restored_condition(cluster: Cluster, namespace: str, pod: str) -> kclient.V1PodCondition:
    cond = pod_condition(cluster.core.read_namespaced_pod(pod, namespace), contract.POD_CONDITION_RESTORED)
    assert cond is not None, f"pod {pod} has no {contract.POD_CONDITION_RESTORED} condition"
    return cond


def settled(cluster: Cluster, cfg: E2EConfig, namespace: str, app: str) -> set[str]:
    """The workload's pods once each has a restore verdict, so what follows only touches new pods."""

    def verdicts() -> set[str] | Pending:
        pods = serving_pods(cluster, namespace, app)
        states = {p.metadata.name: restored(p) for p in pods}
        done = pods and all(s and not s.endswith(contract.REASON_RESTORE_IN_PROGRESS) for s in states.values())
        return set(states) if done else Pending(str(states))

    return wait_until(verdicts, timeout=cfg.timeout_s, what=f"a restore verdict on the pods of {namespace}/{app}")


def assert_serves_cold(
    cluster: Cluster,
    cfg: E2EConfig,
    namespace: str,
    pod: str,
    *,
    source_ids: set[str],
    cause: str = "",
    timeout: float | None = None,
) -> dict[str, Any]:
    """The pod whose restore failed serves anyway, from a worker started cold (not the captured process),
    within `timeout` (default: one wait), its placeholder having been told why (`cause`, the reason the
    agent gave); its /health answer."""

    def serving() -> dict[str, Any] | Pending:
        obj = cluster.core.read_namespaced_pod(pod, namespace)
        return worker_health(cluster, namespace, pod, cfg.demo_port) if pod_ready(obj) else Pending("not Ready")

    body = wait_until(
        serving, timeout=timeout or cfg.timeout_s, what=f"pod {pod} serving cold after its restore did not happen"
    )
    assert init_id(body) not in source_ids, "a restore that did not happen must not leave the captured process serving"
    log = cluster.core.read_namespaced_pod_log(pod, namespace, container=CONTAINER)
    assert f"the restore failed: {cause}" in log and "starting the worker cold" in log, log[-2000:]
    return body


#: the demo workers in the pod's PID namespace (shareProcessNamespace): the processes running
#: `python -m podsnap.demo` that are not podsnap-run (whose own command line names the worker's too)
DEMO_WORKERS = """
import json, os
found = []
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace").split("\\0")
    except OSError:
        continue
    if any(a.endswith("podsnap-run") for a in argv):
        continue
    if any(a == "-m" and b == "podsnap.demo" for a, b in zip(argv, argv[1:])):
        found.append(int(p))
print(json.dumps(sorted(found)))
"""


def demo_workers(cluster: Cluster, namespace: str, pod: str) -> list[int]:
    """PIDs (as the pod sees them) of every demo worker process in the pod."""
    out = cluster.kubectl("exec", "-n", namespace, pod, "-c", CONTAINER, "--", "python3", "-c", DEMO_WORKERS)
    return list(json.loads(out.stdout))


def assert_one_worker(cluster: Cluster, namespace: str, pod: str, serving: dict[str, Any]) -> None:
    """Nothing half-restored is left in the pod: the one demo worker in it is the one that answers."""
    pids = demo_workers(cluster, namespace, pod)
    assert pids == [serving["pid"]], f"demo workers in pod {pod}: {pids}; the one serving is {serving['pid']}"


def contents_of_namespace(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [
        c
        for c in cluster.list_custom(contract.PLURAL_POD_SNAPSHOT_CONTENTS)
        if ((c.get("spec") or {}).get("podSnapshotRef") or {}).get("namespace") == namespace
    ]


def clean_up(cluster: Cluster, cfg: E2EConfig, namespace: str, app: str, node: str) -> None:
    """Deletes the workload and its policy (deletionPolicy Delete), waits until the namespace's
    PodSnapshots and their contents are gone, and asserts that the artifact volume holds nothing of the
    namespace: no artifact, capture staging dir, artifact renamed aside for deletion, or empty dir."""
    cluster.kubectl(
        "delete", "-n", namespace, f"snapshotpolicy/{app}", f"deployment/{app}", f"service/{app}",
        "--ignore-not-found", "--wait=true", timeout=cfg.timeout_s,
    )  # fmt: skip
    for plural in (contract.PLURAL_SNAPSHOT_JOBS, contract.PLURAL_POD_SNAPSHOTS):
        wait_until(
            lambda p=plural: (
                not cluster.list_custom(p, namespace)
                or Pending(str([o["metadata"]["name"] for o in cluster.list_custom(p, namespace)]))
            ),
            timeout=cfg.timeout_s,
            what=f"the {plural} of {namespace} to be deleted",
        )
    wait_until(
        lambda: (
            not contents_of_namespace(cluster, namespace)
            or Pending(str([condition(c, contract.COND_READY) for c in contents_of_namespace(cluster, namespace)]))
        ),
        timeout=cfg.timeout_s,
        what=f"the PodSnapshotContents of {namespace} to be deleted",
    )
    left = artifacts.leftovers(cluster, cfg, node, namespace)
    assert not left, f"the artifact volume still holds, for namespace {namespace}: {left}"


def warning_event(cluster: Cluster, cfg: E2EConfig, namespace: str, name: str, reason: str) -> str:
    """The message of the Warning Event `reason` on object `name` of `namespace` (waiting for it)."""

    def posted() -> str | Pending:
        events = cluster.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        found = [e.message for e in events if e.type == "Warning" and e.reason == reason]
        return found[-1] if found else Pending(str([(e.type, e.reason) for e in events]))

    return wait_until(posted, timeout=cfg.timeout_s, what=f"a Warning Event {reason} on {namespace}/{name}")


def fallback_cause(cond: kclient.V1PodCondition) -> str:
    """The cause a FellBackToColdStart message names first ("Cause: ...")."""
    assert cond.status == "False" and cond.reason == contract.REASON_FELL_BACK_TO_COLD_START, (
        f"{cond.status}/{cond.reason}: {cond.message}"
    )
    return (cond.message or "").split(":", 1)[0]


# --- the node agent, killed or away --------------------------------------------------------------
#: run in the agent's container (hostPID): finds its podsnap-agent process (in its own cgroup, as in
#: test_availability.py), says so, then watches the host's processes and SIGKILLs the agent the moment a
#: CRIU restore it started runs (CRIU's own `restore --no-default-config` command line, under the agent):
#: the restore is then past its gates, RestoreInProgress is on the pod, and the tree may be half restored
KILL_AGENT_MID_RESTORE = """
import os, signal, sys, time
def cmdline(p):
    return open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")
def ppid(p):
    return int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
mine = open("/proc/self/cgroup").read()
agents = set()
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        # this script's own command line names the agent too
        if int(p) != os.getpid() and open(f"/proc/{p}/cgroup").read() == mine and any(
            os.path.basename(a) == b"podsnap-agent" for a in cmdline(p)
        ):
            agents.add(int(p))
    except OSError:
        pass
print("agent", sorted(agents), flush=True)
if not agents:
    sys.exit(2)
def under_agent(p):
    for _ in range(8):
        p = ppid(p)
        if p in agents:
            return True
        if p <= 1:
            return False
    return False
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = cmdline(p)
            if b"restore" in argv and b"--no-default-config" in argv and under_agent(int(p)):
                # said first: the kill ends this process too, and may cut its output short
                print("killing", sorted(agents), "while criu runs as pid", p, flush=True)
                for a in agents:
                    os.kill(a, signal.SIGKILL)
                sys.exit(0)
        except (OSError, ValueError, IndexError):
            continue
    time.sleep(0.005)
print("no restore began", flush=True)
sys.exit(3)
"""


class AgentKiller:
    """KILL_AGENT_MID_RESTORE running in the agent pod of a node (kubectl exec in the background)."""

    def __init__(self, cluster: Cluster, cfg: E2EConfig, node: str, timeout: float) -> None:
        self.pod = artifacts.agent_pod(cluster, cfg, node)
        argv = [
            "exec", "-n", cfg.release_namespace, self.pod, "-c", "agent", "--",
            "python3", "-c", KILL_AGENT_MID_RESTORE, str(timeout),
        ]  # fmt: skip
        kubectl = cluster.kubectl_argv(*argv)
        self.proc = subprocess.Popen(kubectl, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline().strip()
        assert self.first.startswith("agent [") and self.first != "agent []", (
            f"no podsnap-agent process found in {self.pod}: {self.first} {self.proc.stdout.read()}"
        )
        self.timeout = timeout

    def killed(self) -> str:
        """Waits for the watcher; what it said, or why the agent was not killed mid-restore."""
        try:
            out, _ = self.proc.communicate(timeout=self.timeout + 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        # the kill ends the exec too: its last words may not make it, kubectl's exit status (137) does
        assert "killing" in out or "exit code 137" in out, f"the agent was not killed mid-restore: {self.first} / {out}"
        return out.strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def wait_agent_rolled_out(cluster: Cluster, cfg: E2EConfig) -> None:
    cluster.kubectl(
        "rollout", "status", f"daemonset/{cfg.agent_daemonset}", "-n", cfg.release_namespace,
        f"--timeout={int(cfg.timeout_s)}s", timeout=cfg.timeout_s + 30,
    )  # fmt: skip


#: a node label no node has: the agent DaemonSet selecting it runs nowhere
ABSENT_LABEL = "podsnap.io/e2e-agent-absent"


@contextmanager
def agent_absent(cluster: Cluster, cfg: E2EConfig) -> Iterator[None]:
    """No node agent runs while inside: its DaemonSet selects a node label no node has, and its pods are
    deleted at once (an agent stopping normally may take its grace period to finish a capture). On exit the
    selector is back and the agents roll out again."""
    selector = {"spec": {"template": {"spec": {"nodeSelector": {ABSENT_LABEL: "true"}}}}}
    cluster.apps.patch_namespaced_daemon_set(cfg.agent_daemonset, cfg.release_namespace, selector)
    try:
        for pod in artifacts.agent_pods(cluster, cfg):
            cluster.kubectl(
                "delete", "pod", "-n", cfg.release_namespace, pod, "--grace-period=0", "--force", "--wait=false"
            )
        ds = cluster.apps.read_namespaced_daemon_set(cfg.agent_daemonset, cfg.release_namespace)
        labels = ",".join(f"{k}={v}" for k, v in (ds.spec.selector.match_labels or {}).items())
        wait_until(
            lambda: not cluster.core.list_namespaced_pod(cfg.release_namespace, label_selector=labels).items,
            timeout=cfg.timeout_s,
            what="no agent pod left",
        )
        yield
    finally:
        back = {"spec": {"template": {"spec": {"nodeSelector": {ABSENT_LABEL: None}}}}}
        cluster.apps.patch_namespaced_daemon_set(cfg.agent_daemonset, cfg.release_namespace, back)
        wait_agent_rolled_out(cluster, cfg)


@contextmanager
def operator_env(cluster: Cluster, cfg: E2EConfig, name: str, value: str) -> Iterator[None]:
    """The operator runs with environment variable `name` set to `value` while inside (its Deployment
    patched and rolled out), and with what it had before afterwards."""
    deployment = cluster.apps.read_namespaced_deployment(cfg.operator_deployment, cfg.release_namespace)
    [container] = [c for c in deployment.spec.template.spec.containers if c.name == "operator"]
    before = next((e.value for e in container.env or [] if e.name == name), None)

    def set_to(v: str | None) -> None:
        setting = f"{name}={v}" if v is not None else f"{name}-"
        cluster.kubectl(
            "set", "env", f"deployment/{cfg.operator_deployment}", "-n", cfg.release_namespace, "-c", "operator",
            setting,
        )  # fmt: skip
        cluster.kubectl(
            "rollout", "status", f"deployment/{cfg.operator_deployment}", "-n", cfg.release_namespace,
            f"--timeout={int(cfg.timeout_s)}s", timeout=cfg.timeout_s + 30,
        )  # fmt: skip

    set_to(value)
    try:
        yield
    finally:
        set_to(before)
