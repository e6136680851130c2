"""Prompt-lookup speculative decoding (meshlm/generate/speculative.py): the n-gram draft, and greedy and seeded
sampled output token-identical to plain decoding on tiny llama and gemma3 models (fast path and plain forward, stop
ids, the length limit), with drafts actually accepted; the emitted tokens follow the row's distribution; the draft
length adapts; refusals name the argument."""

from __future__ import annotations

import pytest
import torch

from meshlm.errors import ConfigError
from meshlm.generate import generate
from meshlm.generate.decode import fast_forward
from meshlm.generate.params import SamplingParams
from meshlm.generate.sampling import RowSampler
from meshlm.generate.speculative import DraftBudget, SpeculativeStats, ngram_draft, speculative_decode, verified
from meshlm.models import build_model
from tests.test_decode import tiny
from tests.test_flops import tiny_gemma3

# prompts that repeat themselves (as a rewrite does) and one that does not
PROMPTS = [[5, 17, 3, 42, 8, 5, 17, 3, 42, 8, 5, 17], [9, 4, 11, 2, 7, 30, 12], [20, 21, 22, 20, 21, 22, 20, 21]]


def _models():
    yield "llama", tiny(seed=3)
    yield "gemma3", build_model(tiny_gemma3(init_std=0.2), "cpu", seed=3).eval()


def test_the_draft_follows_the_latest_longest_match():
    ids = [1, 2, 3, 9, 1, 2, 4, 5, 6, 1, 2]
    assert ngram_draft(ids, 3) == [4, 5, 6]  # "1 2" last seen before 4 5 6
    assert ngram_draft([7, 1, 2, 3, 8, 8, 2, 3], 2) == [8, 8]  # the 3-gram "8 2 3" is absent; "2 3" is not
    assert ngram_draft([1, 2, 3, 4], 4) == []  # no repeated suffix
    assert ngram_draft(ids, 0) == [] and ngram_draft([1], 4) == []
    assert ngram_draft([5, 6, 5, 6], 8) == [5, 6]  # the match may run up to the suffix itself


def test_the_draft_budget_grows_on_kept_drafts_and_shrinks_on_cut_ones():
    budget = DraftBudget(8)
    sizes = []
    for drafted, kept in [(8, 3), (7, 0), (6, 0), (0, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0), (1, 1), (3, 3),
                          (5, 5), (7, 7)]:
        budget.update(drafted, kept)
        sizes.append(budget.size)
    assert sizes == [7, 6, 5, 5, 4, 3, 2, 1, 1, 3, 5, 7, 8]  # no draft: no change; never below 1 or above 8
    assert DraftBudget(3).size == 3


@pytest.mark.parametrize("fast", [True, False])
def test_greedy_output_is_identical_to_plain_greedy_on_llama_and_gemma3(fast):
    accepted = {}
    for family, model in _models():
        accepted[family] = 0
        for prompt in PROMPTS:
            for n in (1, 2, 13, 30):
                want = generate(model, prompt, n, greedy=True, fast=fast)
                got = generate(model, prompt, n, greedy=True, fast=fast, speculative="ngram")
                assert got == want, (family, prompt, n)
            stats = SpeculativeStats()
            with torch.inference_mode():
                net = fast_forward(model) if fast else model
                greedy = RowSampler(SamplingParams(temperature=0.0), model.cfg.vocab_size)
                out = speculative_decode(net, model.new_cache(1, len(prompt) + 30), prompt, 30, set(), greedy,
                                         stats=stats)
            assert out == want and stats.forwards < 30  # fewer forwards than tokens: drafts were taken
            accepted[family] += stats.accepted
    assert all(accepted.values()), accepted  # both families exercised multi-token acceptance


def test_seeded_sampling_is_identical_to_plain_seeded_sampling_with_drafts_kept():
    kept = 0
    for family, model in _models():
        for prompt in PROMPTS:
            for seed in range(3):
                params = SamplingParams(temperature=0.5, top_p=0.95, seed=seed, max_tokens=30)
                want = generate(model, prompt, params=params)
                stats = SpeculativeStats()
                with torch.inference_mode():
                    got = speculative_decode(fast_forward(model), model.new_cache(1, len(prompt) + 30), prompt, 30,
                                             set(), RowSampler(params, model.cfg.vocab_size), stats=stats)
                assert got == want == generate(model, prompt, params=params, speculative="ngram"), (family, seed)
                kept += stats.accepted
    assert kept > 0  # sampled rows kept drafted tokens


def test_verified_tokens_follow_the_rows_distribution():
    """verified() on fixed distributions: the first emitted token is distributed as the row's own sampling would
    give it (the drafted token is kept with its probability, 0.3 here), the token after a kept draft follows the
    next position's distribution, and every emitted token costs exactly one draw."""
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]]))  # (1 + 1 draft, V = 4)
    row = RowSampler(SamplingParams(temperature=1.0, seed=0), 4)
    first, second = torch.zeros(4), torch.zeros(4)
    n = 20000
    for _ in range(n):
        picks = verified(logits, [3], row, None)
        first[picks[0]] += 1
        assert len(picks) == (2 if picks[0] == 3 else 1)
        if len(picks) == 2:
            second[picks[1]] += 1
    assert torch.allclose(first / n, torch.tensor([0.1, 0.4, 0.2, 0.3]), atol=0.015)
    assert torch.allclose(second / second.sum(), torch.full((4,), 0.25), atol=0.025)
    for seed in range(20):  # one draw per emitted token: the generator then stands where a plain loop's would
        a, b = (RowSampler(SamplingParams(temperature=1.0, seed=seed), 4) for _ in range(2))
        for _ in verified(logits, [3], a, None):
            b.uniform()
        assert a.uniform() == b.uniform()


def test_stop_ids_and_the_context_limit_end_it_where_plain_greedy_ends():
    model = tiny(seed=3)
    prompt = PROMPTS[0]
    plain = generate(model, prompt, 30, greedy=True)
    stop = plain[7]  # a token plain greedy emits in the middle
    assert generate(model, prompt, 30, greedy=True, eos_id=stop, speculative="ngram") == \
        generate(model, prompt, 30, greedy=True, eos_id=stop)
    long = list(range(1, 40))  # 39 tokens of a 48-token context
    assert generate(model, long, 100, greedy=True, speculative="ngram") == generate(model, long, 100, greedy=True)


def test_refusals_name_the_argument():
    model = tiny()
    with pytest.raises(ConfigError, match="logit_bias and the penalties"):
        generate(model, [5, 6], params=SamplingParams(temperature=0.7, presence_penalty=0.5, max_tokens=3),
                 speculative="ngram")
    with pytest.raises(ConfigError, match="speculative must be one of"):
        generate(model, [5, 6], 3, greedy=True, speculative="medusa")
    with pytest.raises(ConfigError, match="--weights int8"):
        generate(model, [5, 6], 3, greedy=True, weights="int8", speculative="ngram")


def test_the_cli_refuses_speculative_int8_before_loading_anything():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "meshlm", "generate", "--checkpoint", "nowhere", "--prompt", "x",
                        "--speculative", "ngram", "--weights", "int8"], capture_output=True, text=True)
    assert r.returncode == 2 and "--weights fp32" in r.stderr and "Traceback" not in r.stderr
