"""The e2e suite's settings (tests/e2e/support/config.py) and where pytest-helm-charts falls short.

The e2e suite takes its cluster, chart and values from pytest-helm-charts' options; these tests pin
how a user's one command resolves, and the one limit of the plugin's pykube client that made the
suite keep the official kubernetes client beside it (docs/testing.md).
"""

from __future__ import annotations

from pathlib import Path

import pykube
import pytest
import yaml
from kubernetes import config as kconfig
from tests.e2e.support.config import LOCAL_KUBECONFIG, LOCAL_VALUES, REPO, E2EConfig, Images

# an exec credential plugin of the current API version, as kubectl >= 1.24 and cloud CLIs write them
EXEC_V1 = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [
        {
            "name": "u",
            "user": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": "/bin/echo",
                    "args": [
                        '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
                        '"status":{"token":"t0ken"}}'
                    ],
                    "interactiveMode": "Never",
                }
            },
        }
    ],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}


def test_pykube_cannot_use_an_exec_v1_kubeconfig_the_kubernetes_client_reads(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(EXEC_V1))
    api = kconfig.new_client_from_config(config_file=str(path))
    assert api.configuration.api_key == {"BearerToken": "Bearer t0ken"}
    client = pykube.HTTPClient(pykube.KubeConfig.from_file(str(path)))
    # refused while authenticating, before any connection is tried
    with pytest.raises(NotImplementedError, match=r"client\.authentication\.k8s\.io/v1 not implemented"):
        client.get(url="/version")


def config(monkeypatch: pytest.MonkeyPatch, options: dict[str, str], **env: str) -> E2EConfig:
    for name in ("KUBECONFIG", "PODSNAP_E2E_KUBECONFIG", "PODSNAP_E2E_VALUES", "PODSNAP_E2E_DEMO_IMAGE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("PODSNAP_E2E_GPU", "PODSNAP_E2E_WORKER"):
        monkeypatch.delenv(name, raising=False)
    for name in ("ATS_APP_CONFIG_FILE_PATH", "ATS_CHART_PATH", "ATS_CLUSTER_TYPE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return E2EConfig.from_options(options.get)


def test_by_default_the_local_cluster_with_its_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(monkeypatch, {})
    assert cfg.kubeconfig == LOCAL_KUBECONFIG and cfg.values_files == (LOCAL_VALUES,)
    assert cfg.cluster_type == "local"
    # the images `make cluster-up` pushed with `make images-push REGISTRY=localhost:5000/podsnap`
    assert cfg.images == Images(
        "localhost:5000/podsnap/podsnap-operator:dev",
        "localhost:5000/podsnap/podsnap-agent:dev",
        "localhost:5000/podsnap/podsnap-demo:dev",
    )


def test_the_plugin_options_point_the_suite_at_another_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    base, gpu = tmp_path / "values.yaml", tmp_path / "gpu.yaml"
    base.write_text("image: {registry: registry.example.com/ml, tag: v1}\nagent: {image: {repository: x-agent}}\n")
    gpu.write_text("image: {tag: v2}\noperator: {image: {digest: 'sha256:ab'}}\n")
    options = {"kubeconfig": "/tmp/kc", "app_config_file_path": f"{base},{gpu}", "cluster_type": "staging"}
    # $KUBECONFIG is not the target: a shell pointed at production gets no e2e install by accident
    cfg = config(monkeypatch, options, KUBECONFIG="/elsewhere")
    assert cfg.kubeconfig == Path("/tmp/kc") and cfg.values_files == (base, gpu)
    assert cfg.cluster_type == "staging" and cfg.gpu is False
    assert cfg.images == Images(
        "registry.example.com/ml/podsnap-operator@sha256:ab",
        "registry.example.com/ml/x-agent:v2",
        "registry.example.com/ml/podsnap-demo:v2",
    )


def test_the_environment_names_work_too_and_the_worker_image_can_be_swapped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    values = tmp_path / "v.yaml"
    values.write_text("image: {registry: localhost, tag: dev}\n")
    cfg = config(
        monkeypatch,
        {},
        ATS_APP_CONFIG_FILE_PATH=str(values),
        PODSNAP_E2E_KUBECONFIG="/tmp/kind",
        PODSNAP_E2E_DEMO_IMAGE="localhost/podsnap-demo-gpu:dev",
        PODSNAP_E2E_GPU="1",
    )
    assert cfg.kubeconfig == Path("/tmp/kind") and cfg.gpu and cfg.cluster_type == "other"
    assert cfg.images.agent == "localhost/podsnap-agent:dev" and cfg.demo_image == "localhost/podsnap-demo-gpu:dev"


def test_kind_with_gpus_differs_only_in_its_values_file_and_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    kind_values = REPO / "hack" / "kind" / "values-gpu.yaml"
    options = {"kubeconfig": "/tmp/kind", "app_config_file_path": str(kind_values), "e2e_worker": "gpu"}
    cfg = config(monkeypatch, options)
    assert cfg.gpu and cfg.values_files == (kind_values,)
    # the images hack/kind/up.sh builds and loads with `kind load`
    assert cfg.images == Images(
        "localhost/podsnap-operator:dev", "localhost/podsnap-agent-gpu:dev", "localhost/podsnap-demo-gpu:dev"
    )
    with pytest.raises(ValueError, match=r"--e2e-worker='tpu'.*cpu, gpu"):
        config(monkeypatch, {}, PODSNAP_E2E_WORKER="tpu")


def test_a_missing_values_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.yaml.*--app-config-file-path"):
        config(monkeypatch, {"app_config_file_path": str(tmp_path / "nope.yaml")})
