"""Node labels for placement: the facts the restore gates compare (engine/_compat.py), as label values.

The agent labels its own Node from its host's facts (`node_labels`); the webhook requires, of a restore
pod's node, the values of the same labels that the artifact's recorded facts give (`requirements`). Both
sides take their facts in the shape of a content's `status.source` (kernel, arch, driver, gpus[].name,
cudaGpus), so one function encodes both and they cannot drift apart.

  podsnap.io/arch           CPU architecture (gate arch), always required
  podsnap.io/kernel         kernel release (gate kernel), always required
  podsnap.io/nvidia-driver  driver version, exact (gate driver): required when the capture holds CUDA state
  podsnap.io/gpu-product    the node's GPU models (gate gpu-model): required when the capture holds CUDA state
  podsnap.io/gpu-count      the node's GPU count (gate gpu-count): required (Gt) when the capture used > 1 GPU

A label value is at most 63 characters of `[A-Za-z0-9._-]`, starting and ending alphanumeric. A fact that
is one already is its own label value; any other (`NVIDIA H200`, a kernel release with `+`, anything too
long) becomes the fact with each run of other characters replaced by `_`, cut to 52 characters, then `-`
and the first 10 hex digits of the sha256 of the whole fact: deterministic, readable, and two facts that
differ only in the replaced characters still get different values. A node with several GPU models is
labelled with all of them, sorted and joined by `+` before encoding, so it matches only an artifact that
used exactly that set of models (a mixed node that could take a single-model artifact is not chosen).

Facts the gates do not refuse on (glibc, CRIU version, free memory: that changes by the second) are not
labelled; the agent's gates still check every restore where it lands.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podsnap import contract as c

LABEL_VALUE_MAX = 63
_VALID = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_INVALID_RUN = re.compile(r"[^A-Za-z0-9_.-]+")
_HASH_HEX = 10
_KEEP = LABEL_VALUE_MAX - _HASH_HEX - 1


def label_value(fact: str) -> str:
    """`fact` as a valid label value (see the module doc); the same fact always gives the same value."""
    if len(fact) <= LABEL_VALUE_MAX and _VALID.match(fact):
        return fact
    digest = hashlib.sha256(fact.encode()).hexdigest()[:_HASH_HEX]
    readable = _INVALID_RUN.sub("_", fact)[:_KEEP].strip("_.-")
    return f"{readable}-{digest}" if readable else digest


def _models(names: Sequence[str]) -> str:
    return label_value("+".join(sorted(set(names))))


def _gpu_names(facts: Mapping[str, Any]) -> list[str]:
    return [str(g.get("name") or "") for g in facts.get("gpus") or [] if isinstance(g, Mapping)]


def _value(fact: Any) -> str | None:
    text = str(fact or "")
    return label_value(text) if text else None


def node_labels(facts: Mapping[str, Any]) -> dict[str, str | None]:
    """Every placement label of a node with these host facts; None for a fact it lacks (a merge patch with
    them removes a label that is no longer true, e.g. after the driver was removed)."""
    gpus = _gpu_names(facts)
    return {
        c.LABEL_NODE_ARCH: _value(facts.get("arch")),
        c.LABEL_NODE_KERNEL: _value(facts.get("kernel")),
        c.LABEL_NODE_DRIVER: _value(facts.get("driver")),
        c.LABEL_NODE_GPU_PRODUCT: _models(gpus) if gpus else None,
        c.LABEL_NODE_GPU_COUNT: str(len(gpus)) if gpus else None,
    }


@dataclass(frozen=True)
class Requirement:
    """One node label an artifact needs: `label` `operator` (In or Gt) `value`; `fact` and `wanted` say it
    in a user's words (e.g. "kernel", "6.1.0-test")."""

    label: str
    operator: str
    value: str
    fact: str
    wanted: str

    def expression(self) -> dict[str, Any]:
        return {"key": self.label, "operator": self.operator, "values": [self.value]}

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label)
        if have is None:
            return False
        if self.operator == "Gt":
            return have.isdigit() and int(have) > int(self.value)
        return have == self.value

    def describe(self) -> str:
        return f"{self.fact} {self.wanted}"


def requirements(source: Mapping[str, Any]) -> list[Requirement]:
    """What a restore pod's node must carry for an artifact whose capture recorded `source` (a content's
    status.source). A fact not recorded requires nothing (an artifact captured before podsnap recorded
    `cudaGpus` is placed by arch and kernel only; the gates still check the rest)."""
    out: list[Requirement] = []
    for label, key in ((c.LABEL_NODE_ARCH, "arch"), (c.LABEL_NODE_KERNEL, "kernel")):
        if fact := str(source.get(key) or ""):
            out.append(Requirement(label, "In", label_value(fact), key, fact))
    cuda = [str(name) for name in source.get("cudaGpus") or [] if name]
    if not cuda:
        return out
    if driver := str(source.get("driver") or ""):
        out.append(Requirement(c.LABEL_NODE_DRIVER, "In", label_value(driver), "NVIDIA driver", driver))
    models = sorted(set(cuda))
    out.append(Requirement(c.LABEL_NODE_GPU_PRODUCT, "In", _models(cuda), "GPU model", " + ".join(models)))
    if len(cuda) > 1:
        out.append(Requirement(c.LABEL_NODE_GPU_COUNT, "Gt", str(len(cuda) - 1), "GPU count", f">= {len(cuda)}"))
    return out
