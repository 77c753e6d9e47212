"""Availability: what operators of a real cluster do to podsnap must not take restored replicas down, and
a pod never sits Ready with nothing behind it.

A restored worker belongs to its pod's own container (its cgroups), so killing the node agent or rolling
its DaemonSet leaves it serving; a prober asks it for /health every half second throughout. When the
restored worker dies, the pod stops being Ready within seconds and its container restarts cold."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from podsnap import contract
from tests.e2e.support import artifacts
from tests.e2e.support.capture import run_capture
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import init_id, restored, worker_health
from tests.e2e.support.k8s import Cluster, Pending, pod_ready, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
APP = "worker"
RESTORED = f"True/{contract.REASON_RESTORE_SUCCEEDED}"

#: the podsnap-agent process of the container this runs in (the agent has hostPID, so `kill 1` would hit
#: the node's init, and other agents may run on this host): the processes in its own cgroup whose
#: command line is the agent's
FIND_AGENT = """
import os
mine = open("/proc/self/cgroup").read()
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open(f"/proc/{p}/cgroup").read() == mine and b"podsnap-agent" in open(f"/proc/{p}/cmdline", "rb").read():
            print(p)
    except OSError:
        pass
"""


@dataclass
class Prober:
    """GET /health of one pod every `interval` s in a thread; every answer is kept."""

    cluster: Cluster
    namespace: str
    pod: str
    port: int
    interval: float = 0.5
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        path = f"namespaces/{self.namespace}/pods/{self.pod}:{self.port}/proxy/health"
        while not self.stop.is_set():
            status, body = self.cluster.proxy(path, timeout=5)
            if status == 0:
                # no answer within 5 s through the API server's proxy: ask once more with room for a loaded
                # node; a dead worker is refused at once (a 5xx from the proxy), never a slow 0
                status, body = self.cluster.proxy(path, timeout=20)
            self.answers.append((time.monotonic(), status, init_id(body) if status == 200 else str(body)[:200]))
            self.stop.wait(self.interval)

    def failures(self) -> list[tuple[float, int, str]]:
        return [a for a in self.answers if a[1] != 200]


@contextmanager
def probing(cluster: Cluster, namespace: str, pod: str, port: int) -> Iterator[Prober]:
    prober = Prober(cluster, namespace, pod, port)
    thread = threading.Thread(target=prober.run, daemon=True)
    thread.start()
    try:
        yield prober
    finally:
        prober.stop.set()
        thread.join(10)


def agent_restarts(cluster: Cluster, cfg: E2EConfig, pod: str) -> int:
    obj = cluster.core.read_namespaced_pod(pod, cfg.release_namespace)
    return sum(s.restart_count for s in obj.status.container_statuses or [] if s.name == "agent")


def agent_ready(cluster: Cluster, cfg: E2EConfig, pod: str) -> bool:
    obj = cluster.core.read_namespaced_pod(pod, cfg.release_namespace)
    return any(s.name == "agent" and s.ready for s in obj.status.container_statuses or [])


def test_a_restored_replica_outlives_a_killed_and_a_rolled_agent_in_its_own_containers_cgroups(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP)
    [pod] = run.require_serving()
    name = pod.metadata.name
    assert restored(pod) == RESTORED
    before = worker_health(cluster, namespace, name, podsnap.demo_port)

    # the worker is in the pod container's cgroups (a process exec'd into the container lands in them)
    script = f"cat /proc/self/cgroup; echo --; cat /proc/{before['pid']}/cgroup"
    out = cluster.kubectl("exec", "-n", namespace, name, "-c", "main", "--", "sh", "-c", script).stdout
    container, _, worker = out.partition("--")
    assert worker.split() == container.split(), f"restored worker's cgroups:\n{worker}\ncontainer's:\n{container}"

    with probing(cluster, namespace, name, podsnap.demo_port) as prober:
        agent = artifacts.agent_pod(cluster, podsnap, pod.spec.node_name)
        restarts = agent_restarts(cluster, podsnap, agent)

        def agent_pids() -> list[str] | Pending:
            got = cluster.kubectl(
                "exec", "-n", podsnap.release_namespace, agent, "-c", "agent", "--", "python3", "-c", FIND_AGENT,
                check=False,
            )  # fmt: skip
            pids = [p for p in got.stdout.split() if p.isdigit()]
            return pids or Pending(f"no podsnap-agent process (exit {got.returncode}): {got.stderr[-500:]}")

        pids = wait_until(agent_pids, timeout=podsnap.timeout_s, what=f"the podsnap-agent process in {agent}")
        # the kill ends the container, and with it this exec (exit 137)
        cluster.kubectl(
            "exec", "-n", podsnap.release_namespace, agent, "-c", "agent", "--", "kill", "-KILL", *pids, check=False
        )
        wait_until(
            lambda: agent_restarts(cluster, podsnap, agent) > restarts and agent_ready(cluster, podsnap, agent),
            timeout=podsnap.timeout_s,
            what=f"agent {agent} restarted after SIGKILL",
        )
        cluster.kubectl("rollout", "restart", f"daemonset/{podsnap.agent_daemonset}", "-n", podsnap.release_namespace)
        cluster.kubectl(
            "rollout", "status", f"daemonset/{podsnap.agent_daemonset}", "-n", podsnap.release_namespace,
            f"--timeout={int(podsnap.timeout_s)}s", timeout=podsnap.timeout_s + 30,
        )  # fmt: skip
        assert artifacts.agent_pod(cluster, podsnap, pod.spec.node_name) != agent, "the DaemonSet did not roll"
        # a few answers from after the rollout too
        seen = len(prober.answers)
        wait_until(lambda: len(prober.answers) >= seen + 4, timeout=30, what="answers after the rollout")

    assert len(prober.answers) >= 10, prober.answers
    assert not prober.failures(), f"the restored replica stopped answering: {prober.failures()[:5]}"
    assert {a[2] for a in prober.answers} == {init_id(before)}, "the same restored process answered throughout"
    after = cluster.core.read_namespaced_pod(name, namespace)
    assert sum(s.restart_count for s in after.status.container_statuses or []) == 0


def test_a_dead_restored_worker_takes_its_pod_out_of_service_and_the_container_restarts_cold(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP)
    [pod] = run.require_serving()
    name = pod.metadata.name
    assert restored(pod) == RESTORED
    before = worker_health(cluster, namespace, name, podsnap.demo_port)

    cluster.kubectl("exec", "-n", namespace, name, "-c", "main", "--", "kill", "-KILL", str(before["pid"]))
    killed_at = time.monotonic()
    wait_until(
        lambda: not pod_ready(cluster.core.read_namespaced_pod(name, namespace)),
        timeout=podsnap.timeout_s,
        interval=0.2,
        what=f"pod {name} not Ready after its worker died",
    )
    unready_after = time.monotonic() - killed_at
    # the wrapper's and the kubelet's 1 s polls and a status write on a loaded node; without the wrapper the
    # readiness probe's failureThreshold (600) would keep it Ready for minutes
    assert unready_after < 30, f"the pod stayed Ready {unready_after:.1f} s with nothing behind it"

    def serving_again() -> dict | Pending:
        obj = cluster.core.read_namespaced_pod(name, namespace)
        restarts = sum(s.restart_count for s in obj.status.container_statuses or [] if s.name == "main")
        if restarts < 1 or not pod_ready(obj):
            return Pending(f"restarts={restarts} ready={pod_ready(obj)}")
        return worker_health(cluster, namespace, name, podsnap.demo_port)

    after = wait_until(serving_again, timeout=podsnap.timeout_s, what=f"pod {name} serving again after a restart")
    assert init_id(after) != init_id(before), "the restarted container must run a fresh (cold) worker"
    previous = cluster.core.read_namespaced_pod_log(name, namespace, container="main", previous=True)
    assert "the restored worker" in previous and "exited" in previous, previous[-2000:]
    current = cluster.core.read_namespaced_pod_log(name, namespace, container="main")
    assert "starting the worker cold" in current, current[-2000:]
