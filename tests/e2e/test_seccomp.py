"""podsnap's seccomp profile as the kubelet and the container runtime apply it: any pod may name it (Pod
Security "restricted" accepts every Localhost profile), so naming it, or the old name earlier charts
installed a permissive profile under, must give no user namespace; io_uring fails with ENOSYS. An
Unconfined pod of the same image shows the attack works on this cluster at all. (That the demo worker
is captured and restored under the profile is test_wait_for_checkpoint.py's.)"""

from __future__ import annotations

import json

import pytest

from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import run_python_pod
from tests.e2e.support.k8s import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PROBE = r"""
import ctypes, errno, json, platform
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"unshare": 272, "io_uring_setup": 425}, "aarch64": {"unshare": 97, "io_uring_setup": 425}}
nr = NR[platform.machine()]
def call(n, *args):
    return 0 if libc.syscall(n, *args) >= 0 else errno.errorcode[ctypes.get_errno()]
out = {"io_uring_setup": call(nr["io_uring_setup"], 8, ctypes.create_string_buffer(120))}
out["unshare(CLONE_NEWUSER)"] = call(nr["unshare"], 0x10000000)
print(json.dumps(out))
"""


def probe(cluster: Cluster, cfg: E2EConfig, namespace: str, name: str, profile: dict[str, str]) -> dict[str, object]:
    phase, log = run_python_pod(cluster, cfg, namespace, name, script=PROBE, security={"seccompProfile": profile})
    assert phase == "Succeeded", f"{name}: {phase}"
    return json.loads(log.strip().splitlines()[-1])


def test_a_pod_naming_podsnaps_profile_or_its_old_name_gets_no_user_namespace_and_no_io_uring(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    unconfined = probe(cluster, podsnap, namespace, "unconfined", {"type": "Unconfined"})
    if unconfined["unshare(CLONE_NEWUSER)"] != 0:
        pytest.skip(f"this cluster's nodes refuse user namespaces to any container: {unconfined}")
    for name, localhost in (("profile", "podsnap/capture-v2.json"), ("old-name", "podsnap/block-io-uring.json")):
        got = probe(cluster, podsnap, namespace, name, {"type": "Localhost", "localhostProfile": localhost})
        assert got == {"io_uring_setup": "ENOSYS", "unshare(CLONE_NEWUSER)": "EPERM"}, f"{localhost}: {got}"
