"""De-risk the GPU mechanism on the device in one short call, without the engine.

Starts a small torch worker that holds `--gib` GiB of float16 weights and answers their checksum on a
TCP socket, then runs the naive sequence by hand: cuCheckpointProcessLock -> Checkpoint -> `criu dump`
-> reap -> `criu restore` -> cuCheckpointProcessRestore -> Unlock, and asks again. Prints versions,
`criu check`, the transparent-huge-page mode and a pinned host->device copy rate too.

usage (on the device): python3 bench/smoke_gpu.py --criu .device/criu/criu --out "$OUT"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def worker(gib: float, port: int, ready: Path) -> None:
    import torch

    t0 = time.monotonic()
    n = int(gib * (1 << 30)) // 2
    w = torch.empty(n, dtype=torch.float16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1234)
    chunk = 1 << 26
    for i in range(0, n, chunk):
        w[i : i + chunk].normal_(generator=g)

    def checksum() -> int:
        total = 0
        for i in range(0, n, chunk):
            c = w[i : i + chunk].view(torch.int16).to(torch.int64)
            pos = torch.arange(c.numel(), device="cuda", dtype=torch.int64) % 251 + 1
            total += int((c * pos).sum().item()) + i
        return total

    first = checksum()
    torch.cuda.synchronize()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(8)
    ready.write_text(json.dumps({"checksum": first, "init_s": time.monotonic() - t0, "pid": os.getpid()}))
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(json.dumps({"checksum": checksum(), "pid": os.getpid()}).encode())


def ask(port: int) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    result: dict[str, Any] = json.loads(data)
    return result


def cu(name: str, *args: Any) -> Any:
    from cuda.bindings import driver

    res = getattr(driver, name)(*args)
    err = res[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise RuntimeError(f"{name}: {err!r} {msg!r}")
    return res[1] if len(res) == 2 else res[1:]


def sh(cmd: str) -> str:
    p = subprocess.run(cmd, check=False, shell=True, capture_output=True, text=True, timeout=60)
    return (p.stdout + p.stderr).strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--port", type=int, default=18777)
    ap.add_argument("--ready", type=Path)
    ap.add_argument("--criu", default=".device/criu/criu")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/smoke")))
    ap.add_argument("--work", type=Path, default=Path("/dev/shm/podsnap-smoke"))
    a = ap.parse_args()
    if a.worker:
        assert a.ready is not None
        worker(a.gib, a.port, a.ready)
        return 0

    a.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    criu = str(Path(a.criu).resolve())
    env_criu = {**os.environ, "LD_LIBRARY_PATH": str(Path(criu).parent / "lib")}
    report["facts"] = {
        "uname": sh("uname -a"),
        "python": sys.version,
        "nvidia_smi": sh("nvidia-smi --query-gpu=name,driver_version,memory.total,uuid --format=csv,noheader"),
        "thp": sh("cat /sys/kernel/mm/transparent_hugepage/enabled"),
        "nproc": os.cpu_count(),
        "mem": sh("free -g | head -2"),
        "df": sh("df -h /tmp /dev/shm . | cat"),
        "pip": sh(f"{sys.executable} -m pip list 2>/dev/null | grep -Ei 'torch |cuda-bindings|nvidia-ml-py|numpy '"),
        "criu_version": subprocess.run(
            [criu, "--version"], check=False, env=env_criu, capture_output=True, text=True
        ).stdout.strip(),
        "criu_check": subprocess.run(
            [criu, "check"], check=False, env=env_criu, capture_output=True, text=True
        ).stdout.strip()
        + subprocess.run([criu, "check"], check=False, env=env_criu, capture_output=True, text=True).stderr.strip()[
            -800:
        ],
        "io_uring_disabled": sh("cat /proc/sys/kernel/io_uring_disabled 2>&1"),
        "whoami": sh("id"),
    }
    print(json.dumps(report["facts"], indent=1), flush=True)

    # pinned host->device, the floor for streaming weights back
    import torch

    n = 4 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.fill_(7)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    for _ in range(2):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    reps = 5
    for _ in range(reps):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    h2d = reps * n / (time.perf_counter() - t)
    report["pinned_h2d_GBps"] = h2d / 1e9
    print(f"pinned H2D: {h2d / 1e9:.1f} GB/s", flush=True)
    del host, dev
    torch.cuda.empty_cache()

    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    ready = a.work / "ready.json"
    log = (a.work / "worker.log").open("w")  # the worker keeps it open across dump/restore
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", "--gib", str(a.gib), "--port", str(a.port), "--ready", str(ready)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    while not ready.exists():
        if proc.poll() is not None:
            print((a.work / "worker.log").read_text())
            raise SystemExit("worker died")
        time.sleep(0.05)
    time.sleep(0.1)
    cold = time.monotonic() - t0
    before = ask(a.port)
    report["cold_start_s"] = cold
    report["before"] = before
    print(f"cold start {cold:.2f}s, before={before}", flush=True)
    pid = proc.pid

    from cuda.bindings import driver

    cu("cuInit", 0)
    phases: dict[str, float] = {}

    def phase(name: str, fn: Any) -> Any:
        t = time.monotonic()
        r = fn()
        phases[name] = time.monotonic() - t
        print(f"  {name}: {phases[name]:.2f}s", flush=True)
        return r

    lock_args = driver.CUcheckpointLockArgs()
    lock_args.timeoutMs = 30000
    phase("cuda_lock", lambda: cu("cuCheckpointProcessLock", pid, lock_args))
    phase("cuda_checkpoint", lambda: cu("cuCheckpointProcessCheckpoint", pid, None))
    report["state_after_checkpoint"] = repr(cu("cuCheckpointProcessGetState", pid))
    images = a.work / "images"
    images.mkdir()
    dump = phase(
        "criu_dump",
        lambda: subprocess.run(
            [criu, "dump", "-t", str(pid), "-D", str(images), "--shell-job", "-v4", "-o", "dump.log"],
            check=False,
            env=env_criu,
            capture_output=True,
            text=True,
        ),
    )
    if dump.returncode != 0:
        print(sh(f"tail -40 {images}/dump.log"))
        raise SystemExit("criu dump failed")
    proc.wait(timeout=30)
    size = sum(f.stat().st_size for f in images.iterdir())
    report["image_bytes"] = size
    pidfile = a.work / "restored.pid"
    rest = phase(
        "criu_restore",
        lambda: subprocess.run(
            [
                criu,
                "restore",
                "-D",
                str(images),
                "-d",
                "--pidfile",
                str(pidfile),
                "--shell-job",
                "-v4",
                "-o",
                "restore.log",
            ],
            check=False,
            env=env_criu,
            capture_output=True,
            text=True,
        ),
    )
    if rest.returncode != 0:
        print(sh(f"tail -40 {images}/restore.log"))
        raise SystemExit("criu restore failed")
    rpid = int(pidfile.read_text())
    report["restored_pid"] = rpid
    report["state_after_criu_restore"] = repr(cu("cuCheckpointProcessGetState", rpid))
    phase("cuda_restore", lambda: cu("cuCheckpointProcessRestore", rpid, None))
    phase("cuda_unlock", lambda: cu("cuCheckpointProcessUnlock", rpid, None))
    after = phase("first_answer", lambda: ask(a.port))
    report["after"] = after
    report["phases_s"] = phases
    report["bit_exact"] = after["checksum"] == before["checksum"]
    gib = size / (1 << 30)
    report["image_gib"] = gib
    print(f"image {gib:.2f} GiB; after={after}; bit_exact={report['bit_exact']}", flush=True)
    with contextlib.suppress(ProcessLookupError):
        os.kill(rpid, 9)
    (a.out / "smoke.json").write_text(json.dumps(report, indent=1, default=str))
    shutil.copy(images / "dump.log", a.out / "dump.log")
    shutil.copy(images / "restore.log", a.out / "restore.log")
    shutil.rmtree(a.work, ignore_errors=True)
    return 0 if report["bit_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
