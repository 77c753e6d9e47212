"""The demo model's promise: answers are a function of the prompt and of every weight."""

from __future__ import annotations

import numpy as np
import pytest

from podsnap.demo._model import VOCAB, NumpyModel, detokenize, element_count

PROMPTS = ("hello", "What is a snapshot?", "Tell me about GPUs.", "1 2 3", "restore me")


@pytest.fixture(scope="module")
def weights() -> np.ndarray:
    return NumpyModel.generated(element_count(2 / 1024), seed=3).w


def test_generation_is_greedy_and_repeatable(weights: np.ndarray) -> None:
    m = NumpyModel(weights.copy())
    first = [m.generate(p, 12) for p in PROMPTS]
    assert first == [m.generate(p, 12) for p in PROMPTS]
    assert all(0 <= t < len(VOCAB) for toks in first for t in toks)
    assert detokenize(first[0]).split() == [VOCAB[t] for t in first[0]]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_every_weight_feeds_the_signature_and_the_checksum(weights: np.ndarray, where: str) -> None:
    base = NumpyModel(weights.copy())
    pos = {"first": 0, "middle": weights.size // 2, "last": weights.size - 1}[where]
    bent = weights.copy()
    bent[pos] = np.float16(bent[pos] + np.float16(4.0))
    other = NumpyModel(bent)
    assert not np.array_equal(base.signature(), other.signature())
    assert base.checksum() != other.checksum()


def test_a_single_bit_flip_changes_the_checksum(weights: np.ndarray) -> None:
    flipped = weights.copy()
    flipped.view(np.uint16)[12345] ^= 1
    assert NumpyModel(weights.copy()).checksum() != NumpyModel(flipped).checksum()


def test_a_restore_that_loses_the_tail_of_the_weights_gives_other_answers(weights: np.ndarray) -> None:
    base = NumpyModel(weights.copy())
    truncated = weights.copy()
    truncated[-weights.size // 64 :] = 0  # the last segment never came back
    lossy = NumpyModel(truncated)
    assert [base.generate(p, 16) for p in PROMPTS] != [lossy.generate(p, 16) for p in PROMPTS]


def test_sizes_are_rounded_and_tiny_ones_refused() -> None:
    assert element_count(1) == (1 << 30) // 2
    with pytest.raises(ValueError, match="too small"):
        element_count(1e-6)
