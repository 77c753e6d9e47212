"""Finding 5 (issue 10), the operator as a confused deputy: a namespace user who may create podsnap objects
but lacks the rights those objects exercise is refused at admission by the validating webhook (called by
the real API server over TLS, SubjectAccessReview against real RBAC), with a message naming the right."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._core.actions import invocation

from podsnap import contract as c
from podsnap.kube.entrypoint import MEMO_KEY
from podsnap.kube.identity import username_from_token
from podsnap.operator import main as operator_main
from podsnap.operator import on_validate
from tests.support.operator_env import Env, deployment, pod_template, podsnapshot, policy, snapshot_job
from tests.support.users import User, denied, rule
from tests.support.waiting import wait_for

PODSNAP = c.GROUP


def create(user: User, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": c.API_VERSION, **body}
    return dict(user.kube.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, user.namespace, plural, body))


def refusal(user: User, plural: str, body: dict[str, Any]) -> str:
    exc = denied(create, user, plural, body)
    assert exc.status == 403, exc.body
    return str(exc.body)


def test_policy_of_a_user_who_may_not_change_the_target_is_refused(env: Env, ns: str, tmp_path: Path) -> None:
    """The attack: alice may create SnapshotPolicies and read Deployments, nothing more. Her policy would have
    the operator scale `web` to zero (WaitForCheckpoint) and run its pod template as a capture Job."""
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 3, pod_template("web", tmp_path)))
    alice = User(env.cluster, ns, "alice")
    alice.grant(rule("create get", "snapshotpolicies", PODSNAP), rule("get list", "deployments", "apps"))
    attack = policy("pol", "Deployment", "web", startupPolicy=c.STARTUP_POLICY_WAIT)

    message = refusal(alice, c.PLURAL_SNAPSHOT_POLICIES, attack)
    assert f"user {alice.username} may not patch deployments.apps 'web' in namespace {ns}" in message
    assert "create jobs.batch" in message and "create pods" in message, "every missing right is named"
    assert env.cluster.get(c.PLURAL_SNAPSHOT_POLICIES, "pol", ns) is None
    assert env.cluster.kube.apps.read_namespaced_deployment("web", ns).spec.replicas == 3

    # with the rights the policy exercises, the same request passes, and the operator acts on it
    alice.grant(
        rule("create get", "snapshotpolicies", PODSNAP),
        rule("get list patch", "deployments", "apps"),
        rule("create", "jobs", "batch"),
        rule("create", "pods"),
    )
    create(alice, c.PLURAL_SNAPSHOT_POLICIES, attack)
    wait_for(
        lambda: env.cluster.kube.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_JOBS)[
            "items"
        ],
        what="the operator's own SnapshotJob (not checked again: the policy was)",
    )


def test_a_spec_change_is_checked_again(env: Env, ns: str, tmp_path: Path) -> None:
    """1.20 has no CEL, so a policy's spec can change: retargeting it at a Deployment alice may not patch is
    refused; a change that leaves the spec alone (a label) is not."""
    for name in ("mine", "theirs"):
        env.cluster.kube.apps.create_namespaced_deployment(ns, deployment(name, 1, pod_template(name, tmp_path)))
    alice = User(env.cluster, ns, "alice")
    alice.grant(
        rule("create get patch", "snapshotpolicies", PODSNAP),
        rule("create", "jobs", "batch"),
        rule("create", "pods"),
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["mine"], "verbs": ["get", "patch"]},
    )
    create(alice, c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "mine"))
    patch = alice.kube.custom.patch_namespaced_custom_object
    exc = denied(
        patch, c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_POLICIES, "pol", {"spec": {"targetRef": {"name": "theirs"}}}
    )
    assert exc.status == 403 and "may not patch deployments.apps 'theirs'" in str(exc.body)
    got = patch(c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_POLICIES, "pol", {"metadata": {"labels": {"team": "a"}}})
    assert got["metadata"]["labels"] == {"team": "a"} and got["spec"]["targetRef"]["name"] == "mine"


def test_snapshotjob_of_a_user_who_may_not_run_jobs_is_refused(env: Env, ns: str) -> None:
    """A SnapshotJob runs its pod template (with its ServiceAccount) as a Job: only for users who could."""
    alice = User(env.cluster, ns, "alice")
    alice.grant(rule("create get", "snapshotjobs", PODSNAP))
    message = refusal(alice, c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"))
    assert f"may not create jobs.batch in namespace {ns}" in message and "ServiceAccount" in message
    assert not env.cluster.kube.batch.list_namespaced_job(ns).items

    alice.grant(rule("create get", "snapshotjobs", PODSNAP), rule("create", "jobs", "batch"), rule("create", "pods"))
    create(alice, c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"))
    wait_for(lambda: env.cluster.kube.batch.list_namespaced_job(ns).items, what="the capture Job")


def test_podsnapshot_of_a_pod_the_user_may_not_exec_into_or_delete_is_refused(env: Env, ns: str) -> None:
    """A capture copies a pod's memory and ends its processes: alice, who may only read pods, cannot have
    that done to someone else's pod by writing a PodSnapshot."""
    env.cluster.kube.core.create_namespaced_pod(
        ns, {"metadata": {"name": "victim"}, "spec": {"containers": [{"name": "main", "image": "db:1"}]}}
    )
    alice = User(env.cluster, ns, "alice")
    alice.grant(rule("create get", "podsnapshots", PODSNAP), rule("get list", "pods"))
    message = refusal(alice, c.PLURAL_POD_SNAPSHOTS, podsnapshot("steal", "victim"))
    assert f"may not create pods/exec 'victim' in namespace {ns}" in message
    assert "delete pods 'victim'" in message and "memory" in message
    assert env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "steal", ns) is None

    alice.grant(
        rule("create get", "podsnapshots", PODSNAP), rule("get list delete", "pods"), rule("create", "pods/exec")
    )
    assert create(alice, c.PLURAL_POD_SNAPSHOTS, podsnapshot("mine", "victim"))["metadata"]["name"] == "mine"


def test_an_unreachable_webhook_refuses_podsnap_objects_instead_of_letting_them_through(env: Env, ns: str) -> None:
    """failurePolicy Fail: with the operator down, even an admin's SnapshotJob is refused (never unchecked)."""
    env.operator.stop()
    try:
        exc = denied(env.cluster.create, c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
        assert exc.status == 500 and "snapshotjobs.validate.podsnap.io" in str(exc.body)
        # pods never wait on it
        env.cluster.kube.core.create_namespaced_pod(
            ns, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "x"}]}}
        )
    finally:
        env.operator.ctx = operator_main.build_context(env.operator_ctx.config)
        env.operator.start()
    assert env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns) is None


def test_the_webhook_answers_while_every_thread_of_the_operators_handlers_is_busy(env: Env, ns: str) -> None:
    """The operator's sync handlers wait on kopf's thread pool for requests that come back through this webhook
    (a policy's SnapshotJob, a job's PodSnapshot). With that pool full, a webhook that needed it too would wait
    for itself until the API server gave up. kopf's own dispatch, with its pool blocked: the operator's request
    is answered, and a user's is checked (on the webhook's own pool) and refused."""
    release = threading.Event()
    busy = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    busy.submit(release.wait)
    settings = kopf.OperatorSettings()
    settings.execution.executor = busy
    memo = kopf.Memo({MEMO_KEY: env.operator_ctx})
    body = {"metadata": {"name": "s", "namespace": ns}, "spec": {"source": {"podRef": {"name": "victim"}}}}

    def validate(username: str | None) -> Any:
        userinfo = {"username": username}
        kwargs = {"body": body, "old": None, "operation": "CREATE", "userinfo": userinfo, "memo": memo}
        return invocation.invoke(on_validate.validate_snapshot, settings=settings, kwargs=kwargs)

    async def answer(username: str | None) -> BaseException | None:
        task = asyncio.ensure_future(validate(username))
        done, _ = await asyncio.wait({task}, timeout=10)
        if not done:  # kopf never abandons a handler's thread: free the pool, then fail
            release.set()
            await asyncio.wait({task})
            pytest.fail(f"the webhook waited for the operator's busy handler pool to answer {username}")
        return task.exception()

    async def both() -> None:
        operator = username_from_token(env.operator_ctx.credentials.token)
        assert operator, "the operator's token names its ServiceAccount"
        assert await answer(operator) is None
        refused = await answer(User(env.cluster, ns, "alice").username)
        assert isinstance(refused, kopf.AdmissionError) and "may not get pods 'victim'" in str(refused)

    try:
        asyncio.run(both())
    finally:
        release.set()
        busy.shutdown()
