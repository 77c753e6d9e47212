"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ kube-controller-manager).

No kubelet runs here: pods are accepted and scheduled nowhere, so tests that need pod status play the
kubelet's part themselves (and say so). Everything listens on 127.0.0.1 only, on free ports, with a
fresh PKI per start, RBAC authorization on, and token authentication for an admin in system:masters.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.support.processes import free_port


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path) -> str:
    """CA, apiserver serving cert, service-account key pair; returns the admin token."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "3650", "-subj", "/CN=podsnap-test-ca", cwd=pki,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
        "-subj", "/CN=kube-apiserver", cwd=pki,
    )  # fmt: skip
    (pki / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "apiserver.crt", "-days", "3650", "-extfile", "ext.cnf", cwd=pki,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    token = base64.b32encode(os.urandom(20)).decode().lower()
    (pki / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    return token


def kubeconfig_text(server: str, ca: Path, token: str, user: str = "admin") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
    )


@dataclass
class ControlPlane:
    workdir: Path
    apiserver: str
    etcd: str
    controller_manager: str | None = None
    port: int = 0
    token: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 60.0) -> ControlPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        self.token = make_pki(pki)
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                self.etcd, "--data-dir", str(self.workdir / "etcd"), "--listen-client-urls", etcd_url,
                "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"default={peer_url}",
                "--unsafe-no-fsync",
            ],
        )  # fmt: skip
        self._spawn(
            "apiserver",
            [
                self.apiserver, "--etcd-servers", etcd_url, "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1", "--secure-port", str(self.port),
                "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
                "--client-ca-file", str(pki / "ca.crt"),
                "--token-auth-file", str(pki / "tokens.csv"), "--authorization-mode", "RBAC",
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(pki / "sa.pub"),
                "--service-account-signing-key-file", str(pki / "sa.key"),
                "--service-cluster-ip-range", "10.0.0.0/24", "--disable-admission-plugins", "ServiceAccount",
                "--allow-privileged=true", "--kubelet-preferred-address-types", "InternalIP",
            ],
        )  # fmt: skip
        self.kubeconfig.write_text(kubeconfig_text(self.server, self.ca, self.token))
        self._wait_ready(timeout)
        if self.controller_manager:
            self._spawn(
                "controller-manager",
                [
                    self.controller_manager, "--kubeconfig", str(self.kubeconfig),
                    "--leader-elect=false", "--service-account-private-key-file", str(pki / "sa.key"),
                    "--root-ca-file", str(pki / "ca.crt"), "--use-service-account-credentials=false",
                    "--secure-port", "0", "--port", "0",
                    "--controllers",
                    "*,-nodeipam,-nodelifecycle,-attachdetach,-persistentvolume-binder,-route,-service,"
                    "-cloud-node-lifecycle,-ttl-after-finished",
                ],
            )  # fmt: skip
        return self

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"control plane process exited ({proc.args!r}):\n{self.logs_tail()}")
            try:
                req = urllib.request.Request(f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.token}"})
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready after {timeout} s ({last}):\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 20) -> str:
        out = []
        for log in sorted(self.workdir.glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        kubectl = shutil.which("kubectl") or "kubectl"
        return subprocess.run(
            [kubectl, "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            text=True,
            capture_output=True,
            check=check,
        )

    def token_kubeconfig(self, token: str, path: Path, user: str) -> Path:
        """A kubeconfig that authenticates with `token` (e.g. a ServiceAccount's), for RBAC tests."""
        path.write_text(kubeconfig_text(self.server, self.ca, token, user=user))
        return path

    def service_account_token(self, namespace: str, name: str, timeout: float = 30.0) -> str:
        """The token of a ServiceAccount, from the Secret the controller-manager's token controller makes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.kubectl(
                "-n", namespace, "get", "secrets", "-o",
                "jsonpath={range .items[?(@.type=='kubernetes.io/service-account-token')]}"
                "{.metadata.annotations.kubernetes\\.io/service-account\\.name}={.data.token}{'\\n'}{end}",
                check=False,
            )  # fmt: skip
            for line in got.stdout.splitlines():
                sa, _, data = line.partition("=")
                if sa == name and data:
                    return base64.b64decode(data).decode()
            time.sleep(0.3)
        raise TimeoutError(
            f"no token Secret for ServiceAccount {namespace}/{name} (is kube-controller-manager running?)"
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=5)
        self.procs.clear()
