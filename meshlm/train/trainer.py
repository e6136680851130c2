"""The one Trainer: objective-agnostic; owns precision, accumulation, clipping, eval, metrics and checkpoints.

train() → train_step() → forward_backward() on each micro-batch. The objective turns a micro-batch into a summed
loss; the trainer divides by the loss-token count of the whole global batch, so accumulation (and data
parallelism) give the gradient of one big batch.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from meshlm.checkpoint.load import resolve_checkpoint
from meshlm.checkpoint.manager import CheckpointManager, choose_resume_checkpoint, load_weights
from meshlm.config.loader import config_to_toml
from meshlm.config.schema import DataConfig, JobConfig
from meshlm.data import SequenceLoader, TokenDataset, default_cache_dir, ensure_embedded_dataset
from meshlm.distributed.comm import CommCounter, comm_time_from_profile, silence_stderr
from meshlm.distributed.engine import Engine, local_value
from meshlm.distributed.rank0 import checked_on_rank0
from meshlm.errors import ConfigError, DataError
from meshlm.models import meta_model
from meshlm.objectives import build_objective
from meshlm.train.callbacks import Callbacks, TrainerCallback, TrainerView, is_out_of_memory
from meshlm.train.determinism import configure_determinism
from meshlm.train.data_setup import PostTrainData
from meshlm.train.flops import model_flops_per_token, module_flops_per_token, peak_flops
from meshlm.train.metrics import IntervalMemory, MetricsLogger, gather_rank_floats, optimizer_time_from_profile
from meshlm.train.optim import build_optimizer
from meshlm.train.posttrain_hooks import ObjectiveHooks
from meshlm.train.precision import DynamicLossScaler, autocast
from meshlm.train.schedule import lr_at

def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def open_training_data(cfg: DataConfig, vocab_size: int, verify: bool = True) -> TokenDataset:
    """The prepared dataset at ``data.path``, or the embedded corpus prepared on first use; ``verify=False``
    checks shard sizes only (the checksums are verified once, by rank 0: see Trainer.__init__)."""
    if cfg.path:
        dataset = TokenDataset(cfg.path, verify=verify)
    else:
        cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        dataset = TokenDataset(ensure_embedded_dataset(cache, vocab_size, num_workers=cfg.num_workers), verify=verify)
    if dataset.vocab_size > vocab_size:
        raise ConfigError(f"the tokenizer of {cfg.path or 'the embedded corpus'} has {dataset.vocab_size} tokens but "
                          f"model.vocab_size is {vocab_size}; raise model.vocab_size to at least "
                          f"{dataset.vocab_size}")
    return dataset


def host_values(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its 0-dim device tensors as Python floats, read with one host synchronisation."""
    keys = [k for k, v in record.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return dict(record)
    values = torch.stack([record[k].detach().double() for k in keys]).tolist()
    return {**record, **dict(zip(keys, values))}


class Trainer:
    def __init__(self, cfg: JobConfig, run_dir: Path, *, resume: bool = False, stop_at: int | None = None,
                 callbacks: Sequence[TrainerCallback] = (), model: nn.Module | None = None,
                 data: PostTrainData | None = None) -> None:
        """``callbacks``: the run's diagnostics (meshlm/train/callbacks.py); the CLI passes
        ``meshlm.doctor.callbacks.run_callbacks(cfg)``.

        ``model`` and ``data``: for a library caller whose architecture is not a ``[model]`` decoder (the encoder
        judge's adapted BERT encoder and class head, safety/encoder_judge.py), a built model and its post-training
        data (tokenizer and loaders) to train instead of building ``cfg.model`` and opening ``data.path``. Such a
        model trains as given on one device, its trainable parameters those with ``requires_grad``: no
        parallelism, no ``lora`` keys, no ``checkpoint.init_from``, no compile or activation checkpointing."""
        self.cfg, self.run_dir, self.stop_at = cfg, Path(run_dir), stop_at
        self.device = resolve_device(cfg.training.device)
        configure_determinism(cfg.training.deterministic, self.device)  # before the first kernel runs
        tc = cfg.training
        self.engine = Engine(cfg.parallel, self.device)
        self.rank = self.engine.rank
        self.micro_batch, self.accum_steps = self._micro_batching()
        self.objective = build_objective(tc.objective, cfg.objective)
        # Post-training objectives (data_kind != "tokens") read JSONL rows; see meshlm/train/posttrain_hooks.py
        self.hooks = ObjectiveHooks(self.objective, cfg, self.engine, self.micro_batch, data=data)
        self.dataset = None if self.hooks.data is not None else checked_on_rank0(
            lambda: open_training_data(cfg.data, cfg.model.vocab_size),  # sha256
            lambda: open_training_data(cfg.data, cfg.model.vocab_size, verify=False))
        self.given_model = model is not None
        if model is None:
            self.model_parts = self._build_model()
            self.flops_per_token = model_flops_per_token(cfg.model, cfg.data.seq_len)
        else:
            self.model_parts = [self._given_model(model)]
            self.flops_per_token = module_flops_per_token(model)
        self.optimizers = [build_optimizer(part, cfg.optimizer, self.objective.new_modules)
                           for part in self.model_parts]
        self.scaler = DynamicLossScaler() if tc.precision == "fp16" else None
        if self.hooks.data is not None:
            self.train_loader, self.eval_loader = self.hooks.data.train_loader, self.hooks.data.eval_loader
        else:
            self.train_loader = SequenceLoader(self.dataset, "train", cfg.data.seq_len, tc.batch_size,
                                               dp_rank=self.engine.dp_rank, dp_size=self.engine.dp_size, seed=tc.seed)
            self.eval_loader = self._eval_loader()
        self.checkpoints = CheckpointManager(self.run_dir, cfg.checkpoint.keep_last, rank=self.rank,
                                             trainable_only=cfg.lora.enabled)  # LoRA: adapters only
        self.step, self.tokens_seen = 0, 0
        self.hooks.before_weights(self.model_parts, self._say)  # LoRA: the frozen base, from init_from
        self.hooks.setup(self.model_parts, self.train_loader, self.eval_loader)  # e.g. the DPO reference
        if self.engine.dp_rank:
            # Dropout masks (LoRA's) and sampling draw from the global RNG: each data-parallel rank gets a stream
            # of its own, or every rank would apply the same masks to different samples. Rank 0 keeps the
            # single-device stream; tensor- and pipeline-parallel peers share their dp rank and so their masks.
            torch.manual_seed(tc.seed + 1_000_003 * self.engine.dp_rank)
        resumed = self._resume() if resume else False  # restores each rank's own RNG state
        if cfg.checkpoint.init_from and not resumed and not cfg.lora.enabled:
            self._init_from(cfg.checkpoint.init_from)
        self.peak_flops, self.peak_source = peak_flops(self.device, tc.precision)
        self.comm_stats: dict[str, Any] = {}
        self._data_wait_s = 0.0  # host seconds spent getting batches in the current logging window
        self.callbacks = Callbacks(callbacks, TrainerView(self))
        self.callbacks.on_init()

    def _build_model(self) -> list[nn.Module]:
        """``cfg.model`` built on the meta device; the engine splits and shards it, then each rank allocates and
        initialises only its own shards, from the seed and each parameter's name (meshlm/models/init.py): every
        layout starts from the single-device weights, and no rank ever holds the whole model."""
        cfg, tc = self.cfg, self.cfg.training
        self.engine.dims.validate_model(cfg.model, cfg.parallel, cfg.data.seq_len, self.micro_batch * self.accum_steps)
        torch.manual_seed(tc.seed)  # the global RNG (anything drawn outside the init) starts the same on every rank
        model = meta_model(cfg.model)
        self.hooks.adapt_meta_model(model)  # the objective's head, LoRA
        stage_loss = self.objective.loss_from_logits
        if self.engine.pipelined and stage_loss is None:
            raise ConfigError(f"training.objective '{tc.objective}' does not support pipeline parallelism; "
                              "use parallel.pp=1")
        return self.engine.parallelize(model, tc, stage_loss, cfg.parallel.microbatches or self.engine.dims.pp)

    def _given_model(self, model: nn.Module) -> nn.Module:
        """A caller's built model (see ``__init__``), checked against what it cannot have."""
        cfg, tc = self.cfg, self.cfg.training
        refused = [what for what, bad in (
            (f"a {self.engine.dims.world_size}-rank layout", self.engine.dims.world_size > 1),
            ("lora keys", cfg.lora.enabled), ("checkpoint.init_from", bool(cfg.checkpoint.init_from)),
            ("training.compile", tc.compile), ("activation checkpointing", tc.activation_checkpointing != "none"),
            ("post-training data opened from data.path", self.hooks.data is None)) if bad]
        if refused:
            raise ConfigError(f"a model given to the Trainer trains as built on one device with its own data; "
                              f"remove {', '.join(refused)}")
        torch.manual_seed(tc.seed)
        return model.to(self.device).train()  # a caller may hand it over in eval mode; dropout is part of training

    @property
    def model(self) -> torch.nn.Module:
        """The whole model (single part); pipelined runs hold several parts in ``model_parts``."""
        assert len(self.model_parts) == 1, "a pipelined model has several parts; use model_parts"
        return self.model_parts[0]

    # ----------------------------------------------------------------------------------------------- set-up
    def _micro_batching(self) -> tuple[int, int]:
        tc = self.cfg.training
        dp = self.engine.dp_size
        if tc.batch_size % dp:
            raise ConfigError(f"training.batch_size ({tc.batch_size}) must be divisible by the {dp} "
                              "data-parallel ranks")
        local = tc.batch_size // dp
        if self.engine.pipelined:
            if tc.micro_batch_size not in (0, local):
                raise ConfigError("under pipeline parallelism the pipeline's micro-batches are the accumulation: "
                                  "set parallel.microbatches instead of training.micro_batch_size")
            return local, 1
        micro = tc.micro_batch_size or local
        if local % micro:
            raise ConfigError(f"each data-parallel rank gets {local} sequences, not a multiple of "
                              f"training.micro_batch_size ({micro})")
        return micro, local // micro

    def _eval_loader(self) -> SequenceLoader | None:
        if not self.cfg.training.eval_interval:
            return None
        try:
            dp = self.engine.dp_size
            return SequenceLoader(self.dataset, "val", self.cfg.data.seq_len, self.micro_batch * dp,
                                  dp_rank=self.engine.dp_rank, dp_size=dp, seed=0, shuffle=False)
        except DataError as exc:
            raise DataError(f"{exc}; held-out evaluation needs a larger val split, or set "
                            "training.eval_interval=0") from None

    def _init_from(self, source: str) -> None:
        path = resolve_checkpoint(source)
        # DCP reshards into whatever layout this run uses; an objective's own new parameters (PPO's value head)
        # are not in the source checkpoint and keep their initial values
        load_weights(path, self.model_parts, keep=self.objective.init_from_keep)
        self._say(f"initialised weights from {path}")

    def _resume(self) -> bool:
        path = choose_resume_checkpoint(self.checkpoints.root, say=self._say)  # rank 0 decides for all
        if path is None:
            self._say(f"no checkpoint in {self.checkpoints.root}; starting from step 0")
            return False
        state = self.checkpoints.load(path, self.model_parts, self.optimizers)
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.train_loader.load_state_dict(state["loader"])
        self.hooks.load_state_dict(state)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self._say(f"resumed from {path} at step {self.step}")
        return True

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    # ------------------------------------------------------------------------------------------------ loop
    def train(self) -> dict[str, Any]:
        tc, mc = self.cfg.training, self.cfg.metrics
        last = min(tc.steps, self.stop_at) if self.stop_at else tc.steps
        # Communication is sampled on multi-rank runs: the process's 2nd step, then every
        # metrics.comm_sample_interval steps; a callback may ask for samples on one device too, or a later start
        asked = self.callbacks.measure_after()
        first_sample = self.step + (asked or 2) if self.engine.dims.world_size > 1 or asked else None
        self.memory = IntervalMemory(self.device)  # memory_gib: the peak of each logging interval from here on
        logger = MetricsLogger(self.run_dir, mc, tc.steps, self.step, rank=self.rank)
        logger.message(self.describe())
        for line in self.callbacks.messages("on_train_start"):  # e.g. the planner's prediction for this layout
            logger.message(line)
        window_tokens, window_positions, window_steps, window_time, record = 0, 0, 0, 0.0, {}
        try:
            while self.step < last:
                start = time.perf_counter()
                # Sampled steps run instrumented (collectives counted, profiler on); their overhead is part of
                # that window's throughput.
                sampled = self._comm_sample_due(self.step + 1, first_sample)
                try:
                    record = self._measured_step(self.step + 1 == first_sample) if sampled else self.train_step()
                except RuntimeError as exc:  # torch.OutOfMemoryError, or the CPU allocator's failure
                    replacement = self.callbacks.on_oom(exc) if is_out_of_memory(exc) else None
                    if replacement is None:
                        raise
                    raise replacement from None  # e.g. names `meshlm diagnose oom`, no traceback
                window_time += time.perf_counter() - start
                window_tokens += record.pop("tokens")
                window_positions += record.pop("positions")
                window_steps += 1
                self.callbacks.on_step_end(record)  # outside the step's timing
                if self.eval_loader is not None and self._due(self.step, tc.eval_interval, last):
                    record["eval_loss"] = self.evaluate()
                if self._due(self.step, mc.interval, last) or "eval_loss" in record:
                    record.update(self.hooks.metrics())  # the objective's own metrics, reduced over dp ranks
                    logger.log(self._finish_record(record, window_tokens, window_positions, window_steps,
                                                   window_time))
                    window_tokens, window_positions, window_steps, window_time = 0, 0, 0, 0.0
                else:
                    logger.advance(self.step)
                if self.cfg.checkpoint.enabled and self._due(self.step, self.cfg.checkpoint.interval, last):
                    self.save()
            for line in self.callbacks.messages("on_train_end"):  # e.g. the prediction beside the measurement
                logger.message(line)
        finally:
            logger.close()
        return {"step": self.step, "tokens_seen": self.tokens_seen, **host_values(record), **self.comm_stats}

    @staticmethod
    def _due(step: int, interval: int, last: int) -> bool:
        return step == last or (interval > 0 and step % interval == 0)

    def _comm_sample_due(self, step: int, first: int | None) -> bool:
        interval = self.cfg.metrics.comm_sample_interval
        if first is None or step < first:
            return False
        return step == first or (interval > 0 and (step - first) % interval == 0)

    def train_step(self) -> dict[str, Any]:
        """One optimizer step. Nothing here waits for the device: the token count, the loss scale, the loss and
        the grad norm stay device tensors (the record's ``loss``, ``grad_norm`` and ``tokens`` are 0-dim tensors
        that :func:`host_values` reads in one go at log steps). The one exception is fp16, whose loss scaler reads
        the grad norm's finiteness once per optimizer step to decide whether to skip it."""
        tc, engine = self.cfg.training, self.engine
        fetch_start = time.perf_counter()
        batch = {k: v.to(self.device) for k, v in self.hooks.next_batch(self.train_loader).items()}
        self._data_wait_s += time.perf_counter() - fetch_start  # host time to get the batch (diagnose slow)
        global_tokens = engine.dp_sum(self.objective.num_loss_tokens(batch))  # () float64 on the device
        loss_scale = self.scaler.scale if self.scaler else 1.0
        # d(loss_sum · scale)/dθ summed over micro-batches (and averaged over data-parallel ranks by FSDP/DDP,
        # hence the dp factor) is the gradient of the mean loss over every token of the global batch. Divided
        # in float64 then rounded once to fp32: the same factor a Python float would have given.
        scale = (loss_scale * engine.dp_size / global_tokens).float()
        if engine.pipelined:
            with autocast(tc.precision, self.device.type):
                local_loss = engine.pipeline_step(batch, scale)
        else:
            local_loss = torch.zeros((), dtype=torch.float64, device=self.device)
            for i in range(self.accum_steps):
                micro = {k: v[i * self.micro_batch:(i + 1) * self.micro_batch] for k, v in batch.items()}
                engine.set_grad_sync(self.model_parts, i == self.accum_steps - 1)
                local_loss += self.forward_backward(micro, scale)
        max_norm = tc.max_grad_norm or math.inf
        grad_norm = engine.clip_grad_norm_(self.model_parts, max_norm, 1.0 / loss_scale)  # () float64, pre-clip
        skipped = self.scaler.update(grad_norm) if self.scaler else False
        lr = lr_at(self.step, self.cfg.optimizer.lr, tc.steps, self.cfg.schedule)
        for optimizer in self.optimizers:
            if not skipped:
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)  # a new module's own rate (optimizer.new_modules_lr)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._pending_tokens = self._pending_tokens + global_tokens  # folded into tokens_seen when read
        return {"step": self.step, "loss": engine.loss_sum(local_loss) / global_tokens, "lr": lr,
                "grad_norm": grad_norm, "skipped": skipped, "tokens": global_tokens,
                "positions": self.objective.num_positions(batch) * engine.dp_size}

    # Tokens of steps not yet read on the host (a device tensor); reading tokens_seen folds them in.
    _pending_tokens: torch.Tensor | int = 0

    @property
    def tokens_seen(self) -> int:
        if isinstance(self._pending_tokens, torch.Tensor):
            self._tokens_seen += int(self._pending_tokens.round())
            self._pending_tokens = 0
        return self._tokens_seen

    @tokens_seen.setter
    def tokens_seen(self, value: int) -> None:
        self._tokens_seen, self._pending_tokens = int(value), 0

    def forward_backward(self, micro_batch: dict[str, torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
        """One micro-batch: forward, backward of ``loss_sum · scale``; returns the (local) summed loss as a
        float64 device tensor (no host read)."""
        with autocast(self.cfg.training.precision, self.device.type), self.engine.loss_context():
            loss_sum = self.objective.loss_sum(self.model, micro_batch)
            (loss_sum * scale).backward()
        return local_value(loss_sum.detach()).double()

    def _measured_step(self, probe_memory: bool = False) -> dict[str, Any]:
        """A training step with communication counted (bytes, calls per collective) and timed (profiler); the
        figures (``comm_*``) are labelled with ``comm_measured_step`` and carried until the next sample.
        ``probe_memory``: the process's first measured step, wrapped in the callbacks' ``measuring()``."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        counter = CommCounter()
        prof = profile(activities=activities)
        with silence_stderr():  # kineto prints a line at start and at stop
            prof.start()
        try:
            start = time.perf_counter()
            with counter, (self.callbacks.measuring() if probe_memory else contextlib.nullcontext()):
                record = self.train_step()
            seconds = time.perf_counter() - start
        finally:
            with silence_stderr():
                prof.stop()
        comm_s = comm_time_from_profile(prof)
        self.comm_stats = {**counter.summary(), "comm_share": min(comm_s / seconds, 1.0),
                           "comm_measured_step": self.step, "measured_step_s": seconds, "comm_s": comm_s,
                           "optimizer_s": optimizer_time_from_profile(prof)}
        self.callbacks.on_measured_step(prof, self.comm_stats)  # e.g. chrome traces, the memory probe's file
        return record

    @torch.no_grad()
    def evaluate(self) -> float:
        assert self.eval_loader is not None
        for part in self.model_parts:
            part.eval()
        self.eval_loader.reset()
        total, count = 0.0, 0
        for _ in range(self.cfg.training.eval_batches):
            batch = {k: v.to(self.device) for k, v in self.eval_loader.next_batch().items()}
            with autocast(self.cfg.training.precision, self.device.type):
                if self.engine.pipelined:
                    total += self.engine.pipeline_step(batch, 1.0, train=False)
                else:
                    with self.engine.loss_context():
                        total += local_value(self.objective.loss_sum(self.model, batch)).double()
            count += self.objective.num_loss_tokens(batch)
        for part in self.model_parts:
            part.train()
        return float(self.engine.loss_sum(total) / self.engine.dp_sum(count))

    def _finish_record(self, record: dict[str, Any], tokens: int | torch.Tensor, positions: int, steps: int,
                       seconds: float) -> dict[str, Any]:
        """``tokens``: the loss's targets (an SFT run's response tokens; a classifier's inputs); ``positions``:
        the input positions the model ran (padding and prompts included), which the FLOPs per token count, so
        MFU is taken from positions."""
        record, tokens = host_values(record), float(tokens)  # the log step is where device values are read
        tokens_per_s = tokens / seconds if seconds > 0 else float("nan")
        positions_per_s = positions / seconds if seconds > 0 else float("nan")
        mfu = positions_per_s * self.flops_per_token / (self.peak_flops * self.engine.dims.world_size)
        data_wait, self._data_wait_s = self._data_wait_s / steps, 0.0
        # Every rank's own timings, one all-gather of a few floats per log step: stragglers show here, not in
        # rank 0's step time (synchronous ranks all wait for the slowest)
        stats = self.comm_stats
        per_rank = gather_rank_floats([seconds / steps, data_wait, stats.get("measured_step_s", 0.0),
                                       stats.get("comm_s", 0.0), stats.get("optimizer_s", 0.0)], self.device)
        names = ("step_time_s", "data_wait_s", "measured_step_s", "comm_s", "optimizer_s")
        return {**record, "tokens_per_s": tokens_per_s, "positions_per_s": positions_per_s, "mfu": mfu,
                "tokens_seen": self.tokens_seen,
                "step_time_s": seconds / steps, "data_wait_s": data_wait, "memory_gib": self.memory.read_and_reset(),
                "memory_kind": self.memory.kind, **stats,
                "per_rank": {name: [r[i] for r in per_rank] for i, name in enumerate(names)}}

    def save(self) -> Path:
        state = {"tokens_seen": self.tokens_seen, "loader": self.train_loader.state_dict(),
                 "scaler": self.scaler.state_dict() if self.scaler else None,
                 "layout": self.engine.dims.describe(), **self.hooks.state_dict()}
        files = ({"tokenizer.json": Path(self.dataset.tokenizer_path)} if self.dataset is not None
                 else self.hooks.data.tokenizer_files)
        return self.checkpoints.save(self.step, self.model_parts, self.optimizers, state, config_to_toml(self.cfg),
                                     extra_files=files)

    def describe(self) -> str:
        mc, tc = self.cfg.model, self.cfg.training
        if self.given_model:
            params = sum(p.numel() for p in self.model.parameters())
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            what = f"given {type(self.model).__name__}: {params / 1e6:.2f}M params, {trainable / 1e6:.2f}M trainable"
        else:
            what = f"{mc.flavor}: {mc.num_params() / 1e6:.2f}M params, {mc.n_layers} layers, dim {mc.dim}"
        return (f"model {what}; "
                f"batch {tc.batch_size} x {self.cfg.data.seq_len} tokens ({self.accum_steps} micro-step(s) of "
                f"{self.micro_batch} per rank); layout {self.engine.dims.describe()} "
                f"(data parallel: {self.engine.describe_data_parallel()}); {tc.precision} on {self.device}; "
                f"peak {self.peak_flops / 1e9:.1f} GFLOP/s ({self.peak_source}); "
                f"{self.flops_per_token / 1e6:.1f} MFLOP/token")
