"""The fast decode path (meshlm/generate/decode.py, packed.py) against the model's plain forward: the same logits
at prefill and at every decode step, and the same tokens from ``generate`` and ``rollout`` (greedy and seeded
sampling, left-padded prompts of different lengths), across the architecture flags; LoRA merged; the pack
follows in-place updates; models it cannot stand in for get their own forward."""

from __future__ import annotations

import os

import dataclasses

import pytest
import torch

from meshlm.generate import generate
from meshlm.generate.decode import FastForward, fast_forward
from meshlm.generate.packed import ROW_PACK_MAX_BATCH, packed_weights
from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import rollout
from meshlm.models import build_model, flavor_config
from meshlm.models.families.gemma3 import FLAGS as GEMMA3_FLAGS
from meshlm.models.lora import apply_lora, reset_lora_parameters

# fp32 throughout. The fast path sums the same products in other groupings (q/k/v in one matmul, residual adds
# inside addmm, attention as two matmuls): logits agree to ~1e-6 of their scale; 1e-4 absolute leaves room.
ATOL = 1e-4
ARCHS = {
    "llama": {},
    "qwen2-bias": dict(qkv_bias=True),
    "qwen3-qknorm": dict(qk_norm=True),
    "mistral-window": dict(sliding_window=6),
    "untied-mha": dict(tie_embeddings=False, n_kv_heads=4),
    # (1 + w) norms, post-norms, GeGLU, scaled embeddings, q/k norms, a query scalar, sliding layers with a RoPE
    # base of their own
    "gemma3": dict(family="gemma3", **GEMMA3_FLAGS, sliding_window=6, layer_kinds=["sliding", "global", "sliding"],
                   rope_local_theta=500.0, query_pre_attn_scalar=24.0),
}
PROMPTS = [[5, 17, 3], [9], [44, 12, 7, 10, 3, 81, 64], [20, 21]]


def tiny(seed: int = 0, **overrides):
    base = dict(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, vocab_size=97, max_seq_len=48,
                init_std=0.2)
    cfg = dataclasses.replace(flavor_config("debug"), **{**base, **overrides})
    model = build_model(cfg, "cpu", seed=seed).eval()
    with torch.no_grad():  # biases and norm weights start at zero or one: give them values the test sees
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
            elif "norm" in name:
                p.add_(torch.linspace(-0.2, 0.2, p.shape[0]))
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_the_plain_forward_at_prefill_and_each_step(arch):
    model = tiny(**ARCHS[arch])
    fast = fast_forward(model)
    assert isinstance(fast, FastForward)
    ids = torch.tensor([[5, 17, 3, 42, 8, 1, 30, 2]])  # (1, 8)
    slow_cache, fast_cache = model.new_cache(1, 20), model.new_cache(1, 20)
    with torch.no_grad():
        want = model(ids, cache=slow_cache, start_pos=0)[:, -1:]
        got = fast(ids, cache=fast_cache, start_pos=0)
        assert got.shape == (1, 1, 97)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        for pos in range(8, 16):  # past the window of 6: the decode steps' masks matter
            token = want[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            want = model(token, cache=slow_cache, start_pos=pos)
            torch.testing.assert_close(fast(token, cache=fast_cache, start_pos=pos), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_bf16_model_decodes_on_the_fast_path(arch):
    """A bf16 model's fast path keeps bf16 activations between ops as its plain forward does (RoPE's fp32 tables
    once promoted q and k to fp32 and the next product failed on the mixed dtypes)."""
    model = tiny(**ARCHS[arch]).to(torch.bfloat16)
    fast = fast_forward(model)
    assert isinstance(fast, FastForward)
    ids = torch.tensor([[5, 17, 3, 42, 8, 1, 30, 2]])
    slow_cache, fast_cache = model.new_cache(1, 20), model.new_cache(1, 20)
    with torch.no_grad():
        want = model(ids, cache=slow_cache, start_pos=0)[:, -1:]
        for pos in range(8, 12):
            got = fast(ids if pos == 8 else token, cache=fast_cache, start_pos=0 if pos == 8 else pos - 1)
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.02)
            token = want[:, -1].argmax(-1, keepdim=True)
            want = model(token, cache=slow_cache, start_pos=pos)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_row_pack_split_by_columns_keeps_the_logits(arch, splits, monkeypatch):
    """The row pack's matrices in ``splits`` column blocks (split.py; a CPU's cores decide how many, so both are
    forced here: 3 pads every odd width, e.g. the 97-token head) give the plain forward's logits at every step."""
    import meshlm.generate.packed as packed
    from meshlm.generate.split import SplitMatrix

    monkeypatch.setattr(packed, "row_splits", lambda device: splits)
    model = tiny(**ARCHS[arch])
    fast = fast_forward(model)
    pack = packed_weights(model, 1)
    assert isinstance(pack.head, SplitMatrix) == (splits > 1)
    assert all(isinstance(m, SplitMatrix) == (splits > 1) for layer in pack.layers
               for m in (*layer.wqkv, layer.wo, *layer.w13, layer.w2))
    slow_cache, fast_cache = model.new_cache(1, 20), model.new_cache(1, 20)
    token = torch.tensor([[5]])
    with torch.no_grad():
        model(torch.tensor([[5, 17, 3]]), cache=slow_cache, start_pos=0)
        fast(torch.tensor([[5, 17, 3]]), cache=fast_cache, start_pos=0)
        for pos in range(3, 12):  # one-row steps: the row pack
            want = model(token, cache=slow_cache, start_pos=pos)
            torch.testing.assert_close(fast(token, cache=fast_cache, start_pos=pos), want, atol=ATOL, rtol=0)
            token = want[:, -1].argmax(-1, keepdim=True)
    for prompt in PROMPTS:
        assert generate(model, prompt, 12, greedy=True) == generate(model, prompt, 12, greedy=True, fast=False)


def test_split_matrix_is_the_product_of_its_matrix():
    from meshlm.generate.split import SplitMatrix, row_splits

    g = torch.Generator().manual_seed(0)
    for rows, cols, splits in ((6, 10, 2), (6, 11, 3), (5, 7, 8), (4, 9, 1)):
        w = torch.randn(rows, cols, generator=g)
        m = SplitMatrix(w, splits)
        assert m.shape == (rows, cols) and torch.equal(m.dense(), w)
        assert m.nbytes() == splits * rows * -(-cols // splits) * 4  # the padded blocks, counted as held
        for n in (1, 3):
            x = torch.randn(n, rows, generator=g)
            got = m(x)
            assert got.shape == (n, cols) and got.is_contiguous()
            torch.testing.assert_close(got, x @ w, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="splits >= 1"):
        SplitMatrix(torch.zeros(2, 2), 0)
    assert row_splits(torch.device("meta")) == 1  # not a CPU: one block
    assert 1 <= row_splits(torch.device("cpu")) <= 8


@pytest.mark.parametrize("arch, rows", [("llama", 1), ("qwen2-bias", 1), ("mistral-window", 4), ("qwen2-bias", 8),
                                        ("llama", 8), ("gemma3", 4)])
def test_padded_batch_logits_equal_the_plain_forward(arch, rows):
    # a one-row decode step takes the row pack (fused copies); more rows (and every prefill of several tokens) the
    # view pack (the model's own weights), multiplied with the operands swapped: ROW_PACK_MAX_BATCH
    assert ROW_PACK_MAX_BATCH == 1
    model = tiny(**ARCHS[arch])
    cfg = SamplingParams(max_tokens=10, temperature=0.0)
    prompts = (PROMPTS * 2)[:rows]
    slow = rollout(model, prompts, cfg, fast=False)
    got = rollout(model, prompts, cfg)
    assert torch.equal(got.response_ids, slow.response_ids)
    torch.testing.assert_close(got.logprobs, slow.logprobs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_greedy_and_seeded_sampling_match_the_plain_forward(arch):
    model = tiny(**ARCHS[arch])
    for prompt in PROMPTS:
        assert generate(model, prompt, 20, greedy=True) == generate(model, prompt, 20, greedy=True, fast=False)
        kwargs = dict(temperature=1.5, top_k=20, top_p=0.9, seed=3)
        assert generate(model, prompt, 20, **kwargs) == generate(model, prompt, 20, fast=False, **kwargs)


def test_rollout_seeded_sampling_and_eos_match_the_plain_forward():
    model = tiny()
    cfg = SamplingParams(max_tokens=16, stop_ids=(7, 11), temperature=1.3, top_p=0.95)
    for kwargs in (dict(generator=torch.Generator().manual_seed(5)), dict(row_seeds=[1, 2, 3, 4])):
        slow = rollout(model, PROMPTS, cfg, fast=False, **{k: _fresh(v) for k, v in kwargs.items()})
        got = rollout(model, PROMPTS, cfg, **{k: _fresh(v) for k, v in kwargs.items()})
        assert torch.equal(got.response_ids, slow.response_ids)
        assert torch.equal(got.response_mask, slow.response_mask)
        torch.testing.assert_close(got.logprobs, slow.logprobs, atol=ATOL, rtol=0)


def _fresh(value):
    """A generator with the same seed for each run (so both runs draw the same numbers)."""
    if isinstance(value, torch.Generator):
        return torch.Generator().manual_seed(value.initial_seed())
    return value


def test_lora_updates_are_merged_into_the_pack():
    model = tiny()
    apply_lora(model, ["q", "k", "v", "o", "gate", "up", "down"], rank=4, alpha=8.0, dropout=0.0)
    reset_lora_parameters(model, seed=1)
    with torch.no_grad():  # B starts at zero: make the update non-zero
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.3)
    model.eval()
    assert isinstance(fast_forward(model), FastForward)
    for prompt in PROMPTS:
        assert generate(model, prompt, 12, greedy=True) == generate(model, prompt, 12, greedy=True, fast=False)


def test_pack_follows_in_place_updates_and_is_reused_otherwise():
    model = tiny()
    first = packed_weights(model, 1)
    assert packed_weights(model, 1) is first
    before = generate(model, PROMPTS[0], 10, greedy=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.5)  # an optimizer step, in effect
    assert packed_weights(model, 1) is not first
    after = generate(model, PROMPTS[0], 10, greedy=True)
    assert after == generate(model, PROMPTS[0], 10, greedy=True, fast=False)
    assert after != before


def test_models_it_cannot_replace_keep_their_own_forward():
    model = tiny()
    model.output = None  # e.g. a pipeline stage, or a model whose head is not a vocabulary head
    assert fast_forward(model) is model
    plain = torch.nn.Linear(3, 3)
    assert fast_forward(plain) is plain


def test_thread_policy_follows_the_measured_table():
    from meshlm.generate.decode import ONE_THREAD_MAX_ROWS, forward_threads

    cpu = torch.device("cpu")
    for batch, length in ((1, 1), (64, 1), (1, 32), (1, 512), (16, 32)):  # measured on an oversubscribed CPU
        assert forward_threads(batch, length, cpu, 2, oversubscribed=True) == 1
    # a quiet machine's forwards keep the process's threads (two beat one there: 71 vs 104 ms for a 32-token
    # prompt, 64 vs 89 ms for a 16-row step; a one-row step's products 13 vs 25 ms since they are split by columns)
    for batch, length in ((1, 1), (16, 1), (4, 1), (1, 8), (1, 32), (1, 129)):
        assert forward_threads(batch, length, cpu, 4, oversubscribed=False) == 4
    assert forward_threads(1, ONE_THREAD_MAX_ROWS + 1, cpu, 2, oversubscribed=True) == 2  # beyond the table
    assert forward_threads(32, 32, cpu, 4, oversubscribed=True) == 4
    assert forward_threads(1, 1, torch.device("cuda"), 8) == 8  # measured on CPU only


def test_oversubscription_is_read_from_the_load_average(monkeypatch):
    import meshlm.generate.decode as decode

    cores = len(os.sched_getaffinity(0))
    for load, expected in ((cores + 0.5, True), (max(cores - 0.5, 0.0), False)):
        monkeypatch.setattr(decode.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        monkeypatch.setattr(decode, "_load_seen", [float("-inf"), 0.0, 0.0, 0.0])
        assert decode.cpu_oversubscribed() is expected
        assert decode.forward_threads(16, 1, torch.device("cpu"), 2) == (1 if expected else 2)


def test_the_process_own_load_is_not_read_as_oversubscription(monkeypatch):
    """Regression: the load average counts this process's own busy threads, so a two-thread decode on a quiet
    two-core machine read its own load (~2) as oversubscription and fell back to one thread a minute later."""
    import meshlm.generate.decode as decode

    cores = len(os.sched_getaffinity(0))
    clock = {"wall": 1000.0, "cpu": 50.0}
    monkeypatch.setattr(decode.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(decode.time, "process_time", lambda: clock["cpu"])
    monkeypatch.setattr(decode, "_load_seen", [float("-inf"), 0.0, 0.0, 0.0])
    load = {"now": 0.2}
    monkeypatch.setattr(decode.os, "getloadavg", lambda: (load["now"], 0.0, 0.0))
    assert decode.cpu_oversubscribed() is False
    for _ in range(300):  # five minutes of this process alone using every core: the load average follows it
        clock["wall"] += 1.0
        clock["cpu"] += cores
        load["now"] = cores + 0.2
        decode.cpu_oversubscribed()
    assert decode.cpu_oversubscribed() is False  # the load is this process's own
    for _ in range(300):  # then it idles while other processes hold every core
        clock["wall"] += 1.0
        decode.cpu_oversubscribed()
    assert decode.cpu_oversubscribed() is True


def test_forwards_run_on_the_policy_threads_and_restore_the_count(monkeypatch):
    """Regression (issue 31): a one-sequence prefill ran on the process's threads, the decode steps on one; on the
    shared 2-core machine the two-thread prefill made the time to first token 1.9 s against 0.3 s; a batch of 16
    decoded on two threads at 0.32-0.35x transformers (one thread: docs/benchmarks.md "Threads per forward")."""
    import meshlm.generate.decode as decode
    from meshlm.generate.decode import ONE_THREAD_MAX_ROWS, _forward_threads

    monkeypatch.setattr(decode, "cpu_oversubscribed", lambda: True)  # the shared machine the table was measured on
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with _forward_threads(1, 32, torch.device("cpu")):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with _forward_threads(16, 1, torch.device("cpu")):  # a batch's decode step: one thread when oversubscribed
            assert torch.get_num_threads() == 1
        with _forward_threads(1, ONE_THREAD_MAX_ROWS + 1, torch.device("cpu")):  # beyond the measured rows
            assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="boom"), _forward_threads(1, 32, torch.device("cpu")):
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
        model = tiny()
        net = fast_forward(model)
        seen = []
        forward = net._forward
        net._forward = lambda *a: seen.append((a[0].shape, torch.get_num_threads())) or forward(*a)
        with torch.inference_mode():
            net(torch.randint(0, model.cfg.vocab_size, (1, 8)), cache=model.new_cache(1, 9))  # a prefill
            net(torch.randint(0, model.cfg.vocab_size, (3, 8)), cache=model.new_cache(3, 9))  # a batch's
        assert seen == [((1, 8), 1), ((3, 8), 1)] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_pack_variant_by_rows_cores_and_weights(monkeypatch):
    """Multi-core CPU: the row pack's column blocks for one row and from 5 rows (prefills too), the view pack's
    swapped products for 2-4 rows (packed.py's table); one core: the row pack for one row only; an int8 model's
    prefill never makes an fp32 copy; other devices keep their own threshold."""
    import meshlm.generate.packed as packed
    from meshlm.generate.packed import pack_variant

    model = tiny()
    monkeypatch.setattr(packed, "row_splits", lambda device: 2)
    assert [pack_variant(model, n) for n in (1, 2, 4, 5, 16, 512)] == ["rows", "views", "views", "rows", "rows", "rows"]
    assert pack_variant(model, 16, copies=False) == pack_variant(model, 1, copies=False) == "views"
    assert pack_variant(model, 1, "int8") == pack_variant(model, 64, "int8") == "int8"
    monkeypatch.setattr(packed, "row_splits", lambda device: 1)
    assert [pack_variant(model, n) for n in (1, 2, 4, 5, 16)] == ["rows", "views", "views", "views", "views"]
    int8 = FastForward(model, "int8")
    monkeypatch.setattr(packed, "row_splits", lambda device: 2)
    packed._PACKS.pop(model, None)
    int8.prepare(1)
    assert set(packed._PACKS[model]) == {"int8", "views"}  # decode steps int8, the prefill on views: no fp32 copy


def test_training_rollouts_multiply_the_model_own_weights(monkeypatch):
    """rollout(copies=False), what GRPO/PPO use: no column-block copy is made (a sharded layout's plain forward sums
    the products in its own order, and parity with it needs the same; test_rl's parity cases failed without), and
    the tokens are the plain forward's."""
    import meshlm.generate.packed as packed

    monkeypatch.setattr(packed, "row_splits", lambda device: 2)
    model = tiny()
    cfg = SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    for prompts in (PROMPTS[:1], PROMPTS * 2):
        got = rollout(model, prompts, cfg, copies=False)
        assert torch.equal(got.response_ids, rollout(model, prompts, cfg, fast=False).response_ids)
    assert set(packed._PACKS[model]) == {"views"}
