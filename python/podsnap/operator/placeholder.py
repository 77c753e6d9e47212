"""The command a restore pod's target container runs in place of its own: a POSIX sh script (the image's
/bin/sh, which podsnap's probes already need) that keeps the container's PID free for the restored worker,
and then makes the container stand or fall with that worker.

    /bin/sh -c SCRIPT podsnap-placeholder <original command and args...>

1. First start: wait for `restore-complete`. If the agent writes `podsnap-restore-failed` instead, or no
   restore begins within PODSNAP_RESTORE_TIMEOUT_S, start the original command cold. A restore that has
   begun (`podsnap-restoring`) but is not complete within PODSNAP_RESTORE_MAX_S ends the container
   (`podsnap-restore-timed-out`): the runtime kills everything in it, a half-restored tree included, and
   the restart starts cold.
2. Restored: watch the restored worker's PID (the agent writes it; shareProcessNamespace makes it visible).
   When it exits, exit 1: the pod stops being Ready at once and the kubelet restarts the container.
   SIGTERM (pod deletion) is passed on to the worker, which then ends as it would have.
3. Any later start (a restart after the worker died, or after anything else went wrong): start the
   original command cold at once.

Under PODSNAP_RESTORE_FAILURE_POLICY=Fail (the SnapshotPolicy's restoreFailurePolicy, or the pod's
podsnap.io/restore-failure-policy annotation) a failed or timed-out restore never starts the command cold:
the placeholder says why and waits (the pod stays un-Ready, its Restored condition says why) until the pod
is deleted; past the pickup timeout it goes on waiting for the agent. A restored worker that dies later
still restarts cold: that is the worker's failure, not the restore's.

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
max="${{{c.ENV_RESTORE_MAX}:-{c.RESTORE_MAX_DEFAULT_S}}}"
policy="${{{c.ENV_RESTORE_FAILURE_POLICY}:-{c.RESTORE_FAILURE_COLD_START}}}"
say() {{ echo "{NAME}: $*" >&2; }}
cold() {{
  say "$1; starting the worker cold"
  shift
  : >"$d/{c.FILE_STARTED_COLD}"
  unset {c.ENV_CONTROL_DIR} {c.ENV_CONTROL_DIR_DYNAMO} {c.ENV_RESTORE_STANDBY}
  exec "$@"
}}
failed() {{
  [ "$policy" = "{c.RESTORE_FAILURE_FAIL}" ] || cold "$@"
  say "$1; restoreFailurePolicy is {c.RESTORE_FAILURE_FAIL}: not starting the worker cold (delete the pod to try again)"
  trap 'exit 143' TERM INT
  while :; do sleep 1; done
}}
if [ -e "$d/{c.FILE_PLACEHOLDER_STARTED}" ]; then
  [ -e "$d/{c.FILE_WORKER_EXITED}" ] && cold "the restored worker exited earlier" "$@"
  [ -e "$d/{c.FILE_RESTORE_COMPLETE}" ] && cold "the container restarted" "$@"
  [ -e "$d/{c.FILE_RESTORE_FAILED}" ] && failed "the restore failed earlier: $(cat "$d/{c.FILE_RESTORE_FAILED}")" "$@"
  [ -e "$d/{c.FILE_RESTORE_TIMED_OUT}" ] && failed "the restore did not finish within $max s" "$@"
  failed "the container restarted before its restore finished" "$@"
fi
: >"$d/{c.FILE_PLACEHOLDER_STARTED}"
trap 'exit 143' TERM INT
waited=0
busy=0
while [ ! -e "$d/{c.FILE_RESTORE_COMPLETE}" ]; do
  if [ -e "$d/{c.FILE_RESTORE_FAILED}" ]; then
    failed "the restore failed: $(cat "$d/{c.FILE_RESTORE_FAILED}")" "$@"
  fi
  if [ -e "$d/{c.FILE_RESTORING}" ]; then
    busy=$((busy + 1))
    if [ "$busy" -gt "$max" ]; then
      : >"$d/{c.FILE_RESTORE_TIMED_OUT}"
      say "the restore did not finish within $max s; the container restarts (what was restored dies with it)"
      exit 1
    fi
  elif [ "$waited" -ge "$timeout" ] && [ "$policy" != "{c.RESTORE_FAILURE_FAIL}" ]; then
    : >"$d/{c.FILE_STARTED_COLD}"
    if [ -e "$d/{c.FILE_RESTORING}" ]; then
      rm -f "$d/{c.FILE_STARTED_COLD}"
    else
      cold "no restore began within $timeout s" "$@"
    fi
  fi
  [ "$waited" -eq "$timeout" ] && [ -e "$d/{c.FILE_RESTORING}" ] && say "no restore within $timeout s, but one is under way: waiting for it"
  [ "$waited" -eq "$timeout" ] && [ "$policy" = "{c.RESTORE_FAILURE_FAIL}" ] && say "no restore began within $timeout s; restoreFailurePolicy is {c.RESTORE_FAILURE_FAIL}: waiting for the agent"
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
