"""Rotary position embeddings: frequencies (with Llama-3.1 or linear scaling), the cos/sin tables, the rotation.

Layout: HF "rotate_half". Channel i of a head is paired with channel i + Dh/2 (first half with second half)
and the pair is rotated by angle pos * inv_freq[i]. Meta's original checkpoints pair adjacent channels
(2i, 2i+1) instead; HF's conversion script permutes wq/wk rows into this layout, so using it here means HF
checkpoints load with no permutation. Attention scores are identical in both layouts for matching weights.
"""

from __future__ import annotations

import math

import torch

from meshlm.errors import ConfigError
from meshlm.models.config import ModelConfig
from meshlm.models.fused import apply_rope_fused, rope_tables, use_fast_path

def rope_inv_freq(cfg: ModelConfig, device: torch.device | str | None = None, *,
                  local: bool = False) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/Dh), i < Dh/2, (Dh/2,) fp32: of the global layers (rope_theta, with the
    configured scaling), or with ``local`` of the sliding layers (rope_local_theta, unscaled: Gemma 3)."""
    head_dim = cfg.resolved_head_dim
    theta = cfg.rope_local_theta if local and cfg.rope_local_theta else cfg.rope_theta
    # fp32 like Meta's reference and HF, so that angles match the ones the published checkpoints saw.
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)  # (Dh/2,)
    if local:
        return inv_freq
    if cfg.rope_scaling == "llama3":
        inv_freq = _llama3_scaling(inv_freq, cfg)
    elif cfg.rope_scaling == "linear":  # positions divided by the factor (HF's "linear")
        inv_freq = inv_freq / cfg.rope_scaling_factor
    return inv_freq


def _llama3_scaling(inv_freq: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between."""
    factor, low, high = cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    if factor <= 0 or not high > low:
        raise ConfigError("model.rope_scaling = 'llama3' needs rope_scaling_factor > 0 and "
                          f"rope_high_freq_factor > rope_low_freq_factor (got {factor}, {high}, {low})")
    old_len = cfg.rope_original_max_len
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)  # 0 at the low-frequency edge, 1 at the high one
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, smoothed)
    return torch.where(wavelen < old_len / high, inv_freq, scaled)


def precompute_rope(cfg: ModelConfig, seq_len: int, device: torch.device | str | None = None, *,
                    local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of pos * inv_freq for pos < seq_len, each (seq_len, Dh/2) fp32 (``local``: see rope_inv_freq)."""
    inv_freq = rope_inv_freq(cfg, device, local=local)  # (Dh/2,)
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)  # (S,)
    angles = torch.outer(positions, inv_freq)  # (S, Dh/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (x[i], x[i + Dh/2]) by the angles in cos/sin. x: (B, T, H, Dh); cos, sin: half-width (T, Dh/2)
    shared by the batch or (B, T, Dh/2) per row (explicit position ids, e.g. restarting per packed document), or
    the full-width tables of :func:`~meshlm.models.fused.rope_tables` ((T, Dh) or (B, T, Dh))."""
    if cos.shape[-1] * 2 == x.shape[-1]:
        cos, sin = rope_tables(cos, sin)
    cos2, sin2 = _broadcast_tables(cos, sin)  # (B|1, T, 1, Dh)
    if use_fast_path(x):
        return apply_rope_fused(x, cos2, sin2)
    xf = x.float()  # rotated in fp32, cast back (no copy when x is fp32)
    x1, x2 = xf.chunk(2, dim=-1)  # (B, T, H, Dh/2) each
    # (x1 cos − x2 sin, x2 cos + x1 sin) as two full-width products, x·(cos, cos) + (x2, x1)·(−sin, sin): the same
    # roundings (negation is exact), half the element-wise ops of four half-width products and their backward.
    rotated = xf * cos2 + torch.cat((x2, x1), dim=-1) * sin2  # (B, T, H, Dh)
    return rotated.type_as(x)


def _broadcast_tables(cos2: torch.Tensor, sin2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width (T, Dh) or (B, T, Dh) tables -> (B|1, T, 1, Dh), broadcasting over heads."""
    if cos2.dim() == 2:
        cos2, sin2 = cos2[None], sin2[None]
    return cos2[:, :, None, :], sin2[:, :, None, :]
