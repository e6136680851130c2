"""GPU-readiness checked on CPU: the process-group backend follows training.device, the training step never waits
for the device, AdamW picks fused/foreach by device, selective AC does not repeat tensor-parallel collectives,
and deterministic mode sets torch's switches."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from meshlm.config.loader import config_to_toml, load_config
from meshlm.distributed.activation_checkpoint import must_save
from meshlm.distributed.launch import process_group_backend
from meshlm.distributed.teardown import end_rank
from meshlm.errors import ConfigError
from meshlm.train.determinism import CUBLAS_WORKSPACE, configure_determinism
from meshlm.train.optim import build_optimizer, implementation_for
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer


def test_backend_follows_training_device():
    assert process_group_backend("cpu", cuda_available=True) == "gloo"  # CPU tensors on a GPU host
    assert process_group_backend("cpu", cuda_available=False) == "gloo"
    assert process_group_backend("cuda", cuda_available=True) == "nccl"
    assert process_group_backend("auto", cuda_available=True) == "nccl"
    assert process_group_backend("auto", cuda_available=False) == "gloo"
    with pytest.raises(ConfigError, match="training.device"):
        process_group_backend("cuda", cuda_available=False)


def test_adamw_kernel_follows_device():
    assert implementation_for("cuda") == {"fused": True, "foreach": False}
    assert implementation_for("cpu") == {"fused": True, "foreach": False}  # measured faster (docs/benchmarks.md)
    assert implementation_for("mps") == {"fused": False, "foreach": True}
    from meshlm.config.schema import OptimizerConfig

    opt = build_optimizer(torch.nn.Linear(4, 4), OptimizerConfig())
    assert opt.defaults["fused"] is True and not opt.defaults["foreach"]


class _HostReads(TorchDispatchMode):
    """Counts device-to-host scalar reads (.item(), float(t), bool(t) all dispatch to _local_scalar_dense),
    except inside optimizer.step: AdamW keeps its step counter on the host unless fused/capturable."""

    def __init__(self) -> None:
        super().__init__()
        self.reads, self.in_optimizer = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and not self.in_optimizer:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _count_host_reads(trainer: Trainer) -> int:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    mode = _HostReads()
    pre = register_optimizer_step_pre_hook(lambda *a: setattr(mode, "in_optimizer", True))
    post = register_optimizer_step_post_hook(lambda *a: setattr(mode, "in_optimizer", False))
    try:
        with mode:
            record = trainer.train_step()
    finally:
        pre.remove()
        post.remove()
    assert isinstance(record["grad_norm"], torch.Tensor) and isinstance(record["loss"], torch.Tensor)
    return mode.reads


@pytest.mark.parametrize("precision,expected", [("fp32", 0), ("fp16", 1)])
def test_train_step_reads_nothing_back_from_the_device(debug_dataset, tmp_path, precision, expected):
    """Accumulation (2 micro-steps) and clipping that bites: fp32 reads no scalar back, fp16 exactly one (the
    loss scaler's finiteness check)."""
    cfg = load_config(None, [f'data.path="{debug_dataset}"', "data.seq_len=16", "training.batch_size=4",
                             "training.micro_batch_size=2", "training.steps=2", "training.eval_interval=0",
                             "training.max_grad_norm=0.01", f"training.precision={precision}",
                             "checkpoint.enabled=false", "metrics.tensorboard=false", "metrics.progress=plain"])
    init_run_dir(tmp_path / "run", config_to_toml(cfg), resume=False)
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.train_step()  # warm-up: lazy initialisation (optimizer state) happens once
    assert _count_host_reads(trainer) == expected
    assert trainer.tokens_seen == 2 * 4 * 16  # pending device counts fold in when read


def test_clip_is_exact_below_the_threshold_and_scales_above():
    from meshlm.config.schema import ParallelConfig
    from meshlm.distributed.engine import Engine

    engine = Engine(ParallelConfig(dp_shard=1), torch.device("cpu"))
    model = torch.nn.Linear(3, 2)
    grads = [torch.randn_like(p) for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    norm = engine.clip_grad_norm_([model], 1e6)
    assert torch.allclose(norm, torch.cat([g.flatten() for g in grads]).double().norm())
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))  # coefficient exactly 1
    engine.clip_grad_norm_([model], 0.5)
    clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert abs(float(clipped) - 0.5) < 1e-5


def test_selective_policy_saves_collectives():
    functional = torch.ops._c10d_functional
    for op in (functional.all_gather_into_tensor.default, functional.reduce_scatter_tensor.default,
               functional.all_reduce.default, functional.wait_tensor.default):
        assert must_save(op)
    assert must_save(torch.ops.aten.mm.default)
    assert not must_save(torch.ops.aten.mul.Tensor)  # element-wise ops are recomputed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, world: int, port: int, out: str) -> None:
    """tp=2 + sequence/loss parallel: collectives of one forward+backward per AC mode; fused vs foreach AdamW
    on the DTensor parameters."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshlm.distributed.activation_checkpoint import apply_activation_checkpointing
    from meshlm.distributed.comm import CommCounter
    from meshlm.distributed.tensor_parallel import apply_tensor_parallel, loss_context
    from meshlm.models import build_model, flavor_config
    from meshlm.objectives import NextTokenObjective

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    tokens = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(0))
    result: dict = {}
    for mode in ("none", "selective", "full"):
        model = build_model(flavor_config("debug"), "cpu", seed=0)
        apply_tensor_parallel(model, mesh, sequence_parallel=True, use_loss_parallel=True)
        apply_activation_checkpointing(model, mode)
        with loss_context(True, True):  # warm-up: DTensor's sharding propagation must not run under the counter
            NextTokenObjective.loss_from_logits(model(tokens), tokens).backward()
        model.zero_grad(set_to_none=True)  # the counted pass assigns gradients, as the warm-up did
        counter = CommCounter()
        with counter, loss_context(True, True):
            NextTokenObjective.loss_from_logits(model(tokens), tokens).backward()
        result[mode] = sum(counter.calls.values())
    after = {}
    for fused in (False, True):  # the same DTensor weights and gradients through each kernel
        copies = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
        for copy, p in zip(copies, model.parameters()):
            copy.grad = p.grad.clone()
        torch.optim.AdamW(copies, lr=1e-2, fused=fused, foreach=not fused).step()
        after[fused] = [c.detach().full_tensor() for c in copies]
    result["adamw_max_diff"] = max(float((a - b).abs().max()) for a, b in zip(after[False], after[True]))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    end_rank(0)  # gloo's threads can abort an interpreter exit (meshlm/distributed/teardown.py)


def test_selective_ac_does_not_recompute_tp_collectives(tmp_path):
    out = tmp_path / "counts.json"
    mp.spawn(_tp_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    counts = json.loads(out.read_text())
    assert counts["selective"] == counts["none"] > 0  # saved outputs: no collective runs twice
    assert counts["full"] > counts["none"]  # full AC recomputes the block, collectives included (the counter sees it)
    assert counts["adamw_max_diff"] < 1e-6  # fused AdamW takes DTensor (TP) parameters like foreach


def test_deterministic_mode_sets_torch_switches(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    try:
        configure_determinism(False, torch.device("cuda"))
        assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        configure_determinism(True, torch.device("cuda"))  # sets flags only; needs no GPU
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
