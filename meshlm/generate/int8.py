"""Weight-only-stored int8 matrices for CPU decoding: ``--weights int8`` of generate, serve and bench generate.

A decode step reads every weight once per step, so on a CPU its time is the weights' bytes over the memory
bandwidth (SmolLM2-135M in fp32: 538 MB a step, ~29 ms at the development machine's ~18.6 GB/s). Int8 weights are
a quarter of those bytes. torch's own weight-only int8 kernel (``_weight_int8pack_mm``) is 4.6–13× *slower* than
fp32 on an AVX2 CPU without VNNI (docs/benchmarks.md), so this module uses the kernel that is fast there:
FBGEMM's dynamic quantized linear (``torch.ops.quantized.linear_dynamic``), which

- keeps each weight as int8 with one symmetric scale per output row (``scale = max |w_row| / 127``), prepacked
  once in FBGEMM's blocked layout;
- quantises the activations per call to 8 bits (one affine scale for the whole (N, in) input, 7-bit range —
  ``reduce_range`` — so that the AVX2 u8 × s8 pair sums cannot saturate), multiplies in int32 and returns fp32.
  Since that scale is shared by the rows of a batch, each row is first divided by its own max |x| and the output
  row multiplied back: per-row activation scales from a per-tensor kernel. Without it one row's large
  activations coarsen every other row's (SmolLM2's factual accuracy in batches of 32: 0.524 without, 0.583
  with, fp32 0.599; a prompt's first tokens, whose activations are far larger than the rest, put the logits 73%
  off fp32's when a whole prompt shared one scale).

So the product differs from fp32's by both roundings (~1–2% relative error per matrix on random data; the effect
on a real model's logits, greedy tokens and factual answers is measured in docs/benchmarks.md, and is why int8 is
opt-in). The norms, RoPE, attention, the KV cache and the embedding lookup stay fp32, and so does a prefill
(decode.py ``FastForward.weights``).

Limits: CPU only (FBGEMM); fp32 models only; built on torch's quantized-tensor API (``linear_prepack``), which
torch 2.13 marks deprecated — meshlm pins torch, and the tests here fail loudly if a later torch drops it.
"""

from __future__ import annotations

import warnings

import torch

from meshlm.errors import ConfigError

WEIGHT_FORMATS = ("fp32", "int8", "int4")  # int4: meshlm/generate/int4.py


def check_weight_format(name: str, device: torch.device | str, dtype: torch.dtype, key: str = "--weights") -> None:
    """Refuse a weight format this model/device cannot run, naming ``key`` (a ConfigError: exit 2)."""
    if name not in WEIGHT_FORMATS:
        raise ConfigError(f"{key} must be one of {', '.join(WEIGHT_FORMATS)}, got {name!r}")
    if name == "int8":
        if torch.device(device).type != "cpu":
            raise ConfigError(f"{key} int8 runs on CPU only (FBGEMM); this model is on {device}: use fp32 there")
        if dtype != torch.float32:
            raise ConfigError(f"{key} int8 quantises an fp32 model; this one is {dtype}: load it in fp32")
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ConfigError(f"{key} int8 needs torch's FBGEMM engine, which this torch build lacks: use fp32")
    if name == "int4":
        from meshlm.generate.int4 import int4_unavailable_reason

        if torch.device(device).type != "cpu":
            raise ConfigError(f"{key} int4 runs on CPU only (torch's CPU int4 kernel); this model is on {device}: "
                              "use fp32 there")
        if dtype != torch.float32:
            raise ConfigError(f"{key} int4 quantises an fp32 model; this one is {dtype}: load it in fp32")
        reason = int4_unavailable_reason()
        if reason is not None:
            raise ConfigError(f"{key} int4: {reason}; use int8 or fp32")


class Int8Matrix:
    """x (N, in) -> x Wᵀ (+ bias) (N, out) in fp32, W held as per-row int8 in FBGEMM's packed layout."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        weight = weight.detach().float().contiguous()  # (out, in)
        scale = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        with warnings.catch_warnings():  # quantized tensors are deprecated in torch 2.13 (module docstring)
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(weight, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(q, None)
        self.bias = None if bias is None else bias.detach().float()
        self.shape = (weight.shape[1], weight.shape[0])  # as the (in, out) matrices of the fp32 packs
        self.scale = scale.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            out = torch.ops.quantized.linear_dynamic(x, self._packed, True)  # reduce_range: no AVX2 saturation
        else:  # each row scaled to max |x| = 1 first, so that one row's range does not coarsen the others'
            scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)  # (N, 1)
            out = torch.ops.quantized.linear_dynamic(x / scale, self._packed, True).mul_(scale)
        return out if self.bias is None else out.add_(self.bias)

    def dequantized(self) -> torch.Tensor:
        """The (out, in) fp32 weight the int8 values stand for (tests, error reports)."""
        weight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return weight.dequantize()
