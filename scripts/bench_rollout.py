"""Rollout decode throughput: meshlm's batched KV-cache sampler (meshlm/generate/rollout.py) vs transformers'
``generate`` on the same weights (the meshlm model's state dict under its HF names) and the same left-padded
batch of prompts of different lengths, measured in the same process. Prints a markdown table (JSON with --json).

    python scripts/bench_rollout.py                         # CPU: debug and small, batch 16, 64 new tokens
    python scripts/bench_rollout.py --device cuda --flavors small --batch 64

Both decode greedily for exactly --new tokens per row (no eos: HF with min_new_tokens, meshlm with no eos id),
so they do the same work; tokens/s counts generated tokens (batch x new) over the whole call (prefill included).
Runs alternate meshlm and HF, one each in turn, and the median time is reported, so that load from other
processes falls on both alike. ``agree`` is the share of generated tokens equal in both (fp32 rounding can flip
a near-tie and everything after it in that row).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import left_pad, rollout
from meshlm.interop.hf import hf_name
from meshlm.models import build_model, flavor_config


def hf_twin(model: torch.nn.Module):
    """transformers' LlamaForCausalLM holding ``model``'s weights."""
    from meshlm.interop.hf_config import transformers_model

    cfg = model.cfg
    twin = transformers_model(cfg)
    state = {hf_name(k, cfg.family): v for k, v in model.state_dict().items()
             if not (cfg.tie_embeddings and k == "output.weight")}
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k or (cfg.tie_embeddings and k == "lm_head.weight") for k in missing)
    return twin.to(next(model.parameters()).device).eval()


def prompts_for(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 8..32 tokens (different lengths, so padding matters)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 33, (batch,), generator=g)
    return [torch.randint(10, vocab, (int(n),), generator=g).tolist() for n in lengths]


def bench(flavor: str, batch: int, new: int, repeats: int, device: torch.device) -> dict:
    model = build_model(flavor_config(flavor), device, seed=0).eval()
    twin = hf_twin(model)
    prompts = prompts_for(batch, model.cfg.vocab_size)
    ids, mask = left_pad(prompts, 0, device)
    sampling = SamplingParams(max_tokens=new, temperature=0.0)  # greedy, no stop ids

    def ours() -> torch.Tensor:
        return rollout(model, prompts, sampling, device=device).response_ids

    @torch.no_grad()
    def theirs() -> torch.Tensor:
        out = twin.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=new, min_new_tokens=new,
                            do_sample=False, pad_token_id=0, eos_token_id=None)
        return out[:, ids.shape[1]:]

    times: dict[str, list[float]] = {"meshlm": [], "hf": []}
    outputs = {}
    for i in range(repeats + 1):  # the first round warms up both
        for name, fn in (("meshlm", ours), ("hf", theirs)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            outputs[name] = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times[name].append(time.perf_counter() - start)
    tokens = batch * new
    ours_tps = tokens / statistics.median(times["meshlm"])
    hf_tps = tokens / statistics.median(times["hf"])
    agree = float((outputs["meshlm"] == outputs["hf"]).float().mean())
    return {"flavor": flavor, "batch": batch, "new_tokens": new, "meshlm_tokens_per_s": ours_tps,
            "hf_tokens_per_s": hf_tps, "ratio": ours_tps / hf_tps, "agree": agree}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavors", default="debug,small")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new", type=int, default=64, help="tokens generated per row")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    import transformers

    rows = [bench(f, args.batch, args.new, args.repeats, device) for f in args.flavors.split(",")]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.processor() or 'cpu'}, "
          f"{torch.get_num_threads()} threads, device {device}")
    print("| flavour | batch | new tokens | meshlm tok/s | HF generate tok/s | ratio | tokens equal |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['flavor']} | {r['batch']} | {r['new_tokens']} | {r['meshlm_tokens_per_s']:.0f} | "
              f"{r['hf_tokens_per_s']:.0f} | {r['ratio']:.2f} | {r['agree']:.1%} |")


if __name__ == "__main__":
    main()
