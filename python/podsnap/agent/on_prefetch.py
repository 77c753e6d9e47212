"""Prefetch: fill this node's artifact cache with the checkpoints Ready SnapshotPolicies restore from.

The operator labels a PodSnapshotContent `podsnap.io/prefetch: "true"` while a Ready SnapshotPolicy
restores from it (operator/prefetch.py). Every agent watches the contents with that label, whatever
their node, read-only, and queues a background fill of each one's artifact (`Filler`, bounded
concurrency, paused while restores and captures run), so the first restore pod on any node finds the
artifact on local disk. When the label goes the entry becomes the first to evict; when the content is
deleted the entry goes.

This watch has its own kopf registry and loop, beside the agent's: the agent's own watch of contents is
limited to its node's by a server-side label selector, and kopf takes one selector per resource. The
loop has only event handlers, so it writes nothing to the objects; its finalizer name is one nothing
ever carries, so it can never release the agent's artifact finalizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.agent.cache import CacheKey
from podsnap.agent.executor import ExecutionError
from podsnap.agent.on_content import artifact_dir
from podsnap.agent.runtime import ENTRYPOINT, AgentContext, ctx_of
from podsnap.kube import conditions
from podsnap.kube.entrypoint import MEMO_KEY, register_login
from podsnap.kube.settings import apply_common

log = logging.getLogger(__name__)

prefetch_registry = kopf.OperatorRegistry()
CONTENTS = (c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS)
#: never added (no handler here needs a finalizer): kopf removes only its own name, and this is not the
#: agent's artifact finalizer
UNUSED_FINALIZER = f"{c.GROUP}/agent-prefetch"


@kopf.on.startup(registry=prefetch_registry)
def prefetch_startup(*, settings: kopf.OperatorSettings, **_: Any) -> None:
    apply_common(settings, finalizer=UNUSED_FINALIZER, progress_prefix=f"prefetch.{c.GROUP}")
    settings.watching.label_selectors[c.GROUP, c.PLURAL_POD_SNAPSHOT_CONTENTS] = f"{c.LABEL_PREFETCH}=true"


register_login(prefetch_registry, AgentContext, ENTRYPOINT)


def fill_request(ctx: AgentContext, body: Mapping[str, Any]) -> tuple[CacheKey, Any] | None:
    """(key, artifact dir on the volume) of a Ready content; None when it has nothing to fill yet."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    digest = (status.get("artifact") or {}).get("digest")
    if not conditions.is_true(status.get("conditions"), c.COND_READY) or not digest or not spec.get("artifactPath"):
        return None
    try:
        return CacheKey(body["metadata"]["name"], str(digest)), artifact_dir(
            ctx.config.artifact_root, spec["artifactPath"]
        )
    except (ValueError, ExecutionError) as exc:
        log.warning("prefetch: not filling %s: %s", body["metadata"]["name"], exc)
        return None


@kopf.on.event(*CONTENTS, registry=prefetch_registry)
def prefetch_content(*, type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    ctx = ctx_of(memo)
    if ctx.cache is None or ctx.filler is None:
        return
    meta = body.get("metadata") or {}
    name = meta.get("name", "")
    if type == "DELETED":
        # a watch with a label selector reports an object that lost the label as DELETED too (with its
        # old body, label included): only the server says whether it still exists
        now = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
        ctx.cache.release(name, gone=now is None or bool(now["metadata"].get("deletionTimestamp")))
        return
    if meta.get("deletionTimestamp"):
        ctx.cache.release(name, gone=True)
        return
    request = fill_request(ctx, body)
    if request is None:
        return
    key, source = request
    obj = {"apiVersion": c.API_VERSION, "kind": c.KIND_POD_SNAPSHOT_CONTENT, "metadata": dict(meta)}
    if ctx.filler.submit(key, source, on_done=lambda k, outcome, msg: _report(ctx, obj, outcome, msg)):
        log.info("prefetch: filling the node cache with %s", name)


def _report(ctx: AgentContext, obj: Mapping[str, Any], outcome: str, message: str) -> None:
    """An Event on the content for a prefetch that filled, or that found the volume's artifact wrong."""
    if outcome not in ("filled", "mismatch"):
        return
    ok = outcome == "filled"
    post_event(
        ctx,
        obj,
        type_="Normal" if ok else "Warning",
        reason=c.REASON_PREFETCHED if ok else c.REASON_PREFETCH_FAILED,
        message=f"node {ctx.config.node_name}: {message}",
    )


def post_event(ctx: AgentContext, obj: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
    """A core Event from a fill's thread, where kopf's own poster (bound to its handlers) is not reachable.
    A cluster-scoped object's Events go to the `default` namespace, as kopf puts them."""
    meta = obj.get("metadata") or {}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = meta.get("namespace") or "default"
    body = {
        "metadata": {"generateName": f"{meta.get('name', 'podsnap')}-"[:200], "namespace": namespace},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "podsnap-agent", "host": ctx.config.node_name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        ctx.kube.core.create_namespaced_event(namespace, body)
    except Exception:  # an Event is best-effort by nature
        log.exception("could not post event %s on %s", reason, meta.get("name"))


@contextlib.contextmanager
def prefetch_loop(ctx: AgentContext) -> Iterator[None]:
    """Run the prefetch watch (its own kopf loop, in a thread) while the block runs."""
    stop = threading.Event()

    def main() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=prefetch_registry,
                    memo=kopf.Memo(**{MEMO_KEY: ctx}),
                    clusterwide=True,
                    standalone=True,
                    stop_flag=stop,
                )
            )
        except Exception:
            log.exception("prefetch: the watch stopped; restores still read the cache and fill it afterwards")

    thread = threading.Thread(target=main, name="prefetch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
