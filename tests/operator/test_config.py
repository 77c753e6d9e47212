"""Honest configuration: the chart passes exactly the variables of `podsnap.contract.CHART_ENV`, under the
names of its generated `_env.tpl`, and each of them changes what the process does. Every test goes
render -> the process's config -> an effect seen from outside (a port answering, a log line, an object
the process wrote, a directory it made)."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import pytest

from podsnap import contract as c
from podsnap.agent import main as agent_main
from podsnap.agent.config import AgentConfig
from podsnap.agent.engine_executor import EngineExecutor
from podsnap.engine import _journal as journal  # the capture's own journal writer, as an earlier agent ran it
from podsnap.kube.client import get_or_none
from podsnap.kube.env import ConfigError
from podsnap.kube.tokens import CAPTURE, KEY_FILE, Claims, TokenKey
from podsnap.operator import main as operator_main
from podsnap.operator.config import DEFAULT_CHECKPOINT_ENV, OperatorConfig
from podsnap.operator.on_podsnapshot import content_body
from tests.conftest import REPO, require_tool
from tests.support.controlplane import free_port
from tests.support.harness import render_chart
from tests.support.operator_env import (
    OTHER_NODE,
    Env,
    agent_kubeconfig,
    no_ready_agent,
    pod_template,
    ready_policy_of,
)
from tests.support.waiting import wait_for
from tests.support.webhooks import validating_served_by

BIN = Path(sys.executable).parent
CHART = REPO / "charts" / "podsnap"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_env", REPO / "hack" / "chart_env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = load_generator()


def container_env(docs: list[dict[str, Any]], kind: str, container: str) -> dict[str, Any]:
    """name -> value (or valueFrom) of one rendered container's env."""
    doc = next(d for d in docs if d["kind"] == kind)
    ct = next(x for x in doc["spec"]["template"]["spec"]["containers"] if x["name"] == container)
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ct.get("env") or []}


def mounts(docs: list[dict[str, Any]], kind: str, container: str) -> dict[str, str]:
    doc = next(d for d in docs if d["kind"] == kind)
    ct = next(x for x in doc["spec"]["template"]["spec"]["containers"] if x["name"] == container)
    return {m["name"]: m["mountPath"] for m in ct.get("volumeMounts") or []}


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return str(resp.read().decode())


#: pid -> the file a process started by `process` writes its output to
_OUTPUT: dict[int, IO[bytes]] = {}


@contextmanager
def process(component: str, environ: Mapping[str, str], kubeconfig: Path) -> Iterator[subprocess.Popen[bytes]]:
    # output to a file, not a pipe: a debug-level process logging past the pipe's 64 KiB before the test
    # reads it would block in write() and stop answering (the more objects earlier tests left, the sooner)
    out = tempfile.TemporaryFile()  # noqa: SIM115 (read and closed by output_of, after the process ended)
    proc = subprocess.Popen(
        [str(BIN / f"podsnap-{component}"), "--kubeconfig", str(kubeconfig)],
        env={**os.environ, **environ},
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    _OUTPUT[proc.pid] = out
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def output_of(proc: subprocess.Popen[bytes]) -> str:
    assert proc.poll() is not None
    with _OUTPUT.pop(proc.pid) as out:
        out.seek(0)
        return out.read().decode(errors="replace")


# --- the names: one source ------------------------------------------------------------------------


def test_env_template_is_what_the_generator_writes() -> None:
    assert GEN.TEMPLATE.read_text() == GEN.render(), "charts/podsnap/templates/_env.tpl is stale: run hack/chart_env.py"
    assert GEN.main(["--check"]) == 0


def test_env_template_check_notices_a_stale_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "_env.tpl"
    stale.write_text(GEN.render().replace("PODSNAP_LOG_LEVEL", "PODSNAP_LOGLEVEL"))
    monkeypatch.setattr(GEN, "TEMPLATE", stale)
    assert GEN.main(["--check"]) == 1


def test_a_key_the_contract_lacks_fails_the_render(tmp_path: Path) -> None:
    helm = require_tool("helm")
    import shutil

    chart = tmp_path / "podsnap"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "probe.yaml").write_text('# {{ include "podsnap.envName" "noSuchKey" }}\n')
    got = subprocess.run([helm, "template", "x", str(chart)], capture_output=True, text=True, check=False)
    assert got.returncode != 0 and '"noSuchKey" is not a key of podsnap.contract.CHART_ENV' in got.stderr


@pytest.mark.parametrize(
    ("component", "kind"), [(c.COMPONENT_OPERATOR, "Deployment"), (c.COMPONENT_AGENT, "DaemonSet")]
)
def test_the_chart_passes_exactly_the_contract_variables(component: str, kind: str) -> None:
    docs = render_chart(require_tool("helm"), CHART)
    assert set(container_env(docs, kind, component)) == set(c.chart_env(component))


def test_paths_the_chart_passes_are_where_it_mounts() -> None:
    docs = render_chart(require_tool("helm"), CHART)
    op, agent = container_env(docs, "Deployment", "operator"), container_env(docs, "DaemonSet", "agent")
    assert op[c.ENV_WEBHOOK_CERT_DIR] == mounts(docs, "Deployment", "operator")["webhook-tls"]
    assert agent[c.ENV_ARTIFACT_ROOT] == mounts(docs, "DaemonSet", "agent")["artifacts"]
    assert agent[c.ENV_CGROUP_ROOT] == mounts(docs, "DaemonSet", "agent")["cgroup"]
    assert agent[c.ENV_CACHE_DIR] == mounts(docs, "DaemonSet", "agent")["artifact-cache"]
    assert agent[c.ENV_STATE_DIR] == mounts(docs, "DaemonSet", "agent")["agent-state"]
    off = render_chart(require_tool("helm"), CHART, "agent.cache.enabled=false")
    assert container_env(off, "DaemonSet", "agent")[c.ENV_CACHE_DIR] == ""
    assert "artifact-cache" not in mounts(off, "DaemonSet", "agent")


# --- render -> config ---------------------------------------------------------------------------


def test_rendered_values_reach_the_operator_config() -> None:
    docs = render_chart(
        require_tool("helm"),
        CHART,
        "operator.logLevel=warning",
        "operator.healthPort=9101",
        "metrics.port=9102",
        "webhook.port=9103",
        "webhook.path=/hooks/mutate-pods",
        "seccomp.profileName=custom/profile.json",
        "restore.pickupTimeoutSeconds=77",
        "restore.timeoutSeconds=88",
        "placement.enabled=false",
    )
    config = OperatorConfig.from_env(container_env(docs, "Deployment", "operator"))
    assert (config.restore_pickup_timeout_s, config.restore_max_s) == (77, 88)
    assert (config.log_level, config.health_port, config.metrics_port) == ("warning", 9101, 9102)
    assert (config.webhook_port, config.webhook_prefix) == (9103, "/hooks")
    assert config.webhook_cert_dir == Path(c.WEBHOOK_CERT_DIR_DEFAULT)
    assert config.seccomp_profile == "custom/profile.json"
    assert config.placement is False and OperatorConfig.from_env({}).placement is True
    off = render_chart(require_tool("helm"), CHART, "metrics.enabled=false", "webhook.enabled=false")
    off_config = OperatorConfig.from_env(container_env(off, "Deployment", "operator"))
    assert (off_config.metrics_port, off_config.webhook_port) == (0, 0)


def test_the_checkpoint_env_values_reach_the_operator_config() -> None:
    def config_of(*values: str) -> dict[str, str] | None:
        docs = render_chart(require_tool("helm"), CHART, *values)
        return OperatorConfig.from_env(container_env(docs, "Deployment", "operator")).checkpoint_env

    assert config_of() == DEFAULT_CHECKPOINT_ENV and DEFAULT_CHECKPOINT_ENV["NCCL_SOCKET_IFNAME"] == "lo"
    tuned = config_of("workload.checkpointEnv.env.MY_FLAG=on", "workload.checkpointEnv.env.HF_HUB_OFFLINE=null")
    assert tuned is not None and tuned.pop("MY_FLAG") == "on" and "HF_HUB_OFFLINE" not in tuned
    assert tuned == {k: v for k, v in DEFAULT_CHECKPOINT_ENV.items() if k != "HF_HUB_OFFLINE"}
    assert config_of("workload.checkpointEnv.enabled=false") is None


def test_rendered_values_reach_the_agent_config() -> None:
    docs = render_chart(
        require_tool("helm"), CHART, "agent.logLevel=debug", "agent.healthPort=9111", "metrics.port=9112"
    )
    env = container_env(docs, "DaemonSet", "agent")
    assert env[c.ENV_NODE_NAME] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    config = AgentConfig.from_env({**env, c.ENV_NODE_NAME: "node-x"})
    assert (config.node_name, config.log_level, config.health_port, config.metrics_port) == (
        "node-x",
        "debug",
        9111,
        9112,
    )
    assert config.artifact_root == Path(c.ARTIFACT_ROOT_DEFAULT)
    assert config.cgroup_root == Path(c.CGROUP_ROOT_IN_AGENT)
    # what the agent does with the cgroup root: restores join their pod's cgroups through it (the effect is
    # shown by tests/agent/test_restore_cgroups.py and, in pods, tests/e2e/test_availability.py)
    executor = agent_main.engine_executor(config)
    assert isinstance(executor, EngineExecutor) and executor.cgroup_root == Path(c.CGROUP_ROOT_IN_AGENT)
    assert config.cache_dir == Path(c.CACHE_DIR_IN_AGENT) and config.cache_max_bytes == 200 << 30
    assert (config.cache_min_free_percent, config.prefetch_concurrency) == (15, 1)
    # the capture journal: in the node-local state the chart mounts, not on the artifact volume
    assert config.state_dir == Path(c.STATE_DIR_IN_AGENT) and config.journal_dir.parent == config.state_dir
    assert not config.journal_dir.is_relative_to(config.artifact_root)
    assert isinstance(executor, EngineExecutor) and executor.journal_dir == config.journal_dir
    tuned = render_chart(
        require_tool("helm"),
        CHART,
        "agent.cache.maxSize=1500Mi",
        "agent.cache.minFreePercent=20",
        "agent.cache.prefetch.concurrency=3",
    )
    tuned_config = AgentConfig.from_env({**container_env(tuned, "DaemonSet", "agent"), c.ENV_NODE_NAME: "n"})
    assert (tuned_config.cache_max_bytes, tuned_config.cache_min_free_percent) == (1500 << 20, 20)
    assert tuned_config.prefetch_concurrency == 3
    for off in ("agent.cache.enabled=false", "agent.cache.prefetch.enabled=false"):
        environ = {
            **container_env(render_chart(require_tool("helm"), CHART, off), "DaemonSet", "agent"),
            c.ENV_NODE_NAME: "n",
        }
        assert AgentConfig.from_env(environ).prefetch_concurrency == 0
    assert (
        AgentConfig.from_env(
            {
                **container_env(
                    render_chart(require_tool("helm"), CHART, "agent.cache.enabled=false"), "DaemonSet", "agent"
                ),
                c.ENV_NODE_NAME: "n",
            }
        ).cache_dir
        is None
    )


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        (c.ENV_LOG_LEVEL, "verbose", "expected one of debug, info, warning, error"),
        (c.ENV_HEALTH_PORT, "80a", "expected an integer"),
        (c.ENV_METRICS_PORT, "70000", "expected a port"),
        (c.ENV_SCHEDULING_GATES, "maybe", "expected one of auto, on, off"),
        (c.ENV_CHECKPOINT_ENV, "{not json", "expected JSON"),
        (c.ENV_CHECKPOINT_ENV, '{"env": {"A": 1}}', "expected JSON"),
        (c.ENV_CHECKPOINT_ENV, '{"enabled": "yes"}', "expected JSON"),
        (c.ENV_RESTORE_MAX, "0", "expected a positive number of seconds"),
    ],
)
def test_a_malformed_variable_stops_the_operator_naming_it(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}={value!r}: {says}"):
        OperatorConfig.from_env({name: value})


def test_the_agent_refuses_to_start_without_its_node() -> None:
    with pytest.raises(ConfigError, match=c.ENV_NODE_NAME):
        AgentConfig.from_env({})


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        (c.ENV_CACHE_MAX_SIZE, "lots", "expected a size as a Kubernetes quantity"),
        (c.ENV_CACHE_MAX_SIZE, "1k", "expected at least 1Mi"),
        (c.ENV_CACHE_MIN_FREE_PERCENT, "95", "expected an integer from 0 to 90"),
        (c.ENV_PREFETCH_CONCURRENCY, "-1", "expected an integer from 0 to 64"),
        (c.ENV_STATE_DIR, "state", "expected an absolute path"),
    ],
)
def test_a_malformed_cache_variable_stops_the_agent_naming_it(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}={value!r}: {says}"):
        AgentConfig.from_env({c.ENV_NODE_NAME: "n", name: value})


# --- config -> what the process does ------------------------------------------------------------


def webhook_tls(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_dir = tmp_path / "webhook-tls"
    cert_dir.mkdir()
    cert.cert_chain_pems[0].write_to_path(str(cert_dir / "tls.crt"))
    cert.private_key_pem.write_to_path(str(cert_dir / "tls.key"))
    ca.cert_pem.write_to_path(str(cert_dir / "ca.crt"))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return cert_dir, client


def admission_review(
    url: str, client: ssl.SSLContext, pod: Mapping[str, Any] | None = None, namespace: str = "default"
) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "probe-uid",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod or {"metadata": {"name": "probe"}, "spec": {"containers": [{"name": "main", "image": "x"}]}},
            "userInfo": {"username": "probe"},
        },
    }
    req = urllib.request.Request(
        url, data=json.dumps(review).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=5, context=client) as resp:
        return dict(json.loads(resp.read()))


def pod_of_a_ready_policy(env: Env, ns: str, tmp_path: Path) -> dict[str, Any]:
    """A new pod of a Deployment whose SnapshotPolicy is Ready (its ReplicaSet as controller): what the webhook
    shapes for restore."""
    template = pod_template("web", tmp_path / "ctl")
    owner = ready_policy_of(env, ns, template)
    meta = {**template["metadata"], "generateName": "web-", "ownerReferences": [{**owner, "controller": True}]}
    return {"metadata": meta, "spec": template["spec"]}


def test_every_operator_variable_changes_what_the_operator_process_does(env: Env, ns: str, tmp_path: Path) -> None:
    health, metrics, webhook = free_port(), free_port(), free_port()
    docs = render_chart(
        require_tool("helm"),
        CHART,
        "operator.logLevel=debug",
        f"operator.healthPort={health}",
        f"metrics.port={metrics}",
        f"webhook.port={webhook}",
        "webhook.path=/hooks/mutate-pods",
        "seccomp.profileName=custom/profile.json",
        "workload.checkpointEnv.env.PROBE_FLAG=from-values",
        "restore.pickupTimeoutSeconds=77",
        "restore.timeoutSeconds=88",
        "cleanup.handoverAfterSeconds=2",
        "placement.enabled=false",
    )
    environ = container_env(docs, "Deployment", "operator")
    assert set(environ) == set(c.chart_env(c.COMPONENT_OPERATOR))
    policy_pod = pod_of_a_ready_policy(env, ns, tmp_path)
    # the paths that must exist on this machine: the certificate and the token key (Secrets in the chart)
    cert_dir, client = webhook_tls(tmp_path)
    environ[c.ENV_WEBHOOK_CERT_DIR] = str(cert_dir)
    key = token_key_dir(tmp_path)
    environ[c.ENV_TOKEN_KEY_DIR] = str(key)
    seen: set[str] = set()

    env.operator.stop()  # one operator at a time reconciles the namespace
    try:
        with process(c.COMPONENT_OPERATOR, environ, env.operator_kubeconfig) as proc:
            wait_for(
                lambda: proc.poll() is None and http_get(f"http://127.0.0.1:{health}/healthz"),
                what=f"/healthz on {c.ENV_HEALTH_PORT}={health} (exit code {proc.poll()})",
            )
            seen.add(c.ENV_HEALTH_PORT)
            assert "podsnap_operator_" in http_get(f"http://127.0.0.1:{metrics}/metrics")
            seen.add(c.ENV_METRICS_PORT)
            # served at the chart's path, with the certificate from the cert dir (the client trusts only its CA)
            answer = wait_for(
                lambda: admission_review(f"https://127.0.0.1:{webhook}/hooks/mutate-pods", client),
                what=f"the webhook on {c.ENV_WEBHOOK_PORT}={webhook}",
            )
            assert answer["response"]["uid"] == "probe-uid" and answer["response"]["allowed"] is True
            seen.update((c.ENV_WEBHOOK_PORT, c.ENV_WEBHOOK_PATH, c.ENV_WEBHOOK_CERT_DIR))
            # a capture pod (its token signed with the key of the token key dir) gets the values' environment
            capture = {
                "metadata": {
                    "name": "capture-probe",
                    "annotations": {
                        c.ANNOTATION_CAPTURE_TOKEN: TokenKey.load(key).mint(Claims(CAPTURE, "default", "main", "cfg"))
                    },
                },
                "spec": {"containers": [{"name": "main", "image": "x", "command": ["serve"]}]},
            }
            reply = admission_review(f"https://127.0.0.1:{webhook}/hooks/mutate-pods", client, capture)["response"]
            ops = json.loads(base64.b64decode(reply["patch"]))
            [added] = [op["value"] for op in ops if op["path"] == "/spec/containers/0/env"]  # it had no env
            assert {"name": "PROBE_FLAG", "value": "from-values"} in added
            seen.add(c.ENV_CHECKPOINT_ENV)
            # a policy's pod is shaped with the chart's restore timeouts
            shaped = admission_review(f"https://127.0.0.1:{webhook}/hooks/mutate-pods", client, policy_pod, ns)
            patch = json.loads(base64.b64decode(shaped["response"]["patch"]))
            env_ops = [op["value"] for op in patch if op["path"].startswith("/spec/containers/0/env/")]
            given = {e["name"]: e.get("value") for e in env_ops}
            assert (given[c.ENV_RESTORE_TIMEOUT], given[c.ENV_RESTORE_MAX]) == ("77", "88"), patch
            seen.update((c.ENV_RESTORE_TIMEOUT, c.ENV_RESTORE_MAX))
            # ... and without placement's node affinity (the session operator, placement on, adds one)
            assert not [op for op in patch if op["path"].startswith("/spec/affinity")], patch
            seen.add(c.ENV_PLACEMENT)
            # capture pods run with the chart's seccomp profile
            # (the validating webhook, which fails closed, is this process's while the session operator is away)
            with validating_served_by(env.cluster, f"https://127.0.0.1:{webhook}/hooks", cert_dir / "ca.crt"):
                env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, _snapshot_job("cfg"), ns)
                job = wait_for(lambda: env.cluster.kube.batch.list_namespaced_job(ns).items, what="the capture Job")[0]
            profile = job.spec.template.spec.security_context.seccomp_profile
            assert (profile.type, profile.localhost_profile) == ("Localhost", "custom/profile.json")
            seen.add(c.ENV_SECCOMP_PROFILE)
            # its capture pods are marked with the key found in the token key dir
            token = job.spec.template.metadata.annotations[c.ANNOTATION_CAPTURE_TOKEN]
            assert TokenKey.load(key).verify(token).subject == "cfg"
            seen.add(c.ENV_TOKEN_KEY_DIR)
            # a content being deleted on a node without a Ready agent (no agent is Ready here) is released
            # after the chart's 2 s, not the default 10 minutes
            with (
                validating_served_by(env.cluster, f"https://127.0.0.1:{webhook}/hooks", cert_dir / "ca.crt"),
                no_ready_agent(env.cluster),
            ):
                orphan = content_body(
                    name="orphan", namespace=ns, uid="0" * 8, container="main",
                    pod={"metadata": {"name": "gone", "uid": "1" * 8}, "spec": {"nodeName": OTHER_NODE}},
                )  # fmt: skip
                made = env.cluster.create(c.PLURAL_POD_SNAPSHOT_CONTENTS, orphan)
                env.cluster.kube.delete_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, made["metadata"]["name"])
                wait_for(
                    lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, made["metadata"]["name"]) is None,
                    what=f"the content released after {c.ENV_CLEANUP_HANDOVER}=2",
                )
            seen.add(c.ENV_CLEANUP_HANDOVER)
        out = output_of(proc)
        assert " DEBUG " in out, out[-2000:]
        seen.add(c.ENV_LOG_LEVEL)
    finally:
        env.operator.ctx = operator_main.build_context(env.operator_ctx.config)
        env.operator.start()
    assert seen == set(c.chart_env(c.COMPONENT_OPERATOR)), "a variable the chart passes has no effect shown here"


def test_every_agent_variable_changes_what_the_agent_process_does(env: Env, tmp_path: Path) -> None:
    health, metrics = free_port(), free_port()
    node = "node-config-test"
    docs = render_chart(
        require_tool("helm"),
        CHART,
        "agent.logLevel=debug",
        f"agent.healthPort={health}",
        f"metrics.port={metrics}",
        "agent.cache.maxSize=3Gi",
        "agent.cache.minFreePercent=7",
        "agent.cache.prefetch.concurrency=2",
        "placement.enabled=false",
    )
    environ = container_env(docs, "DaemonSet", "agent")
    assert set(environ) == set(c.chart_env(c.COMPONENT_AGENT))
    environ[c.ENV_NODE_NAME] = node  # the downward API's part
    # container paths the chart mounts, at places of this test on this machine
    artifacts = tmp_path / "artifacts"
    environ[c.ENV_ARTIFACT_ROOT] = str(artifacts)
    cache = tmp_path / "cache"
    environ[c.ENV_CACHE_DIR] = str(cache)
    state = tmp_path / "state"
    environ[c.ENV_STATE_DIR] = str(state)
    # a capture an earlier agent of this node left in its journal (its source has exited since)
    gone = subprocess.Popen(["sleep", "60"])
    journal.Journal(state / "journal" / "cfg-journal.json", {"content": "cfg-journal"}).begin(
        gone.pid, [gone.pid], [], leave_running=False
    )
    gone.kill()
    gone.wait()
    environ[c.ENV_CGROUP_ROOT] = str(AgentConfig(node_name="x").cgroup_root)
    key = token_key_dir(tmp_path)
    environ[c.ENV_TOKEN_KEY_DIR] = str(key)
    seen: set[str] = set()
    content = _content(node)
    # its token is bound to an agent pod of that node, as the chart's is (the operator's webhook checks it)
    kubeconfig = agent_kubeconfig(env.cluster, node, env.agent_kubeconfig, tmp_path / "agent.kubeconfig")
    env.cluster.kube.core.create_node({"metadata": {"name": node}})
    with process(c.COMPONENT_AGENT, environ, kubeconfig) as proc:
        wait_for(
            lambda: proc.poll() is None and http_get(f"http://127.0.0.1:{health}/healthz"),
            what=f"/healthz on {c.ENV_HEALTH_PORT}={health} (exit code {proc.poll()})",
        )
        seen.add(c.ENV_HEALTH_PORT)
        scraped = http_get(f"http://127.0.0.1:{metrics}/metrics")
        assert "podsnap_agent_" in scraped
        seen.add(c.ENV_METRICS_PORT)
        assert artifacts.is_dir(), "the agent makes its artifact root at start"
        seen.add(c.ENV_ARTIFACT_ROOT)
        # the node cache: made private at start, its limit published
        wait_for((cache / "entries").is_dir, what="the cache directory")
        assert cache.stat().st_mode & 0o777 == 0o700
        seen.add(c.ENV_CACHE_DIR)
        # its journal: made private in the state dir, and the record found there recovered (and removed)
        wait_for(lambda: not list((state / "journal").iterdir()), what="the journal record recovered")
        assert (state / "journal").stat().st_mode & 0o777 == 0o700
        seen.add(c.ENV_STATE_DIR)
        assert "podsnap_agent_cache_max_bytes 3.221225472e+09" in scraped
        seen.add(c.ENV_CACHE_MAX_SIZE)
        # it takes on the contents bound to its node (this one's source pod does not exist: it fails it)
        env.cluster.create(c.PLURAL_POD_SNAPSHOT_CONTENTS, content)
        try:
            failed = wait_for(
                lambda: _failed_reason(env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, content["metadata"]["name"])),
                what=f"the agent of {node} to act on its content",
            )
            assert failed == c.REASON_POD_NOT_FOUND
        finally:
            _delete_content(env, content["metadata"]["name"])
        seen.add(c.ENV_NODE_NAME)
        # it captures only pods marked with the key in its token key dir: a pod marked with another key is
        # refused, one marked with this key passes on to the next check (its container is not running here)
        for name, marker, verdict in (
            ("other-key", TokenKey(b"x" * 32), c.REASON_NOT_A_CAPTURE_SOURCE),
            ("this-key", TokenKey.load(key), c.REASON_CONTAINER_NOT_FOUND),
        ):
            marked = _content(node, name)
            _marked_pod(env, node, name, marker.mint(Claims(CAPTURE, "default", "main", "config-test")))
            env.cluster.create(c.PLURAL_POD_SNAPSHOT_CONTENTS, marked)
            try:
                got = wait_for(
                    lambda marked=marked: _failed_reason(
                        env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, marked["metadata"]["name"])
                    ),
                    what=f"the agent's verdict on {name}",
                )
                assert got == verdict, (name, got)
            finally:
                _delete_content(env, marked["metadata"]["name"])
                env.cluster.kube.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        seen.add(c.ENV_TOKEN_KEY_DIR)
    # placement off: it acted on its content above, yet left its Node unlabelled (the session agent labels its own)
    labels = env.cluster.kube.core.read_node(node).metadata.labels or {}
    env.cluster.kube.core.delete_node(node)
    assert not set(labels) & set(c.NODE_FACT_LABELS), labels
    seen.add(c.ENV_PLACEMENT)
    out = output_of(proc)
    assert " DEBUG " in out, out[-2000:]
    seen.add(c.ENV_LOG_LEVEL)
    assert "keeping 7% of its filesystem free; prefetch 2 at a time" in out, out[-2000:]
    assert "capture of cfg-journal: the node agent restarted during the capture (at step inspected)" in out, out
    assert f"the source (pid {gone.pid}) is gone" in out, out[-2000:]
    seen.update((c.ENV_CACHE_MIN_FREE_PERCENT, c.ENV_PREFETCH_CONCURRENCY))
    # PODSNAP_CGROUP_ROOT: restored workers join their pod's cgroups through it (tests/e2e: test_availability)
    seen.add(c.ENV_CGROUP_ROOT)
    assert seen == set(c.chart_env(c.COMPONENT_AGENT)), "a variable the chart passes has no effect shown here"


def _snapshot_job(name: str) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "main", "image": "worker:1", "command": ["python", "-m", "worker"]}]}}
    return {"kind": c.KIND_SNAPSHOT_JOB, "metadata": {"name": name}, "spec": {"podTemplate": template}}


def token_key_dir(tmp_path: Path) -> Path:
    key = tmp_path / "token-key"
    key.mkdir()
    (key / KEY_FILE).write_bytes(os.urandom(16).hex().encode())
    return key


def _marked_pod(env: Env, node: str, name: str, token: str) -> None:
    """A pod in `default` on `node`, Ready, whose container runs nowhere on this machine."""
    env.cluster.kube.core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": name, "annotations": {c.ANNOTATION_CAPTURE_TOKEN: token}},
            "spec": {"containers": [{"name": "main", "image": "worker:1"}]},
        },
    )
    env.cluster.kubelet_bind("default", name, node)
    env.cluster.kubelet_run("default", name, ready=True)


def _content(node: str, pod: str = "no-such-pod") -> dict[str, Any]:
    name = f"{c.CONTENT_NAME_PREFIX}config-test" + ("" if pod == "no-such-pod" else f"-{pod}")
    return {
        "kind": c.KIND_POD_SNAPSHOT_CONTENT,
        "metadata": {"name": name, "labels": {c.LABEL_SNAPSHOT_NODE: node}},
        "spec": {
            "podSnapshotRef": {"namespace": "default", "name": "config-test", "uid": "0"},
            "source": {"podRef": {"namespace": "default", "name": pod, "containers": ["main"]}},
            "nodeName": node,
            "artifactPath": "default/config-test",
            "deletionPolicy": c.DELETION_POLICY_RETAIN,
        },
    }


def _failed_reason(obj: dict[str, Any] | None) -> str | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == c.COND_FAILED and cond["status"] == "True":
            return str(cond["reason"])
    return None


def _delete_content(env: Env, name: str) -> None:
    env.cluster.kube.delete_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    obj = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    if obj is not None and obj["metadata"].get("finalizers"):  # no live agent of that node: release it here
        get_or_none(
            env.cluster.kube.custom.patch_cluster_custom_object,
            c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, {"metadata": {"finalizers": None}},
        )  # fmt: skip
