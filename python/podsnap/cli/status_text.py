"""The readable view of a `podsnap status` document: a few aligned lines a person reads at a glance."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from podsnap import contract as c
from podsnap.cli.progress import human_bytes
from podsnap.kube.conditions import parse_time

#: the engine's phases in the order they run (others follow alphabetically, totals last)
CAPTURE_ORDER = ("inspect", "cuda_lock", "cuda_checkpoint", "criu_dump", "rootfs", "hash", "publish")
RESTORE_ORDER = ("read_manifest", "verify", "compat", "rootfs", "criu_restore", "cuda_restore", "cuda_unlock")
TOTALS = ("total", c.TIMING_AGENT_TOTAL)
LABEL_WIDTH = 12


def ago(stamp: str | None, now: datetime.datetime | None) -> str:
    """kubectl's age style: 45s, 12m, 3h, 2d."""
    at = parse_time(stamp)
    if at is None or now is None:
        return "?"
    s = max(0, int((now - at).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def seconds(ms: float) -> str:
    return f"{ms / 1000:.2f} s"


def timing_line(timings: Mapping[str, float] | None, order: Sequence[str]) -> str:
    """`7.50 s: cuda_checkpoint 2.10 s · criu_dump 5.30 s (agent 7.61 s)`; the engine total leads."""
    if not timings:
        return "not recorded"
    known = [p for p in order if p in timings]
    rest = sorted(p for p in timings if p not in order and p not in TOTALS)
    phases = " · ".join(f"{p} {seconds(timings[p])}" for p in (*known, *rest))
    total = timings.get("total", timings.get(c.TIMING_AGENT_TOTAL))
    out = seconds(total) if total is not None else ""
    if phases:
        out += f": {phases}" if out else phases
    if "total" in timings and c.TIMING_AGENT_TOTAL in timings:
        out += f" (agent {seconds(timings[c.TIMING_AGENT_TOTAL])})"
    return out


def _row(label: str, text: str) -> str:
    return f"  {label:<{LABEL_WIDTH}}{text}"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _why(reason: str | None, message: str | None) -> str:
    message = _one_line(message)
    if reason and message and message != reason:
        return f"{reason}: {message}"
    return reason or message or ""


def checkpoint_lines(cp: Mapping[str, Any] | None, now: datetime.datetime | None) -> list[str]:
    if cp is None:
        return ["checkpoint  none yet"]
    head = f"checkpoint  PodSnapshot {cp['name']}  {cp['state']}"
    if cp["state"] == "Ready":
        head += f"  (captured {ago(cp['capturedAt'], now)} ago)" if cp["capturedAt"] else ""
    else:
        head += f"  {_why(cp['reason'], cp['message'])}"
    lines = [head]
    if cp["node"]:
        src = cp["source"] or {}
        facts = [src.get("arch"), f"kernel {src['kernel']}" if src.get("kernel") else None]
        facts.append(f"driver {src['driver']}" if src.get("driver") else "no GPU driver")
        if src.get("gpus"):
            facts.append(f"{len(src['gpus'])} GPU: {', '.join(sorted(set(src['gpus'])))}")
        lines.append(_row("node", f"{cp['node']}  ({', '.join(f for f in facts if f)})"))
    if cp["sizeBytes"] is not None:
        digest = cp["digest"] or "no digest"
        short = digest[:19] + "…" if len(digest) > 20 else digest
        lines.append(_row("artifact", f"{human_bytes(cp['sizeBytes'])}  {short}  content {cp['content'] or '?'}"))
    if cp["state"] == "Ready":
        lines.append(_row("capture", timing_line(cp["captureTimingsMs"], CAPTURE_ORDER)))
    if cp["sourcePod"]:
        lines.append(_row("source pod", cp["sourcePod"]))
    return lines


def job_lines(job: Mapping[str, Any] | None) -> list[str]:
    if job is None:
        return []
    text = f"SnapshotJob {job['name']}  {job['state']}"
    why = _why(job["reason"], job["message"]) if job["state"] in (c.COND_FAILED, "Pending") else job["reason"]
    return [_row("job", f"{text}  {why}".rstrip())]


def pod_detail(pod: Mapping[str, Any], checkpoint: str | None) -> str:
    if pod["start"] == "restored":
        source = f"from {pod['restoredFrom']}: " if pod["restoredFrom"] and pod["restoredFrom"] != checkpoint else ""
        return source + timing_line(pod["restoreTimingsMs"], RESTORE_ORDER)
    return _why(pod["reason"], pod["message"])


def pods_lines(pods: Sequence[Mapping[str, Any]], checkpoint: str | None) -> list[str]:
    if not pods:
        return ["pods        none"]
    rows = [("NAME", "NODE", "READY", "START", "DETAIL")]
    for p in pods:
        ready = "yes" if p["ready"] else "no"
        rows.append((p["name"], p["node"] or "-", ready, p["start"], pod_detail(p, checkpoint)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"pods ({len(pods)})"]
    for r in rows:
        lines.append("  " + "  ".join(f"{r[i]:<{widths[i]}}" for i in range(4)) + f"  {r[4]}")
    return lines


def header(doc: Mapping[str, Any], now: datetime.datetime | None) -> list[str]:
    t, policy = doc["target"], doc["policy"]
    kind = t["kind"]
    if kind == c.KIND_SNAPSHOT_POLICY and policy is not None:
        ref = policy["targetRef"]
        lines = [
            f"SnapshotPolicy {t['namespace']}/{t['name']}  ->  {ref['kind']} {ref['name']}  ({policy['startupPolicy']})"
        ]
        state = "Ready" if policy["ready"] else "not Ready"
        since = f"  ({ago(policy['since'], now)} ago)" if policy["since"] else ""
        lines.append(_row("status", f"{state}  {_why(policy['reason'], policy['message'])}{since}"))
        return lines
    if kind == "Pod" and doc["pods"]:
        pod = doc["pods"][0]
        phase = f"{pod['phase'] or 'Unknown'}, {'Ready' if pod['ready'] else 'not Ready'}"
        lines = [f"Pod {t['namespace']}/{t['name']}  on {pod['node'] or '(not scheduled)'}  {phase}"]
        when = f" ({ago(pod['since'], now)} ago)" if pod["since"] else ""
        lines.append(_row("start", f"{pod['start']}{when}  {_why(pod['reason'], pod['message'])}"))
        if pod["start"] == "restored":
            lines.append(_row("restore", timing_line(pod["restoreTimingsMs"], RESTORE_ORDER)))
        lines.append(_row("policy", f"SnapshotPolicy {policy['name']}" if policy else "none"))
        return lines
    lines = [f"{kind} {t['namespace']}/{t['name']}"]
    if policy is not None:
        lines.append(_row("policy", f"SnapshotPolicy {policy['name']}"))
    return lines


def _blocks(*blocks: Iterable[str]) -> str:
    return "\n\n".join("\n".join(b) for b in (list(x) for x in blocks) if b)


def render(doc: Mapping[str, Any]) -> str:
    now = parse_time(doc.get("generatedAt"))
    checkpoint = doc["checkpoint"]
    cp_block = checkpoint_lines(checkpoint, now) + job_lines(doc["snapshotJob"])
    blocks: list[list[str]] = [header(doc, now), cp_block]
    if doc["target"]["kind"] != "Pod":
        blocks.append(pods_lines(doc["pods"], (checkpoint or {}).get("name")))
    failure = doc["lastFailure"]
    if failure is not None:
        when = f" ({ago(failure['at'], now)} ago)" if failure["at"] else ""
        blocks.append([f"last failure  {failure['object']}{when}  {_why(failure['reason'], failure['message'])}"])
    if doc["warnings"]:
        blocks.append(["warnings", *(f"  {w}" for w in doc["warnings"])])
    return _blocks(*blocks)
