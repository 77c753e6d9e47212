"""Deprecated: import `Criu` from `podsnap.engine`.

Kept only until the code outside the engine that still imports this module has moved to the facade.
"""

from podsnap.engine._criu_runner import Criu  # noqa: F401
