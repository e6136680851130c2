"""Tensor parallelism (2 gloo ranks, sequence parallel) with the attention-mask and qk-norm paths: packed rows
with document/position ids, a sliding window and Qwen3's q/k norms give the single-device logits and gradients."""

from __future__ import annotations

import dataclasses
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshlm.distributed.teardown import end_rank
from meshlm.models import build_model, flavor_config
from meshlm.models.llama import positions_from_documents

# fp32; TP splits the head and SwiGLU sums into two partial sums added by an all-reduce / reduce-scatter, a
# different summation order than one device: rounding differences of ~1e-7 relative, accumulated over 2 layers.
ATOL = 1e-5


def _cfg():
    base = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, vocab_size=97, max_seq_len=32,
                init_std=0.1, qk_norm=True, sliding_window=3)
    return dataclasses.replace(flavor_config("debug"), **base)


def _inputs():
    tokens = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    docs = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [3] * 9 + [4] * 7])  # (2, 16) packed rows
    return tokens, docs, positions_from_documents(docs)


def _forward_backward(model) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tokens, docs, positions = _inputs()
    logits = model(tokens, position_ids=positions, document_ids=docs)  # (2, 16, V)
    logits.float().logsumexp(-1).sum().backward()
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad
        grads[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return logits.detach(), grads


def _worker(rank: int, port: int, result: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        from meshlm.distributed.tensor_parallel import apply_tensor_parallel

        model = build_model(_cfg(), "cpu", seed=0)
        apply_tensor_parallel(model, init_device_mesh("cpu", (2,)), sequence_parallel=True, use_loss_parallel=False)
        logits, grads = _forward_backward(model)
        result[rank] = (logits, {n: g for n, g in grads.items() if "norm" in n or "wq" in n})
    finally:
        dist.destroy_process_group()
    end_rank(0)  # gloo's threads can abort an interpreter exit (meshlm/distributed/teardown.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp2_packed_rows_window_and_qk_norm_match_single_device():
    logits, grads = _forward_backward(build_model(_cfg(), "cpu", seed=0))
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_worker, args=(_free_port(), result), nprocs=2, join=True)
        got = dict(result)
    for rank in (0, 1):
        tp_logits, tp_grads = got[rank]
        torch.testing.assert_close(tp_logits, logits, atol=ATOL, rtol=0)
        assert {n for n in tp_grads if "q_norm" in n} == {"layers.0.attention.q_norm.weight",
                                                           "layers.1.attention.q_norm.weight"}
        for name, grad in tp_grads.items():  # q/k norm grads summed over both ranks' heads; wq sharded rows
            torch.testing.assert_close(grad, grads[name], atol=ATOL, rtol=1e-4, msg=name)
