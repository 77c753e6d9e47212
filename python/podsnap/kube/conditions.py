"""metav1.Condition lists: pure helpers, and kopf patch functions that are safe to replay.

kopf replays `patch.fns` after a 422 conflict against a fresher body, so every function here reads the
list it changes from the body it is given instead of from a stale copy.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TRUE = "True"
FALSE = "False"
#: a condition or Event message is a sentence or two: the cause, and where the details are
MESSAGE_MAX = 400
_POINTER = re.compile(r"\(full log: [^()]*\)")


def short(message: str, limit: int = MESSAGE_MAX) -> str:
    """`message` as one line of at most `limit` characters. Logs do not belong here: only the first line is
    kept, and a long one is cut in the middle so that a "(full log: ...)" pointer and what follows it survive."""
    line = " ".join(message.strip().splitlines()[0].split()) if message.strip() else ""
    if len(line) <= limit:
        return line
    pointers = list(_POINTER.finditer(line))
    tail = line[pointers[-1].start() :] if pointers else ""
    if not tail or len(tail) > limit // 2:
        return line[: limit - 1].rstrip() + "…"
    return line[: limit - len(tail) - 2].rstrip() + "… " + tail


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == TRUE


def reason_of(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> str | None:
    cond = find(conditions, type_)
    return None if cond is None else cond.get("reason")


def merged(
    conditions: Sequence[Mapping[str, Any]] | None,
    updates: Sequence[Condition],
    *,
    now: str | None = None,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """The list with `updates` applied; lastTransitionTime moves only when the status flips."""
    stamp = now or now_rfc3339()
    result = [dict(c) for c in conditions or ()]
    for update in updates:
        status = TRUE if update.status else FALSE
        new: dict[str, Any] = {
            "type": update.type,
            "status": status,
            "reason": update.reason,
            # never "": the 1.20 API server reads an empty string here as null and rejects it
            "message": short(update.message) or update.reason,
            "lastTransitionTime": stamp,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        for i, old in enumerate(result):
            if old.get("type") == update.type:
                if old.get("status") == status and old.get("lastTransitionTime"):
                    new["lastTransitionTime"] = old["lastTransitionTime"]
                result[i] = new
                break
        else:
            result.append(new)
    return result


def patch_fn(*updates: Condition, generation: int | None = None) -> Callable[[Any], None]:
    """A kopf `patch.fns` entry that sets these conditions on whatever body kopf replays it against."""
    stamp = now_rfc3339()

    def apply(body: Any) -> None:
        status = body.setdefault("status", {})
        status["conditions"] = merged(status.get("conditions"), updates, now=stamp, generation=generation)

    return apply
