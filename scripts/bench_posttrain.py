"""Post-training step speed against pretraining, on the same shapes, measured in one process.

Four steps (forward + backward + AdamW on a model of --flavor) alternate round by round, so machine load hits
them alike; the median and the minimum step time of each are reported (on a shared machine the minimum is
the least disturbed), with ratios of the minima:

- pretrain: B rows of T tokens, no document ids (causal attention);
- sft: the same B × T tokens packed with --docs rows per sequence (position ids, block-diagonal attention);
- dpo (reference model): B/2 pairs = B rows of T tokens, plus the frozen reference's forward on them;
- dpo (precomputed): the same rows, reference log-probs read from a table (no reference forward).

Usage: python scripts/bench_posttrain.py --flavor small --batch 8 --seq-len 256 --rounds 7
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.models import build_model, flavor_config
from meshlm.objectives import NextTokenObjective, PreferenceObjective, SFTObjective


def batches(vocab: int, B: int, T: int, docs: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = torch.roll(ids, -1, dims=1)
    length = T // docs
    doc_ids = (torch.arange(T) // length).clamp(max=docs - 1).expand(B, T)  # (B, T)
    positions = torch.arange(T) - doc_ids[0] * length  # restart per row
    pretrain = {"input_ids": ids, "labels": labels}
    sft = {**pretrain, "position_ids": positions.expand(B, T), "document_ids": doc_ids}
    # pair-major (B/2, 2, T): the prompt is the first quarter, the response the rest
    pair_labels = labels.clone()
    pair_labels[:, : T // 4] = -100
    pairs = {"input_ids": ids.reshape(B // 2, 2, T), "labels": pair_labels.reshape(B // 2, 2, T),
             "index": torch.arange(B).reshape(2, B // 2).t()}
    return {"pretrain": pretrain, "sft": sft, "pairs": pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flavor", default="small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--docs", type=int, default=4, help="rows packed per SFT sequence")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    cfg = flavor_config(args.flavor)
    model = build_model(cfg, "cpu", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    data = batches(cfg.vocab_size, args.batch, args.seq_len, args.docs)
    dpo = PreferenceObjective(ObjectiveConfig())
    dpo.reference = copy.deepcopy(model).requires_grad_(False).eval()
    pre = PreferenceObjective(ObjectiveConfig(reference="precomputed"))
    pre.reference_table = torch.zeros(args.batch, 2)
    steps = {"pretrain": (NextTokenObjective(), data["pretrain"]), "sft": (SFTObjective(), data["sft"]),
             "dpo_reference_model": (dpo, data["pairs"]), "dpo_precomputed": (pre, data["pairs"])}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, (objective, batch) in steps.items():
            start = time.perf_counter()
            objective.loss_sum(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if round_:
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    fastest = {name: min(t) for name, t in times.items()}
    tokens = args.batch * args.seq_len
    print(json.dumps({
        "flavor": args.flavor, "batch": args.batch, "seq_len": args.seq_len, "docs_per_sequence": args.docs,
        "threads": torch.get_num_threads(), "rounds": args.rounds,
        "step_s_median": median, "step_s_min": fastest, "tokens_per_s": {k: tokens / v for k, v in fastest.items()},
        "sft_over_pretrain_tokens_per_s": fastest["pretrain"] / fastest["sft"],
        "dpo_model_over_sft_step": fastest["dpo_reference_model"] / fastest["sft"],
        "dpo_precomputed_over_sft_step": fastest["dpo_precomputed"] / fastest["sft"],
    }, indent=1))


if __name__ == "__main__":
    main()
