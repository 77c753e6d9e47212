"""Settings of the end-to-end suite (the same suite runs on every cluster; only values and the worker differ).

The cluster, the chart and its values come from pytest-helm-charts' options (each also read from its
environment variable, as the plugin does), falling back to podsnap's own names and then to the local
cluster of `make cluster-up`:

  --kubeconfig PATH              kubeconfig of the cluster under test. NOT read from $KUBECONFIG (the
                                 plugin's own fallback): a shell pointed at production must not get an
                                 e2e install by accident. Else PODSNAP_E2E_KUBECONFIG, else the local
                                 cluster's /var/lib/podsnap-cluster/kubeconfig.
  --app-config-file-path VALUES  chart values file(s), comma-separated (ATS_APP_CONFIG_FILE_PATH; else
                                 PODSNAP_E2E_VALUES; default overlays/local-cluster/values.yaml). Their
                                 image.registry and image.tag also name the demo worker's image.
  --chart-path PATH              the chart (ATS_CHART_PATH; default charts/podsnap)
  --cluster-type NAME            a label for the timings (ATS_CLUSTER_TYPE): local, kind-gpu, ...

podsnap's own (the plugin knows nothing of the workload):
  --e2e-worker cpu|gpu     the demo worker (PODSNAP_E2E_WORKER; default cpu): `gpu` runs
                           <image.registry>/podsnap-demo-gpu:<image.tag> on one nvidia.com/gpu
  PODSNAP_E2E_DEMO_IMAGE   the demo worker image, overriding the one --e2e-worker names
  PODSNAP_E2E_GPU          "1": the same as --e2e-worker gpu
  PODSNAP_E2E_TIMEOUT      seconds a single wait may take (default 120)
  PODSNAP_E2E_OUT          where timings go (default out/e2e)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pytest_helm_charts.fixtures import (
    ENV_VAR_APP_CONFIG_PATH,
    ENV_VAR_CHART_PATH,
    ENV_VAR_CLUSTER_TYPE,
    ENV_VAR_KUBE_CONFIG,
    get_cmd_line_option_name_from_env_var,
)

from podsnap.contract import is_truthy

REPO = Path(__file__).resolve().parents[3]
LOCAL_CLUSTER_DIR = Path(os.environ.get("PODSNAP_CLUSTER_DIR", "/var/lib/podsnap-cluster"))
LOCAL_KUBECONFIG = LOCAL_CLUSTER_DIR / "kubeconfig"
LOCAL_VALUES = REPO / "overlays" / "local-cluster" / "values.yaml"
#: the hostPath directory behind the local cluster's artifact volume (hack/cluster/storage.yaml)
LOCAL_ARTIFACTS_DIR = LOCAL_CLUSTER_DIR / "volumes" / "artifacts"

#: the demo workers: `gpu` is the same server on CUDA, from the image built with podsnap[gpu,torch]
WORKERS = ("cpu", "gpu")

#: an option's value (None when not given): pytest's `config.getoption`, or a dict's `get` in tests
GetOption = Callable[[str], Any]


def _option(getoption: GetOption, env_var: str, *fallback_env: str) -> str:
    """The plugin's option for `env_var`, then that variable (the plugin's order), then podsnap's own ones."""
    value = getoption(get_cmd_line_option_name_from_env_var(env_var))
    if value:
        return str(value)
    for name in (env_var, *fallback_env):
        if os.environ.get(name):
            return os.environ[name]
    return ""


@dataclass(frozen=True)
class Images:
    """The images the chart's values name (what the cluster must be able to pull)."""

    operator: str
    agent: str
    demo: str

    @classmethod
    def from_values(cls, values: Mapping[str, Any], demo_repository: str = "podsnap-demo") -> Images:
        image = values.get("image") or {}
        registry, tag = str(image.get("registry") or ""), str(image.get("tag") or "")

        def ref(component: str, default_repo: str) -> str:
            own = (values.get(component) or {}).get("image") or {}
            repo = str(own.get("repository") or default_repo)
            name = f"{registry}/{repo}" if registry else repo
            if own.get("digest"):
                return f"{name}@{own['digest']}"
            return f"{name}:{own.get('tag') or tag or 'latest'}"

        return cls(ref("operator", "podsnap-operator"), ref("agent", "podsnap-agent"), ref("demo", demo_repository))


def merged_values(files: tuple[Path, ...]) -> dict[str, Any]:
    """The values files merged in order (later files win, maps merged key by key), as helm does."""

    def merge(into: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
        for key, value in new.items():
            if isinstance(value, Mapping) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value
        return into

    out: dict[str, Any] = {}
    for f in files:
        merge(out, yaml.safe_load(f.read_text()) or {})
    return out


@dataclass(frozen=True)
class E2EConfig:
    kubeconfig: Path
    values_files: tuple[Path, ...]
    images: Images
    gpu: bool
    timeout_s: float
    out_dir: Path
    chart: Path = REPO / "charts" / "podsnap"
    cluster_type: str = ""
    release: str = "podsnap"
    release_namespace: str = "podsnap-system"
    operator_deployment: str = "podsnap-operator"
    agent_daemonset: str = "podsnap-agent"
    demo_port: int = 8000

    @property
    def demo_image(self) -> str:
        return self.images.demo

    @property
    def local_cluster(self) -> bool:
        return self.kubeconfig.resolve() == LOCAL_KUBECONFIG.resolve()

    @classmethod
    def from_options(cls, getoption: GetOption) -> E2EConfig:
        # the plugin's --kubeconfig, but not its $KUBECONFIG fallback: see the module's docstring
        kube = getoption(get_cmd_line_option_name_from_env_var(ENV_VAR_KUBE_CONFIG))
        kubeconfig = Path(kube or os.environ.get("PODSNAP_E2E_KUBECONFIG") or LOCAL_KUBECONFIG).expanduser()
        values = _option(getoption, ENV_VAR_APP_CONFIG_PATH, "PODSNAP_E2E_VALUES")
        values_files = tuple(REPO / Path(v.strip()).expanduser() for v in values.split(",") if v.strip()) or (
            LOCAL_VALUES,
        )
        missing = [str(v) for v in values_files if not v.is_file()]
        if missing:
            raise ValueError(f"chart values {missing} not found: pass existing files to --app-config-file-path")
        worker = (getoption("e2e_worker") or os.environ.get("PODSNAP_E2E_WORKER") or "").strip().lower()
        if worker not in ("", *WORKERS):
            raise ValueError(f"--e2e-worker={worker!r}: choose one of {', '.join(WORKERS)}")
        gpu = worker == "gpu" or (not worker and is_truthy(os.environ.get("PODSNAP_E2E_GPU")))
        images = Images.from_values(merged_values(values_files), "podsnap-demo-gpu" if gpu else "podsnap-demo")
        demo = os.environ.get("PODSNAP_E2E_DEMO_IMAGE")
        if demo:
            images = Images(images.operator, images.agent, demo)
        timeout = os.environ.get("PODSNAP_E2E_TIMEOUT", "120")
        try:
            timeout_s = float(timeout)
        except ValueError:
            raise ValueError(f"PODSNAP_E2E_TIMEOUT={timeout!r}: set it to a number of seconds, e.g. 120") from None
        chart = _option(getoption, ENV_VAR_CHART_PATH)
        local = kubeconfig.resolve() == LOCAL_KUBECONFIG.resolve()
        return cls(
            kubeconfig=kubeconfig,
            values_files=values_files,
            images=images,
            gpu=gpu,
            timeout_s=timeout_s,
            out_dir=REPO / os.environ.get("PODSNAP_E2E_OUT", "out/e2e"),
            chart=REPO / chart if chart else REPO / "charts" / "podsnap",
            cluster_type=_option(getoption, ENV_VAR_CLUSTER_TYPE) or ("local" if local else "other"),
        )
