"""Sampling: greedy equals argmax decoding, top-k/top-p filters, seeded reproducibility, argument checks."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from meshlm.errors import ConfigError
from meshlm.generate import filter_logits, generate
from meshlm.models import Transformer, build_model, flavor_config


def tiny_model(**overrides) -> Transformer:
    base = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, vocab_size=97, max_seq_len=32,
                init_std=0.1)
    cfg = dataclasses.replace(flavor_config("debug"), **{**base, **overrides})
    return build_model(cfg, "cpu", seed=0).eval()


PROMPT = [5, 17, 3, 42]


def test_greedy_equals_argmax_with_full_forward_each_step():
    model = tiny_model()
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(10):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert generate(model, PROMPT, 10, greedy=True) == ids[len(PROMPT):]


def test_top_k_one_sampling_is_greedy():
    model = tiny_model()
    assert generate(model, PROMPT, 8, top_k=1, seed=7) == generate(model, PROMPT, 8, greedy=True)


def test_same_seed_same_sample_and_global_rng_untouched():
    model = tiny_model()
    state = torch.get_rng_state()
    a = generate(model, PROMPT, 20, temperature=2.0, seed=11)
    assert torch.equal(torch.get_rng_state(), state)
    assert generate(model, PROMPT, 20, temperature=2.0, seed=11) == a
    assert generate(model, PROMPT, 20, temperature=2.0, seed=12) != a  # 97^-20 odds of a false failure
    assert len(a) == 20 and all(0 <= t < 97 for t in a)


def test_stops_at_eos_and_includes_it():
    model = tiny_model()
    first = generate(model, PROMPT, 8, greedy=True)
    eos = first[2]
    stopped = generate(model, PROMPT, 8, greedy=True, eos_id=eos)
    assert stopped == first[:first.index(eos) + 1] and len(stopped) <= 3


def test_stops_at_max_seq_len():
    model = tiny_model(max_seq_len=10)
    assert len(generate(model, PROMPT, 100, greedy=True)) == 10 - len(PROMPT)
    assert generate(model, list(range(10)), 5, greedy=True) == []
    assert generate(model, PROMPT, 0) == []


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
    out = filter_logits(logits, top_k=2)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False], [True, True, False, False, False]]
    assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])  # kept values unchanged
    assert torch.equal(filter_logits(logits, top_k=0), logits)


@pytest.mark.parametrize("top_p, kept", [(0.45, {2}), (0.7, {2, 0}), (0.79, {2, 0}), (0.85, {2, 0, 3}),
                                         (0.99, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_nucleus(top_p, kept):
    probs = torch.tensor([0.3, 0.05, 0.5, 0.15])  # sorted: 0.5 (id 2), 0.3 (id 0), 0.15 (id 3), 0.05 (id 1)
    out = filter_logits(probs.log(), top_p=top_p)
    assert set(torch.isfinite(out).nonzero().flatten().tolist()) == kept


def test_top_k_and_top_p_combine():
    probs = torch.tensor([0.3, 0.05, 0.5, 0.15])
    out = filter_logits(probs.log(), top_k=3, top_p=0.95)  # top-k drops id 1; renormalised nucleus keeps 3 ids
    assert set(torch.isfinite(out).nonzero().flatten().tolist()) == {0, 2, 3}
    assert math.isinf(filter_logits(probs.log(), top_k=3, top_p=0.6)[3])


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=-0.1), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(prompt_ids=[]), "empty"),
    (dict(prompt_ids=list(range(33))), "max_seq_len"),
    (dict(prompt_ids=[1, 97]), "vocabulary"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
])
def test_bad_arguments_raise_config_error(kwargs, match):
    model = tiny_model()
    args = dict(prompt_ids=PROMPT, max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        generate(model, args.pop("prompt_ids"), args.pop("max_new_tokens"), **args)


def test_temperature_zero_is_allowed_with_greedy():
    model = tiny_model()
    assert generate(model, PROMPT, 3, greedy=True, temperature=0.0) == generate(model, PROMPT, 3, greedy=True)


def test_temperature_is_applied():
    model = tiny_model()
    greedy = generate(model, PROMPT, 8, greedy=True)
    assert generate(model, PROMPT, 8, temperature=1e-4, seed=5) == greedy  # near 0: the argmax every time
    assert generate(model, PROMPT, 8, temperature=50.0, seed=5) != greedy  # near uniform over 97 ids


def test_vocab_limit_never_samples_padded_rows():
    model = tiny_model()
    ids = generate(model, [1, 2, 3], 40, temperature=5.0, seed=0, vocab_limit=7)
    assert ids and all(0 <= i < 7 for i in ids)


def test_any_of_several_eos_ids_stops():
    model = tiny_model()
    free = generate(model, [1, 2, 3], 10, greedy=True)
    stopped = generate(model, [1, 2, 3], 10, greedy=True, eos_id={free[2], 10**6})
    assert stopped == free[:free.index(free[2]) + 1]
