"""4-bit decode weights (meshlm/generate/int4.py): the group quantisation and torch's CPU int4 kernel against fp32
products, the fallback for shapes the kernel lacks, the fast path's decode steps near fp32's with greedy tokens
mostly the same, and the weight format accepted where int8 is."""

from __future__ import annotations

import pytest
import torch

from meshlm.generate import generate
from meshlm.generate.decode import FastForward, fast_forward
from meshlm.generate.int4 import GROUP_SIZE, Int4Matrix, int4_or_fp32, int4_unavailable_reason, quantize_groups
from meshlm.generate.packed import pack_bytes, packed_weights
from tests.test_decode import ARCHS, tiny
from tests.test_int8 import assert_format_refusals

pytestmark = pytest.mark.skipif(int4_unavailable_reason() is not None, reason="torch without the CPU int4 kernel")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_groups_round_trip_within_half_a_level():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 128, generator=g) * torch.linspace(0.1, 3.0, 48)[:, None]
    q, scale, zero = quantize_groups(weight)
    assert q.min() >= 0 and q.max() <= 15 and scale.shape == (48, 128 // GROUP_SIZE)
    deq = ((q.float() - 8).view(48, -1, GROUP_SIZE) * scale.float()[..., None] + zero.float()[..., None]).view(48, 128)
    # each entry within half a level of its group (plus the bf16 rounding of scale and zero: 2^-8 of them)
    bound = (scale.float() * (0.5 + 16 * 2**-8)).repeat_interleave(GROUP_SIZE, dim=1) + 2**-8 * zero.float().abs(
        ).repeat_interleave(GROUP_SIZE, dim=1)
    assert ((deq - weight).abs() <= bound).all()
    m = Int4Matrix(weight)
    torch.testing.assert_close(m.dequantized(), deq, rtol=1e-6, atol=1e-6)  # the kernel reads what was rounded
    assert m.nbytes() == 48 * 128 // 2 + 2 * 2 * 48 * (128 // GROUP_SIZE)


def test_the_matrix_multiplies_near_fp32_and_folds_the_bias():
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(64, 96, generator=g), torch.randn(64, generator=g)
    m = Int4Matrix(weight, bias)
    assert m.shape == (96, 64)
    for rows in (1, 5):
        x = torch.randn(rows, 96, generator=g)
        got = m(x)
        assert got.shape == (rows, 64) and got.dtype == torch.float32
        # against the dequantised weight: only the bf16 activations differ (~0.3%)
        assert _rel(got, x @ m.dequantized().t() + bias) < 0.01
        assert 0 < _rel(got, x @ weight.t() + bias) < 0.12  # 4 bits: ~7% on Gaussian data (module docstring)


def test_shapes_the_kernel_lacks_stay_fp32():
    w, b = torch.randn(97, 32), torch.randn(97)  # 97 outputs: not a multiple of 16
    fallback = int4_or_fp32(w, b)
    x = torch.randn(3, 32)
    torch.testing.assert_close(fallback(x), x @ w.t() + b)
    assert isinstance(int4_or_fp32(torch.randn(32, 33)), torch.Tensor)  # 33 inputs: no whole group
    assert isinstance(int4_or_fp32(torch.randn(32, 64)), Int4Matrix)


@pytest.mark.parametrize("arch", ["llama", "qwen2-bias", "mistral-window"])
def test_decode_steps_stay_near_fp32_and_greedy_tokens_mostly_agree(arch):
    model = tiny(**ARCHS[arch])
    fp32, int4 = FastForward(model), fast_forward(model, "int4")
    assert int4.weight_format == "int4"
    ids = torch.tensor([[5, 17, 3, 42, 8, 1, 30, 2]])
    c32, c4 = model.new_cache(1, 24), model.new_cache(1, 24)
    with torch.no_grad():
        want, got = fp32(ids, cache=c32, start_pos=0), int4(ids, cache=c4, start_pos=0)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # a prefill runs fp32 (blocks or not: ~1e-6)
        errors, agree = [], []
        for pos in range(8, 24):
            token = want[:, -1].argmax(-1, keepdim=True)  # both follow fp32's tokens
            want, got = fp32(token, cache=c32, start_pos=pos), int4(token, cache=c4, start_pos=pos)
            errors.append(_rel(got, want))
            agree.append(bool(got.argmax(-1) == want.argmax(-1)))
    # a 32-wide toy with init_std 0.2 amplifies rounding: 4 bits move its logits 15-60% (measured), against ~140%
    # for logits unrelated to fp32's (a transposed or misread layout), and its argmax then lands anywhere
    assert 0 < sum(errors) / len(errors) < 0.45 and max(errors) < 0.9, errors
    assert sum(agree) >= len(agree) // 2, (agree, errors)  # chance on 97 tokens: ~1%


def test_generate_decodes_on_the_int4_pack_and_counts_its_bytes():
    model = tiny()
    pack = packed_weights(model, 1, "int4")
    assert isinstance(pack.layers[0].wqkv[0], Int4Matrix) and isinstance(pack.layers[0].w2, Int4Matrix)
    assert not isinstance(pack.head, Int4Matrix)  # vocabulary 97: the fp32 fallback
    assert packed_weights(model, 16, "int4") is pack  # one pack for every batch
    layer_bytes = sum(m.nbytes() for m in (*pack.layers[0].wqkv, pack.layers[0].wo, *pack.layers[0].w13,
                                           pack.layers[0].w2))
    assert pack_bytes(pack, model) == len(pack.layers) * layer_bytes  # the head is a view of the model's
    ids = generate(model, [5, 17, 3, 42], 6, greedy=True, weights="int4")
    assert len(ids) == 6 and ids[0] == generate(model, [5, 17, 3, 42], 1, greedy=True)[0]  # fp32 prefill


def test_refusals_name_the_key():
    assert_format_refusals("int4")


def test_the_server_engine_decodes_on_the_int4_pack():
    from meshlm.serve.engine import BatchEngine
    from meshlm.serve.protocol import Sampling
    from tests.test_serve_engine import DigitTokenizer, _collect

    model = tiny()
    prompt = [5, 17, 3, 42]
    want = generate(model, prompt, 5, greedy=True, weights="int4")
    engine = BatchEngine(model, DigitTokenizer(), max_batch=4, weights="int4")
    try:
        seq, done = _collect(engine, prompt, 5, Sampling(temperature=0.0))
        assert done.wait(60)
        assert engine._forward().weight_format == "int4" and seq.generated == want  # one row a step in both
    finally:
        engine.close()
