"""``meshlm redteam``: seed prompts -> attack prompts (JSONL), offline families and an optional model attacker."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError
from meshlm.safety.attacks import names as attack_families
from meshlm.safety.judges import add_judge_arguments


def register(sub, add_config_args) -> None:
    p = sub.add_parser("redteam", help="turn seed prompts into jailbreak attacks (JSONL with family and category)")
    p.add_argument("--spec", help="a behaviour spec (default: the embedded one); its refuse/warn seed prompts are "
                                  "the default input")
    p.add_argument("--prompts", help="seed prompts instead of the spec's: JSONL rows {prompt, category?, expected?}")
    p.add_argument("--out", required=True, help="where to write the attacks (JSONL)")
    p.add_argument("--families", help=f"comma-separated families (default: all): {','.join(attack_families())}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-prompt", type=int, default=1, help="attacks per seed prompt and family (distinct templates)")
    p.add_argument("--split", choices=["train", "eval"], help="draw only from the training or the held-out share "
                                                              "of each family's templates (default: all)")
    p.add_argument("--attacker", help="also rewrite each seed with a model: a checkpoint path or an endpoint URL")
    p.add_argument("--attacker-model", help="the attacker endpoint's model name")
    p.add_argument("--target", help="keep only rewrites that succeed against this model (checkpoint or URL)")
    p.add_argument("--target-model", help="the target endpoint's model name")
    add_judge_arguments(p, "the target's replies")
    p.add_argument("--attack-rounds", type=int, default=1, help="attacker retries for seeds not yet broken")
    p.add_argument("--max-new-tokens", type=int, default=128, help="for the attacker's and the target's replies")
    p.add_argument("--json", action="store_true", help="print a summary as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from meshlm.fileio import atomic_write_text
    from meshlm.safety.redteam import attack, check_families, read_seed_prompts, seeds_from_spec
    from meshlm.safety.spec import load_spec

    if args.target and not args.attacker:
        raise ConfigError("--target judges the attacker's rewrites: give --attacker too (a checkpoint or URL)")
    families = check_families(args.families.split(",")) if args.families is not None else None
    spec = load_spec(args.spec)
    seeds = read_seed_prompts(args.prompts, spec) if args.prompts else seeds_from_spec(spec)
    rows = attack(seeds, families, args.seed, per_prompt=args.per_prompt, split=args.split)
    attacker_stats = generation = None
    if args.attacker:
        attacker_rows, attacker_stats, generation = _model_attack(args, seeds)
        rows += attacker_rows
    atomic_write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    summary = {"out": str(args.out), "seeds": len(seeds), "rows": len(rows),
               "by_family": dict(Counter(r["family"] for r in rows)),
               "by_category": dict(Counter(str(r["category"]) for r in rows)),
               "seed": args.seed, "split": args.split, "attacker": attacker_stats,
               "generation": generation}
    if args.json:
        emit(summary, indent=1)
    else:
        print(f"wrote {len(rows)} attacks from {len(seeds)} seed prompts to {args.out}")
        for family, n in summary["by_family"].items():
            print(f"  {family:<20} {n}")
        if attacker_stats:
            print(f"  attacker: {attacker_stats}")
        for who, block in (generation or {}).items():
            print(f"  {who} generation: {block['prompts']} prompts in {block['seconds']:.1f} s, "
                  f"{block['new_tokens']} new tokens, {block['tokens_per_s']} tokens/s")
    return 0


def _model_attack(args: argparse.Namespace, seeds: list) -> tuple[list[dict], dict[str, int], dict]:
    """The attacker's rows and counts, and the ``generation`` block of the attacker (and target): seconds,
    prompts, new tokens and tokens/s (meshlm.safety.generation.Measured)."""
    from meshlm.safety.chatgen import generate_fn
    from meshlm.safety.generation import Measured
    from meshlm.safety.redteam import model_attack

    # The attacker samples (temperature 0.8) so that each round tries something new; the target is greedy.
    rewrite = generate_fn(args.attacker, args.attacker_model, max_new_tokens=args.max_new_tokens, temperature=0.8,
                          seed=args.seed, flag="--attacker")
    rewrite = Measured(rewrite)
    target = judge = None
    if args.target:
        target = Measured(generate_fn(args.target, args.target_model, max_new_tokens=args.max_new_tokens,
                                      flag="--target"))
        judge = build_judge(args)
    rows, stats = model_attack(seeds, rewrite, target=target, judge=judge, rounds=args.attack_rounds, seed=args.seed)
    generation = {"attacker": rewrite.stats(), **({"target": target.stats()} if target is not None else {})}
    return rows, stats, generation


def build_judge(args: argparse.Namespace):
    """``(prompts, responses) -> labels`` from the judge plug-in ``--judge`` names (meshlm.safety.judges)."""
    from meshlm.safety.judges import judge_options, make_judge

    return make_judge(args.judge, judge_options(args)).label
