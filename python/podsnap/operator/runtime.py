"""The operator's kopf registry and the per-process context its handlers share through kopf's `memo`."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass, field
from typing import Any

import kopf

from podsnap.kube.client import Credentials, Kube
from podsnap.kube.entrypoint import context_of
from podsnap.kube.tokens import TokenKey
from podsnap.operator.config import OperatorConfig
from podsnap.operator.metrics import OperatorMetrics

#: the operator's own registry, so the agent's handlers (another registry) can run in the same process
registry = kopf.OperatorRegistry()
ENTRYPOINT = "podsnap.operator.main"


@dataclass
class OperatorContext:
    config: OperatorConfig
    credentials: Credentials
    kube: Kube
    metrics: OperatorMetrics
    #: signs the tokens of the pods podsnap makes (capture Jobs, restore pods) and verifies capture tokens
    tokens: TokenKey
    server_minor: int = 0
    #: policy `namespace/name` -> (checkpoint, content) whose prefetch label this process set (operator/prefetch.py)
    prefetch_marked: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: loops the operator runs beside its handlers (operator/orphans.py), cancelled when it stops
    background: list[asyncio.Task[None]] = field(default_factory=list)
    #: uids of pods the webhook could not place whose Restored condition this process wrote (on_placement.py)
    placement_noticed: set[str] = field(default_factory=set)
    #: since when each node has had no Ready agent, when the API cannot keep it (operator/agent_absence.py)
    absent_agents: dict[str, datetime.datetime] = field(default_factory=dict)
    absent_agents_in_memory: bool = False

    @property
    def scheduling_gates(self) -> bool:
        """Pod scheduling gates are GA from Kubernetes 1.30 (beta and on by default from 1.27)."""
        mode = self.config.scheduling_gates
        return mode == "on" or (mode == "auto" and self.server_minor >= 27)


def ctx_of(memo: Any) -> OperatorContext:
    return context_of(memo, OperatorContext, ENTRYPOINT)
