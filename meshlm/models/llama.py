"""The generic decoder in pure PyTorch: RMSNorm, RoPE, a gated MLP, grouped-query attention.

One class covers every family (meshlm/models/families/): Llama 2/3/3.1, Mistral, Qwen2 (``qkv_bias``), Qwen3
(``qk_norm``) and Gemma 3 ((1 + w) norms, post-norms, GeGLU, scaled embeddings, a query scalar, sliding and
global layers with their own RoPE bases); they differ only by :class:`~meshlm.models.config.ModelConfig` flags. The file has no collectives, no process groups and no
environment reads: tensor, pipeline and data parallelism are applied from outside, keyed by the module names
below (``wq wk wv wo``, ``w1 w2 w3``, ``layers.<i>``, ``tok_embeddings``, ``norm``, ``output``), which are
also the names HF conversion maps. Build on the meta device; :meth:`Transformer.param_init` declares how each
parameter starts and meshlm/models/init.py materialises it (whole, or only a rank's shard).

Shape letters: B batch, T new tokens, S attended (cached + new) tokens, D model dim, H heads, Hkv kv heads,
Dh head dim, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from meshlm.models.config import ModelConfig
from meshlm.models.fused import rms_norm, use_fast_path
from meshlm.models.head import OutputHead
from meshlm.models.rope import apply_rope, precompute_rope, rope_inv_freq

__all__ = ["KVCache", "ParamInit", "RMSNorm", "Transformer", "TransformerBlock", "apply_rope", "attention_mask",
           "positions_from_documents", "precompute_rope", "rope_inv_freq"]


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 and cast back (bf16 sums of squares lose too much). With
    ``unit_offset`` (Gemma) it scales by (1 + w), in fp32 before the cast back, as HF's Gemma3RMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-5, unit_offset: bool = False):
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unit_offset:
            normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
            return (normed * (1.0 + self.weight.float())).type_as(x)
        if use_fast_path(x, self.weight):
            return rms_norm(x, self.weight, self.eps)  # the same formula, fewer ops and saved tensors
        # torch's rms_norm: a fused kernel on CUDA; on CPU the same ops as x·rsqrt(mean(x²) + eps) (bitwise equal,
        # checked in tests/test_fast_paths.py). The weight multiplies after the cast back, as in HF's Llama.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return normed.type_as(x) * self.weight


# ------------------------------------------------------------------------------------------------ KV cache
class KVCache:
    """Keys and values of one layer for incremental decoding, preallocated as (B, Hkv, max_len, Dh)."""

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32):
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, Hkv, T, Dh) at positions start_pos.. and return everything up to them (B, Hkv, S, Dh)."""
        end = start_pos + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; asked to write up to {end}")
        self.k[:, :, start_pos:end] = k
        self.v[:, :, start_pos:end] = v
        keys, values = self.k[:, :, :end], self.v[:, :, :end]
        if keys.dtype != k.dtype:  # e.g. an fp32 cache under bf16 autocast: sdpa wants one dtype
            keys, values = keys.to(k.dtype), values.to(k.dtype)
        return keys, values


# --------------------------------------------------------------------------------------------------- blocks
class Attention(nn.Module):
    """Grouped-query self-attention with optional q/k/v bias (Qwen2) and per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.resolved_head_dim
        q_size, kv_size = cfg.n_heads * self.head_dim, cfg.n_kv_heads * self.head_dim
        self.wq = nn.Linear(cfg.dim, q_size, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, kv_size, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, kv_size, bias=cfg.qkv_bias)
        self.wo = nn.Linear(q_size, cfg.dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps, cfg.norm_unit_offset) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps, cfg.norm_unit_offset) if cfg.qk_norm else None
        # None: sdpa's default 1 / sqrt(Dh); Gemma scales by query_pre_attn_scalar ** -0.5.
        self.scale = cfg.query_pre_attn_scalar ** -0.5 if cfg.query_pre_attn_scalar else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None,
                start_pos: int = 0, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask``: None for plain causal attention, else a boolean (B|1, 1, T, S) mask, True = may attend
        (see :func:`attention_mask`). It is a keyword so tensor-parallel input plans keep their 5-tuple."""
        B, T, _ = x.shape
        # Head counts come from the projections' outputs (-1), not from the config: tensor parallelism shards
        # wq/wk/wv by output rows (whole heads), so each rank sees only its local heads. Inferring from the
        # activation also works when the weights are DTensors, whose .shape is the global one.
        q = self.wq(x).view(B, T, -1, self.head_dim)  # (B, T, H, Dh)
        k = self.wk(x).view(B, T, -1, self.head_dim)  # (B, T, Hkv, Dh)
        v = self.wv(x).view(B, T, -1, self.head_dim)  # (B, T, Hkv, Dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, before RoPE (Qwen3)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H|Hkv, T, Dh)
        if cache is not None:
            k, v = cache.update(start_pos, k, v)  # (B, Hkv, S, Dh), S = start_pos + T
        if mask is None:
            out = _causal_attention(q, k, v, self.scale)  # (B, H, T, Dh)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1],
                                                 scale=self.scale)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """softmax(q k^T · scale) v (scale None: 1 / sqrt(Dh)) where query t (the last T of S positions) sees keys
    0..S-T+t.

    q: (B, H, T, Dh); k, v: (B, Hkv, S, Dh). Query head h reads kv head h // (H / Hkv), as HF's repeat_kv
    and sdpa's enable_gqa do, so no repeated copy of k/v is materialised.
    """
    T, S = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if T == S:  # training or a prefill from position 0: the plain causal mask
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa, scale=scale)
    if T == 1:  # one decode step: the new token sees every cached position
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, scale=scale)
    # A chunk appended to a non-empty cache. sdpa's is_causal aligns the mask top-left, which would be
    # wrong here, so build the bottom-right aligned one explicitly.
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)  # (T, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa, scale=scale)


def attention_mask(T: int, S: int, *, window: int = 0, document_ids: torch.Tensor | None = None,
                   key_mask: torch.Tensor | None = None,
                   device: torch.device | str | None = None) -> torch.Tensor | None:
    """Which keys each query may attend to: a boolean (B|1, 1, T, S) mask, True = attend; None when the plain
    causal mask is all that applies (the caller then takes sdpa's fast ``is_causal`` path).

    The T queries are the last T of S positions (a KV cache holds the first S - T). Query i sees key j when
    j <= i; with ``window`` also i - j < window (HF's sliding window: the query and window - 1 keys before it);
    with ``document_ids`` (B, T), T == S, also only keys of its own document (block-diagonal causal, for packed
    rows). With ``key_mask`` (B, S), True = a real token, also only real keys (left-padded batches, e.g. a
    batched sampler whose prompts differ in length; works with a KV cache). Every query sees at least itself, so
    no row of the mask is empty (sdpa would return NaN for one).
    """
    if window >= S:  # no query is window or more positions past any key: the window changes nothing
        window = 0
    if not window and document_ids is None and key_mask is None:
        return None
    q_pos = torch.arange(S - T, S, device=device)[:, None]  # (T, 1) positions of the queries
    k_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    allowed = k_pos <= q_pos  # (T, S) causal, aligned bottom-right
    if window:
        allowed = allowed & (k_pos > q_pos - window)
    allowed = allowed[None, None]  # (1, 1, T, S)
    if document_ids is not None:
        same = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
        allowed = allowed & same[:, None]  # (B, 1, T, S)
    if key_mask is not None:
        allowed = allowed & (key_mask[:, None, None, :] | (k_pos == q_pos))  # (B, 1, T, S); a pad sees itself
    return allowed


def positions_from_documents(document_ids: torch.Tensor) -> torch.Tensor:
    """RoPE position ids that restart at 0 where each document starts: (B, T) ids -> (B, T) int64 positions.

    A document is a run of equal consecutive ids, e.g. [[7, 7, 7, 2, 2, 9]] -> [[0, 1, 2, 0, 1, 0]].
    """
    B, T = document_ids.shape
    index = torch.arange(T, device=document_ids.device).expand(B, T)  # (B, T)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # start of each one's run
    return index - first


class FeedForward(nn.Module):
    """A gated MLP: w2(act(w1 x) * w3 x); w1 is the gate, w3 the up projection, w2 the down projection. act: silu
    (SwiGLU) or the tanh-approximated GELU (GeGLU, Gemma)."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu"):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.gelu = activation == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w1(x)  # (B, T, F)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.w2(gate * self.w3(x))  # (B, T, D)


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + ffn(norm(h)). With ``post_norms`` (Gemma) each branch's
    output is normed too before its residual add: h = x + norm(attn(norm(x))); out = h + norm(ffn(norm(h)))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        offset = cfg.norm_unit_offset
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, offset)
        self.attention = Attention(cfg)
        self.post_attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, offset) if cfg.post_norms else None
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, offset)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_hidden_dim, cfg.mlp_activation)
        self.post_ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, offset) if cfg.post_norms else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None,
                start_pos: int = 0, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        attn = self.attention(self.attention_norm(x), cos, sin, cache, start_pos, mask=mask)  # (B, T, D)
        if self.post_attention_norm is not None:
            attn = self.post_attention_norm(attn)
        h = x + attn
        ffn = self.feed_forward(self.ffn_norm(h))  # (B, T, D)
        if self.post_ffn_norm is not None:
            ffn = self.post_ffn_norm(ffn)
        return h + ffn


def _rope_rows(cos: torch.Tensor, sin: torch.Tensor, start_pos: int, T: int,
               position_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The table rows of the new tokens: (T, Dh/2) from start_pos, or (B, T, Dh/2) at explicit position ids."""
    if position_ids is None:
        return cos[start_pos:start_pos + T], sin[start_pos:start_pos + T]
    return cos[position_ids], sin[position_ids]


# ---------------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class ParamInit:
    """How a parameter starts: ``normal`` (mean 0, ``std``), ``ones`` or ``zeros``. ``key`` names the parameter
    whose random values it takes: itself, or the embedding for a tied head (so both copies of a tied matrix on
    different pipeline stages start equal)."""

    kind: str
    std: float = 0.0
    key: str = ""


class Transformer(nn.Module):
    """The decoder. tok_embeddings, norm and output may be set to None by a pipeline splitter (see forward)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        # A dict keyed "0".."L-1" keeps every layer's name (and so its checkpoint keys) stable after a
        # pipeline split deletes the layers that live on other stages.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, cfg.norm_unit_offset)
        self.output = OutputHead(cfg.dim, cfg.vocab_size)
        self.tie_weights()
        # Non-persistent: derived from the config, so not in state_dict; init_buffers recomputes them
        # after to_empty(). Under `with torch.device("meta")` they are meta tensors and cost nothing.
        cos, sin = precompute_rope(cfg, cfg.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, Dh/2)
        self.register_buffer("rope_sin", sin, persistent=False)  # (max_seq_len, Dh/2)
        if self.cfg.local_rope:  # sliding layers with their own base (Gemma 3)
            cos, sin = precompute_rope(cfg, cfg.max_seq_len, local=True)
            self.register_buffer("rope_cos_local", cos, persistent=False)
            self.register_buffer("rope_sin_local", sin, persistent=False)

    def tie_weights(self) -> None:
        """Make output.weight the tok_embeddings.weight object (tied flavours; both present). The engine calls it
        again after tensor parallelism, which replaces each module's parameters by its own DTensor."""
        if self.cfg.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def _apply(self, fn, recurse=True):
        # Module._apply replaces each module's parameters by new objects when moving off the meta device
        # (to_empty), which silently unties output.weight from tok_embeddings.weight; tie them again.
        module = super()._apply(fn, recurse)
        self.tie_weights()
        return module

    def param_init(self, name: str) -> ParamInit:
        """How parameter ``name`` (its state-dict name, e.g. ``layers.3.attention.wo.weight``) starts.

        Normal(0, init_std) for embeddings, projections and the head; the projections into the residual stream
        (wo, w2) use init_std / sqrt(2 · n_layers) (GPT-2's depth scaling; the global depth, also on a pipeline
        stage); norms start at one, biases at zero. A tied head draws the embedding's values.
        """
        cfg = self.cfg
        if name.endswith("norm.weight"):
            return ParamInit("zeros" if cfg.norm_unit_offset else "ones")  # (1 + w) norms start at w = 0
        if name.endswith(".bias"):
            return ParamInit("zeros")
        if name == "output.weight" and cfg.tie_embeddings:
            return ParamInit("normal", cfg.init_std, key="tok_embeddings.weight")
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            return ParamInit("normal", cfg.init_std / math.sqrt(2 * cfg.n_layers), key=name)
        if name == "tok_embeddings.weight" or name == "output.weight" or \
                name.endswith(("attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
                               "feed_forward.w1.weight", "feed_forward.w3.weight")):
            return ParamInit("normal", cfg.init_std, key=name)
        raise ValueError(f"no initialisation rule for parameter '{name}'")

    def init_buffers(self, device: torch.device | str) -> None:
        """Recompute the RoPE tables (after to_empty(), which leaves buffers uninitialised)."""
        self.rope_cos, self.rope_sin = precompute_rope(self.cfg, self.cfg.max_seq_len, device)
        if self.cfg.local_rope:
            self.rope_cos_local, self.rope_sin_local = precompute_rope(self.cfg, self.cfg.max_seq_len, device,
                                                                       local=True)

    def forward(self, tokens: torch.Tensor, *, cache: list[KVCache] | None = None, start_pos: int = 0,
                position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                padding_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T) ids -> logits (B, T, V); with ``labels`` (B, T), the summed fp32 cross-entropy instead,
        computed by the head without materialising the logits (meshlm/models/head.py; IGNORE_INDEX = -100 skips a
        position).

        On a pipeline stage without tok_embeddings the input is hidden states (B, T, D); without output the
        result is hidden states. With a cache (one KVCache per layer of this module, in order) the tokens sit
        at positions start_pos.., and their keys/values are appended to the cache.

        Packed rows: ``document_ids`` (B, T) makes attention block-diagonal causal (a token sees only earlier
        tokens with the same id), and ``position_ids`` (B, T) gives each token's RoPE position (restarting at 0
        per row, see :func:`positions_from_documents`; values must be < max_seq_len). With both, each packed row
        gets the logits it would get alone. document_ids cannot be combined with a cache.

        Left-padded batches (rows of different lengths, e.g. batched generation): ``padding_mask`` (B, S), True on
        real tokens over every attended position (cached + new), hides the pads from attention, and
        ``position_ids`` (allowed with a cache) give the real tokens their own positions.
        """
        B, T = tokens.shape[:2]  # from the input: under sequence parallelism h holds only T / tp positions
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens  # (B, T, D)
        if self.cfg.scale_embeddings and self.tok_embeddings is not None:
            h = h * torch.tensor(self.cfg.dim ** 0.5, dtype=h.dtype)  # sqrt(D) rounded to h's dtype, as HF's Gemma
        if start_pos + T > self.rope_cos.shape[0]:
            raise ValueError(f"positions up to {start_pos + T} exceed model.max_seq_len = {self.rope_cos.shape[0]}")
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache has {len(cache)} layers, model has {len(self.layers)}")
        for name, ids in (("position_ids", position_ids), ("document_ids", document_ids)):
            if ids is not None and tuple(ids.shape) != (B, T):
                raise ValueError(f"{name} must be (B, T) = {(B, T)}, got {tuple(ids.shape)}")
        if document_ids is not None and cache is not None:
            raise ValueError("document_ids (packed rows) cannot be combined with a KV cache")
        rope = {kind: _rope_rows(cos, sin, start_pos, T, position_ids)
                for kind, (cos, sin) in self.rope_by_kind().items()}
        num_keys = start_pos + T if cache is not None else T  # without a cache, attention sees only these T
        if padding_mask is not None and tuple(padding_mask.shape) != (B, num_keys):
            raise ValueError(f"padding_mask must be (B, S) = {(B, num_keys)}, got {tuple(padding_mask.shape)}")
        masks = self._attention_masks(T, num_keys, document_ids, padding_mask, tokens.device)
        kinds = self.cfg.resolved_layer_kinds()
        for i, (name, layer) in enumerate(self.layers.items()):
            cos, sin = rope[kinds[int(name)]]
            h = layer(h, cos, sin, cache[i] if cache is not None else None, start_pos, mask=masks[name])  # (B, T, D)
        if self.norm is not None:
            h = self.norm(h)
        if labels is not None:
            if not isinstance(self.output, OutputHead):
                raise ValueError("labels need the model's own output head (this module has none, or another)")
            return self.output(h, labels=labels)  # () summed cross-entropy
        return self.output(h) if self.output is not None else h  # (B, T, V) or (B, T, D)

    def rope_by_kind(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Layer kind -> its RoPE (cos, sin) tables (max_seq_len, Dh/2)."""
        local = (self.rope_cos_local, self.rope_sin_local) if self.cfg.local_rope else (self.rope_cos, self.rope_sin)
        return {"global": (self.rope_cos, self.rope_sin), "sliding": local}

    def _attention_masks(self, T: int, S: int, document_ids: torch.Tensor | None, key_mask: torch.Tensor | None,
                         device: torch.device) -> dict[str, torch.Tensor | None]:
        """Layer name -> its attention mask; built once per distinct window (layers keep their global index, so
        a pipeline stage's layers get their own windows)."""
        by_window: dict[int, torch.Tensor | None] = {}
        masks = {}
        for name in self.layers:
            window = self.cfg.layer_window(int(name))
            if window not in by_window:
                by_window[window] = attention_mask(T, S, window=window, document_ids=document_ids,
                                                   key_mask=key_mask, device=device)
            masks[name] = by_window[window]
        return masks

    def new_cache(self, batch_size: int, max_len: int, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> list[KVCache]:
        """One empty KVCache per layer of this module; device/dtype default to the model's."""
        if max_len > self.cfg.max_seq_len:
            raise ValueError(f"cache length {max_len} exceeds model.max_seq_len = {self.cfg.max_seq_len}")
        param = next(self.parameters())
        device = device if device is not None else param.device
        dtype = dtype if dtype is not None else param.dtype
        head_dim = self.cfg.resolved_head_dim
        return [KVCache(batch_size, self.cfg.n_kv_heads, max_len, head_dim, device, dtype) for _ in self.layers]

    def num_params(self, include_embedding: bool = True) -> int:
        """Unique parameters (a tied embedding counts once); equals cfg.num_params() for a whole model."""
        emb = self.tok_embeddings.weight if self.tok_embeddings is not None else None
        return sum(p.numel() for p in self.parameters() if include_embedding or p is not emb)
