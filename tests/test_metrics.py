"""Honest metrics: memory per logging interval, a CPU peak that ranks sharing cores cannot over-count, and
collectives DTensor runs inside its own dispatch counted exactly."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from meshlm.train.flops import cpu_core_matmul_peak, cpu_peak_flops, cpu_share
from meshlm.train.metrics import IntervalMemory, process_peak_rss_bytes

LINUX = sys.platform.startswith("linux")


@pytest.mark.skipif(not LINUX, reason="/proc/self/clear_refs is Linux's")
def test_memory_is_the_peak_of_each_interval_not_of_the_process():
    memory = IntervalMemory(torch.device("cpu"))
    assert memory.kind == "interval_peak_rss"
    big = np.ones(256 * 2**20 // 8)  # 256 MiB, touched
    del big
    first = memory.read_and_reset()
    second = memory.read_and_reset()  # an interval with no large allocation
    assert first - second > 0.2  # GiB: the 256 MiB peak belongs to the first interval only
    assert process_peak_rss_bytes() / 2**30 >= first  # the lifetime peak survives the resets


def test_cpu_share_divides_the_cores_among_local_ranks(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cpu_share(num_threads=2, local_ranks=1) == 2  # one rank may use both cores
    assert cpu_share(num_threads=1, local_ranks=2) == 1
    assert cpu_share(num_threads=1, local_ranks=4) == 0.5  # 4 ranks on 2 cores: half a core each
    assert cpu_share(num_threads=4, local_ranks=1) == 2  # more threads than cores add nothing
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr("meshlm.train.flops.cpu_core_matmul_peak", lambda precision: 100e9)
    peak, source = cpu_peak_flops("fp32")
    assert peak == 50e9 and "4 rank(s)" in source  # the host's 2 cores x 100 GFLOP/s, over 4 ranks


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_core_peak_is_not_lowered_by_a_process_sharing_the_core():
    """The probe times its own CPU time: a busy process on the same core halves the wall-clock rate (the
    under-measured peak behind "mfu 165%") but not the per-core rate."""
    core = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        alone = cpu_core_matmul_peak("fp32", seconds=0.2, n=512)
        hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\n"
                                "while True: pass"])
        try:
            time.sleep(0.3)
            shared = cpu_core_matmul_peak("fp32", seconds=0.2, n=512)
        finally:
            hog.kill()
            hog.wait()
    finally:
        os.sched_setaffinity(0, saved)
    assert shared > 0.7 * alone, (shared, alone)


def test_a_run_directory_gets_tensorboard_events_and_interval_memory(debug_dataset, tmp_path):
    """TensorBoard is a dependency, so the default run writes events; every record labels its memory figure."""
    import json

    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    cfg = load_config(None, [f'data.path="{debug_dataset}"', "data.seq_len=32", "training.batch_size=4",
                             "training.steps=2", "training.eval_interval=0", "checkpoint.enabled=false",
                             "metrics.interval=1", "metrics.progress=plain"])
    run = tmp_path / "run"
    init_run_dir(run, config_to_toml(cfg), resume=False)
    Trainer(cfg, run).train()
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    expected = "interval_peak_rss" if LINUX else "process_peak_rss"
    assert all(r["memory_kind"] == expected and r["memory_gib"] > 0 for r in records)
    assert all(0 < r["mfu"] <= 1 for r in records)
    assert not any(k.startswith("comm") for r in records for k in r)  # one process: nothing sampled
