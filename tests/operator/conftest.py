"""One control plane for the operator suite, with the chart's CRDs and RBAC, the operator and one node
agent running in threads under their chart ServiceAccounts' tokens (RBAC authorizer on), the webhook
registered with the API server over TLS, and a kubelet played by the tests (see harness.py)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podsnap.agent import main as agent_main
from podsnap.agent.config import AgentConfig
from podsnap.agent.runtime import AgentContext
from podsnap.kube.client import Credentials, Kube
from podsnap.operator import main as operator_main
from podsnap.operator.config import OperatorConfig
from podsnap.operator.runtime import OperatorContext
from tests.conftest import REPO, ControlPlaneFactory, require_tool
from tests.operator.harness import RELEASE_NS, Cluster, KopfThread, render_chart, wait_for
from tests.operator.recording import RecordingExecutor
from tests.support.controlplane import free_port

NODE = "node-a"
OTHER_NODE = "node-b"
OPERATOR_SA = "podsnap-operator"
AGENT_SA = "podsnap-agent"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


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
    chart_docs: list[dict]

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


def _apply(cp, docs: list[dict]) -> None:
    import yaml

    # --validate=false: kubectl checks against the 1.20 server's OpenAPI, which predates x-kubernetes-validations
    # (the server itself drops that field; the operator re-checks immutability)
    got = cp.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert got.returncode == 0, f"kubectl apply failed: {got.stderr}"


@pytest.fixture(scope="session")
def env(control_plane_factory: ControlPlaneFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    helm = require_tool("helm")
    require_tool("kubectl")
    cp = control_plane_factory("operator")
    docs = render_chart(helm, REPO / "charts" / "podsnap")
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    _apply(cp, crds)
    for crd in crds:
        cp.kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=30s")
    cp.kubectl("create", "namespace", RELEASE_NS)
    _apply(cp, [d for d in docs if d["kind"] in RBAC_KINDS])

    admin = Kube(Credentials.load(cp.kubeconfig).api_client())
    cluster = Cluster(kube=admin, kubectl=cp.kubectl)
    for node in (NODE, OTHER_NODE):  # the kubelet registers its Node
        admin.core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})

    tmp = tmp_path_factory.mktemp("operator-env")
    op_kc = cp.token_kubeconfig(
        cp.service_account_token(RELEASE_NS, OPERATOR_SA), tmp / "operator.kubeconfig", "operator"
    )
    agent_kc = cp.token_kubeconfig(cp.service_account_token(RELEASE_NS, AGENT_SA), tmp / "agent.kubeconfig", "agent")

    # webhook TLS for 127.0.0.1 (the chart's own certificate names the Service, which has no endpoint here)
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_dir = tmp / "webhook-tls"
    cert_dir.mkdir()
    cert.cert_chain_pems[0].write_to_path(str(cert_dir / "tls.crt"))
    cert.private_key_pem.write_to_path(str(cert_dir / "tls.key"))
    port = free_port()
    webhook = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    for hook in webhook["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(ca.cert_pem.bytes()).decode(),
        }
        assert hook["failurePolicy"] == "Ignore"
    _apply(cp, [webhook])

    op_config = OperatorConfig(
        kubeconfig=str(op_kc),
        seccomp_profile="podsnap/checkpoint.json",
        webhook_port=port,
        webhook_host="127.0.0.1",
        webhook_cert_dir=cert_dir,
        metrics_port=0,
        health_port=0,
    )
    artifact_root = tmp / "artifacts"
    executor = RecordingExecutor()
    agent_config = AgentConfig(
        node_name=NODE, kubeconfig=str(agent_kc), artifact_root=artifact_root, metrics_port=0, health_port=0
    )
    operator = KopfThread("operator", operator_main.run, operator_main.build_context(op_config)).start()
    agent = KopfThread("agent", agent_main.run, agent_main.build_context(agent_config, executor)).start()
    env = Env(cluster, operator, agent, executor, artifact_root, op_kc, agent_kc, port, docs)
    try:
        yield env
    finally:
        agent.stop()
        operator.stop()
        cluster.cleanup()


@pytest.fixture
def ns(env: Env, request: pytest.FixtureRequest) -> str:
    """A fresh namespace per test (names from the test, so objects are easy to find in the logs)."""
    name = request.node.name.lower().replace("_", "-")[:50].strip("-")
    return env.cluster.namespace(f"t-{name}"[:63].rstrip("-"))


__all__ = ["NODE", "OTHER_NODE", "Env", "wait_for"]
