"""The agent's node-local state directory in the chart (`agent.stateDir`): a hostPath only the agent mounts,
where its capture journal lives instead of the shared artifact volume (agent/state_dir.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from podsnap import contract as c
from tests.chart.conftest import CHART, SNAPSHOTS, Docs, container, env_of, find, render, render_error

Template = Callable[..., Docs]


def state(docs: Docs) -> tuple[str, str, dict[str, Any]]:
    """(PODSNAP_STATE_DIR, the agent-state mount path, the agent-state volume) of the agent DaemonSet."""
    ds = find(docs, "DaemonSet")
    ct = container(ds, "agent")
    mounts = {m["name"]: m["mountPath"] for m in ct["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    return env_of(ct)[c.ENV_STATE_DIR], mounts["agent-state"], volumes["agent-state"]


def test_by_default_the_agent_keeps_its_state_in_a_host_directory_under_the_kubelet_dir(
    helm_template: Template,
) -> None:
    docs = helm_template()
    env, mount, volume = state(docs)
    assert env == mount == c.STATE_DIR_IN_AGENT
    assert volume == {
        "name": "agent-state",
        "hostPath": {"path": "/var/lib/kubelet/podsnap/agent-state", "type": "DirectoryOrCreate"},
    }
    assert not Path(c.STATE_DIR_IN_AGENT).is_relative_to(c.ARTIFACT_ROOT_DEFAULT), "never on the artifact claim"
    ds = find(docs, "DaemonSet")
    for init in ds["spec"]["template"]["spec"].get("initContainers", []):
        assert all(m["name"] != "agent-state" for m in init.get("volumeMounts", [])), "only the agent mounts it"
    for doc in docs:
        if doc["kind"] == "Deployment":
            assert all(v["name"] != "agent-state" for v in doc["spec"]["template"]["spec"].get("volumes", []))


def test_the_state_dir_follows_the_kubelet_dir_or_its_own_path(helm_template: Template) -> None:
    _, _, volume = state(helm_template("--set", "agent.kubeletDir=/data/kubelet/"))
    assert volume["hostPath"]["path"] == "/data/kubelet/podsnap/agent-state"
    env, mount, volume = state(helm_template("--set", "agent.stateDir=/nvme/podsnap-state"))
    assert volume["hostPath"] == {"path": "/nvme/podsnap-state", "type": "DirectoryOrCreate"}
    assert env == mount == c.STATE_DIR_IN_AGENT, "the agent sees it at the same place wherever it is on the node"
    # independent of the cache: turning the cache off keeps the journal
    _, _, volume = state(helm_template("--set", "agent.cache.enabled=false"))
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/podsnap/agent-state"


def test_a_relative_state_dir_fails_naming_its_key(helm: str) -> None:
    message = render_error(helm, "--set", "agent.stateDir=state")
    assert "schema" in message and ("agent.stateDir" in message or "/agent/stateDir" in message), message


def test_an_upgrade_from_values_without_the_key_mounts_the_default(helm: str, tmp_path: Path) -> None:
    """`helm upgrade --reuse-values` from a release whose values have no agent.stateDir."""
    older = [p for p in SNAPSHOTS if "stateDir" not in (yaml.safe_load(p.read_text()).get("agent") or {})]
    assert older, "no stored values.yaml lacks agent.stateDir"
    chart = tmp_path / "podsnap"
    shutil.copytree(CHART, chart)
    (chart / "values.yaml").write_text(older[-1].read_text())
    env, mount, volume = state(render(helm, chart=chart))
    assert env == mount == c.STATE_DIR_IN_AGENT
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/podsnap/agent-state", "type": "DirectoryOrCreate"}
