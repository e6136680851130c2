"""Fixed-length sequences from encoded rows: packed several to a sequence, or one per sequence (padded).

A row of n tokens takes n positions: ``input_ids`` are its tokens, ``labels[t]`` is token t+1 where that token
is a loss token and IGNORE_INDEX (-100) elsewhere, the row's last position included (nothing follows it inside
the row, so no label crosses into the next row). ``position_ids`` restart at 0 for every row and
``document_ids`` number the rows of a sequence 0, 1, 2, ...; the padding after them is one more document
(positions from 0, labels -100). A model that attends only within a document (block-diagonal causal mask) and
rotates by ``position_ids`` therefore computes on a packed sequence exactly what it computes on each row alone.

Packing is best-fit decreasing: rows by decreasing length (ties by index), each into the fullest sequence that
still has room, else a new one. It depends only on the row lengths, so it is deterministic.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from meshlm.data.posttrain.templates import Encoded
from meshlm.errors import DataError
from meshlm.models.head import IGNORE_INDEX

SEQUENCE_KEYS = ("input_ids", "labels", "position_ids", "document_ids")


def row_labels(enc: Encoded) -> np.ndarray:
    """Next-token labels of one row, IGNORE_INDEX where the next token is not a loss token. (n,)"""
    ids = np.asarray(enc.ids, dtype=np.int64)
    mask = np.asarray(enc.loss_mask, dtype=bool)
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = np.where(mask[1:], ids[1:], IGNORE_INDEX)
    return labels


def plan_packing(lengths: Sequence[int], seq_len: int) -> list[list[int]]:
    """Row indices per sequence (best-fit decreasing); every length must be in [1, seq_len]."""
    too_long = [i for i, n in enumerate(lengths) if not 0 < n <= seq_len]
    if too_long:
        raise DataError(f"row {too_long[0]} has {lengths[too_long[0]]} tokens, which does not fit seq_len {seq_len}; "
                        "truncate rows to seq_len before packing")
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (room left, sequence index)
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        n = lengths[i]
        at = bisect.bisect_left(free, (n, -1))  # the sequence with the least room that still fits n
        if at < len(free):
            room, b = free.pop(at)
        else:
            room, b = seq_len, len(bins)
            bins.append([])
        bins[b].append(i)
        if room - n > 0:
            bisect.insort(free, (room - n, b))
    return bins


def plan_padded(num_rows: int) -> list[list[int]]:
    """One row per sequence, in row order."""
    return [[i] for i in range(num_rows)]


def build_sequence(examples: Sequence[Encoded], rows: Sequence[int], seq_len: int, pad_id: int) -> dict[str,
                                                                                                        np.ndarray]:
    """One sequence of ``seq_len`` positions holding ``rows`` in order, then padding. Arrays of shape (T,)."""
    out = {
        "input_ids": np.full(seq_len, pad_id, dtype=np.int64),
        "labels": np.full(seq_len, IGNORE_INDEX, dtype=np.int64),
        "position_ids": np.zeros(seq_len, dtype=np.int64),
        "document_ids": np.zeros(seq_len, dtype=np.int64),
    }
    start = 0
    for doc, r in enumerate(rows):
        n = len(examples[r].ids)
        assert start + n <= seq_len, "rows overflow the sequence"
        out["input_ids"][start : start + n] = examples[r].ids
        out["labels"][start : start + n] = row_labels(examples[r])
        out["position_ids"][start : start + n] = np.arange(n)
        out["document_ids"][start : start + n] = doc
        start += n
    out["position_ids"][start:] = np.arange(seq_len - start)  # padding: a document of its own
    out["document_ids"][start:] = len(rows)
    return out


def stack_sequences(examples: Sequence[Encoded], bins: Sequence[Sequence[int]], seq_len: int,
                    pad_id: int) -> dict[str, np.ndarray]:
    """Several sequences as (B, T) arrays."""
    seqs = [build_sequence(examples, rows, seq_len, pad_id) for rows in bins]
    return {k: np.stack([s[k] for s in seqs]) for k in SEQUENCE_KEYS}
