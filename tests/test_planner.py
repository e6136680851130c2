"""The planner: shapes and counts, activation constants against autograd, published results (ZeRO, Megatron,
torchtitan), the search (speed, decision order, --fix), Chinchilla, and the `meshlm plan` CLI contract.
Multi-process measured-vs-predicted checks are in tests/test_planner_measure.py."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from meshlm.errors import ConfigError, UserError
from meshlm.planner.hardware import resolve_hardware
from meshlm.planner.layout import Layout, Training
from meshlm.planner.memory import _zero_bytes, memory
from meshlm.planner.model_spec import GPT_PRESETS, resolve_model
from meshlm.planner.plan import make_plan
from meshlm.planner.search import evaluate
from helpers import meshlm

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("flavor", ["debug", "small", "llama3-8b", "llama3-70b", "llama3-405b", "qwen2.5-7b",
                                    "mistral-7b"])
def test_param_count_matches_the_model_config(flavor):
    from meshlm.models import flavor_config

    assert resolve_model(flavor).num_params() == flavor_config(flavor).num_params()


def test_gpt_presets_match_megatron_sizes():
    """Narayanan et al. 2021, Table 1 (billions): P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))."""
    published = {"gpt-1.7b": 1.7, "gpt-3.6b": 3.6, "gpt-7.5b": 7.5, "gpt-18b": 18.4, "gpt-39b": 39.1,
                 "gpt-76b": 76.1, "gpt-145b": 145.6, "gpt-310b": 310.1, "gpt-530b": 529.6, "gpt-1t": 1008.0}
    for name, billions in published.items():
        assert GPT_PRESETS[name].num_params() / 1e9 == pytest.approx(billions, rel=0.03), name


def test_layer_split_matches_the_engine():
    from meshlm.distributed.pipeline import layer_ranges
    from meshlm.planner.memory import _layer_ranges

    for layers, stages in [(4, 2), (5, 2), (126, 16), (80, 6), (7, 7)]:
        assert _layer_ranges(layers, stages) == tuple(len(r) for r in layer_ranges(layers, stages))


def test_hf_config_json(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 131072, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert resolve_model(str(path)).num_params() == resolve_model("llama3-8b").num_params()
    path.write_text(json.dumps({"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}))
    gpt2 = resolve_model(str(path))
    assert gpt2.arch == "gpt" and gpt2.num_params() == pytest.approx(124.4e6, rel=0.01)  # GPT-2 small


# ----------------------------------------------------------------------------- activations vs autograd
def _saved_bytes(module, *inputs, autocast: bool = False) -> int:
    """Unique storages autograd saves in a forward, parameters and buffers excluded."""
    static = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers(), *inputs[1:]]}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in static:
            seen.setdefault(ptr, t.untyped_storage().nbytes())
        return t

    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        module(*inputs)
    return sum(seen.values())


@pytest.mark.parametrize("shape", [dict(dim=96, n_heads=6, n_kv_heads=2, ffn_hidden_dim=160),
                                   dict(dim=64, n_heads=4, n_kv_heads=4, ffn_hidden_dim=128),
                                   dict(dim=64, n_heads=8, n_kv_heads=2, ffn_hidden_dim=96, head_dim=16)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_block_activation_formula_matches_saved_tensors(shape, precision):
    """The per-block constants (meshlm/planner/activations.py) equal what autograd saves on our real block,
    exactly (bf16: autocast without FSDP; the weight copies autocast saves are counted as buffers)."""
    from meshlm.models import flavor_config
    from meshlm.models.llama import TransformerBlock, precompute_rope
    from meshlm.planner.activations import block_bytes
    from meshlm.planner.memory import rank_stages
    from meshlm.planner.model_spec import from_model_config

    cfg = dataclasses.replace(flavor_config("debug"), **shape)
    block = TransformerBlock(cfg)
    b, s = 3, 40
    x = torch.randn(b, s, cfg.dim, requires_grad=True)
    cos, sin = precompute_rope(cfg, s)
    measured = _saved_bytes(block, x, cos, sin, autocast=precision == "bf16")
    spec = from_model_config(cfg)
    layout = Layout(sharding="none")
    training = Training(s, b, precision)
    predicted = block_bytes(spec, layout, training, b)
    if precision == "bf16":
        predicted += 2 * rank_stages(spec, layout)[0].block.matmul  # autocast's weight copies
    assert predicted == measured


@pytest.mark.parametrize("overrides", [[], ["training.activation_checkpointing=selective"],
                                       ["training.activation_checkpointing=full"],
                                       ["training.precision=bf16", "data.seq_len=32", "training.batch_size=2"],
                                       ["training.micro_batch_size=2"]],
                         ids=["none", "selective", "full", "bf16", "accumulation"])
def test_single_device_memory_is_predicted(overrides, debug_dataset, tmp_path):
    """One device, in process: param/grad/optimizer bytes exact, activations within 5% (measured: exact but
    a few scalars). The meter's activations equal the saved-tensor count where no checkpointing hides them."""
    from meshlm.config.loader import load_config
    from meshlm.planner.measure import MemoryProbe
    from meshlm.planner.predict import layout_from_config, predict_rank
    from meshlm.train.trainer import Trainer

    cfg = load_config(ROOT / "configs/debug.toml", [*overrides, "checkpoint.enabled=false", "training.eval_interval=0",
                                                    "metrics.tensorboard=false", "metrics.progress=plain"])
    probe = MemoryProbe()  # a trainer callback: registers its hooks when the trainer is built
    trainer = Trainer(cfg, tmp_path / "run", callbacks=[probe])
    trainer.train_step()
    with probe.measuring(probe.view):
        trainer.train_step()
    measured = probe.result
    predicted = predict_rank(*layout_from_config(cfg, 1), {})
    for key in ("params", "grads", "optimizer"):
        assert measured[key] == predicted[key], key
    assert measured["activations"] == pytest.approx(predicted["activations"], rel=0.05)
    assert abs(measured["activations"] - predicted["activations"]) < 64  # scalars (loss, token count)


# ------------------------------------------------------------------------------------- published results
def test_zero_paper_table1_memory():
    """Rajbhandari et al. 2019 (arXiv 1910.02054), Table 1: 7.5B parameters, N_d = 64, mixed-precision Adam
    (K = 12): baseline DP 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.88 GB (1 GB = 1e9 bytes)."""
    training = Training(1024, 64, "fp16", accounting="zero")
    published = {"none": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.88}
    for sharding, gb in published.items():
        layout = Layout(dp_shard=64, sharding=sharding)
        total = sum(_zero_bytes(7.5e9, layout, training)) / 1e9
        assert round(total, 2 if gb < 10 else 1) == pytest.approx(gb, abs=0.011), sharding


MEGATRON = [  # Narayanan et al. 2021 (arXiv 2104.04473), Table 1: model, t, p, GPUs, batch, TFLOP/s per GPU
    ("gpt-1.7b", 1, 1, 32, 512, 137), ("gpt-3.6b", 2, 1, 64, 512, 138), ("gpt-7.5b", 4, 1, 128, 512, 142),
    ("gpt-18b", 8, 1, 256, 1024, 135), ("gpt-39b", 8, 2, 512, 1536, 138), ("gpt-76b", 8, 4, 1024, 1792, 140),
    ("gpt-145b", 8, 8, 1536, 2304, 148), ("gpt-310b", 8, 16, 1920, 2160, 155), ("gpt-530b", 8, 35, 2520, 2520, 163),
    ("gpt-1t", 8, 64, 3072, 3072, 163)]


def megatron_tflops(efficiency: float) -> dict[str, float]:
    """Per-GPU TFLOP/s as the paper counts it (F = 96·B·s·l·h²·(1 + s/6h + V/16lh), recompute included) over
    our predicted step: A100 80GB, fp16, full recompute, 1F1B, micro-batch 1, plain data parallelism."""
    hw = resolve_hardware("a100-80gb", 8)
    out = {}
    for name, tp, pp, gpus, batch, _ in MEGATRON:
        spec, dp = GPT_PRESETS[name], gpus // (tp * pp)
        layout = Layout(dp, 1, tp, pp, "1f1b", 1, microbatches=batch // dp if pp > 1 else 1,
                        micro_batch_size=1, sharding="none", activation_checkpointing="full")
        training = Training(2048, batch, "fp16", efficiency=efficiency)
        step = evaluate(spec, layout, training, hw).time.step_time_s
        s, l, h, v = 2048, spec.n_layers, spec.dim, spec.vocab_size
        flops = 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        out[name] = flops / (step * gpus) / 1e12
    return out


def calibrate_on_7_5b(tflops_7_5b, steps: int = 30) -> float:
    """The efficiency at which ``tflops_7_5b(efficiency)`` predicts the 7.5B row's published 142 TFLOP/s, by
    bisection (the step is not linear in the efficiency: memory-bound parts)."""
    lo, hi = 0.05, 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tflops_7_5b(mid) < 142 else (lo, mid)
    return lo


def test_megatron_table1_throughput():
    """Calibrate the efficiency on the 7.5B row with the preset's 20 µs per matmul kernel (timing.py), the other
    nine within ±10% (docs/planner.md: +0.9% … +8.7%, −0.6%, −6.6%, −6.3% for 310B–1T; without the per-kernel
    term −1% … +4% up to 145B, then −9%, −15%, −15%: their bigger GEMMs run closer to peak). The 20 µs was
    chosen on this table, so this guards the model; the leave-one-out errors in docs/planner.md are its test.
    tests/test_planner_cli.py makes the same calibration through `meshlm plan`."""
    lo = calibrate_on_7_5b(lambda e: megatron_tflops(e)["gpt-7.5b"])
    assert lo == pytest.approx(resolve_hardware("a100-80gb", 8).efficiency, abs=0.01)  # the preset's default
    predicted = megatron_tflops(lo)
    errors = {name: predicted[name] / pub - 1 for name, *_, pub in MEGATRON}
    assert abs(errors["gpt-7.5b"]) < 0.01
    assert all(abs(e) < 0.10 for e in errors.values()), errors


def test_torchtitan_llama3_8b_fsdp():
    """torchtitan benchmarks (Llama 3.1 8B, bf16, FSDP, local batch 2 x 8192, selective AC, H100): 5,762
    tokens/s/GPU on 8 GPUs (the H100 preset's efficiency is calibrated on it) and 5,605 on 128 GPUs (predicted:
    +2.5%); memory 82.4 GiB measured on 8 GPUs (ours is an upper bound: +11%)."""
    spec, hw = resolve_model("llama3-8b"), resolve_hardware("h100-80gb", 8)
    for gpus, published in ((8, 5762), (128, 5605)):
        training = Training(8192, 2 * gpus, "bf16", efficiency=hw.efficiency)
        layout = Layout(1, gpus, micro_batch_size=2, sharding="zero3", activation_checkpointing="selective")
        ev = evaluate(spec, layout, training, hw, exact=True)
        assert ev.tokens_per_s / gpus == pytest.approx(published, rel=0.15), gpus
        if gpus == 8:
            assert ev.memory.total / 2**30 == pytest.approx(82.4, rel=0.15)


# -------------------------------------------------------------------------------------------------- search
def test_search_llama3_405b_on_16k_gpus_is_fast():
    """A product limit: a full search for 405B on 16,384 H100s (8 per node) answers in under 2 s."""
    spec, hw = resolve_model("llama3-405b"), resolve_hardware("h100-80gb", 16384)
    training = Training(8192, 2048, "bf16", efficiency=hw.efficiency)
    start = time.perf_counter()
    plan = make_plan(spec, hw, training, 16384)
    elapsed = time.perf_counter() - start
    assert plan.recommended.feasible and plan.recommended.layout.world == 16384
    assert plan.result.evaluated > 1000
    assert elapsed < 2.0, f"{elapsed:.2f} s"


def test_70b_on_8_gpus():
    """fp32 master weights + Adam need 16 bytes/param: 70.6B / 8 GPUs = 131 GiB each before any activation.
    No layout of 8 x 80 GB fits (the message says how many GPUs would); 8 x MI300X (192 GB) does."""
    spec = resolve_model("llama3-70b")
    training = Training(4096, 64, "bf16", efficiency=0.36)
    with pytest.raises(ConfigError, match="use at least 16 GPUs"):
        make_plan(spec, resolve_hardware("h100-80gb", 8), training, 8)
    hw = resolve_hardware("mi300x-192gb", 8)
    plan = make_plan(spec, hw, training, 8)
    rec = plan.recommended
    assert rec.feasible and rec.memory.total < 0.9 * 192 * 2**30
    assert "pure DP" in plan.result.rejected
    assert "GiB per GPU > 172.8 GiB usable (192 GiB x 0.9 headroom)" in plan.result.rejected["pure DP"].reason
    assert not plan.taught[0]["fits"] and plan.verdict
    # nothing faster fits: every candidate is slower or (within the tie band) equal
    assert all(c.tokens_per_s <= rec.tokens_per_s * 1.005 for c in plan.result.candidates)  # ties: less comm


def test_fix_never_refuses():
    spec, hw = resolve_model("llama3-70b"), resolve_hardware("h100-80gb", 8)
    training = Training(8192, 16, "bf16", efficiency=hw.efficiency)
    plan = make_plan(spec, hw, training, 8, fix={"tp": 1, "dp_shard": 1, "dp_replicate": 8})
    assert not plan.recommended.feasible and plan.recommended.memory.total > 80 * 2**30
    assert "GiB per GPU" in plan.recommended.reason
    plan = make_plan(spec, hw, training, 8, fix={"tp": 8, "activation_checkpointing": "full"})
    assert plan.recommended.layout.tp == 8 and plan.recommended.layout.activation_checkpointing == "full"


LLAMA_33B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 6656,
             "num_hidden_layers": 60, "num_attention_heads": 52, "num_key_value_heads": 52, "intermediate_size": 17920,
             "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def test_30b_on_8_a100_80gb_fits_with_zero3_and_accumulation(tmp_path):
    """The classic case (LLaMA-1 33B-like, 32.5B params, seq 2048, 2M-token batches on 8 x A100 80GB): 16 bytes
    per parameter sharded over 8 is 60.6 GiB, plus one micro-batch of one sequence's activations. The search
    used to try micro-batches down to local/16 only (128 sequences per rank: 8 at least) and found nothing."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_33B))
    out = meshlm("plan", "--model", str(config), "--gpus", "8", "--gpu", "a100-80gb", "--seq", "2048",
                 "--global-batch-tokens", "2097152", "--json")
    rec = json.loads(out.stdout)["recommended"]
    assert rec["feasible"] and rec["memory_gib"]["total"] < 0.9 * 80
    spec, hw = resolve_model(str(config)), resolve_hardware("a100-80gb", 8)
    training = Training(2048, 1024, "bf16", efficiency=hw.efficiency)
    zero3 = Layout(1, 8, micro_batch_size=1, sharding="zero3", activation_checkpointing="full")
    ev = evaluate(spec, zero3, training, hw)
    states = ev.memory.params + ev.memory.grads + ev.memory.optimizer
    assert states == pytest.approx(16 * spec.num_params() / 8, rel=1e-3)
    assert ev.feasible and ev.memory.activations < 0.05 * states, ev.reason


def test_zero1_row_of_the_zero_paper_from_the_cli():
    """--fix sharding=zero1 under the paper's accounting reports ZeRO-1 (P_os: 2 + 2 + 12/N_d bytes per parameter,
    31.4 GB for 7.5B on 64 GPUs); under the engine's accounting it is reported with the reason it cannot run."""
    args = ["plan", "--model", "gpt-7.5b", "--gpus", "64", "--gpu", "a100-80gb", "--seq", "1024",
            "--global-batch-seqs", "64", "--json"]
    data = json.loads(meshlm(*args, "--fix", "sharding=zero1", "--accounting", "zero").stdout)
    rec = data["recommended"]
    assert rec["feasible"] and rec["layout"]["sharding"] == "zero1" and rec["family"].startswith("ZeRO-1")
    assert rec["layout"]["dp_shard"] == 64  # the fastest: ranking compares relative speed at any magnitude
    assert all(c["tokens_per_s"] <= rec["tokens_per_s"] * 1.005 for c in data["candidates"])
    states = sum(rec["memory_gib"][k] for k in ("params", "grads", "optimizer")) * 2**30
    assert states == pytest.approx(data["model"]["params"] * (2 + 2 + 12 / 64), rel=1e-3)
    assert states / data["model"]["params"] * 7.5e9 / 1e9 == pytest.approx(31.4, abs=0.05)
    engine = json.loads(meshlm(*args, "--fix", "sharding=zero1,tp=1,pp=1").stdout)["recommended"]
    assert not engine["feasible"] and "no ZeRO-1" in engine["reason"]


def test_model_that_fits_nowhere_says_by_how_much():
    spec, hw = resolve_model("llama3-405b"), resolve_hardware("h100-80gb", 8)
    with pytest.raises(ConfigError, match=r"needs .* GiB per GPU, .*x the 72.0 GiB usable.*at least \d+ GPUs"):
        make_plan(spec, hw, Training(8192, 16, "bf16"), 8)


def test_pipeline_memory_follows_the_schedule():
    """1F1B's first stage holds p micro-batches, GPipe all m; interleaving holds more chunks but smaller."""
    spec = resolve_model("llama3-8b")
    training = Training(4096, 64, "bf16")
    acts = {s: memory(spec, Layout(1, 1, 1, 4, s, 2 if s.startswith("inter") else 1, microbatches=16,
                                   sharding="none"), training, 0).detail["activations:in_flight"]
            for s in ("gpipe", "1f1b", "interleaved-1f1b")}
    assert acts["gpipe"] == 16 and acts["1f1b"] == 4 and acts["interleaved-1f1b"] > 4


def test_chinchilla():
    from meshlm.planner.chinchilla import compute_optimal, rule_of_thumb

    # Gopher's budget, 5.76e23 FLOPs: the replication's fit lands near the 20 tokens/param rule (~70B), the
    # original published constants lower (~32B) — the discrepancy Besiroglu et al. 2024 point out.
    assert compute_optimal(5.76e23, "besiroglu")["params"] / 1e9 == pytest.approx(72, rel=0.05)
    assert compute_optimal(5.76e23)["params"] / 1e9 == pytest.approx(32, rel=0.05)
    assert rule_of_thumb(5.76e23)["tokens"] == pytest.approx(20 * rule_of_thumb(5.76e23)["params"])
    small, big = compute_optimal(1e21), compute_optimal(1e23)
    assert big["params"] / small["params"] == pytest.approx(100 ** (0.28 / 0.62), rel=1e-6)


# ------------------------------------------------------------------------------------------------------ CLI
def test_plan_json_contract(tmp_path):
    out = meshlm("plan", "--model", "llama3-70b", "--gpus", "8", "--gpu", "mi300x-192gb", "--seq", "4096",
                 "--global-batch-tokens", str(64 * 4096), "--json", "--chart", str(tmp_path / "mem.png"))
    data = json.loads(out.stdout)
    assert {"recommended", "candidates", "rejected"} <= set(data)
    for entry in [data["recommended"], *data["candidates"]]:
        assert set(entry["layout"]) >= {"dp_replicate", "dp_shard", "tp", "pp", "pp_schedule", "microbatches",
                                        "sharding", "activation_checkpointing", "precision"}
        assert set(entry["memory_gib"]) == {"params", "grads", "optimizer", "activations", "buffers", "total"}
        assert {"step_time_s", "tokens_per_s", "mfu", "comm_share", "bubble"} <= set(entry)
    assert data["rejected"] and all("reason" in r for r in data["rejected"])
    assert (tmp_path / "mem.png").stat().st_size > 1000


@pytest.mark.parametrize("args, message", [
    (["--gpu", "h100-80g"], "did you mean 'h100-80gb'"),
    (["--gpus", "0"], "--gpus must be at least 1"),
    (["--seq", "0"], "--seq must be positive"),
    (["--model", "llama3-405b", "--gpus", "4"], "fits no layout of 4 x h100-80gb"),
    (["--fix", "tpp=2"], "did you mean 'tp'"),
    (["--model", "gpt-7.5b", "--emit-config", "x.toml"], "exists only in the planner"),
])
def test_plan_bad_input_exits_2(args, message):
    base = {"--model": "llama3-8b", "--gpus": "8", "--gpu": "h100-80gb", "--seq": "4096",
            "--global-batch-tokens": str(16 * 4096)}
    for key, value in zip(args[::2], args[1::2]):
        base[key] = value
    proc = meshlm("plan", *[x for kv in base.items() for x in kv], check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_heads_not_divisible_is_a_config_error(tmp_path):
    """HF derives head_dim = hidden_size // heads (33 here), which RoPE cannot rotate: exit 2, one line."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 100, "num_hidden_layers": 2,
                                "num_attention_heads": 3, "intermediate_size": 256, "vocab_size": 1000,
                                "max_position_embeddings": 128}))
    proc = meshlm("plan", "--model", str(path), "--gpus", "2", "--seq", "64", "--global-batch-seqs", "4", check=False)
    assert proc.returncode == 2 and "head size 33 must be even" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_hf_config_is_read_as_the_converter_reads_it(tmp_path):
    """The planner reads config.json through meshlm/interop/hf_config.py: what `meshlm convert` refuses (here a
    bias on o_proj, which meshlm's decoder has not) the planner refuses too, with the same reason."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_33B, "attention_bias": True}))
    with pytest.raises(UserError, match="attention_bias = true"):  # exit code 2 on the CLI
        resolve_model(str(path))


def test_emitted_config_is_accepted(tmp_path):
    run = tmp_path / "run.toml"
    meshlm("plan", "--model", "llama3-8b", "--gpus", "16", "--gpu", "a100-80gb", "--seq", "4096",
           "--global-batch-tokens", str(64 * 4096), "--emit-config", str(run))
    shown = meshlm("config", "show", str(run))
    assert "[parallel]" in shown.stdout and "llama3-8b" in shown.stdout


def test_step_cost_of_lora_and_of_a_preference_pair():
    """LoRA's frozen weights skip their weight gradients (2 matmuls per weight instead of 3) and only the adapters
    are updated; a preference pair runs two sequences, and DPO's reference model one more forward of each."""
    from meshlm.planner.timing import lora_adapter_params, rank_flops, step_time

    spec = resolve_model("small")
    hw = resolve_hardware("h100-80gb", 1)  # no per-kernel cost: LoRA's small adapter kernels cost their FLOPs only
    base = Training(256, 8, "bf16", efficiency=0.5)
    full_flops = rank_flops(spec, Layout(), base, 0)[0]
    lora = dataclasses.replace(base, lora_rank=8, lora_targets=("q", "k", "v", "o", "gate", "up", "down"))
    tokens = 8 * 256
    block_w = 2 * sum(t.numel for t in spec.block_tensors() if t.matmul)
    head, attention = 2 * spec.vocab_size * spec.dim, 4 * 256 * spec.q_size
    by_hand = tokens * (spec.n_layers * (2 * block_w + 3 * attention + 3 * 2 * lora_adapter_params(spec, lora))
                        + 2 * head)
    assert rank_flops(spec, Layout(), lora, 0)[0] == pytest.approx(by_hand)
    assert rank_flops(spec, Layout(), lora, 0)[0] < 0.75 * full_flops
    assert lora_adapter_params(spec, lora) == 8 * sum(sum(t.shape) for t in spec.block_tensors() if t.matmul)
    assert step_time(spec, Layout(), lora, hw).step_time_s < step_time(spec, Layout(), base, hw).step_time_s
    dpo = dataclasses.replace(base, sequences_per_row=2, frozen_forwards=1)
    assert rank_flops(spec, Layout(), dpo, 0)[0] == pytest.approx(full_flops * (2 * 3 + 2 * 1) / 3)
    assert dpo.tokens == 2 * base.tokens
    with pytest.raises(ConfigError, match="needs its targets"):
        Training(256, 8, lora_rank=8)


def test_calibration_solves_the_planners_own_step_model():
    """The calibrated efficiency makes the planner's single-device prediction of the probe equal its measured
    time (the element-wise and optimizer time stay beside the matmuls, not inside the efficiency)."""
    from meshlm.planner.calibrate import solve_efficiency
    from meshlm.planner.timing import step_time

    spec, hw = resolve_model("small"), resolve_hardware("a100-80gb", 1)
    training = Training(256, 4, "fp32")
    fast = step_time(spec, Layout(), dataclasses.replace(training, efficiency=1.0), hw).step_time_s
    for measured in (1.5 * fast, 4 * fast):
        e = solve_efficiency(spec, hw, training, measured)
        assert step_time(spec, Layout(), dataclasses.replace(training, efficiency=e), hw).step_time_s \
            == pytest.approx(measured, rel=1e-9)
    assert solve_efficiency(spec, hw, training, 0.5 * fast) == 1.0  # faster than the model allows: clamped


def test_a_calibration_is_kept_per_machine_and_precision(tmp_path, monkeypatch):
    """`meshlm plan --calibrate` keeps its efficiency; a training run's own prediction reads it back."""
    from meshlm.planner.calibrate import calibration_path, save_calibration, saved_efficiency

    monkeypatch.setenv("MESHLM_CACHE", str(tmp_path))
    assert saved_efficiency("cpu", "fp32") is None
    save_calibration("cpu", "fp32", 0.73)
    save_calibration("cpu", "bf16", 0.11)
    assert saved_efficiency("cpu", "fp32") == 0.73 and saved_efficiency("cpu", "bf16") == 0.11
    assert saved_efficiency("a100-80gb", "fp32") is None
    calibration_path().write_text("{not json")
    assert saved_efficiency("cpu", "fp32") is None  # unreadable: no calibration, never an error
