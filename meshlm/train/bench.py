"""Training throughput benchmark on synthetic tokens: the trainer's compute path without data loading."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch import nn

from meshlm.config.schema import OptimizerConfig, ParallelConfig, TrainingConfig
from meshlm.distributed.engine import Engine
from meshlm.models import build_model, flavor_config
from meshlm.models.config import ModelConfig
from meshlm.objectives import NextTokenObjective
from meshlm.train.flops import model_flops_per_token, peak_flops
from meshlm.train.optim import build_optimizer
from meshlm.train.precision import autocast


def _time_steps(step: Callable[[], None], steps: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _train_step_fn(model: nn.Module, loss_fn: Callable[[nn.Module, dict], torch.Tensor], batch: dict,
                   precision: str, device: torch.device) -> Callable[[], None]:
    optimizer = build_optimizer(model, OptimizerConfig())
    num_tokens = batch["labels"].numel()

    def step() -> None:
        with autocast(precision, device.type):
            loss = loss_fn(model, batch) / num_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def synthetic_batch(cfg: ModelConfig, batch: int, seq: int, device: torch.device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
    return {"input_ids": tokens[:, :-1].to(device), "labels": tokens[:, 1:].to(device)}


def bench_train(flavor: str, batch: int, seq: int, steps: int, *, warmup: int = 2, compile: bool = False,
                precision: str = "fp32", device: str = "cpu", compare_hf: bool = False) -> dict[str, Any]:
    dev = torch.device(device)
    cfg = flavor_config(flavor)
    cfg.max_seq_len = max(cfg.max_seq_len, seq)
    engine = Engine(ParallelConfig(dp_shard=1), dev)  # single device: the engine applies AC/compile only
    training = TrainingConfig(compile=compile, precision=precision)
    model = engine.parallelize(build_model(cfg, dev, seed=0), training, None, 1)[0]
    data = synthetic_batch(cfg, batch, seq, dev)
    seconds = _time_steps(_train_step_fn(model, NextTokenObjective().loss_sum, data, precision, dev), steps, warmup,
                          dev)
    peak, peak_source = peak_flops(dev, precision)
    flops_per_token = model_flops_per_token(cfg, seq)
    tokens_per_s = batch * seq * steps / seconds
    result = {"flavor": flavor, "batch": batch, "seq": seq, "steps": steps, "compile": compile,
              "precision": precision, "device": str(dev), "num_threads": torch.get_num_threads(),
              "params": cfg.num_params(), "tokens_per_s": tokens_per_s, "step_time_s": seconds / steps,
              "flops_per_token": flops_per_token, "achieved_flops": tokens_per_s * flops_per_token,
              "matmul_peak_flops": peak, "peak_source": peak_source,
              "mfu": tokens_per_s * flops_per_token / peak}
    if compare_hf:
        hf_tps = _bench_hf(cfg, data, steps, warmup, compile, precision, dev)
        result.update(hf_tokens_per_s=hf_tps, ratio_to_hf=tokens_per_s / hf_tps)
    return result


def _bench_hf(cfg: ModelConfig, data: dict, steps: int, warmup: int, compile: bool, precision: str,
              dev: torch.device) -> float:
    """The same dimensions through transformers' LlamaForCausalLM, same optimizer and loss, same process."""
    from meshlm.errors import ConfigError

    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise ConfigError("--compare-hf needs the transformers package (pip install transformers)") from None
    hf_cfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_hidden_dim,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.resolved_head_dim,
                         max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                         rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
                         attention_bias=cfg.qkv_bias)
    hf_cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_cfg).to(dev)
    if compile:
        model.compile()  # whole model: compiling HF's layers one by one recompiles per layer index

    def loss_fn(m: nn.Module, batch: dict) -> torch.Tensor:
        logits = m(input_ids=batch["input_ids"]).logits
        return NextTokenObjective.loss_from_logits(logits, batch["labels"])

    batch, seq = data["input_ids"].shape
    seconds = _time_steps(_train_step_fn(model, loss_fn, data, precision, dev), steps, warmup, dev)
    return batch * seq * steps / seconds
