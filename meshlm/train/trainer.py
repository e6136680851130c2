"""The one Trainer: objective-agnostic; owns precision, accumulation, clipping, eval, metrics and checkpoints.

train() → train_step() → forward_backward() on each micro-batch. The objective turns a micro-batch into a summed
loss; the trainer divides by the loss-token count of the whole global batch, so accumulation (and data
parallelism) give the gradient of one big batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from meshlm.checkpoint.manager import CheckpointManager, find_latest_valid
from meshlm.config.loader import config_to_toml
from meshlm.config.schema import DataConfig, JobConfig
from meshlm.data import SequenceLoader, TokenDataset, default_cache_dir, ensure_embedded_dataset
from meshlm.distributed.parallelize import parallelize_model
from meshlm.errors import ConfigError, DataError
from meshlm.models import build_model
from meshlm.objectives import build_objective
from meshlm.train.flops import model_flops_per_token, peak_flops
from meshlm.train.metrics import MetricsLogger, peak_memory_gib
from meshlm.train.optim import build_optimizer
from meshlm.train.precision import DynamicLossScaler, autocast
from meshlm.train.schedule import lr_at


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def open_training_data(cfg: DataConfig, vocab_size: int) -> TokenDataset:
    """The prepared dataset at ``data.path``, or the embedded corpus prepared on first use."""
    if cfg.path:
        dataset = TokenDataset(cfg.path)
    else:
        cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        dataset = TokenDataset(ensure_embedded_dataset(cache, vocab_size, num_workers=cfg.num_workers))
    if dataset.vocab_size > vocab_size:
        raise ConfigError(f"the tokenizer of {cfg.path or 'the embedded corpus'} has {dataset.vocab_size} tokens but "
                          f"model.vocab_size is {vocab_size}; raise model.vocab_size to at least "
                          f"{dataset.vocab_size}")
    return dataset


@dataclass
class DataParallelInfo:
    """Where this process sits among the data-parallel ranks (single device: rank 0 of 1)."""

    rank: int = 0
    size: int = 1


class Trainer:
    def __init__(self, cfg: JobConfig, run_dir: Path, *, resume: bool = False, stop_at: int | None = None,
                 dp: DataParallelInfo | None = None, rank: int = 0) -> None:
        self.cfg, self.run_dir, self.stop_at, self.rank = cfg, Path(run_dir), stop_at, rank
        self.dp = dp or DataParallelInfo()
        self.device = resolve_device(cfg.training.device)
        tc = cfg.training
        self.dataset = open_training_data(cfg.data, cfg.model.vocab_size)
        self.micro_batch, self.accum_steps = self._micro_batching()
        self.model = parallelize_model(build_model(cfg.model, self.device, seed=tc.seed), tc)
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.objective = build_objective(tc.objective)
        self.scaler = DynamicLossScaler() if tc.precision == "fp16" else None
        self.train_loader = SequenceLoader(self.dataset, "train", cfg.data.seq_len, tc.batch_size,
                                           dp_rank=self.dp.rank, dp_size=self.dp.size, seed=tc.seed)
        self.eval_loader = self._eval_loader()
        self.checkpoints = CheckpointManager(self.run_dir, cfg.checkpoint.keep_last, rank=rank)
        self.step, self.tokens_seen = 0, 0
        if resume:
            self._resume()
        self.flops_per_token = model_flops_per_token(cfg.model, cfg.data.seq_len)
        self.peak_flops, self.peak_source = peak_flops(self.device, tc.precision)

    # ----------------------------------------------------------------------------------------------- set-up
    def _micro_batching(self) -> tuple[int, int]:
        tc = self.cfg.training
        if tc.batch_size % self.dp.size:
            raise ConfigError(f"training.batch_size ({tc.batch_size}) must be divisible by the {self.dp.size} "
                              "data-parallel ranks")
        local = tc.batch_size // self.dp.size
        micro = tc.micro_batch_size or local
        if local % micro:
            raise ConfigError(f"each data-parallel rank gets {local} sequences, not a multiple of "
                              f"training.micro_batch_size ({micro})")
        return micro, local // micro

    def _eval_loader(self) -> SequenceLoader | None:
        if not self.cfg.training.eval_interval:
            return None
        try:
            return SequenceLoader(self.dataset, "val", self.cfg.data.seq_len, self.micro_batch * self.dp.size,
                                  dp_rank=self.dp.rank, dp_size=self.dp.size, seed=0, shuffle=False)
        except DataError as exc:
            raise DataError(f"{exc}; held-out evaluation needs a larger val split, or set "
                            "training.eval_interval=0") from None

    def _resume(self) -> None:
        path = find_latest_valid(self.checkpoints.root, warn=self._say)
        if path is None:
            self._say(f"no checkpoint in {self.checkpoints.root}; starting from step 0")
            return
        state = self.checkpoints.load(path, self.model, self.optimizer)
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.train_loader.load_state_dict(state["loader"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self._say(f"resumed from {path} at step {self.step}")

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    # ------------------------------------------------------------------------------------------------ loop
    def train(self) -> dict[str, Any]:
        tc, mc = self.cfg.training, self.cfg.metrics
        last = min(tc.steps, self.stop_at) if self.stop_at else tc.steps
        logger = MetricsLogger(self.run_dir, mc, tc.steps, self.step, rank=self.rank)
        logger.message(self.describe())
        window_tokens, window_steps, window_time, record = 0, 0, 0.0, {}
        try:
            while self.step < last:
                start = time.perf_counter()
                record = self.train_step()
                window_time += time.perf_counter() - start
                window_tokens += record.pop("tokens")
                window_steps += 1
                if self.eval_loader is not None and self._due(self.step, tc.eval_interval, last):
                    record["eval_loss"] = self.evaluate()
                if self._due(self.step, mc.interval, last) or "eval_loss" in record:
                    logger.log(self._finish_record(record, window_tokens, window_steps, window_time))
                    window_tokens, window_steps, window_time = 0, 0, 0.0
                else:
                    logger.advance(self.step)
                if self.cfg.checkpoint.enabled and self._due(self.step, self.cfg.checkpoint.interval, last):
                    self.save()
        finally:
            logger.close()
        return {"step": self.step, "tokens_seen": self.tokens_seen, **record}

    @staticmethod
    def _due(step: int, interval: int, last: int) -> bool:
        return step == last or (interval > 0 and step % interval == 0)

    def train_step(self) -> dict[str, Any]:
        tc = self.cfg.training
        batch = self.train_loader.next_batch()
        micro_batches = [{k: v[i * self.micro_batch:(i + 1) * self.micro_batch].to(self.device)
                          for k, v in batch.items()} for i in range(self.accum_steps)]
        num_tokens = sum(self.objective.num_loss_tokens(mb) for mb in micro_batches)
        global_tokens = self._global_sum(float(num_tokens))
        loss_scale = self.scaler.scale if self.scaler else 1.0
        loss_sum = 0.0
        for mb in micro_batches:
            loss_sum += self.forward_backward(mb, global_tokens, loss_scale)
        grad_norm, skipped = self._clip_and_check(loss_scale)
        lr = lr_at(self.step, self.cfg.optimizer.lr, tc.steps, self.cfg.schedule)
        if not skipped:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        tokens = int(global_tokens)
        self.tokens_seen += tokens
        return {"step": self.step, "loss": self._global_sum(loss_sum) / global_tokens, "lr": lr,
                "grad_norm": grad_norm, "skipped": skipped, "tokens": tokens}

    def forward_backward(self, micro_batch: dict[str, torch.Tensor], global_tokens: float, loss_scale: float) -> float:
        with autocast(self.cfg.training.precision, self.device.type):
            loss_sum = self.objective.loss_sum(self.model, micro_batch)
        # Gradient of (sum over this micro-batch) / (tokens in the whole global batch): summed over micro-batches
        # (and averaged over data-parallel ranks by the engine, hence * dp size) this is the global-mean gradient.
        (loss_sum * (loss_scale * self.dp.size / global_tokens)).backward()
        return float(loss_sum.detach())

    def _clip_and_check(self, loss_scale: float) -> tuple[float, bool]:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if loss_scale != 1.0:
            torch._foreach_mul_([p.grad for p in params], 1.0 / loss_scale)
        max_norm = self.cfg.training.max_grad_norm or math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        skipped = self.scaler.update(grad_norm) if self.scaler else not math.isfinite(grad_norm)
        return grad_norm, skipped

    def _global_sum(self, value: float) -> float:
        return value  # single device; the distributed engine reduces over the data-parallel ranks

    @torch.no_grad()
    def evaluate(self) -> float:
        assert self.eval_loader is not None
        self.model.eval()
        self.eval_loader.reset()
        total, count = 0.0, 0.0
        for _ in range(self.cfg.training.eval_batches):
            batch = {k: v.to(self.device) for k, v in self.eval_loader.next_batch().items()}
            with autocast(self.cfg.training.precision, self.device.type):
                total += float(self.objective.loss_sum(self.model, batch))
            count += self.objective.num_loss_tokens(batch)
        self.model.train()
        return self._global_sum(total) / self._global_sum(count)

    def _finish_record(self, record: dict[str, Any], tokens: int, steps: int, seconds: float) -> dict[str, Any]:
        tokens_per_s = tokens / seconds if seconds > 0 else float("nan")
        world = self.dp.size
        mfu = tokens_per_s * self.flops_per_token / (self.peak_flops * world)
        return {**record, "tokens_per_s": tokens_per_s, "mfu": mfu, "tokens_seen": self.tokens_seen,
                "step_time_s": seconds / steps,
                "memory_gib": peak_memory_gib(self.device)}

    def save(self) -> Path:
        state = {"tokens_seen": self.tokens_seen, "loader": self.train_loader.state_dict(),
                 "scaler": self.scaler.state_dict() if self.scaler else None}
        return self.checkpoints.save(self.step, self.model, self.optimizer, state, config_to_toml(self.cfg),
                                     extra_files={"tokenizer.json": Path(self.dataset.tokenizer_path)})

    def describe(self) -> str:
        mc, tc = self.cfg.model, self.cfg.training
        params = mc.num_params()
        return (f"model {mc.flavor}: {params / 1e6:.2f}M params, {mc.n_layers} layers, dim {mc.dim}; "
                f"batch {tc.batch_size} x {self.cfg.data.seq_len} tokens ({self.accum_steps} micro-step(s) of "
                f"{self.micro_batch}); {tc.precision} on {self.device}; peak {self.peak_flops / 1e9:.1f} GFLOP/s "
                f"({self.peak_source}); {self.flops_per_token / 1e6:.1f} MFLOP/token")
