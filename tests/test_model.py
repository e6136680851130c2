"""The Llama-family decoder: shapes, masking, RoPE, GQA, a reference attention, init, parameter counts, KV cache."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from meshlm.models import FLAVORS, ModelConfig, Transformer, build_model, flavor_config
from meshlm.models.llama import (
    Attention,
    FeedForward,
    RMSNorm,
    apply_rope,
    attention_mask,
    positions_from_documents,
    precompute_rope,
    rope_inv_freq,
)

# fp32 on CPU. Two computations of the same math in a different order (a T=1 sdpa against the cache vs one
# causal block, different matmul blockings) differ by fp32 rounding, ~1e-7 relative per op, accumulated over
# a few layers; logits here are O(1). 1e-5 leaves margin for that while a wrong position, mask or head
# mapping shows up at O(1e-2) or more.
ATOL = 1e-5


def tiny_cfg(**overrides) -> ModelConfig:
    """Two layers, 4 query heads over 2 kv heads; init_std 0.1 so attention is far from uniform."""
    base = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, vocab_size=97, max_seq_len=32,
                init_std=0.1)
    return dataclasses.replace(flavor_config("debug"), **{**base, **overrides})


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    return build_model(tiny_cfg(**overrides), "cpu", seed=seed).eval()


def tokens(batch: int = 2, seq: int = 12, vocab: int = 97, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ shapes and masking
def test_forward_shape_and_dtype():
    model = tiny_model()
    logits = model(tokens())
    assert logits.shape == (2, 12, 97)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(tokens(seq=4)).dtype == torch.bfloat16


def test_changing_future_tokens_leaves_past_logits_unchanged():
    model = tiny_model()
    x = tokens()
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 1) % 97
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=0, rtol=0)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-3  # the change itself is visible


def test_forward_past_max_seq_len_raises():
    model = tiny_model(max_seq_len=8)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(tokens(seq=9))


# ------------------------------------------------------------------------------------------------------ RoPE
def test_rope_scores_depend_only_on_relative_position():
    cfg = tiny_cfg(head_dim=16)
    cos, sin = precompute_rope(cfg, 32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rope(q, cos[m:m + 1], sin[m:m + 1])
        kn = apply_rope(k, cos[n:n + 1], sin[n:n + 1])
        return (qm * kn).sum()

    for m, n, shift in [(5, 2, 7), (0, 3, 20), (9, 9, 13)]:
        torch.testing.assert_close(score(m, n), score(m + shift, n + shift), atol=1e-5, rtol=1e-5)
    assert (score(5, 2) - score(5, 3)).abs() > 1e-3  # a different offset gives a different score


def test_rope_uses_rotate_half_layout():
    """Channel i pairs with channel i + Dh/2 (HF layout), rotated by pos * inv_freq[i]."""
    cfg = tiny_cfg(head_dim=8)
    cos, sin = precompute_rope(cfg, 8)
    inv_freq = rope_inv_freq(cfg)
    x = torch.zeros(1, 1, 1, 8)
    x[..., 1] = 1.0
    out = apply_rope(x, cos[3:4], sin[3:4]).flatten()
    angle = 3 * inv_freq[1]
    expected = torch.zeros(8)
    expected[1], expected[5] = torch.cos(angle), torch.sin(angle)
    torch.testing.assert_close(out, expected)


def _llama3_reference(freqs: list[float], factor: float, low: float, high: float, old_len: int) -> list[float]:
    """The published formula (Meta's llama3.1 apply_scaling), one frequency at a time in Python floats."""
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(freq)
        elif wavelen > old_len / low:
            out.append(freq / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


def test_llama3_rope_scaling_matches_published_formula():
    cfg = flavor_config("llama3-8b")  # theta 5e5, factor 8, low 1, high 4, original 8192; Dh = 128
    plain = [cfg.rope_theta ** (-2 * i / 128) for i in range(64)]
    expected = torch.tensor(_llama3_reference(plain, 8.0, 1.0, 4.0, 8192))
    got = rope_inv_freq(cfg)
    torch.testing.assert_close(got.double(), expected.double(), rtol=1e-5, atol=0)
    # All three regimes occur: kept, divided by the factor, and interpolated.
    ratio = got / torch.tensor(plain)
    assert (ratio > 0.999).any() and (ratio < 0.126).any() and ((ratio > 0.13) & (ratio < 0.99)).any()


def test_rope_scaling_none_is_the_plain_formula():
    cfg = dataclasses.replace(flavor_config("llama3-8b"), rope_scaling="none")
    plain = torch.tensor([cfg.rope_theta ** (-2 * i / 128) for i in range(64)])
    torch.testing.assert_close(rope_inv_freq(cfg).double(), plain.double(), rtol=1e-5, atol=0)


# ----------------------------------------------------------------------------------------------- attention
def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa = tiny_model(n_heads=4, n_kv_heads=2)
    mha = Transformer(tiny_cfg(n_heads=4, n_kv_heads=4)).eval()
    state = gqa.state_dict()
    for name in list(state):
        if name.endswith(("attention.wk.weight", "attention.wv.weight")):
            w = state[name].view(2, 8, 32)  # (Hkv, Dh, D)
            state[name] = w.repeat_interleave(2, dim=0).reshape(32, 32)  # query head h reads kv head h // 2
    mha.load_state_dict(state)
    x = tokens()
    torch.testing.assert_close(gqa(x), mha(x), atol=ATOL, rtol=0)


def _reference_attention(attn: Attention, cfg: ModelConfig, x: torch.Tensor, window: int = 0) -> torch.Tensor:
    """softmax(QK^T / sqrt(d) + causal mask) V written out, with RoPE and qk-norm from their definitions; with
    ``window`` query i also ignores keys j with i - j >= window (HF's sliding window)."""
    B, T, _ = x.shape
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
    q = torch.nn.functional.linear(x, attn.wq.weight, attn.wq.bias).view(B, T, H, Dh)
    k = torch.nn.functional.linear(x, attn.wk.weight, attn.wk.bias).view(B, T, Hkv, Dh)
    v = torch.nn.functional.linear(x, attn.wv.weight, attn.wv.bias).view(B, T, Hkv, Dh)
    if cfg.qk_norm:
        q = q / q.pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt() * attn.q_norm.weight
        k = k / k.pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt() * attn.k_norm.weight
    inv_freq = torch.tensor([cfg.rope_theta ** (-2 * i / Dh) for i in range(Dh // 2)])
    angles = torch.arange(T).float()[:, None] * inv_freq  # (T, Dh/2)
    cos = torch.cat([angles.cos(), angles.cos()], -1)[None, :, None]  # (1, T, 1, Dh) HF-style full tables
    sin = torch.cat([angles.sin(), angles.sin()], -1)[None, :, None]

    def rotate_half(t):
        return torch.cat([-t[..., Dh // 2:], t[..., :Dh // 2]], -1)

    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)  # (B, T, H, Dh)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(Dh)  # (B, H, T, T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    if window:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).tril(-window), float("-inf"))
    out = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, H * Dh)
    return out @ attn.wo.weight.T


@pytest.mark.parametrize("window", [0, 4])
@pytest.mark.parametrize("flags", [{}, {"qkv_bias": True}, {"qk_norm": True}, {"n_kv_heads": 1, "head_dim": 16}])
def test_attention_matches_explicit_reference(flags, window):
    cfg = tiny_cfg(**flags)
    torch.manual_seed(0)
    attn = Attention(cfg)
    with torch.no_grad():  # non-trivial biases and norm weights, so that their use is checked too
        for p in attn.parameters():
            if p.ndim == 1:
                p.copy_(1.0 + torch.randn_like(p) * 0.3)
            else:
                p.normal_(0.0, 0.1)
    x = torch.randn(2, 10, 32)
    cos, sin = precompute_rope(cfg, 10)
    mask = attention_mask(10, 10, window=window)
    assert (mask is None) == (window == 0)  # the plain causal case keeps sdpa's is_causal path
    out = attn(x, cos, sin, mask=mask)
    torch.testing.assert_close(out, _reference_attention(attn, cfg, x, window), atol=ATOL, rtol=1e-5)
    if window:  # the window matters: without it the late positions differ
        assert (out - attn(x, cos, sin))[:, window:].abs().max() > 1e-3


def test_attention_follows_sharded_weights_like_tensor_parallel():
    """Column-sharding wq/wk/wv by whole heads and row-sharding wo needs no model change: shards sum to the whole."""
    cfg = tiny_cfg()  # 4 heads over 2 kv heads, Dh 8: shard r holds q heads 2r, 2r+1 and kv head r
    torch.manual_seed(0)
    full = Attention(cfg)
    x = torch.randn(2, 6, 32)
    cos, sin = precompute_rope(cfg, 6)
    total = torch.zeros(2, 6, 32)
    for r in range(2):
        shard = copy.deepcopy(full)
        for name, rows in (("wq", 16), ("wk", 8), ("wv", 8)):
            weight = getattr(full, name).weight[r * rows:(r + 1) * rows]
            setattr(shard, name, torch.nn.Linear(32, rows, bias=False))
            getattr(shard, name).weight = torch.nn.Parameter(weight.clone())
        shard.wo = torch.nn.Linear(16, 32, bias=False)
        shard.wo.weight = torch.nn.Parameter(full.wo.weight[:, r * 16:(r + 1) * 16].clone())
        total += shard(x, cos, sin)
    torch.testing.assert_close(total, full(x, cos, sin), atol=ATOL, rtol=1e-5)


def test_feed_forward_is_swiglu_with_w1_as_gate():
    ffn = FeedForward(8, 16)  # w1 = HF gate_proj, w3 = up_proj, w2 = down_proj: the HF conversion relies on it
    x = torch.randn(3, 8)
    expected = (torch.nn.functional.silu(x @ ffn.w1.weight.T) * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)


def test_rms_norm_matches_definition_and_keeps_dtype():
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    x = torch.randn(4, 16) * 3
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    assert norm.to(torch.bfloat16)(x.bfloat16()).dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------- structure
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_optional_bias_and_qk_norm_follow_flags(qkv_bias, qk_norm):
    with torch.device("meta"):
        model = Transformer(tiny_cfg(qkv_bias=qkv_bias, qk_norm=qk_norm))
    names = {n for n, _ in model.named_parameters()}
    attn = "layers.1.attention."
    assert all((attn + f"{w}.bias" in names) == qkv_bias for w in ("wq", "wk", "wv"))
    assert attn + "wo.bias" not in names
    assert (attn + "q_norm.weight" in names) == qk_norm and (attn + "k_norm.weight" in names) == qk_norm
    assert {"tok_embeddings.weight", "norm.weight", "output.weight", "layers.0.feed_forward.w1.weight",
            "layers.0.feed_forward.w2.weight", "layers.0.feed_forward.w3.weight",
            "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight"} <= names


def test_tied_embeddings_share_storage_after_meta_build():
    tied = tiny_model(tie_embeddings=True)
    assert tied.output.weight is tied.tok_embeddings.weight
    assert tied.output.weight.data_ptr() == tied.tok_embeddings.weight.data_ptr()
    tied.load_state_dict(copy.deepcopy(tied.state_dict()))
    assert tied.output.weight is tied.tok_embeddings.weight
    with torch.device("meta"):
        bare = Transformer(tiny_cfg(tie_embeddings=True))
    bare.to_empty(device="cpu")  # Module._apply would untie these (new Parameter objects) if not re-tied
    assert bare.output.weight is bare.tok_embeddings.weight
    untied = tiny_model(tie_embeddings=False)
    assert untied.output.weight.data_ptr() != untied.tok_embeddings.weight.data_ptr()


def test_meta_build_then_init_gives_expected_weights():
    cfg = flavor_config("debug")  # 64 wide, 4 layers: enough entries to estimate each std within a few %
    model = build_model(cfg, "cpu", seed=0)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())
    out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        elif name.endswith(("wo.weight", "w2.weight")):
            assert abs(p.std().item() / out_std - 1) < 0.1, name
        else:
            assert abs(p.std().item() / cfg.init_std - 1) < 0.1, name
            assert abs(p.mean().item()) < 0.1 * cfg.init_std, name
    cos, sin = precompute_rope(cfg, cfg.max_seq_len)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    assert not any("rope" in key for key in model.state_dict())


def test_init_is_reproducible_from_seed_and_zeroes_biases():
    a, b, c = tiny_model(seed=3, qkv_bias=True), tiny_model(seed=3, qkv_bias=True), tiny_model(seed=4)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
        if name.endswith(".bias"):
            assert torch.equal(pa, torch.zeros_like(pa)), name
    assert not torch.equal(a.tok_embeddings.weight, c.tok_embeddings.weight)


@pytest.mark.parametrize("name", sorted(FLAVORS))
def test_num_params_matches_config_for_every_flavour(name):
    cfg = flavor_config(name)
    with torch.device("meta"):  # never allocates: the 405B model costs nothing here
        model = Transformer(cfg)
    assert model.num_params() == cfg.num_params()
    assert model.num_params(include_embedding=False) == cfg.num_params(include_embedding=False)


@pytest.mark.parametrize("flags", [{"qk_norm": True, "tie_embeddings": True}, {"qkv_bias": True, "head_dim": 16}])
def test_num_params_matches_config_for_optional_features(flags):
    cfg = tiny_cfg(**flags)
    with torch.device("meta"):
        model = Transformer(cfg)
    assert model.num_params() == cfg.num_params()
    assert model.num_params(include_embedding=False) == cfg.num_params(include_embedding=False)


def test_pipeline_stages_with_missing_modules_compose_to_the_full_model():
    model = tiny_model(n_layers=4, tie_embeddings=True)
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    del first.layers["2"], first.layers["3"]
    first.norm, first.output = None, None
    del last.layers["0"], last.layers["1"]
    last.tok_embeddings = None
    assert "layers.2.attention.wq.weight" in last.state_dict()  # names survive the split
    x = tokens()
    hidden = first(x)
    assert hidden.shape == (2, 12, 32)
    torch.testing.assert_close(last(hidden), model(x), atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------- KV cache
def test_kv_cache_decoding_matches_full_forward():
    model = tiny_model()
    x = tokens(seq=16)
    full = model(x)  # (B, 16, V)
    cache = model.new_cache(batch_size=2, max_len=16)
    with torch.no_grad():
        steps = [model(x[:, :5], cache=cache, start_pos=0)]  # causal prefill of 5
        steps.append(model(x[:, 5:9], cache=cache, start_pos=5))  # a chunk appended to a filled cache
        steps += [model(x[:, t:t + 1], cache=cache, start_pos=t) for t in range(9, 16)]  # single steps
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="KV cache"):
        model(x[:, :1], cache=cache, start_pos=16)


# ------------------------------------------------------------------------------- sliding window and packing
def _mask_by_definition(T: int, S: int, window: int, docs: list[int] | None) -> torch.Tensor:
    """(T, S): query t (position S - T + t) sees key j iff j <= it, it - j < window (if any), same document."""
    out = torch.zeros(T, S, dtype=torch.bool)
    for t in range(T):
        i = S - T + t
        for j in range(S):
            out[t, j] = j <= i and (not window or i - j < window) and (docs is None or docs[i] == docs[j])
    return out


@pytest.mark.parametrize("T, S, window, docs", [(6, 6, 3, None), (3, 9, 4, None), (1, 9, 4, None),
                                                 (7, 7, 0, [0, 0, 0, 1, 1, 2, 2]), (7, 7, 2, [5, 5, 5, 5, 1, 1, 1])])
def test_attention_mask_follows_its_definition(T, S, window, docs):
    doc_ids = torch.tensor([docs]) if docs else None
    mask = attention_mask(T, S, window=window, document_ids=doc_ids)
    assert mask.shape == (1, 1, T, S) and mask.dtype == torch.bool
    assert torch.equal(mask[0, 0], _mask_by_definition(T, S, window, docs))
    assert attention_mask(5, 5, window=5) is None  # a window as long as the sequence is no window


def test_sliding_window_changes_only_positions_past_the_window():
    plain, windowed = tiny_model(), tiny_model(sliding_window=5)
    x = tokens(seq=16)
    a, b = plain(x), windowed(x)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=0, rtol=0)  # within the window: the same computation
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3
    every_layer_full = tiny_model(sliding_window=5, full_attention_layers=2)  # Qwen2's max_window_layers = L
    torch.testing.assert_close(every_layer_full(x), a, atol=0, rtol=0)
    second_only = tiny_model(sliding_window=5, full_attention_layers=1)
    assert (second_only(x) - a)[:, 5:].abs().max() > 1e-4 and (second_only(x) - b)[:, 5:].abs().max() > 1e-4


@pytest.mark.parametrize("full_layers", [0, 1])
def test_sliding_window_kv_cache_decoding_matches_full_forward(full_layers):
    model = tiny_model(sliding_window=4, full_attention_layers=full_layers)
    x = tokens(seq=16)
    full = model(x)
    cache = model.new_cache(batch_size=2, max_len=16)
    with torch.no_grad():
        steps = [model(x[:, :6], cache=cache, start_pos=0)]  # prefill longer than the window
        steps.append(model(x[:, 6:9], cache=cache, start_pos=6))  # chunked prefill against the cache
        steps += [model(x[:, t:t + 1], cache=cache, start_pos=t) for t in range(9, 16)]  # decode
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_positions_from_documents():
    docs = torch.tensor([[7, 7, 7, 2, 2, 9], [1, 1, 1, 1, 1, 1]])
    assert positions_from_documents(docs).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


@pytest.mark.parametrize("flags", [{}, {"sliding_window": 3}, {"qk_norm": True, "n_kv_heads": 1}])
def test_packed_rows_give_the_logits_and_gradients_of_each_row_alone(flags):
    """Three rows packed in one sequence with document ids and restarting positions = each row run alone."""
    model = tiny_model(**flags)
    rows = [tokens(1, n, seed=s)[0] for n, s in ((5, 1), (7, 2), (4, 3))]
    packed = torch.cat(rows)[None]  # (1, 16)
    docs = torch.cat([torch.full((len(r),), i) for i, r in enumerate(rows)])[None]  # (1, 16)
    logits = model(packed, position_ids=positions_from_documents(docs), document_ids=docs)  # (1, 16, V)
    alone = torch.cat([model(r[None]) for r in rows], dim=1)  # (1, 16, V)
    torch.testing.assert_close(logits, alone, atol=ATOL, rtol=0)  # fp32, <= 1e-5 per token
    assert (model(packed) - alone)[:, 5:].abs().max() > 1e-3  # without the masks the rows would contaminate

    grads = []
    for out in (logits, alone):  # the same scalar through both graphs gives the same parameter gradients
        model.zero_grad()
        out.float().logsumexp(-1).sum().backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], atol=ATOL, rtol=1e-4, msg=name)


def test_document_ids_refuse_a_cache_and_wrong_shapes():
    model = tiny_model()
    x = tokens(seq=6)
    with pytest.raises(ValueError, match="document_ids"):
        model(x, document_ids=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="cannot be combined with a KV cache"):
        model(x, cache=model.new_cache(2, 6), document_ids=torch.zeros(2, 6, dtype=torch.long))
