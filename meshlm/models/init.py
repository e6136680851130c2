"""Layout-independent initialisation: a model built on the meta device, split and sharded, is materialised with
only this rank's shards allocated, each holding exactly the values the single-device run starts from.

Each parameter's full value is a function of (seed, parameter name) alone: the model declares its rule
(:meth:`~meshlm.models.llama.Transformer.param_init`: normal with a std, ones or zeros) and a CPU
``torch.Generator`` seeded from the seed and a SHA-256 of the name draws it, one parameter at a time. A DTensor
parameter (TP, FSDP, both) keeps only its shard of that full value, cut locally by ``distribute_tensor(...,
src_data_rank=None)`` (no communication). So the values do not depend on the order parameters are visited, on
which of them a pipeline stage holds, or on how they are sharded; single device (``build_model``) uses the same
rule and is the reference. Peak extra memory: one full parameter on the CPU (the largest: the embedding or the
head), never the model.

The decoder (llama.py) stays free of RNG and sharding mechanics: this file does them; the model only names the
rule. It sits with the model, not the engine, because the single-device build (build.py) and the engine's sharded
materialisation (distributed/engine.py) use the same rule; it imports nothing of meshlm and sends nothing.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

# Wrappers that insert a path component into parameter names without being part of the model's own names.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def canonical_name(name: str) -> str:
    """The state-dict name of a parameter seen through activation-checkpoint or compile wrappers."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def param_generator(seed: int, key: str) -> torch.Generator:
    """A CPU generator for one parameter: its stream depends on (seed, key) only, stable across processes and
    Python versions (no hash randomisation)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") >> 1)  # 63 bits


def full_value(rule, shape: torch.Size | tuple[int, ...], seed: int) -> torch.Tensor:
    """The whole parameter as the rule says, fp32 on the CPU. ``rule``: a ParamInit (kind, std, key)."""
    if rule.kind == "ones":
        return torch.ones(shape)
    if rule.kind == "zeros":
        return torch.zeros(shape)
    if rule.kind == "normal":
        return torch.empty(shape).normal_(0.0, rule.std, generator=param_generator(seed, rule.key))
    if rule.kind == "uniform":  # U(-std, std): LoRA's A (PEFT's default bound 1/sqrt(in))
        return torch.empty(shape).uniform_(-rule.std, rule.std, generator=param_generator(seed, rule.key))
    raise ValueError(f"unknown initialisation kind '{rule.kind}'")


@torch.no_grad()
def init_parameters(model: nn.Module, seed: int) -> None:
    """Fill every parameter of ``model`` (a Transformer, a pipeline stage of one, sharded or not) in place.

    A parameter shared by two modules (a tied head) is visited once. ``model.param_init`` gives the rule.
    """
    for name, param in model.named_parameters():
        rule = _rule(model, name)
        full = full_value(rule, param.shape, seed)  # param.shape is the global shape for a DTensor
        if isinstance(param, DTensor):
            # Every rank of the mesh cuts its own shard from the same full tensor: src_data_rank=None means
            # "the input is already identical everywhere, split locally", with no broadcast.
            shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(shard.to_local())
        else:
            param.copy_(full)


def _rule(model: nn.Module, name: str):
    """The model's rule for ``name``, unless the module holding it names its own (``param_init_local``: modules
    added around the model, e.g. LoRA adapters, whose names the model does not know)."""
    owner_path, _, local = name.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    own_rule = getattr(owner, "param_init_local", None)
    rule = own_rule(local, canonical_name(name)) if own_rule is not None else None
    return rule if rule is not None else model.param_init(canonical_name(name))


def materialize(model: nn.Module, device: torch.device | str, seed: int) -> None:
    """Allocate ``model``'s (local) parameters and buffers on ``device`` and initialise them."""
    model.to_empty(device=device)
    init_parameters(model, seed)
    model.init_buffers(device)
