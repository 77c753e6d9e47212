"""Thin access to the cluster under test: the Kubernetes client, kubectl and helm, and waiting.

Everything goes through the kubeconfig, so the same code drives the local cluster and kind. Requests
to workloads go through the API server's service and pod proxy, which works from any machine that can
reach the API server (a kind cluster's pod and Service addresses are not routable from its host).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes.client.exceptions import ApiException
from pytest_helm_charts.k8s.fixtures import NamespaceFactoryFunc

from podsnap import contract
from tests.conftest import tool

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A wait ran out of time; the message says what was awaited and what was last seen."""


class Pending(str):
    """What a polled function returns while not done yet: a description of what it saw."""


def wait_until(fn: Callable[[], T | Pending | None], *, timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll `fn` until it returns something truthy that is not `Pending`; fail naming `what` and the
    last thing seen."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except ApiException as exc:
            value, last = None, f"API error {exc.status}: {exc.reason}"
        if isinstance(value, Pending):
            last, value = str(value), None
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what} (last seen: {last})")
        time.sleep(interval)


@dataclass
class Cluster:
    """One cluster, reached by its kubeconfig."""

    kubeconfig: Path
    api: kclient.ApiClient

    @classmethod
    def connect(cls, kubeconfig: Path) -> Cluster:
        return cls(kubeconfig, kconfig.new_client_from_config(config_file=str(kubeconfig)))

    @property
    def core(self) -> kclient.CoreV1Api:
        return kclient.CoreV1Api(self.api)

    @property
    def apps(self) -> kclient.AppsV1Api:
        return kclient.AppsV1Api(self.api)

    @property
    def batch(self) -> kclient.BatchV1Api:
        return kclient.BatchV1Api(self.api)

    @property
    def custom(self) -> kclient.CustomObjectsApi:
        return kclient.CustomObjectsApi(self.api)

    @property
    def ext(self) -> kclient.ApiextensionsV1Api:
        return kclient.ApiextensionsV1Api(self.api)

    # --- command-line tools ------------------------------------------------------------------
    def _run(
        self, argv: Sequence[str], *, timeout: float, check: bool, stdin: str | None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
            )
        return proc

    def kubectl_argv(self, *args: str) -> list[str]:
        """The kubectl command line for `args` against this cluster (for a process run in the background)."""
        kubectl = tool("kubectl")
        if kubectl is None:
            raise AssertionError("kubectl not installed: run `make setup`")
        return [kubectl, "--kubeconfig", str(self.kubeconfig), *args]

    def kubectl(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self._run(self.kubectl_argv(*args), timeout=timeout, check=check, stdin=stdin)

    def helm(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        helm = tool("helm")
        if helm is None:
            raise AssertionError("helm not installed: run `make setup`")
        return self._run([helm, "--kubeconfig", str(self.kubeconfig), *args], timeout=timeout, check=check, stdin=None)

    def apply(self, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        docs = "\n---\n".join(json.dumps(o) for o in objects)
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", stdin=docs)

    # --- podsnap objects ---------------------------------------------------------------------
    def get_custom(self, plural: str, name: str, namespace: str | None) -> dict[str, Any] | None:
        try:
            if namespace is None:
                obj = self.custom.get_cluster_custom_object(contract.GROUP, contract.VERSION, plural, name)
            else:
                obj = self.custom.get_namespaced_custom_object(
                    contract.GROUP, contract.VERSION, namespace, plural, name
                )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj)

    def list_custom(self, plural: str, namespace: str | None = None, selector: str = "") -> list[dict[str, Any]]:
        if namespace is None:
            out = self.custom.list_cluster_custom_object(
                contract.GROUP, contract.VERSION, plural, label_selector=selector
            )
        else:
            out = self.custom.list_namespaced_custom_object(
                contract.GROUP, contract.VERSION, namespace, plural, label_selector=selector
            )
        return list(out.get("items", []))

    # --- requests to workloads (through the API server) ----------------------------------------
    def proxy(
        self, path: str, *, method: str = "GET", body: dict[str, Any] | None = None, timeout: float = 30
    ) -> tuple[int, Any]:
        """`path` under /api/v1 (e.g. namespaces/NS/services/NAME:PORT/proxy/health): (status, JSON or text)."""
        method_, url, headers, payload, _ = self.api.param_serialize(
            method,
            f"/api/v1/{path}",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(method_, url, header_params=headers, body=payload, _request_timeout=timeout)
            resp.read()
            raw, status = resp.data, int(resp.status)
        except ApiException as exc:
            raw, status = (exc.body or b""), int(exc.status or 0)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # a worker frozen by a checkpoint, or a pod going away: no answer is an answer here
            return 0, f"{type(exc).__name__}: {exc}"
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text


E2E_NAMESPACE_LABEL = "podsnap.io/e2e=true"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:30].strip("-")


def wait_for_default_service_account(cluster: Cluster, namespace: str) -> None:
    """A pod created before its namespace's default ServiceAccount exists is refused."""
    wait_until(
        lambda: any(
            sa.metadata.name == "default" for sa in cluster.core.list_namespaced_service_account(namespace).items
        ),
        timeout=30,
        what=f"the default ServiceAccount of {namespace}",
    )


def new_namespace(cluster: Cluster, factory: NamespaceFactoryFunc, prefix: str) -> str:
    """`e2e-<prefix>-<random>` from one of pytest-helm-charts' namespace factories (it deletes the namespace
    and waits until it is gone when its scope ends: the operator's finalizers inside have finished),
    labelled for the session's cleanup, its default ServiceAccount in place."""
    name = f"e2e-{_slug(prefix)}-{secrets.token_hex(2)}"
    key, value = E2E_NAMESPACE_LABEL.split("=")
    factory(name, extra_metadata={"labels": {key: value}})
    wait_for_default_service_account(cluster, name)
    return name


def create_namespace(cluster: Cluster, prefix: str) -> str:
    """A fresh namespace `e2e-<prefix>-<random>` the caller deletes (`delete_namespace`), for scopes the
    plugin's factories do not have."""
    name = f"e2e-{_slug(prefix)}-{secrets.token_hex(2)}"
    key, value = E2E_NAMESPACE_LABEL.split("=")
    cluster.core.create_namespace({"metadata": {"name": name, "labels": {key: value}}})
    wait_for_default_service_account(cluster, name)
    return name


def delete_namespace(cluster: Cluster, name: str) -> None:
    """Deletes without waiting: the operator's finalizers finish the cleanup inside."""
    try:
        cluster.core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """A condition of a custom object's status (None when absent)."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def pod_condition(pod: kclient.V1Pod, type_: str) -> kclient.V1PodCondition | None:
    for cond in (pod.status and pod.status.conditions) or []:
        if cond.type == type_:
            return cond
    return None


def pod_ready(pod: kclient.V1Pod) -> bool:
    cond = pod_condition(pod, "Ready")
    return bool(cond and cond.status == "True")
