"""`helm upgrade --reuse-values` from every earlier chart version renders what a fresh install renders.

With --reuse-values, Helm 3 and 4 render the new chart with the OLD chart's computed values in place of
the new values.yaml, so the chart itself fills in what an older values.yaml lacked (templates/
_defaults.tpl, podsnap.init). Each case runs against a real kube-apiserver (1.20):

1. install the old chart with some user values;
2. `helm upgrade --reuse-values` to this chart, twice (Helm 3 feeds a user's `null` back one way on the
   first upgrade and another way on the second); from a version without image values, the first
   such upgrade fails asking for image.registry, and succeeds with it;
3. take every object of the release (`helm get manifest`), uninstall;
4. install this chart fresh with the same user values, take its objects, uninstall;
5. compare object by object.

What legitimately differs, and how the comparison handles it:
- the webhook's self-signed certificate is made anew by each install: each manifest's caBundle must be
  its own Secret's ca.crt, then both are masked;
- an old chart whose DEFAULT differs from today's (the stored 0.1.0 values: a 50Gi claim, a 10 s webhook
  timeout, operator resources without a limit) keeps it on --reuse-values, by Helm's design (the
  release's values are reused, and a claim must not change size). The fresh install is given those
  old defaults as user values, so everything else must still be equal.

Earlier chart versions: every commit that changed charts/podsnap, grouped by its values.yaml (an upgrade
depends only on the old chart's values, its templates never render again); the newest commit of each
group is installed with `git archive`. Plus the stored values of releases made before the chart came
into this repository (upgrade-snapshots/), installed as this chart with those values.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, FIGURES, NAMESPACE, RELEASE, REPO, SNAPSHOTS, run
from tests.chart.history import (
    REGISTRY,
    USER_VALUES,
    canonical,
    chart_commits,
    check_user_values_honoured,
    differences,
    has_path,
    kept_old_defaults,
    normalized,
    prune,
)
from tests.conftest import require_tool
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.slow

Obj = dict[str, Any]


@dataclass(frozen=True)
class OldChart:
    name: str
    values: dict[str, Any]
    commit: str | None = None  # from git; else a stored values set on this chart's templates
    snapshot: Path | None = None

    def materialize(self, tmp: Path) -> Path:
        if self.commit is not None:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", self.commit, "charts/podsnap"], capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
            return tmp / "charts" / "podsnap"
        assert self.snapshot is not None
        chart = tmp / "podsnap"
        subprocess.run(["cp", "-r", str(CHART), str(chart)], check=True)
        (chart / "values.yaml").write_text(self.snapshot.read_text())
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        meta["version"] = self.snapshot.stem
        (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
        return chart


def old_charts() -> list[OldChart]:
    """The newest commit of each distinct values.yaml in git, then stored values sets not in git."""
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for commit, values in chart_commits():
        groups.setdefault(canonical(values), []).append((commit, values))
    charts = [OldChart(f"git-{members[0][0][:7]}", members[0][1], commit=members[0][0]) for members in groups.values()]
    FIGURES["reuse-values: chart commits"] = (
        f"{sum(len(m) for m in groups.values())} commits, {len(groups)} distinct values.yaml: "
        + "; ".join(f"{m[0][0][:7]} ({len(m)})" for m in groups.values())
    )
    for snap in SNAPSHOTS:
        values = yaml.safe_load(snap.read_text())
        if canonical(values) not in groups:
            charts.append(OldChart(snap.stem, values, snapshot=snap))
    return charts


OLD_CHARTS = old_charts()


@dataclass
class Helm:
    cp: ControlPlane
    binary: str
    kubectl_bin: str

    @property
    def major(self) -> int:
        return 3 if Path(self.binary).name == "helm3" else 4

    def attempt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run([self.binary, "--kubeconfig", str(self.cp.kubeconfig), *args], check=False, timeout=240)

    def __call__(self, *args: str) -> str:
        proc = self.attempt(*args)
        if proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def kubectl(self, *args: str) -> str:
        argv = [self.kubectl_bin, "--kubeconfig", str(self.cp.kubeconfig), *args]
        return subprocess.run(argv, text=True, capture_output=True, check=True, timeout=120).stdout

    def manifest(self) -> dict[tuple[str, str], Obj]:
        text = self("get", "manifest", RELEASE, "-n", NAMESPACE)
        objs = [d for d in yaml.safe_load_all(text) if d]
        return {(o["kind"], o["metadata"]["name"]): o for o in objs}

    def uninstall(self) -> None:
        self("uninstall", RELEASE, "-n", NAMESPACE)
        # the claim is kept by its resource policy; the next install must create its own
        self.kubectl("-n", NAMESPACE, "delete", "pvc", "--all", "--timeout=60s")


@pytest.fixture(scope="module")
def control_plane(control_plane_factory: Any) -> Iterator[ControlPlane]:
    cp = control_plane_factory("reuse-values", controller_manager=True)
    kubectl = require_tool("kubectl")
    subprocess.run([kubectl, "--kubeconfig", str(cp.kubeconfig), "create", "namespace", NAMESPACE], check=True)
    yield cp


@pytest.mark.parametrize("old", OLD_CHARTS, ids=lambda c: c.name)
@pytest.mark.parametrize("binary", ["helm3", "helm"])
def test_reuse_values_upgrade_renders_what_a_fresh_install_renders(
    old: OldChart, binary: str, control_plane: ControlPlane, tmp_path: Path
) -> None:
    helm = Helm(control_plane, require_tool(binary), require_tool("kubectl"))
    user = prune(USER_VALUES, old.values)
    (tmp_path / "user.yaml").write_text(yaml.safe_dump(user))
    kept = kept_old_defaults(old.values, user)
    (tmp_path / "kept.yaml").write_text(yaml.safe_dump(kept))
    # a version without image values: the upgrade must name a registry (podsnap publishes no images)
    added = {} if has_path(old.values, ("image", "registry")) else REGISTRY
    (tmp_path / "added.yaml").write_text(yaml.safe_dump(added))
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    chart = old.materialize(old_dir)
    # the old chart as its users installed it; its CRDs may carry fields a 1.20 server does not know
    legacy = ["--disable-openapi-validation"] + (["--server-side=false"] if helm.major == 4 else [])
    start = time.monotonic()
    helm("install", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(tmp_path / "user.yaml"), *legacy)
    try:
        if added:
            failed = helm.attempt("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values")
            assert failed.returncode != 0 and "image.registry is empty" in failed.stderr, failed.stderr
        helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "-f", str(tmp_path / "added.yaml"))
        helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values")
        upgraded = helm.manifest()
    finally:
        helm.uninstall()
    helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "-f",
        str(tmp_path / "user.yaml"),
        "-f",
        str(tmp_path / "kept.yaml"),
        "-f",
        str(tmp_path / "added.yaml"),
    )
    try:
        fresh = helm.manifest()
    finally:
        helm.uninstall()
    FIGURES[f"reuse-values upgrade vs fresh install ({old.name}, helm {helm.major})"] = (
        f"{len(upgraded)} objects equal in {time.monotonic() - start:.1f} s; {len(user)} user value groups"
        + (f"; old defaults kept: {', '.join(sorted(kept))}" if kept else "")
    )
    check_user_values_honoured(list(upgraded.values()), user)
    a, b = normalized(upgraded), normalized(fresh)
    assert sorted(a) == sorted(b), f"objects differ: upgrade {sorted(set(a) - set(b))}, fresh {sorted(set(b) - set(a))}"
    diffs = [f"{kind}/{name}{d}" for (kind, name) in sorted(a) for d in differences(a[kind, name], b[kind, name])]
    assert not diffs, "the upgraded release differs from a fresh install:\n" + "\n".join(diffs)
