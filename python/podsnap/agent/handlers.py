"""Importing this module registers every agent handler in `runtime.registry`."""

from podsnap.agent import artifacts, on_content, on_pod, startup, volume_sweep
from podsnap.agent.runtime import registry

__all__ = ["artifacts", "on_content", "on_pod", "registry", "startup", "volume_sweep"]
