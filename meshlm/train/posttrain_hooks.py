"""The trainer's side of the objective interface (objectives/base.py), kept out of trainer.py so that the
trainer stays objective-agnostic: it calls these hooks, each a no-op for pretraining (the defaults of
:class:`meshlm.objectives.base.Objective`).

- ``data``: for ``data_kind`` other than "tokens", the tokenizer and JSONL loaders (train/data_setup.py).
- ``adapt_meta_model``: the objective's change to the architecture, then LoRA, on the meta model.
- ``before_weights``: a LoRA run loads its frozen base from ``checkpoint.init_from`` (resumed or not).
- ``setup``: ``objective.setup(ObjectiveContext)`` — e.g. the DPO reference, built by :func:`build_frozen`.
- ``next_batch``, ``metrics`` (reduced over data-parallel ranks), ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from meshlm.checkpoint.load import load_lora_base
from meshlm.config.schema import JobConfig
from meshlm.models.build import adapt_meta_model
from meshlm.objectives.base import Objective, ObjectiveContext
from meshlm.train.data_setup import PostTrainData, open_posttrain_data
from meshlm.train.model_setup import build_frozen
from meshlm.train.precision import autocast


class ObjectiveHooks:
    def __init__(self, objective: Objective, cfg: JobConfig, engine, micro_batch: int,
                 data: PostTrainData | None = None) -> None:
        """``data``: the caller's own (Trainer's ``data``), else opened from ``data.path`` for the data kind."""
        self.objective, self.cfg, self.engine = objective, cfg, engine
        self.data_kind = objective.data_kind
        self.data: PostTrainData | None = data
        if data is None and self.data_kind != "tokens":
            self.data = open_posttrain_data(cfg, self.data_kind, engine.dp_rank, engine.dp_size, micro_batch)
        self.lora_base: str | None = None

    def adapt_meta_model(self, model: nn.Module) -> None:
        adapt_meta_model(model, self.objective, self.cfg.lora)

    def before_weights(self, parts: list[nn.Module], say: Callable[[str], None]) -> None:
        if self.cfg.lora.enabled:
            self.lora_base = str(load_lora_base(self.cfg, parts))
            say(f"LoRA: frozen base loaded from {self.lora_base}")

    def setup(self, parts: list[nn.Module], train_loader: Any, eval_loader: Any) -> None:
        ctx = ObjectiveContext(
            cfg=self.cfg, engine=self.engine, device=self.engine.device,
            tokenizer=self.data.tokenizer if self.data is not None else None, model_parts=parts,
            build_frozen=lambda checkpoint=None, adapt=None: build_frozen(self.cfg, self.engine, self.objective,
                                                                         checkpoint, adapt),
            train_loader=train_loader, eval_loader=eval_loader,
            autocast=lambda: autocast(self.cfg.training.precision, self.engine.device.type))
        self.objective.setup(ctx)

    def next_batch(self, loader: Any) -> dict[str, torch.Tensor]:
        return self.objective.next_batch(loader)

    def metrics(self) -> dict[str, torch.Tensor]:
        """name -> sum / count over every data-parallel rank (0-dim device tensors; read at the log step)."""
        out = {}
        for name, (total, count) in sorted(self.objective.metrics().items()):
            # One all-reduce per metric pair; a handful of scalars at log steps only.
            both = self.engine.dp_sum(torch.stack([total.double(), count.double()]))
            out[name] = both[0] / both[1].clamp(min=1)
        return out

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.lora_base is not None:
            state["lora_base"] = self.lora_base
        own = self.objective.state_dict()
        if own is not None:
            state["objective"] = own
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "objective" in state:
            self.objective.load_state_dict(state["objective"])
