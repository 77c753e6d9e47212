"""What an engine adapter is: named steps with their undo, plus what it was checked against.

An adapter never imports its engine. It holds either the engine's Python object (and calls its
methods, which may be coroutines) or the base URL of the engine's HTTP server (and posts to its
admin endpoints). Quiesce runs the steps in order; resume runs the undos in reverse order, so the
engine comes back through the same states it left by.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Call:
    """One engine call: `name` is what errors and logs show, e.g. "sleep(level=1)" or "POST /sleep"."""

    name: str
    fn: Callable[[], object]


@dataclass(frozen=True)
class Step:
    """A quiesce call and the call that undoes it on resume (None: nothing to undo), plus the calls
    that finish that undo (`then`, run in order after `undo`): each needs the one before it."""

    do: Call
    undo: Call | None = None
    then: tuple[Call, ...] = ()

    @property
    def undos(self) -> tuple[Call, ...]:
        """Every call of the undo, in the order they run."""
        return ((self.undo,) if self.undo is not None else ()) + self.then


@dataclass(frozen=True)
class Checked:
    """An engine version an adapter's calls were checked against, and how."""

    version: str
    how: str


class EngineAdapter(Protocol):
    #: the engine's name, as in `safe_env` and in errors: "vllm", "sglang", "trtllm"
    engine: str

    def steps(self) -> Sequence[Step]:
        """The quiesce steps, in order."""
        ...

    @property
    def weights(self) -> str:
        """Where the weights are during the capture: "gpu" (captured by the CUDA checkpoint), "host"
        (the engine copied them to host memory; CRIU captures them), or "released" (gone; reloaded)."""
        ...


def hook_call(fn: Callable[[], object], what: str) -> Call:
    """A call of the worker's own function `fn` (it may return an awaitable), named for errors."""
    return Call(f"{what} hook {getattr(fn, '__qualname__', None) or repr(fn)}()", fn)


def method_call(obj: object, method: str, *args: Any, **kwargs: Any) -> Call:
    """A call of `obj.method(*args, **kwargs)`, named like the source reads."""
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    name = f"{method}({', '.join(shown)})"

    def fn() -> object:
        bound = getattr(obj, method, None)
        if bound is None:
            raise AttributeError(
                f"{type(obj).__name__} has no method {method!r}: is this the engine version it was checked against?"
            )
        return bound(*args, **kwargs)

    return Call(name, fn)


class HttpAdmin:
    """The engine's HTTP admin endpoints on `base_url` (standard library only; loopback by design)."""

    def __init__(self, base_url: str, *, timeout_s: float = 300.0, headers: Mapping[str, str] | None = None) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url {base_url!r}: expected http://HOST:PORT, e.g. http://127.0.0.1:8000")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        body: object | None = None,
    ) -> Call:
        qs = urllib.parse.urlencode(query or {}, doseq=True)
        url = f"{self.base_url}{path}" + (f"?{qs}" if qs else "")
        shown = (
            f"{method} {path}"
            + (f"?{qs}" if qs else "")
            + (f" {json.dumps(body, sort_keys=True)}" if body is not None else "")
        )

        def fn() -> object:
            data = None if body is None else json.dumps(body).encode()
            headers = {**self.headers, **({"Content-Type": "application/json"} if data is not None else {})}
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    text = response.read().decode(errors="replace")
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:300]
                raise RuntimeError(f"HTTP {e.code} from {url}: {detail}") from None
            if not text.strip():
                return None
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                return text

        return Call(shown, fn)
