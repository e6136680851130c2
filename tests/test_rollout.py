"""The batched rollout sampler (meshlm/generate/rollout.py): left-padded prompts of different lengths decoded
together give what the single-sequence sampler gives each alone; log-probs equal a full forward; eos stops rows;
under FSDP2 on 2 gloo ranks (different prompt lengths and stop steps per rank) it equals the single-device run."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshlm.config.loader import load_config
from meshlm.distributed.teardown import end_rank
from meshlm.errors import ConfigError
from meshlm.generate import generate
from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import rollout
from meshlm.models import build_model, flavor_config, meta_model

PROMPTS = [[5, 17, 300], [9], [44, 12, 7, 1000, 3, 81, 64], [200, 201]]
SEED = 11


def _model():
    torch.manual_seed(0)
    return build_model(flavor_config("debug"), "cpu", seed=SEED).eval()


def test_greedy_rollout_equals_single_sequence_generation():
    model = _model()
    cfg = SamplingParams(max_tokens=12, temperature=0.0)
    out = rollout(model, PROMPTS, cfg)
    assert out.response_ids.shape == (4, 12) and bool(out.response_mask.all())
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, prompt, 12, greedy=True)
        assert out.response_ids[row].tolist() == alone, row


def test_eos_stops_each_row_and_pads_after_it():
    model = _model()
    free = rollout(model, PROMPTS, SamplingParams(max_tokens=10, temperature=0.0))
    eos = int(free.response_ids[2, 3])  # row 2 emits this at step 3 (maybe other rows too, earlier or later)
    out = rollout(model, PROMPTS, SamplingParams(max_tokens=10, stop_ids=(eos, 2047), temperature=0.0))
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, prompt, 10, greedy=True, eos_id=[eos, 2047])
        n = len(alone)
        assert out.response_ids[row, :n].tolist() == alone
        assert out.response_mask[row].tolist() == [True] * n + [False] * (out.response_ids.shape[1] - n)
        assert bool((out.response_ids[row, n:] == 0).all()) and bool((out.logprobs[row, n:] == 0).all())
    assert out.response_mask[2].sum() <= 4  # row 2 stopped at (or before) its step-3 eos


def test_logprobs_equal_a_full_forward_and_sampling_is_seeded():
    model = _model()
    cfg = SamplingParams(max_tokens=8, stop_ids=(7,), temperature=0.7, top_k=50)
    a = rollout(model, PROMPTS, cfg, generator=torch.Generator().manual_seed(3))
    b = rollout(model, PROMPTS, cfg, generator=torch.Generator().manual_seed(3))
    c = rollout(model, PROMPTS, cfg, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.response_ids, b.response_ids) and not torch.equal(a.response_ids, c.response_ids)
    ids, mask, positions = a.sequences()
    with torch.no_grad():
        logits = model(ids, position_ids=positions, padding_mask=mask)  # (B, P + N, V) teacher forcing
    P = a.prompt_ids.shape[1]
    # the distribution sampled from: top-50 of logits / 0.7, renormalised
    scaled = logits[:, P - 1:-1].float() / 0.7
    kth = scaled.topk(50, dim=-1).values[..., -1:]
    logp = torch.log_softmax(scaled.masked_fill(scaled < kth, float("-inf")), -1)
    expected = logp.gather(-1, a.response_ids[..., None]).squeeze(-1) * a.response_mask
    # cached decoding vs one full forward: the same math in another order, fp32
    torch.testing.assert_close(a.logprobs, expected, atol=1e-5, rtol=0)


def test_row_seeded_sampling_does_not_depend_on_the_batch():
    """With row seeds each row's tokens are a function of the row alone: the 4 prompts decoded together equal
    them decoded as two batches of 2 (as two data-parallel ranks would, with the global prompt width), in any
    order; inverse-CDF sampling never picks a token outside top-k / vocab_limit."""
    model = _model()
    cfg = SamplingParams(max_tokens=6, temperature=0.9, top_k=40)
    seeds = [101, 102, 103, 104]
    whole = rollout(model, PROMPTS, cfg, row_seeds=seeds, vocab_limit=2000)
    width = max(len(p) for p in PROMPTS)
    halves = [rollout(model, PROMPTS[i:i + 2], cfg, row_seeds=seeds[i:i + 2], prompt_width=width, vocab_limit=2000)
              for i in (0, 2)]
    swapped = rollout(model, PROMPTS[::-1], cfg, row_seeds=seeds[::-1], vocab_limit=2000)
    assert torch.equal(whole.response_ids, torch.cat([h.response_ids for h in halves]))
    assert torch.equal(whole.response_ids, swapped.response_ids.flip(0))
    other = rollout(model, PROMPTS, cfg, row_seeds=[1, 2, 3, 4], vocab_limit=2000)
    assert not torch.equal(whole.response_ids, other.response_ids)
    assert int(whole.response_ids.max()) < 2000 and bool(torch.isfinite(whole.logprobs).all())
    with pytest.raises(ConfigError, match="shorter than the longest prompt"):
        rollout(model, PROMPTS, cfg, row_seeds=seeds, prompt_width=3)


def test_inverse_cdf_follows_the_distribution():
    from meshlm.generate.sampling import inverse_cdf

    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]]).expand(4, 5)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.999999999])
    assert inverse_cdf(probs, u).tolist() == [1, 1, 3, 3]  # zero-probability tokens are never drawn
    draws = inverse_cdf(probs[:1].expand(20000, 5), torch.rand(20000, generator=torch.Generator().manual_seed(0)))
    assert abs(float((draws == 3).double().mean()) - 0.75) < 0.015


def test_bad_requests_are_config_errors():
    model = _model()
    with pytest.raises(ConfigError, match="max_seq_len"):
        rollout(model, PROMPTS, SamplingParams(max_tokens=250))
    with pytest.raises(ConfigError, match="max_tokens"):
        rollout(model, PROMPTS, SamplingParams(max_tokens=None))
    with pytest.raises(ConfigError, match="stop"):
        rollout(model, PROMPTS, SamplingParams(max_tokens=4, stop=("x",)))
    with pytest.raises(ConfigError, match="at least one token"):
        rollout(model, [[1], []], SamplingParams(max_tokens=4))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp_worker(rank: int, world: int, port: int, eos: int, result: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from meshlm.distributed.engine import Engine

        cfg = load_config(None, [f"training.seed={SEED}", "parallel.dp_shard=2"])
        engine = Engine(cfg.parallel, torch.device("cpu"))
        (policy,) = engine.parallelize(meta_model(cfg.model), cfg.training, None, 1)

        def all_finished(done: bool) -> bool:
            flag = torch.tensor([float(done)])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            return bool(flag.item())

        prompts = PROMPTS[:1] if rank == 0 else PROMPTS[1:]  # ranks with different batches, lengths and stops
        sampling = SamplingParams(max_tokens=10, stop_ids=(eos,), temperature=0.0)
        out = rollout(policy, prompts, sampling, all_finished=all_finished)
        result[rank] = [out.response_ids[i][out.response_mask[i]].tolist() for i in range(len(prompts))]
    finally:
        dist.destroy_process_group()
    end_rank(0)  # gloo's threads can abort an interpreter exit (meshlm/distributed/teardown.py)


def test_fsdp2_rollout_equals_single_device():
    model = _model()
    free = rollout(model, PROMPTS, SamplingParams(max_tokens=10, temperature=0.0))
    eos = int(free.response_ids[0, 1])  # rank 0's only row stops early: it must keep decoding with rank 1
    expected = [generate(model, p, 10, greedy=True, eos_id=eos) for p in PROMPTS]
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_fsdp_worker, args=(2, _free_port(), eos, result), nprocs=2, join=True)
        got = result[0] + result[1]
    assert got == expected
