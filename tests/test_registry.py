"""The model registry: versions numbered per name, weights and file hashes, safety gates, refusal of changed files,
and the ``meshlm registry`` commands."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256
from meshlm.errors import CheckpointError, ConfigError
from meshlm.serve.registry import Registry, RegistryError, parse_ref, verify_files


def run_checkpoints(run: Path) -> tuple[Path, Path]:
    """The step-1 and step-2 checkpoints of the session's real two-step training run (conftest ``tiny_run``)."""
    step1, step2 = (run / "checkpoints" / f"step-{step:08d}" for step in (1, 2))
    assert step1.is_dir() and step2.is_dir()
    return step1, step2


def write_report(path: Path, passed: bool) -> Path:
    path.write_text(json.dumps({"gates": {"passed": passed, "refusal_rate": {"value": 0.97, "passed": passed}}}))
    return path


@pytest.fixture(scope="module")
def checkpoints(tiny_run) -> tuple[Path, Path]:
    return run_checkpoints(tiny_run)


def test_versions_hashes_gates(checkpoints, tmp_path):
    step1, step2 = checkpoints
    reg = Registry(tmp_path / "reg.sqlite")
    v1 = reg.add_checkpoint(step1, "tiny", write_report(tmp_path / "ok.json", True))
    v2 = reg.add_checkpoint(step2.parent.parent, "tiny")  # a run directory: its newest valid checkpoint
    v3 = reg.add_checkpoint(step1, "tiny", write_report(tmp_path / "bad.json", False))
    other = reg.add_checkpoint(step2, "other")
    assert [v.ref for v in reg.versions("tiny")] == ["tiny:v1", "tiny:v2", "tiny:v3"] and other.ref == "other:v1"
    assert v2.source == str(step2.resolve())
    assert v1.weights_sha256 == weights_sha256(model_from_checkpoint(step1)[0])  # what `meshlm inspect` prints
    assert v2.weights_sha256 != v1.weights_sha256 and v3.weights_sha256 == v1.weights_sha256
    manifest = json.loads((step1 / "manifest.json").read_text())["files"]
    assert {k: m["sha256"] for k, m in manifest.items()}.items() <= v1.files.items()
    assert v1.config["model"]["vocab_size"] == 2048 and v1.created_by and v1.created_at.endswith("Z")
    assert (v1.gate_status, v1.servable) == ("passed", True)
    assert (v2.gate_status, v2.servable) == ("no report", False)
    assert (v3.gate_status, v3.servable) == ("failed", False)
    assert v1.report["gates"]["refusal_rate"]["value"] == 0.97 and len(v1.report["sha256"]) == 64
    assert reg.get("tiny:2") == v2 and parse_ref("a.b-c:v12") == ("a.b-c", 12)
    with pytest.raises(RegistryError, match="tiny:v1, tiny:v2, tiny:v3"):
        reg.get("tiny:v9")
    with pytest.raises(RegistryError, match="NAME:vN"):
        reg.get("tiny")
    evaluated = {"source": str(step1), "gates": [{"gate": "refusal_rate>=0.9", "passed": True, "value": 0.95},
                                                 {"gate": "false_refusal_rate<=0.1", "passed": False}], "passed": False}
    (tmp_path / "eval.json").write_text(json.dumps(evaluated))  # `meshlm eval safety --gate ...` report.json
    assert not reg.add_checkpoint(step1, "tiny", tmp_path / "eval.json").servable
    evaluated["gates"][1]["passed"] = evaluated["passed"] = True
    (tmp_path / "eval.json").write_text(json.dumps(evaluated))
    passing = reg.add_checkpoint(step1, "tiny", tmp_path / "eval.json")
    assert passing.servable and passing.report["source"] == str(step1)
    (tmp_path / "eval.json").write_text(json.dumps({"gates": [], "passed": True}))  # no gate asked for
    assert reg.add_checkpoint(step1, "tiny", tmp_path / "eval.json").gate_status == "failed"
    (tmp_path / "nogates.json").write_text('{"summary": {}}')
    with pytest.raises(ConfigError, match="gates"):
        reg.add_checkpoint(step1, "tiny", tmp_path / "nogates.json")
    with pytest.raises(ConfigError, match="--name"):
        reg.add_checkpoint(step1, "bad:name")
    remote = reg.add_endpoint("http://127.0.0.1:9/v1/", "tiny", "upstream-model")
    assert (remote.ref, remote.kind, remote.source, remote.remote_model) == ("tiny:v7", "endpoint",
                                                                             "http://127.0.0.1:9/v1", "upstream-model")
    with pytest.raises(ConfigError, match="http"):
        reg.add_endpoint("ftp://x", "tiny")
    assert [v.ref for v in Registry(tmp_path / "reg.sqlite").versions("tiny")][-1] == "tiny:v7"  # persisted


def test_changed_files_are_refused_at_load(checkpoints, tmp_path):
    from meshlm.serve.local import LocalBackend

    step1, step2 = checkpoints
    folder = tmp_path / "ckpt"
    shutil.copytree(step1, folder)
    reg = Registry(tmp_path / "reg.sqlite")
    entry = reg.add_checkpoint(folder, "tiny")
    backend = LocalBackend.load(entry)  # intact: loads, weights hash checked
    backend.engine.close()
    shutil.rmtree(folder)
    shutil.copytree(step2, folder)  # a valid checkpoint (its own manifest matches), but other weights
    with pytest.raises(CheckpointError, match="sha256 recorded at registration"):
        verify_files(entry)
    with pytest.raises(CheckpointError, match="sha256"):
        LocalBackend.load(entry)
    shutil.rmtree(folder)
    with pytest.raises(CheckpointError, match="no longer exists"):
        verify_files(entry)


def test_cli_add_list_show(checkpoints, tmp_path, capfd):
    from meshlm.cli.main import main

    def run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as stop:
            main(list(argv))
        out, err = capfd.readouterr()
        return stop.value.code, out, err

    db = str(tmp_path / "reg.sqlite")
    code, out, _ = run("registry", "add", str(checkpoints[0]), "--name", "tiny", "--registry", db, "--report",
                       str(write_report(tmp_path / "r.json", True)), "--json")
    added = json.loads(out)
    assert code == 0 and added["ref"] == "tiny:v1" and added["gate_status"] == "passed" and added["servable"]
    code, out, _ = run("registry", "add", "--endpoint", "http://127.0.0.1:9/v1", "--name", "tiny", "--registry", db)
    assert code == 0 and "tiny:v2" in out and "not servable without --force" in out
    code, out, _ = run("registry", "list", "--registry", db, "--json")
    assert [(v["ref"], v["kind"]) for v in json.loads(out)] == [("tiny:v1", "checkpoint"), ("tiny:v2", "endpoint")]
    code, out, _ = run("registry", "show", "tiny:v1", "--registry", db, "--json")
    assert json.loads(out)["weights_sha256"] == added["weights_sha256"]
    code, _, err = run("registry", "show", "tiny:v7", "--registry", db)
    assert code == 2 and "tiny:v7 is not in the registry" in err and "Traceback" not in err
    code, _, err = run("registry", "add", "--name", "x", "--registry", db)
    assert code == 2 and "exactly one" in err
    code, _, err = run("serve", "--registry", db, "--model", "tiny:v2", "--port", "0")  # no report: refused
    assert code == 2 and "tiny:v2 (gates: no report)" in err and "--force" in err
    assert not (tmp_path / "audit.sqlite").exists()  # refused before anything was opened


def test_cli_add_adapter_of(tmp_path, capfd):
    """`registry add LORA_RUN --adapter-of NAME:vN` records both hashes; a LoRA run of another base, a plain
    checkpoint or an endpoint base are one-line errors with exit code 2."""
    from meshlm.cli.main import main
    from meshlm.serve.fixtures import random_adapter, random_checkpoints

    def run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as stop:
            main(list(argv))
        out, err = capfd.readouterr()
        return stop.value.code, out, err

    base, other = random_checkpoints(tmp_path / "base", steps=(1, 2))
    adapter = random_adapter(base, tmp_path / "lora", seed=1)
    db = str(tmp_path / "reg.sqlite")
    for ckpt, name in ((base, "base"), (other, "other")):
        assert run("registry", "add", str(ckpt), "--name", name, "--registry", db)[0] == 0
    code, out, _ = run("registry", "add", str(adapter), "--name", "chat", "--adapter-of", "base:v1", "--registry", db,
                       "--json")
    added = json.loads(out)
    assert code == 0 and added["kind"] == "adapter" and added["adapter"]["of"] == "base:v1"
    assert added["adapter"]["base_weights_sha256"] == Registry(db).get("base:v1").weights_sha256
    for argv, message in (([str(adapter), "--adapter-of", "other:v1"], "it is an adapter of another model"),
                          ([str(base), "--adapter-of", "base:v1"], "not a LoRA checkpoint"),
                          (["--endpoint", "http://127.0.0.1:9/v1", "--adapter-of", "base:v1"], "--adapter-of goes")):
        code, _, err = run("registry", "add", *argv, "--name", "x", "--registry", db)
        assert code == 2 and message in err and "Traceback" not in err, err
