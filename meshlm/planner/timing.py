"""Step time of a layout: compute at an efficiency factor, every collective with ring costs, the pipeline bubble.

Assumptions (docs/planner.md):
- compute: FLOPs of the matmuls (blocks, attention scores and values over the full sequence, LM head), forward
  + 2× for backward, + one more forward of the blocks under full activation checkpointing (selective
  recomputes element-wise ops only: no matmul FLOPs). Time = FLOPs / (peak · efficiency) + (matmul kernels
  run) · ``hw.matmul_overhead_us``: a fixed cost per matmul kernel (launch, the last partial wave of tiles,
  the ramp of a kernel's start and end), so that a large GEMM runs closer to peak than a small one — at an
  overhead t₀, a GEMM of F FLOPs runs at F / (F + t₀·peak·efficiency) of the efficiency's rate. MFU counts the
  model's FLOPs without recompute; HFU counts what the hardware ran.
- collectives: α-β ring model, nccl-tests convention: all-reduce 2(n−1)/n·S/B + 2(n−1)·α, all-gather and
  reduce-scatter (n−1)/n·S/B + (n−1)·α. A group inside one node uses the intra-node bandwidth; a group that
  spans nodes gets the node's NIC bandwidth shared by the groups that cross at the same time
  (B = inter · ranks-of-this-group-per-node / GPUs-per-node), never more than intra-node. Mesh order is
  (pp, dp_replicate, dp_shard, tp): tp is innermost (consecutive ranks, inside a node), pp outermost.
- overlap: tensor-parallel collectives and pipeline sends are on the critical path (exposed). FSDP/DDP
  collectives overlap the compute of other blocks: what exceeds the step's compute is exposed, plus one
  block's all-gather (nothing to hide the first behind) and one reduce-scatter (the last).
- pipeline bubble, as a fraction of the busy time: GPipe and 1F1B (p−1)/m; interleaved (p−1)/(v·m);
  interleaved zero-bubble (p−1)/(3·v·m) (backward split into input and weight gradients fills two thirds of
  the bubble, Qi et al. 2024, ZB-H1); ZBV (p−1)/(6·m) (a lower bound).
- element-wise kernels (norms, residual adds, activation functions, RoPE, softmax) are bound by memory
  bandwidth, not FLOPs: their bytes per token per layer, counted from the block's forward ops (below), are
  read and written once in forward, twice in backward, once more under (selective or full) recompute, at the
  HBM bandwidth.
  Without sequence parallelism the norm/residual part is replicated on every tensor-parallel rank.
- the optimizer step is not modelled (memory-bound, small at these batch sizes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from meshlm.models import counts
from meshlm.models.families import family_spec
from meshlm.planner.activations import micro_batch
from meshlm.planner.collectives import Collective, step_collectives, steps_per_optimizer_step
from meshlm.planner.hardware import Hardware
from meshlm.planner.layout import Layout, Training
from meshlm.planner.memory import _layer_ranges, rank_stages
from meshlm.planner.model_spec import ModelSpec

INNER_ORDER = ("tp", "dp_shard", "dp_replicate", "pp")


@dataclass
class StepTime:
    step_time_s: float
    compute_s: float
    tp_comm_s: float
    p2p_s: float
    dp_comm_s: float
    dp_exposed_s: float
    small_s: float
    bubble_s: float
    model_flops: float  # per step, whole job, no recompute
    hardware_flops: float  # per step, whole job, with recompute
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def comm_s(self) -> float:
        return self.tp_comm_s + self.p2p_s + self.dp_comm_s + self.small_s

    @property
    def exposed_comm_s(self) -> float:
        return self.tp_comm_s + self.p2p_s + self.dp_exposed_s + self.small_s


def group_link(layout: Layout, hw: Hardware, dim: str) -> tuple[int, float, float]:
    """(ranks in the group, bandwidth B/s, latency s) of a mesh dim's groups."""
    return _group_link(layout.tp, layout.dp_shard, layout.dp_replicate, layout.pp, hw, dim)


@lru_cache(maxsize=4096)
def _group_link(tp: int, dp_shard: int, dp_replicate: int, pp: int, hw: Hardware, dim: str) -> tuple[int, float, float]:
    sizes = {"tp": tp, "dp_shard": dp_shard, "dp_replicate": dp_replicate, "pp": pp}
    if dim == "dp":
        size, inner = dp_shard * dp_replicate, tp
    else:
        size = sizes[dim]
        inner = 1
        for d in INNER_ORDER[:INNER_ORDER.index(dim)]:
            inner *= sizes[d]
    per_node_gpus = hw.gpus_per_node
    intra = (hw.intra_node_gbs * 1e9, hw.intra_latency_us * 1e-6)
    if inner * size <= per_node_gpus:
        return size, *intra
    members_per_node = max(1, min(size, per_node_gpus // inner)) if inner < per_node_gpus else 1
    bw = min(hw.intra_node_gbs, hw.inter_node_gbs * members_per_node / per_node_gpus) * 1e9
    return size, bw, hw.inter_latency_us * 1e-6


def collective_time(c: Collective, layout: Layout, hw: Hardware) -> float:
    n, bw, lat = group_link(layout, hw, c.dim)
    if c.kind in ("send", "recv"):
        return 0.0 if c.kind == "recv" else c.calls * (c.payload / bw + lat)  # a recv is the peer's send
    if n <= 1:
        return 0.0
    steps = 2 * (n - 1) if c.kind == "all_reduce" else n - 1
    factor = steps / n
    return c.calls * (c.payload * factor / bw + steps * lat)


def elementwise_bytes(spec: ModelSpec, layout: Layout, training: Training) -> float:
    """Bytes read + written by the forward element-wise ops of one block, per token, on one rank.

    GPT (Megatron's fused kernels): 2 LayerNorms (2h each) and 2 bias-dropout-residual adds (4h each): 12h
    replicated; bias-GeLU 2·ffn, q/k/v/out reshapes 8h: per rank /t; scale-mask-softmax + dropout over the
    materialised scores 4.5·a·s /t (none with flash attention).
    Llama (meshlm, eager PyTorch): 2 RMSNorms (fp32 upcast, square, mean, rsqrt, 2 multiplies ≈ 6h each) and 2
    residual adds (3h each): 18h replicated; RoPE on q and k (≈ 6 per element), SiLU and the gate product
    (5·ffn): per rank /t.
    """
    t = layout.tp
    sp = layout.sequence_parallel and t > 1
    h, f, q, kv = spec.dim, spec.ffn_hidden_dim, spec.q_size, spec.kv_size
    if spec.arch == "gpt":
        replicated, partitioned = 12 * h, 2 * f + 8 * q
    else:
        replicated, partitioned = 18 * h, 5 * f + 6 * (q + kv)
    scores = 0.0 if spec.flash_attention else 4.5 * spec.n_heads * training.seq_len
    return training.compute_bytes * (replicated / (t if sp else 1) + (partitioned + scores) / t)


def lora_adapter_params(spec: ModelSpec, training: Training) -> int:
    """Adapter weights of one block (A: r x in, B: out x r per target); 0 without LoRA."""
    if not training.lora_rank:
        return 0
    shapes, family = spec.shapes(), family_spec(spec.family)
    return sum(training.lora_rank * sum(family.linear(t).shape(shapes)) for t in training.lora_targets)


def _weight_passes(training: Training) -> int:
    """Matmuls per base weight in a trained pass: forward, input gradient and (unless LoRA freezes it) weight
    gradient."""
    return 2 if training.lora_rank else 3


def rank_matmuls(spec: ModelSpec, layout: Layout, training: Training, pp_rank: int) -> int:
    """Matmul kernels one rank runs in a step: per micro-batch and layer the block's weight matmuls (forward and
    input gradient, and the weight gradient unless LoRA freezes them), attention's two (scores, values) three
    times, each LoRA target's two adapter matmuls three times, one more forward of the weights and attention
    under full recompute and per frozen forward (a DPO reference); the head's on the last stage."""
    weights = sum(1 for x in spec.block_tensors() if x.matmul)
    passes = _weight_passes(training)
    extra = (1 if layout.activation_checkpointing == "full" else 0) + training.frozen_forwards
    per_layer = weights * passes + 2 * 3 + 2 * 3 * len(training.lora_targets if training.lora_rank else ()) \
        + (weights + 2) * extra
    count = 0
    for st in rank_stages(spec, layout, pp_rank):
        last = st.index == layout.num_stages - 1
        count += st.layers * per_layer + ((passes + training.frozen_forwards) if last else 0)
    return count * steps_per_optimizer_step(layout, training) * training.sequences_per_row


def rank_flops(spec: ModelSpec, layout: Layout, training: Training, pp_rank: int) -> tuple[float, float]:
    """(hardware FLOPs, model FLOPs) of one rank's step (its share of the tensor-parallel work).

    Per token and layer: 2 FLOPs per weight forward, as many for the input gradient, as many again for the weight
    gradient of weights that train (all of them, or none of the base under LoRA, whose adapters train: 6 per
    adapter weight); attention's scores and values (meshlm/models/counts.py: 4·q_size per attended key, the
    layer's window or the sequence) forward, three times that trained. A frozen forward (a DPO reference) adds
    one forward per sequence; full recompute one more forward of the blocks (hardware FLOPs only)."""
    s, t = training.seq_len, layout.tp
    tokens = micro_batch(layout, training) * s * steps_per_optimizer_step(layout, training) * training.sequences_per_row
    block_weights = 2 * counts.block_matmul_params(spec.count_shape()) / t  # forward, per token
    adapters = 2 * lora_adapter_params(spec, training) / t
    head = 2 * counts.head_matmul_params(spec.count_shape()) / t
    passes = _weight_passes(training)
    model = hw = 0.0
    for st in rank_stages(spec, layout, pp_rank):
        last = st.index == layout.num_stages - 1
        attention = _stage_attention(spec, layout, st.index, s) / t  # forward, per token, the stage's layers
        trained = st.layers * (passes * block_weights + 3 * adapters) + 3 * attention + (passes * head if last else 0)
        frozen = training.frozen_forwards * (st.layers * block_weights + attention + (head if last else 0))
        model += (trained + frozen) * tokens
        hw += (trained + frozen) * tokens
        if layout.activation_checkpointing == "full":
            hw += (st.layers * (block_weights + adapters) + attention) * tokens
    return hw, model


def _stage_attention(spec: ModelSpec, layout: Layout, stage: int, seq_len: int) -> float:
    """Attention's forward FLOPs per token over the layers of pipeline stage ``stage``."""
    sizes = _layer_ranges(spec.n_layers, layout.num_stages)
    start = sum(sizes[:stage])
    return counts.attention_flops_per_token(spec.count_shape(), seq_len, range(start, start + sizes[stage]))


def model_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token, forward + backward, no recompute (meshlm/models/counts.py)."""
    return counts.model_flops_per_token(spec.count_shape(), seq_len)


def bubble_fraction(layout: Layout) -> float:
    if layout.pp == 1:
        return 0.0
    p, m = layout.pp, layout.microbatches
    v = layout.stages_per_rank
    return {"gpipe": (p - 1) / m, "1f1b": (p - 1) / m, "interleaved-1f1b": (p - 1) / (v * m),
            "interleaved-zb": (p - 1) / (3 * v * m), "zbv": (p - 1) / (6 * m)}[layout.pp_schedule]


def step_time(spec: ModelSpec, layout: Layout, training: Training, hw: Hardware) -> StepTime:
    peak = hw.peak(training.precision) * training.efficiency
    ranks = sorted({0, layout.pp - 1})  # the first stage (embedding) and the last (head) bound the pipeline
    worst = None
    for r in ranks:
        hw_flops, _ = rank_flops(spec, layout, training, r)
        colls = step_collectives(spec, layout, training, r)
        times = {"tp": 0.0, "p2p": 0.0, "dp": 0.0, "small": 0.0}
        for c in colls:
            times[c.role] += collective_time(c, layout, hw)
        compute = hw_flops / peak + _elementwise_time(spec, layout, training, hw, r) \
            + _optimizer_time(spec, layout, training, hw, r)
        if hw.matmul_overhead_us:
            compute += rank_matmuls(spec, layout, training, r) * hw.matmul_overhead_us * 1e-6
        busy = compute + times["tp"] + times["p2p"]
        if worst is None or busy > worst[0]:
            worst = (busy, compute, times, colls)
    busy, compute, times, colls = worst
    dp_exposed = max(0.0, times["dp"] - compute) + _unhidden_dp(colls, layout, hw)
    bubble = bubble_fraction(layout) * busy
    total = busy + bubble + dp_exposed + times["small"]
    if training.lora_rank or training.frozen_forwards:  # what the step computes, over every rank
        model_flops = sum(rank_flops(spec, layout, training, r)[1] for r in range(layout.pp)) * layout.tp * layout.dp
    else:
        model_flops = model_flops_per_token(spec, training.seq_len) * training.tokens
    hw_flops_job = model_flops * (1 + _recompute_share(spec, training, layout))
    return StepTime(total, compute, times["tp"], times["p2p"], times["dp"], dp_exposed, times["small"], bubble,
                    model_flops, hw_flops_job)


def _elementwise_time(spec: ModelSpec, layout: Layout, training: Training, hw: Hardware, pp_rank: int) -> float:
    tokens = micro_batch(layout, training) * training.seq_len * steps_per_optimizer_step(layout, training)
    layers = sum(st.layers for st in rank_stages(spec, layout, pp_rank))
    passes = 3 + (1 if layout.activation_checkpointing != "none" else 0)  # selective recomputes these too
    passes += training.frozen_forwards
    tokens *= training.sequences_per_row
    return passes * layers * tokens * elementwise_bytes(spec, layout, training) / (hw.hbm_gbs * 1e9)


def _optimizer_time(spec: ModelSpec, layout: Layout, training: Training, hw: Hardware, pp_rank: int) -> float:
    """The optimizer's update of the rank's trainable parameters (its shard under FSDP; only the adapters under
    LoRA), a stream at the memory bandwidth: AdamW reads the fp32 value, gradient and two moments and writes the
    value and moments back (28 bytes a parameter), SGD with momentum 16."""
    stages = rank_stages(spec, layout, pp_rank)
    if training.lora_rank:
        shards = layout.dp_shard if layout.uses_fsdp else 1
        local = sum(st.layers for st in stages) * lora_adapter_params(spec, training) / (layout.tp * shards)
    else:
        local = sum(st.total.local for st in stages)  # FSDP (ZeRO-2/3): already this rank's shard
        if layout.sharding == "zero1":  # optimizer state sharded, parameters replicated: each rank updates 1/dp
            local /= max(layout.dp, 1)
    per_param = 28 if training.optimizer == "adamw" else 16
    return local * per_param / (hw.hbm_gbs * 1e9)


def _recompute_share(spec: ModelSpec, training: Training, layout: Layout) -> float:
    if layout.activation_checkpointing != "full":
        return 0.0
    s, shape = training.seq_len, spec.count_shape()
    blocks_fwd = 2 * spec.n_layers * counts.block_matmul_params(shape) + counts.attention_flops_per_token(shape, s)
    return blocks_fwd / model_flops_per_token(spec, s)


def _unhidden_dp(colls: list[Collective], layout: Layout, hw: Hardware) -> float:
    """The first all-gather and the last reduce-scatter (FSDP) or the last bucket (DDP) wait for nothing."""
    out = 0.0
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        dp = [c for c in colls if c.role == "dp" and c.kind == kind]
        if not dp:
            continue
        biggest = max(dp, key=lambda c: c.payload)
        one = Collective(biggest.kind, biggest.dim, min(biggest.payload, 25e6 if layout.uses_ddp else
                                                        biggest.payload), 1, "dp")
        out += collective_time(one, layout, hw)
    return out
