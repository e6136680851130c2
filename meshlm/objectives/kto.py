"""KTO (``training.objective = "dpo"``, ``objective.loss_type = "kto"``; Ethayarajh et al. 2024): unpaired
desirable / undesirable completions, each judged against a reference point z₀ = the policy's KL to the reference
on mismatched (prompt, other completion) pairs. Formula: objectives/losses.py ``kto_loss``.

Data: the preference loader's layout, an item = (the row, its KL row) with a ``desirable`` label
(data/posttrain/encode.py ``encode_unpaired``). The reference point is detached, so it is a number per global
batch: :meth:`next_batch` computes it once, before the step, from the KL rows of the whole global batch (policy
and reference under ``no_grad``, summed over the data-parallel ranks) — the same value whatever the layout or
micro-batch size, where TRL averages per device batch. Held-out batches (read by the trainer directly) compute it
over the held-out micro-batch, summed over ranks. The step's gradient forward then runs on the items' own rows
only. The reference is the frozen model or the precomputed table, as for DPO (its two columns: row, KL row).
"""

from __future__ import annotations

import torch
from torch import nn

from meshlm.objectives.base import ObjectiveContext, pairs_to_rows
from meshlm.objectives.losses import DEFAULT_BETA, SequenceLogps, kto_loss, kto_reference_point
from meshlm.objectives.preference import PreferenceObjective, pair_logps


class KTOObjective(PreferenceObjective):
    name = "dpo"
    data_kind = "unpaired"  # {prompt, completion, label} rows; a preference row gives one item of each label
    config_keys = (*PreferenceObjective.config_keys, "desirable_weight", "undesirable_weight")
    sequences_per_row = 1  # the item's own row trains; its KL row runs forward only

    def num_positions(self, batch: dict[str, torch.Tensor]) -> int:
        """The items' own rows: the (B, 2, T) batch's KL rows run forward only (counted in frozen_forwards)."""
        return batch["input_ids"].numel() // 2

    @property
    def frozen_forwards(self) -> int:
        """The policy's forward of the KL row, and the reference's of both rows unless precomputed."""
        return 1 + (2 if self.needs_reference and self.cfg.reference == "model" else 0)

    def setup(self, ctx: ObjectiveContext) -> None:
        self.engine, self.policy, self.autocast = ctx.engine, ctx.model_parts[0], ctx.autocast
        tc = ctx.cfg.training
        self.chunk = tc.micro_batch_size or max(1, tc.batch_size // ctx.engine.dp_size)  # KL rows per forward
        super().setup(ctx)

    def next_batch(self, loader) -> dict[str, torch.Tensor]:
        batch = {k: v.to(self.engine.device) for k, v in loader.next_batch().items()}  # pair-major (B, 2, ...)
        z0 = self._reference_point(pairs_to_rows(batch), self.policy)
        batch["kto_kl"] = z0.expand(batch["input_ids"].shape[0], 2).contiguous()  # sliced with the micro-batches
        return batch

    @torch.no_grad()
    def _reference_point(self, rows: dict[str, torch.Tensor], model: nn.Module) -> torch.Tensor:
        """z₀ over the KL rows (the second half of ``rows``) of every rank: max(0, global mean log-ratio)."""
        n = rows["input_ids"].shape[0] // 2
        kl_rows = {k: v[n:] for k, v in rows.items()}
        total = torch.zeros((), dtype=torch.float64, device=rows["input_ids"].device)
        count = torch.zeros((), dtype=torch.float64, device=total.device)
        for start in range(0, n, self.chunk):
            part = {k: v[start:start + self.chunk] for k, v in kl_rows.items()}
            with self.autocast():
                policy = pair_logps(model, part).sum
                reference = self._side_logps(part, policy, column=1)
            s, c = kto_reference_point(policy, reference)
            total, count = total + s.double(), count + c.double()
        both = self.engine.dp_sum(torch.stack([total, count]))
        return (both[0] / both[1].clamp(min=1)).clamp(min=0).float()

    def _side_logps(self, rows: dict[str, torch.Tensor], policy: torch.Tensor, column: int) -> torch.Tensor:
        """Reference sums of ``rows``: the table's ``column`` (0 the item's row, 1 its KL row) or the model."""
        if self.reference_table is not None:
            return self.reference_table[rows["index"], column]
        assert self.reference is not None, "setup() builds the reference"
        return pair_logps(self.reference, rows).sum

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = pairs_to_rows(batch)
        n = rows["input_ids"].shape[0] // 2
        z0 = batch["kto_kl"][0, 0] if "kto_kl" in batch else self._reference_point(rows, model)
        own = {k: v[:n] for k, v in rows.items()}
        policy = pair_logps(model, own)
        with torch.no_grad():
            reference = self._side_logps(own, policy.sum, column=0)
        cfg = self.cfg
        out = kto_loss(policy.sum, reference, own["desirable"], z0, beta=cfg.beta or DEFAULT_BETA["kto"],
                       desirable_weight=cfg.desirable_weight, undesirable_weight=cfg.undesirable_weight)
        self._record_kto(out, policy, z0, "" if model.training else "eval_")
        return out.losses.sum()

    def _record_kto(self, out, policy: SequenceLogps, z0: torch.Tensor, prefix: str) -> None:
        """TRL's KTO names: rewards/chosen (desirable items), rewards/rejected (undesirable), kl (z₀)."""
        good = out.desirable
        logps = policy.sum.detach()
        terms = {"rewards/chosen": out.rewards[good], "rewards/rejected": out.rewards[~good],
                 "logps/chosen": logps[good], "logps/rejected": logps[~good], "kl": z0.reshape(1)}
        for name, values in terms.items():
            self._metrics.add(prefix + name, values)
