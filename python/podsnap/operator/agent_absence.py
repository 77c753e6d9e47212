"""Since when each node has had no Ready podsnap agent, as the operator can still tell after its own restart.

The clean-up handover (orphans.py) and the removal of a node's placement labels (stale_placement.py) both
wait `cleanup.handoverAfterSeconds` from that moment, not from when a content was deleted: a content deleted
long after its agent went waits no longer, one deleted just before an agent's blip is not handed over early,
and nothing is ever done for a node while it has a Ready agent.

Where the moment comes from, and why:
- an agent pod that exists but is not Ready: its Ready condition's lastTransitionTime. The kubelet writes it,
  so it is exact and in the API whatever happened to the operator;
- no agent pod at all (the DaemonSet's nodeSelector or tolerations changed, the pod was evicted): nothing in
  the API remembers when the pod went, so the operator writes it down the first time it sees the node without
  a Ready agent, in the ConfigMap ABSENCE_CONFIGMAP of its own namespace (node name: RFC 3339 time), and
  drops the entry once a Ready agent is back. A time in memory would start every wait again at each
  operator restart. The ConfigMap changes only on those transitions, not on each look. If the operator was
  down when the agent went, it writes the time it first sees the absence: later than the truth, so a wait
  may be longer, never shorter.
- why not an annotation on the Node: the operator may patch Nodes only with placement on (and then only for
  its labels); the orphan handover must work without placement too. A ConfigMap of its own namespace needs
  only a namespaced Role, for that one object.

Limits: an agent that came back Ready and went again while the operator was down leaves the first absence's
time in the ConfigMap (nothing in the API tells of the Ready spell in between). An operator that runs outside
a ServiceAccount (no namespace of its own) or without the chart's Role keeps the record in memory instead,
logging why: its waits then start again when it restarts, but still end.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from podsnap.kube.client import get_or_none
from podsnap.kube.conditions import parse_time
from podsnap.operator.on_agent_requests import AGENT_LABELS, own_namespace
from podsnap.operator.runtime import OperatorContext

log = logging.getLogger(__name__)

#: in the operator's namespace (the chart's Role grants it this one ConfigMap)
ABSENCE_CONFIGMAP = "podsnap-agent-absence"


@dataclass(frozen=True)
class Agents:
    """The release's agent pods as the API shows them now."""

    #: nodes with a Ready agent pod (not being deleted)
    ready: frozenset[str] = frozenset()
    #: nodes with an agent pod in any state
    present: frozenset[str] = frozenset()
    #: nodes whose agent pod reports Ready=False: since when (the kubelet's lastTransitionTime)
    not_ready_since: Mapping[str, datetime.datetime] = field(default_factory=dict)


def observe(ctx: OperatorContext) -> Agents:
    """The agent pods (the release's, in the operator's namespace) and their readiness."""
    namespace = own_namespace(ctx)
    if namespace is None:
        return Agents()
    selector = ",".join(f"{k}={v}" for k, v in sorted(AGENT_LABELS.items()))
    ready, present, since = set(), set(), {}
    for pod in ctx.kube.core.list_namespaced_pod(namespace, label_selector=selector).items:
        node = str(pod.spec.node_name or "")
        if not node:
            continue
        present.add(node)
        cond = next((c for c in (pod.status and pod.status.conditions) or [] if c.type == "Ready"), None)
        if cond is not None and cond.status == "True" and pod.metadata.deletion_timestamp is None:
            ready.add(node)
        elif cond is not None and cond.status != "True" and cond.last_transition_time is not None:
            since[node] = cond.last_transition_time.astimezone(datetime.UTC)
    since = {n: t for n, t in since.items() if n not in ready}
    return Agents(frozenset(ready), frozenset(present), since)


def absences(
    recorded: Mapping[str, datetime.datetime], agents: Agents, watched: Iterable[str], now: datetime.datetime
) -> dict[str, datetime.datetime]:
    """The record to keep: each watched node without a Ready agent, since the earliest time known for it."""
    out = {}
    for node in set(watched) - agents.ready:
        known = [t for t in (recorded.get(node), agents.not_ready_since.get(node)) if t is not None]
        out[node] = min(known) if known else now
    return out


def since(
    node: str, agents: Agents, recorded: Mapping[str, datetime.datetime], now: datetime.datetime
) -> datetime.datetime:
    """Since when `node` has had no Ready agent; `now` when it has one, or when its absence is not recorded yet
    (the sweep records it): a wait never starts earlier than the operator can show."""
    if node in agents.ready:
        return now
    known = [t for t in (recorded.get(node), agents.not_ready_since.get(node)) if t is not None]
    return min(known) if known else now


#: the resourceVersion `read` gives when the record is kept in memory (ctx.absent_agents)
IN_MEMORY = "in-memory"


def _in_memory(ctx: OperatorContext, why: str) -> tuple[dict[str, datetime.datetime], str]:
    if not ctx.absent_agents_in_memory:
        log.warning("agent absences are kept in memory (%s): the clean-up waits start again at each restart", why)
        ctx.absent_agents_in_memory = True
    return dict(ctx.absent_agents), IN_MEMORY


def read(ctx: OperatorContext) -> tuple[dict[str, datetime.datetime], str | None]:
    """The recorded absences and the ConfigMap's resourceVersion (None: there is none yet)."""
    namespace = own_namespace(ctx)
    if namespace is None or ctx.absent_agents_in_memory:  # once in memory, for the rest of this process
        return _in_memory(ctx, "the operator runs under no ServiceAccount, so has no namespace of its own")
    try:
        cm = get_or_none(ctx.kube.core.read_namespaced_config_map, ABSENCE_CONFIGMAP, namespace)
    except ApiException as exc:
        if exc.status != 403:
            raise
        return _in_memory(ctx, f"no right to read ConfigMap {namespace}/{ABSENCE_CONFIGMAP}: the chart's Role")
    if cm is None:
        return {}, None
    got = {node: parse_time(value) for node, value in (cm.data or {}).items()}
    return {node: t for node, t in got.items() if t is not None}, str(cm.metadata.resource_version)


def write(ctx: OperatorContext, absent: Mapping[str, datetime.datetime], version: str | None) -> None:
    """Store `absent`, guarded by `version`: a second operator's write in between makes this one fail with a
    409 (ApiException), and the next sweep starts again from what is stored."""
    namespace = own_namespace(ctx)
    if namespace is None or version == IN_MEMORY:
        ctx.absent_agents = dict(absent)
        return
    data = {node: t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for node, t in sorted(absent.items())}
    body: dict[str, Any] = {"metadata": {"name": ABSENCE_CONFIGMAP}, "data": data}
    if version is None:
        ctx.kube.core.create_namespaced_config_map(namespace, body)
    else:
        body["metadata"]["resourceVersion"] = version
        ctx.kube.core.replace_namespaced_config_map(ABSENCE_CONFIGMAP, namespace, body)


def track(
    ctx: OperatorContext, agents: Agents, watched: Iterable[str], now: datetime.datetime
) -> dict[str, datetime.datetime]:
    """Bring the record up to date for the `watched` nodes; returns it (what is stored, or would be)."""
    recorded, version = read(ctx)
    absent = absences(recorded, agents, watched, now)
    # written only when an entry comes or goes: a time once written stays as it was
    if set(absent) != set(recorded) or any(absent[n] != recorded[n] for n in absent):
        try:
            write(ctx, absent, version)
        except ApiException as exc:
            if exc.status == 403:  # no right to create it: the chart's Role is missing
                _in_memory(ctx, f"no right to write ConfigMap {ABSENCE_CONFIGMAP}: the chart's Role")
                write(ctx, absent, IN_MEMORY)
                return absent
            if exc.status != 409:
                raise
            # another operator (or this one's previous round) wrote in between: its record stands until next time
            return absences(read(ctx)[0], agents, watched, now)
    return absent
