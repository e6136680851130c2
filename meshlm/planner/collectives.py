"""Every collective one rank runs in one training step, as the engine issues them.

Each entry carries the payload in the convention of meshlm/distributed/comm.py (the full buffer of an
all-gather or reduce-scatter, the tensor of an all-reduce or send/recv), the mesh dim it runs over and whether
the engine's own counter buckets hold it (``counted``): collectives that DTensor issues inside its own op
dispatch (the loss-parallel reductions, the gradient-norm reduction) are counted too, but apart, in
``comm_dtensor*`` (meshlm/distributed/comm.py); here they are ``counted=False``. They are costed in time all
the same. ``comm_bytes_per_step`` predicted = the counted payloads, and a test compares it with
``metrics.jsonl`` byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshlm.planner.activations import micro_batch, residual_bytes
from meshlm.planner.layout import Layout, Training
from meshlm.planner.memory import StageParams, rank_stages
from meshlm.planner.model_spec import ModelSpec


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce, all_gather, reduce_scatter, send, recv
    dim: str  # tp, dp_shard, dp_replicate, dp (replicate x shard), pp
    payload: float  # bytes per call
    calls: int
    role: str  # tp (on the critical path), dp (overlaps compute), p2p, small (trainer scalars)
    counted: bool = True

    @property
    def bytes(self) -> float:
        return self.payload * self.calls


def step_collectives(spec: ModelSpec, layout: Layout, training: Training, pp_rank: int = 0, tp_rank: int = 0,
                     shard_rank: int = 0) -> list[Collective]:
    stages = rank_stages(spec, layout, pp_rank, tp_rank, shard_rank)
    out: list[Collective] = []
    out += _trainer_scalars(layout)
    out += _data_parallel(spec, layout, training, stages)
    out += _tensor_parallel(spec, layout, training, stages)
    out += _pipeline(spec, layout, training, stages)
    return [c for c in out if c.calls > 0]


def steps_per_optimizer_step(layout: Layout, training: Training) -> int:
    """Forward/backward passes per step on a rank: pipeline micro-batches or accumulation micro-steps."""
    if layout.pp > 1:
        return layout.microbatches
    local = training.global_batch // max(layout.dp, 1)
    return max(local // micro_batch(layout, training), 1)


def _trainer_scalars(layout: Layout) -> list[Collective]:
    out = []
    if layout.dp > 1:  # the global token count and the loss sum (float64)
        out.append(Collective("all_reduce", "dp", 8, 2, "small"))
    if layout.pp > 1:  # the loss from the last stage and the squared grad norm over stages (float64)
        out.append(Collective("all_reduce", "pp", 8, 2, "small"))
    if layout.uses_fsdp or layout.tp > 1:  # DTensor's grad-norm reduction (float32), inside dispatch
        out.append(Collective("all_reduce", "dp" if layout.dp > 1 else "tp", 4, 1, "small", counted=False))
    return out


def _data_parallel(spec: ModelSpec, layout: Layout, training: Training,
                   stages: list[StageParams]) -> list[Collective]:
    if layout.dp == 1:
        return []
    held_local = sum(st.total.local for st in stages)
    if layout.uses_ddp:  # fp32 gradients, bucketed
        return [Collective("all_reduce", "dp", 4.0 * held_local, 1, "dp")]
    pb = training.compute_bytes  # FSDP2 gathers in the mixed-precision param dtype
    micro = steps_per_optimizer_step(layout, training)
    out: list[Collective] = []
    for st in stages:
        units = [(st.block.unsharded, st.layers)]
        for end in (st.embedding, st.root):  # the embedding and the head are FSDP units of their own
            if end.tensors:
                units.append((end.unsharded, 1))
        gathers_fwd = sum(k for _, k in units)
        fwd_bytes = sum(u * k for u, k in units)
        if layout.pp > 1 or layout.sharding == "zero1":
            # pipelining: gathered once per step, kept until the schedule's last backward; ZeRO-1 (the paper's
            # accounting only): full gradients accumulate locally, then one reduce-scatter and one all-gather of
            # the updated parameters per step
            regather, rounds = 0, 1
        else:
            rounds = micro
            # reshard_after_forward=default: every block but the last is gathered again for backward
            regather = 0
            if layout.sharding == "zero3":
                regather = st.layers if layout.reshard_after_forward == "always" else max(st.layers - 1, 0)
        if layout.dp_shard > 1 or layout.sharding in ("zero2", "zero3"):
            out.append(Collective("all_gather", "dp_shard", pb * fwd_bytes / gathers_fwd,
                                  rounds * gathers_fwd, "dp"))
            if regather:
                out.append(Collective("all_gather", "dp_shard", pb * st.block.unsharded, rounds * regather, "dp"))
            if st.embedding.tensors and layout.sharding == "zero3" and layout.pp == 1:
                # the embedding is resharded after forward and gathered again for its backward
                out.append(Collective("all_gather", "dp_shard", pb * st.embedding.unsharded, rounds, "dp"))
        # reduce-scattered on every accumulation micro-step (meshlm.distributed.data_parallel.set_grad_sync);
        # under pipelining once, after the schedule's last backward
        out.append(Collective("reduce_scatter", "dp_shard", 4.0 * fwd_bytes / gathers_fwd, rounds * gathers_fwd,
                              "dp"))
        if layout.dp_replicate > 1:  # HSDP: the summed shards are all-reduced over the replicas once per step
            out.append(Collective("all_reduce", "dp_replicate", 4.0 * st.total.local / gathers_fwd, gathers_fwd,
                                  "dp"))
        if layout.tp > 1 and layout.sequence_parallel:  # norm weights' partial gradients, made whole for FSDP
            norms = 2 * st.layers + (1 if st.index == layout.num_stages - 1 else 0)
            out.append(Collective("all_reduce", "tp", 4.0 * spec.dim, norms, "dp"))
    return out


def _tensor_parallel(spec: ModelSpec, layout: Layout, training: Training,
                     stages: list[StageParams]) -> list[Collective]:
    """Payloads in the compute dtype (exact in fp32; under bf16 autocast without FSDP the sequence-parallel
    all-gathers of the fp32 norm outputs are twice that)."""
    if layout.tp == 1:
        return []
    micro = steps_per_optimizer_step(layout, training)
    b, s, h = micro_batch(layout, training), training.seq_len, spec.dim
    act = b * s * h * training.compute_bytes  # one full-sequence activation
    last = layout.num_stages - 1
    out: list[Collective] = []
    for st in stages:
        first_stage, last_stage = st.index == 0, st.index == last
        if layout.sequence_parallel:
            # forward: embedding reduce-scatter; per block 2 all-gathers (attention, FFN inputs) and 2
            # reduce-scatters (wo, w2 outputs); the head's input all-gather. Backward swaps them.
            ag = 2 * st.layers + (1 if last_stage else 0)
            rs = 2 * st.layers + (1 if first_stage else 0)
            boundary = (0 if first_stage else 1) + (0 if last_stage else 1)  # stage edges gather the sequence
            out.append(Collective("all_gather", "tp", act, micro * (ag + rs + boundary), "tp"))
            out.append(Collective("reduce_scatter", "tp", act, micro * (ag + rs), "tp"))
        else:
            # forward: embedding output, wo and w2 outputs; backward: the input gradient of every
            # column-parallel linear (wq, wk, wv, w1, w3) and of the head
            calls = 7 * st.layers + (1 if first_stage else 0) + (1 if last_stage else 0)
            out.append(Collective("all_reduce", "tp", act, micro * calls, "tp"))
        if layout.dp == 1:  # no FSDP: the engine all-reduces the Partial norm-weight gradients once per step
            if layout.sequence_parallel:
                norms = 2 * st.layers + (1 if last_stage else 0)
                out.append(Collective("all_reduce", "tp", 4.0 * spec.dim, norms, "dp"))
            if spec.qk_norm:  # head-shared q/k norm weights over head-sharded activations
                out.append(Collective("all_reduce", "tp", 4.0 * spec.hd, 2 * st.layers, "dp"))
        if last_stage:
            if layout.loss_parallel:  # max, sum of exponentials and target logit over the vocabulary shards
                out.append(Collective("all_reduce", "tp", 4.0 * b * s, micro * 3, "tp", counted=False))
            else:  # the logits are gathered for a replicated cross-entropy
                out.append(Collective("all_gather", "tp", b * s * spec.vocab_size * training.compute_bytes,
                                      micro, "tp"))
    return out


def _pipeline(spec: ModelSpec, layout: Layout, training: Training, stages: list[StageParams]) -> list[Collective]:
    if layout.pp == 1:
        return []
    m = layout.microbatches
    act = micro_batch(layout, training) * training.seq_len * spec.dim * residual_bytes(layout, training)
    local = {st.index for st in stages}
    out = []
    for st in stages:
        if st.index > 0 and st.index - 1 not in local:  # activations in, their gradients back
            out += [Collective("recv", "pp", act, m, "p2p"), Collective("send", "pp", act, m, "p2p")]
        if st.index < layout.num_stages - 1 and st.index + 1 not in local:
            out += [Collective("send", "pp", act, m, "p2p"), Collective("recv", "pp", act, m, "p2p")]
    return out
