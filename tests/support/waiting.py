"""Waiting on state, never on time: poll a function until it says done, with a timeout that names what
was awaited and what was last seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: what "not yet" may look like while polling: an API error (object not there yet, a conflict, a
#: server still starting) or a connection refused/reset by a process still starting. Anything else
#: (a typo's NameError, a failed assert, a KeyError in the test's own code) is raised at once.
NOT_YET: tuple[type[BaseException], ...]
try:
    from kubernetes.client.exceptions import ApiException
except ImportError:  # the GPU machine has no Kubernetes client, and nothing there raises its errors
    NOT_YET = (OSError,)
else:
    NOT_YET = (ApiException, OSError)


def wait_for(
    fn: Callable[[], T],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "",
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """Poll until `fn()` returns something truthy; fail with `what` and the last value (or error) seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except not_yet as exc:
            last = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or fn}: last={last!r}")
        time.sleep(interval)
