"""The objective interface: the :class:`Objective` base class, what its ``setup`` receives, and helpers."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager

import torch
from torch import nn

from meshlm.config.posttrain import ObjectiveConfig

# a label to skip: one constant for the model's head (which computes the loss) and every objective
from meshlm.models.head import IGNORE_INDEX  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from meshlm.config.schema import JobConfig
    from meshlm.distributed.engine import Engine
    from meshlm.tokenizer import MeshTokenizer


class Objective:
    """Turns a batch into a summed loss; the trainer normalises by the global count of loss tokens.

    Returning a *sum* (not a mean) lets the trainer divide by the token count of the whole global batch, so
    gradient accumulation and data parallelism give exactly the gradient of one big batch.

    Every hook the trainer calls has a default here that does nothing, so an objective overrides only what it
    needs. A new objective is one module with a subclass, plus its line in meshlm/config/catalog.py
    (docs/architecture.md).
    """

    name: ClassVar[str] = ""  # the training.objective value it answers to
    # What the trainer feeds it: "tokens" (prepared shards) or a kind of JSONL rows (meshlm/data/posttrain/rows.py
    # DATA_KINDS: "sft", "preference", "unpaired", "prompt", "labelled"), read by meshlm/train/data_setup.py
    data_kind: ClassVar[str] = "tokens"
    # The [objective] keys it reads (documentation, and a test that every key has a reader)
    config_keys: ClassVar[tuple[str, ...]] = ()
    # Modules adapt_model adds that no base checkpoint holds: they train even under LoRA
    new_modules: ClassVar[tuple[str, ...]] = ()
    # Sequences the model runs forward and backward per batch row (a preference pair: 2); the planner's step time
    sequences_per_row: ClassVar[int] = 1
    # Pipeline parallelism runs the model stage by stage, so the loss must be a function of the last stage's
    # output and the labels; objectives that support pp > 1 set this to a
    #     (logits: Tensor (B, T, V), labels: Tensor (B, T)) -> Tensor (summed, fp32)
    loss_from_logits: ClassVar[Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None] = None

    def __init__(self, cfg: ObjectiveConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else ObjectiveConfig()

    @classmethod
    def configured(cls, cfg: ObjectiveConfig) -> Objective:
        """The objective for ``cfg``: a family may return a member class's instance (DPO's ``kto``)."""
        return cls(cfg)

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | int:
        """How many targets in ``batch`` contribute to the loss: preferably a 0-dim tensor on the batch's device,
        so that the trainer can scale the loss by the global count without a host synchronisation."""
        raise NotImplementedError

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of per-token losses over ``batch`` (fp32 scalar)."""
        raise NotImplementedError

    def num_positions(self, batch: dict[str, torch.Tensor]) -> int:
        """Input positions the step trains on (forward and backward): the trainer's ``positions_per_s`` and MFU.
        Default: every element of ``input_ids``."""
        return batch["input_ids"].numel()

    @property
    def frozen_forwards(self) -> int:
        """Forward passes without a gradient per trained sequence and step (a DPO reference model: 1); the
        planner's step time counts them."""
        return 0

    # ------------------------------------------------------------------------------- optional hooks: no-ops
    def adapt_model(self, model: nn.Module) -> None:
        """Change the META model's architecture (e.g. a score head), before LoRA and parallelism."""

    def init_from_keep(self, key: str) -> bool:
        """Whether ``checkpoint.init_from`` loads state-dict ``key`` (False: a new module keeps its initial
        values, e.g. PPO's value head)."""
        return True

    def setup(self, ctx: ObjectiveContext) -> None:
        """Once, after the policy is parallelised, materialised and initialised (e.g. the DPO reference)."""

    def next_batch(self, loader: Any) -> dict[str, torch.Tensor]:
        """The next training batch (rollouts happen here for RL)."""
        return loader.next_batch()

    def metrics(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{name: (sum, count)} 0-dim tensors accumulated since the last call; the trainer sums both over
        data-parallel ranks at log steps and logs sum / count as ``name``."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        """JSON-able state kept in the checkpoint's train_state.json (None: nothing to keep)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


@dataclass
class ObjectiveContext:
    """What :meth:`setup` receives. ``build_frozen(checkpoint, adapt)`` builds a model from a checkpoint's own
    config, laid out like the policy (same mesh; sharded under FSDP2, replicated under DDP), with its weights
    loaded, ``requires_grad`` off and in eval mode; ``checkpoint=None`` means the policy's own starting weights
    (``checkpoint.init_from``, or the seeded initialisation when there is none). ``adapt(model)`` runs on the
    meta model after the checkpoint's own objective adapted it (e.g. PPO adds a value head). ``autocast()`` is
    the precision context the trainer's own forwards run in (for forwards an objective runs itself)."""

    cfg: JobConfig
    engine: Engine
    device: torch.device
    tokenizer: MeshTokenizer | None
    model_parts: list[nn.Module]
    build_frozen: Callable[..., list[nn.Module]]
    train_loader: Any = None
    eval_loader: Any = None
    autocast: Callable[[], ContextManager[Any]] = contextlib.nullcontext
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
