"""`podsnap status KIND/NAME`: a SnapshotPolicy's, PodSnapshot's, SnapshotJob's or pod's snapshot story.

It reads (get and list only, in the object's namespace) the object, its checkpoint (PodSnapshot), the
SnapshotJob that captured it, and the pods involved, and shows which checkpoint, on which node, how big and
how old, the capture and restore timings the agent recorded, how each pod started, and the last failure.
Credentials come from --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the pod's ServiceAccount
(as kubectl). An auxiliary read that is forbidden becomes a warning in the output, not a failure.

Exit codes: 0 shown; 1 the object (or podsnap's API) was not found; 2 bad arguments; 3 the cluster could
not be read (credentials, connection, permission on the object itself).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from podsnap import contract as c
from podsnap.cli import status_doc as d

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNREADABLE = 3

KIND_POD = "Pod"
#: what a user may type for each kind (kubectl's names: kind, plural, singular, short names; any case)
ALIASES: dict[str, str] = {
    "pod": KIND_POD,
    "pods": KIND_POD,
    "po": KIND_POD,
    "policy": c.KIND_SNAPSHOT_POLICY,
    "policies": c.KIND_SNAPSHOT_POLICY,
}
for _kind in (c.KIND_SNAPSHOT_POLICY, c.KIND_POD_SNAPSHOT, c.KIND_SNAPSHOT_JOB):
    _plural, _singular, _short, _ = c.CRDS[_kind]
    for _alias in (_kind, _plural, _singular, *_short):
        ALIASES[_alias.lower()] = _kind
        ALIASES[f"{_alias.lower()}.{c.GROUP}"] = _kind
PLURALS = {kind: c.CRDS[kind][0] for kind in (c.KIND_SNAPSHOT_POLICY, c.KIND_POD_SNAPSHOT, c.KIND_SNAPSHOT_JOB)}
T = TypeVar("T")


class StatusError(Exception):
    """Ends the command with `code` and this message on stderr."""

    def __init__(self, message: str, code: int) -> None:
        self.code = code
        super().__init__(message)


class Forbidden(StatusError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_UNREADABLE)


@dataclass(frozen=True)
class Target:
    kind: str
    name: str


def parse_target(words: list[str]) -> Target:
    """`KIND/NAME` or `KIND NAME`, with kubectl's names for the kind (policy, snappolicy, podsnap, pod, …)."""
    if len(words) == 1 and "/" in words[0]:
        kind, _, name = words[0].partition("/")
    elif len(words) == 2 and "/" not in words[0]:
        kind, name = words
    else:
        raise StatusError(
            f"expected KIND/NAME or KIND NAME (e.g. policy/web, podsnapshot/web-abc, pod/web-0), got {' '.join(words)!r}",
            EXIT_USAGE,
        )
    resolved = ALIASES.get(kind.lower())
    if resolved is None:
        raise StatusError(
            f"unknown kind {kind!r}: use one of policy (snapshotpolicy, snappolicy), podsnapshot (podsnap), "
            "snapshotjob (snapjob), pod",
            EXIT_USAGE,
        )
    if not name:
        raise StatusError(f"{kind}/: the name is missing", EXIT_USAGE)
    return Target(resolved, name)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target", nargs="+", metavar="KIND/NAME", help="policy/NAME, podsnapshot/NAME, snapjob/NAME, pod/NAME"
    )
    p.add_argument("-n", "--namespace", help="the object's namespace (default: the kubeconfig context's, else default)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("--request-timeout", type=float, default=15.0, metavar="SECONDS", help="per API call (default 15)")


# --- credentials ---------------------------------------------------------------------------------
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def load_client(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """(ApiClient, the context's namespace), the way kubectl finds its credentials."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    conf = client.Configuration()
    default_file = Path("~/.kube/config").expanduser()
    in_cluster = not kubeconfig and not os.environ.get("KUBECONFIG") and not default_file.exists()
    try:
        if in_cluster and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=conf)
            namespace = SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else "default"
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=conf)
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            chosen = next((x for x in contexts if x["name"] == context), active) if context else active
            namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    except (ConfigException, OSError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or str(default_file)
        raise StatusError(f"no usable Kubernetes credentials ({where}): {exc}", EXIT_UNREADABLE) from None
    conf.retries = 1  # an unreachable server fails in seconds, not after urllib3's default retries
    return client.ApiClient(conf), namespace


# --- reading -------------------------------------------------------------------------------------
def _api_message(body: bytes | None, fallback: str) -> str:
    try:
        data = json.loads(body or b"")
    except ValueError:
        return fallback
    return str(data.get("message") or fallback) if isinstance(data, dict) else fallback


def _object_missing(body: bytes | None) -> bool:
    """A 404 for an object (vs. a resource the server does not serve: podsnap's CRDs not installed)."""
    try:
        data = json.loads(body or b"")
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("reason") == "NotFound" and bool(data.get("details"))


@dataclass
class Reader:
    """GETs through one client, answered as plain JSON; `optional` turns a forbidden auxiliary read into a
    warning. Plain GETs rather than the client's typed API classes: importing those costs seconds."""

    api: Any
    namespace: str
    timeout: float
    warnings: list[str] = field(default_factory=list)

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)

    def get(self, what: str, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        """The object or list at `path`; None on a 404 of the object itself."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        method, url, headers, _, _ = self.api.param_serialize(
            "GET",
            path,
            query_params=list((query or {}).items()) or None,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(method, url, header_params=headers, _request_timeout=self.timeout)
            body = resp.read()
        except (ApiException, HTTPError, OSError) as exc:
            raise StatusError(f"cannot reach the API server at {self.server}: {exc}", EXIT_UNREADABLE) from None
        status = resp.status
        if status == 200:
            return dict(json.loads(body))
        message = _api_message(body, f"{status} {resp.reason}")
        if status == 404 and _object_missing(body):
            return None
        if status == 404:
            raise StatusError(
                f"the API server at {self.server} does not serve {what.split(maxsplit=1)[0]}: are podsnap's CRDs installed "
                "(helm install podsnap charts/podsnap)?",
                EXIT_NOT_FOUND,
            )
        if status == 403:
            raise Forbidden(f"not allowed to read {what}: {message}")
        if status == 401:
            raise StatusError(
                f"the API server at {self.server} refused the credentials (401 Unauthorized)", EXIT_UNREADABLE
            )
        raise StatusError(f"reading {what}: {message}", EXIT_UNREADABLE)

    def optional(self, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except Forbidden as exc:
            self.warn(str(exc))
            return None

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def _ns(self, api: str, plural: str) -> str:
        return f"{api}/namespaces/{quote(self.namespace, safe='')}/{plural}"

    def cr(self, kind: str, name: str) -> dict[str, Any] | None:
        plural = PLURALS[kind]
        path = f"{self._ns(f'/apis/{c.GROUP}/{c.VERSION}', plural)}/{quote(name, safe='')}"
        return self.get(f"{plural}.{c.GROUP} {self.namespace}/{name}", path)

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.get(f"pods {self.namespace}/{name}", f"{self._ns('/api/v1', 'pods')}/{quote(name, safe='')}")

    def pods(self, selector: str) -> list[dict[str, Any]]:
        got = self.get(f"pods in {self.namespace}", self._ns("/api/v1", "pods"), {"labelSelector": selector})
        return sorted((got or {}).get("items") or [], key=lambda p: p["metadata"]["name"])

    def workload(self, kind: str, name: str) -> dict[str, Any] | None:
        plural = {"Deployment": "deployments", "StatefulSet": "statefulsets"}.get(kind)
        if plural is None:
            return None
        path = f"{self._ns('/apis/apps/v1', plural)}/{quote(name, safe='')}"
        return self.get(f"{plural}.apps {self.namespace}/{name}", path)

    def policies(self) -> list[dict[str, Any]]:
        plural = PLURALS[c.KIND_SNAPSHOT_POLICY]
        got = self.get(f"{plural}.{c.GROUP} in {self.namespace}", self._ns(f"/apis/{c.GROUP}/{c.VERSION}", plural))
        return list((got or {}).get("items") or [])


# --- gathering -----------------------------------------------------------------------------------
def _not_found(kind: str, name: str, namespace: str) -> StatusError:
    listing = "pods" if kind == KIND_POD else PLURALS[kind]
    return StatusError(
        f"{kind} {name!r} not found in namespace {namespace!r} (kubectl get {listing} -n {namespace} lists them)",
        EXIT_NOT_FOUND,
    )


def _checkpoint(r: Reader, name: str | None, now: datetime.datetime) -> d.Doc | None:
    if not name:
        return None
    try:
        snapshot = r.cr(c.KIND_POD_SNAPSHOT, name)
    except Forbidden as exc:
        r.warn(str(exc))
        return None  # not allowed to read it: said in the warnings, not claimed missing
    return d.checkpoint_view(snapshot, now, name=name)


def _job(r: Reader, name: str | None) -> d.Doc | None:
    job = r.optional(lambda: r.cr(c.KIND_SNAPSHOT_JOB, name)) if name else None
    return None if job is None else d.job_view(job)


def _selector_of(workload: Mapping[str, Any]) -> str | None:
    return d.label_selector((workload.get("spec") or {}).get("selector"))


def policy_status(r: Reader, name: str, now: datetime.datetime) -> d.Doc:
    policy = r.cr(c.KIND_SNAPSHOT_POLICY, name)
    if policy is None:
        raise _not_found(c.KIND_SNAPSHOT_POLICY, name, r.namespace)
    pview = d.policy_view(policy)
    checkpoint = _checkpoint(r, pview["checkpointName"], now)
    job = _job(r, pview["snapshotJobName"])
    pods: list[d.Doc] = []
    ref = pview["targetRef"]
    if ref["kind"] and ref["name"]:
        workload = r.optional(lambda: r.workload(ref["kind"], ref["name"]))
        selector = _selector_of(workload) if workload else None
        if selector:
            found = r.optional(lambda: r.pods(selector)) or []
            pods = [d.pod_view(p, policy=pview, checkpoint=checkpoint) for p in found]
    target = {"kind": c.KIND_SNAPSHOT_POLICY, "namespace": r.namespace, "name": name}
    return d.document(target, now, policy=pview, job=job, checkpoint=checkpoint, pods=pods, warnings=r.warnings)


def _restoring_from(r: Reader, snapshot: str) -> list[dict[str, Any]]:
    pods = r.optional(lambda: r.pods(f"{c.LABEL_RESTORE}=true")) or []
    return [p for p in pods if (p["metadata"].get("annotations") or {}).get(c.ANNOTATION_RESTORE_FROM) == snapshot]


def snapshot_status(r: Reader, name: str, now: datetime.datetime) -> d.Doc:
    snapshot = r.cr(c.KIND_POD_SNAPSHOT, name)
    if snapshot is None:
        raise _not_found(c.KIND_POD_SNAPSHOT, name, r.namespace)
    checkpoint = d.checkpoint_view(snapshot, now)
    labels = snapshot["metadata"].get("labels") or {}
    policy_name = labels.get(c.LABEL_POLICY)
    policy = r.optional(lambda: r.cr(c.KIND_SNAPSHOT_POLICY, policy_name)) if policy_name else None
    pview = d.policy_view(policy) if policy else None
    job = _job(r, labels.get(c.LABEL_SNAPSHOT_JOB))
    pods = [d.pod_view(p, policy=pview, checkpoint=checkpoint) for p in _restoring_from(r, name)]
    target = {"kind": c.KIND_POD_SNAPSHOT, "namespace": r.namespace, "name": name}
    return d.document(target, now, policy=pview, job=job, checkpoint=checkpoint, pods=pods, warnings=r.warnings)


def job_status(r: Reader, name: str, now: datetime.datetime) -> d.Doc:
    job = r.cr(c.KIND_SNAPSHOT_JOB, name)
    if job is None:
        raise _not_found(c.KIND_SNAPSHOT_JOB, name, r.namespace)
    jview = d.job_view(job)
    checkpoint = _checkpoint(r, jview["podSnapshotName"], now)
    policy_name = (job["metadata"].get("labels") or {}).get(c.LABEL_POLICY)
    policy = r.optional(lambda: r.cr(c.KIND_SNAPSHOT_POLICY, policy_name)) if policy_name else None
    pview = d.policy_view(policy) if policy else None
    pods = [d.pod_view(p, policy=pview, checkpoint=checkpoint) for p in _restoring_from(r, jview["podSnapshotName"])]
    target = {"kind": c.KIND_SNAPSHOT_JOB, "namespace": r.namespace, "name": name}
    return d.document(target, now, policy=pview, job=jview, checkpoint=checkpoint, pods=pods, warnings=r.warnings)


def _policy_of(r: Reader, pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The SnapshotPolicy whose target's selector matches the pod's labels (what the webhook consults)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    for policy in r.optional(r.policies) or []:
        ref = (policy.get("spec") or {}).get("targetRef") or {}
        workload = r.optional(partial(r.workload, str(ref.get("kind") or ""), str(ref.get("name") or "")))
        selector = ((workload or {}).get("spec") or {}).get("selector") or {}
        if selector and _matches(selector, labels):
            return policy
    return None


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(op, False)
        if not ok:
            return False
    return True


def pod_status(r: Reader, name: str, now: datetime.datetime) -> d.Doc:
    pod = r.pod(name)
    if pod is None:
        raise _not_found(KIND_POD, name, r.namespace)
    policy = _policy_of(r, pod)
    pview = d.policy_view(policy) if policy else None
    restored_from = (pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_RESTORE_FROM)
    checkpoint = _checkpoint(r, restored_from or (pview or {}).get("checkpointName"), now)
    job = _job(r, pview["snapshotJobName"]) if pview else None
    view = d.pod_view(pod, policy=pview, checkpoint=checkpoint)
    target = {"kind": KIND_POD, "namespace": r.namespace, "name": name}
    return d.document(target, now, policy=pview, job=job, checkpoint=checkpoint, pods=[view], warnings=r.warnings)


GATHER: dict[str, Callable[[Reader, str, datetime.datetime], d.Doc]] = {
    c.KIND_SNAPSHOT_POLICY: policy_status,
    c.KIND_POD_SNAPSHOT: snapshot_status,
    c.KIND_SNAPSHOT_JOB: job_status,
    KIND_POD: pod_status,
}


def run_status(args: argparse.Namespace) -> int:
    from podsnap.cli.status_text import render

    try:
        target = parse_target(list(args.target))
        api, context_ns = load_client(args.kubeconfig, args.context)
        reader = Reader(api, args.namespace or context_ns, args.request_timeout)
        doc = GATHER[target.kind](reader, target.name, datetime.datetime.now(datetime.UTC))
    except StatusError as exc:
        print(f"podsnap status: {exc}", file=sys.stderr)
        return exc.code
    if args.output == "json":
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc))
    return 0
