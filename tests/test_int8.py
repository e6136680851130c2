"""int8 decode weights (meshlm/generate/int8.py): the matrix against fp32 products, the fast path's prefill in fp32
and decode steps near fp32's, padded batches row for row, the generate / rollout / server paths, and refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from meshlm.errors import ConfigError
from meshlm.generate import generate
from meshlm.generate.decode import FastForward, fast_forward
from meshlm.generate.int8 import Int8Matrix, check_weight_format
from meshlm.generate.packed import packed_weights
from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import rollout
from meshlm.serve.engine import BatchEngine
from meshlm.serve.protocol import Sampling
from tests.test_decode import ARCHS, tiny
from tests.test_serve_engine import DigitTokenizer, _collect

pytestmark = pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines,
                                reason="torch build without FBGEMM")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_the_matrix_stores_per_row_int8_and_multiplies_near_fp32():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=g) * torch.linspace(0.1, 3.0, 96)[:, None]  # rows of unequal scale
    bias = torch.randn(96, generator=g)
    m = Int8Matrix(weight, bias)
    assert m.shape == (64, 96)
    deq = m.dequantized()
    # per-row symmetric: every entry within half a step of its row's scale, the row maximum exact
    assert (deq - weight).abs().le(m.scale[:, None] / 2 + 1e-6).all()
    torch.testing.assert_close(deq.abs().amax(1), weight.abs().amax(1), rtol=1e-6, atol=1e-6)
    for rows in (1, 5):
        x = torch.randn(rows, 64, generator=g)
        got, want = m(x), x @ weight.t() + bias
        assert got.shape == (rows, 96) and got.dtype == torch.float32
        assert _rel(got, want) < 0.03  # both roundings: ~1% each on this data (the module docstring)
        assert _rel(got, want) > 0  # it did quantise (an fp32 fallback would be exact)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_runs_fp32_and_decode_steps_stay_near_fp32(arch):
    model = tiny(**ARCHS[arch])
    fp32, int8 = FastForward(model), fast_forward(model, "int8")
    assert isinstance(int8, FastForward) and int8.weight_format == "int8"
    ids = torch.tensor([[5, 17, 3, 42, 8, 1, 30, 2]])
    c32, c8 = model.new_cache(1, 20), model.new_cache(1, 20)
    with torch.no_grad():
        want, got = fp32(ids, cache=c32, start_pos=0), int8(ids, cache=c8, start_pos=0)
        # a prefill never runs the int8 pack: fp32 (the view pack; the fp32 model's may sum in column blocks,
        # split.py: ~1e-6), where int8 is ~1e-2 off
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        errors = []
        for pos in range(8, 16):
            token = want[:, -1].argmax(-1, keepdim=True)
            want, got = fp32(token, cache=c32, start_pos=pos), int8(token, cache=c8, start_pos=pos)
            errors.append(_rel(got, want))
    assert 0 < max(errors) < 0.1, errors


def test_a_padded_batch_decodes_every_row_near_fp32():
    model = tiny(sliding_window=6)
    B, P = 3, 5
    ids = torch.tensor([[0, 0, 5, 17, 3], [9, 4, 11, 2, 7], [0, 44, 12, 7, 10]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    fp32, int8 = FastForward(model), FastForward(model, "int8")
    c32, c8 = model.new_cache(B, 16), model.new_cache(B, 16)
    full_mask = torch.cat([mask, torch.ones(B, 8, dtype=torch.bool)], 1)
    with torch.no_grad():
        kw = dict(start_pos=0, position_ids=positions, padding_mask=mask)
        want, got = fp32(ids, cache=c32, **kw), int8(ids, cache=c8, **kw)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # the prefill is fp32 (column blocks or not)
        next_pos, errors = mask.long().sum(1), []
        for step in range(8):
            token = want[:, -1].argmax(-1, keepdim=True)  # (B, 1): both follow fp32's tokens
            kw = dict(start_pos=P + step, position_ids=(next_pos + step)[:, None], padding_mask=full_mask[:, :P + step + 1])
            want, got = fp32(token, cache=c32, **kw), int8(token, cache=c8, **kw)
            for row in range(B):
                errors.append(_rel(got[row], want[row]))
    # int8 rounding on a 32-wide toy model: a few percent a row (a masking or position mistake would be ~1)
    assert 0 < sum(errors) / len(errors) < 0.06 and max(errors) < 0.2, errors


def test_generate_rollout_and_the_server_engine_decode_on_the_int8_pack(monkeypatch):
    model = tiny()
    calls = []
    original = Int8Matrix.__call__
    monkeypatch.setattr(Int8Matrix, "__call__", lambda self, x: calls.append(x.shape[0]) or original(self, x))
    prompt = [5, 17, 3, 42]
    ids8, ids32 = generate(model, prompt, 5, greedy=True, weights="int8"), generate(model, prompt, 5, greedy=True)
    assert len(ids8) == 5 and ids8[0] == ids32[0]  # the first token comes from the fp32 prefill
    per_step = 4 * len(model.layers) + 1  # q/k/v, o, gate/up, down per layer, and the head
    assert calls == [1] * per_step * 4  # four decode steps of one row, every matrix int8
    calls.clear()
    cfg = SamplingParams(max_tokens=3, temperature=0.0)
    out = rollout(model, [prompt, [9, 8]], cfg, weights="int8")
    assert out.response_ids.shape == (2, 3) and out.response_ids[0, 0] == ids32[0]
    assert calls == [2] * per_step * 2
    # the server's engine: one greedy request alone decodes exactly generate()'s int8 ids (one row a step in both)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, weights="int8")
    try:
        seq, done = _collect(engine, prompt, 5, Sampling(temperature=0.0))
        assert done.wait(60)
        assert engine._forward().weight_format == "int8" and seq.generated == ids8
    finally:
        engine.close()


def test_the_int8_pack_is_made_once_and_follows_updates():
    model = tiny()
    first = packed_weights(model, 1, "int8")
    assert packed_weights(model, 16, "int8") is first  # one int8 pack serves every batch size
    assert isinstance(first.head, Int8Matrix) and isinstance(first.layers[0].w2, Int8Matrix)
    with torch.no_grad():
        model.layers["0"].feed_forward.w2.weight.mul_(2)
    assert packed_weights(model, 1, "int8") is not first


def assert_format_refusals(weights: str) -> None:
    """``--weights WEIGHTS`` runs an fp32 model on CPU and refuses CUDA, another dtype and a model without meshlm's
    packed decode path, each with a message naming the format (shared with tests/test_int4.py)."""
    check_weight_format(weights, "cpu", torch.float32)
    with pytest.raises(ConfigError, match=f"{weights} runs on CPU only"):
        check_weight_format(weights, "cuda", torch.float32)
    with pytest.raises(ConfigError, match=f"{weights} quantises an fp32 model"):
        check_weight_format(weights, "cpu", torch.bfloat16)
    with pytest.raises(ConfigError, match="needs meshlm's packed decode path"):
        fast_forward(torch.nn.Linear(2, 2), weights)


def test_refusals_name_the_key():
    model = tiny()
    with pytest.raises(ConfigError, match="--weights must be one of"):
        check_weight_format("int3", "cpu", torch.float32)
    assert_format_refusals("int8")
    assert fast_forward(torch.nn.Linear(2, 2)).__class__ is torch.nn.Linear  # fp32: the model's own forward
    assert fast_forward(model).__class__ is FastForward
    with pytest.raises(ConfigError, match="fast=False"):
        generate(model, [5, 6], 2, greedy=True, fast=False, weights="int8")
    with pytest.raises(ConfigError, match="fast=False"):
        rollout(model, [[5, 6]], SamplingParams(max_tokens=2, temperature=0.0), fast=False,
                weights="int8")


def test_the_cli_refuses_an_unknown_weight_format_before_loading_anything():
    for command in (["generate", "--checkpoint", "nowhere", "--prompt", "x"],
                    ["bench", "generate", "--checkpoint", "nowhere"]):
        r = subprocess.run([sys.executable, "-m", "meshlm", *command, "--weights", "int3"], capture_output=True,
                           text=True)
        assert r.returncode == 2
        assert "--weights" in r.stderr and "int3" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "meshlm", "bench", "generate", "--checkpoint", "nowhere", "--plain",
                        "--weights", "int8"], capture_output=True, text=True)
    assert r.returncode == 2 and "--plain" in r.stderr and "Traceback" not in r.stderr
