"""`python -m podsnap.workload.engines ENGINE [--url URL] -- CMD...`: snapshot an unmodified engine server.

Starts CMD (e.g. `vllm serve MODEL --enable-sleep-mode`) as a child, waits until its health
endpoint answers, then runs the engine controller through the engine's HTTP admin endpoints: the
server is quiesced, captured and, in a restored pod, woken up. Then it waits for the server and
exits with its status, forwarding termination signals. Without a control dir it only supervises.

The server must not open connections to outside services before the capture; `vllm serve`,
`sglang.launch_server` and `trtllm-serve` do not. In the container: `podsnap-run -- python -m
podsnap.workload.engines vllm -- vllm serve ...` (podsnap-run keeps the worker off PID 1).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import NoReturn

from podsnap.workload.engines._adapter import EngineAdapter
from podsnap.workload.engines._controller import EngineSnapshot
from podsnap.workload.engines._errors import EngineError
from podsnap.workload.engines.sglang import SglangAdapter
from podsnap.workload.engines.trtllm import TrtllmAdapter
from podsnap.workload.engines.vllm import MODES as VLLM_MODES
from podsnap.workload.engines.vllm import VllmAdapter

DEFAULT_PORT = {"vllm": 8000, "sglang": 30000, "trtllm": 8000}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m podsnap.workload.engines",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s ENGINE [options] -- CMD [ARG...]",
    )
    p.add_argument("engine", choices=sorted(DEFAULT_PORT))
    p.add_argument("--url", default=None, help="the server's base URL (default http://127.0.0.1:<engine's port>)")
    p.add_argument("--health", default="/health", help="path that answers 200 once the server is up (default /health)")
    p.add_argument("--start-timeout", type=float, default=3600.0, help="seconds to wait for the server to come up")
    p.add_argument("--snapshot-timeout", type=float, default=None, help="give up waiting for the restore after SECONDS")
    p.add_argument(
        "--vllm-mode",
        choices=VLLM_MODES,
        default="kv",
        help="vLLM: release the KV cache only (kv), sleep level 1 (weights to host), or sleep level 2 and reload "
        "the weights after the restore (weights)",
    )
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--sglang-release-weights",
        action="store_true",
        help="SGLang: also release the weights (needs --enable-weights-cpu-backup)",
    )
    weights.add_argument(
        "--sglang-reload-weights",
        action="store_true",
        help="SGLang: discard the weights before the capture and reload them from the model path after the restore "
        "(start the server WITHOUT --enable-weights-cpu-backup)",
    )
    p.add_argument(
        "--sglang-model-path",
        default=None,
        metavar="PATH",
        help="SGLang: the path to reload the weights from (default: the server command's --model-path)",
    )
    p.add_argument(
        "--api-key-env", default=None, metavar="VAR", help="send 'Authorization: Bearer $VAR' to the admin endpoints"
    )
    return p


def command_option(cmd: Sequence[str], option: str) -> str | None:
    """The value of `option` in a server command line (`--opt VALUE` or `--opt=VALUE`), if it is there."""
    for i, arg in enumerate(cmd):
        if arg == option and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def make_adapter(args: argparse.Namespace, url: str, cmd: Sequence[str] = ()) -> EngineAdapter:
    headers = {"Authorization": f"Bearer {os.environ[args.api_key_env]}"} if args.api_key_env else None
    if args.engine == "vllm":
        return VllmAdapter.http(url, mode=args.vllm_mode)
    if args.engine == "sglang":
        if not args.sglang_reload_weights:
            return SglangAdapter.http(url, release_weights=args.sglang_release_weights, headers=headers)
        model_path = args.sglang_model_path or command_option(cmd, "--model-path")
        if model_path is None:
            raise SystemExit(
                "podsnap: --sglang-reload-weights needs the model path: give --sglang-model-path PATH, or "
                "--model-path PATH in the server command"
            )
        return SglangAdapter.http(url, reload_weights=True, model_path=model_path, headers=headers)
    return TrtllmAdapter.http(url, headers=headers)


def wait_healthy(url: str, child: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if child.poll() is not None:
            raise SystemExit(f"podsnap: the server exited with status {child.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            child.kill()
            raise SystemExit(f"podsnap: {url} did not answer 200 within {timeout_s:g}s")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, cmd = build_parser().parse_args(argv[:split]), argv[split + 1 :]
    if not cmd:
        print(
            "podsnap: no server command given; usage: python -m podsnap.workload.engines ENGINE -- CMD...",
            file=sys.stderr,
        )
        return 2
    url = (args.url or f"http://127.0.0.1:{DEFAULT_PORT[args.engine]}").rstrip("/")
    adapter = make_adapter(args, url, cmd)  # before the server starts: a bad option costs no model load
    # its own process group, so a clean exit can end the whole server tree at once
    child = subprocess.Popen(cmd, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)

    def end(status: int) -> NoReturn:
        # the server's copy lives on in the checkpoint (or it never will be restored): end it here
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    wait_healthy(url + args.health, child, args.start_timeout)
    try:
        EngineSnapshot(adapter, timeout_s=args.snapshot_timeout, exit=end).run()
    except EngineError as e:
        print(f"podsnap: {e}", file=sys.stderr)
        end(1)
    status = child.wait()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    raise SystemExit(main())
