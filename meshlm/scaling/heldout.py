"""The held-out loss a sweep point is fitted on.

The trainer's own ``eval_loss`` reads ``training.eval_batches`` micro-batches of the ``val`` split, so how many
tokens it covers depends on the point's batch shape. A scaling fit wants every point measured on the *same*
tokens: here the newest checkpoint is loaded on one device and the first ``tokens`` tokens of the val split (whole
windows of ``data.seq_len``, read in order, never shuffled) are scored. ``prepare`` puts whole documents in val
and the training loader reads only the train split, so these tokens were never trained on.
"""

from __future__ import annotations

from pathlib import Path

import torch

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.data import SequenceLoader
from meshlm.errors import DataError
from meshlm.objectives.pretrain import NextTokenObjective
from meshlm.train.trainer import open_training_data

EVAL_BATCH = 16  # sequences per forward pass; the result does not depend on it (losses are summed)


@torch.no_grad()
def heldout_loss(run_dir: str | Path, tokens: int, device: str = "cpu") -> dict:
    """{"loss", "tokens", "step", "tokens_seen"} of the newest checkpoint of ``run_dir`` on the val split."""
    model, cfg, state, ckpt = model_from_checkpoint(run_dir, device)
    dataset = open_training_data(cfg.data, cfg.model.vocab_size, verify=False)
    seq_len = cfg.data.seq_len
    try:
        loader = SequenceLoader(dataset, "val", seq_len, 1, shuffle=False)
    except DataError as exc:
        raise DataError(f"{exc}; the held-out loss needs a val split (prepare the data with a val fraction)") from None
    windows = min(loader.num_windows, max(1, -(-tokens // seq_len)))
    objective = NextTokenObjective()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for start in range(0, windows, EVAL_BATCH):
        batch_size = min(EVAL_BATCH, windows - start)
        loader = SequenceLoader(dataset, "val", seq_len, batch_size, shuffle=False)
        loader.samples_consumed = start  # windows [start, start + batch_size), in order
        batch = {k: v.to(device) for k, v in loader.next_batch().items()}
        total += objective.loss_sum(model, batch).double().cpu()
        count += int(objective.num_loss_tokens(batch))
    return {"loss": float(total / count), "tokens": count, "step": int(state["step"]),
            "tokens_seen": int(state["tokens_seen"]), "checkpoint": str(ckpt)}
