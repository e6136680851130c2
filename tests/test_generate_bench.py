"""``meshlm bench generate`` measures what a user feels (issue 31): end-to-end tokens/s as the headline, time to
first token and ms per step beside it, transformers' figures and ratios, the fast path's pack memory made once
before the timed runs, and the machine's load."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from meshlm.cli.main import main  # noqa: E402
from meshlm.generate.decode import fast_forward  # noqa: E402
from meshlm.generate.packed import pack_bytes, packed_weights  # noqa: E402
from meshlm.generate.split import row_splits  # noqa: E402
from meshlm.interop import convert_from_hf  # noqa: E402
from meshlm.models import build_model, flavor_config  # noqa: E402
from tiny_hf import VOCAB_ROWS, chatml_tokenizer, write_chatml_llama  # noqa: E402

transformers.utils.logging.disable_progress_bar()
D, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128  # write_chatml_llama's shapes
DH = D // HEADS


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-generate")
    write_chatml_llama(root / "hf", chatml_tokenizer())
    convert_from_hf(root / "hf", root / "run")
    return root / "run"


def bench(args, capfd):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "generate", "--device", "cpu", "--repeats", "1", "--warmup", "0", *args])
    return exc.value.code, capfd.readouterr().out


def test_end_to_end_headline_first_token_and_pack_memory(run, capfd):
    code, out = bench(["--checkpoint", str(run), "--prompt-len", "6", "--new-tokens", "5", "--compare-hf", "--json"],
                      capfd)
    r = json.loads(out)
    assert code == 0 and r["hf_identical"] is True
    assert r["end_to_end_tokens_per_s"] == r["tokens_per_s"] == pytest.approx(5 / r["total_s"])
    if math.isnan(r["ms_per_step"]):  # 4 steps of a tiny model can be shorter than the noise of the two medians
        assert math.isnan(r["decode_tokens_per_s"])
    else:
        assert r["ms_per_step"] > 0 and r["decode_tokens_per_s"] == pytest.approx(1e3 / r["ms_per_step"])
    assert r["ttft_to_hf"] == pytest.approx(r["time_to_first_token_s"] / r["hf_time_to_first_token_s"])
    assert r["hf_end_to_end_tokens_per_s"] == r["hf_tokens_per_s"]
    # batch 1 decodes on the row pack (row_pack_bytes); the prefill takes the view pack (one core: no copy) or the
    # same blocks
    assert r["pack_bytes"] == row_pack_bytes() and r["pack_build_s"] > 0
    assert r["load_average_start"] >= 0 and r["load_average_end"] >= 0
    code, out = bench(["--checkpoint", str(run), "--prompt-len", "6", "--new-tokens", "5"], capfd)
    assert code == 0 and "end to end" in out.splitlines()[1] and "fast-path packs" in out


def row_pack_bytes() -> int:
    """The row pack's copies: fused q/k/v and gate/up, o and the tied head transposed, each an fp32 copy; on more
    than one core also the down projection, every matrix in column blocks padded to a whole number of blocks
    (split.py)."""
    splits = row_splits(torch.device("cpu"))

    def cols(n):
        return n if splits == 1 else splits * -(-n // splits)

    per_layer = D * cols((HEADS + 2 * KV_HEADS) * DH) + D * cols(2 * FFN) + HEADS * DH * cols(D)
    per_layer += FFN * cols(D) if splits > 1 else 0
    return 4 * (LAYERS * per_layer + D * cols(VOCAB_ROWS))


def test_a_batch_adds_no_pack_memory_and_plain_none(run, capfd):
    # 3 rows decode on the view pack (no copy); their 12-row prefill on one core too, on more the row pack's blocks
    code, out = bench(["--checkpoint", str(run), "--batch", "3", "--prompt-len", "4", "--new-tokens", "3", "--json"],
                      capfd)
    assert code == 0 and json.loads(out)["pack_bytes"] == (0 if row_splits(torch.device("cpu")) == 1
                                                           else row_pack_bytes())
    code, out = bench(["--checkpoint", str(run), "--plain", "--prompt-len", "4", "--new-tokens", "3", "--json"], capfd)
    r = json.loads(out)
    assert code == 0 and r["pack_bytes"] == 0 and r["pack_build_s"] == 0


def test_prepare_makes_the_packs_once_and_int8_counts_a_byte_an_entry():
    cfg = dataclasses.replace(flavor_config("debug"), dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64,
                              vocab_size=97, max_seq_len=32)
    model = build_model(cfg, "cpu", seed=0).eval()
    forward = fast_forward(model)
    extra = forward.prepare(1)
    assert extra > 0
    packs = packed_weights(model, 1), packed_weights(model, 64)
    assert forward.prepare(1) == extra and (packed_weights(model, 1), packed_weights(model, 64)) == packs  # reused
    int8 = packed_weights(model, 1, "int8")
    matrices = [int8.head] + [m for layer in int8.layers for m in (*layer.wqkv, layer.wo, *layer.w13, layer.w2)]
    assert pack_bytes(int8, model) == sum(m.shape[0] * m.shape[1] + 4 * m.shape[1] for m in matrices)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # a changed parameter: the next prepare makes new packs
    forward.prepare(1)
    assert packed_weights(model, 1) is not packs[0]


def test_compare_hf_maps_a_gemma3_model_by_its_family():
    """--compare-hf copies the weights into transformers' model by the checkpoint's family's names (Gemma 3's
    norms and layers are not the llama family's)."""
    from meshlm.generate.bench import hf_model_from

    small = flavor_config("gemma3-270m")
    cfg = dataclasses.replace(small, vocab_size=64, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                              ffn_hidden_dim=64, max_seq_len=32, sliding_window=4, layer_kinds=["sliding", "global"],
                              query_pre_attn_scalar=16.0)
    model = build_model(cfg, "cpu", seed=0).eval()
    hf = hf_model_from(model)
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    ours = model.state_dict()["layers.1.post_ffn_norm.weight"]
    assert torch.equal(hf.state_dict()["model.layers.1.post_feedforward_layernorm.weight"], ours)


def test_a_step_time_lost_in_the_noise_is_not_reported_negative():
    from meshlm.generate.bench import _figures

    noisy = _figures({"full_s": 0.010, "first_token_s": 0.012}, batch=1, new_tokens=5)  # medians of separate runs
    assert math.isnan(noisy["ms_per_step"]) and math.isnan(noisy["decode_tokens_per_s"])
    clean = _figures({"full_s": 0.5, "first_token_s": 0.1}, batch=2, new_tokens=5)
    assert clean["ms_per_step"] == pytest.approx(100.0) and clean["decode_tokens_per_s"] == pytest.approx(20.0)


def test_speculative_and_int4_runs_report_their_figures_and_match_where_exact(run, capfd):
    code, out = bench(["--checkpoint", str(run), "--prompt-len", "6", "--new-tokens", "9", "--speculative", "ngram",
                       "--compare-hf", "--json"], capfd)
    r = json.loads(out)
    assert code == 0 and r["speculative"] == "ngram" and r["hf_identical"] is True  # greedy tokens unchanged
    assert 1 <= r["speculative_forwards"] <= 8 and 0 <= r["speculative_accepted"] <= r["speculative_drafted"]
    code, out = bench(["--checkpoint", str(run), "--prompt-len", "6", "--new-tokens", "3", "--weights", "int4",
                       "--json"], capfd)
    r = json.loads(out)
    assert code == 0 and r["weights"] == "int4" and r["speculative"] is None
    assert 0 < r["weight_bytes"] < 4 * r["params"] / 4  # half a byte a weight + a bf16 scale and zero per 32
    code, out = bench(["--checkpoint", str(run), "--batch", "2", "--speculative", "ngram"], capfd)
    assert code == 2


def test_the_int4_pack_counts_half_a_byte_an_entry_and_its_group_scales():
    from meshlm.generate.int4 import GROUP_SIZE, Int4Matrix

    cfg = dataclasses.replace(flavor_config("debug"), dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64,
                              vocab_size=96, max_seq_len=32)
    model = build_model(cfg, "cpu", seed=0).eval()
    int4 = packed_weights(model, 1, "int4")
    matrices = [int4.head] + [m for layer in int4.layers for m in (*layer.wqkv, layer.wo, *layer.w13, layer.w2)]
    assert all(isinstance(m, Int4Matrix) for m in matrices)  # 96 = 6 x 16 vocabulary rows: the head too
    assert pack_bytes(int4, model) == sum(m.shape[0] * m.shape[1] // 2 + 4 * m.shape[1] * m.shape[0] // GROUP_SIZE
                                          for m in matrices)
