"""Reading the settings the chart passes as environment variables (names in `podsnap.contract`).

A malformed value stops the process at start with the variable's name and what it accepts: a typo in
the chart's values must not become a default that silently does something else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(SystemExit):
    """A setting the process cannot start with; the message names the variable and the fix."""


def env_str(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """The variable's value; unset or empty means `default`."""
    return (os.environ if environ is None else environ).get(name) or default


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    raw = env_str(name, "", environ)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected an integer") from None


def env_port(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """A TCP port; 0 turns the endpoint off."""
    port = env_int(name, default, environ)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{name}={str(port)!r}: expected a port (1-65535), or 0 to turn it off")
    return port


def env_seconds(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """A positive whole number of seconds."""
    seconds = env_int(name, default, environ)
    if seconds < 1:
        raise ConfigError(f"{name}={str(seconds)!r}: expected a positive number of seconds")
    return seconds


def env_path(name: str, default: str | Path, environ: Mapping[str, str] | None = None) -> Path:
    return Path(env_str(name, str(default), environ))


def env_choice(name: str, choices: Sequence[str], default: str, environ: Mapping[str, str] | None = None) -> str:
    raw = env_str(name, default, environ).strip().lower()
    if raw not in choices:
        raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return raw


def log_level(name: str, default: str = "info", environ: Mapping[str, str] | None = None) -> str:
    return env_choice(name, LOG_LEVELS, default, environ)
