"""Components read a token file again for every request (a pod's ServiceAccount token, a kubeconfig's
`tokenFile`): the kubelet replaces a projected token before it expires, and the agent's, bound to its pod,
lives about an hour. Against the real API server: one client, its token file rewritten, the next request
authenticates with the new token."""

from __future__ import annotations

from pathlib import Path

import kubernetes
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from podsnap.kube.client import Credentials
from tests.support.operator_env import Env


def _review() -> dict[str, object]:
    return {"spec": {"resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}}}


def test_a_rotated_token_file_is_used_by_the_next_request_of_the_same_client(env: Env, tmp_path: Path) -> None:
    agent = yaml.safe_load(env.agent_kubeconfig.read_text())
    user = agent["users"][0]["user"]
    token_file = tmp_path / "token"
    token_file.write_text("expired-token\n")
    kubeconfig = tmp_path / "kubeconfig"
    agent["users"][0]["user"] = {"tokenFile": str(token_file)}
    kubeconfig.write_text(yaml.safe_dump(agent))

    creds = Credentials.load(kubeconfig)
    authz = kubernetes.client.AuthorizationV1Api(creds.api_client())
    with pytest.raises(ApiException) as err:
        authz.create_self_subject_access_review(_review())
    assert err.value.status == 401, "the file's first (bad) token was sent"

    token_file.write_text(user["token"] + "\n")  # what the kubelet does before the old one expires
    assert authz.create_self_subject_access_review(_review()).status is not None, "the same client, the new token"
    # kopf logs in again after a 401 and gets what the file holds now
    assert creds.connection_info().token == user["token"]


def test_a_kubeconfig_token_is_kept_as_given(env: Env) -> None:
    creds = Credentials.load(env.agent_kubeconfig)
    token = yaml.safe_load(env.agent_kubeconfig.read_text())["users"][0]["user"]["token"]
    assert creds.token == token and creds.token_path is None
