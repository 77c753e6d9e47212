"""The operator and agent against a real kube-apiserver, with no kubelet: the kubelet's part, played.

What plays the kubelet's part (there is no kubelet on this machine) is named `kubelet_*` and does only
what a kubelet would: bind a pod to a node, report its status (phase, Ready, container IDs, pod IP),
and run the container's process (`ContainerProcess`: a real `sleep` placed in a cgroup named after
the container ID, below one named after its pod's UID, which is how the agent finds a container's
processes on a real node).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from podsnap import contract as c
from podsnap.kube.client import Kube
from tests.support.waiting import wait_for

T = TypeVar("T")
RELEASE_NS = "podsnap-system"
CGROUP_ROOT = Path("/sys/fs/cgroup/pids")


def render_chart(helm: str, chart: Path, *values: str) -> list[dict[str, Any]]:
    args = [helm, "template", "podsnap", str(chart), "-n", RELEASE_NS]
    for v in values:
        args += ["--set", v]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def cond_is(obj: dict[str, Any] | None, type_: str, status: str = "True", reason: str | None = None) -> bool:
    cond = condition(obj, type_)
    return cond is not None and cond["status"] == status and (reason is None or cond["reason"] == reason)


class KopfThread:
    """Runs a component's `run(ctx, stop_flag=, ready_flag=)` in a thread with its own event loop."""

    def __init__(
        self, name: str, run: Callable[..., Coroutine[Any, Any, None]], ctx: Any, *, listens_on: int | None = None
    ) -> None:
        self.name, self.run, self.ctx = name, run, ctx
        #: a port the component serves (the operator's webhooks): started means listening there too, since
        #: kopf reports ready before its webhook server binds, and the validating webhook fails closed
        self.listens_on = listens_on
        self.thread: threading.Thread | None = None
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> KopfThread:
        self.stop_flag = threading.Event()
        ready = threading.Event()

        def main() -> None:
            try:
                asyncio.run(self.run(self.ctx, stop_flag=self.stop_flag, ready_flag=ready))
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=main, name=self.name, daemon=True)
        self.thread.start()
        if not ready.wait(timeout):
            raise AssertionError(f"{self.name} not ready after {timeout} s (error: {self.error!r})")
        if self.listens_on:
            port = self.listens_on
            wait_for(lambda: socket.create_connection(("127.0.0.1", port), 1).close() is None, what=f"port {port}")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self.thread is None:
            return
        self.stop_flag.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} did not stop"
        self.thread = None


def pod_cgroup(pod_uid: str, container_id: str, *, systemd: bool = False) -> Path:
    """Where a kubelet and containerd put a container of pod `pod_uid`, under the test's own cgroup: the
    cgroupfs driver's `pod<uid>/<id>` (the local e2e cluster's, hack/cluster/kubelet-config.yaml), or the
    systemd driver's `kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope`."""
    if systemd:
        pod = f"kubepods-besteffort-pod{pod_uid.replace('-', '_')}.slice"
        return CGROUP_ROOT / "podsnap-test" / pod / f"cri-containerd-{container_id}.scope"
    return CGROUP_ROOT / "podsnap-test" / f"pod{pod_uid}" / container_id


@dataclass
class ContainerProcess:
    """A container's main process as a kubelet + runtime would leave it: a real process in its pod's
    container cgroup (`pod_cgroup`), with the container's environment. Until `kubelet_run` tells it its pod
    (`place`), it waits in a cgroup of no pod, where the agent does not find it."""

    container_id: str
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    pod_uid: str | None = None
    systemd: bool = False

    @property
    def cgroup(self) -> Path:
        if self.pod_uid is None:
            return CGROUP_ROOT / "podsnap-test" / f"unplaced-{self.container_id}"
        return pod_cgroup(self.pod_uid, self.container_id, systemd=self.systemd)

    def start(self) -> ContainerProcess:
        self.cgroup.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env}
        self.proc = subprocess.Popen(["sleep", "600"], env=env, start_new_session=True)
        (self.cgroup / "cgroup.procs").write_text(str(self.proc.pid))
        return self

    def place(self, pod_uid: str) -> None:
        """Into the container cgroup of pod `pod_uid` (what the runtime does when the pod sandbox exists)."""
        before = self.cgroup
        self.pod_uid = pod_uid
        self.cgroup.mkdir(parents=True, exist_ok=True)
        for pid in (before / "cgroup.procs").read_text().split():
            (self.cgroup / "cgroup.procs").write_text(pid)
        _remove_cgroup(before)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        _remove_cgroup(self.cgroup)


def _remove_cgroup(cgroup: Path) -> None:
    """The cgroup and its pod's, once empty (another test's process may still be in a parent: left then)."""
    for d in (cgroup, cgroup.parent):
        if d == CGROUP_ROOT / "podsnap-test":
            return
        with contextlib.suppress(OSError):
            d.rmdir()


@functools.cache
def cgroups_writable() -> str | None:
    """None when the test can place processes in cgroups (root, cgroup v1 pids); else why not."""
    probe = CGROUP_ROOT / "podsnap-test" / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir(parents=True)
        probe.rmdir()
    except OSError as exc:
        return f"cannot create cgroups under {CGROUP_ROOT} ({exc}); run as root on a cgroup-v1 host"
    return None


def image_id(image: str) -> str:
    """What containerd reports as a container's imageID: the repository and the digest the tag resolved to
    (here a digest derived from the reference, so one image reference always resolves the same)."""
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"docker.io/library/{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def new_container_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


@dataclass
class Cluster:
    """The test's view of the control plane: admin API access plus the kubelet's part."""

    kube: Kube
    kubectl: Callable[..., subprocess.CompletedProcess[str]]
    processes: list[ContainerProcess] = field(default_factory=list)

    def namespace(self, name: str) -> str:
        with contextlib.suppress(Exception):
            self.kube.core.create_namespace({"metadata": {"name": name}})
        wait_for(
            lambda: any(
                sa.metadata.name == "default" for sa in self.kube.core.list_namespaced_service_account(name).items
            ),
            what=f"default ServiceAccount in {name}",
        )
        return name

    def get(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.kube.get_cr(plural, name, namespace)

    def create(self, plural: str, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        body = {"apiVersion": c.API_VERSION, **body}
        if namespace is None:
            return dict(self.kube.custom.create_cluster_custom_object(c.GROUP, c.VERSION, plural, body))
        return dict(self.kube.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, namespace, plural, body))

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.sanitize(self.kube.core.read_namespaced_pod(name, namespace))
        except Exception:
            return None

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        items = self.kube.core.list_namespaced_pod(namespace, label_selector=selector).items
        return [self.kube.sanitize(p) for p in items]

    # --- the kubelet's part ----------------------------------------------------------------------
    def kubelet_bind(self, namespace: str, pod: str, node: str) -> None:
        """What the scheduler + kubelet do: put the pod on `node`."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.kube.core.create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)

    def kubelet_run(
        self,
        namespace: str,
        pod: str,
        *,
        ready: bool,
        container_ids: dict[str, str] | None = None,
        phase: str = "Running",
        pod_ip: str = "10.244.0.7",
    ) -> None:
        """What the kubelet reports: phase, Ready, and each container's ID and state."""
        obj = self.pod(namespace, pod)
        assert obj is not None, f"pod {namespace}/{pod} missing"
        ids = container_ids or {}
        for proc in self.processes:  # the runtime starts each container in its pod's cgroup, once
            if proc.container_id in ids.values() and proc.pod_uid is None:
                proc.place(obj["metadata"]["uid"])
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        running = phase == "Running"
        statuses = [
            {
                "name": ct["name"],
                "image": ct.get("image", "img"),
                "imageID": image_id(ct.get("image", "img")),
                "ready": ready and running,
                "restartCount": 0,
                "containerID": f"containerd://{ids.get(ct['name'], new_container_id())}",
                "state": {"running": {"startedAt": now}} if running else {"terminated": {"exitCode": 0}},
            }
            for ct in obj["spec"]["containers"]
        ]
        status = {
            "phase": phase,
            "podIP": pod_ip,
            "hostIP": "10.0.0.2",
            "startTime": now,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True" if ready else "False", "lastTransitionTime": now},
            ],
            "containerStatuses": statuses,
        }
        self.kube.core.patch_namespaced_pod_status(pod, namespace, {"status": status})

    def kubelet_container(self, env: dict[str, str] | None = None) -> ContainerProcess:
        reason = cgroups_writable()
        if reason is not None:
            import pytest

            pytest.skip(reason)
        proc = ContainerProcess(new_container_id(), env=env or {}).start()
        self.processes.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.processes:
            proc.stop()
        with contextlib.suppress(OSError):
            (CGROUP_ROOT / "podsnap-test").rmdir()
