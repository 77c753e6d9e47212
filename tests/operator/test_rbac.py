"""Operator and agent run under their chart ServiceAccounts (every test of this suite does: the env
fixture logs them in with those tokens, RBAC authorizer on), and each may do no more than it needs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from podsnap.operator.agent_absence import ABSENCE_CONFIGMAP
from tests.support.harness import RELEASE_NS
from tests.support.operator_env import Env

OPERATOR = f"system:serviceaccount:{RELEASE_NS}:podsnap-operator"
AGENT = f"system:serviceaccount:{RELEASE_NS}:podsnap-agent"

# (verb, resource, operator needs it, agent needs it): "needs" is what the code calls; anything else must
# be denied. The podsnap.io resources are checked with every verb.
CR = ("snapshotjobs", "podsnapshots", "podsnapshotcontents", "snapshotpolicies")
OPERATOR_CR = {
    "snapshotjobs": {"get", "list", "watch", "create", "patch", "delete"},
    "podsnapshots": {"get", "list", "watch", "create", "patch", "delete"},
    "podsnapshotcontents": {"get", "list", "watch", "create", "patch", "delete"},
    "snapshotpolicies": {"get", "list", "watch", "patch"},
}
AGENT_CR = {"podsnapshotcontents": {"get", "list", "watch", "patch"}, "podsnapshots": {"get"}}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
MATRIX = [
    *[(v, f"{r}.podsnap.io", v in OPERATOR_CR.get(r, ()), v in AGENT_CR.get(r, ())) for r in CR for v in VERBS],
    *[
        (v, f"{r}.podsnap.io/status", v == "patch", v == "patch" and r == "podsnapshotcontents")
        for r in CR
        for v in ("patch", "update")
    ],
    ("create", "jobs.batch", True, False),
    ("get", "jobs.batch", True, False),
    ("delete", "jobs.batch", True, False),
    ("watch", "jobs.batch", False, False),
    ("patch", "jobs.batch", False, False),
    ("get", "pods", True, True),
    ("list", "pods", True, True),
    ("watch", "pods", True, True),  # operator: the pods the webhook could not place (placement)
    ("patch", "pods", False, True),
    ("patch", "pods/status", False, True),
    ("create", "pods", False, False),
    ("delete", "pods", True, False),
    ("create", "pods/exec", False, False),
    ("get", "deployments.apps", True, False),
    ("patch", "deployments.apps", True, False),
    ("create", "deployments.apps", False, False),
    ("delete", "deployments.apps", False, False),
    ("list", "statefulsets.apps", True, False),
    ("patch", "statefulsets.apps", True, False),
    ("list", "replicasets.apps", True, False),
    ("patch", "replicasets.apps", False, False),
    ("get", "nodes", True, False),
    ("delete", "nodes", False, False),
    # agent: the placement labels of its own Node (webhook-enforced); operator: removing those of a Node whose
    # agent is gone (operator/stale_placement.py)
    ("patch", "nodes", True, True),
    ("update", "nodes", False, False),
    ("create", "events", True, True),
    ("create", "subjectaccessreviews.authorization.k8s.io", True, False),
    ("create", "tokenreviews.authentication.k8s.io", False, False),
    ("get", "configmaps", False, False),  # cluster-wide: no; the operator's one ConfigMap: test below
    ("list", "configmaps", False, False),
    ("get", "secrets", False, False),
    ("list", "secrets", False, False),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", False, False),
    ("create", "serviceaccounts/token", False, False),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", False, False),
]


#: rights the chart grants beyond what the code uses (reported to the chart's owner). strict xfail: when the
#: chart drops one, its row turns into an XPASS failure and moves out of this list.
# Rows the chart once over-granted; kept empty so a new over-grant has to be argued for here.
CHART_OVERGRANTS: set[tuple[str, str, str]] = set()
CASES = [
    pytest.param(
        who,
        verb,
        resource,
        needed,
        id=f"{who}-{verb}-{resource}",
        marks=[pytest.mark.xfail(strict=True, reason="chart grants more than needed")]
        if (who, verb, resource) in CHART_OVERGRANTS
        else [],
    )
    for verb, resource, operator, agent in MATRIX
    for who, needed in (("operator", operator), ("agent", agent))
]


@pytest.fixture(scope="module")
def can_i(env: Env) -> dict[tuple[str, str, str], str]:
    """Every `kubectl auth can-i --as=<ServiceAccount>` answer of the matrix, asked in parallel."""

    def ask(key: tuple[str, str, str]) -> str:
        who, verb, resource = key
        user = OPERATOR if who == "operator" else AGENT
        got = env.cluster.kubectl("auth", "can-i", verb, resource, "--all-namespaces", f"--as={user}", check=False)
        return got.stdout.strip() or got.stderr.strip()

    keys = [(who, verb, resource) for verb, resource, _, _ in MATRIX for who in ("operator", "agent")]
    with ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(keys, pool.map(ask, keys), strict=True))


@pytest.mark.parametrize(("who", "verb", "resource", "needed"), CASES)
def test_can_i_matrix(can_i: dict[tuple[str, str, str], str], who: str, verb: str, resource: str, needed: bool) -> None:
    answer = can_i[who, verb, resource]
    assert answer == ("yes" if needed else "no"), f"podsnap-{who} can-i {verb} {resource}: {answer}"


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


@pytest.mark.parametrize(
    ("verb", "what", "namespace", "needed"),
    [
        ("get", f"configmaps/{ABSENCE_CONFIGMAP}", RELEASE_NS, True),
        ("update", f"configmaps/{ABSENCE_CONFIGMAP}", RELEASE_NS, True),
        ("create", "configmaps", RELEASE_NS, True),
        ("get", "configmaps/other", RELEASE_NS, False),
        ("update", "configmaps/other", RELEASE_NS, False),
        ("delete", f"configmaps/{ABSENCE_CONFIGMAP}", RELEASE_NS, False),
        ("list", "configmaps", RELEASE_NS, False),
        ("get", f"configmaps/{ABSENCE_CONFIGMAP}", "default", False),
        ("create", "configmaps", "default", False),
    ],
)
def test_the_operator_keeps_one_configmap_of_its_own_namespace(
    env: Env, verb: str, what: str, namespace: str, needed: bool
) -> None:
    """Its record of absent agents (operator/agent_absence.py), and no other ConfigMap anywhere."""
    got = env.cluster.kubectl("auth", "can-i", verb, what, "-n", namespace, f"--as={OPERATOR}", check=False)
    answer = got.stdout.strip() or got.stderr.strip()
    assert answer == ("yes" if needed else "no"), f"podsnap-operator can-i {verb} {what} -n {namespace}: {answer}"
