"""Memory per device: parameters, gradients, optimizer state, activations and buffers.

Two accountings:
- ``engine`` (default): what meshlm allocates. Parameters are fp32 master weights (FSDP2: the rank's shard),
  gradients fp32 (FSDP2 reduces in fp32), AdamW keeps two fp32 moments plus a 4-byte step per tensor. Counts are
  exact per rank: tensor parallelism and FSDP2 split a dimension like ``torch.chunk`` (the first ranks take the
  rounded-up share), which is what each rank's local tensors hold.
- ``zero``: the ZeRO paper's mixed-precision Adam, 2 + 2 + 12 bytes per parameter, sharded over the
  data-parallel ranks by stage (ZeRO-1 optimizer state, ZeRO-2 + gradients, ZeRO-3 + parameters).

Activations follow :mod:`meshlm.planner.activations` (constants derived from what autograd saves for our
block); buffers are FSDP's gathered parameters and reduce-scatter input, DDP's gradient buckets, autocast's
weight copies, the pipeline's receive buffers and the backward's transient peak (the loss backward's logits
gradient and chunk temporaries, or a block's first backward op, whichever is larger).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache

from meshlm.planner import activations as act
from meshlm.planner.layout import Layout, Training
from meshlm.planner.model_spec import ModelSpec, Tensor

GIB = 2**30
KEYS = ("params", "grads", "optimizer", "activations", "buffers")


@dataclass
class Memory:
    """Bytes per device."""

    params: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    buffers: float = 0.0
    detail: dict[str, float] = field(default_factory=dict)  # buffers and activations by source

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def gib(self) -> dict[str, float]:
        out = {k: getattr(self, k) / GIB for k in KEYS}
        out["total"] = self.total / GIB
        return out


def chunk(n: int, parts: int, index: int) -> int:
    """Size of ``torch.chunk(n, parts)[index]`` (0 past the end), as DTensor and FSDP2 split a dimension."""
    size = -(-n // parts)
    return max(0, min(size, n - index * size))


def local_shape(t: Tensor, tp: int, tp_rank: int) -> list[int]:
    shape = list(t.shape)
    if tp > 1 and t.tp_dim is not None:
        shape[t.tp_dim] = chunk(shape[t.tp_dim], tp, tp_rank)
    return shape


def sharded_numel(shape: list[int], shard: int, shard_rank: int) -> tuple[int, int]:
    """(this rank's FSDP shard numel, the padded unsharded numel FSDP gathers) of a (tp-local) tensor."""
    rest = math.prod(shape[1:]) if len(shape) > 1 else 1
    if shard <= 1:
        return shape[0] * rest, shape[0] * rest
    return chunk(shape[0], shard, shard_rank) * rest, -(-shape[0] // shard) * shard * rest


@dataclass(frozen=True)
class Group:
    """A set of parameter tensors as one rank holds them (one FSDP unit, or several)."""

    local: int = 0  # elements this rank stores (its shard under FSDP)
    unsharded: int = 0  # elements of the tp-local tensors (what an all-gather rebuilds), padded for FSDP
    matmul: int = 0  # tp-local elements of weights multiplied by activations
    tensors: int = 0

    def __add__(self, other: Group) -> Group:
        return Group(self.local + other.local, self.unsharded + other.unsharded, self.matmul + other.matmul,
                     self.tensors + other.tensors)

    def times(self, k: int) -> Group:
        return Group(self.local * k, self.unsharded * k, self.matmul * k, self.tensors * k)


@lru_cache(maxsize=4096)
def _group(tensors: tuple[Tensor, ...], tp: int, tp_rank: int, shard: int, shard_rank: int) -> Group:
    g = Group()
    for t in tensors:
        shape = local_shape(t, tp, tp_rank)
        local, unsharded = sharded_numel(shape, shard, shard_rank)
        g = g + Group(local, unsharded, math.prod(shape) if t.matmul else 0, 1)
    return g


@dataclass(frozen=True)
class StageParams:
    """Parameters of one pipeline stage on one rank, by FSDP unit."""

    index: int
    layers: int
    block: Group  # one block
    root: Group  # final norm / head held on this stage (and a tied embedding, which shares the head's unit)
    embedding: Group = Group()  # an untied embedding: an FSDP unit of its own, resharded after forward

    @property
    def total(self) -> Group:
        return self.block.times(self.layers) + self.root + self.embedding


@lru_cache(maxsize=1024)
def _layer_ranges(n_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per pipeline stage, earlier stages taking one extra when the split is uneven: the split of
    meshlm.distributed.pipeline.layer_ranges (restated here because importing torch's pipelining costs a
    second; a test checks that they agree)."""
    base, extra = divmod(n_layers, num_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(num_stages))


def stage_indices(layout: Layout, pp_rank: int) -> list[int]:
    if layout.pp == 1:
        return [0]
    if layout.pp_schedule == "zbv":
        return [pp_rank, 2 * layout.pp - 1 - pp_rank]
    return [pp_rank + k * layout.pp for k in range(layout.stages_per_rank)]


def rank_stages(spec: ModelSpec, layout: Layout, pp_rank: int = 0, tp_rank: int = 0,
                shard_rank: int = 0) -> list[StageParams]:
    shard = layout.dp_shard if layout.sharding in ("zero2", "zero3") and layout.uses_fsdp else 1
    return list(_rank_stages(spec, layout.tp, layout.pp, layout.num_stages, tuple(stage_indices(layout, pp_rank)),
                             tp_rank, shard, shard_rank))


@lru_cache(maxsize=8192)
def _rank_stages(spec: ModelSpec, tp: int, pp: int, num_stages: int, indices: tuple[int, ...], tp_rank: int,
                 shard: int, shard_rank: int) -> tuple[StageParams, ...]:
    sizes = _layer_ranges(spec.n_layers, num_stages)
    block = _group(spec.block_tensors(), tp, tp_rank, shard, shard_rank)
    out = []
    for s in indices:
        root: tuple[Tensor, ...] = ()
        embedding = tuple(spec.embedding_tensors()) if s == 0 else ()
        if s == num_stages - 1:
            root += tuple(spec.head_tensors())
            if spec.tie_embeddings and num_stages > 1:  # a pipelined tied head: the last stage keeps its own copy
                root += (Tensor("output.weight", (spec.vocab_size, spec.dim), 0, True),)
            elif spec.tie_embeddings:  # one tied parameter, one FSDP unit (distributed/data_parallel.py)
                root, embedding = embedding + root, ()
        out.append(StageParams(s, sizes[s], block, _group(root, tp, tp_rank, shard, shard_rank),
                               _group(embedding, tp, tp_rank, shard, shard_rank)))
    return tuple(out)


def _state_bytes(g: Group, training: Training) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes of a group under the engine's accounting."""
    opt = 8 * g.local + 4 * g.tensors if training.optimizer == "adamw" else 4 * g.local
    return 4.0 * g.local, 4.0 * g.local, float(opt)


def _zero_bytes(psi: float, layout: Layout, training: Training) -> tuple[float, float, float]:
    """ZeRO paper (Rajbhandari et al. 2019, §5): fp16 params 2Ψ, fp16 grads 2Ψ, optimizer KΨ (K = 12 for
    mixed-precision Adam: fp32 master, momentum, variance; 8 for SGD with momentum), partitioned over N_d."""
    n = layout.dp
    k = 12 if training.optimizer == "adamw" else 8
    stage = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}[layout.sharding]
    params = 2 * psi / (n if stage >= 3 else 1)
    grads = 2 * psi / (n if stage >= 2 else 1)
    opt = k * psi / (n if stage >= 1 else 1)
    return params, grads, opt


def memory(spec: ModelSpec, layout: Layout, training: Training, pp_rank: int | None = None, tp_rank: int = 0,
           shard_rank: int = 0) -> Memory:
    """Memory of one rank; ``pp_rank=None`` gives the pipeline rank that needs the most."""
    if pp_rank is None:
        ranks = range(layout.pp) if layout.pp <= 64 else sorted({0, 1, layout.pp // 2, layout.pp - 2, layout.pp - 1})
        return max((memory(spec, layout, training, r, tp_rank, shard_rank) for r in ranks), key=lambda m: m.total)
    stages = rank_stages(spec, layout, pp_rank, tp_rank, shard_rank)
    held = Group()
    for st in stages:
        held = held + st.total
    if training.accounting == "zero":
        params, grads, opt = _zero_bytes(float(held.unsharded), layout, training)
    else:
        params, grads, opt = _state_bytes(held, training)
    if training.accounting == "engine" and layout.tp > 1 and not layout.uses_fsdp and stages[0].index == 0:
        # DTensor's embedding backward returns a Replicate gradient for the vocabulary-sharded weight: each
        # tensor-parallel rank holds the full V x h gradient (FSDP re-shards it before reduce-scatter).
        grads += 4.0 * spec.vocab_size * spec.dim - 4.0 * _group(tuple(spec.embedding_tensors()[:1]), layout.tp,
                                                                   tp_rank, 1, 0).local
    mem = Memory(params, grads, opt)
    activations, act_detail = act.rank_activation_bytes(spec, layout, training, pp_rank, stages)
    mem.activations = activations
    mem.detail.update(act_detail)
    if training.accounting == "engine":
        mem.detail.update(buffer_bytes(spec, layout, training, stages, held))
        mem.buffers = sum(v for k, v in mem.detail.items() if k.startswith("buffer:"))
    return mem


# Rows per chunk of meshlm's chunked cross-entropy (meshlm/models/head.py CHUNK_ROWS; the planner
# stays free of torch, a test keeps the two equal).
CE_CHUNK_ROWS = 4096
FUSED_CHUNK_ROWS = 1024  # meshlm/models/head.py FUSED_CHUNK_ROWS (the same test keeps them equal)


def logits_grad_bytes(spec: ModelSpec, layout: Layout, training: Training, b: int) -> float:
    """The loss's transient peak. Through logits, at the loss backward, beside the saved logits: the logits'
    gradient in the compute dtype and, with the chunked cross-entropy, two fp32 (rows, V) temporaries of one chunk (logits − lse and its exp, alive
    together); torch's cross-entropy on vocabulary shards (loss parallelism) keeps one fp32 softmax instead."""
    s, cb = training.seq_len, training.compute_bytes
    if act.fused_head(spec, layout, training):
        # The head's fused loss (meshlm/models/head.py), at its forward: one chunk's fp32 logits and logsumexp's
        # temporary of the same size; in 16 bits also the chunk's matmul output and gradient in the compute
        # dtype, and over several chunks the weight gradient's fp32 sum and the chunk's product it adds.
        rows = min(b * s, FUSED_CHUNK_ROWS)
        low = 0.0
        if cb != 4:
            low = 2 * cb * rows * spec.vocab_size + ((4 + cb) * spec.vocab_size * spec.dim if b * s > rows else 0)
        return 8 * rows * spec.vocab_size + low
    if layout.tp > 1 and layout.loss_parallel:
        return b * s * spec.vocab_size / layout.tp * (4 + cb)
    if spec.arch == "gpt":
        return b * s * spec.vocab_size * (4 + cb)
    return spec.vocab_size * (cb * b * s + 8 * min(b * s, CE_CHUNK_ROWS))


def block_backward_bytes(spec: ModelSpec, layout: Layout, training: Training, b: int) -> float:
    """A block's transient peak in backward, at its first op, SwiGLU's backward (measured with the memory probe
    on the debug model): the gradient of w2's input and of SwiGLU's two inputs beside the incoming gradient, in
    the compute dtype: three b·s·f/t (the same on plain tensors and under tensor parallelism). With activation
    checkpointing, plus what the recompute re-creates for that one block (what no AC would have saved beyond
    what the mode keeps)."""
    if spec.arch == "gpt":
        return 0.0
    ws = 3 * training.compute_bytes * b * training.seq_len * spec.ffn_hidden_dim / layout.tp
    if layout.activation_checkpointing != "none":
        keep = act.block_bytes(spec, layout, training, b)
        full = act.block_bytes(spec, dataclasses.replace(layout, activation_checkpointing="none"), training, b)
        ws += full - keep
    return ws


def _accumulates(layout: Layout, training: Training) -> bool:
    """More than one forward/backward per optimizer step on a rank (gradient accumulation)."""
    return act.micro_batch(layout, training) < training.global_batch // max(layout.dp, 1)


def buffer_bytes(spec: ModelSpec, layout: Layout, training: Training, stages: list[StageParams],
                 held: Group) -> dict[str, float]:
    cb = training.compute_bytes
    out: dict[str, float] = {}
    if layout.uses_fsdp:
        pb = cb  # FSDP2 gathers in the mixed-precision param dtype (fp32 when training in fp32)
        unit = stages[0].block.unsharded
        root = sum(st.root.unsharded for st in stages)
        embedding = sum(st.embedding.unsharded for st in stages)
        if layout.pp > 1 or layout.sharding == "zero2":
            gathered = held.unsharded  # nothing is resharded until the step ends
        else:  # the head stays gathered from its forward to its backward, the embedding only while in use;
            # one block in use, the next prefetched (and the last block kept)
            gathered = max(root, embedding) + 2 * unit
        out["buffer:fsdp_gathered_params"] = pb * gathered
        out["buffer:fsdp_reduce_scatter"] = 4.0 * max(unit, root, embedding)
        if layout.pp > 1:
            # torch's pipeline stages defer FSDP's reduce-scatter to the schedule's end: each stage's unsharded
            # fp32 gradients accumulate over the micro-batches (without pipelining meshlm reduce-scatters every
            # accumulation micro-step, and only the shards above accumulate)
            out["buffer:fsdp_unsharded_grads"] = 4.0 * held.unsharded
        elif layout.dp_replicate > 1 and _accumulates(layout, training):
            # HSDP defers the all-reduce over replicas to the last micro-step: FSDP2 sums the reduce-scattered
            # shards in a buffer of their own until then
            out["buffer:hsdp_partial_grads"] = 4.0 * held.local
    elif layout.uses_ddp:
        out["buffer:ddp_buckets"] = 4.0 * held.local
    if training.precision != "fp32" and not layout.uses_fsdp:
        out["buffer:autocast_weight_copies"] = 2.0 * held.matmul
    b = act.micro_batch(layout, training)
    s = training.seq_len
    # The backward's transient peak: the loss backward's (last stage) or a block's, whichever is larger — they
    # are never alive together.
    loss_ws = logits_grad_bytes(spec, layout, training, b) if any(
        st.index == layout.num_stages - 1 for st in stages) else 0.0
    out["buffer:backward_transient"] = max(loss_ws, block_backward_bytes(spec, layout, training, b))
    if layout.pp > 1:
        m = layout.microbatches
        act_bytes = b * s * spec.dim * act.residual_bytes(layout, training)
        recv = sum(m * act_bytes for st in stages if st.index > 0)  # activations in
        recv += sum(m * act_bytes for st in stages if st.index < layout.num_stages - 1)  # gradients in
        out["buffer:pipeline_recv"] = float(recv)
    return out
