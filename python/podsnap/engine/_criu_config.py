"""What CRIU is told: `CriuOptions` -> the lines of the config file each run writes.

CRIU's config parser turns each word of a line into an argv entry, so one newline smuggled into a
value becomes a whole new option (`action-script ...` runs a program as root). Every value is
therefore validated where it enters (`CriuOptions`, `inherit_line`) and every line once more where the
file is written (`config_text`): no control characters, ever.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

TcpMode = Literal["established", "close"]
CgroupMode = Literal["soft", "ignore", "full", "strict", "props", "none"]
TCP_MODES: frozenset[str] = frozenset(get_args(TcpMode))
CGROUP_MODES: frozenset[str] = frozenset(get_args(CgroupMode))

#: inherit-fd key of the network namespace declared external at dump
EXTERNAL_NET_KEY = "podsnap-netns"
#: the file ids `inherit-fd` may replace: pipes as CRIU names them, and our net ns key
_INHERIT_KEY = re.compile(rf"pipe:\[[0-9]{{1,20}}\]|{EXTERNAL_NET_KEY}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_value(what: str, value: str) -> str:
    """`value` unchanged, or ValueError naming `what` when it holds a control character (newline, NUL, ...)."""
    if _CONTROL.search(value):
        raise ValueError(f"{what} {value!r} holds a control character: CRIU's config takes one option per line")
    return value


@dataclass(frozen=True)
class CriuOptions:
    """What CRIU is told, as config-file lines. Defaults suit a container's worker process."""

    shell_job: bool = True
    #: established: dump and restore live TCP connections; close: drop them (a new pod IP cannot keep them)
    tcp: TcpMode = "established"
    file_locks: bool = True
    ext_unix_sk: bool = True
    link_remap: bool = True
    #: None picks "ignore" in namespace mode (the restorer joins the destination's cgroups) and "soft" otherwise
    manage_cgroups: CgroupMode | None = None
    #: declare the target's network namespace external at dump; join `RestoreOptions.net_ns` at restore
    external_net_ns: bool = False
    log_level: int = 4
    #: more config lines as CRIU's long options without dashes, e.g. "ghost-limit 64M"
    extra: tuple[str, ...] = field(default_factory=tuple)
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.tcp not in TCP_MODES:
            raise ValueError(f"CriuOptions.tcp {self.tcp!r}: use one of {sorted(TCP_MODES)}")
        if self.manage_cgroups is not None and self.manage_cgroups not in CGROUP_MODES:
            raise ValueError(
                f"CriuOptions.manage_cgroups {self.manage_cgroups!r}: use one of {sorted(CGROUP_MODES)} or None"
            )
        if not isinstance(self.log_level, int) or not 0 <= self.log_level <= 4:
            raise ValueError(f"CriuOptions.log_level {self.log_level!r}: use 0..4")
        if not self.timeout_s > 0:
            raise ValueError(f"CriuOptions.timeout_s {self.timeout_s!r}: must be positive")
        if isinstance(self.extra, str):
            raise ValueError("CriuOptions.extra must be a tuple of lines, not one string")
        for i, line in enumerate(self.extra):
            check_value(f"CriuOptions.extra[{i}]", str(line))
            if not str(line).strip() or str(line).lstrip().startswith("-"):
                raise ValueError(f"CriuOptions.extra[{i}] {line!r}: write a long option without dashes")

    def _cgroups(self, namespaced: bool) -> str:
        return self.manage_cgroups or ("ignore" if namespaced else "soft")

    def common_lines(self, namespaced: bool) -> list[str]:
        lines = []
        if self.shell_job:
            lines.append("shell-job")
        lines.append("tcp-established" if self.tcp == "established" else "tcp-close")
        if self.file_locks:
            lines.append("file-locks")
        if self.ext_unix_sk:
            lines.append("ext-unix-sk")
        # one word with "=": CRIU's config parser turns each word into an argv entry, and getopt does not
        # take the next entry as the value of an optional-argument option, so "manage-cgroups ignore"
        # silently meant the default mode (soft), which mounts a cgroup yard a pod's mount ns refuses
        lines.append(f"manage-cgroups={self._cgroups(namespaced)}")
        return lines

    def dump_lines(
        self, namespaced: bool, *, net_ns_inode: int | None = None, leave_running: bool = False
    ) -> list[str]:
        # connections are not firewalled while dumped: podsnap's CRIU never runs iptables (it runs no program
        # at all, see hack/criu-guards.c), connections are closed in pods, and a quiesced worker sends nothing
        lines = [*self.common_lines(namespaced), "network-lock=skip"]
        if self.link_remap:
            lines.append("link-remap")
        if self.external_net_ns and net_ns_inode is not None:
            lines.append(f"external net[{int(net_ns_inode)}]:{EXTERNAL_NET_KEY}")
        if leave_running:
            lines.append("leave-running")
        return [*lines, *self.extra]

    def restore_lines(
        self,
        namespaced: bool,
        *,
        net_ns_fd: int | None = None,
        inherit: Mapping[int, str] | None = None,
        leave_stopped: bool = False,
    ) -> list[str]:
        lines = self.common_lines(namespaced)
        if self.external_net_ns and net_ns_fd is not None:
            lines.append(inherit_line(net_ns_fd, EXTERNAL_NET_KEY))
        lines += [inherit_line(fd, key) for fd, key in sorted((inherit or {}).items())]
        if leave_stopped:
            lines.append("leave-stopped")
        return [*lines, *self.extra]


def inherit_line(fd: int, key: str) -> str:
    """`inherit-fd fd[N]:KEY`; KEY (it may come from a manifest) must be a pipe id or our net ns key."""
    if not _INHERIT_KEY.fullmatch(key):
        raise ValueError(f"inherit-fd key {key!r}: expected pipe:[INODE] or {EXTERNAL_NET_KEY}")
    return f"inherit-fd fd[{int(fd)}]:{key}"


def config_text(lines: Iterable[str]) -> str:
    """The config file: one option per line; ValueError on any control character (a second line)."""
    return "".join(f"{check_value('CRIU config line', line)}\n" for line in lines)
