"""PID 1 of a test "pod" (an `unshare --pid --mount --fork --mount-proc` namespace): reap orphans like pause.

usage: python pod_init.py HIDE_DIR...   (mounts an empty tmpfs over each HIDE_DIR in the pod's mount
namespace first, so nothing the host keeps there is visible to the pod's processes)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def main() -> None:
    for d in sys.argv[1:]:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "podsnap-hidden", d], check=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("pod ready", flush=True)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
