"""The serving engine's prefix cache (meshlm/serve/prefix.py): a prompt that starts with a kept prompt prefills only
its remaining tokens, and decodes what a whole prefill decodes; the cache keeps to its byte budget."""

from __future__ import annotations

import torch

from meshlm.generate import generate
from meshlm.generate.decode import FastForward
from meshlm.serve.engine import BatchEngine
from meshlm.serve.prefix import PrefixCache
from meshlm.serve.protocol import Sampling
from tests.test_generate import tiny_model
from tests.test_serve_engine import DigitTokenizer, _collect

SYSTEM = [(7 * i + 3) % 90 + 1 for i in range(24)]  # a shared "system prompt" of 24 tokens


def _run(engine: BatchEngine, prompts: list[list[int]], steps: int, together: bool = False):
    """Greedy tokens of each prompt: one after another (each finished before the next is sent), or all at once."""
    out = []
    jobs = []
    for prompt in prompts:
        jobs.append(_collect(engine, prompt, steps, Sampling(temperature=0.0)))
        if not together:
            assert jobs[-1][1].wait(60)
    for seq, done in jobs:
        assert done.wait(60)
        out.append(seq.generated)
    return out


def test_a_later_turn_and_another_user_reuse_the_kept_keys_and_decode_the_same_tokens():
    model = tiny_model(max_seq_len=96)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=8, max_queue=16, prefix_cache_bytes=1 << 20)
    turn1 = SYSTEM + [11, 12, 13, 14]
    turn2 = turn1 + [20, 21, 22, 23, 24, 25]  # the next turn carries the first
    other = SYSTEM + [40, 41, 42]  # another user, the same system prompt
    try:
        got = _run(engine, [turn1, turn2, other], 10)
        stats = engine.status()["prefix_cache"]
    finally:
        engine.close()
    assert got == [generate(model, p, 10, greedy=True) for p in (turn1, turn2, other)]
    # turn 2 reused all of turn 1; the other user the 24 system tokens (of turn 2, which replaced turn 1)
    assert stats["hits"] == 2 and stats["tokens_reused"] == len(turn1) + len(SYSTEM)
    assert stats["entries"] == 2 and stats["lookups"] == 3  # turn 2 covers turn 1: turn 1 left


def test_reused_keys_give_the_whole_prefill_logits_to_rounding():
    model = tiny_model(max_seq_len=64)
    fast = FastForward(model)
    prompt = SYSTEM + [5, 6, 7, 8, 9]
    with torch.inference_mode():
        whole_cache = model.new_cache(1, len(prompt))
        whole = fast(torch.tensor([prompt]), cache=whole_cache)
        kept = PrefixCache(1 << 20, min_tokens=4)
        kept.store(SYSTEM, [c.k[0, :, :len(SYSTEM)] for c in whole_cache], [c.v[0, :, :len(SYSTEM)] for c in whole_cache])
        n, keys, values = kept.find(prompt)
        cache = model.new_cache(1, len(prompt))
        for c, k, v in zip(cache, keys, values):
            c.k[0, :, :n], c.v[0, :, :n] = k, v
        part = fast(torch.tensor([prompt[n:]]), cache=cache, start_pos=n)
    assert n == len(SYSTEM)
    assert torch.allclose(part, whole, atol=1e-5, rtol=0), float((part - whole).abs().max())
    assert torch.allclose(cache[-1].k, whole_cache[-1].k, atol=1e-5, rtol=0)


def test_requests_joining_together_mix_reused_and_whole_prefills():
    model = tiny_model(max_seq_len=96)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=8, max_queue=16, prefix_cache_bytes=1 << 20)
    cold = [[3, 1, 4, 1, 5], list(range(50, 80))]
    warm = [SYSTEM + [60, 61], SYSTEM + [62, 63, 64, 65, 66, 67, 68]]
    try:
        _run(engine, [SYSTEM + [1]], 2)  # keeps the system prompt
        got = _run(engine, [cold[0], warm[0], cold[1], warm[1]], 12, together=True)
        stats = engine.status()
    finally:
        engine.close()
    assert got == [generate(model, p, 12, greedy=True) for p in (cold[0], warm[0], cold[1], warm[1])]
    assert stats["prefix_cache"]["hits"] >= 2 and stats["active"] == 0


def test_the_budget_evicts_the_least_recently_used_and_short_prompts_are_not_kept():
    layer = (2, 1, 4)  # (Hkv, P, Dh) per token: 2 * 4 floats of keys, as many values

    def kv(length: int) -> list[torch.Tensor]:
        return [torch.randn(layer[0], length, layer[2])]

    per_token = 2 * 2 * 4 * 4  # keys and values, 2 heads x 4 dims, 4 bytes
    cache = PrefixCache(max_bytes=per_token * 45, min_tokens=4)
    a, b, c = list(range(1, 21)), list(range(30, 50)), list(range(60, 80))
    cache.store(a, kv(20), kv(20))
    cache.store(b, kv(20), kv(20))
    assert cache.find(a + [99])[0] == 20  # a is now the most recently used
    cache.store(c, kv(20), kv(20))  # 60 tokens > 45: b (least recently used) leaves
    assert cache.find(b + [99]) is None and cache.find(c + [99])[0] == 20 and len(cache) == 2
    assert cache.bytes == per_token * 40 <= cache.max_bytes and cache.stats["evicted"] == 1
    cache.store([1, 2, 3], kv(3), kv(3))  # not longer than min_tokens: not kept
    assert len(cache) == 2
    assert cache.find(a) is not None and cache.find(a)[0] == 19  # the last token is always prefilled
    cache.store(a[:10], kv(10), kv(10))  # a kept prompt already starts with it: nothing new
    assert len(cache) == 2
    assert cache.find([1, 2, 3, 77, 78, 79, 80]) is None  # a common prefix under min_tokens is not used


def test_echo_with_logprobs_prefills_whole_and_an_engine_without_the_cache_keeps_nothing():
    import threading

    from meshlm.serve.protocol import Finished

    model = tiny_model(max_seq_len=64)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, max_queue=4, prefix_cache_bytes=1 << 20)
    try:
        _run(engine, [SYSTEM + [1, 2]], 3)
        done = threading.Event()
        rows = engine.submit_choices(SYSTEM + [1, 2, 3], 3, Sampling(temperature=0.0, logprobs=1), frozenset(),
                                     lambda ev: done.set() if isinstance(ev, Finished) else None, echo="x")
        assert done.wait(60)
        stats = engine.status()["prefix_cache"]
    finally:
        engine.close()
    assert rows[0].generated == generate(model, SYSTEM + [1, 2, 3], 3, greedy=True)
    assert stats["lookups"] == 1 and stats["hits"] == 0  # the echo's prompt logits need the whole prompt's forward
    plain = BatchEngine(model, DigitTokenizer(), max_batch=4, max_queue=4)
    try:
        assert _run(plain, [SYSTEM + [1, 2], SYSTEM + [3, 4]], 3) == \
            [generate(model, p, 3, greedy=True) for p in (SYSTEM + [1, 2], SYSTEM + [3, 4])]
        assert plain.prefixes is None and "prefix_cache" not in plain.status()
    finally:
        plain.close()


def test_a_failing_cache_costs_the_reuse_not_the_answer():
    model = tiny_model(max_seq_len=64)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, max_queue=4, prefix_cache_bytes=1 << 20)

    def broken(*args, **kwargs):
        raise MemoryError("no room for the kept keys")

    engine.prefixes.store = broken
    prompts = [SYSTEM + [1, 2], SYSTEM + [3, 4]]
    try:
        got = _run(engine, prompts, 4)
        stats = engine.status()["prefix_cache"]
    finally:
        engine.close()
    assert got == [generate(model, p, 4, greedy=True) for p in prompts]  # both answered, whole prefills
    assert stats["errors"] == 2 and stats["hits"] == 0 and stats["entries"] == 0
