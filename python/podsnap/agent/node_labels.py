"""The agent labels its own Node with the facts the restore gates compare (podsnap.kube.placement_labels), so
the webhook can send restore pods only to nodes that can take their artifact.

It labels once when it starts and again every RELABEL_INTERVAL_S, so a driver upgrade or a new kernel
(which needs a reboot, and so a new agent) shows within minutes. The patch sets every placement label,
null for a fact the host lacks: it is idempotent, and removes labels that stopped being true. A failure is
logged and tried again at the next tick; restores are not held up by it (the gates still check each one).
The agent may change only these labels of its own Node: the operator's node-restriction webhook refuses
anything else (operator/on_agent_requests.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from podsnap.agent.runtime import AgentContext
from podsnap.kube.placement_labels import node_labels

log = logging.getLogger(__name__)

RELABEL_INTERVAL_S = 300.0


def label_node(ctx: AgentContext) -> dict[str, str | None]:
    """Patch this agent's Node with its host's placement labels; returns them."""
    labels = node_labels(ctx.node_facts())
    ctx.kube.core.patch_node(ctx.config.node_name, {"metadata": {"labels": labels}})
    return labels


def _loop(ctx: AgentContext, stop: threading.Event, interval_s: float) -> None:
    last: dict[str, str | None] | None = None
    while True:
        try:
            labels = label_node(ctx)
            if labels != last:
                log.info("node %s labelled for placement: %s", ctx.config.node_name, labels)
            last = labels
        except Exception as exc:  # the API server or NVML, for now: the next tick tries again
            log.warning("could not label node %s for placement: %s", ctx.config.node_name, exc)
        if stop.wait(interval_s):
            return


@contextlib.contextmanager
def labelling(ctx: AgentContext, interval_s: float = RELABEL_INTERVAL_S) -> Iterator[None]:
    """Keep this node's placement labels current while the agent runs (nothing when placement is off)."""
    if not ctx.config.placement:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=_loop, args=(ctx, stop, interval_s), name="node-labels", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
