"""docs/walkthrough.md cannot rot: its ```sh blocks run in order, each with `bash -euo pipefail`, against
the cluster and chart of the e2e session, and each must exit 0; the request of step 5 must be answered
by a restored worker (the init id every restored replica shares: each cold start mints its own).

Only the placeholders the page documents are set (tests/e2e/support/walkthrough.py): the session's
kubeconfig and values, the demo worker's image and this test's namespace; PATH carries the tools of
`make setup`, as the page's first block does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from podsnap import contract
from tests.e2e.support.config import REPO, E2EConfig
from tests.e2e.support.flow import init_id, restore_from, restored, serving_pods, worker_health
from tests.e2e.support.k8s import Cluster
from tests.e2e.support.walkthrough import WALKTHROUGH, Block, sh_blocks

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
APP = "worker"  # the page's Deployment, Service and SnapshotPolicy
REQUEST = "/v1/chat/completions"
#: one block's limit: the page's own waits are at most 300 s each, a block has up to three
BLOCK_TIMEOUT_S = 900


def _env(cfg: E2EConfig, namespace: str) -> dict[str, str]:
    env = dict(os.environ)
    tools = [str(REPO / ".tools" / "bin"), str(Path(sys.executable).parent)]
    env.update(
        PATH=os.pathsep.join([*tools, env.get("PATH", "")]),
        KUBECONFIG=str(cfg.kubeconfig),
        VALUES=",".join(str(v) for v in cfg.values_files),
        DEMO_IMAGE=cfg.demo_image,
        NAMESPACE=namespace,
    )
    return env


def _run(block: Block, env: dict[str, str]) -> str:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{block} exited {proc.returncode}:\n{block.script}\n--- stdout\n{proc.stdout[-3000:]}\n"
        f"--- stderr\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _answer(stdout: str, block: Block) -> dict[str, Any]:
    try:
        answer = json.loads(stdout)
    except ValueError:
        raise AssertionError(f"{block} printed no JSON answer: {stdout[-2000:]!r}") from None
    choices = answer.get("choices") or []
    assert choices and (choices[0].get("message") or {}).get("content"), f"no completion in {answer}"
    return dict(answer)


def _restored_serving(cluster: Cluster, namespace: str, port: int) -> set[str]:
    """Checks that every serving pod was restored from the policy's checkpoint (the page waited for it);
    returns the one init id they answer with (the capture source's)."""
    policy = cluster.get_custom(contract.PLURAL_SNAPSHOT_POLICIES, APP, namespace) or {}
    checkpoint = (policy.get("status") or {}).get("checkpointName")
    pods = serving_pods(cluster, namespace, APP)
    assert checkpoint and pods, f"no checkpoint or no serving pod: {policy.get('status')}, {pods}"
    states = {p.metadata.name: (restored(p), restore_from(p)) for p in pods}
    expected = (f"True/{contract.REASON_RESTORE_SUCCEEDED}", checkpoint)
    assert all(s == expected for s in states.values()), f"expected every pod {expected}: {states}"
    # each cold start mints its own init id: replicas restored from one capture all answer with its one id
    ids = {p.metadata.name: init_id(worker_health(cluster, namespace, p.metadata.name, port)) for p in pods}
    assert len(pods) >= 2 and len(set(ids.values())) == 1, f"the replicas' init ids differ: {ids}"
    return set(ids.values())


def test_the_walkthrough_runs_green(cluster: Cluster, podsnap: E2EConfig, namespace: str) -> None:
    if podsnap.gpu:
        pytest.skip("docs/walkthrough.md runs the CPU demo worker; run this test with --e2e-worker cpu")
    assert (podsnap.release, podsnap.release_namespace) == ("podsnap", "podsnap-system"), "the page's release"
    blocks = sh_blocks(WALKTHROUGH.read_text())
    requests = [i for i, b in enumerate(blocks) if REQUEST in b.script]
    assert requests, f"docs/walkthrough.md sends no request to {REQUEST}"
    env = _env(podsnap, namespace)
    sources: set[str] = set()
    for i, block in enumerate(blocks):
        if i == requests[-1]:
            sources = _restored_serving(cluster, namespace, podsnap.demo_port)
        stdout = _run(block, env)
        if i == requests[-1]:
            answer = _answer(stdout, block)
            assert init_id(answer) in sources, f"answered by a re-initialized worker: {answer}; source {sources}"
    assert not cluster.list_custom(contract.PLURAL_POD_SNAPSHOTS, namespace), "the page's clean-up left a PodSnapshot"
