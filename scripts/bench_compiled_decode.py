"""Experiment for issue 20 (not a meshlm code path yet): is a compiled decode step worth writing?

A static-shape batch-1 decode step on FastForward's packed weights — the preallocated KV cache is written with
index_copy_ at the step's position and read whole under a boolean position mask, so every step has the same
shapes — run eager and through torch.compile (inductor), against meshlm's FastForward; greedy tokens compared.

    OMP_NUM_THREADS=1 python scripts/bench_compiled_decode.py RUN [THREADS]
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.generate.decode import FastForward, _rms_norm, _rotate
from meshlm.models.fused import rope_tables
from meshlm.models.llama import KVCache

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
model, *_ = model_from_checkpoint(sys.argv[1])
model.eval()
ff = FastForward(model)
w = ff.weights(1)
cfg = ff.cfg
H, Hkv, Dh, L = w.n_heads, w.n_kv_heads, w.head_dim, len(w.layers)
SMAX, P, N = 128, 32, 48
prompt = torch.randint(0, w.embedding.shape[0], (1, P), generator=torch.Generator().manual_seed(0))

def static_step(tok, pos, mask, cos, sin, ks, vs):
    x = F.embedding(tok, w.embedding).view(1, -1)
    for layer, kc, vc in zip(w.layers, ks, vs):
        h = _rms_norm(x, layer.attention_norm, w.norm_eps)
        qkv = torch.mm(h, layer.wqkv[0]).view(1, 1, H + 2 * Hkv, Dh)
        qk, v = qkv[:, :, :H + Hkv], qkv[:, :, H + Hkv:]
        qk = _rotate(qk, cos, sin)
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v.transpose(1, 2))
        out = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
        x = torch.addmm(x, out.transpose(1, 2).reshape(1, H * Dh), layer.wo)
        h = _rms_norm(x, layer.ffn_norm, w.norm_eps)
        gu = torch.mm(h, layer.w13[0])
        Fh = gu.shape[1] // 2
        x = torch.addmm(x, F.silu(gu[:, :Fh]) * gu[:, Fh:], layer.w2)
    return torch.mm(_rms_norm(x, w.norm, w.norm_eps), w.head)

def run_fast():
    cache = [KVCache(1, Hkv, SMAX, Dh) for _ in range(L)]
    logits = ff(prompt, cache=cache, start_pos=0)
    toks = [int(logits[0, -1].argmax())]
    t0 = time.perf_counter()
    for i in range(N - 1):
        logits = ff(torch.tensor([[toks[-1]]]), cache=cache, start_pos=P + i)
        toks.append(int(logits[0, -1].argmax()))
    return toks, (time.perf_counter() - t0) / (N - 1)

def run_static(step):
    cache = [KVCache(1, Hkv, SMAX, Dh) for _ in range(L)]
    logits = ff(prompt, cache=cache, start_pos=0)  # prefill on the fast path
    ks, vs = [c.k for c in cache], [c.v for c in cache]
    toks = [int(logits[0, -1].argmax())]
    t0 = time.perf_counter()
    for i in range(N - 1):
        p = P + i
        mask = torch.zeros(1, 1, 1, SMAX, dtype=torch.bool)
        mask[..., :p + 1] = True
        c2, s2 = rope_tables(model.rope_cos[p:p + 1], model.rope_sin[p:p + 1])
        cos, sin = c2[None, :, None, :], s2[None, :, None, :]
        logits = step(torch.tensor([[toks[-1]]]), torch.tensor([p]), mask, cos, sin, ks, vs)
        toks.append(int(logits[0].argmax()))
    return toks, (time.perf_counter() - t0) / (N - 1)

with torch.no_grad():
    ref, t_fast = run_fast()
    st, t_static = run_static(static_step)
    t0 = time.perf_counter()
    compiled = torch.compile(static_step, dynamic=False)
    run_static(compiled)  # compile
    print("compile s", round(time.perf_counter() - t0, 1), flush=True)
    res = {"fast": [], "static": [], "compiled": []}
    for _ in range(3):
        a, t1 = run_fast(); b, t2 = run_static(static_step); c, t3 = run_static(compiled)
        res["fast"].append(t1); res["static"].append(t2); res["compiled"].append(t3)
        assert a == ref, "fast path changed"
    print("tokens equal static", st == ref, "compiled", c == ref)
    for k, v in res.items():
        print(k, "ms/step median", round(1000 * statistics.median(v), 2))
