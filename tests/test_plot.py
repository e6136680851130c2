"""`meshlm plot`: several runs' curves overlaid in one PNG; a run without metrics is a one-line exit-2 error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from meshlm.cli.main import main


def write_run(folder: Path, scale: float, steps: int = 40) -> Path:
    folder.mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as f:
        for step in range(5, steps + 1, 5):
            record = {"step": step, "loss": scale * (3 + 5 * math.exp(-step / 15)), "lr": 3e-3 * min(1, step / 10),
                      "grad_norm": 1.0, "tokens_per_s": 1000 * scale + step, "mfu": 0.01, "memory_gib": 0.3 * scale}
            if step % 20 == 0:
                record["eval_loss"] = record["loss"] + 0.1
            f.write(json.dumps(record) + "\n")
        f.write("{truncated by a cra")  # a torn last line (a crash mid-write) is skipped
    return folder


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_plot_two_runs_writes_one_png(tmp_path, capsys):
    runs = [write_run(tmp_path / "baseline", 1.0), write_run(tmp_path / "wider", 0.8)]
    out = tmp_path / "cmp.png"
    code, stdout, _ = cli(["plot", *map(str, runs), "--out", str(out)], capsys)
    assert code == 0 and str(out) in stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".png"] == ["cmp.png"]  # no temp file left


def test_plot_one_run_defaults_into_the_run(tmp_path, capsys):
    run = write_run(tmp_path / "run", 1.0)
    code, _, _ = cli(["plot", str(run)], capsys)
    assert code == 0 and (run / "plots" / "curves.png").stat().st_size > 20_000


@pytest.mark.parametrize("content", [None, "", "not json\n"])
def test_plot_without_metrics_exits_2(tmp_path, capsys, content):
    good, bad = write_run(tmp_path / "good", 1.0), tmp_path / "bad"
    bad.mkdir()
    if content is not None:
        (bad / "metrics.jsonl").write_text(content)
    code, _, err = cli(["plot", str(good), str(bad), "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "bad/metrics.jsonl" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def test_plot_refuses_a_non_png_output(tmp_path, capsys):
    code, _, err = cli(["plot", str(write_run(tmp_path / "r", 1.0)), "--out", str(tmp_path / "x.pdf")], capsys)
    assert code == 2 and ".png" in err
