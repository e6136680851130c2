"""A parallel layout and the training set-up it is evaluated under (the planner's inputs besides the model
and the hardware)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from meshlm.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
AC_MODES = ("none", "selective", "full")
# none: replicated (DDP, or no data parallelism); zero1: optimizer state sharded (ZeRO paper accounting only —
# the engine has no ZeRO-1); zero2: FSDP2 keeping gathered parameters from forward to backward
# (reshard_after_forward=never); zero3: FSDP2 resharding after forward (the engine's default).
SHARDINGS = ("none", "zero1", "zero2", "zero3")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv")


@dataclass(frozen=True)
class Training:
    seq_len: int
    global_batch: int  # sequences per optimizer step
    precision: str = "bf16"
    optimizer: str = "adamw"
    efficiency: float = 0.5  # achieved / peak FLOP/s of the matmul-heavy compute
    accounting: str = "engine"  # "engine": what meshlm allocates; "zero": the ZeRO paper's 2+2+12 bytes
    # What a step computes besides one forward and backward per sequence (timing.py's compute, element-wise and
    # optimizer time; memory and the collectives' payloads do not model them yet):
    lora_rank: int = 0  # > 0: LoRA adapters of this rank on lora_targets; the base weights are frozen
    lora_targets: tuple[str, ...] = ()  # the family spec's target names (q, k, v, o, gate, up, down)
    sequences_per_row: int = 1  # sequences the model runs per batch row (a preference pair: 2)
    frozen_forwards: int = 0  # forward passes of a frozen copy per sequence (DPO's reference model: 1)

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.global_batch < 1:
            raise ConfigError(f"sequence length and global batch must be positive (got --seq {self.seq_len}, "
                              f"{self.global_batch} sequences)")
        if self.lora_rank < 0 or self.sequences_per_row < 1 or self.frozen_forwards < 0:
            raise ConfigError(f"LoRA rank ({self.lora_rank}) and frozen forwards ({self.frozen_forwards}) must be "
                              f">= 0 and sequences per row ({self.sequences_per_row}) >= 1")
        if self.lora_rank and not self.lora_targets:
            raise ConfigError(f"LoRA rank {self.lora_rank} needs its targets (e.g. q, v)")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got '{self.precision}'")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got '{self.optimizer}'")
        if not 0 < self.efficiency <= 1:
            raise ConfigError(f"--efficiency must be in (0, 1], got {self.efficiency}")

    @property
    def tokens(self) -> int:
        """Positions the model runs forward and backward per optimizer step (both sequences of a pair)."""
        return self.seq_len * self.global_batch * self.sequences_per_row

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of activations / gathered parameters in the compute precision."""
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    pp_schedule: str = "1f1b"
    stages_per_rank: int = 1
    microbatches: int = 1  # pipeline micro-batches per step (pp > 1)
    micro_batch_size: int = 0  # sequences per forward/backward on a rank (0: the whole local batch)
    sharding: str = "zero3"
    activation_checkpointing: str = "none"
    sequence_parallel: bool = True
    loss_parallel: bool = True
    reshard_after_forward: str = "default"  # FSDP2 under zero3: default (all but the last block) or always

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def uses_ddp(self) -> bool:
        """The engine uses DDP only for pure replication; FSDP2 otherwise (HSDP with a replicate dim)."""
        return self.dp > 1 and self.dp_shard == 1 and self.tp == 1 and self.pp == 1

    @property
    def uses_fsdp(self) -> bool:
        return self.dp > 1 and not self.uses_ddp

    def family(self) -> str:
        """A name for the kind of layout, for explanations ("FSDP+TP", "pure DP", ...)."""
        parts = []
        if self.dp_shard > 1:
            zero = {"zero3": "FSDP", "zero2": "ZeRO-2", "zero1": "ZeRO-1"}.get(self.sharding, "FSDP")
            parts.append("HSDP" if self.dp_replicate > 1 else zero)
        elif self.dp_replicate > 1:
            parts.append("DP")
        if self.tp > 1:
            parts.append("TP")
        if self.pp > 1:
            parts.append("PP")
        if not parts:
            return "single device"
        return "pure DP" if parts == ["DP"] else "+".join(parts)

    def describe(self) -> str:
        bits = [f"{name} {getattr(self, name)}" for name in ("dp_replicate", "dp_shard", "tp", "pp")
                if getattr(self, name) > 1]
        text = " x ".join(bits) if bits else "single device"
        if self.pp > 1:
            text += f" ({self.pp_schedule}, {self.microbatches} micro-batches"
            text += f", {self.stages_per_rank} stages/rank)" if self.stages_per_rank > 1 else ")"
        return text

    def to_json(self, training: Training) -> dict:
        d = asdict(self)
        d["precision"] = training.precision
        return d
