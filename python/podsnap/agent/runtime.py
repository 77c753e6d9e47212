"""The agent's kopf registry and the context its handlers share through kopf's `memo`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from podsnap.agent.cache import ArtifactCache
from podsnap.agent.cached_executor import Filler
from podsnap.agent.config import AgentConfig
from podsnap.agent.executor import Executor
from podsnap.agent.metrics import AgentMetrics
from podsnap.kube.client import Credentials, Kube
from podsnap.kube.entrypoint import context_of
from podsnap.kube.tokens import TokenKey

registry = kopf.OperatorRegistry()
ENTRYPOINT = "podsnap.agent.main"


@dataclass
class AgentContext:
    config: AgentConfig
    credentials: Credentials
    kube: Kube
    executor: Executor
    metrics: AgentMetrics
    #: verifies that a pod is one podsnap made (capture source or shaped restore pod) before acting on it
    tokens: TokenKey
    #: pod UIDs whose restore runs now (pod events arrive while a restore is in flight)
    restoring: set[str] = field(default_factory=set)
    #: pod UIDs this process has started restoring: a later event still showing RestoreInProgress is stale
    started: set[str] = field(default_factory=set)
    #: content name -> when its artifact was last checked (time.monotonic)
    checked: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the node-local artifact cache and its background fills (None: no cache configured)
    cache: ArtifactCache | None = None
    filler: Filler | None = None
    #: loops the agent runs beside its handlers (agent/volume_sweep.py), cancelled when it stops
    background: list[asyncio.Task[None]] = field(default_factory=list)
    #: this host's facts in the shape of status.source, which the agent labels its Node with (node_labels.py)
    node_facts: Callable[[], dict[str, Any]] = dict


def ctx_of(memo: Any) -> AgentContext:
    return context_of(memo, AgentContext, ENTRYPOINT)
