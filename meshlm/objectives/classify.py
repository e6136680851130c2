"""Sequence classification: a class head on the decoder, read at each input's last real token, cross-entropy.

As the reward model (reward.py), ``adapt_model`` replaces the vocabulary head ``output`` (V outputs) by a linear
head (untied from the embedding, with a bias) before parallelism, here with one output per class of
``objective.classes``; the logits of an input are that head's outputs at position ``length − 1`` (right padding:
its eos). The data are labelled rows ``{"prompt", "response", "label"}`` (data/posttrain/labelled.py: plain
``User: … / Assistant: …`` text, the prompt's end and the response's start and end kept). Loss: the cross-entropy
summed over the batch's inputs; the trainer divides by the global number of inputs. Metric: ``accuracy``
(``eval_accuracy`` on held-out rows). ``checkpoint.init_from`` loads every weight but the head, which starts
fresh (normal(0, init_std), bias 0). The safety classifiers (safety/classifier.py: the trained judge, the guard)
train through it with the classes refuse / warn / answer. So does the encoder judge (safety/encoder_judge.py),
whose model is no decoder: it gives the Trainer its built encoder and class head, and batches of tokenized
(prompt, response) pairs that the model pools and classifies itself (:func:`class_logits`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.errors import ConfigError
from meshlm.objectives.base import MetricSums, Objective
from meshlm.objectives.reward import replace_head


def add_class_head(model: nn.Module, num_classes: int) -> None:
    """Replace ``output`` (dim -> V) by an untied (dim -> num_classes) head with a bias; on the meta model before
    parallelism, or on a built one (loading a saved classifier)."""
    replace_head(model, num_classes, bias=True)


def last_token_logits(model: nn.Module, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T) right-padded ids, (B,) lengths -> (B, C) fp32 class logits at each input's last real token."""
    out = model(input_ids)  # (B, T, C)
    return out[torch.arange(input_ids.shape[0], device=out.device), lengths - 1].float()  # (B, C)


def class_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, C) fp32 class logits of a batch: a decoder's at each input's last real token (``input_ids``,
    ``lengths``), or an encoder pair classifier's (``input_ids``, ``mask``, ``type_ids``: the model pools and
    classifies; data/posttrain/labelled.py :class:`PairLoader`)."""
    if "type_ids" in batch:
        return model(batch["input_ids"], batch["mask"], batch["type_ids"]).float()
    return last_token_logits(model, batch["input_ids"], batch["lengths"])


class ClassifyObjective(Objective):
    name = "classify"
    data_kind = "labelled"
    config_keys = ("classes", "prompt_tokens", "eval_fraction")
    new_modules = ("output",)  # the class head: trained even under LoRA (it is not in the base checkpoint)

    def __init__(self, cfg: ObjectiveConfig | None = None) -> None:
        super().__init__(cfg)
        if len(self.cfg.classes) < 2:
            raise ConfigError(f"training.objective = 'classify' needs objective.classes, at least two class names "
                              f"(e.g. [\"refuse\", \"warn\", \"answer\"]); got {self.cfg.classes}")
        self._metrics = MetricSums()

    def adapt_model(self, model: nn.Module) -> None:
        add_class_head(model, len(self.cfg.classes))

    def init_from_keep(self, key: str) -> bool:
        return not key.startswith("output.")  # a vocabulary head (or another run's classes) is not this head

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor(batch["input_ids"].shape[0], device=batch["input_ids"].device)  # inputs

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = class_logits(model, batch)  # (B, C)
        prefix = "" if model.training else "eval_"
        self._metrics.add(prefix + "accuracy", (logits.argmax(-1) == batch["class_ids"]).float())
        return F.cross_entropy(logits, batch["class_ids"], reduction="sum")

    def metrics(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self._metrics.pop()
