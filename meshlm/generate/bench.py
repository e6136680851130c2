"""``meshlm bench generate``: decoding speed of a checkpoint, and transformers' ``generate`` on the same weights.

The headline is end to end, as a user feels it: ``tokens_per_s`` (= ``end_to_end_tokens_per_s``) is B × N new
tokens over the whole call, prefill included. Every row gets exactly N new tokens (no eos: ``eos_ids`` is empty
for meshlm, HF's eos is unset and ``min_new_tokens = N``), greedy, from B prompts of P random ids (seeded). A timed run is the rollout sampler
(meshlm/generate/rollout.py) end to end: prefill, N samples, N − 1 decode steps. Time to first token is a run of
N = 1 (prefill + one sample); a decode step is (full − first) / (N − 1). Runs alternate between the contenders
(a, b, a, b, ...) so that a shared machine's load falls on both alike; figures are medians.

The fast path's packs are made before the timed runs, as a loaded model does (``FastForward.prepare``);
``pack_bytes`` is the memory they add to the model's weights and ``pack_build_s`` the time they took once. The
machine's 1-minute load average is recorded at the start and the end (this machine is shared).

The bandwidth bound: a decode step reads every weight once, so it cannot beat weight bytes ÷ the memory copy
rate measured here (read + write bytes of a 256 MiB ``copy_`` per second).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

from meshlm.errors import CheckpointError, ConfigError
from meshlm.generate.decode import FastForward, fast_forward
from meshlm.generate.int4 import Int4Matrix
from meshlm.generate.int8 import Int8Matrix
from meshlm.generate.packed import packed_weights
from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import rollout
from meshlm.generate.sampling import RowSampler
from meshlm.generate.speculative import SpeculativeStats, speculative_decode
from meshlm.interop.hf import hf_name
from meshlm.interop.hf_config import transformers_model

COPY_BYTES = 256 * 2**20


def copy_rate(device: torch.device, nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """Bytes moved per second (read + write) by the best of ``repeats`` copies of an ``nbytes`` fp32 tensor."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first copy also faults the pages in
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_prompts(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """(B, P) int64 ids drawn uniformly from [0, vocab) by a seeded generator."""
    return torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))


def meshlm_runner(model: nn.Module, prompts: torch.Tensor, fast: bool, device: torch.device, weights: str = "fp32",
                  speculative: SpeculativeStats | None = None) -> Callable[[int], torch.Tensor]:
    """new_tokens -> (B, N) greedy ids from meshlm's rollout sampler, or (``speculative``: batch 1) from
    prompt-lookup speculative decoding, its counts of the last run kept in ``speculative``."""
    rows = prompts.tolist()

    def run(new_tokens: int) -> torch.Tensor:
        if speculative is not None:
            counts, net = SpeculativeStats(), fast_forward(model) if fast else model
            with torch.inference_mode():
                cache = model.new_cache(1, len(rows[0]) + new_tokens, device=device)
                greedy = RowSampler(SamplingParams(temperature=0.0), model.cfg.vocab_size, device)
                ids = speculative_decode(net, cache, rows[0], new_tokens, set(), greedy, device=device, stats=counts)
            if new_tokens > 1:  # a full run's counts (a first-token run drafts nothing)
                vars(speculative).update(vars(counts))
            return torch.tensor([ids])
        cfg = SamplingParams(max_tokens=new_tokens, temperature=0.0)  # greedy, no stop ids
        return rollout(model, rows, cfg, device=device, fast=fast, weights=weights).response_ids

    return run


def hf_model_from(model: nn.Module) -> nn.Module:
    """transformers' model of the same architecture holding a copy of ``model``'s weights (eval mode)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("--compare-hf needs the transformers package (pip install transformers)") from None
    param = next(model.parameters())
    hf = transformers_model(model.cfg).to(device=param.device, dtype=param.dtype).eval()
    state = {hf_name(k, model.cfg.family): v for k, v in model.state_dict().items()
             if not (model.cfg.tie_embeddings and k == "output.weight")}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise CheckpointError(f"the checkpoint does not map onto transformers' model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    return hf


def hf_runner(hf: nn.Module, prompts: torch.Tensor, device: torch.device) -> Callable[[int], torch.Tensor]:
    """new_tokens -> (B, N) greedy ids from transformers' ``generate`` (no eos, exactly N tokens)."""
    from transformers import GenerationConfig

    ids = prompts.to(device)
    attention = torch.ones_like(ids)

    def run(new_tokens: int) -> torch.Tensor:
        cfg = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0, use_cache=True)
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=attention, generation_config=cfg)
        return out[:, ids.shape[1]:].cpu()

    return run


def _timed(run: Callable[[int], torch.Tensor], new_tokens: int, device: torch.device) -> tuple[float, torch.Tensor]:
    _sync(device)
    start = time.perf_counter()
    out = run(new_tokens)
    _sync(device)
    return time.perf_counter() - start, out


def time_runners(runners: list[Callable[[int], torch.Tensor]], new_tokens: int, repeats: int, warmup: int,
                 device: torch.device) -> list[dict[str, Any]]:
    """Median full-run and first-token times of each runner (alternating), and each one's last output."""
    for _ in range(warmup):
        for run in runners:
            run(new_tokens)
    full: list[list[float]] = [[] for _ in runners]
    first: list[list[float]] = [[] for _ in runners]
    outputs: list[torch.Tensor | None] = [None] * len(runners)
    for _ in range(repeats):
        for i, run in enumerate(runners):
            seconds, outputs[i] = _timed(run, new_tokens, device)
            full[i].append(seconds)
            first[i].append(_timed(run, 1, device)[0])
    return [{"full_s": statistics.median(f), "first_token_s": statistics.median(t), "ids": out}
            for f, t, out in zip(full, first, outputs)]


def decode_weight_bytes(model: nn.Module, weights: str = "fp32") -> int:
    """Bytes of weights a decode step reads: every parameter once in fp32 (a tied head counts once); with int8
    weights, each int8 matrix (a byte an entry and an fp32 scale a row), with int4 each int4 matrix (half a byte an
    entry, a bf16 scale and zero a group; an fp32 fallback matrix at 4 bytes an entry), and the fp32 norms (the
    embedding is only gathered)."""
    if weights == "fp32":
        return sum(p.numel() * p.element_size() for p in model.parameters())
    packed = packed_weights(model, 1, weights)  # the pack the timed runs use
    matrices = [packed.head] + [m for layer in packed.layers for m in (*layer.wqkv, layer.wo, *layer.w13, layer.w2)]
    norms = [packed.norm] + [n for layer in packed.layers for n in (layer.attention_norm, layer.ffn_norm)]
    return sum(_matrix_bytes(m) for m in matrices) + sum(4 * n.numel() for n in norms)


def _matrix_bytes(m) -> int:
    if isinstance(m, Int4Matrix):
        return m.nbytes()
    if isinstance(m, Int8Matrix):
        return m.shape[0] * m.shape[1] + 4 * m.shape[1]
    return 4 * m.shape[0] * m.shape[1]  # fp32 (int4's fallback for a shape its kernel lacks)


def _figures(timing: dict[str, Any], batch: int, new_tokens: int) -> dict[str, float]:
    full, first = timing["full_s"], timing["first_token_s"]
    step = (full - first) / (new_tokens - 1) if new_tokens > 1 else float("nan")
    if not step > 0:  # a few fast steps can drown in the noise of two medians: not measured, never negative
        step = float("nan")
    return {"tokens_per_s": batch * new_tokens / full, "end_to_end_tokens_per_s": batch * new_tokens / full,
            "time_to_first_token_s": first, "ms_per_step": 1e3 * step,
            "decode_tokens_per_s": batch / step if step > 0 else float("nan"), "total_s": full}


def prepare_packs(model: nn.Module, batch: int, fast: bool, weights: str) -> tuple[int, float]:
    """(bytes, seconds) of making the fast path's packs for ``batch`` rows now; (0, 0) on the plain forward."""
    forward = fast_forward(model, weights) if fast else None
    if not isinstance(forward, FastForward):
        return 0, 0.0
    start = time.perf_counter()
    extra = forward.prepare(batch)
    return extra, time.perf_counter() - start


def bench_generate(model: nn.Module, *, batch: int, prompt_len: int, new_tokens: int, repeats: int = 3,
                   warmup: int = 1, compare_hf: bool = False, fast: bool = True,
                   device: str | torch.device = "cpu", seed: int = 0, weights: str = "fp32",
                   speculative: str | None = None) -> dict[str, Any]:
    """The figures of the module docstring for ``model`` (a meshlm decoder on ``device``), and HF's beside them.
    ``speculative="ngram"``: batch 1 decoded by meshlm/generate/speculative.py (its draft counts reported)."""
    dev = torch.device(device)
    cfg = model.cfg
    if speculative is not None and (batch != 1 or weights != "fp32"):
        raise ConfigError("--speculative decodes one greedy fp32 sequence: use --batch 1 and --weights fp32")
    if prompt_len + new_tokens > cfg.max_seq_len:
        raise ConfigError(f"--prompt-len {prompt_len} + --new-tokens {new_tokens} exceed the model's context "
                          f"(model.max_seq_len = {cfg.max_seq_len}); lower one of them")
    prompts = synthetic_prompts(batch, prompt_len, cfg.vocab_size, seed)
    load_start = os.getloadavg()[0]
    pack_extra, pack_s = prepare_packs(model, batch, fast, weights)
    stats = SpeculativeStats() if speculative is not None else None
    runners = [meshlm_runner(model, prompts, fast, dev, weights, stats)]
    if compare_hf:
        runners.append(hf_runner(hf_model_from(model), prompts, dev))
    timings = time_runners(runners, new_tokens, repeats, warmup, dev)
    weight_bytes = decode_weight_bytes(model, weights)
    rate = copy_rate(dev)
    result: dict[str, Any] = {
        "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats, "fast": fast,
        "weights": weights,
        "device": str(dev), "num_threads": torch.get_num_threads(), "dtype": str(next(model.parameters()).dtype),
        "params": model.num_params(), "weight_bytes": weight_bytes, "copy_bytes_per_s": rate,
        "bandwidth_bound_ms_per_step": 1e3 * weight_bytes / rate, "pack_bytes": pack_extra, "pack_build_s": pack_s,
        "load_average_start": load_start, "load_average_end": os.getloadavg()[0], "speculative": speculative,
        **_figures(timings[0], batch, new_tokens)}
    if stats is not None:  # the counts of the last full run
        result.update(speculative_forwards=stats.forwards, speculative_drafted=stats.drafted,
                      speculative_accepted=stats.accepted)
    if compare_hf:
        hf = _figures(timings[1], batch, new_tokens)
        mine, theirs = timings[0]["ids"].cpu(), timings[1]["ids"]
        same = mine == theirs
        result.update({f"hf_{k}": v for k, v in hf.items()})
        result.update(ratio_to_hf=result["tokens_per_s"] / hf["tokens_per_s"],
                      ttft_to_hf=result["time_to_first_token_s"] / hf["time_to_first_token_s"],
                      hf_identical=bool(same.all()),
                      hf_identical_rows=int(same.all(dim=1).sum()))
    return result
