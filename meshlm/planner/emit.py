"""The recommended layout as a job config that ``meshlm train`` runs as is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshlm.config.loader import build_config
from meshlm.errors import ConfigError
from meshlm.planner.layout import Layout, Training
from meshlm.planner.model_spec import ModelSpec
from meshlm.sections import dumps_toml


def job_sections(spec: ModelSpec, layout: Layout, training: Training, device: str,
                 base: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Raw config sections: ``base`` (a TOML the model came from) with the layout written over it."""
    if spec.meshlm_model is None:
        raise ConfigError(f"--emit-config: '{spec.name}' is a {spec.arch.upper()}-style model, which exists only "
                          "in the planner (meshlm trains Llama-style models); plan a flavour, a meshlm TOML or "
                          "a Llama-style HF config.json")
    sections: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (base or {}).items()}
    model = sections.setdefault("model", {})
    model.update({k: v for k, v in spec.meshlm_model.items() if v is not None})
    if training.seq_len > int(model.get("max_seq_len", spec.max_seq_len)):
        model["max_seq_len"] = training.seq_len
    sections.setdefault("data", {})["seq_len"] = training.seq_len
    local = training.global_batch // layout.dp
    micro = 0 if layout.pp > 1 or layout.micro_batch_size in (0, local) else layout.micro_batch_size
    sections.setdefault("training", {}).update(
        batch_size=training.global_batch, micro_batch_size=micro, precision=training.precision,
        activation_checkpointing=layout.activation_checkpointing, device=device)
    parallel = {"dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard, "tp": layout.tp,
                "pp": layout.pp, "sequence_parallel": layout.sequence_parallel,
                "loss_parallel": layout.loss_parallel,
                "reshard_after_forward": "never" if layout.sharding == "zero2" else layout.reshard_after_forward}
    if layout.pp > 1:
        parallel.update(pp_schedule=layout.pp_schedule, stages_per_rank=layout.stages_per_rank,
                        microbatches=layout.microbatches)
    sections.setdefault("parallel", {}).update(parallel)
    return sections


def write_config(path: Path, spec: ModelSpec, layout: Layout, training: Training, device: str,
                 base: dict[str, Any] | None = None, header: str = "") -> Path:
    """Write the TOML after checking that meshlm's own loader and layout checks accept it."""
    from meshlm.distributed.parallel_dims import ParallelDims

    sections = job_sections(spec, layout, training, device, base)
    cfg = build_config(sections)  # raises ConfigError with the key to fix
    dims = ParallelDims.from_config(cfg.parallel, layout.world)
    dims.validate_model(cfg.model, cfg.parallel, cfg.data.seq_len, cfg.training.batch_size // dims.dp)
    text = "".join(f"# {line}\n" for line in header.splitlines()) + dumps_toml(sections)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
