"""The agent's node-local artifact cache in the chart (`agent.cache`): where it lives, what the agent is
told, and the values the schema refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from podsnap import contract as c
from tests.chart.conftest import Docs, container, env_of, find, render_error

Template = Callable[..., Docs]


def agent(docs: Docs) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(cache env, cache mount path or None, cache volume or None) of the agent DaemonSet."""
    ds = find(docs, "DaemonSet")
    ct = container(ds, "agent")
    env = {k: v for k, v in env_of(ct).items() if "CACHE" in k or "PREFETCH" in k}
    mounts = {m["name"]: m["mountPath"] for m in ct["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    return env, mounts, volumes


def test_by_default_a_host_directory_under_the_kubelet_dir_is_the_agents_own_cache(helm_template: Template) -> None:
    docs = helm_template()
    env, mounts, volumes = agent(docs)
    assert env == {
        c.ENV_CACHE_DIR: c.CACHE_DIR_IN_AGENT,
        c.ENV_CACHE_MAX_SIZE: "200Gi",
        c.ENV_CACHE_MIN_FREE_PERCENT: "15",
        c.ENV_PREFETCH_CONCURRENCY: "1",
    }
    assert mounts["artifact-cache"] == c.CACHE_DIR_IN_AGENT
    assert volumes["artifact-cache"] == {
        "name": "artifact-cache",
        "hostPath": {"path": "/var/lib/kubelet/podsnap/artifact-cache", "type": "DirectoryOrCreate"},
    }
    ds = find(docs, "DaemonSet")
    for init in ds["spec"]["template"]["spec"].get("initContainers", []):
        assert all(m["name"] != "artifact-cache" for m in init.get("volumeMounts", [])), "only the agent mounts it"
    for doc in docs:  # no workload of podsnap's other than the agent sees it
        if doc["kind"] == "Deployment":
            assert all(v["name"] != "artifact-cache" for v in doc["spec"]["template"]["spec"].get("volumes", []))


def test_the_cache_follows_the_kubelet_dir_or_its_own_path(helm_template: Template) -> None:
    _, _, volumes = agent(helm_template("--set", "agent.kubeletDir=/data/kubelet/"))
    assert volumes["artifact-cache"]["hostPath"]["path"] == "/data/kubelet/podsnap/artifact-cache"
    _, _, volumes = agent(helm_template("--set", "agent.cache.hostPath=/nvme/podsnap"))
    assert volumes["artifact-cache"]["hostPath"]["path"] == "/nvme/podsnap"


@pytest.mark.parametrize(("medium", "expected"), [("", {}), ("Memory", {"medium": "Memory"})])
def test_an_empty_dir_cache(helm_template: Template, medium: str, expected: dict[str, str]) -> None:
    _, mounts, volumes = agent(
        helm_template("--set", "agent.cache.type=emptyDir", "--set-string", f"agent.cache.emptyDir.medium={medium}")
    )
    assert volumes["artifact-cache"] == {"name": "artifact-cache", "emptyDir": expected}
    assert mounts["artifact-cache"] == c.CACHE_DIR_IN_AGENT


def test_sizes_and_prefetch_reach_the_agent(helm_template: Template) -> None:
    env, _, _ = agent(
        helm_template(
            "--set",
            "agent.cache.maxSize=1Ti",
            "--set",
            "agent.cache.minFreePercent=25",
            "--set",
            "agent.cache.prefetch.concurrency=4",
        )
    )
    assert (env[c.ENV_CACHE_MAX_SIZE], env[c.ENV_CACHE_MIN_FREE_PERCENT]) == ("1Ti", "25")
    assert env[c.ENV_PREFETCH_CONCURRENCY] == "4"
    env, _, _ = agent(helm_template("--set", "agent.cache.prefetch.enabled=false"))
    assert env[c.ENV_PREFETCH_CONCURRENCY] == "0" and env[c.ENV_CACHE_DIR] == c.CACHE_DIR_IN_AGENT


def test_a_disabled_cache_is_neither_mounted_nor_used(helm_template: Template) -> None:
    env, mounts, volumes = agent(helm_template("--set", "agent.cache.enabled=false"))
    assert env[c.ENV_CACHE_DIR] == "" and env[c.ENV_PREFETCH_CONCURRENCY] == "0"
    assert "artifact-cache" not in mounts and "artifact-cache" not in volumes


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("agent.cache.type=nfs", "agent.cache.type"),
        ("agent.cache.hostPath=relative/dir", "agent.cache.hostPath"),
        ("agent.cache.emptyDir.medium=HugePages", "agent.cache.emptyDir.medium"),
        ("agent.cache.maxSize=lots", "agent.cache.maxSize"),
        ("agent.cache.minFreePercent=95", "agent.cache.minFreePercent"),
        ("agent.cache.prefetch.concurrency=0", "agent.cache.prefetch.concurrency"),
        ("agent.cache.size=1Ti", "size"),
    ],
)
def test_bad_cache_values_fail_naming_their_key(helm: str, value: str, key: str) -> None:
    message = render_error(helm, "--set", value)
    assert "schema" in message and (key in message or "/" + key.replace(".", "/") in message), message
