"""Parallel degrees → one DeviceMesh with named dims ``pp × dp_replicate × dp_shard × tp``.

Single device is the case where every degree is 1: no process group, no mesh, and every parallel step a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshlm.config.schema import ParallelConfig
from meshlm.errors import ConfigError
from meshlm.models.config import ModelConfig

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    world_size: int

    @classmethod
    def from_config(cls, cfg: ParallelConfig, world_size: int) -> ParallelDims:
        others = cfg.dp_replicate * cfg.tp * cfg.pp
        dp_shard = cfg.dp_shard
        if dp_shard == -1:
            if world_size % others:
                raise ConfigError(f"parallel: dp_replicate ({cfg.dp_replicate}) x tp ({cfg.tp}) x pp ({cfg.pp}) = "
                                  f"{others} does not divide the {world_size} ranks; change the degrees or --nproc")
            dp_shard = world_size // others
        dims = cls(cfg.dp_replicate, dp_shard, cfg.tp, cfg.pp, world_size)
        if dims.product != world_size:
            raise ConfigError(f"parallel: dp_replicate ({cfg.dp_replicate}) x dp_shard ({dp_shard}) x tp ({cfg.tp}) "
                              f"x pp ({cfg.pp}) = {dims.product} ranks, but the job has {world_size}; make the "
                              "product equal the world size (dp_shard = -1 infers it)")
        return dims

    @property
    def product(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def describe(self) -> str:
        parts = [f"{name} {getattr(self, name)}" for name in ("pp", "dp_replicate", "dp_shard", "tp")
                 if getattr(self, name) > 1]
        return " x ".join(parts) if parts else "single device"

    def validate_model(self, model: ModelConfig, parallel: ParallelConfig, seq_len: int, local_batch: int) -> None:
        """Shape constraints between the layout and the model/batch, each with the key to change."""
        tp = self.tp
        if tp > 1:
            for name in ("n_heads", "n_kv_heads", "ffn_hidden_dim"):
                if getattr(model, name) % tp:
                    raise ConfigError(f"model.{name} ({getattr(model, name)}) is not divisible by parallel.tp ({tp}); "
                                      f"choose a tp that divides it")
            if model.vocab_size % tp and parallel.loss_parallel:
                raise ConfigError(f"model.vocab_size ({model.vocab_size}) is not divisible by parallel.tp ({tp}) "
                                  "for loss parallelism; set parallel.loss_parallel=false or pad the vocabulary")
            if parallel.sequence_parallel and seq_len % tp:
                raise ConfigError(f"data.seq_len ({seq_len}) is not divisible by parallel.tp ({tp}) for sequence "
                                  "parallelism; change data.seq_len or set parallel.sequence_parallel=false")
        if self.pp > 1:
            stages = self.pp * parallel.num_stages_per_rank
            if model.n_layers < stages:
                raise ConfigError(f"model.n_layers ({model.n_layers}) is fewer than the {stages} pipeline stages "
                                  f"(parallel.pp {self.pp} x stages_per_rank {parallel.num_stages_per_rank})")
            microbatches = parallel.microbatches or self.pp
            if local_batch % microbatches:
                raise ConfigError(f"each data-parallel rank gets {local_batch} sequences, not divisible into "
                                  f"parallel.microbatches ({microbatches}); change training.batch_size or "
                                  "parallel.microbatches")
            if parallel.num_stages_per_rank > 1 and parallel.pp_schedule in ("gpipe", "1f1b"):
                raise ConfigError(f"parallel.pp_schedule '{parallel.pp_schedule}' runs one stage per rank; use "
                                  "interleaved-1f1b (or interleaved-zb, zbv) for parallel.stages_per_rank > 1")
            if parallel.pp_schedule == "zbv" and parallel.num_stages_per_rank != 2:
                raise ConfigError("parallel.pp_schedule 'zbv' needs exactly 2 stages per rank")

    def build_meshes(self, device_type: str) -> dict[str, DeviceMesh] | None:
        """Sub-meshes by role: ``pp``, ``tp``, ``dp`` (replicate x shard flattened: data loading, loss
        reduction, DDP), ``dp_shard`` (FSDP) and ``hsdp`` (2D replicate x shard). None on a single device."""
        if not dist.is_initialized():
            if self.world_size > 1:
                raise ConfigError("a multi-rank layout needs a process group: launch with `meshlm train --nproc N` "
                                  "or torchrun")
            return None
        mesh = init_device_mesh(device_type, (self.pp, self.dp_replicate, self.dp_shard, self.tp),
                                mesh_dim_names=MESH_DIMS)
        hsdp = mesh[("dp_replicate", "dp_shard")]
        return {"pp": mesh["pp"], "tp": mesh["tp"], "dp_shard": mesh["dp_shard"], "hsdp": hsdp,
                "dp": hsdp._flatten("dp")}
