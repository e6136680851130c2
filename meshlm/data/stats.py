"""Corpus statistics used as baselines for training curves."""

from __future__ import annotations

import numpy as np

from meshlm.data.dataset import TokenDataset

_BLOCK_TOKENS = 1 << 24  # bounds the temporary int64 copy np.bincount makes


def unigram_counts(dataset: TokenDataset, split: str = "train") -> np.ndarray:
    """(vocab_size,) int64 count of every token id in ``split`` (eos included)."""
    counts = np.zeros(dataset.vocab_size, dtype=np.int64)
    for shard in dataset.split(split).shards:
        for start in range(0, len(shard), _BLOCK_TOKENS):
            counts += np.bincount(shard[start : start + _BLOCK_TOKENS], minlength=dataset.vocab_size)
    return counts


def unigram_entropy(dataset: TokenDataset, split: str = "train") -> float:
    """Entropy of the split's token frequencies, in nats/token.

    This is the cross-entropy of the best context-free predictor of that split (predict every token with its
    frequency), so a language model whose loss is not clearly below it has learnt nothing from context.
    """
    counts = unigram_counts(dataset, split)
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())
