"""Reward modelling (Bradley–Terry): a scalar score head on the decoder, read at each sequence's last real token.

``adapt_model`` replaces the vocabulary head ``output`` (V outputs) by a 1-output linear head (untied from the
embedding) before parallelism; the score of a sequence is that head's value at position ``length − 1`` (right
padding: the last token that is not padding, the eos of the response). Loss per pair (losses.py):
``−log σ(r⁺ − r⁻ − m) + c·(r⁺ + r⁻)²``; the trainer divides the summed loss by the global number of pairs.
Metrics: ``accuracy`` (r⁺ > r⁻) and ``margin`` (mean r⁺ − r⁻), ``eval_accuracy`` / ``eval_margin`` on
held-out pairs.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.objectives.base import MetricSums, Objective, pairs_to_rows
from meshlm.objectives.losses import bradley_terry_loss, last_token_scores, split_pairs


def replace_head(model: nn.Module, outputs: int, bias: bool) -> None:
    """Replace ``output`` (dim -> V) by an untied (dim -> outputs) head, on ``output``'s device and dtype (the meta
    model before parallelism, or a built one)."""
    model.cfg = dataclasses.replace(model.cfg, tie_embeddings=False)  # tie_weights() must not restore the V head
    weight = model.output.weight
    model.output = nn.Linear(model.cfg.dim, outputs, bias=bias, device=weight.device, dtype=weight.dtype)


def add_score_head(model: nn.Module) -> None:
    """Replace ``output`` by an untied (dim -> 1) head without a bias; on the meta model, before parallelism."""
    replace_head(model, 1, bias=False)


def sequence_scores(model: nn.Module, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """(2B,) fp32 scores of a (2B, T) batch at each row's last real token."""
    values = model(rows["input_ids"]).squeeze(-1).float()  # (2B, T)
    return last_token_scores(values, rows["lengths"])


class RewardObjective(Objective):
    name = "reward"
    data_kind = "preference"
    config_keys = ("reward_margin", "reward_center_coef", "eval_fraction")
    new_modules = ("output",)  # the score head: trained even under LoRA (it is not in the base checkpoint)

    def __init__(self, cfg: ObjectiveConfig | None = None) -> None:
        super().__init__(cfg)
        self._metrics = MetricSums()

    def adapt_model(self, model: nn.Module) -> None:
        add_score_head(model)

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor(batch["input_ids"].shape[0], device=batch["input_ids"].device)  # pairs

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        chosen, rejected = split_pairs(sequence_scores(model, pairs_to_rows(batch)))  # (B,) each
        losses = bradley_terry_loss(chosen, rejected, self.cfg.reward_margin or None,
                                    self.cfg.reward_center_coef or None)
        prefix = "" if model.training else "eval_"
        self._metrics.add(prefix + "accuracy", (chosen > rejected).float())
        self._metrics.add(prefix + "margin", chosen - rejected)
        self._metrics.add(prefix + "rewards/chosen", chosen)
        self._metrics.add(prefix + "rewards/rejected", rejected)
        return losses.sum()

    def metrics(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self._metrics.pop()
