"""Activation memory: what autograd keeps from forward to backward, per rank.

Llama-style (meshlm's block). The constants come from counting the tensors autograd saves on the real block
(``torch.autograd.graph.saved_tensors_hooks``, unique storages, parameters excluded; sdpa on CPU is the
flash-style kernel, so nothing is O(s²)); docs/planner.md has the derivation. Per block, one micro-batch of
b sequences of s tokens, hidden h, q = heads·head_dim, kv = kv_heads·head_dim, f = ffn width, H heads, all
divided by the tensor-parallel degree t where the engine shards them:

  fp32                 4·[ 6·bsh + 2·bs + 2·bs·q + 2·bs·kv + 4·bs·f + b·H·s + 4·s·hd ]
    x, RMSNorm's normalised value and output, twice (attention and FFN halves): 6·bsh; RMSNorm's rsqrt: bs
    each; q and k after RoPE, v, the attention output: 2·bs·q + 2·bs·kv; sdpa's logsumexp: b·H·s; SwiGLU's
    w1 and w3 outputs, silu(w1·x) and the product: 4·bs·f; RoPE's full-width cos/sin tables for q and k
    (fp32 in every precision, shared by the batch): 4·s·hd.
  bf16/fp16 autocast   fp32 residual-stream tensors (x, normed, twice) 4·4·bsh, the low-precision copy of the
                       norm output made once per consuming linear (q, k, v; w1, w3): 5·2·bsh, the rest in 2
                       bytes, rsqrt and logsumexp in 4.
  under FSDP2 mixed precision (inputs and parameters cast to bf16 by FSDP): RMSNorm keeps its fp32 upcast of
                       the input (4·bsh) and the bf16 normalised value and output (2·2·bsh), twice; the linears
                       share one input.
  sequence parallel    the norm-region tensors (x, normed, rsqrt) are 1/t; the all-gathered norm output that
                       the column-parallel linears save is full size.
  selective AC         the block input + the outputs of every matmul (q, k, v, wo, w1, w3, w2) and of sdpa
                       (output, logsumexp): the policy saves them; everything else is recomputed.
  full AC              the block input only.

The last stage adds the final norm and what the head and loss save. Without tensor or pipeline parallelism (and
not in fp16) the head computes the loss itself (meshlm/models/head.py) and saves its two gradients: the head input's (b·s·h, in the
residual stream's dtype) and the head weight's (V·h, in the weight's dtype: fp32 masters, or FSDP2's gathered
dtype). Otherwise the head's input (bf16 copy under autocast) and the loss's: with loss parallelism the fp32
log-softmax of the vocabulary shard (4·b·s·V/t); else the chunked cross-entropy's logits in the compute dtype
(b·s·V each) and one fp32 log-sum-exp per row (4·bs). Every rank holds its batch (input ids and labels, int64).

GPT-style (planner only): Korthikanti et al. 2022 in 16-bit, s·b·h·34 per layer (with flash attention the
5·a·s/h term vanishes), TP t: sbh·(10 + 24/t), TP+SP: 34·sbh/t, full recompute 2·sbh; ×2 in fp32.
"""

from __future__ import annotations

from functools import lru_cache

from meshlm.planner.layout import Layout, Training
from meshlm.planner.model_spec import ModelSpec


def micro_batch(layout: Layout, training: Training) -> int:
    """Sequences per forward on a rank (one pipeline micro-batch, or one accumulation micro-step)."""
    local = training.global_batch // max(layout.dp, 1)
    if layout.pp > 1:
        return max(local // max(layout.microbatches, 1), 1)
    return layout.micro_batch_size or local


def residual_bytes(layout: Layout, training: Training) -> int:
    """Bytes per element of the residual stream (what pipeline stages exchange): fp32 unless FSDP's mixed
    precision casts the block inputs (autocast alone leaves the residual additions in fp32)."""
    return 2 if training.precision != "fp32" and layout.uses_fsdp else 4


def block_bytes(spec: ModelSpec, layout: Layout, training: Training, b: int) -> float:
    """One block's saved activations for one micro-batch on one rank."""
    s, h, t = training.seq_len, spec.dim, layout.tp
    sp = layout.sequence_parallel and t > 1
    bs = b * s
    if spec.arch == "gpt":
        return _gpt_block(bs * h, t, sp, layout.activation_checkpointing, training.compute_bytes)
    q, kv, f, heads = spec.q_size / t, spec.kv_size / t, spec.ffn_hidden_dim / t, spec.n_heads / t
    norm_div = t if sp else 1  # norm-region tensors are sharded along the sequence under SP
    low = training.precision != "fp32"
    fsdp_cast = low and layout.uses_fsdp
    x_bytes = 2 if fsdp_cast else 4  # the block input as stored (FSDP casts it; else the fp32 residual)
    ac = layout.activation_checkpointing
    if ac == "full":
        return bs * h * x_bytes / norm_div
    cb = training.compute_bytes
    if ac == "selective":  # the block input, matmul outputs (row-parallel ones before the reduction) and sdpa
        return (bs * h * x_bytes / norm_div + cb * bs * (2 * q + 2 * kv + 2 * f + 2 * h) + 4 * b * heads * s)
    # rsqrt (twice), logsumexp; RoPE's fp32 (cos, cos) and (−sin, sin) tables of (1, s, 1, hd), made for q and
    # for k in every block (shared by the batch, whole-sequence, and not split by tensor parallelism)
    small = 4 * (2 * bs / norm_div + b * heads * s) + 4 * 4 * s * spec.hd
    inner = cb * bs * (2 * q + 2 * kv + 4 * f)  # rotated q/k, v, attention output; SwiGLU
    if not low:
        norm_region = 4 * 4 * bs * h / norm_div  # x, normed (attention half); h, normed (FFN half)
        linear_inputs = 4 * 2 * bs * h  # the norm outputs (all-gathered under SP), shared by their linears
    elif fsdp_cast:
        norm_region = (2 * 4 + 2 * 2) * bs * h / norm_div  # fp32 upcast + bf16 normed, twice
        linear_inputs = 2 * 2 * bs * h
    else:  # autocast only: fp32 residual stream, one bf16 copy of the norm output per consuming linear
        norm_region = 4 * 4 * bs * h / norm_div
        linear_inputs = 5 * 2 * bs * h
    return norm_region + linear_inputs + inner + small


def _gpt_block(sbh: float, t: int, sp: bool, ac: str, cb: int) -> float:
    scale = cb / 2  # the published constants are for 16-bit activations
    if ac == "full":
        return 2 * sbh / (t if sp else 1) * scale
    if t == 1:
        return 34 * sbh * scale
    return (34 / t if sp else 10 + 24 / t) * sbh * scale


def fused_head(spec: ModelSpec, layout: Layout, training: Training) -> bool:
    """Whether the head computes the loss itself, without logits (meshlm/models/head.py): meshlm's decoder
    without tensor parallelism (whose logits stay vocabulary-sharded), without pipelining (whose last stage
    hands logits to the schedule's loss) and not in fp16 (whose loss scale must apply before fp16 rounding)."""
    return spec.arch != "gpt" and layout.tp == 1 and layout.pp == 1 and training.precision != "fp16"


def head_bytes(spec: ModelSpec, layout: Layout, training: Training, b: int) -> float:
    """Final norm + what the head and the loss save, one micro-batch (last stage)."""
    s, h, t = training.seq_len, spec.dim, layout.tp
    if fused_head(spec, layout, training):
        bs = b * s
        if training.precision == "fp32":
            norm, grad_h, grad_w = 4 * (2 * bs * h + bs), 4 * bs * h, 4 * spec.vocab_size * h
        elif layout.uses_fsdp:  # bf16 residual stream and gathered weight; the norm's fp32 upcast
            cb = training.compute_bytes
            norm, grad_h, grad_w = (4 + cb) * bs * h + 4 * bs, cb * bs * h, cb * spec.vocab_size * h
        else:  # autocast: fp32 residual stream and master weight
            norm, grad_h, grad_w = 4 * (2 * bs * h + bs), 4 * bs * h, 4 * spec.vocab_size * h
        return norm + grad_h + grad_w
    sp = layout.sequence_parallel and t > 1
    bs = b * s
    loss_parallel = t > 1 and layout.loss_parallel
    vocab = spec.vocab_size / t if loss_parallel else spec.vocab_size
    # Loss parallelism: torch's cross-entropy on the vocabulary shards saves the fp32 log-softmax of the
    # upcast logits. Otherwise meshlm's chunked cross-entropy saves the logits themselves, in the dtype the head
    # produced them (bf16/fp16 under autocast or FSDP's mixed precision), and one fp32 log-sum-exp per row.
    loss_saved = 4 * bs * vocab if loss_parallel else training.compute_bytes * bs * vocab
    if spec.arch == "gpt":  # Megatron's fp32 cross-entropy keeps the fp32 log-softmax
        return 4 * bs * vocab + 4 * bs * h * training.compute_bytes / 2
    norm_div = t if sp else 1
    if training.precision == "fp32":
        norm = 4 * (2 * bs * h / norm_div + bs / norm_div) + 4 * bs * h  # x, normed, rsqrt; head input
    elif layout.uses_fsdp:
        norm = (4 + 2) * bs * h / norm_div + 4 * bs / norm_div + 2 * bs * h
    else:
        norm = 4 * (2 * bs * h / norm_div + bs / norm_div) + 2 * bs * h
    lse = 0.0 if loss_parallel else 4 * bs  # the chunked cross-entropy's row log-sum-exps (models/head.py ChunkedCrossEntropy)
    return norm + loss_saved + lse


def stage_bytes(spec: ModelSpec, layout: Layout, training: Training, stage: int, layers: int, b: int) -> float:
    """One micro-batch of one pipeline stage."""
    total = layers * block_bytes(spec, layout, training, b)
    last = stage == layout.num_stages - 1
    if last:
        total += head_bytes(spec, layout, training, b)
    if layout.pp > 1:
        rb = residual_bytes(layout, training)
        if not last:  # the stage output, held by the schedule until its gradient arrives
            total += b * training.seq_len * spec.dim * rb
        if stage > 0 and not (layout.sequence_parallel and layout.tp > 1) and not layout.uses_fsdp:
            # the first block's input is the pipeline's receive buffer (allocated once, counted as a buffer);
            # FSDP's root pre-forward and sequence parallelism's re-sharding copy it
            total -= b * training.seq_len * spec.dim * rb
    return total


def schedule_events(layout: Layout, pp_rank: int) -> list[tuple[str, int]]:
    """This rank's forward ("F") and backward ("B") passes in order, by local stage, as torch's schedules run
    them: GPipe all forwards first; 1F1B p − rank forwards of warm-up, then one backward, one forward;
    interleaved (v local stages) a warm-up of (v − 1)·(micro-batches per round) + k·(p − 1 − rank) forwards
    (k = 2 for interleaved 1F1B, 1 for the zero-bubble ones), then one forward, one backward. ZBV is modelled as
    interleaved zero-bubble with its two V-placed stages."""
    m, p, v = layout.microbatches, layout.pp, len_local(layout)
    if layout.pp_schedule == "gpipe":
        return [("F", 0)] * m + [("B", 0)] * m
    if layout.pp_schedule == "1f1b":
        warmup = min(m, p - pp_rank)
        events = [("F", 0)] * warmup
        for k in range(m):
            events.append(("B", 0))
            if warmup + k < m:
                events.append(("F", 0))
        return events
    rounds = max(1, m // p)
    per_round = m // rounds
    factor = 2 if layout.pp_schedule == "interleaved-1f1b" else 1
    total = m * v
    warmup = min((v - 1) * per_round + factor * (p - 1 - pp_rank), total)
    events = [("F", (i // per_round) % v) for i in range(warmup)]
    for k in range(total):
        if warmup + k < total:
            i = warmup + k
            events.append(("F", (i // per_round) % v))
        events.append(("B", v - 1 - (k // per_round) % v))
    return events


@lru_cache(maxsize=4096)
def held_counts(schedule: str, m: int, p: int, v: int, pp_rank: int) -> tuple[tuple[int, ...], ...]:
    """At each backward start: forwards in flight per local stage, reduced to the combinations no other one
    dominates (the peak is one of them)."""
    layout = Layout(pp=p, pp_schedule=schedule, stages_per_rank=v, microbatches=m)
    inflight = [0] * v
    points = set()
    for kind, j in schedule_events(layout, pp_rank):
        if kind == "F":
            inflight[j] += 1
        else:
            points.add(tuple(inflight))
            inflight[j] -= 1
    frontier: list[tuple[int, ...]] = []
    for point in sorted(points, key=lambda q: -sum(q)):  # a dominator sorts before what it dominates
        if not any(all(x <= y for x, y in zip(point, kept)) for kept in frontier):
            frontier.append(point)
    return tuple(frontier)


def len_local(layout: Layout) -> int:
    return 2 if layout.pp_schedule == "zbv" else layout.stages_per_rank


def logits_bytes(spec: ModelSpec, layout: Layout, training: Training, b: int) -> float:
    """One micro-batch's logits (vocabulary-sharded under loss parallelism), in the compute dtype."""
    vocab = spec.vocab_size / layout.tp if layout.tp > 1 and layout.loss_parallel else spec.vocab_size
    return b * training.seq_len * vocab * training.compute_bytes


def rank_activation_bytes(spec: ModelSpec, layout: Layout, training: Training, pp_rank: int,
                          stages) -> tuple[float, dict[str, float]]:
    """Peak activations of a rank over a step: what its forwards hold at the start of each backward, plus its
    batch. On the last pipeline stage the schedule keeps each in-flight micro-batch's output — its logits —
    until its backward (finished ones are freed: the engine runs the schedule with return_outputs=False). The
    chunked cross-entropy saves that very tensor (one storage, already in :func:`head_bytes`); only under loss
    parallelism, whose cross-entropy saves a log-softmax instead, are the held logits a tensor of their own."""
    b = micro_batch(layout, training)
    local = training.global_batch // max(layout.dp, 1)
    batch = 2 * 8 * local * training.seq_len  # input ids + labels, int64
    per_stage = [stage_bytes(spec, layout, training, st.index, st.layers, b) for st in stages]
    if layout.pp == 1:
        held, flights = per_stage[0], 1
    else:
        loss_parallel = layout.tp > 1 and layout.loss_parallel
        logits = logits_bytes(spec, layout, training, b) if loss_parallel or spec.arch == "gpt" else 0.0
        last = [st.index == layout.num_stages - 1 for st in stages]
        held, flights = 0.0, 0
        for counts in held_counts(layout.pp_schedule, layout.microbatches, layout.pp, len_local(layout), pp_rank):
            now = sum(c * (a + (logits if is_last else 0.0)) for c, a, is_last in zip(counts, per_stage, last))
            if now > held:
                held, flights = now, sum(counts)
    return held + batch, {"activations:per_microbatch": sum(per_stage) / len(per_stage),
                          "activations:in_flight": float(flights), "activations:batch": float(batch)}
