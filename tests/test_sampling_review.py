"""Review of the one decoding core (issue 31): the sampler's draws follow the distribution it says it samples
(a chi-square check against softmax on a small vocabulary), its filters' edge cases, fp16/bf16 logits, per-row
seeds, a tiny positive temperature (which overflowed to an id outside the vocabulary and failed the whole server
batch), and SamplingParams / filter_logits values that are refused naming their field or read as meant.

Draws use fixed seeds, so every figure here is the same on every run; the two unseeded rows are only compared
with each other and with a seeded one (equal 40-token draws at temperature 1.7 on 6 tokens: odds below 1e-20)."""

from __future__ import annotations

import threading

import openai
import pytest
import torch

from meshlm.generate import filter_logits, generate
from meshlm.generate.params import SamplingError, SamplingParams
from meshlm.generate.sampling import RowSampler, sample
from meshlm.serve.decode import TextStream
from meshlm.serve.engine import BatchEngine
from meshlm.serve.protocol import Failed, Finished
from tests.test_families import tiny
from tests.test_serve_engine import DigitTokenizer, plain_greedy
from tests.test_serve_fields import serve_tiny

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0, 3.0])  # V = 6, no ties
# chi-square with 5 degrees of freedom: P(X > 20.52) = 0.001. Each check below is deterministic (fixed seeds);
# a sampler off by one token, ignoring the temperature or a filter scores in the hundreds or thousands.
CHI2_5DOF_P001 = 20.52
DRAWS = 6000


def draws(params: SamplingParams, logits: torch.Tensor = LOGITS, n: int = DRAWS) -> torch.Tensor:
    """(V,) counts of n tokens drawn step after step by one seeded row, as generate() draws them."""
    row = RowSampler(params, logits.shape[-1])
    counts = torch.zeros(logits.shape[-1])
    for _ in range(n):
        counts[int(sample(logits[None], [row]).tokens[0])] += 1
    return counts


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the tokens the reference gives mass (a draw outside them is infinitely wrong)."""
    if bool((counts[probs == 0] > 0).any()):
        return float("inf")
    expected = probs * counts.sum()
    keep = probs > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def reference(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
              min_p: float = 0.0) -> torch.Tensor:
    """The documented distribution, written out token by token (no shared code with the sampler)."""
    probs = torch.softmax(logits.double() / temperature, -1)
    order = sorted(range(len(probs)), key=lambda t: -float(probs[t]))
    keep = set(order[:top_k] if top_k else order)
    mass = sum(float(probs[t]) for t in order if t in keep)
    above, nucleus = 0.0, set()
    for t in (t for t in order if t in keep):  # renormalised over the top-k: the nucleus of what is left
        if above >= top_p and nucleus:
            break
        nucleus.add(t)
        above += float(probs[t]) / mass
    top = max(float(probs[t]) for t in nucleus)
    final = [t for t in nucleus if float(probs[t]) >= min_p * top]
    out = torch.zeros_like(probs)
    out[final] = probs[final]
    return out / out.sum()


@pytest.mark.parametrize("fields", [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=2.5),
    dict(temperature=1.3, top_k=4),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.9, top_k=5, top_p=0.9, min_p=0.1),
])
def test_draws_follow_the_softmax_of_the_filtered_tempered_logits(fields):
    counts = draws(SamplingParams(seed=2024, **fields))
    expected = reference(LOGITS, **fields)
    assert chi2(counts, expected) < CHI2_5DOF_P001, (counts.tolist(), (expected * DRAWS).tolist())
    # the check has the power to see a wrong sampler: the untempered softmax, or the same shifted by one token
    if abs(fields["temperature"] - 1.0) >= 0.3:
        assert chi2(counts, reference(LOGITS, 1.0, fields.get("top_k", 0), fields.get("top_p", 1.0))) > 100
    assert chi2(counts, expected.roll(1)) > 100


def test_a_tiny_positive_temperature_takes_the_argmax():
    """Regression: logits / 1e-40 overflowed fp32 to inf, softmax made NaN of it and the inverse CDF returned id V
    (outside the vocabulary): an IndexError in generate(), and `meshlm generate --temperature 1e-40` a traceback."""
    for temperature in (1e-40, 1e-46):  # 1e-46 is 0 in fp32 (a division by zero without the floor)
        picked = sample(LOGITS[None].expand(3, 6), [RowSampler(SamplingParams(temperature=temperature, seed=s), 6)
                                                    for s in range(3)], with_logprobs=True)
        assert picked.tokens.tolist() == [5, 5, 5] and picked.logprobs.tolist() == [0.0, 0.0, 0.0]
    ties = torch.tensor([[1.0, 4.0, 4.0, 0.0]])  # the argmax tied: shared between the tied ones, nothing else
    assert {int(sample(ties, [RowSampler(SamplingParams(temperature=1e-40, seed=s), 4)]).tokens[0])
            for s in range(40)} == {1, 2}
    model = tiny("llama", False)
    assert generate(model, [5, 17, 3], 8, temperature=1e-40, seed=3) == plain_greedy(model, [5, 17, 3], 8)


def test_a_tiny_temperature_request_fails_no_other_request_in_the_engine():
    """Regression: its out-of-vocabulary id reached the next batched forward (an IndexError there), which failed
    every active request, the greedy neighbour too (requests are isolated: DESIGN.md 9)."""
    model = tiny("llama", False)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, max_queue=8)
    ends: dict[int, list] = {0: [], 1: []}
    done = {0: threading.Event(), 1: threading.Event()}

    def emit(i: int):
        def on(event) -> None:
            if isinstance(event, (Finished, Failed)):
                ends[i].append(event)
                done[i].set()
        return on

    try:
        seqs = [engine.submit([5, 17, 3], 8, SamplingParams(temperature=t, seed=7), frozenset(), emit(i))
                for i, t in enumerate((0.0, 1e-40))]
        assert done[0].wait(60) and done[1].wait(60)
    finally:
        engine.close()
    assert [type(ends[i][0]) for i in (0, 1)] == [Finished, Finished]
    assert seqs[0].generated == seqs[1].generated == plain_greedy(model, [5, 17, 3], 8)


def test_filter_edge_cases():
    assert filter_logits(torch.tensor([1.0, 1.0, 1.0, 0.0]), top_k=1).isfinite().tolist() == [True] * 3 + [False]
    one = torch.tensor([float("-inf"), float("-inf"), 0.5, float("-inf")])
    assert torch.equal(filter_logits(one, top_k=2, top_p=0.1, min_p=0.5), one)  # the only token survives all
    assert {int(sample(one[None], [RowSampler(SamplingParams(temperature=3.0, seed=s), 4)]).tokens[0])
            for s in range(20)} == {2}
    for top_p in (0.0, 1e-9):  # the most likely token alone, whatever the seed
        assert {int(sample(LOGITS[None], [RowSampler(SamplingParams(top_p=top_p, seed=s), 6)]).tokens[0])
                for s in range(30)} == {5}
    assert filter_logits(LOGITS, min_p=1.0).isfinite().sum() == 1
    assert torch.equal(filter_logits(LOGITS, top_k=6, top_p=1.0), LOGITS)  # k = V and p = 1: nothing is cut
    # per-row filters in one batch: each row as alone
    rows = torch.stack([LOGITS, LOGITS.flip(0)])
    both = filter_logits(rows, torch.tensor([2, 0]), torch.tensor([1.0, 0.5]), torch.tensor([0.0, 0.2]))
    assert torch.equal(both[0], filter_logits(LOGITS, top_k=2))
    assert torch.equal(both[1], filter_logits(LOGITS.flip(0), top_p=0.5, min_p=0.2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_sample_as_their_fp32_values(dtype):
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 3.0], [0.25, 0.5, -2.0, 1.5, 1.5, 0.0]])  # exact in both
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.95, min_p=0.05)
    for seed in range(20):
        pick = [sample(x, [RowSampler(params, 6, seed=seed), RowSampler(params, 6, seed=seed + 100)],
                       with_logprobs=True) for x in (logits.to(dtype), logits)]
        assert torch.equal(pick[0].tokens, pick[1].tokens) and torch.equal(pick[0].logprobs, pick[1].logprobs)
    kept = filter_logits(logits.to(dtype), top_k=4, top_p=0.9, min_p=0.1)
    assert kept.dtype == dtype and torch.equal(kept.isfinite(), filter_logits(logits, 4, 0.9, 0.1).isfinite())


def test_a_row_seed_is_its_own_whatever_shares_the_batch():
    params = SamplingParams(temperature=1.7, seed=99)
    alone = RowSampler(params, 6)
    batch = [RowSampler(params, 6), RowSampler(params, 6),  # the same seed twice: the same draws
             RowSampler(SamplingParams(temperature=0.0), 6),  # a greedy neighbour draws nothing
             RowSampler(SamplingParams(temperature=1.7), 6), RowSampler(SamplingParams(temperature=1.7), 6)]
    logits = LOGITS[None].expand(5, 6)
    got_alone, got = [], []
    for _ in range(40):
        got_alone.append(int(sample(LOGITS[None], [alone]).tokens[0]))
        got.append(sample(logits, batch).tokens.tolist())
    columns = list(zip(*got))
    assert list(columns[0]) == list(columns[1]) == got_alone
    assert set(columns[2]) == {5}
    assert columns[3] != columns[4] and list(columns[3]) != got_alone  # unseeded rows: fresh seeds, uncorrelated


def test_sampling_fields_are_read_as_meant_or_refused_naming_the_field():
    """Regression: stop="CD" was the stop strings "C" and "D" (the engine stopped at either letter), stop_ids=7 and a
    {token id: bias} mapping raised a bare TypeError, and filter_logits took any number (top_p 1.5 was no filter)."""
    params = SamplingParams(stop="CD", stop_ids=7, logit_bias={5: -100.0})
    assert (params.stop, params.stop_ids, params.logit_bias) == (("CD",), (7,), ((5, -100.0),))
    assert params == SamplingParams(stop=["CD"], stop_ids=[7], logit_bias=[[5, -100.0]]) and hash(params)
    stream = TextStream(DigitTokenizer(), params.stop)
    stream.push(2)  # "C"
    assert not stream.stopped
    stream.push(3)  # "D": now "CD"
    assert stream.stopped
    for fields, field in [(dict(stop=None), "stop"), (dict(stop_ids=None), "stop_ids"),
                          (dict(stop_ids=2.5), "stop_ids"),
                          (dict(logit_bias=((1,),)), "logit_bias"), (dict(logit_bias="5"), "logit_bias"),
                          (dict(logit_bias={5: "x"}), "logit_bias")]:
        with pytest.raises(SamplingError) as err:
            SamplingParams(**fields)
        assert err.value.field == field
    for kwargs, field in [(dict(top_p=1.5), "top_p"), (dict(top_p=-0.1), "top_p"), (dict(top_k=-1), "top_k"),
                          (dict(min_p=2.0), "min_p")]:
        with pytest.raises(SamplingError) as err:
            filter_logits(LOGITS, **kwargs)
        assert err.value.field == field


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory, "sampling-review")


def test_over_http_a_tiny_temperature_is_greedy_and_a_bad_one_a_400(served):
    client = served.client()
    kw = dict(model="tiny", prompt="The river", max_tokens=8)
    greedy = client.completions.create(temperature=0, **kw).choices[0].text
    assert client.completions.create(temperature=1e-40, seed=5, **kw).choices[0].text == greedy
    for field, value in (("temperature", -1), ("temperature", 2.5), ("top_p", 1.5), ("seed", 1 << 63)):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(**{**kw, field: value})
        assert err.value.body["param"] == field


def test_filters_are_chosen_on_the_host_not_read_off_the_device():
    """Which of top-k / top-p / min-p apply is read from the per-row numbers sample() builds on the host, so a
    step on a GPU does not wait for the device to say so (issue 31). A meta tensor cannot be read at all: the
    filters run on meta logits with host numbers, and reading a flag off a meta tensor raises."""
    logits = torch.empty(3, 50, device="meta")
    out = filter_logits(logits, torch.tensor([0, 5, 2]), torch.tensor([1.0, 0.9, 0.5]), torch.tensor([0.0, 0.1, 0.0]))
    assert out.device.type == "meta" and out.shape == (3, 50)
    with pytest.raises(RuntimeError, match="meta"):
        filter_logits(logits, torch.tensor([0, 5, 2], device="meta"))
