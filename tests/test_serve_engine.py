"""The continuous-batching engine against the single-sequence sampler: rows that join a running batch at different
times, with different prompt lengths, decode exactly the greedy tokens they would get alone; stop strings never
leak; per-row sampling follows each request's seed, temperature and top-p."""

from __future__ import annotations

import threading

import pytest
import torch

from meshlm.generate import generate
from meshlm.generate.decode import FastForward
from meshlm.generate.params import SamplingParams
from meshlm.generate.sampling import RowSampler, sample
from meshlm.serve.decode import TextStream
from meshlm.serve.engine import BatchEngine
from meshlm.serve.protocol import Finished, Sampling
from tests.test_generate import tiny_model


class DigitTokenizer:
    """Token i decodes to chr(65 + i % 26): enough text for the engine's bookkeeping, no BPE needed."""

    vocab_size, pad_id, eos_id = 97, 0, 96

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(65 + i % 26) for i in ids)


def _collect(engine: BatchEngine, prompt: list[int], max_new: int, sampling: Sampling, eos=frozenset()):
    done = threading.Event()
    seq = engine.submit(prompt, max_new, sampling, eos, lambda ev: done.set() if isinstance(ev, Finished) else None)
    return seq, done


def plain_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens by the model's own full forward (no cache, no fast path) each step."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_joining_rows_decode_what_they_would_alone():
    model = tiny_model(max_seq_len=48)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=8, max_queue=16)
    assert isinstance(engine._forward(), FastForward)  # no adapters: the engine decodes on the fast path
    greedy = Sampling(temperature=0.0)
    prompts = [[5, 17, 3, 42], [7], list(range(10, 22)), [1, 2, 3], list(range(30, 60))]
    lengths = [20, 30, 12, 25, 18]
    # the first two are decoding when the others arrive: the engine's step waits, once the first row has 3 tokens,
    # until the others are submitted (a busy machine's scheduling once let the second finish before they were)
    held, release, jobs = threading.Event(), threading.Event(), []
    step = engine._step

    def held_step() -> None:
        if jobs and len(jobs[0][0].generated) >= 3 and not release.is_set():
            held.set()
            release.wait(60)
        step()
    engine._step = held_step
    try:
        jobs += [_collect(engine, prompts[0], lengths[0], greedy), _collect(engine, prompts[1], lengths[1], greedy)]
        assert held.wait(60)
        jobs += [_collect(engine, p, n, greedy) for p, n in zip(prompts[2:], lengths[2:])]
        joined_mid_flight = not jobs[1][1].is_set()
        release.set()
        for _, done in jobs:
            assert done.wait(60)
    finally:
        release.set()
        engine.close()
    for (seq, _), prompt, n in zip(jobs, prompts, lengths):
        assert seq.generated == generate(model, prompt, n, greedy=True), prompt  # fp32: exact
        assert seq.generated == plain_greedy(model, prompt, n), prompt
    stats = engine.status()
    assert joined_mid_flight and stats["prefills"] >= 2
    assert stats["tokens"] == sum(lengths) and stats["mean_batch"] > 1.5 and stats["active"] == 0


def test_context_limit_waits_instead_of_overflowing():
    model = tiny_model(max_seq_len=24)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, max_queue=4)
    try:  # 20 + 4 fills the context; the second (2 + 20) cannot sit beside it and waits its turn
        jobs = [_collect(engine, list(range(1, 21)), 4, Sampling(temperature=0.0)),
                _collect(engine, [3, 4], 20, Sampling(temperature=0.0))]
        for _, done in jobs:
            assert done.wait(60)
    finally:
        engine.close()
    assert jobs[1][0].generated == generate(model, [3, 4], 20, greedy=True)


def test_one_decoding_one_waiting_then_429():
    """max_batch 1 + max_queue 1: with a row held mid-step, a second request waits and a third is a 429 with
    Retry-After; both admitted ones finish (the over-the-wire test only sees that the codes are 200 and 429)."""
    from meshlm.serve.protocol import ApiError

    model = tiny_model()
    entered, release = threading.Event(), threading.Event()
    engine = BatchEngine(model, DigitTokenizer(), max_batch=1, max_queue=1)
    step = engine._step

    def held_step() -> None:  # the engine thread waits inside its decode step until the test lets it go
        entered.set()
        release.wait(60)
        step()
    engine._step = held_step
    try:
        first = _collect(engine, [5, 6, 7], 4, Sampling(temperature=0.0))
        assert entered.wait(60)  # the first row has joined and the engine is in its step: it decodes, nothing waits
        second = _collect(engine, [8, 9], 4, Sampling(temperature=0.0))
        with pytest.raises(ApiError) as busy:  # a third beside one decoding and one waiting
            _collect(engine, [1, 2], 4, Sampling(temperature=0.0))
        assert busy.value.status == 429 and busy.value.retry_after >= 1
        release.set()
        assert first[1].wait(60) and second[1].wait(60)
    finally:
        release.set()
        engine.close()
    assert second[0].generated == generate(model, [8, 9], 4, greedy=True)


def test_eos_and_seeded_sampling():
    model = tiny_model()
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, max_queue=4)
    try:
        first = generate(model, [5, 6, 7], 6, greedy=True)
        eos_seq, done = _collect(engine, [5, 6, 7], 6, Sampling(temperature=0.0), eos=frozenset({first[2]}))
        hot = [_collect(engine, [9, 9], 12, Sampling(temperature=1.5, seed=s)) for s in (3, 3, 4)]
        for _, d in [(eos_seq, done), *hot]:
            assert d.wait(60)
    finally:
        engine.close()
    assert eos_seq.generated == first[:first.index(first[2]) + 1]  # stops at (and includes) the eos token
    a, b, c = (h[0].generated for h in hot)
    assert a == b and a != c  # same seed, same sample, even when batched together


def test_text_stream_holds_back_stop_prefixes():
    stream = TextStream(DigitTokenizer(), stop=["CDE"])
    out = [stream.push(t) for t in (0, 1, 2, 3)]  # "A", "B", "C" (held: may start "CDE"), "D" (held)
    assert out == ["A", "B", "", ""] and not stream.stopped
    assert stream.push(5) == "CDF" and not stream.stopped  # "CDF" is no stop: released
    stream2 = TextStream(DigitTokenizer(), stop=["CDE"])
    assert "".join(stream2.push(t) for t in (0, 1, 2, 3, 4, 5)) == "AB" and stream2.stopped
    assert stream2.flush() == ""


def test_sample_temperature_and_top_p():
    """The one sampler (meshlm/generate/sampling.py) as the engine calls it, one RowSampler a row."""
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 3)

    def rows(**fields):
        return [RowSampler(SamplingParams(**fields), 4, seed=i) for i in range(3)]

    assert sample(logits, rows(temperature=0.0)).tokens.tolist() == [1, 1, 1]
    # top_p 0.5: only token 1 (p = 0.64 at T=1) is in the nucleus, whatever the seed
    assert sample(logits, rows(top_p=0.5)).tokens.tolist() == [1, 1, 1]
    draws = {int(sample(logits[:1], [RowSampler(SamplingParams(temperature=5.0), 4, seed=s)]).tokens[0])
             for s in range(40)}
    assert draws == {0, 1, 2, 3}  # a hot temperature reaches every token
    one = [RowSampler(SamplingParams(), 4, seed=0)]
    assert sample(logits[:1], one, vocab_limit=1).tokens.tolist() == [0]  # rows past the tokenizer excluded


def test_the_engine_thread_runs_torch_on_its_threads_and_the_caller_keeps_its_own():
    """`meshlm serve` keeps every thread but the engine's on one torch thread (a second multi-threaded OpenMP team
    slowed every op: docs/benchmarks.md, session 17): the engine thread sets its own count, whatever its creator's."""
    model = tiny_model()
    seen: list[int] = []
    caller = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = BatchEngine(model, DigitTokenizer(), max_batch=2, threads=2)
        inner = engine._fast
        engine._fast = lambda *a, **kw: (seen.append(torch.get_num_threads()), inner(*a, **kw))[1]
        try:
            seq, done = _collect(engine, [3, 4, 5], 3, Sampling(temperature=0.0))
            assert done.wait(60) and len(seq.generated) == 3
        finally:
            engine.close()
        assert seen and set(seen) == {2}, seen  # every forward of the engine thread, prefill and steps
        assert torch.get_num_threads() == 1  # the caller's count untouched
    finally:
        torch.set_num_threads(caller)


def test_a_speculating_sampled_row_keeps_its_tokens_when_another_request_joins():
    """One draw per emitted token: a seeded sampled row that speculates alone, then decodes in plain steps beside a
    request that joined, gives the plain engine's tokens."""
    from tests.test_decode import tiny
    from tests.test_speculative import PROMPTS

    model = tiny(seed=3)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, speculative="ngram")
    plain = BatchEngine(model, DigitTokenizer(), max_batch=4)
    sampled = Sampling(temperature=0.2, seed=1)
    held, release, first = threading.Event(), threading.Event(), []
    step = engine._step

    def held_step() -> None:  # once the first row has 14 tokens (drafts taken), wait for the second request
        if first and len(first[0].generated) >= 14 and not release.is_set():
            held.set()
            release.wait(60)
        step()

    engine._step = held_step
    try:
        first.append(_collect(engine, PROMPTS[0], 30, sampled)[0])
        done = threading.Event()
        first[0].emit = lambda ev, old=first[0].emit: (old(ev), done.set() if isinstance(ev, Finished) else None)
        assert held.wait(60)
        drafted = engine.status()["drafted"]
        other, other_done = _collect(engine, PROMPTS[1], 20, Sampling(temperature=0.0))
        release.set()
        ref, ref_done = _collect(plain, PROMPTS[0], 30, sampled)
        assert done.wait(60) and other_done.wait(60) and ref_done.wait(60)
        assert drafted > 0 and first[0].generated == ref.generated
        assert other.generated == generate(model, PROMPTS[1], 20, greedy=True)
    finally:
        release.set()
        engine.close()
        plain.close()


def test_a_failing_verification_fails_its_request_alone(monkeypatch):
    from meshlm.serve import engine as engine_module
    from meshlm.serve.protocol import Failed
    from tests.test_decode import tiny
    from tests.test_speculative import PROMPTS

    model = tiny(seed=3)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, speculative="ngram")
    events, done = [], threading.Event()

    def broken(*args, **kwargs):
        raise RuntimeError("verification broke")

    def emit(ev) -> None:
        events.append(ev)
        if isinstance(ev, (Finished, Failed)):
            done.set()

    try:
        monkeypatch.setattr(engine_module, "verified", broken)
        engine.submit(PROMPTS[0], 20, Sampling(temperature=0.0), frozenset(), emit)
        assert done.wait(60) and isinstance(events[-1], Failed)
        monkeypatch.undo()
        seq, ok = _collect(engine, PROMPTS[0], 20, Sampling(temperature=0.0))
        assert ok.wait(60) and seq.generated == generate(model, PROMPTS[0], 20, greedy=True)
    finally:
        engine.close()


def test_speculative_engine_gives_plain_tokens_with_drafts_taken():
    """``speculative="ngram"``: a lone request verifies prompt-lookup drafts (engine.py ``_draft``): its tokens are
    plain greedy's (or, sampled with a seed, the plain engine's), drafts are accepted on prompts that repeat
    themselves, and a stop token, the token limit and requests decoding together are untouched."""
    from meshlm.errors import ConfigError
    from tests.test_decode import tiny
    from tests.test_speculative import PROMPTS

    model = tiny(seed=3)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, speculative="ngram")
    plain = BatchEngine(model, DigitTokenizer(), max_batch=4)
    greedy = Sampling(temperature=0.0)
    try:
        for prompt in PROMPTS:
            for n in (1, 2, 13, 30):
                seq, done = _collect(engine, prompt, n, greedy)
                assert done.wait(60) and seq.generated == generate(model, prompt, n, greedy=True), (prompt, n)
        stats = engine.status()
        # drafts were taken: more tokens than the prefills' first tokens and one a forward would give
        assert stats["accepted"] > 0 and stats["tokens"] > stats["requests"] + stats["decode_steps"]
        want = generate(model, PROMPTS[0], 30, greedy=True)
        stop = want[9]
        seq, done = _collect(engine, PROMPTS[0], 30, greedy, eos=frozenset({stop}))
        assert done.wait(60) and seq.generated == want[:want.index(stop) + 1]
        before = engine.status()["accepted"]
        for seed in range(4):  # a seeded sampled request speculates too, and gives the plain engine's tokens
            sampled = Sampling(temperature=0.2, seed=seed)
            got, ref = _collect(engine, PROMPTS[0], 20, sampled), _collect(plain, PROMPTS[0], 20, sampled)
            assert got[1].wait(60) and ref[1].wait(60) and got[0].generated == ref[0].generated, seed
        assert engine.status()["accepted"] > before
        together = [_collect(engine, p, 12, greedy) for p in PROMPTS]  # one forward for all rows once they join
        assert all(done.wait(60) for _, done in together)
        assert [s.generated for s, _ in together] == [generate(model, p, 12, greedy=True) for p in PROMPTS]
    finally:
        engine.close()
        plain.close()
    with pytest.raises(ConfigError, match="--weights int8"):
        BatchEngine(model, DigitTokenizer(), weights="int8", speculative="ngram")
