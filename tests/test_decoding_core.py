"""One decoding core (issue 31): generate(), rollout() and the server's engine pick tokens with the one sampler
from one SamplingParams. Greedy decoding is token-identical across the three and the model's plain forward on a
tiny model of every family the registry has; a seed gives the same sampled tokens in each, alone or batched;
bad params fail once, naming the field; the engine makes its decode packs at load."""

from __future__ import annotations

import pytest
import torch

from meshlm.errors import ConfigError
from meshlm.generate import generate
from meshlm.generate.packed import _PACKS, pack_variant
from meshlm.generate.params import SamplingError, SamplingParams
from meshlm.generate.rollout import rollout
from meshlm.models.families import FAMILIES
from meshlm.serve.engine import BatchEngine
from tests.test_families import tiny
from tests.test_serve_engine import DigitTokenizer, _collect, plain_greedy

PROMPTS = [[5, 17, 3, 42, 8], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9], [30, 31]]
STEPS = 10


def _engine_tokens(model, prompts, params: SamplingParams) -> list[list[int]]:
    """Each prompt through one in-process engine, all submitted together (they share the batch)."""
    engine = BatchEngine(model, DigitTokenizer(), max_batch=8, max_queue=16)
    try:
        jobs = [_collect(engine, p, params.max_tokens, params) for p in prompts]
        for _, done in jobs:
            assert done.wait(60)
    finally:
        engine.close()
    return [seq.generated for seq, _ in jobs]


@pytest.mark.parametrize("local_rope", [False, True])  # True: a family's model the packed path does not serve
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_is_token_identical_in_every_caller_and_the_plain_forward(family, local_rope):
    model = tiny(family, local_rope)
    greedy = SamplingParams(max_tokens=STEPS, temperature=0.0)
    expected = [plain_greedy(model, p, STEPS) for p in PROMPTS]  # full forward, no cache, each step
    assert [generate(model, p, params=greedy) for p in PROMPTS] == expected
    assert [generate(model, p, STEPS, greedy=True, fast=False) for p in PROMPTS] == expected  # the old keywords
    out = rollout(model, PROMPTS, greedy)  # left-padded, one KV cache
    assert out.response_ids.tolist() == expected
    assert _engine_tokens(model, PROMPTS, greedy) == expected


def test_a_seed_samples_the_same_tokens_in_generate_rollout_and_the_engine():
    model = tiny("llama", False)
    params = SamplingParams(max_tokens=12, temperature=1.4, top_k=40, top_p=0.95, min_p=0.01, seed=1234)
    prompt = PROMPTS[0]
    alone = generate(model, prompt, params=params)
    assert len(alone) == 12 and alone != plain_greedy(model, prompt, 12)  # sampled, not the argmax
    assert rollout(model, [prompt], params).response_ids[0].tolist() == alone  # row 0 takes params.seed
    unseeded = params.with_(seed=None)
    assert rollout(model, [prompt], unseeded, row_seeds=[1234]).response_ids[0].tolist() == alone
    batched = rollout(model, [prompt, PROMPTS[2]], unseeded, row_seeds=[1234, 9])
    assert batched.response_ids[0].tolist() == alone  # beside another row, as alone
    engine_rows = _engine_tokens(model, [prompt, PROMPTS[2]], params)
    assert engine_rows[0] == alone  # the server's row 0 of a request seeded 1234, batched with another request
    assert generate(model, prompt, params=params.with_(seed=1235)) != alone


def test_bias_and_penalties_apply_alike_in_generate_and_the_engine():
    model = tiny("llama", False)
    free = plain_greedy(model, PROMPTS[0], STEPS)
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, logit_bias=((free[0], -100.0),),
                            frequency_penalty=2.0, presence_penalty=1.0)
    ids = generate(model, PROMPTS[0], params=params)
    assert ids[0] != free[0] and free[0] not in ids  # the banned token never comes
    assert _engine_tokens(model, [PROMPTS[0]], params) == [ids]
    assert rollout(model, [PROMPTS[0]], params).response_ids[0].tolist() == ids


def test_stop_ids_end_every_caller_at_the_same_token():
    model = tiny("llama", False)
    free = plain_greedy(model, PROMPTS[0], STEPS)
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, stop_ids=(free[3],))
    expected = free[:free.index(free[3]) + 1]  # the stop id is included
    assert generate(model, PROMPTS[0], params=params) == expected
    out = rollout(model, [PROMPTS[0]], params)
    assert out.response_ids[0][out.response_mask[0]].tolist() == expected
    assert _engine_tokens(model, [PROMPTS[0]], params) == [expected]


@pytest.mark.parametrize("fields, field", [
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(min_p=2.0), "min_p"),
    (dict(max_tokens=-1), "max_tokens"),
    (dict(seed=1 << 64), "seed"),
    (dict(seed=True), "seed"),
    (dict(n=0), "n"),
    (dict(logprobs=-1), "logprobs"),
    (dict(presence_penalty=float("inf")), "presence_penalty"),
    (dict(logit_bias=((-3, 1.0),)), "logit_bias"),
    (dict(stop_ids=(4, -1)), "stop_ids"),
])
def test_bad_params_name_their_field(fields, field):
    with pytest.raises(SamplingError) as err:
        SamplingParams(**fields)
    assert err.value.field == field and str(err.value).startswith(f"sampling {field}: ")
    assert isinstance(err.value, ConfigError)  # the CLI's exit code 2


def test_callers_refuse_what_they_cannot_honour():
    model = tiny("llama", False)
    with pytest.raises(SamplingError, match="stop"):
        generate(model, [1, 2], params=SamplingParams(max_tokens=3, stop=("\n",)))
    with pytest.raises(SamplingError, match="n"):
        rollout(model, [[1, 2]], SamplingParams(max_tokens=3, n=2))
    with pytest.raises(ConfigError, match="either params"):
        generate(model, [1, 2], 3, params=SamplingParams(), temperature=0.5)
    with pytest.raises(SamplingError, match="max_tokens"):
        rollout(model, [[1, 2]], SamplingParams())  # a rollout needs a length
    with pytest.raises(SamplingError, match="logit_bias: token id 97 is outside the vocabulary"):
        generate(model, [1, 2], params=SamplingParams(max_tokens=3, logit_bias=((97, 1.0),)))
    with pytest.raises(ConfigError, match="drop the generator"):
        rollout(model, [[1, 2]], SamplingParams(max_tokens=3, seed=1), generator=torch.Generator())


def test_the_engine_makes_its_packs_at_load_and_states_their_memory():
    model = tiny("llama", False)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4)
    try:
        # before any request: the one-row decode pack (copies) and the prefill's (the view pack on one core, the same
        # column blocks on more: packed.py) are made
        assert set(_PACKS[model]) == {pack_variant(model, 1), pack_variant(model, 1 << 20)}
        assert "rows" in _PACKS[model]
        status = engine.status()
        assert status["pack_bytes"] == engine.pack_bytes > 0
        assert status["requests"] == 0
    finally:
        engine.close()
