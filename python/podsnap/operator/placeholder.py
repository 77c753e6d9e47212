"""The command a restore pod's target container runs in place of its own: a POSIX sh script (the image's
/bin/sh, which podsnap's probes already need) that keeps the container's PID free for the restored worker,
and then makes the container stand or fall with that worker.

    /bin/sh -c SCRIPT podsnap-placeholder <original command and args...>

1. First start: wait for `restore-complete`. If the agent writes `podsnap-restore-failed` instead, or nothing
   happens within PODSNAP_RESTORE_TIMEOUT_S (while no restore is under way), start the original command cold.
2. Restored: watch the restored worker's PID (the agent writes it; shareProcessNamespace makes it visible).
   When it exits, exit 1: the pod stops being Ready at once and the kubelet restarts the container.
   SIGTERM (pod deletion) is passed on to the worker, which then ends as it would have.
3. Any later start (a restart after the worker died, or after anything else went wrong): start the
   original command cold at once.

A cold start unsets SNAPSHOT_CONTROL_DIR (and its Dynamo name, and standby), so an SDK-instrumented worker
serves instead of waiting for a checkpoint nobody will take. Cold and restore never both happen: the
placeholder writes `podsnap-started-cold` before it checks for the agent's `podsnap-restoring`, and the
agent writes `podsnap-restoring` before it checks for `podsnap-started-cold`; whoever finds the other's
file first backs off. A container without an explicit `command` has nothing to start cold (the image's
entrypoint is not in the pod spec), so such pods are not shaped for restore at all (restore_pod.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from podsnap import contract as c

SHELL = "/bin/sh"
NAME = "podsnap-placeholder"

SCRIPT = f"""\
d="${{{c.ENV_CONTROL_DIR}:-${{{c.ENV_CONTROL_DIR_DYNAMO}:-{c.CONTROL_DIR_DEFAULT}}}}}"
timeout="${{{c.ENV_RESTORE_TIMEOUT}:-{c.RESTORE_TIMEOUT_DEFAULT_S}}}"
say() {{ echo "{NAME}: $*" >&2; }}
cold() {{
  say "$1; starting the worker cold"
  shift
  : >"$d/{c.FILE_STARTED_COLD}"
  unset {c.ENV_CONTROL_DIR} {c.ENV_CONTROL_DIR_DYNAMO} {c.ENV_RESTORE_STANDBY}
  exec "$@"
}}
if [ -e "$d/{c.FILE_PLACEHOLDER_STARTED}" ]; then
  why="the container restarted"
  [ -e "$d/{c.FILE_WORKER_EXITED}" ] && why="the restored worker exited earlier"
  [ -e "$d/{c.FILE_RESTORE_FAILED}" ] && why="the restore failed earlier"
  cold "$why" "$@"
fi
: >"$d/{c.FILE_PLACEHOLDER_STARTED}"
trap 'exit 143' TERM INT
waited=0
while [ ! -e "$d/{c.FILE_RESTORE_COMPLETE}" ]; do
  if [ -e "$d/{c.FILE_RESTORE_FAILED}" ]; then
    cold "the restore failed: $(cat "$d/{c.FILE_RESTORE_FAILED}")" "$@"
  fi
  if [ "$waited" -ge "$timeout" ]; then
    : >"$d/{c.FILE_STARTED_COLD}"
    if [ -e "$d/{c.FILE_RESTORING}" ]; then
      rm -f "$d/{c.FILE_STARTED_COLD}"
      [ "$waited" -eq "$timeout" ] && say "no restore within $timeout s, but one is under way: waiting for it"
    else
      cold "no restore within $timeout s" "$@"
    fi
  fi
  sleep 1
  waited=$((waited + 1))
done
pid=$(cat "$d/{c.FILE_WORKER_PID}" 2>/dev/null)
case "$pid" in
  "" | *[!0-9]*) say "restored, but no worker PID to watch"; while :; do sleep 3600; done ;;
esac
say "restored; watching the worker (pid $pid)"
stop=""
trap 'stop=1; kill -TERM "$pid" 2>/dev/null' TERM INT
while [ -d "/proc/$pid" ]; do sleep 1; done
[ -n "$stop" ] && exit 0
: >"$d/{c.FILE_WORKER_EXITED}"
say "the restored worker (pid $pid) exited; the container restarts and starts it cold"
exit 1
"""


def command(original: Sequence[str]) -> list[str]:
    """The target container's command: the placeholder, with the original command as its arguments."""
    return [SHELL, "-c", SCRIPT, NAME, *original]


#: the startup probe of a restore pod: restored, or started cold
STARTUP_PROBE_SCRIPT = (
    f'd="${{{c.ENV_CONTROL_DIR}:-{c.CONTROL_DIR_DEFAULT}}}"; '
    f'[ -e "$d/{c.FILE_RESTORE_COMPLETE}" ] || [ -e "$d/{c.FILE_STARTED_COLD}" ]'
)
