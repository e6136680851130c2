"""The environment local ranks start with: one compute thread each, and for CPU ranks glibc's fixed mmap threshold,
unless the user set either; and that threshold does what it is there for (freed tensors leave the process)."""

from __future__ import annotations

import os
import subprocess
import sys

from meshlm.distributed.launch import CPU_RANK_MALLOC_ENV, rank_environment

# A child that allocates and frees a 16 MiB tensor three times, then prints how much resident memory it kept.
RETAINED = """
import torch
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
base = rss()
for _ in range(3):
    t = torch.ones(16 * 2**20 // 4)
    del t
print((rss() - base) / 2**20)
"""


def test_cpu_ranks_get_the_malloc_setting_unless_the_user_set_it(monkeypatch):
    for key in ("OMP_NUM_THREADS", *CPU_RANK_MALLOC_ENV):
        monkeypatch.delenv(key, raising=False)
    assert rank_environment(cpu=True) == {"OMP_NUM_THREADS": "1", **CPU_RANK_MALLOC_ENV}
    assert rank_environment(cpu=False) == {"OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert rank_environment(cpu=True) == {}


def _retained_mib(extra_env: dict[str, str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", RETAINED], capture_output=True, text=True, env={**env, **extra_env},
                         timeout=120, check=True)
    return float(out.stdout.strip())


def test_the_setting_returns_freed_tensors_to_the_os():
    # glibc's default keeps the freed 16 MiB blocks in the heap once its dynamic threshold has grown past them
    # (measured: 32 MiB kept); with the fixed threshold they are unmapped (1.4 MiB: the interpreter's own growth).
    assert _retained_mib({}) > 12
    assert _retained_mib(CPU_RANK_MALLOC_ENV) < 8
