"""Tensor parallelism (2 gloo ranks) on a tiny Gemma 3: post-norms, (1 + w) norms on q/k, GeGLU, sliding and global
layers with their own RoPE bases give the single-device logits and gradients, with and without sequence
parallelism. One KV head over two ranks is refused before anything is built, naming parallel.tp."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshlm.config.loader import load_config
from meshlm.distributed.parallel_dims import ParallelDims
from meshlm.distributed.teardown import end_rank
from meshlm.errors import ConfigError
from meshlm.models import ModelConfig, build_model, flavor_config

# fp32; TP sums the row-parallel projections and the head in two partial sums (another order than one device):
# ~1e-7 relative rounding differences over 3 layers, as tests/test_tp_masks.py.
ATOL = 1e-5


def _cfg() -> ModelConfig:
    gemma = {k: v for k, v in vars(flavor_config("gemma3-270m")).items() if k not in ("flavor",)}
    gemma.update(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, ffn_hidden_dim=64, vocab_size=96,
                 max_seq_len=32, sliding_window=3, layer_kinds=["sliding", "sliding", "global"], init_std=0.1,
                 query_pre_attn_scalar=12.0)
    return ModelConfig(**gemma)


def _model():
    model = build_model(_cfg(), "cpu", seed=0)
    with torch.no_grad():  # norms start at zero offsets: move them so their gradients and scales matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.linspace(-0.3, 0.3, p.shape[0]))
    return model


def _forward_backward(model) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)  # (2, 16, V)
    logits.float().logsumexp(-1).sum().backward()
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad
        grads[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return logits.detach(), grads


def _worker(rank: int, port: int, sequence_parallel: bool, result: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        from meshlm.distributed.tensor_parallel import apply_tensor_parallel

        model = _model()
        apply_tensor_parallel(model, init_device_mesh("cpu", (2,)), sequence_parallel=sequence_parallel,
                              use_loss_parallel=False)
        logits, grads = _forward_backward(model)
        result[rank] = (logits, {n: g for n, g in grads.items() if "norm" in n or "wq" in n or "w2" in n})
    finally:
        dist.destroy_process_group()
    end_rank(0)  # gloo's threads can abort an interpreter exit (meshlm/distributed/teardown.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp2_gemma3_matches_single_device(sequence_parallel):
    logits, grads = _forward_backward(_model())
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_worker, args=(_free_port(), sequence_parallel, result), nprocs=2, join=True)
        got = dict(result)
    for rank in (0, 1):
        tp_logits, tp_grads = got[rank]
        torch.testing.assert_close(tp_logits, logits, atol=ATOL, rtol=0)
        assert "layers.2.post_ffn_norm.weight" in tp_grads
        for name, grad in tp_grads.items():
            torch.testing.assert_close(grad, grads[name], atol=ATOL, rtol=1e-4, msg=name)


def test_one_kv_head_over_two_ranks_is_refused_naming_tp():
    cfg = load_config(None, ["model.flavor=\"gemma3-270m\"", "parallel.tp=2", "parallel.dp_shard=1",
                             "data.seq_len=64"])
    dims = ParallelDims.from_config(cfg.parallel, 2)
    with pytest.raises(ConfigError, match=r"model.n_kv_heads \(1\) is not divisible by parallel.tp \(2\)"):
        dims.validate_model(cfg.model, cfg.parallel, cfg.data.seq_len, 1)


GEMMA3_TINY = ["model.family=gemma3", "model.norm_unit_offset=true", "model.post_norms=true",
               "model.mlp_activation=gelu_tanh", "model.scale_embeddings=true", "model.qk_norm=true",
               "model.sliding_window=8", 'model.layer_kinds=["sliding","sliding","sliding","global"]',
               "model.rope_local_theta=10000.0", "model.rope_theta=1000000.0", "model.query_pre_attn_scalar=16.0",
               "model.tie_embeddings=true", "data.seq_len=32", "training.batch_size=4", "metrics.progress=plain",
               "metrics.tensorboard=false", "training.eval_interval=0"]


@pytest.mark.parametrize("layout", [["parallel.dp_shard=2"],
                                    ["parallel.pp=2", "parallel.dp_shard=1", "parallel.pp_schedule=1f1b",
                                     "parallel.microbatches=2"]], ids=["fsdp2", "pp2-1f1b"])
def test_gemma3_trains_like_one_device_under_fsdp_and_pipelining(layout, debug_dataset):
    """`meshlm diagnose parity` on the debug shape with Gemma 3's flags: 3 steps of FSDP2 / a 2-stage pipeline
    give the single device's losses and grad norms (the tool's own tolerances: 1e-4 / 1e-3 relative)."""
    import json

    from helpers import meshlm

    sets = [a for o in [*GEMMA3_TINY, f'data.path="{debug_dataset}"', *layout] for a in ("--set", o)]
    proc = meshlm("diagnose", "parity", *sets, "--nproc", "2", "--steps", "3", "--json")
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert report["ok"] and len(report["steps"]) == 3, report
