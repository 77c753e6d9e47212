"""The demo "model": a large weight vector plus a tiny greedy network whose answers depend on all of it.

The weights are one flat vector of `n` float16/bfloat16 values. Every request first reduces ALL of
them into a 64-value signature (a float32 sum per contiguous segment), which biases a tiny recurrent
MLP (embedding, hidden and output matrices cut from the start of the same vector). Decoding is
greedy, so the answer is a function of the prompt and the weights only: a restore that corrupts any
weight changes the signature, and with it the answer. `checksum()` is an exact, position-weighted
digest of the raw bits, for bit-exact comparisons.

The numpy backend is here; the torch backend (`_torch_model`) is imported only for `--device cuda`,
so a CPU worker never loads torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from podsnap.workload import FileSource, Weights

HIDDEN = 64
SEGMENTS = 64
#: the words the network "speaks" (HIDDEN of them); index = token id
_WORDS = """
the a of to and in is it that for on with as was at by this be are from or an have not but they which one you were all we
her she there would their will when who him been has more if no out do so can what up said about other into than its time only could new them man
"""
VOCAB: tuple[str, ...] = tuple(_WORDS.split())
#: elements per chunk when streaming over the weights (keeps temporaries small)
CHUNK = 1 << 26
assert len(VOCAB) == HIDDEN
#: weight counts are rounded to this, so the vector splits evenly into segments and chunks
ALIGN = SEGMENTS * 4096


def element_count(weights_gib: float) -> int:
    n = int(weights_gib * (1 << 30)) // 2
    n -= n % ALIGN
    minimum = ALIGN * 2
    if n < minimum:
        raise ValueError(f"--weights-gib {weights_gib:g} is too small: at least {minimum * 2 / (1 << 20):g} MiB")
    return n


def prompt_bytes(prompt: str) -> list[int]:
    return list(prompt.encode("utf-8")[-4096:]) or [0]


def detokenize(tokens: Sequence[int]) -> str:
    return " ".join(VOCAB[t] for t in tokens)


def combine_checksum(parts: Sequence[int], n: int, dtype: str) -> str:
    h = hashlib.sha256(f"{dtype}:{n}:".encode())
    for p in parts:
        h.update(int(p).to_bytes(16, "little", signed=True))
    return h.hexdigest()[:32]


class Model(Protocol):
    device: str
    dtype: str
    n: int

    @property
    def nbytes(self) -> int: ...

    def generate(self, prompt: str, max_tokens: int) -> list[int]: ...

    def checksum(self) -> str: ...

    def release_caches(self) -> None: ...

    def device_memory(self) -> dict[str, int]: ...

    def adopt(self, weights: Weights, source: FileSource | None) -> None: ...


class NumpyModel:
    """CPU backend: float16 weights in host memory, float32 math."""

    device = "cpu"

    def __init__(self, weights: np.ndarray, dtype: str = "float16") -> None:
        if weights.dtype != np.float16 or weights.ndim != 1:
            raise ValueError("NumpyModel needs a flat float16 vector")
        self.w = weights
        self.dtype = dtype
        self.n = int(weights.size)
        head = weights[: 256 * HIDDEN + 2 * HIDDEN * HIDDEN].astype(np.float32)
        self.emb = head[: 256 * HIDDEN].reshape(256, HIDDEN)
        rest = head[256 * HIDDEN :]
        self.w1 = rest[: HIDDEN * HIDDEN].reshape(HIDDEN, HIDDEN) / np.sqrt(HIDDEN)
        self.w2 = rest[HIDDEN * HIDDEN :].reshape(HIDDEN, HIDDEN)[:, : len(VOCAB)] / np.sqrt(HIDDEN)

    @classmethod
    def generated(cls, n: int, seed: int) -> NumpyModel:
        rng = np.random.default_rng(seed)
        w = np.empty(n, dtype=np.float16)
        for i in range(0, n, CHUNK):
            m = min(CHUNK, n - i)
            w[i : i + m] = rng.standard_normal(m, dtype=np.float32)
        return cls(w)

    @classmethod
    def from_file(cls, path: Path, n: int) -> NumpyModel:
        w = np.empty(n, dtype=np.float16)
        with path.open("rb") as f:
            got = f.readinto(w.view(np.uint8).data)
        if got != w.nbytes:
            raise ValueError(f"--weights-file {path}: holds {got} bytes, {w.nbytes} needed for --weights-gib")
        return cls(w)

    @property
    def nbytes(self) -> int:
        return int(self.w.nbytes)

    def signature(self) -> np.ndarray:
        seg = self.n // SEGMENTS
        sig = np.empty(SEGMENTS, dtype=np.float32)
        for s in range(SEGMENTS):
            total = np.float64(0.0)
            for i in range(s * seg, (s + 1) * seg, CHUNK):
                total += self.w[i : min(i + CHUNK, (s + 1) * seg)].sum(dtype=np.float32)
            sig[s] = total
        return sig / np.float32(np.sqrt(seg))

    def generate(self, prompt: str, max_tokens: int) -> list[int]:
        sig = self.signature()
        b = np.array(prompt_bytes(prompt), dtype=np.int64)
        decay = (0.9 ** np.arange(len(b) - 1, -1, -1)).astype(np.float32)
        h = np.tanh(decay @ self.emb[b])
        out = []
        for _ in range(max_tokens):
            z = np.tanh(h @ self.w1 + sig)
            tok = int(np.argmax(z @ self.w2))
            out.append(tok)
            h = np.tanh(z + self.emb[tok])
        return out

    def checksum(self) -> str:
        # exact digest of the raw bits (the GPU backend sums them on the device instead: no 32 GiB copy)
        return hashlib.sha256(self.w.view(np.uint8).data).hexdigest()[:32]

    def release_caches(self) -> None:
        pass

    def device_memory(self) -> dict[str, int]:
        return {}

    def adopt(self, weights: Weights, source: FileSource | None) -> None:
        """Hand every array the answers depend on to the SDK (the derived ones are kept as host copies)."""
        self.w = weights.adopt("weights", self.w, source=source)
        self.emb = weights.adopt("emb", self.emb)
        self.w1 = weights.adopt("w1", self.w1)
        self.w2 = weights.adopt("w2", self.w2)
