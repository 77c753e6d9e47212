"""Deprecated: import `gpu_facts` from `podsnap.engine`.

Kept only until the code outside the engine that still imports this module has moved to the facade.
"""

from podsnap.engine._nvml import gpu_facts  # noqa: F401
