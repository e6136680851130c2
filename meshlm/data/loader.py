"""Fixed-length training windows from a token stream: deterministic, rank-aware, and resumable across dp sizes.

A split's tokens are one stream (documents separated by eos). Window i is ``tokens[i*T : i*T + T + 1]`` for
``i < n = (len - 1) // T``: inputs are its first T tokens and labels its last T (the next token of each).
Consecutive windows share one token, so every token but the first is a label exactly once per epoch.

The run's global sample g is window ``perm_e[g % n]`` with ``e = g // n`` and ``perm_e`` a permutation of range(n)
drawn from a NumPy PCG64 generator seeded by (seed, e); without shuffling it is window ``g % n``. Global batch b is
samples ``[b*G, (b+1)*G)`` and data-parallel rank r of d takes the contiguous slice ``[r*G/d, (r+1)*G/d)`` of it.
The state is expressed in global samples only, so a run resumed with another dp size reads the same global
batches in the same order.
"""

from __future__ import annotations

import numpy as np
import torch

from meshlm.data.dataset import TokenDataset
from meshlm.errors import DataError

STATE_VERSION = 1


class SequenceLoader:
    """Yields ``{"input_ids", "labels"}`` LongTensors of shape (global_batch_size / dp_size, seq_len)."""

    def __init__(
        self,
        dataset: TokenDataset,
        split: str,
        seq_len: int,
        global_batch_size: int,
        *,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        _check_positive(seq_len=seq_len, global_batch_size=global_batch_size, dp_size=dp_size)
        if global_batch_size % dp_size:
            raise DataError(
                f"global batch size {global_batch_size} is not divisible by the data-parallel size {dp_size}; "
                "choose a global batch size that is a multiple of it"
            )
        if not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank {dp_rank} is outside [0, {dp_size})")
        if not isinstance(seed, int) or seed < 0:
            raise DataError(f"seed {seed!r} is invalid; use a non-negative integer")
        self.split, self.seq_len, self.global_batch_size = split, seq_len, global_batch_size
        self.dp_rank, self.dp_size, self.seed, self.shuffle = dp_rank, dp_size, seed, shuffle
        self.local_batch_size = global_batch_size // dp_size
        self._tokens = dataset.split(split)
        self.num_windows = (len(self._tokens) - 1) // seq_len
        if self.num_windows < 1:
            raise DataError(
                f"split {split!r} of {dataset.path} has {len(self._tokens)} tokens, too few for one window of "
                f"seq_len {seq_len} (needs {seq_len + 1}); lower seq_len or add data"
            )
        self._fingerprint = dataset.fingerprint(split)
        self.samples_consumed = 0  # global samples, all ranks together
        self._permutations: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> int:
        return self.samples_consumed // self.num_windows

    def reset(self) -> None:
        """Back to the first batch (evaluation reads the same batches every time)."""
        self.samples_consumed = 0

    def batch_samples(self, samples_consumed: int | None = None) -> range:
        """The global sample numbers this rank reads in the batch that starts at ``samples_consumed`` (default:
        the next batch); ``window_of`` maps each to the window read. ``meshlm diagnose parity`` proves with these
        that the ranks' shards are disjoint and cover the data."""
        consumed = self.samples_consumed if samples_consumed is None else samples_consumed
        first = consumed + self.dp_rank * self.local_batch_size
        return range(first, first + self.local_batch_size)

    def window_of(self, sample: int) -> int:
        """The window (index into the split's windows) that global sample ``sample`` reads."""
        return self._window(sample)

    def next_batch(self) -> dict[str, torch.Tensor]:
        starts = [self.window_of(g) * self.seq_len for g in self.batch_samples()]
        windows = np.stack([self._tokens.read(s, self.seq_len + 1) for s in starts]).astype(np.int64)  # (B, T + 1)
        self.samples_consumed += self.global_batch_size
        batch = torch.from_numpy(windows)
        return {"input_ids": batch[:, :-1].contiguous(), "labels": batch[:, 1:].contiguous()}  # (B, T) each

    def __iter__(self) -> SequenceLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return self.next_batch()

    def _window(self, sample: int) -> int:
        epoch, position = divmod(sample, self.num_windows)
        if not self.shuffle:
            return position
        if epoch not in self._permutations:
            if len(self._permutations) >= 2:  # a batch spans at most two epochs when G <= n; keep memory flat
                self._permutations.pop(min(self._permutations))
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
            self._permutations[epoch] = rng.permutation(self.num_windows)
        return int(self._permutations[epoch][position])

    # --- checkpointing ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-serialisable state in global terms: independent of dp_rank and dp_size."""
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "order": "shuffled" if self.shuffle else "sequential",
            "seed": self.seed,
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
            "samples_consumed": self.samples_consumed,
            "num_windows": self.num_windows,
            "dataset_fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``, possibly saved under another dp size; the seed is taken from the state."""
        expected = self.state_dict()
        missing = [k for k in expected if k not in state]
        if missing:
            raise DataError(f"loader state lacks {missing}; it was not written by SequenceLoader.state_dict()")
        for key, hint in (
            ("seq_len", "resume with the same seq_len"),
            ("global_batch_size", "resume with the same global batch size (dp size may change)"),
            ("split", "resume on the same split"),
            ("order", "resume with the same shuffle setting"),
            ("num_windows", "the dataset changed since the checkpoint; resume on the same prepared dataset"),
            ("dataset_fingerprint", "the dataset changed since the checkpoint; resume on the same prepared dataset"),
        ):
            if state[key] != expected[key]:
                raise DataError(f"loader state has {key}={state[key]!r} but this loader has {expected[key]!r}; {hint}")
        consumed = state["samples_consumed"]
        if not isinstance(consumed, int) or consumed < 0 or consumed % self.global_batch_size:
            raise DataError(f"loader state has invalid samples_consumed={consumed!r}")
        self.seed = int(state["seed"])
        self.samples_consumed = consumed
        self._permutations.clear()


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise DataError(f"{name} {value!r} is invalid; use a positive integer")
