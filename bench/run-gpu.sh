#!/bin/bash
# `make bench-gpu`: cold start vs restore of the demo worker at 8 and 32 GiB, eager and compiled, through
# the transparent and the cooperative restore paths, side by side, with the floor (pinned host->device),
# on a machine with an NVIDIA GPU, the CUDA checkpoint API (driver >= 570), CRIU >= 4 and root.
# Needs a python3 with torch + cuda-bindings (PYTHON=... to choose one); podsnap comes from python/.
# CRIU: PODSNAP_CRIU, else the bundle carried to .device/criu, else the engine's own lookup.
# JSON: $OUT/bench.json when OUT is set, else bench/results/gpu-<time>.json. Extra args go to gpu_bench.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
# never let a GPU program here turn on NVLink multicast (shared hosts)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${PODSNAP_CRIU:-}" ] && [ -x "$ROOT/.device/criu/criu.sh" ]; then
  export PODSNAP_CRIU="$ROOT/.device/criu/criu.sh"
fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  # the repo's venv (first on make's PATH) has no torch; prefer a python3 that has it
  for cand in /usr/bin/python3 /usr/local/bin/python3 $(type -ap python3); do
    if "$cand" -c 'import torch, cuda.bindings.driver' 2>/dev/null; then PY=$cand; break; fi
  done
fi
[ -n "$PY" ] || { echo "run-gpu.sh: no python3 with torch and cuda-bindings found; set PYTHON=" >&2; exit 2; }
exec "$PY" "$ROOT/bench/gpu_bench.py" "$@"
