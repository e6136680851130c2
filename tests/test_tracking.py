"""metrics.trackers: MLflow (a local file store) receives the numeric fields of every metrics.jsonl record and a
resume continues its run; a tracker whose package is missing is a one-line config error naming the extra (exit 2)
that comes before torch is imported; an unknown tracker is refused with the valid names."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import ROOT

from meshlm.config.loader import config_to_toml, load_config
from meshlm.errors import ConfigError
from meshlm.train.run_dir import init_run_dir
from meshlm.train.tracking import MLFLOW_RUN_FILE, check_trackers, numeric_fields


def _cfg(dataset, *overrides):
    return load_config(None, [f'data.path="{dataset}"', "data.seq_len=32", "training.batch_size=4",
                              "training.eval_interval=0", "checkpoint.interval=2", "metrics.interval=1",
                              "metrics.tensorboard=false", "metrics.progress=plain", *overrides])


def test_mlflow_gets_the_records_of_metrics_jsonl_and_a_resume_continues_its_run(debug_dataset, tmp_path,
                                                                                  monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from meshlm.train.trainer import Trainer

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    cfg = _cfg(debug_dataset, "training.steps=2", 'metrics.trackers=["mlflow"]')
    init_run_dir(run, config_to_toml(cfg), resume=False)
    Trainer(cfg, run).train()
    first = json.loads((run / MLFLOW_RUN_FILE).read_text())
    assert first["tracking_uri"] == (run / "mlruns").resolve().as_uri()
    cfg = _cfg(debug_dataset, "training.steps=3", 'metrics.trackers=["mlflow"]')
    init_run_dir(run, config_to_toml(cfg), resume=True)
    Trainer(cfg, run, resume=True).train()
    assert json.loads((run / MLFLOW_RUN_FILE).read_text())["run_id"] == first["run_id"]  # the same MLflow run

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    client = MlflowClient(tracking_uri=first["tracking_uri"])
    logged = client.get_run(first["run_id"]).data.metrics
    assert set(logged) == set(numeric_fields(records[-1])) and {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(logged)
    for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(first["run_id"], key))
        assert history == [(r["step"], pytest.approx(float(r[key]))) for r in records], key
    assert client.get_run(first["run_id"]).info.status == "FINISHED"


def test_a_missing_tracker_package_names_the_extra(monkeypatch):
    """The package's absence is simulated for mlflow by hiding it from importlib.util.find_spec."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    cfg = load_config(None, ['metrics.trackers=["tensorboard", "mlflow"]'])
    with pytest.raises(ConfigError, match=r"'mlflow'.*pip install 'meshlm\[tracking\]'"):
        check_trackers(cfg.metrics)


def test_train_with_wandb_missing_exits_2_before_importing_torch(tmp_path):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here: the missing-package path needs a machine without it")
    code = ("import sys\nfrom meshlm.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    print('torch' in sys.modules, exc.code, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, "train", "--run-dir", str(tmp_path / "run"), "--set",
                           'metrics.trackers=["wandb"]'], capture_output=True, text=True, cwd=ROOT, timeout=120)
    *lines, last = proc.stderr.strip().splitlines()
    assert last == "False 2", proc.stderr
    assert len(lines) == 1 and "pip install 'meshlm[tracking]'" in lines[0] and "wandb" in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_unknown_tracker_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="metrics.trackers: unknown tracker.*'neptune'.*tensorboard, mlflow, wandb"):
        load_config(None, ['metrics.trackers=["neptune"]'])
