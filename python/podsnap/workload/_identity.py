"""Tell a restored process from the one that was checkpointed.

CRIU gives a restored task the same PID, memory and files, but the kernel stamps a new start time
(field 22 of /proc/self/stat) on every task it creates, and a restore on another machine also sees
another boot id. So a change of either proves this process was restored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessIdentity:
    boot_id: str
    start_ticks: int

    @classmethod
    def current(cls) -> ProcessIdentity:
        stat = Path("/proc/self/stat").read_text()
        # the command name (field 2) may hold spaces and parentheses; the fields after its last ')' are fixed
        fields = stat[stat.rindex(")") + 2 :].split()
        start_ticks = int(fields[19])  # field 22 overall: starttime
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot_id = ""
        return cls(boot_id=boot_id, start_ticks=start_ticks)
