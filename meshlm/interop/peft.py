"""LoRA adapters as a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``).

PEFT stores ``lora_A`` (r, in) and ``lora_B`` (out, r) under the HF module path prefixed with
``base_model.model.``, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``, and scales the
update by ``lora_alpha / r``, as meshlm does; meshlm's projections use HF's row layout (no RoPE permutation), so
the matrices carry over unchanged. ``PeftModel.from_pretrained(base, folder)`` on the exported base model gives
the logits of meshlm's merged model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from meshlm.interop.hf_files import write_json
from meshlm.models.families import spec_of
from meshlm.models.lora import HF_TARGETS, TARGETS, lora_modules

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """PEFT key -> tensor for every LoRA layer of ``model`` (a whole, unsharded model; its family's HF names)."""
    tensors = {}
    spec = spec_of(model.cfg)
    for name, module in lora_modules(model).items():
        # e.g. model.layers.0.self_attn.q_proj
        hf_module = spec.external_name(f"{name}.weight", "hf").removesuffix(".weight")
        for part in ("lora_A", "lora_B"):
            value = getattr(module, part).detach().to("cpu", torch.float32).contiguous().clone()
            tensors[f"base_model.model.{hf_module}.{part}.weight"] = value
    return tensors


def adapter_config(targets: list[str], rank: int, alpha: float, dropout: float, base: str) -> dict[str, Any]:
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": rank, "lora_alpha": alpha, "lora_dropout": dropout, "bias": "none", "use_rslora": False,
        "target_modules": sorted(HF_TARGETS[t] for t in targets), "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
    }


def write_peft_adapter(model: nn.Module, out_dir: Path, targets: list[str], rank: int, alpha: float,
                       dropout: float, base: str = "") -> list[str]:
    """Write the adapter files into ``out_dir`` (which must exist); returns the file names written."""
    from safetensors.torch import save_file

    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"unknown LoRA targets {unknown}")
    tensors = adapter_tensors(model)
    if not tensors:
        raise ValueError("the model has no LoRA layers to export")
    write_json(out_dir / ADAPTER_CONFIG, adapter_config(targets, rank, alpha, dropout, base))
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
