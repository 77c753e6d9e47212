"""The `podsnap` command: checkpoint/restore on one host, host diagnostics, and the demo.

podsnap doctor                         what this host can and cannot do (exit 1 on any FAIL)
podsnap capture --pid P --out DIR      checkpoint process tree P into artifact DIR (ends P)
        [--control-dir C]              ... once the worker wrote C/ready-for-snapshot (waits, with progress)
podsnap restore DIR                    restore it; prints the new PID (--skip-compat-check to override gates)
        [--control-dir C --context K=V]  ... then hand the worker its context and C/restore-complete
podsnap inspect DIR [--verify]         an artifact's source, processes, size; digests and gates checked here
podsnap run -- CMD...                  the standby-aware worker entrypoint (same as podsnap-run)
podsnap demo                           start the demo worker, capture, restore, compare, print timings
podsnap status KIND/NAME [-n NS]       on a cluster: a policy's, snapshot's or pod's checkpoint, timings,
        [-o json]                      how each pod started, the last failure (also `kubectl podsnap status`)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from podsnap import __version__


def _write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_parser(prog: str = "podsnap") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"podsnap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("doctor", help="check kernel, CRIU, capabilities, CUDA, THP, io_uring on this host")
    d.add_argument("--json", metavar="PATH", help="also write the checks as JSON")

    c = sub.add_parser("capture", help="checkpoint a process tree into an artifact directory")
    c.add_argument("--pid", type=int, required=True, help="host PID of the tree's root")
    c.add_argument("--out", required=True, help="artifact directory to create (must not exist)")
    c.add_argument("--namespace-pid", type=int, help="run CRIU inside this PID's namespaces (a container's init)")
    c.add_argument("--cuda", choices=("auto", "on", "off"), default="auto", help="checkpoint CUDA state (default auto)")
    c.add_argument("--tcp", choices=("established", "close"), default="established", help="TCP connections")
    c.add_argument("--leave-running", action="store_true", help="keep the source running after the dump")
    c.add_argument(
        "--digest",
        choices=("blake3", "sha256"),
        default="blake3",
        help="file digests: blake3 (default, fast) or sha256 (also restorable by an older podsnap)",
    )
    c.add_argument("--criu", metavar="PATH", help="CRIU binary (default: PODSNAP_CRIU, .tools/bin/criu, PATH)")
    c.add_argument("--json", metavar="PATH", help="write the result (timings, bytes) as JSON")
    c.add_argument(
        "--control-dir",
        metavar="DIR",
        help="the worker's control dir (its SNAPSHOT_CONTROL_DIR): capture once it wrote ready-for-snapshot there",
    )
    c.add_argument(
        "--ready-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for ready-for-snapshot (default 600)",
    )

    r = sub.add_parser("restore", help="restore an artifact directory; prints the new PID")
    r.add_argument("artifact", help="artifact directory written by `podsnap capture`")
    r.add_argument("--skip-compat-check", action="store_true", help="restore even when a compatibility gate refuses")
    r.add_argument("--namespace-pid", type=int, help="restore inside this PID's namespaces and cgroups")
    r.add_argument("--tcp", choices=("established", "close"), default="established", help="TCP connections")
    r.add_argument("--criu", metavar="PATH", help="CRIU binary (default: PODSNAP_CRIU, .tools/bin/criu, PATH)")
    r.add_argument("--json", metavar="PATH", help="write the result (pid, timings, bytes) as JSON")
    r.add_argument(
        "--control-dir",
        metavar="DIR",
        help="the worker's control dir: after the restore, write restore-context.json and restore-complete there "
        "(with --namespace-pid: a path inside that process's root)",
    )
    r.add_argument(
        "--context",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment entry of the restore context (repeatable; needs --control-dir)",
    )

    i = sub.add_parser("inspect", help="show an artifact's manifest summary; --verify checks digests and gates here")
    i.add_argument("artifact", help="artifact directory")
    i.add_argument("--verify", action="store_true", help="check every digest and this host's compatibility gates")
    i.add_argument("--json", action="store_true", help="print the whole manifest as JSON")

    sub.add_parser("run", help="standby-aware worker entrypoint: podsnap run -- CMD...", add_help=False)

    m = sub.add_parser("demo", help="capture -> restore -> request of the demo worker, with a timing table")
    m.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the demo model lives")
    m.add_argument("--weights-gib", type=float, default=None, help="size of the demo model's weights in GiB")
    m.add_argument(
        "--json", metavar="PATH", default="out/demo.json", help="timing table as JSON (default out/demo.json)"
    )
    m.add_argument("--workdir", metavar="DIR", help="where the artifact and logs go (default: a temp dir)")
    m.add_argument("--keep", action="store_true", help="keep the artifact and leave the restored worker running")
    m.add_argument("--criu", metavar="PATH", help="CRIU binary (default: PODSNAP_CRIU, .tools/bin/criu, PATH)")
    m.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the worker's cold start")
    m.add_argument(
        "--cooperative",
        action="store_true",
        help="the worker hands its weights to the SDK: released before the checkpoint, streamed back at resume",
    )
    m.add_argument("--extra-arg", action="append", default=[], help="pass one more argument to the demo worker")

    from podsnap.cli.status import add_arguments

    s = sub.add_parser(
        "status",
        help="a SnapshotPolicy's, PodSnapshot's, SnapshotJob's or pod's checkpoint, timings and failures",
        description="Show which checkpoint, where, how big and old, the capture and restore timings, how each "
        "pod started, and the last failure. Reads only (get/list) in the object's namespace.",
    )
    add_arguments(s)
    return parser


def _cmd_capture(args: argparse.Namespace) -> int:
    from podsnap.cli.progress import ProgressPrinter
    from podsnap.engine import CaptureOptions, CriuOptions, EngineError, capture

    if args.control_dir is not None:
        from podsnap.cli.flow import ReadyWaitError, wait_ready

        try:
            wait_ready(args.control_dir, args.pid, args.ready_timeout)
        except ReadyWaitError as exc:
            print(f"podsnap capture: {exc}", file=sys.stderr)
            return 1

    opts = CaptureOptions(
        namespace_pid=args.namespace_pid,
        cuda=args.cuda,
        leave_running=args.leave_running,
        digest=args.digest,
        criu=CriuOptions(tcp=args.tcp),
        criu_binary=Path(args.criu) if args.criu else None,
    )
    try:
        res = capture(args.pid, Path(args.out), opts, progress=ProgressPrinter())
    except EngineError as exc:
        print(f"podsnap capture: {exc}", file=sys.stderr)
        return 1
    out = {
        "artifact": str(res.artifact),
        "bytesTotal": res.bytes_total,
        "bytesMemory": res.bytes_memory,
        "cudaPids": list(res.cuda_pids),
        "timingsMs": res.timings_ms,
    }
    _write_json(args.json, out)
    print(f"captured pid {args.pid} into {res.artifact} ({res.bytes_total} bytes, {res.timings_ms['total']:.0f} ms)")
    return 0


def _cmd_restore(args: argparse.Namespace) -> int:
    from podsnap.cli.flow import ContextError, parse_context, signal_restored
    from podsnap.cli.progress import ProgressPrinter
    from podsnap.engine import CompatibilityError, CriuOptions, EngineError, RestoreOptions, restore

    try:
        context = parse_context(args.context, args.control_dir)
    except ContextError as exc:
        print(f"podsnap restore: {exc}", file=sys.stderr)
        return 2

    opts = RestoreOptions(
        namespace_pid=args.namespace_pid,
        skip_compat=args.skip_compat_check,
        criu=CriuOptions(tcp=args.tcp),
        criu_binary=Path(args.criu) if args.criu else None,
    )
    try:
        res = restore(Path(args.artifact), opts, progress=ProgressPrinter())
    except CompatibilityError as exc:
        print(f"podsnap restore: {exc}", file=sys.stderr)
        return 3
    except EngineError as exc:
        print(f"podsnap restore: {exc}", file=sys.stderr)
        return 1
    for gate in res.skipped_gates:
        print(f"WARN skipped gate {gate.gate}: expected {gate.expected!r}, found {gate.found!r}", file=sys.stderr)
    if args.control_dir is not None:
        try:
            signal_restored(args.control_dir, context, res.pid, in_namespace=args.namespace_pid is not None)
        except OSError as exc:
            print(f"podsnap restore: {exc}", file=sys.stderr)
            return 1
    out = {
        "pid": res.pid,
        "nsPid": res.ns_pid,
        "pids": list(res.pids),
        "bytesTotal": res.bytes_total,
        "cudaPids": list(res.cuda_pids),
        "timingsMs": res.timings_ms,
        "skippedGates": [g.gate for g in res.skipped_gates],
    }
    _write_json(args.json, out)
    print(res.pid)
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from podsnap.cli.progress import human_bytes
    from podsnap.engine import EngineError, check_compat, host_facts, read_manifest, verify

    path = Path(args.artifact)
    try:
        m = read_manifest(path)
    except EngineError as exc:
        print(f"podsnap inspect: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(m.to_json(), end="")
    else:
        src = m.source
        gpus = ", ".join(f"{g.name} ({g.uuid})" for g in src.gpus) or "none"
        print(
            f"artifact   {path}  (schema {m.schema_version}, {m.digest} digests, podsnap {m.podsnap_version}, {m.created_at})"
        )
        print(f"source     {src.hostname}: {src.arch}, kernel {src.kernel}, {src.glibc}, driver {src.driver_version}")
        print(f"gpus       {gpus}")
        print(f"processes  {', '.join(f'{p.pid}/{p.ns_pid} {p.comm}' for p in m.processes)}  (host pid/ns pid)")
        print(f"cuda pids  {list(m.cuda_pids) or 'none'}; namespaced {m.namespaced}")
        print(f"size       {human_bytes(m.total_bytes)} in {len(m.files)} files; memory {human_bytes(m.memory_bytes)}")
        print(f"criu       {m.criu_version}: {', '.join(m.criu_options)}")
        if m.extra:
            print(f"extra      {', '.join(sorted(m.extra))}")
    if not args.verify:
        return 0
    try:
        verify(path, m)
    except EngineError as exc:
        print(f"FAIL digests: {exc}")
        return 1
    print("OK   digests")
    failures = check_compat(m, host_facts(with_gpus=bool(m.cuda_pids)))
    for f in failures:
        print(f"FAIL gate {f.gate}: expected {f.expected!r}, found {f.found!r}")
    if not failures:
        print("OK   gates: restorable on this host")
    return 3 if failures else 0


def _cmd_run(argv: Sequence[str]) -> int:
    try:
        from podsnap.workload.run import main as run_main
    except ImportError:
        print("podsnap run: the workload SDK (podsnap.workload.run) is not installed", file=sys.stderr)
        return 2
    return int(run_main(list(argv)) or 0)


def main(argv: Sequence[str] | None = None, prog: str = "podsnap") -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # `run` passes everything after it to podsnap-run untouched (its own options and `-- CMD`)
    if args_list[:1] == ["run"]:
        return _cmd_run(args_list[1:])
    args = build_parser(prog).parse_args(args_list)
    if args.command == "doctor":
        from podsnap.cli.doctor import run_doctor

        return run_doctor(args.json)
    if args.command == "capture":
        return _cmd_capture(args)
    if args.command == "restore":
        return _cmd_restore(args)
    if args.command == "inspect":
        return _cmd_inspect(args)
    if args.command == "demo":
        from podsnap.cli.demo import run_demo

        return run_demo(args)
    if args.command == "status":
        from podsnap.cli.status import run_status

        return run_status(args)
    build_parser(prog).print_help()
    return 0


def kubectl_plugin() -> int:
    """`kubectl podsnap ...`: kubectl runs `kubectl-podsnap` from PATH with the arguments after `podsnap`."""
    return main(prog="kubectl podsnap")
