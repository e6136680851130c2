"""LoRA (Hu et al. 2021, arXiv 2106.09685): low-rank adapters on the decoder's linear projections.

``W x`` becomes ``W x + (alpha / r) · B A dropout(x)`` with A (r, in) and B (out, r). The base weight W is frozen;
only A and B train. B starts at zero, so the adapted model starts exactly equal to the base model. A is drawn
like PEFT's default (Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))).

The adapted layer is a subclass of ``nn.Linear`` that keeps ``weight`` / ``bias`` under their own names and adds
``lora_A`` / ``lora_B`` beside them, so base state-dict keys (and therefore checkpoints and HF conversion) are
unchanged. Pure PyTorch: data parallelism (DDP, FSDP2) is applied from outside as for any module.

Tensor parallelism: the engine's plan shards the base projection as for plain ``nn.Linear`` (column-parallel
``Shard(0)`` of the (out, in) weight, row-parallel ``Shard(1)``), and :meth:`LoRALinear.register_parameter` lays
the adapters out to match as the plan installs its DTensors: column-parallel → A replicated, B ``Shard(0)`` (each
rank computes its own output columns; no communication); row-parallel → A ``Shard(1)`` (the input is sharded),
B replicated, so the update is a partial sum reduced with the base output. The hook acts only on DTensors of a
one-dimensional mesh named ``tp`` (FSDP2's data-parallel DTensors pass through untouched). Without dropout the
layer has no submodule (the row-parallel plan would visit one as a linear layer); with dropout > 0 it has an
``nn.Dropout`` (which tools listing dropout modules see), and the config refuses it under tensor parallelism.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from meshlm.models.family import LINEARS, Shapes

# Config names -> the module names inside the generic block, every family's (meshlm/models/family.py).
TARGETS = {lin.target: lin.module for lin in LINEARS}
# The same targets under HF's names (PEFT's target_modules): the last part of the HF module name.
HF_TARGETS = {lin.target: lin.hf.rsplit(".", 1)[-1] for lin in LINEARS}
_BY_TARGET = {lin.target: lin for lin in LINEARS}


class _LoRAFunction(torch.autograd.Function):
    """``x Wᵀ + b + s·(x Aᵀ) Bᵀ`` and its gradients with no full-size element-wise pass: the update is added by
    the GEMM itself (``addmm``) in the forward, and the two input-gradient terms ``g W + s·(g B) A`` likewise in the
    backward. The plain formula spends a scale and an add over the (tokens, out) output in the forward, and a
    scale and a gradient sum over (tokens, out) and (tokens, in) in the backward, per adapted projection; on the
    CPU those passes and the extra kernels made a LoRA step of SmolLM2 (all seven projections) as slow as the full
    fine-tune's (docs/benchmarks.md). Saved for the backward: x (the base matmul's input, which the plain path
    saves too) and x Aᵀ, (tokens, r). W and b are frozen: no gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scaling: float):
        flat = x.reshape(-1, x.shape[-1])  # (N, in)
        xa = flat @ lora_a.t()  # (N, r)
        out = torch.addmm(F.linear(flat, weight, bias), xa, lora_b.t(), alpha=scaling)  # (N, out)
        ctx.save_for_backward(flat, weight, lora_a, lora_b, xa)
        ctx.scaling, ctx.in_shape = scaling, x.shape
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable  # a double backward raises instead of missing the x Aᵀ path
    def backward(ctx, grad_out):
        flat, weight, lora_a, lora_b, xa = ctx.saved_tensors
        s = ctx.scaling
        g = grad_out.reshape(-1, grad_out.shape[-1])  # (N, out)
        gb = g @ lora_b  # (N, r), unscaled
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.addmm(g @ weight, gb, lora_a, alpha=s).view(ctx.in_shape)
        if ctx.needs_input_grad[3]:
            grad_a = (gb.t() @ flat).mul_(s)  # (r, in)
        if ctx.needs_input_grad[4]:
            grad_b = (g.t() @ xa).mul_(s)  # (out, r)
        return grad_x, None, None, grad_a, grad_b, None


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` with a frozen base weight and a trainable low-rank update."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, alpha: float,
                 dropout: float, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.empty(out_features, rank, device=device, dtype=dtype))
        if dropout > 0:
            self.lora_dropout = nn.Dropout(dropout)
        else:
            self.lora_dropout = None  # no submodule for a tensor-parallel plan to visit
        self.merged = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged:
            return F.linear(x, self.weight, self.bias)
        if self._fused_ok(x):
            return _LoRAFunction.apply(x, self.weight, self.bias, self.lora_A, self.lora_B, self.scaling)
        out = F.linear(x, self.weight, self.bias)  # (..., out)
        h = self.lora_dropout(x) if self.lora_dropout is not None else x
        update = F.linear(F.linear(h, self.lora_A), self.lora_B)  # (..., r) -> (..., out)
        return out + update * self.scaling

    def _fused_ok(self, x: torch.Tensor) -> bool:
        """The fused path (:class:`_LoRAFunction`) covers the training case that matters: a frozen base of plain
        tensors (one device, or FSDP2's gathered parameters), no dropout, no autocast. Tensor-parallel DTensors,
        dropout, a trained base and mixed precision take the plain formula."""
        return (self.lora_dropout is None and not self.weight.requires_grad
                and (self.bias is None or not self.bias.requires_grad)
                and not any(isinstance(t, DTensor) for t in (x, self.weight, self.lora_A, self.lora_B))
                and not torch.is_autocast_enabled(x.device.type))

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        """Tensor parallelism (module docstring): adapters follow the base weight's column/row sharding."""
        weight = self._parameters.get("weight") if name != "weight" else param
        if name in ("lora_A", "lora_B") and _tp_placement(param) is not None and _tp_placement(weight) == Shard(0):
            # column-parallel: the plan shards every parameter along dim 0; A must stay whole
            param = _placed(param, [Replicate()] if name == "lora_A" else [Shard(0)])
        super().register_parameter(name, param)
        if name == "weight" and _tp_placement(param) == Shard(1) and "lora_A" in self._parameters:
            # row-parallel: the plan shards only weight (and replicates bias); place the adapters here
            super().register_parameter("lora_A", _placed(self._parameters["lora_A"], [Shard(1)], param.device_mesh))
            super().register_parameter("lora_B", _placed(self._parameters["lora_B"], [Replicate()], param.device_mesh))

    @torch.no_grad()
    def reset_lora(self, generator: torch.Generator | None = None) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        values = torch.empty(self.lora_A.shape, dtype=torch.float32).uniform_(-bound, bound, generator=generator)
        self.lora_A.copy_(values.to(self.lora_A.dtype))
        nn.init.zeros_(self.lora_B)

    def param_init_local(self, local_name: str, full_name: str):
        """Initialisation rules of the adapters when the model is materialised from the meta device
        (meshlm/models/init.py): A ~ U(±1/sqrt(in)) drawn from (seed, full name), B = 0. None for the base
        weight, which follows the model's own rule (and is then loaded from the base checkpoint)."""
        from meshlm.models.llama import ParamInit

        if local_name == "lora_A":
            return ParamInit("uniform", 1.0 / math.sqrt(self.in_features), key=full_name)
        if local_name == "lora_B":
            return ParamInit("zeros")
        return None

    def delta_weight(self) -> torch.Tensor:
        """(alpha / r) · B A, the (out, in) update the adapter adds to ``weight``."""
        return (self.lora_B.float() @ self.lora_A.float()) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the update into ``weight`` (for export); the adapter then no longer contributes."""
        if not self.merged:
            self.weight.add_(self.delta_weight().to(self.weight.dtype))
            self.merged = True

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}"


def _tp_placement(param) -> object | None:
    """The placement of a DTensor on a one-dimensional ``tp`` mesh, else None."""
    if not isinstance(param, DTensor) or param.device_mesh.mesh_dim_names != ("tp",):
        return None
    return param.placements[0]


def _placed(param, placements, mesh=None) -> nn.Parameter:
    """``param`` (a plain tensor, or a DTensor of the tp mesh) laid out with ``placements`` on the tp mesh. On the
    meta device only shapes move; otherwise every rank rebuilds the full value (a collective for a DTensor)."""
    if isinstance(param, DTensor):
        mesh = param.device_mesh
        full = torch.empty(param.shape, dtype=param.dtype, device="meta") if param.is_meta else param.full_tensor()
    else:
        full = param.detach()
    placed = distribute_tensor(full, mesh, placements, src_data_rank=None)
    return nn.Parameter(placed, requires_grad=param.requires_grad)


def _swap(parent: nn.Module, child_name: str, rank: int, alpha: float, dropout: float) -> LoRALinear:
    old: nn.Linear = getattr(parent, child_name)
    new = LoRALinear(old.in_features, old.out_features, old.bias is not None, rank, alpha, dropout,
                     device=old.weight.device, dtype=old.weight.dtype)
    new.weight = old.weight  # the same Parameter objects: no copy, works on the meta device too
    if old.bias is not None:
        new.bias = old.bias
    setattr(parent, child_name, new)
    return new


def apply_lora(model: nn.Module, targets: list[str], rank: int, alpha: float, dropout: float) -> list[str]:
    """Replace the targeted projections of every block by LoRA layers and freeze everything else.

    Returns the qualified names of the adapted modules. Call before any parallelism is applied (on the meta
    device is fine: ``reset_lora`` initialises the adapters after materialisation).
    """
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"unknown LoRA targets {unknown}; choose from {sorted(TARGETS)}")
    for p in model.parameters():
        p.requires_grad_(False)
    names = [f"layers.{layer_name}.{TARGETS[target]}" for layer_name in model.layers for target in targets]
    return add_lora(model, names, rank, alpha, dropout)


def add_lora(model: nn.Module, names: list[str], rank: int, alpha: float, dropout: float) -> list[str]:
    """Replace the ``nn.Linear`` modules of ``model`` at the qualified ``names`` by LoRA layers with trainable
    adapters (any model: the decoder's blocks through :func:`apply_lora`, the encoder judge's layers); freezing
    the rest is the caller's choice. Returns ``names``."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        module = _swap(model.get_submodule(parent_name), child, rank, alpha, dropout)
        module.lora_A.requires_grad_(True)
        module.lora_B.requires_grad_(True)
    return list(names)


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


@torch.no_grad()
def reset_lora_parameters(model: nn.Module, seed: int) -> None:
    """Initialise every adapter from (seed, module name) alone, so the result does not depend on the layout."""
    for name, module in sorted(lora_modules(model).items()):
        generator = torch.Generator().manual_seed(_stable_seed(seed, name))
        module.reset_lora(generator)


def merge_lora(model: nn.Module) -> None:
    for module in lora_modules(model).values():
        module.merge()


def num_trainable_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def expected_lora_params(cfg, targets: list[str], rank: int) -> int:
    """r · (in + out) per adapted projection per layer, from the model config alone."""
    head_dim = cfg.resolved_head_dim
    sizes = Shapes(cfg.dim, cfg.n_heads * head_dim, cfg.n_kv_heads * head_dim, head_dim, cfg.ffn_hidden_dim)
    return cfg.n_layers * sum(rank * sum(_BY_TARGET[t].shape(sizes)) for t in targets)


def _stable_seed(seed: int, name: str) -> int:
    import hashlib

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
