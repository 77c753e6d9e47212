"""The checkpoint-safe environment of each inference engine, as data.

Standard library only, and nothing else from podsnap, so the operator's pod webhook can import it
without the workload SDK: `safe_env("vllm")` is the dict of variables to set on the target
container of a capture pod AND its restore pods (a restore that falls back to a cold start must
build the same process the checkpoint holds).

Why each group exists:
- collectives (NCCL, GLOO, OpenMPI) bind to loopback: a socket on the capture pod's IP cannot follow
  the process to a pod with another IP, and single-GPU workers (podsnap v1) need no other interface;
- NCCL's cuMem buffers, NVLink SHARP multicast and InfiniBand verbs hold device mappings and
  fabric handles that the CUDA checkpoint API does not capture;
- hub downloads and usage telemetry are off: a restored process must open no connection the
  capture made, and a worker that phones home at start would hold one in the checkpoint. Models
  come from the image or a volume filled by an init container (the webhook sets this env on the
  target container only);
- torch.compile's worker pool is one thread: its subprocesses would otherwise join the captured
  process tree.

The webhook applies `safe_env(engine)` under whatever the container already sets: a variable the
workload names itself wins (`merge_env`), so a workload can override any default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str


#: the pod-template annotation that names the engine whose safe env the webhook applies
ANNOTATION_ENGINE: Final = "podsnap.io/engine"

COMMON: Final[tuple[EnvVar, ...]] = (
    EnvVar("NCCL_SOCKET_IFNAME", "lo", "NCCL bootstrap and socket transport on loopback: no socket on the pod IP"),
    EnvVar("GLOO_SOCKET_IFNAME", "lo", "torch.distributed's gloo groups on loopback: no socket on the pod IP"),
    EnvVar("NCCL_CUMEM_ENABLE", "0", "NCCL buffers from cudaMalloc, not cuMem handles the CUDA checkpoint misses"),
    EnvVar("NCCL_NVLS_ENABLE", "0", "no NVLink SHARP multicast objects (not checkpointable)"),
    EnvVar("NCCL_IB_DISABLE", "1", "no InfiniBand/RoCE verbs: queue pairs and registered memory do not survive"),
    EnvVar("HF_HUB_OFFLINE", "1", "no Hugging Face Hub connection: the model comes from the image or a volume"),
    EnvVar("TRANSFORMERS_OFFLINE", "1", "same for transformers' own download paths"),
    EnvVar("HF_HUB_DISABLE_TELEMETRY", "1", "no hub telemetry requests"),
    EnvVar("TORCHINDUCTOR_COMPILE_THREADS", "1", "torch.compile compiles in-process: no worker pool in the tree"),
)

ENGINE_ENV: Final[dict[str, tuple[EnvVar, ...]]] = {
    "vllm": (
        EnvVar("VLLM_NO_USAGE_STATS", "1", "no usage-stats thread posting to stats.vllm.ai"),
        EnvVar("VLLM_DO_NOT_TRACK", "1", "same, the opt-out vLLM also reads"),
    ),
    "sglang": (),
    "trtllm": (
        EnvVar(
            "TLLM_NCCL_SYMMETRIC_ZERO_COPY",
            "0",
            "no NCCL registered (symmetric) windows: the CUDA checkpoint cannot capture them",
        ),
        EnvVar("OMPI_MCA_oob_tcp_if_include", "lo", "OpenMPI's out-of-band channel (mpi4py workers) on loopback"),
        EnvVar("OMPI_MCA_btl_tcp_if_include", "lo", "OpenMPI's TCP byte transfer layer on loopback"),
    ),
}

ENGINES: Final[tuple[str, ...]] = tuple(ENGINE_ENV)


def env_vars(engine: str) -> tuple[EnvVar, ...]:
    """The documented variables for `engine` (the common ones first)."""
    if engine not in ENGINE_ENV:
        raise ValueError(f"unknown engine {engine!r}; {ANNOTATION_ENGINE} must be one of {', '.join(ENGINES)}")
    return COMMON + ENGINE_ENV[engine]


def safe_env(engine: str) -> dict[str, str]:
    """`{name: value}` of the checkpoint-safe environment of `engine` ("vllm", "sglang", "trtllm")."""
    return {v.name: v.value for v in env_vars(engine)}


def merge_env(
    container_env: Sequence[Mapping[str, Any]] | None,
    defaults: Mapping[str, str],
    overrides: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """A container's `env` list with `defaults` added where the container does not set the name.

    Order of precedence, highest first: the container's own entries (value or valueFrom), then
    `overrides` (a None value removes that default: the workload opts out of it), then `defaults`.
    Existing entries keep their order; added ones follow in the order of `defaults`.
    """
    merged = [dict(e) for e in container_env or ()]
    present = {str(e.get("name")) for e in merged}
    wanted = dict(defaults)
    for name, value in (overrides or {}).items():
        if value is None:
            wanted.pop(name, None)
        else:
            wanted[name] = value
    merged.extend({"name": name, "value": value} for name, value in wanted.items() if name not in present)
    return merged


def table(engine: str) -> str:
    """The Markdown table of `engine`'s variables (docs/engines.md shows it; a test keeps the two in step)."""
    rows = [f"| `{v.name}` | `{v.value}` | {v.why} |" for v in env_vars(engine)]
    return "\n".join(["| variable | value | why |", "|---|---|---|", *rows])
