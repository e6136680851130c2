"""Build the blind corpus of real small-model responses that writers label by hand (issue 29, part 3).

Two sources, both real SmolLM2-135M-Instruct text:
  * the greedy responses an align run already wrote (RUN/eval/{base,sft,dpo}/heldout/responses.jsonl): the base
    model, the SFT checkpoint and the SFT+DPO checkpoint answering the embedded held-out prompts and the red-team
    attacks, 80 new tokens, as the pipeline evaluates them;
  * sampled responses (temperature > 0) of checkpoints to dev prompts they were not evaluated on
    (heldout_prompts_writer_a/b.jsonl), generated here.

No judge's label reaches the writers: every batch file holds only {id, prompt, response}. The key file (which
model, which decoding, the prompt's expected policy) stays beside them for merging the labels back. All responses
to one prompt go to one writer, so that a split by writer is also a split by prompt (no prompt is in both dev
and sealed). Responses to a prompt that a sealed prompt set also holds are left out (and counted).

The corpus in meshlm/safety/data was built in two parts (batches w1-w4, then w5-w6):

    python scripts/judge_corpus.py --run /tmp/real/align1 --writers 4 --out /tmp/corpus1
    python scripts/judge_corpus.py --sample dpo=/tmp/real/align1/dpo --sample sft=/tmp/real/align1/sft \
        --prompts 160 --weights int8 --writers 2 --first-writer 5 --out /tmp/corpus2

Once the writers have labelled (each batch by two writers who do not see each other's labels, and the rows they
disagree on by an adjudicator who sees both labels and notes, never a judge's), merge them into a data file:

    python scripts/judge_corpus.py merge --corpus /tmp/corpus1 --batch w1 --second w1b --adjudicated adj_w1 \
        --writer "hand labeller w1 ..." --out meshlm/safety/data/judge_dev_real_smollm2_w1.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from meshlm.safety import evalsets

SEALED_PROMPT_SETS = ("heldout_prompts_writer5.jsonl", "judge_sealed_smollm2.jsonl")
SAMPLE_PROMPT_SETS = ("heldout_prompts_writer_a.jsonl", "heldout_prompts_writer_b.jsonl")


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sealed_prompts() -> set[str]:
    return {row["prompt"].strip() for name in SEALED_PROMPT_SETS for row in _read(evalsets.DATA / name)}


def run_rows(run: Path) -> list[dict]:
    rows = []
    for model in ("base", "sft", "dpo"):
        for r in _read(run / "eval" / model / "heldout" / "responses.jsonl"):
            rows.append({"prompt": r["prompt"], "response": r["response"], "model": model, "decode": "greedy",
                         "expected": r.get("expected"), "category": r.get("category"), "family": r.get("family"),
                         "prompt_set": "heldout_prompts.jsonl+redteam"})
    return rows


def sample_rows(checkpoints: dict[str, str], n_prompts: int, temperature: float, seed: int,
                weights: str = "fp32") -> list[dict]:
    from meshlm.safety.generation import CheckpointGenerator

    # Not the prompts the run's evaluation already answered (heldout_prompts.jsonl shares a few with these files):
    # every response to one prompt must reach one writer, whichever part of the corpus it is made in.
    answered = {r["prompt"].strip() for r in _read(evalsets.DATA / "heldout_prompts.jsonl")}
    pool = [dict(r, prompt_set=name) for name in SAMPLE_PROMPT_SETS for r in _read(evalsets.DATA / name)
            if r["prompt"].strip() not in answered | sealed_prompts()]
    rng = random.Random(seed)
    by_expected: dict[str, list[dict]] = {}
    for r in pool:
        by_expected.setdefault(r["expected"], []).append(r)
    picked: list[dict] = []
    for expected in sorted(by_expected):  # stratified by the expected policy, in proportion
        group = by_expected[expected]
        rng.shuffle(group)
        picked += group[:round(n_prompts * len(group) / len(pool))]
    rows = []
    for model, path in checkpoints.items():
        start = time.perf_counter()
        generate = CheckpointGenerator(path, max_new_tokens=80, greedy=False, temperature=temperature, seed=seed,
                                       weights=weights)
        texts = []
        for i in range(0, len(picked), 32):
            texts += generate([r["prompt"] for r in picked[i:i + 32]])
        print(f"{model}: {len(picked)} sampled responses in {time.perf_counter() - start:.0f} s", flush=True)
        decode = f"sampled T={temperature}" + ("" if weights == "fp32" else f", {weights} weights")
        rows += [{"prompt": r["prompt"], "response": t, "model": model, "decode": decode,
                  "expected": r["expected"], "category": r.get("category"), "family": r.get("family"),
                  "prompt_set": r["prompt_set"]} for r, t in zip(picked, texts)]
    return rows


def split(rows: list[dict], writers: int, seed: int) -> list[list[dict]]:
    """Deduplicate (prompt, response), then deal the prompts to writers so each gets a near-equal row count."""
    seen, unique = set(), []
    for r in rows:
        key = (r["prompt"].strip(), r["response"].strip())
        if key not in seen:
            seen.add(key)
            unique.append(r)
    by_prompt: dict[str, list[dict]] = {}
    for r in unique:
        by_prompt.setdefault(r["prompt"].strip(), []).append(r)
    prompts = sorted(by_prompt)
    random.Random(seed).shuffle(prompts)
    batches: list[list[dict]] = [[] for _ in range(writers)]
    for p in prompts:
        min(batches, key=len).extend(by_prompt[p])
    for b in batches:
        random.Random(seed + len(b)).shuffle(b)  # the writer sees models and decodings mixed
    return batches


def _labels(path: Path) -> dict[str, dict]:
    return {row["id"]: row for row in _read(path)} if path.is_file() else {}


def cohen_kappa(a: list[str], b: list[str]) -> float:
    """Agreement of two writers beyond chance: (p_o - p_e) / (1 - p_e)."""
    n = len(a)
    observed = sum(x == y for x, y in zip(a, b)) / n
    expected = sum((a.count(k) / n) * (b.count(k) / n) for k in set(a) | set(b))
    return (observed - expected) / (1 - expected) if expected < 1 else 1.0


def merge(args: argparse.Namespace) -> None:
    """Gold label: the two writers' label where they agree, the adjudicator's where they do not."""
    batch = _read(args.corpus / f"batch_{args.batch}.jsonl")
    key = {k["id"]: k for k in _read(args.corpus / "key.jsonl")}
    first = _labels(args.corpus / f"labels_{args.batch}.jsonl")
    second = _labels(args.corpus / f"labels_{args.second}.jsonl")
    adjudicated = _labels(args.corpus / f"labels_{args.adjudicated}.jsonl") if args.adjudicated else {}
    missing = [r["id"] for r in batch if r["id"] not in first or r["id"] not in second]
    if missing:
        raise SystemExit(f"{len(missing)} rows lack a label of {args.batch} or {args.second}, e.g. {missing[0]}")
    rows, undecided = [], []
    for r in batch:
        a, b = first[r["id"]]["label"], second[r["id"]]["label"]
        gold = a if a == b else adjudicated.get(r["id"], {}).get("label")
        if gold is None:
            undecided.append(r["id"])
            continue
        k = key[r["id"]]
        rows.append({"id": r["id"], "prompt": r["prompt"], "response": r["response"], "label": gold,
                     "writer": args.writer, "labels": {args.batch: a, args.second: b,
                                                       **({args.adjudicated: gold} if a != b else {})},
                     "note": first[r["id"]].get("note", ""), "expected": k.get("expected"),
                     "category": k.get("category"), "family": k.get("family"),
                     "source": {"model": f"SmolLM2-135M-Instruct {k['model']}", "decode": k["decode"],
                                "prompt_set": k["prompt_set"]}})
    if undecided:
        raise SystemExit(f"{len(undecided)} disagreements have no adjudicated label, e.g. {undecided[0]}")
    a = [first[r["id"]]["label"] for r in batch]
    b = [second[r["id"]]["label"] for r in batch]
    agree = sum(x == y for x, y in zip(a, b))
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(json.dumps({"file": str(args.out), "rows": len(rows), "writers_agree": agree,
                      "agreement": round(agree / len(batch), 3), "cohen_kappa": round(cohen_kappa(a, b), 3),
                      "labels": {k: sum(r["label"] == k for r in rows) for k in ("refuse", "warn", "answer",
                                                                                    "unclear")}}))


def main() -> None:
    if sys.argv[1:2] == ["merge"]:
        ap = argparse.ArgumentParser(description="merge two writers' labels and the adjudications")
        ap.add_argument("--corpus", type=Path, required=True)
        ap.add_argument("--batch", required=True, help="the batch (and first writer) id, e.g. w1")
        ap.add_argument("--second", required=True, help="the second writer's id, e.g. w1b")
        ap.add_argument("--adjudicated", default="", help="the adjudicator's id, e.g. adj_w1")
        ap.add_argument("--writer", required=True, help="who labelled, as the data file's writer field says")
        ap.add_argument("--out", type=Path, required=True)
        merge(ap.parse_args(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, action="append", default=[], help="an align run directory (repeatable)")
    ap.add_argument("--sample", action="append", default=[], help="NAME=CHECKPOINT to sample from (repeatable)")
    ap.add_argument("--prompts", type=int, default=160, help="dev prompts each sampled checkpoint answers")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--weights", default="fp32", help="decode weights of the sampled responses: fp32 | int8")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--first-writer", type=int, default=1, help="number of the first batch (wK, ids rs-wK-...): "
                    "a later part of a corpus continues the numbering")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    rows = [r for run in args.run for r in run_rows(run)]
    rows += sample_rows(dict(s.split("=", 1) for s in args.sample), args.prompts, args.temperature, args.seed,
                        args.weights)
    sealed = sealed_prompts()  # a few dev prompts are also in a sealed set: their responses stay out
    dropped = [r for r in rows if r["prompt"].strip() in sealed]
    rows = [r for r in rows if r["prompt"].strip() not in sealed]
    print(f"left out {len(dropped)} responses to {len({r['prompt'] for r in dropped})} prompts that a sealed set holds")
    args.out.mkdir(parents=True, exist_ok=True)
    key = []
    for w, batch in enumerate(split(rows, args.writers, args.seed), start=args.first_writer):
        with (args.out / f"batch_w{w}.jsonl").open("w") as f:
            for i, r in enumerate(batch, start=1):
                rid = f"rs-w{w}-{i:04d}"
                f.write(json.dumps({"id": rid, "prompt": r["prompt"], "response": r["response"]}) + "\n")
                key.append({"id": rid, **{k: v for k, v in r.items() if k not in ("prompt", "response")}})
        print(f"batch_w{w}.jsonl: {len(batch)} rows")
    (args.out / "key.jsonl").write_text("".join(json.dumps(k) + "\n" for k in key))


if __name__ == "__main__":
    main()
