"""`python -m podsnap.demo`: the demo worker's cold start, snapshot point and serving loop.

Cold start: import the backend, load the weights (generated from `--seed`, or streamed from
`--weights-file`), optionally `torch.compile` the decode step, warm up with a few requests, then
listen. With a control dir (SNAPSHOT_CONTROL_DIR / DYN_SNAPSHOT_CONTROL_DIR) and without
`--no-snapshot`, the worker then offers itself for capture through the workload SDK while it keeps
serving; a restored copy continues from there with the same init id and pid. Every phase's seconds
are reported at /health.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from podsnap.demo._model import Model, NumpyModel, element_count
from podsnap.demo._server import DemoServer
from podsnap.workload import (
    FileSource,
    QuiesceError,
    RestoreTimeout,
    ResumeInfo,
    SnapshotControl,
    SnapshotError,
    Weights,
)

DEFAULT_GIB = {"cpu": 1 / 64, "cuda": 1.0}
WARMUP_PROMPTS = ("Hello!", "What is podsnap?", "Tell me a story about GPUs and checkpoints.")


class _Stop(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m podsnap.demo", description=__doc__.split("\n\n")[0] if __doc__ else "")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 picks a free one)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when torch sees a GPU")
    p.add_argument(
        "--weights-gib", type=float, default=None, help="size of the weights (default 1 on cuda, 1/64 = 16 MiB on cpu)"
    )
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--seed", type=int, default=0, help="weights are generated from this seed (default 0)")
    p.add_argument("--weights-file", type=Path, default=None, help="raw weights to stream in instead of generating")
    p.add_argument(
        "--write-weights", type=Path, default=None, help="write generated weights to this file and exit (cuda)"
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step and warm it up (cuda)")
    p.add_argument(
        "--compile-mode",
        choices=("default", "reduce-overhead"),
        default="default",
        help="torch.compile mode; reduce-overhead captures CUDA graphs on the weights' addresses (cuda)",
    )
    p.add_argument(
        "--cooperative",
        action="store_true",
        help="hand the weights to podsnap.workload.Weights: released before the checkpoint, streamed back at resume",
    )
    p.add_argument(
        "--cooperative-source",
        choices=("auto", "file", "host"),
        default="auto",
        help="--cooperative: reload from --weights-file (file) or from a host copy in the checkpoint (host); "
        "auto: file when --weights-file is given",
    )
    p.add_argument(
        "--offer-on-request",
        action="store_true",
        help="offer this worker for capture only once POST /podsnap/offer arrives (after a caller's own checks)",
    )
    p.add_argument(
        "--weights-threads",
        type=int,
        default=None,
        help="--cooperative: reader threads for a file source (default: the SDK's, one per core up to 16)",
    )
    p.add_argument("--warmup-requests", type=int, default=3, help="requests run before serving (default 3)")
    p.add_argument("--model-id", default="podsnap-demo", help="the model name /v1/models reports")
    p.add_argument("--no-snapshot", action="store_true", help="never offer this worker for capture")
    p.add_argument(
        "--snapshot-timeout", type=float, default=None, help="give up waiting for restore-complete after SECONDS"
    )
    return p


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    # probing imports torch, so only where a GPU can exist at all: a CPU worker never loads it
    if not Path("/dev/nvidiactl").exists() or importlib.util.find_spec("torch") is None:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def adopt_weights(args: argparse.Namespace, model: Model, phases: dict[str, float]) -> Weights:
    """The cooperative path: the model's weights move into memory the SDK owns (before compile/warm-up)."""
    source_kind = args.cooperative_source
    if source_kind == "auto":
        source_kind = "file" if args.weights_file else "host"
    if source_kind == "file" and not args.weights_file:
        raise SystemExit("--cooperative-source file needs --weights-file")
    t = time.monotonic()
    small = model.device == "cpu"
    weights = Weights(threads=2, staging_bytes=4 << 20) if small else Weights(threads=args.weights_threads)
    model.adopt(weights, FileSource(args.weights_file) if source_kind == "file" else None)
    phases["adopt"] = time.monotonic() - t
    return weights


def load_model(args: argparse.Namespace, device: str, phases: dict[str, float]) -> tuple[Model, Weights | None]:
    gib = args.weights_gib if args.weights_gib is not None else DEFAULT_GIB[device]
    n = element_count(gib)
    t = time.monotonic()
    if device == "cpu":
        if args.dtype != "float16":
            raise SystemExit("--dtype bfloat16 needs --device cuda (numpy has no bfloat16); use --dtype float16")
        if args.compile:
            raise SystemExit("--compile needs --device cuda (the CPU backend is numpy)")
        phases["import"] = time.monotonic() - t
        t = time.monotonic()
        model: Model = (
            NumpyModel.from_file(args.weights_file, n) if args.weights_file else NumpyModel.generated(n, args.seed)
        )
        phases["load"] = time.monotonic() - t
        return model, adopt_weights(args, model, phases) if args.cooperative else None
    if args.compile:
        # inductor's default pool of compile subprocesses would become part of the captured process tree
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch

    from podsnap.demo._torch_model import TorchModel

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU; use --device cpu or auto")
    torch.cuda.init()
    phases["import"] = time.monotonic() - t
    t = time.monotonic()
    tm = (
        TorchModel.from_file(args.weights_file, n, args.dtype)
        if args.weights_file
        else TorchModel.generated(n, args.seed, args.dtype)
    )
    phases["load"] = time.monotonic() - t
    weights = adopt_weights(args, tm, phases) if args.cooperative else None
    if args.compile:
        t = time.monotonic()
        tm.compile(args.compile_mode)
        tm.generate(WARMUP_PROMPTS[0], 2)  # the first call compiles
        phases["compile"] = time.monotonic() - t
    return tm, weights


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = build_parser().parse_args(argv)
    init_id = str(uuid.uuid4())
    device = pick_device(args.device)
    if args.write_weights is not None:
        if device != "cuda":
            raise SystemExit("--write-weights needs --device cuda")
        from podsnap.demo._torch_model import write_weights

        gib = args.weights_gib if args.weights_gib is not None else DEFAULT_GIB["cuda"]
        write_weights(args.write_weights, element_count(gib), args.seed, args.dtype)
        return 0
    try:
        # a restored worker notices restore-complete within 10 ms (the SDK's default polls every 50)
        snap = SnapshotControl(poll_interval_s=0.01) if not args.no_snapshot else None
    except SnapshotError as e:
        raise SystemExit(f"podsnap-demo: {e}") from e
    phases: dict[str, float] = {}
    model, weights = load_model(args, device, phases)
    t = time.monotonic()
    for i in range(max(0, args.warmup_requests)):
        model.generate(WARMUP_PROMPTS[i % len(WARMUP_PROMPTS)], 8)
    phases["warmup"] = time.monotonic() - t
    state: dict[str, Any] = {"restored": False, "restore": None}

    def health() -> dict[str, Any]:
        return {
            "device": model.device,
            "dtype": model.dtype,
            "weights_bytes": model.nbytes,
            "compiled": bool(args.compile),
            "compile_mode": args.compile_mode if args.compile else None,
            "cooperative": None
            if weights is None
            else {"bytes": weights.nbytes, "offload": weights.last_offload, "reload": weights.last_reload},
            "phases_s": dict(phases),
            **state,
        }

    identity = {"init_id": init_id, "model": args.model_id}
    server = DemoServer((args.host, args.port), model, args.model_id, identity, health)
    phases["cold_start"] = time.monotonic() - start
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    port = server.server_address[1]
    print(
        f"podsnap-demo: serving on http://{args.host}:{port} init_id={init_id} pid={os.getpid()} "
        f"device={model.device} weights={model.nbytes / (1 << 30):.3f}GiB cold_start={phases['cold_start']:.2f}s",
        flush=True,
    )
    try:
        if snap is not None and snap.enabled:
            while args.offer_on_request and not server.offer.wait(1.0):
                pass
            _offer_for_capture(snap, server, model, state, weights=weights, timeout_s=args.snapshot_timeout)
        while True:
            time.sleep(3600)
    except _Stop:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _offer_for_capture(
    snap: SnapshotControl,
    server: DemoServer,
    model: Model,
    state: dict[str, Any],
    *,
    weights: Weights | None,
    timeout_s: float | None,
) -> None:
    def finish_generation() -> None:
        # in-flight requests finish before the process is offered; the lock is released again at once
        with server.generation:
            pass

    snap.on_quiesce(finish_generation, name="finish-generation")
    snap.on_quiesce(model.release_caches, name="release-caches")
    if weights is not None:
        # requests wait while the weights are away: from the quiesce until they are back
        def hold_generation() -> None:
            server.generation.acquire()

        snap.on_quiesce(hold_generation, name="hold-generation")
        # last to quiesce (generation has stopped), first to resume (before anything reads the weights)
        weights.attach(snap)
        snap.on_resume(lambda _: server.generation.release(), name="release-generation")

    def record_checkpoint_memory() -> None:
        # last quiesce hook: what the CUDA checkpoint (and so the image and the fill) will carry
        state["at_checkpoint"] = model.device_memory()

    snap.on_quiesce(record_checkpoint_memory, name="record-checkpoint-memory")

    def mark_restored(info: ResumeInfo) -> None:
        state["restored"] = info.restored
        state["restore"] = {"waited_s": info.waited_s, "context_env": sorted(info.context.env)}

    snap.on_resume(mark_restored, name="mark-restored")
    print(f"podsnap-demo: ready for snapshot ({snap.control_dir})", flush=True)
    try:
        info = snap.checkpoint_and_wait(timeout_s=timeout_s)
    except (QuiesceError, RestoreTimeout) as e:
        # never captured: this process is still the intact source, so it keeps serving (with its weights)
        if weights is not None and not weights.resident:
            weights.reload()
        if weights is not None and server.generation.locked():
            server.generation.release()
        print(f"podsnap-demo: not captured, serving on: {e}", file=sys.stderr, flush=True)
        return
    except SnapshotError as e:
        # released or restored, but the new context or a resume hook failed: its state is not trusted
        print(f"podsnap-demo: resume failed, exiting: {e}", file=sys.stderr, flush=True)
        raise SystemExit(3) from e
    state["restore"] = {**(state["restore"] or {}), "hook_s": dict(info.hook_seconds)}
    print(
        "podsnap-demo: resumed " + json.dumps({"restored": info.restored, "pid": os.getpid(), **state["restore"]}),
        flush=True,
    )
