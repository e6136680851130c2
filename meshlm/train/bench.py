"""Training throughput benchmark on synthetic tokens: the trainer's compute path without data loading."""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.config.schema import OptimizerConfig, ParallelConfig, TrainingConfig
from meshlm.distributed.engine import Engine
from meshlm.errors import ConfigError
from meshlm.generate.bench import hf_model_from
from meshlm.models import build_model, flavor_config
from meshlm.models.config import ModelConfig
from meshlm.models.lora import HF_TARGETS, TARGETS, apply_lora, lora_modules, reset_lora_parameters
from meshlm.objectives import NextTokenObjective
from meshlm.train.flops import model_flops_per_token, peak_flops
from meshlm.train.optim import build_optimizer
from meshlm.train.precision import autocast

ALL_LORA_TARGETS = tuple(TARGETS)  # the seven projections of a block


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_times(steps: list[Callable[[], None]], timed: int, warmup: int, device: torch.device,
                clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Seconds per step of each step function, run in turn (a, b, a, b, ...) so that a shared machine's load
    falls on all of them alike; returns one list of ``timed`` durations per function. ``clock``: wall time, or
    the thread's CPU time (``time.thread_time``, meaningful with one thread), which other processes disturb
    far less."""
    for _ in range(warmup):
        for step in steps:
            step()
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(timed):
        for step, out in zip(steps, times):
            _sync(device)
            start = clock()
            step()
            _sync(device)
            out.append(clock() - start)
    return times


def _train_step_fn(model: nn.Module, loss_fn: Callable[[nn.Module, dict], torch.Tensor], batch: dict,
                   precision: str, device: torch.device) -> Callable[[], None]:
    optimizer = build_optimizer(model, OptimizerConfig())
    num_tokens = batch["labels"].numel()
    trainable = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        with autocast(precision, device.type):
            loss = loss_fn(model, batch) / num_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step.trainable_params = sum(p.numel() for p in trainable)  # type: ignore[attr-defined]
    return step


def synthetic_batch(cfg: ModelConfig, batch: int, seq: int, device: torch.device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
    return {"input_ids": tokens[:, :-1].to(device), "labels": tokens[:, 1:].to(device)}


def bench_train(flavor: str, batch: int, seq: int, steps: int, *, warmup: int = 2, compile: bool = False,
                precision: str = "fp32", device: str = "cpu", compare_hf: bool = False,
                cpu_time: bool = False, fused_head: bool = True, checkpoint: str | None = None,
                lora_rank: int = 0, lora_targets: tuple[str, ...] = ALL_LORA_TARGETS, lora_alpha: float = 16.0,
                compare_full: bool = False) -> dict[str, Any]:
    """tokens/s of meshlm's training step from the median step time; with ``compare_hf``, transformers' model (and
    PEFT's LoRA with ``lora_rank``) on the same weights stepped alternately with it in this process, and the
    ratio of the medians. ``checkpoint``: a converted or trained run instead of a flavour's random weights.
    ``lora_rank`` > 0: LoRA on ``lora_targets`` (the base frozen); ``compare_full`` also times the full fine-tune
    step of the same model. ``cpu_time``: time steps by the thread's CPU time instead of wall time (CPU, one
    thread only). ``fused_head=False``: meshlm takes the loss from logits (the path TP and PP use) instead of its
    fused head, to measure what the head buys."""
    dev = torch.device(device)
    if cpu_time and (dev.type != "cpu" or torch.get_num_threads() != 1):
        raise ConfigError("CPU-time timing needs --device cpu and --threads 1 (other threads' work is not counted)")
    base = _base_model(flavor, checkpoint, seq, dev)
    cfg = base.cfg
    data = synthetic_batch(cfg, batch, seq, dev)
    lora = (lora_rank, tuple(lora_targets), lora_alpha) if lora_rank > 0 else None
    contenders = {"meshlm": lambda: _meshlm_step(base, data, compile, precision, dev, fused_head, lora)}
    if compare_hf:
        contenders["hf"] = lambda: _hf_step(base, data, compile, precision, dev, lora)
    if compare_full and lora:
        contenders["full"] = lambda: _meshlm_step(base, data, compile, precision, dev, fused_head, None)
    names = list(contenders)
    step_fns = [contenders[name]() for name in names]
    times = _step_times(step_fns, steps, warmup, dev, time.thread_time if cpu_time else time.perf_counter)
    seconds = {name: statistics.median(t) for name, t in zip(names, times)}
    peak, peak_source = peak_flops(dev, precision)
    flops_per_token = model_flops_per_token(cfg, seq)
    tokens_per_s = batch * seq / seconds["meshlm"]
    result = {"flavor": flavor if checkpoint is None else cfg.flavor, "checkpoint": checkpoint, "batch": batch,
              "seq": seq, "steps": steps, "compile": compile, "cpu_time": cpu_time, "fused_head": fused_head,
              "precision": precision, "device": str(dev), "num_threads": torch.get_num_threads(),
              "params": cfg.num_params(), "lora_rank": lora_rank, "lora_targets": list(lora_targets) if lora else [],
              "trainable_params": _trainable(step_fns[0]), "tokens_per_s": tokens_per_s,
              "step_time_s": seconds["meshlm"], "flops_per_token": flops_per_token,
              "achieved_flops": tokens_per_s * flops_per_token, "matmul_peak_flops": peak, "peak_source": peak_source,
              "mfu": tokens_per_s * flops_per_token / peak}
    if "hf" in seconds:
        result.update(hf_tokens_per_s=batch * seq / seconds["hf"], ratio_to_hf=seconds["hf"] / seconds["meshlm"],
                      hf_step_time_s=seconds["hf"], hf_peft=lora is not None)
    if "full" in seconds:
        result.update(full_step_time_s=seconds["full"], lora_to_full_step=seconds["meshlm"] / seconds["full"])
    return result


def _base_model(flavor: str, checkpoint: str | None, seq: int, dev: torch.device) -> nn.Module:
    """The weights every contender copies: a checkpoint's, or the flavour's from seed 0."""
    if checkpoint is None:
        cfg = flavor_config(flavor)
        cfg.max_seq_len = max(cfg.max_seq_len, seq)
        return build_model(cfg, dev, seed=0)

    model = model_from_checkpoint(checkpoint, dev)[0]
    if lora_modules(model):
        raise ConfigError(f"{checkpoint} is a LoRA run (base + adapters); bench its base checkpoint instead")
    if seq > model.cfg.max_seq_len:
        raise ConfigError(f"--seq {seq} exceeds the checkpoint's model.max_seq_len = {model.cfg.max_seq_len}")
    return model


def _trainable(step: Callable[[], None]) -> int:
    return step.trainable_params  # type: ignore[attr-defined]


def _meshlm_step(base: nn.Module, data: dict, compile: bool, precision: str, dev: torch.device,
                 fused_head: bool = True, lora: tuple[int, tuple[str, ...], float] | None = None
                 ) -> Callable[[], None]:
    model = copy.deepcopy(base).train()
    if lora is not None:
        rank, targets, alpha = lora
        apply_lora(model, list(targets), rank, alpha, dropout=0.0)
        reset_lora_parameters(model, seed=0)
    engine = Engine(ParallelConfig(dp_shard=1), dev)  # single device: the engine applies AC/compile only
    training = TrainingConfig(compile=compile, precision=precision)
    model = engine.parallelize(model, training, None, 1)[0]
    model.output.fused = fused_head
    return _train_step_fn(model, NextTokenObjective().loss_sum, data, precision, dev)


def _hf_step(base: nn.Module, data: dict, compile: bool, precision: str, dev: torch.device,
             lora: tuple[int, tuple[str, ...], float] | None = None) -> Callable[[], None]:
    """The same architecture and weights in transformers (LlamaForCausalLM for the Llama flavours; PEFT's LoRA on
    the same targets with ``lora``), the same optimizer, HF's own loss path, same process."""
    model = hf_model_from(base).train()
    if lora is not None:
        model = _peft(model, *lora)
    if compile:
        model.compile()  # whole model: compiling HF's layers one by one recompiles per layer index

    def loss_fn(m: nn.Module, batch: dict) -> torch.Tensor:
        # HF's own default: the model computes its loss from labels (ForCausalLMLoss: fp32 logits, then
        # F.cross_entropy). The labels are already shifted (shift_labels), and num_items_in_batch makes it a sum
        # over the batch's tokens divided by their count; times that count, it is meshlm's summed loss.
        labels = batch["labels"].contiguous()  # HF views them flat
        count = torch.tensor(labels.numel(), device=labels.device)
        return m(input_ids=batch["input_ids"], labels=labels, shift_labels=labels, num_items_in_batch=count).loss * count

    return _train_step_fn(model, loss_fn, data, precision, dev)


def _peft(model: nn.Module, rank: int, targets: tuple[str, ...], alpha: float) -> nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError("--compare-hf with --lora-rank needs the peft package (pip install peft)") from None
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                        target_modules=[HF_TARGETS[t] for t in targets])
    return get_peft_model(model, config)


def profile_train_step(flavor: str, batch: int, seq: int, steps: int = 3, *, compile: bool = False,
                       precision: str = "fp32", device: str = "cpu", row_limit: int = 15) -> str:
    """torch.profiler's table of the ops that take meshlm's training step's time (self time, top ``row_limit``),
    over ``steps`` steps after two warm-up steps: the evidence behind each optimisation in docs/benchmarks.md."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    base = _base_model(flavor, None, seq, dev)
    step = _meshlm_step(base, synthetic_batch(base.cfg, batch, seq, dev), compile, precision, dev)
    for _ in range(2):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    sort_by = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)
