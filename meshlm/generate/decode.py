"""The fast inference forward behind ``generate``, rollouts and the server: the model's own forward with a
KV cache, minus what decoding does not need.

:class:`FastForward` is called exactly like :class:`~meshlm.models.llama.Transformer` with a cache —
``(tokens, cache=, start_pos=, position_ids=, padding_mask=)`` — and returns the logits of the **last** position
only, (B, 1, V): what sampling reads, at prefill as at each decode step (the head is the largest matmul of a
step; at prefill the other positions' logits are never used). Everything else matches the plain forward (tests
compare them token for token, tests/test_decode.py): the same KVCache objects, masks from the same
:func:`~meshlm.models.llama.attention_mask`, the same RoPE tables.

Where the time goes instead, per decode step (profiled on SmolLM2-135M, docs/benchmarks.md "Decoding"): a step
is ~200 small matmuls and ~4,000 tensor ops, each with a fixed dispatch cost. The packed weights
(meshlm/generate/packed.py) make it 4 matmuls a layer; RoPE rotates q and k in one pass from tables gathered
once per step for all layers; the mask is built once per step and window (none when no row is padded); residual adds ride in ``addmm``. No shape checks or Python bookkeeping per layer beyond the ops themselves.

:func:`fast_forward` returns the fast path for a model, or the model itself where it does not apply (sharded or
pipelined models, reward heads, LoRA dropout in training mode; see packed.py); callers treat both alike.
"""

from __future__ import annotations

import math
import os
import time

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from meshlm.errors import ConfigError
from meshlm.generate.int8 import check_weight_format
from meshlm.generate.packed import (PackedLayer, PackedModel, _inner, pack_bytes, pack_variant, packed_weights,
                                    unsupported_reason)
from meshlm.generate.split import SplitMatrix
from meshlm.models.fused import rope_tables
from meshlm.models.llama import KVCache, Transformer, attention_mask


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_in_fp32: bool = False) -> torch.Tensor:
    """meshlm's RMSNorm over the last dim: in fp32, cast back, then the weight, which may also broadcast over
    heads ((heads, Dh) for q/k norms); ``weight_in_fp32`` (Gemma's 1 + w): the weight before the cast back. One
    fused op for fp32 and a (D,) weight."""
    if x.dtype == torch.float32 and weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return (normed * weight).type_as(x) if weight_in_fp32 else normed.type_as(x) * weight


class FastForward:
    """A decoder's KV-cache forward on packed weights, last position only (module docstring)."""

    def __init__(self, model: Transformer, weights: str = "fp32", copies: bool = True) -> None:
        self.model = _inner(model)
        self.cfg = self.model.cfg
        param = next(self.model.parameters())
        check_weight_format(weights, param.device, param.dtype)
        self.weight_format = weights  # "fp32": the model's own weights; "int8", "int4": generate/int8.py, int4.py
        # False: fp32 products on the view pack only — the model's own weights, multiplied as its plain forward
        # multiplies them (training rollouts: see objectives/rl.py); True: the fastest pack for the rows (packed.py)
        self.copies = copies

    def weights(self, batch: int, decode: bool = True) -> PackedModel:
        """The pack for ``batch`` rows, repacked only when the parameters changed. int8 (and int4) serve decode steps
        only; a prefill runs on fp32 weights — the view pack, so that a quantized model holds no fp32 copy: it is
        compute-bound, so int8 gains little there, and an int8 prefill doubles the error of the cache every later
        step reads (SmolLM2: logits 0.28 off fp32's over the steps against 0.14; docs/benchmarks.md "int8 decode
        weights")."""
        copies = self.copies and (decode or self.weight_format == "fp32")
        return packed_weights(self.model, batch, self.weight_format if decode else "fp32", copies=copies)

    def prepare(self, batch: int = 1) -> int:
        """Make now the packs that generating ``batch`` rows will multiply — the prefill's and the decode steps'
        — so that no call pays for them (the packs last while the parameters are unchanged; packed.py), and
        return the bytes they hold beyond the model's own weights (:func:`~meshlm.generate.packed.pack_bytes`:
        SmolLM2-135M, fp32: the row pack's copies, ~540 MB in column blocks on more than one core (split.py; they
        also serve prefills and batches of 5 rows or more), ~400 MB on one; the view pack: ~0)."""
        # an int8 or int4 model's prefill takes the view pack (no fp32 copy beside the quantized one)
        prefill_copies = self.copies and self.weight_format == "fp32"
        variants = {pack_variant(self.model, batch, self.weight_format, self.copies): (batch, self.weight_format,
                                                                                       self.copies),
                    pack_variant(self.model, 1 << 20, "fp32", prefill_copies): (1 << 20, "fp32", prefill_copies)}
        return sum(pack_bytes(packed_weights(self.model, rows, weights, copies), self.model)
                   for rows, weights, copies in variants.values())

    def _rope(self, T: int, start_pos: int, position_ids: torch.Tensor | None,
              kinds: set[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Layer kind -> full-width tables (B|1, T, 1, Dh) for the new tokens' positions, shared by the layers of
        that kind (one kind but for Gemma 3, whose sliding layers have a RoPE base of their own)."""
        tables = {}
        for kind, (cos, sin) in self.model.rope_by_kind().items():
            if kind not in kinds:
                continue
            if position_ids is None:
                cos, sin = cos[start_pos:start_pos + T], sin[start_pos:start_pos + T]  # (T, Dh/2)
            else:
                cos, sin = cos[position_ids], sin[position_ids]  # (B, T, Dh/2)
            cos2, sin2 = rope_tables(cos, sin)
            if cos2.dim() == 2:
                cos2, sin2 = cos2[None], sin2[None]
            tables[kind] = cos2[:, :, None, :], sin2[:, :, None, :]
        return tables

    @staticmethod
    def _masks(w: PackedModel, T: int, S: int, padding_mask: torch.Tensor | None,
               device: torch.device) -> dict[int, torch.Tensor | None]:
        """Window -> the boolean (B|1, 1, T, S) mask (True = attend) or None for plain causal attention."""
        windows = {layer.window for layer in w.layers}
        return {w: attention_mask(T, S, window=w, key_mask=padding_mask, device=device) for w in windows}

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, *, cache: list[KVCache], start_pos: int = 0,
                 position_ids: torch.Tensor | None = None,
                 padding_mask: torch.Tensor | None = None, all_positions: bool = False) -> torch.Tensor:
        """tokens (B, T) at cache slots start_pos.. -> logits (B, 1, V) of the last one, or (B, T, V) of every one
        with ``all_positions`` (a speculative draft's verification, meshlm/generate/speculative.py)."""
        B, T = tokens.shape
        S = start_pos + T
        if S > self.model.rope_cos.shape[0]:
            raise ValueError(f"positions up to {S} exceed model.max_seq_len = {self.model.rope_cos.shape[0]}")
        if len(cache) != len(self.model.layers):
            raise ValueError(f"cache has {len(cache)} layers, model has {len(self.model.layers)}")
        if padding_mask is not None and tuple(padding_mask.shape) != (B, S):
            raise ValueError(f"padding_mask must be (B, S) = {(B, S)}, got {tuple(padding_mask.shape)}")
        with _forward_threads(B, T, tokens.device):
            return self._forward(tokens, cache, start_pos, position_ids, padding_mask, all_positions)

    def _forward(self, tokens: torch.Tensor, cache: list[KVCache], start_pos: int, position_ids: torch.Tensor | None,
                 padding_mask: torch.Tensor | None, all_positions: bool = False) -> torch.Tensor:
        B, T = tokens.shape
        S = start_pos + T
        w = self.weights(B * T, decode=T == 1)  # the pack for this many rows: one row (a decode step) or several
        rope = self._rope(T, start_pos, position_ids, {layer.rope for layer in w.layers})
        masks = self._masks(w, T, S, padding_mask, tokens.device)
        x = F.embedding(tokens, w.embedding).view(B * T, -1)  # (B·T, D)
        if w.embed_scale is not None:
            x = x * w.embed_scale
        for layer, layer_cache in zip(w.layers, cache):
            x = self._block(x, layer, w, B, T, *rope[layer.rope], layer_cache, start_pos, masks[layer.window])
        out = x if all_positions else x.view(B, T, -1)[:, -1]  # (B·T | B, D)
        out = _rms_norm(out, w.norm, w.norm_eps, w.norm_in_fp32)
        return _mm(out, w.head).view(B, T if all_positions else 1, -1)  # (B, T|1, V)

    def _block(self, x: torch.Tensor, layer: PackedLayer, w: PackedModel, B: int, T: int, cos: torch.Tensor,
               sin: torch.Tensor, cache: KVCache, start_pos: int, mask: torch.Tensor | None) -> torch.Tensor:
        """x (B·T, D) -> (B·T, D) through one pre-norm block (with Gemma's post-norms: each branch's output normed
        before its residual add)."""
        H, Hkv, Dh = w.n_heads, w.n_kv_heads, w.head_dim
        eps, fp32 = w.norm_eps, w.norm_in_fp32
        h = _rms_norm(x, layer.attention_norm, eps, fp32)
        qkv = _project(h, layer.wqkv, layer.bqkv).view(B, T, H + 2 * Hkv, Dh)
        qk, v = qkv[:, :, :H + Hkv], qkv[:, :, H + Hkv:]  # (B, T, H + Hkv, Dh), (B, T, Hkv, Dh)
        if layer.qk_norm is not None:
            qk = _rms_norm(qk, layer.qk_norm, eps, fp32)  # per head, before RoPE (Qwen3, Gemma 3)
        qk = _rotate(qk, cos, sin)
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)  # (B, H, T, Dh), (B, Hkv, T, Dh)
        keys, values = cache.update(start_pos, k, v.transpose(1, 2))  # (B, Hkv, S, Dh)
        out = _attention(q, keys, values, mask, w.attn_scale).view(B * T, H * Dh)
        if layer.post_attention_norm is None:
            x = _addmm(x, out, layer.wo)  # residual + attention
        else:
            x = x + _rms_norm(_mm(out, layer.wo), layer.post_attention_norm, eps, fp32)
        h = _rms_norm(x, layer.ffn_norm, eps, fp32)
        gate_up = _project(h, layer.w13)  # (B·T, 2F)
        F_ = gate_up.shape[1] // 2
        gate = F.gelu(gate_up[:, :F_], approximate="tanh") if w.gelu else F.silu(gate_up[:, :F_])
        hidden = gate * gate_up[:, F_:]  # SwiGLU / GeGLU
        if layer.post_ffn_norm is None:
            return _addmm(x, hidden, layer.w2)  # residual + MLP
        return x + _rms_norm(_mm(hidden, layer.w2), layer.post_ffn_norm, eps, fp32)


# The thread policy. Measured on SmolLM2-135M with 1 and 2 threads alternating (docs/benchmarks.md "Threads per
# forward"; median ms of 7, the 2-core development machine at load 8-14, i.e. oversubscribed): decode steps of
# 1 / 4 / 16 / 64 rows 59 / 157 / 260 / 593 ms on one thread against 505 / 2,531 / 3,447 / 4,783 on two;
# one-sequence prefills of 8 / 32 / 128 / 512 tokens 339 / 460 / 1,236 / 2,589 against 6,009 / 2,137 / 10,098 /
# 11,200; prefills of 4 and 16 prompts of 32 tokens 1,230 / 3,342 against 10,650 / 27,159: one thread won at every
# point (3-17x) while other processes held the cores. On a quiet machine (docs/benchmarks.md "The issue's targets
# on a quiet machine", session 14) batches and prefills gain from the second thread: decode steps of 4 / 16 / 64
# rows 31 / 89 / 233 against 21 / 64 / 156 ms, one-sequence prefills of 8 / 32 / 128 / 512 tokens 60 / 104 / 300 /
# 1,225 against 39 / 71 / 170 / 657; and since the row pack's matrices are split by columns (split.py), so does a
# one-sequence decode step (its products 24.6 ms on one core, 13.2 on two; the step tied at 28.4 / 28.6 ms before).
# So: up to ONE_THREAD_MAX_ROWS rows run on one thread while the CPU is oversubscribed (other work holds as many
# runnable threads as this process may use cores); anything else keeps the process's threads (a quiet machine with
# more cores than this one has not been measured: its threads are the user's choice).
ONE_THREAD_MAX_ROWS = 512
_LOAD_EVERY_S = 1.0
_LOAD_TAU_S = 60.0  # the time constant of the kernel's 1-minute load average
# [when read, oversubscribed?, this process's CPU seconds then, its own load averaged like the kernel's]
_load_seen: list[float] = [float("-inf"), 0.0, 0.0, 0.0]


def cpu_oversubscribed() -> bool:
    """Whether other work holds the cores this process may use: the 1-minute load average less this process's own
    share of it is at least the number of cores.

    The load average counts this process's own busy threads too, so a forward on two threads of a two-core machine
    would read its own load as oversubscription and fall back to one thread a minute later. Its share is its CPU
    seconds per second, averaged with the load average's time constant; read at most once a second. The threshold is
    the cores, not fewer: the load average lags by a minute, so a process started after another busy one still
    reads that one's load for a while (at cores − 1 a benchmark's next process read its predecessor's ~1.3 as
    oversubscription on two cores and decoded on one thread; measured in docs/benchmarks.md, session 17)."""
    now = time.monotonic()
    seen = _load_seen
    if now - seen[0] >= _LOAD_EVERY_S:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this platform
            load = 0.0
        cpu = time.process_time()
        if seen[0] != float("-inf"):
            elapsed = now - seen[0]
            keep = math.exp(-elapsed / _LOAD_TAU_S)
            seen[3] = seen[3] * keep + (cpu - seen[2]) / elapsed * (1.0 - keep)
        seen[:3] = [now, float(load - seen[3] >= cores), cpu]
    return bool(seen[1])


def forward_threads(batch: int, length: int, device: torch.device, threads: int,
                    oversubscribed: bool | None = None) -> int:
    """The intra-op threads a forward of ``batch`` x ``length`` new tokens runs on, of the process's ``threads``
    (the rule above; ``oversubscribed`` None: read from the machine's load)."""
    if device.type != "cpu" or threads == 1:
        return threads
    if batch * length <= ONE_THREAD_MAX_ROWS and (cpu_oversubscribed() if oversubscribed is None else oversubscribed):
        return 1
    return threads


@contextmanager
def _forward_threads(batch: int, length: int, device: torch.device) -> Iterator[None]:
    """Run the forward on :func:`forward_threads`' count, restored after it.

    Why one thread wins on a shared CPU: a decode step's ops are small (one row, or a batch's few, times matrices
    of a few hundred columns; ~4,000 ops a step) and a short prefill's hardly larger, and every extra OpenMP thread
    adds a fork and a barrier per op, which a busy machine turns into waits for a descheduled thread (the
    measurements above; the bench's time to first token fell from 1.89 s to 0.16 s with it, session 10).

    ``torch.set_num_threads`` sets the calling thread's count and the default of threads that start using torch
    meanwhile; it is restored after the forward (a server thread whose first torch call falls inside one keeps
    one thread). Switching back and forth every step measured no slower than not switching."""
    threads = torch.get_num_threads()
    wanted = forward_threads(batch, length, device, threads)
    if wanted == threads:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


SWAP_MAX_ROWS = 8  # decode steps of up to this many rows multiply operands-swapped (_swapped)


def _swapped(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``x @ w`` runs faster as ``(wᵀ xᵀ)ᵀ``: several rows times a transposed view of an (out, in)
    weight. BLAS then sees the weight's long side as the product's rows and the few activation rows as its
    columns — on the development machine's MKL, 1.3–4× faster from 2 to 32 rows than x times the transposed
    view or than an (in, out) copy, for every decode matrix of SmolLM2 and its 49k-row head (docs/benchmarks.md
    "Decoding"); for one row, ``x @ w`` is as fast or faster, and from ~64 rows (a prefill) the plain product wins
    back (batch-8 prefill of 32-token prompts: 528 ms plain, 661 ms swapped). Those were two-thread figures; now
    that every decode step of up to 512 rows runs on one thread (:func:`forward_threads`), whole SmolLM2 steps on
    one thread measured swapped / plain 71.5 / 155.8 ms at 2 rows, 86.6 / 146.5 at 4, 166.6 / 162.5 at 8, 252.9 /
    234.0 at 16 and 379.4 / 347.3 at 32 (load 9-11, 5 rounds alternating; docs/benchmarks.md "Speed levers"),
    hence up to 8 rows."""
    return (x.device.type == "cpu" and 1 < x.shape[0] <= SWAP_MAX_ROWS and w.dim() == 2 and w.stride(0) == 1
            and w.stride(1) != 1)  # measured on CPU only: CUDA keeps the plain product


def _mm(x: torch.Tensor, w) -> torch.Tensor:
    """x (N, in) @ w (in, out) -> (N, out), contiguous; w a tensor or a quantized matrix (int8.py, int4.py)."""
    if not isinstance(w, torch.Tensor):
        return w(x)
    if _swapped(x, w):
        return torch.mm(w.t(), x.t()).t().contiguous()
    return torch.mm(x, w)


def _addmm(residual: torch.Tensor, x: torch.Tensor, w) -> torch.Tensor:
    """residual + x @ w, contiguous; the residual add rides in the GEMM (a tensor, split.py's blocks) or follows it
    (a quantized matrix)."""
    if isinstance(w, SplitMatrix):
        return w.addmm(residual, x)
    if not isinstance(w, torch.Tensor):
        return w(x).add_(residual)
    if _swapped(x, w):
        return torch.addmm(residual.t(), w.t(), x.t()).t().contiguous()
    return torch.addmm(residual, x, w)


def _project(x: torch.Tensor, matrices: list[torch.Tensor], bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (N, in) times one (in, out) matrix, or several whose outputs are concatenated; plus the bias."""
    if len(matrices) == 1:
        if bias is None:
            return _mm(x, matrices[0])
        return _addmm(bias.expand(x.shape[0], -1), x, matrices[0])
    out = torch.cat([_mm(x, m) for m in matrices], dim=1)
    return out if bias is None else out.add_(bias)


def _rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate_half layout) on x (B, T, heads, Dh) with full-width tables: x·cos2 + swap(x)·sin2."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(x * cos2, swapped, sin2).type_as(x)  # fp32 tables: rotated in fp32, cast back


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               scale: float | None = None) -> torch.Tensor:
    """q (B, H, T, Dh), k/v (B, Hkv, S, Dh), mask (B|1, 1, T, S) or None (causal) -> (B, T, H·Dh); scores scaled by
    ``scale`` (None: 1 / sqrt(Dh)).

    sdpa for decode steps too: a hand-written pair of batched matmuls + softmax measured 2× faster with one thread,
    but with two threads on the loaded machine each of those tiny ops paid ~16 ms of OpenMP barrier (torch.profiler),
    where sdpa's one kernel did not.
    """
    B, H, T, Dh = q.shape
    S = k.shape[2]
    gqa = H != k.shape[1]
    if mask is None and T == S:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa, scale=scale)
    elif mask is None and T == 1:  # a decode step: the new token sees every cached position
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, scale=scale)
    else:
        if mask is None:  # a chunk after cached tokens: causal aligned bottom-right
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa, scale=scale)
    return out.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, H·Dh)


def fast_forward(model: nn.Module, weights: str = "fp32", copies: bool = True) -> nn.Module | FastForward:
    """The fast KV-cache forward for ``model`` (last-position logits, module docstring), or ``model`` itself when
    the fast path does not apply to it. ``weights="int8"`` (``"int4"``) multiplies int8 (4-bit) copies of the weights
    (meshlm/generate/int8.py, int4.py) and needs the fast path: a model it does not apply to is refused."""
    reason = unsupported_reason(model)
    if reason is not None:
        if weights != "fp32":
            raise ConfigError(f"--weights {weights} needs meshlm's packed decode path, which this model cannot use: "
                              f"{reason}")
        return model
    return FastForward(model, weights, copies)
