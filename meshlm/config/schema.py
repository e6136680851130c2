"""The job config: one typed section per component. Each component receives only its own section."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshlm.config.catalog import OBJECTIVES
from meshlm.config.diagnostics import DiagnosticsConfig
from meshlm.config.posttrain import LoRAConfig, ObjectiveConfig
from meshlm.errors import ConfigError
from meshlm.models.config import ModelConfig
from meshlm.sections import option


@dataclass
class DataConfig:
    path: str = option("", "A folder written by `meshlm prepare`; empty means the embedded default corpus "
                           "(prepared on first use into the cache folder).")
    seq_len: int = option(128, "Tokens per training sequence (must not exceed model.max_seq_len).")
    cache_dir: str = option("", "Where the embedded corpus is prepared; empty means $MESHLM_CACHE or "
                                "~/.cache/meshlm.")
    num_workers: int = option(2, "Worker processes used when preparing the embedded corpus.")

    def validate(self) -> None:
        if self.seq_len < 2:
            raise ConfigError(f"data.seq_len must be at least 2, got {self.seq_len}")
        if self.num_workers < 1:
            raise ConfigError(f"data.num_workers must be at least 1, got {self.num_workers}")


@dataclass
class OptimizerConfig:
    name: str = option("adamw", "Optimizer.", choices=("adamw",))
    lr: float = option(3e-3, "Peak learning rate.")
    weight_decay: float = option(0.1, "Decoupled weight decay (not applied to norms and biases).")
    beta1: float = option(0.9, "Adam beta1.")
    beta2: float = option(0.95, "Adam beta2.")
    eps: float = option(1e-8, "Adam epsilon.")
    new_modules_lr: float = option(0.0, "Peak learning rate of the modules the objective adds and trains from "
                                        "scratch (the class head of classify, the score head of reward); the "
                                        "schedule scales it as it scales lr. 0: optimizer.lr.")

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optimizer.lr must be positive, got {self.lr}")
        if self.new_modules_lr < 0:
            raise ConfigError(f"optimizer.new_modules_lr must be >= 0 (0: optimizer.lr), got {self.new_modules_lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError("optimizer.beta1 and optimizer.beta2 must be in [0, 1)")
        if self.weight_decay < 0 or self.eps <= 0:
            raise ConfigError("optimizer.weight_decay must be >= 0 and optimizer.eps > 0")


@dataclass
class ScheduleConfig:
    name: str = option("cosine", "Learning-rate schedule after warmup.", choices=("cosine", "wsd", "constant"))
    warmup_steps: int = option(20, "Linear warmup steps from 0 to optimizer.lr.")
    min_lr_ratio: float = option(0.1, "Final learning rate as a fraction of optimizer.lr.")
    decay_fraction: float = option(0.2, "WSD: fraction of the steps spent in the final linear decay.")

    def validate(self) -> None:
        if self.warmup_steps < 0:
            raise ConfigError(f"schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"schedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"schedule.decay_fraction must be in (0, 1], got {self.decay_fraction}")


@dataclass
class TrainingConfig:
    steps: int = option(100, "Optimizer steps to train for.")
    seed: int = option(0, "Seed for initialisation, data order and sampling.")
    batch_size: int = option(8, "Global batch in sequences per optimizer step.")
    micro_batch_size: int = option(0, "Sequences per forward/backward on each rank; 0 means the whole local "
                                      "batch (no accumulation). batch_size / (micro_batch_size * data-parallel "
                                      "ranks) micro-steps are accumulated.")
    objective: str = option("pretrain", "Training objective: pretrain (next-token), sft (assistant-only loss on "
                                        "JSONL chats), reward (Bradley-Terry reward model), classify (a class head "
                                        "on labelled rows), dpo (DPO family, see [objective]), ppo / grpo (RL "
                                        "from generated rollouts, see [objective]).",
                            choices=OBJECTIVES)  # the catalog itself: an objective registered later counts
    precision: str = option("fp32", "fp32; bf16 autocast; fp16 autocast with dynamic loss scaling.",
                            choices=("fp32", "bf16", "fp16"))
    max_grad_norm: float = option(1.0, "Clip the global gradient norm to this; 0 disables clipping.")
    activation_checkpointing: str = option("none", "Recompute activations in backward.",
                                           choices=("none", "selective", "full"))
    compile: bool = option(False, "torch.compile each transformer block.")
    eval_interval: int = option(50, "Evaluate held-out loss every N steps (and at the end); 0 disables.")
    eval_batches: int = option(4, "Batches of held-out data per evaluation.")
    device: str = option("auto", "auto picks cuda when available, else cpu.", choices=("auto", "cpu", "cuda"))
    deterministic: bool = option(False, "Deterministic kernels (torch.use_deterministic_algorithms, cuBLAS "
                                        "workspace, cuDNN) for bitwise-repeatable GPU runs; slower. CPU runs are "
                                        "deterministic without it.")

    def validate(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"training.steps must be at least 1, got {self.steps}")
        if self.batch_size < 1 or self.micro_batch_size < 0:
            raise ConfigError("training.batch_size must be >= 1 and training.micro_batch_size >= 0")
        if self.micro_batch_size and self.batch_size % self.micro_batch_size:
            raise ConfigError(f"training.batch_size ({self.batch_size}) must be a multiple of "
                              f"training.micro_batch_size ({self.micro_batch_size})")
        if self.max_grad_norm < 0 or self.eval_interval < 0 or self.eval_batches < 1:
            raise ConfigError("training.max_grad_norm and training.eval_interval must be >= 0, "
                              "training.eval_batches >= 1")


PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv")


@dataclass
class ParallelConfig:
    dp_replicate: int = option(1, "Data-parallel replicas (DDP when alone; HSDP's replica groups with dp_shard).")
    dp_shard: int = option(-1, "Sharded data-parallel degree (FSDP2 / ZeRO-3); -1 = whatever the world size "
                               "leaves after the other degrees.")
    tp: int = option(1, "Tensor-parallel degree (Megatron-style column/row sharding, DTensor).")
    pp: int = option(1, "Pipeline-parallel degree (torch.distributed.pipelining).")
    pp_schedule: str = option("1f1b", "Pipeline schedule.", choices=PP_SCHEDULES)
    stages_per_rank: int = option(0, "Pipeline stages (model chunks) per rank; 0 = 1 for gpipe/1f1b, 2 for the "
                                     "interleaved and zero-bubble schedules.")
    microbatches: int = option(0, "Pipeline micro-batches per local batch; 0 = pp.")
    sequence_parallel: bool = option(True, "With tp > 1, shard norms/residuals along the sequence too.")
    loss_parallel: bool = option(True, "With tp > 1, compute the cross-entropy on vocabulary-sharded logits.")
    reshard_after_forward: str = option("default", "FSDP: free gathered params after forward (ZeRO-3, "
                                        "'always'), keep them until backward (ZeRO-2-like, 'never'), or 'default' "
                                        "(always, except never for the last block and under pipelining).",
                                        choices=("default", "always", "never"))
    timeout_s: int = option(300, "Collective / rendezvous timeout in seconds before a hung job fails.")

    def validate(self) -> None:
        for name in ("dp_replicate", "tp", "pp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel.{name} must be at least 1, got {getattr(self, name)}")
        if self.dp_shard < 1 and self.dp_shard != -1:
            raise ConfigError(f"parallel.dp_shard must be -1 (infer) or at least 1, got {self.dp_shard}")
        if self.stages_per_rank < 0 or self.microbatches < 0 or self.timeout_s < 1:
            raise ConfigError("parallel.stages_per_rank and parallel.microbatches must be >= 0, "
                              "parallel.timeout_s >= 1")

    @property
    def num_stages_per_rank(self) -> int:
        return self.stages_per_rank or (1 if self.pp_schedule in ("gpipe", "1f1b") else 2)


@dataclass
class CheckpointConfig:
    interval: int = option(50, "Save a checkpoint every N steps (and at the end); 0 saves only at the end.")
    keep_last: int = option(3, "Keep the newest K checkpoints; older ones are deleted after a save succeeds.")
    enabled: bool = option(True, "Write checkpoints at all.")
    init_from: str = option("", "Initialise the model's weights from this checkpoint (a run directory or a "
                                "step folder, e.g. one written by `meshlm convert from-hf`) instead of at random: "
                                "fine-tuning. Optimizer and data position start fresh; ignored when --resume "
                                "finds a checkpoint of the run itself.")

    def validate(self) -> None:
        if self.interval < 0 or self.keep_last < 1:
            raise ConfigError("checkpoint.interval must be >= 0 and checkpoint.keep_last >= 1")


TRACKERS = ("tensorboard", "mlflow", "wandb")  # metrics.trackers; meshlm/train/tracking.py implements each


@dataclass
class MetricsConfig:
    interval: int = option(10, "Log metrics every N steps.")
    tensorboard: bool = option(True, "Also write TensorBoard events to RUN_DIR/tensorboard/.")
    comm_sample_interval: int = option(50, "Count collective bytes/calls and profile their time on one step "
                                           "every N steps (the first sample is a process's 2nd step; "
                                           "multi-rank runs only). Records carry the latest sample with "
                                           "comm_measured_step; 0 = sample once.")
    progress: str = option("auto", "auto: a rich progress bar on a terminal, plain log lines otherwise.",
                           choices=("auto", "rich", "plain"))
    wandb: bool = option(False, "Also log to Weights & Biases (the same as listing 'wandb' in metrics.trackers).")
    wandb_project: str = option("meshlm", "Weights & Biases project name for metrics.wandb.")
    trackers: list[str] = option([], "Experiment trackers that also receive every metrics.jsonl record, any of "
                                     "tensorboard, mlflow, wandb; mlflow and wandb need "
                                     "pip install 'meshlm[tracking]'.")
    wandb_mode: str = option("offline", "offline: files under RUN_DIR/wandb (`wandb sync` uploads them later); "
                                        "online: straight to the W&B server.", choices=("offline", "online"))
    mlflow_tracking_uri: str = option("", "MLflow tracking URI (a server, sqlite:///FILE); empty: "
                                          "$MLFLOW_TRACKING_URI, else a file store at RUN_DIR/mlruns.")
    mlflow_experiment: str = option("meshlm", "MLflow experiment name for 'mlflow' in metrics.trackers.")

    def validate(self) -> None:
        if self.interval < 1:
            raise ConfigError(f"metrics.interval must be at least 1, got {self.interval}")
        unknown = [name for name in self.trackers if name not in TRACKERS]
        if unknown:
            raise ConfigError(f"metrics.trackers: unknown tracker(s) {', '.join(map(repr, unknown))}; choose from "
                              f"{', '.join(TRACKERS)}")
        if self.comm_sample_interval < 0:
            raise ConfigError(f"metrics.comm_sample_interval must be 0 (sample once) or a positive number of "
                              f"steps, got {self.comm_sample_interval}")


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    def validate(self) -> None:
        """Checks that span sections."""
        if self.data.seq_len > self.model.max_seq_len:
            raise ConfigError(f"data.seq_len ({self.data.seq_len}) is larger than the model's context "
                              f"model.max_seq_len ({self.model.max_seq_len}); lower data.seq_len")
        if self.lora.enabled and self.training.objective == "ppo":
            # LoRA freezes every base parameter, PPO's value head included: the critic would never learn.
            raise ConfigError("training.objective = 'ppo' does not support LoRA yet (its value head would stay "
                              "frozen); set lora.rank = 0, or use grpo, which has no critic")
        if self.lora.enabled and not self.checkpoint.init_from:
            raise ConfigError("lora.rank > 0 adapts a base model: set checkpoint.init_from to the base checkpoint "
                              "(or lora.rank = 0 to train every weight)")
        if self.lora.enabled and self.parallel.tp > 1 and (self.lora.dropout > 0 or self.parallel.sequence_parallel
                                                           or self.model.qk_norm):
            # torch's SequenceParallel re-creates the norm weights as trainable parameters (the frozen base norms
            # would train); dropout masks under DTensor would differ from a single device's
            raise ConfigError("LoRA with tensor parallelism needs parallel.sequence_parallel = false, lora.dropout = 0 "
                              "and no model.qk_norm (sequence-parallel norms lose their frozen state); set those, or "
                              "parallel.tp = 1")
        if self.training.objective == "reward" and self.parallel.tp > 1:
            raise ConfigError("training.objective = 'reward' has a 1-output score head that tensor parallelism "
                              "cannot shard; use parallel.tp = 1 (DDP or FSDP2)")


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "training": TrainingConfig,
    "parallel": ParallelConfig,
    "checkpoint": CheckpointConfig,
    "metrics": MetricsConfig,
    "objective": ObjectiveConfig,
    "lora": LoRAConfig,
    "diagnostics": DiagnosticsConfig,
}
