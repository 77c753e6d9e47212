"""Importing this module registers every agent handler in `runtime.registry`."""

from podsnap.agent import on_content, on_pod, startup
from podsnap.agent.runtime import registry

__all__ = ["on_content", "on_pod", "registry", "startup"]
