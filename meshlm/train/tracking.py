"""Experiment trackers beside ``metrics.jsonl``: TensorBoard, MLflow and Weights & Biases get the same records.

``metrics.jsonl`` stays the contract. Each tracker receives every logged record's numeric fields (strings such as
``memory_kind`` and the nested ``per_rank`` lists stay in the JSON file), keyed by the record's step. Which run
directories feed which trackers: ``metrics.tensorboard`` (on by default; TensorBoard is a dependency of meshlm),
``metrics.wandb`` and the list ``metrics.trackers``. MLflow and W&B come with ``pip install 'meshlm[tracking]'``;
a tracker whose package is missing is a config error (exit 2) raised before training starts, on every rank.

One tracker run per run directory, continued on resume: TensorBoard purges the steps after the checkpoint, W&B
resumes its run id (derived from the run directory's path), MLflow its run id (kept in ``RUN_DIR/mlflow_run.json``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from meshlm.config.schema import TRACKERS, MetricsConfig
from meshlm.errors import ConfigError
from meshlm.fileio import atomic_write_text

EXTRA = "pip install 'meshlm[tracking]'"
MLFLOW_RUN_FILE = "mlflow_run.json"


def selected_trackers(cfg: MetricsConfig) -> list[str]:
    """The trackers a run feeds, in :data:`TRACKERS` order."""
    on = set(cfg.trackers) | {name for name, flag in (("tensorboard", cfg.tensorboard), ("wandb", cfg.wandb)) if flag}
    return [name for name in TRACKERS if name in on]


def check_trackers(cfg: MetricsConfig) -> None:
    """Refuse a tracker whose package is not installed (no import: cheap, and safe before torch is loaded)."""
    for name in selected_trackers(cfg):
        if importlib.util.find_spec(name) is not None:
            continue
        if name == "tensorboard":  # a dependency of meshlm: only a broken install gets here
            raise ConfigError("metrics.tensorboard needs the tensorboard package (a dependency of meshlm: pip "
                              "install tensorboard), or set metrics.tensorboard=false")
        raise ConfigError(f"metrics.trackers includes '{name}', but the {name} package is not installed: {EXTRA} "
                          f"(or remove '{name}' from metrics.trackers{' and set metrics.wandb=false' * (name == 'wandb')})")


def numeric_fields(record: dict[str, Any]) -> dict[str, float]:
    """What a tracker logs of a record: the finite-or-infinite numbers (NaN, e.g. an unknown MFU, is left out)."""
    return {key: float(value) for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and value == value}


class _TensorBoard:
    def __init__(self, run_dir: Path, cfg: MetricsConfig, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start_step + 1)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.close()


class _WandB:
    """One W&B run per run directory (its id derives from the folder's path), offline or online (metrics.wandb_mode)."""

    def __init__(self, run_dir: Path, cfg: MetricsConfig, start_step: int) -> None:
        import wandb

        run_id = "meshlm-" + hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
        self._run = wandb.init(project=cfg.wandb_project, dir=str(run_dir), name=run_dir.name, id=run_id,
                               resume="allow", mode=cfg.wandb_mode)

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


class _MLflow:
    """An MLflow run through ``MlflowClient`` (no global active run). Without a tracking URI (config or
    $MLFLOW_TRACKING_URI) the store is MLflow's file store at RUN_DIR/mlruns, which MLflow 3 accepts only with
    MLFLOW_ALLOW_FILE_STORE=true: it is set for that default alone."""

    def __init__(self, run_dir: Path, cfg: MetricsConfig, start_step: int) -> None:
        from mlflow.tracking import MlflowClient

        uri = cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        self.run_id = self._resume_or_start(run_dir, uri, cfg.mlflow_experiment)

    def _resume_or_start(self, run_dir: Path, uri: str, experiment: str) -> str:
        saved_file = run_dir / MLFLOW_RUN_FILE
        saved = json.loads(saved_file.read_text()) if saved_file.is_file() else {}
        if saved.get("tracking_uri") == uri and saved.get("experiment") == experiment:
            self._client.update_run(saved["run_id"], status="RUNNING")
            return saved["run_id"]
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        run = self._client.create_run(experiment_id, run_name=run_dir.name,
                                      tags={"meshlm.run_dir": str(run_dir.resolve())})
        atomic_write_text(saved_file, json.dumps({"tracking_uri": uri, "experiment": experiment,
                                                  "run_id": run.info.run_id}))
        return run.info.run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


_OPEN = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}
assert set(_OPEN) == set(TRACKERS)


class Trackers:
    """The run's trackers (rank 0 only): ``log(record)`` sends one metrics.jsonl record to each."""

    def __init__(self, run_dir: Path, cfg: MetricsConfig, start_step: int) -> None:
        check_trackers(cfg)
        self._open = [_OPEN[name](Path(run_dir), cfg, start_step) for name in selected_trackers(cfg)]

    def log(self, record: dict[str, Any]) -> None:
        values = numeric_fields(record)
        for tracker in self._open:
            tracker.log(record["step"], values)

    def close(self) -> None:
        for tracker in self._open:
            tracker.close()
