"""Deprecated: import `pid_exists`, `wait_gone`, `kill_tree` from `podsnap.engine`.

Kept only until the code outside the engine that still imports this module has moved to the facade.
"""

from podsnap.engine._proctree import *  # noqa: F403
from podsnap.engine._proctree import exists, host_pid_in_ns, kill_tree, pid_ns, wait_gone  # noqa: F401
