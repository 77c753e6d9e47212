"""The demo worker: a small OpenAI-compatible server holding a "model" on the GPU (or, with numpy, the CPU).

Run it with `python -m podsnap.demo [--device auto|cpu|cuda] [--weights-gib N] [--compile] [--port 8000]`.
Every response carries the worker's `init_id` (created at cold start) and pid, so a restored worker
is recognisable as the same one. See `podsnap.demo._worker` for the flags and the snapshot flow.

`round_trip(workdir, worker_args, port=...)` runs the worker through cold start -> capture ->
restore -> first answer with the engine and returns a measured, bit-exactness-checked report; it is
what `podsnap demo`, the tests and `bench/gpu_bench.py` use.
"""

from podsnap.demo._roundtrip import QUESTION, RoundTripError, free_port, round_trip
from podsnap.demo._worker import main

__all__ = ["QUESTION", "RoundTripError", "free_port", "main", "round_trip"]
