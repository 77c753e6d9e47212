"""A worker that follows the control-dir contract with the standard library only (nothing from podsnap).

usage: contract_worker.py RESULT_JSON   (env SNAPSHOT_CONTROL_DIR names the control dir)

It builds some state (random bytes and their digest), clears stale control files, writes
`ready-for-snapshot` atomically, and polls for `restore-complete`. Then it reads
`restore-context.json`, applies its env, and writes RESULT_JSON: its pid, the digest of its state
before and after, its start time before and after (a restored process gets a new one), the env and
whether any podsnap module was ever loaded. It exits 0.
"""

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

control = Path(os.environ["SNAPSHOT_CONTROL_DIR"])
result_path = Path(sys.argv[1])


def start_ticks() -> int:
    stat = Path("/proc/self/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


state = bytearray(os.urandom(8 << 20))
digest_before = hashlib.sha256(state).hexdigest()
ticks_before = start_ticks()
for name in ("restore-complete", "restore-context.json", "ready-for-snapshot"):
    with contextlib.suppress(FileNotFoundError):
        (control / name).unlink()
# warm-up takes a moment: `podsnap capture --control-dir` must wait for it
time.sleep(float(os.environ.get("WARMUP_S", "1.0")))
tmp = control / ".ready.tmp"
with tmp.open("w") as f:
    f.write(json.dumps({"pid": os.getpid()}))
    f.flush()
    os.fsync(f.fileno())
tmp.rename(control / "ready-for-snapshot")

while not (control / "restore-complete").exists():
    time.sleep(0.05)

context = json.loads((control / "restore-context.json").read_text())
os.environ.update(context.get("env", {}))
result = {
    "pid": os.getpid(),
    "digest_before": digest_before,
    "digest_after": hashlib.sha256(state).hexdigest(),
    "ticks_before": ticks_before,
    "ticks_after": start_ticks(),
    "env": {k: os.environ.get(k) for k in context.get("env", {})},
    "podsnap_modules": sorted(m for m in sys.modules if m.split(".")[0] == "podsnap"),
}
tmp = result_path.with_suffix(".tmp")
tmp.write_text(json.dumps(result))
tmp.rename(result_path)
