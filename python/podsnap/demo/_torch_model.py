"""GPU backend of the demo model (same math as `NumpyModel`, on a torch device). Imported only for cuda."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from podsnap.demo._model import CHUNK, HIDDEN, SEGMENTS, VOCAB, combine_checksum, prompt_bytes

if TYPE_CHECKING:
    from podsnap.workload import FileSource, Weights

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class TorchModel:
    def __init__(self, weights: torch.Tensor, dtype: str) -> None:
        self.w = weights
        self.device = str(weights.device)
        self.dtype = dtype
        self.n = int(weights.numel())
        head = weights[: 256 * HIDDEN + 2 * HIDDEN * HIDDEN].float()
        self.emb = head[: 256 * HIDDEN].reshape(256, HIDDEN).contiguous()
        rest = head[256 * HIDDEN :]
        self.w1 = (rest[: HIDDEN * HIDDEN].reshape(HIDDEN, HIDDEN) / math.sqrt(HIDDEN)).contiguous()
        self.w2 = (rest[HIDDEN * HIDDEN :].reshape(HIDDEN, HIDDEN)[:, : len(VOCAB)] / math.sqrt(HIDDEN)).contiguous()
        self._step: Callable[..., Any] = _step
        self._graphs = False

    @classmethod
    def generated(cls, n: int, seed: int, dtype: str, device: str = "cuda") -> TorchModel:
        w = torch.empty(n, dtype=DTYPES[dtype], device=device)
        g = torch.Generator(device=device).manual_seed(seed)
        for i in range(0, n, CHUNK):
            w[i : i + CHUNK].normal_(generator=g)
        torch.cuda.synchronize()
        return cls(w, dtype)

    @classmethod
    def from_file(cls, path: Path, n: int, dtype: str, device: str = "cuda") -> TorchModel:
        """Stream the file through two pinned buffers into GPU memory, as an engine's loader would."""
        w = torch.empty(n, dtype=DTYPES[dtype], device=device)
        elem = w.element_size()
        bufs = [torch.empty(CHUNK * elem, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        events = [torch.cuda.Event(), torch.cuda.Event()]
        stream = torch.cuda.Stream()
        flat = w.view(torch.uint8)
        total = n * elem
        with path.open("rb", buffering=0) as f:
            done, k = 0, 0
            while done < total:
                buf, ev = bufs[k % 2], events[k % 2]
                ev.synchronize()  # the copy that last used this buffer has finished
                want = min(CHUNK * elem, total - done)
                got = f.readinto(memoryview(buf.numpy())[:want])
                if got != want:
                    raise ValueError(f"--weights-file {path}: holds {done + (got or 0)} bytes, {total} needed")
                with torch.cuda.stream(stream):
                    flat[done : done + want].copy_(buf[:want], non_blocking=True)
                    ev.record(stream)
                done += want
                k += 1
        stream.synchronize()
        del bufs
        return cls(w, dtype)

    @property
    def nbytes(self) -> int:
        return self.n * self.w.element_size()

    def compile(self, mode: str = "default") -> None:
        if mode == "reduce-overhead":
            # the decode step's weights are static inputs: the CUDA graphs read them at their addresses
            # (not through copies), which is what the cooperative path must keep valid across a restore
            for t in (self.w1, self.w2, self.emb):
                torch._dynamo.mark_static_address(t)
        self._step = torch.compile(_step, fullgraph=True, dynamic=False, mode=None if mode == "default" else mode)
        self._graphs = mode == "reduce-overhead"

    def adopt(self, weights: Weights, source: FileSource | None) -> None:
        """Hand every tensor the answers depend on to the SDK, before compile captures their addresses."""
        self.w = weights.adopt("weights", self.w, source=source)
        self.emb = weights.adopt("emb", self.emb)
        self.w1 = weights.adopt("w1", self.w1)
        self.w2 = weights.adopt("w2", self.w2)
        self.release_caches()  # the originals' memory goes back to the GPU

    def signature(self) -> torch.Tensor:
        seg = self.n // SEGMENTS
        sig = torch.zeros(SEGMENTS, dtype=torch.float64, device=self.w.device)
        for s in range(SEGMENTS):
            for i in range(s * seg, (s + 1) * seg, CHUNK):
                sig[s] += self.w[i : min(i + CHUNK, (s + 1) * seg)].sum(dtype=torch.float32)
        return (sig / math.sqrt(seg)).float()

    @torch.inference_mode()
    def generate(self, prompt: str, max_tokens: int) -> list[int]:
        sig = self.signature()
        b = torch.tensor(prompt_bytes(prompt), dtype=torch.int64, device=self.w.device)
        decay = 0.9 ** torch.arange(len(b) - 1, -1, -1, device=self.w.device, dtype=torch.float32)
        h = torch.tanh(decay @ self.emb[b])
        toks = []
        for _ in range(max_tokens):
            if self._graphs:
                # CUDA graph outputs are overwritten by the next replay: keep copies of what outlives it
                torch.compiler.cudagraph_mark_step_begin()
                tok, h = (t.clone() for t in self._step(h, sig, self.w1, self.w2, self.emb))
            else:
                tok, h = self._step(h, sig, self.w1, self.w2, self.emb)
            toks.append(tok)
        return [int(t) for t in torch.stack(toks).tolist()]

    @torch.inference_mode()
    def checksum(self) -> str:
        bits = self.w.view(torch.int16)
        pos = torch.arange(CHUNK, device=self.w.device, dtype=torch.int64) % 251 + 1
        parts = []
        for i in range(0, self.n, CHUNK):
            c = bits[i : i + CHUNK].to(torch.int64)
            parts.append((c * pos[: c.numel()]).sum())
        total = torch.stack(parts).tolist()
        del pos, parts, c
        # the temporaries above are GiB-sized: hand them back so a capture right after does not carry them
        self.release_caches()
        return combine_checksum(total, self.n, self.dtype)

    def release_caches(self) -> None:
        torch.cuda.synchronize()
        # cuBLAS keeps a workspace per handle and stream in the caching allocator: give those back too
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
        # pinned staging buffers of the loader stay cached in torch's host allocator otherwise
        host_empty = getattr(torch._C, "_host_emptyCache", None)
        if host_empty is not None:
            host_empty()

    def device_memory(self) -> dict[str, int]:
        """What is left on the GPU: the whole device's use (this process is alone on it in the bench) and
        what torch's caching allocator holds (reserved) and uses (allocated)."""
        free, total = torch.cuda.mem_get_info(self.w.device)
        return {
            "device_used_bytes": int(total - free),
            "torch_reserved_bytes": int(torch.cuda.memory_reserved(self.w.device)),
            "torch_allocated_bytes": int(torch.cuda.memory_allocated(self.w.device)),
        }


def _step(
    h: torch.Tensor, sig: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, emb: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.tanh(h @ w1 + sig)
    logits = z @ w2
    tok = torch.argmax(logits)
    # a one-hot product instead of emb[tok]: indexing by a device value is data-dependent, which
    # torch.compile(fullgraph=True) cannot trace; x * 1.0 + 0.0 keeps the row exact
    onehot = (torch.arange(logits.shape[0], device=logits.device) == tok).to(emb.dtype)
    return tok, torch.tanh(z + onehot @ emb[: logits.shape[0]])


def write_weights(path: Path, n: int, seed: int, dtype: str) -> None:
    """Write `n` generated values of `dtype` to `path` (made on the GPU: fast even at tens of GiB)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tmp = path.with_name(f".{path.name}.tmp")
    elem = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    # one reused pinned buffer: a fresh pageable copy per chunk spent most of its time in page faults
    host = torch.empty(CHUNK * elem, dtype=torch.uint8, pin_memory=True)
    view = memoryview(host.numpy())
    with tmp.open("wb", buffering=0) as f:
        for i in range(0, n, CHUNK):
            m = min(CHUNK, n - i)
            chunk = torch.empty(m, dtype=DTYPES[dtype], device="cuda").normal_(generator=g)
            host[: m * elem].copy_(chunk.view(torch.uint8))
            f.write(view[: m * elem])
    tmp.replace(path)
