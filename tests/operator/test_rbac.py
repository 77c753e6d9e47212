"""Operator and agent run under their chart ServiceAccounts (every test of this suite does: the env
fixture logs them in with those tokens, RBAC authorizer on), and each may do no more than it needs."""

from __future__ import annotations

import pytest

from tests.operator.conftest import Env
from tests.operator.harness import RELEASE_NS

OPERATOR = f"system:serviceaccount:{RELEASE_NS}:podsnap-operator"
AGENT = f"system:serviceaccount:{RELEASE_NS}:podsnap-agent"

# (verb, resource, needed-by-operator, needed-by-agent) — "needed" is what the code calls; everything
# else must be denied
MATRIX = [
    ("create", "snapshotjobs.podsnap.io", True, False),
    ("create", "podsnapshots.podsnap.io", True, False),
    ("create", "podsnapshotcontents.podsnap.io", True, False),
    ("delete", "podsnapshotcontents.podsnap.io", True, False),
    ("watch", "podsnapshotcontents.podsnap.io", True, True),
    ("patch", "podsnapshotcontents.podsnap.io", True, True),
    ("update", "podsnapshotcontents.podsnap.io/status", True, True),
    ("update", "podsnapshots.podsnap.io/status", True, False),
    ("get", "podsnapshots.podsnap.io", True, True),
    ("watch", "snapshotpolicies.podsnap.io", True, False),
    ("create", "jobs.batch", True, False),
    ("delete", "jobs.batch", True, False),
    ("patch", "deployments.apps", True, False),
    ("patch", "statefulsets.apps", True, False),
    ("get", "replicasets.apps", True, False),
    ("watch", "pods", True, True),
    ("patch", "pods", True, True),
    ("patch", "pods/status", False, True),
    ("create", "events", True, True),
    ("get", "nodes", True, True),
    # never needed by either
    ("create", "pods", False, False),
    ("delete", "pods", False, False),
    ("create", "pods/exec", False, False),
    ("get", "secrets", False, False),
    ("list", "secrets", False, False),
    ("create", "deployments.apps", False, False),
    ("delete", "deployments.apps", False, False),
    ("delete", "nodes", False, False),
    ("patch", "nodes", False, False),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", False, False),
    ("create", "serviceaccounts/token", False, False),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", False, False),
    ("update", "snapshotpolicies.podsnap.io", False, False),
]


@pytest.mark.parametrize(("verb", "resource", "operator", "agent"), MATRIX, ids=[f"{v}-{r}" for v, r, _, _ in MATRIX])
def test_can_i_matrix(env: Env, verb: str, resource: str, operator: bool, agent: bool) -> None:
    for who, expected in ((OPERATOR, operator), (AGENT, agent)):
        got = env.cluster.kubectl("auth", "can-i", verb, resource, "--all-namespaces", f"--as={who}", check=False)
        answer = got.stdout.strip()
        assert answer == ("yes" if expected else "no"), f"{who} can-i {verb} {resource}: {answer} {got.stderr.strip()}"


def test_components_are_logged_in_as_their_service_accounts(env: Env) -> None:
    """The kubeconfigs the running operator and agent use carry the ServiceAccounts' tokens, not admin's."""
    import shutil

    kubectl = shutil.which("kubectl") or "kubectl"
    import subprocess

    for kubeconfig, allowed in (
        (env.operator_kubeconfig, "podsnapshotcontents.podsnap.io"),
        (env.agent_kubeconfig, "pods/status"),
    ):
        verb = "create" if "contents" in allowed else "patch"

        def can(verb: str, resource: str, kubeconfig: object = kubeconfig) -> str:
            out = subprocess.run(
                [kubectl, "--kubeconfig", str(kubeconfig), "auth", "can-i", verb, resource, "-A"],
                capture_output=True,
                text=True,
                check=False,
            )
            return out.stdout.strip()

        assert can(verb, allowed) == "yes"
        assert can("get", "secrets") == "no"
