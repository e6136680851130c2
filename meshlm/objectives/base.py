"""The objective interface."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch
from torch import nn

# a label to skip: one constant for the model's head (which computes the loss) and every objective
from meshlm.models.head import IGNORE_INDEX  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from meshlm.config.schema import JobConfig
    from meshlm.distributed.engine import Engine
    from meshlm.tokenizer import MeshTokenizer



class Objective(Protocol):
    """Turns a batch into a summed loss; the trainer normalises by the global count of loss tokens.

    Returning a *sum* (not a mean) lets the trainer divide by the token count of the whole global batch, so
    gradient accumulation and data parallelism give exactly the gradient of one big batch.
    """

    name: str

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | int:
        """How many targets in ``batch`` contribute to the loss: preferably a 0-dim tensor on the batch's device,
        so that the trainer can scale the loss by the global count without a host synchronisation."""
        ...

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of per-token losses over ``batch`` (fp32 scalar)."""
        ...

    # Optional hooks (the trainer looks them up with getattr; see docs/post-training.md):
    #   data_kind: str                      "tokens" (prepared shards, the default) | "sft" | "preference" | "prompt"
    #   adapt_model(model) -> None          on the META model, before LoRA and parallelism (e.g. a score head)
    #   setup(ctx: ObjectiveContext)        once, after the policy is parallelised, materialised and initialised
    #   next_batch(loader) -> batch         called instead of loader.next_batch() (rollouts happen here)
    #   metrics() -> {name: (sum, count)}   0-dim tensors accumulated since the last call; the trainer sums both
    #                                       over data-parallel ranks at log steps and logs sum / count as `name`
    #   state_dict() / load_state_dict(d)   JSON-able state kept in the checkpoint's train_state.json
    #
    # Pipeline parallelism runs the model stage by stage, so the loss must be a function of the last stage's
    # output and the labels: objectives that support pp > 1 also define
    #     loss_from_logits(logits: Tensor (B, T, V), labels: Tensor (B, T)) -> Tensor  (summed, fp32)


@dataclass
class ObjectiveContext:
    """What :meth:`setup` receives. ``build_frozen(checkpoint, adapt)`` builds a model from a checkpoint's own
    config, laid out like the policy (same mesh; sharded under FSDP2, replicated under DDP), with its weights
    loaded, ``requires_grad`` off and in eval mode; ``checkpoint=None`` means the policy's own starting weights
    (``checkpoint.init_from``, or the seeded initialisation when there is none). ``adapt(model)`` runs on the
    meta model after the checkpoint's own objective adapted it (e.g. PPO adds a value head)."""

    cfg: JobConfig
    engine: Engine
    device: torch.device
    tokenizer: MeshTokenizer | None
    model_parts: list[nn.Module]
    build_frozen: Callable[..., list[nn.Module]]
    train_loader: Any = None
    eval_loader: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class MetricSums:
    """Named (sum, count) accumulators on the device, for an objective's :meth:`metrics`."""

    def __init__(self) -> None:
        self._sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def add(self, name: str, values: torch.Tensor) -> None:
        """Adds the sum and the number of elements of ``values`` (detached, float64) under ``name``."""
        values = values.detach().double()
        total = values.sum()
        count = torch.tensor(float(values.numel()), dtype=torch.float64, device=values.device)
        if name in self._sums:
            old_sum, old_count = self._sums[name]
            total, count = old_sum + total, old_count + count
        self._sums[name] = (total, count)

    def pop(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        out, self._sums = self._sums, {}
        return out


def pairs_to_rows(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A pair-major preference batch (B, 2, ...) -> (2B, ...) with the B chosen rows first, then their B rejected
    ones (the layout of objectives/losses.py). The trainer slices micro-batches along dim 0, so pairs stay whole."""
    return {k: v.transpose(0, 1).reshape(-1, *v.shape[2:]) for k, v in batch.items()}
