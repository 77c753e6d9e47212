"""Settings of the end-to-end suite, from the environment (the same suite runs on every cluster).

PODSNAP_E2E_KUBECONFIG   kubeconfig of the cluster under test; default: the local cluster's
                         (`make cluster-up` writes /var/lib/podsnap-cluster/kubeconfig)
PODSNAP_E2E_VALUES       chart values file(s), comma-separated; default: overlays/local-cluster/values.yaml
PODSNAP_E2E_DEMO_IMAGE   the demo worker image; default localhost/podsnap-demo:dev
PODSNAP_E2E_GPU          "1": the demo worker asks for one nvidia.com/gpu and runs on it (kind with GPUs)
PODSNAP_E2E_TIMEOUT      seconds a single wait may take (default 120)
PODSNAP_E2E_OUT          where timings go (default out/e2e)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from podsnap.contract import is_truthy

REPO = Path(__file__).resolve().parents[3]
LOCAL_CLUSTER_DIR = Path(os.environ.get("PODSNAP_CLUSTER_DIR", "/var/lib/podsnap-cluster"))
LOCAL_KUBECONFIG = LOCAL_CLUSTER_DIR / "kubeconfig"
#: the hostPath directory behind the local cluster's artifact volume (hack/cluster/storage.yaml)
LOCAL_ARTIFACTS_DIR = LOCAL_CLUSTER_DIR / "volumes" / "artifacts"


@dataclass(frozen=True)
class E2EConfig:
    kubeconfig: Path
    values_files: tuple[Path, ...]
    demo_image: str
    gpu: bool
    timeout_s: float
    out_dir: Path
    chart: Path = REPO / "charts" / "podsnap"
    release: str = "podsnap"
    release_namespace: str = "podsnap-system"
    operator_deployment: str = "podsnap-operator"
    agent_daemonset: str = "podsnap-agent"
    demo_port: int = 8000
    images: tuple[str, ...] = field(default=())

    @property
    def local_cluster(self) -> bool:
        return self.kubeconfig.resolve() == LOCAL_KUBECONFIG.resolve()

    @classmethod
    def from_env(cls) -> E2EConfig:
        kubeconfig = Path(os.environ.get("PODSNAP_E2E_KUBECONFIG") or LOCAL_KUBECONFIG)
        values = os.environ.get("PODSNAP_E2E_VALUES")
        if values:
            values_files = tuple(REPO / v.strip() for v in values.split(",") if v.strip())
        else:
            values_files = (REPO / "overlays" / "local-cluster" / "values.yaml",)
        demo_image = os.environ.get("PODSNAP_E2E_DEMO_IMAGE", "localhost/podsnap-demo:dev")
        timeout = os.environ.get("PODSNAP_E2E_TIMEOUT", "120")
        try:
            timeout_s = float(timeout)
        except ValueError:
            raise ValueError(f"PODSNAP_E2E_TIMEOUT={timeout!r}: set it to a number of seconds, e.g. 120") from None
        return cls(
            kubeconfig=kubeconfig,
            values_files=values_files,
            demo_image=demo_image,
            gpu=is_truthy(os.environ.get("PODSNAP_E2E_GPU")),
            timeout_s=timeout_s,
            out_dir=REPO / os.environ.get("PODSNAP_E2E_OUT", "out/e2e"),
            images=(demo_image,),
        )
