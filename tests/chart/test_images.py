"""podsnap's images leave this machine as standard archives and reach a real registry, and the chart
names exactly what was pushed (podsnap publishes no images of its own).

hack/images.sh is run for real: `export` splits a multi-image docker-archive (the shape
hack/cluster/build-images.sh writes; here three small images made by the same hack/cluster/mkimage.py,
since a full build takes minutes and root) into one archive per image with skopeo; `push` copies
them with skopeo into Debian's docker-registry (the distribution registry) on a free local port.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.conftest import REPO, find, render
from tests.conftest import tool
from tests.support.controlplane import free_port

pytestmark = pytest.mark.slow

NAMES = ("podsnap-operator", "podsnap-agent", "podsnap-demo")
IMAGES = REPO / "hack" / "images.sh"
MKIMAGE = REPO / "hack" / "cluster" / "mkimage.py"


def missing() -> str | None:
    for binary, package in (("skopeo", "skopeo"), ("docker-registry", "docker-registry")):
        if tool(binary) is None:
            return f"{binary} not installed: run `make setup` (Debian package {package})"
    return None


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1:<free port>, storage in a temp dir, no auth."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = work / "config.yml"
    config.write_text(
        f"version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {work / 'data'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    log = (work / "registry.log").open("wb")
    proc = subprocess.Popen([str(tool("docker-registry")), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"docker-registry did not start:\n{(work / 'registry.log').read_text()}") from None
            time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


def images_sh(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(IMAGES), *args],
        env={**os.environ, **env},
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A multi-image docker-archive like build-images.sh's: localhost/podsnap-NAME:dev."""
    work = tmp_path_factory.mktemp("built")
    spec = {"images": []}
    for name in NAMES:
        root = work / name
        (root / "etc").mkdir(parents=True)
        (root / "etc" / "podsnap-image").write_text(name)
        layer = work / f"{name}.tar"
        subprocess.run(
            [str(REPO / ".venv" / "bin" / "python"), str(MKIMAGE), "layer", str(root), str(layer)],
            check=True,
            capture_output=True,
        )
        spec["images"].append(
            {"ref": f"localhost/{name}:dev", "layers": [str(layer)], "config": {"Entrypoint": [f"/{name}"]}}
        )
    (work / "spec.json").write_text(json.dumps(spec))
    archive = work / "images.tar"
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), str(MKIMAGE), "archive", str(work / "spec.json"), str(archive)],
        check=True,
        capture_output=True,
    )
    return archive


def repo_tags(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    tags: list[str] = [t for entry in manifest for t in entry["RepoTags"]]
    return tags


def test_images_are_exported_as_one_standard_archive_each_and_pushed_where_the_chart_looks(
    built: Path, registry: str, tmp_path: Path, helm: str
) -> None:
    env = {"PODSNAP_IMAGES_DIR": str(tmp_path / "out"), "TAG": "t1"}
    proc = images_sh("export", str(built), env=env)
    assert proc.returncode == 0, proc.stderr
    for name in NAMES:
        assert repo_tags(tmp_path / "out" / f"{name}.tar") == [f"localhost/{name}:t1"]
    assert (tmp_path / "out" / "TAG").read_text().strip() == "t1"

    target = f"{registry}/ml/podsnap"
    proc = images_sh("push", target, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"--set image.registry={target} --set image.tag=t1" in proc.stdout
    for name in NAMES:
        with urllib.request.urlopen(f"http://{registry}/v2/ml/podsnap/{name}/tags/list", timeout=10) as resp:
            assert json.load(resp)["tags"] == ["t1"]

    # the chart, given what push printed, names exactly the pushed images, and each resolves
    docs = render(helm, "--set", f"image.registry={target}", "--set", "image.tag=t1")
    operator = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    agent = find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert (operator, agent) == (f"{target}/podsnap-operator:t1", f"{target}/podsnap-agent:t1")
    for image in (operator, agent):
        inspect = subprocess.run(
            [str(tool("skopeo")), "inspect", "--tls-verify=false", f"docker://{image}"],
            text=True, capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        assert json.loads(inspect.stdout)["Name"] == image.rsplit(":", 1)[0]


def test_push_refuses_a_malformed_registry_and_a_missing_export(tmp_path: Path) -> None:
    proc = images_sh("push", "https://registry.example.com", env={"PODSNAP_IMAGES_DIR": str(tmp_path)})
    assert proc.returncode != 0 and "is not a registry host" in proc.stderr
    proc = images_sh("push", "registry.example.com/podsnap", env={"PODSNAP_IMAGES_DIR": str(tmp_path)})
    assert proc.returncode != 0 and "run: make images" in proc.stderr
