"""Launching: ``meshlm train --nproc N`` starts N local ranks through torchrun's elastic agent, and each rank
(also under a plain ``torchrun ... -m meshlm train``) joins the process group from torchrun's environment.

With ``--max-restarts K`` the agent restarts every rank when one fails; restarted ranks resume from the newest
valid checkpoint of the run directory.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist

from meshlm.distributed.worker_env import in_worker
from meshlm.errors import ConfigError, UserError


class LaunchError(UserError):
    """A rank failed; the message says which one and why."""

    exit_code = 1


def process_group_backend(device: str, cuda_available: bool) -> str:
    """The backend for ``training.device``: NCCL only moves CUDA tensors, so a run on CPU tensors uses gloo
    even on a host with GPUs ("auto" resolves as the trainer resolves it: cuda when one is available)."""
    if device == "cuda" and not cuda_available:
        raise ConfigError("training.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if device == "cuda" or (device == "auto" and cuda_available):
        return "nccl"
    return "gloo"


def init_distributed(timeout_s: int, device: str = "auto") -> None:
    """Join the process group torchrun describes, with the backend ``training.device`` needs; no-op outside a
    worker."""
    if not in_worker() or dist.is_initialized():
        return
    backend = process_group_backend(device, torch.cuda.is_available())
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    try:
        dist.init_process_group(backend=backend, store=_attempt_store(rank, world, timeout), rank=rank,
                                world_size=world, timeout=timeout)
    except (RuntimeError, ValueError) as exc:  # DistStoreError / gloo connect errors are RuntimeErrors
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise LaunchError(f"rank {rank} could not join the {world}-rank process group at "
                          f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within "
                          f"parallel.timeout_s={timeout_s}s ({reason}); check that every rank started and can "
                          "reach that address") from None


def _attempt_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store, namespaced by restart attempt.

    After an elastic restart the agent's store still holds the previous attempt's keys, and gloo's full-mesh
    connect can read a dead rank's address from them ("connectFullMesh failed ... Connection refused"; the same
    class of failure as pytorch/pytorch#167288). A prefix per attempt gives every attempt clean keys.
    """
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(host, port, world, is_master=not agent_hosts_store and rank == 0, timeout=timeout,
                         multi_tenant=not agent_hosts_store)
    return dist.PrefixStore(f"meshlm/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


# glibc's malloc for CPU ranks: serve every block over 128 KiB by mmap, so a freed tensor's memory goes back to the
# OS at once. With glibc's default the threshold grows to 32 MiB after the first large free and freed buffers stay
# in the heap: an fsdp8 run of a 240M model peaked at 7.4 B/param per rank, 2.78 with this setting
# (docs/benchmarks.md, "Peak memory per rank").
CPU_RANK_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def rank_environment(cpu: bool) -> dict[str, str]:
    """Variables the ranks get unless the user set them: one compute thread per rank (as torchrun does) and, for
    CPU ranks, the allocator setting above."""
    wanted = {"OMP_NUM_THREADS": "1", **(CPU_RANK_MALLOC_ENV if cpu else {})}
    return {k: v for k, v in wanted.items() if k not in os.environ}


def launch_local(nproc: int, max_restarts: int, worker_args: list[str], timeout_s: int,
                 cpu: bool | None = None, entry: tuple[str, ...] = ("-m", "meshlm")) -> None:
    """Run ``python -m meshlm <worker_args>`` on ``nproc`` local ranks under the elastic agent. ``cpu``: whether
    the ranks compute on CPU (default: when this host has no CUDA device). ``entry``: what ``python`` runs instead
    of ``-m meshlm`` (the test suite's batched parity worker, tests/parity_batch.py)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Set in this process's environment, which the spawned ranks inherit (glibc reads MALLOC_* as a process starts).
    os.environ.update(rank_environment(not torch.cuda.is_available() if cpu is None else cpu))
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"meshlm-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", rdzv_configs={"timeout": timeout_s},
        max_restarts=max_restarts, monitor_interval=0.2, start_method="spawn")
    try:
        elastic_launch(config, entrypoint=sys.executable)(*entry, *worker_args)
    except ChildFailedError as exc:
        error = LaunchError(describe_failures(exc, max_restarts))
        if all(f.exitcode == 2 for f in exc.failures.values()):
            error.exit_code = 2  # every rank refused the same user mistake (already printed by the ranks)
        raise error from None


def describe_failures(exc, max_restarts: int) -> str:
    lines = []
    for rank, failure in sorted(exc.failures.items()):
        code = failure.exitcode
        if code < 0:
            try:
                why = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                why = f"was killed by signal {-code}"
        else:
            why = f"exited with code {code}"
        message = failure.message if isinstance(failure.message, str) else ""
        useful = message and message != "<N/A>" and not message.startswith("To enable traceback")
        detail = f": {message.strip().splitlines()[-1]}" if useful else ""
        lines.append(f"rank {rank} (pid {failure.pid}) {why}{detail}")
    restarts = f" after {max_restarts} restart(s)" if max_restarts else " (no restarts: pass --max-restarts K)"
    return f"training failed{restarts}: " + "; ".join(lines)
