"""The DPO family (``training.objective = "dpo"``): sigmoid (DPO / cDPO), ipo, hinge, and the reference-free
simpo and orpo (formulas in objectives/losses.py and docs/post-training.md).

One forward of the policy on the 2B rows of a pair batch (chosen first) gives both sides' log-probs, summed over
the response tokens (its eos included). The reference log-probs come from either

- ``objective.reference = "model"``: a frozen copy of the starting weights (``checkpoint.init_from``, or the
  seeded initialisation), laid out like the policy (FSDP2-sharded the same way), run under ``no_grad``; or
- ``"precomputed"``: the same copy run once over every train and held-out pair in :meth:`setup`, kept as a
  (num_pairs, 2) table on the device and then freed — the table replaces the model's memory.

With ``objective.rpo_alpha = α > 0`` each pair's loss adds α times the chosen response's NLL per token (RPO, Pang et
al. 2024): the pair loss only asks the chosen side to beat the rejected one, and on a small model it does so
mostly by pushing both down — a refusal template rejected on warn prompts becomes unlikely on harmful ones too.

The loss is per pair, so ``num_loss_tokens`` is the number of pairs: the trainer divides the summed loss by the
global count. Metrics carry TRL's names (rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies,
``eval_`` prefixed on held-out pairs) plus logps/chosen and logps/rejected.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.objectives.base import MetricSums, Objective, ObjectiveContext, pairs_to_rows
from meshlm.objectives.losses import (
    REFERENCE_FREE,
    SequenceLogps,
    preference_loss,
    preference_metrics,
    sequence_logps,
    split_pairs,
)

PRECOMPUTE_PAIRS = 8  # pairs per reference forward while precomputing


def pair_logps(model: nn.Module, rows: dict[str, torch.Tensor]) -> SequenceLogps:
    """Summed response log-probs of a (2B, T) batch; right padding needs no mask under causal attention."""
    logits = model(rows["input_ids"])  # (2B, T, V)
    if isinstance(logits, DTensor):  # vocabulary-sharded under tensor parallelism: gather to compute log-probs
        logits = logits.full_tensor()
    return sequence_logps(logits, rows["labels"])


class PreferenceObjective(Objective):
    name = "dpo"
    data_kind = "preference"
    config_keys = ("beta", "loss_type", "label_smoothing", "simpo_gamma", "ipo_normalize", "rpo_alpha", "reference",
                   "eval_fraction")

    @classmethod
    def configured(cls, cfg: ObjectiveConfig) -> Objective:
        """The family's unpaired member, KTO, for ``loss_type = "kto"``: its own data and reference point."""
        if cfg.loss_type == "kto" and cls is PreferenceObjective:
            from meshlm.objectives.kto import KTOObjective  # kto.py subclasses this class: a real cycle

            return KTOObjective(cfg)
        return cls(cfg)

    def __init__(self, cfg: ObjectiveConfig | None = None) -> None:
        super().__init__(cfg)
        self.reference: nn.Module | None = None
        self.reference_table: torch.Tensor | None = None  # (num_pairs, 2) summed ref log-probs (chosen, rejected)
        self._metrics = MetricSums()

    sequences_per_row = 2  # chosen and rejected

    @property
    def needs_reference(self) -> bool:
        return self.cfg.loss_type not in REFERENCE_FREE

    @property
    def frozen_forwards(self) -> int:
        """The reference model's forward of each sequence (none when its log-probs are precomputed)."""
        return 1 if self.needs_reference and self.cfg.reference == "model" else 0

    def setup(self, ctx: ObjectiveContext) -> None:
        if not self.needs_reference:
            return
        (reference,) = ctx.build_frozen(None)  # the policy's starting weights
        if self.cfg.reference == "model":
            self.reference = reference
            return
        with ctx.autocast():  # as the training forwards run
            self.reference_table = self._precompute(reference, [ctx.train_loader, ctx.eval_loader], ctx.device)
        del reference  # only the table stays

    @torch.no_grad()
    def _precompute(self, reference: nn.Module, loaders: list, device: torch.device) -> torch.Tensor:
        """Reference log-prob sums of every pair of ``loaders`` (each rank computes them all: same forwards on
        every rank, as a sharded reference needs)."""
        loaders = [x for x in loaders if x is not None]
        table = torch.zeros(sum(x.num_pairs for x in loaders), 2, dtype=torch.float32, device=device)
        for loader in loaders:
            for batch in loader.every_pair(PRECOMPUTE_PAIRS):
                rows = pairs_to_rows({k: v.to(device) for k, v in batch.items()})
                chosen, rejected = split_pairs(pair_logps(reference, rows).sum)
                index = split_pairs(rows["index"])[0]
                table[index] = torch.stack([chosen, rejected], dim=1)
        return table

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor(batch["input_ids"].shape[0], device=batch["input_ids"].device)  # pairs

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = pairs_to_rows(batch)
        policy = pair_logps(model, rows)
        reference = self._reference_logps(rows, policy) if self.needs_reference else None
        beta = self.cfg.beta or None  # 0 = the loss type's default
        out = preference_loss(self.cfg.loss_type, policy, reference, beta=beta,
                              label_smoothing=self.cfg.label_smoothing, simpo_gamma=self.cfg.simpo_gamma,
                              ipo_normalize=self.cfg.ipo_normalize)
        self._record(out, policy, "" if model.training else "eval_")
        if not self.cfg.rpo_alpha:
            return out.losses.sum()
        chosen_nll = -split_pairs(policy.mean)[0]  # per token, so long and short chosen responses weigh alike
        self._metrics.add(("" if model.training else "eval_") + "nll/chosen", chosen_nll.detach())
        return (out.losses + self.cfg.rpo_alpha * chosen_nll).sum()

    def _record(self, out, policy: SequenceLogps, prefix: str) -> None:
        """TRL's metric names (+ the policy's summed log-probs), accumulated until the trainer reads them."""
        logps_chosen, logps_rejected = split_pairs(policy.sum.detach())
        terms = {**preference_metrics(out), "logps/chosen": logps_chosen, "logps/rejected": logps_rejected}
        for name, values in terms.items():
            self._metrics.add(prefix + name, values)

    @torch.no_grad()
    def _reference_logps(self, rows: dict[str, torch.Tensor], policy: SequenceLogps) -> SequenceLogps:
        if self.reference_table is not None:
            chosen_index = split_pairs(rows["index"])[0]
            sums = self.reference_table[chosen_index].t().reshape(-1)  # (2B,) chosen first
            return SequenceLogps(sums, policy.count)
        assert self.reference is not None, "setup() builds the reference"
        return pair_logps(self.reference, rows)

    def metrics(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self._metrics.pop()
