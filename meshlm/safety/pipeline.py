"""``meshlm align``: spec → data → (base) → SFT → DPO → red team → judged evaluation → gates, in one run dir.

RUN_DIR/
  align.resolved.toml   the config that ran
  data/                 sft.jsonl, preference.jsonl, eval_prompts.jsonl, labelled_responses.jsonl, manifest.json
  base/                 the pretrained base (a short pretraining on the embedded corpus), unless base.checkpoint
  sft/, dpo/            the trained checkpoints (ordinary meshlm run directories)
  sft-lora/, dpo-lora/  with sft.lora_rank / dpo.lora_rank > 0: the adapters' runs, merged into sft/, dpo/
  eval/<model>/<set>/   responses.jsonl, report.json, report.md per model (base, sft, dpo) and prompt set
  report.json, report.md, plots/safety.png

Prompt sets: ``heldout`` is the hand-written held-out file (direct prompts and a few hand-written attacks) plus
the red-team attacks (``meshlm.safety.redteam``, held-out templates) built from its refuse prompts; the gates
apply to it. ``synthetic`` is ``data/eval_prompts.jsonl`` (subjects held out of the synthetic training data).
Every stage whose output is complete is reused with ``resume=True``, so a stopped run continues where it was.
Every generation and judge label goes through the content-addressed cache (meshlm/safety/cache.py): what depends
only on a model's weights and its inputs — above all the base model's evaluation, factual answers and
self-distilled targets — is computed once and served to every later run that asks the same. Each stage's wall
time, what the cache served it and the share spent training are in report.json (``stages``, ``training_share``).
"""

from __future__ import annotations

import functools
import json
import random
import time
from pathlib import Path
from typing import Any, Callable

from meshlm.errors import CheckpointError, ConfigError
from meshlm.fileio import atomic_write_text
from meshlm.safety.align_config import AlignConfig, lora_table
from meshlm.safety.cache import AlignCache
from meshlm.safety.metrics import HEADLINE
from meshlm.safety.synth import SynthSizes

Log = Callable[[str], None]
MODELS = ("base", "sft", "dpo")
SETS = ("heldout", "synthetic")


def make_dataset(spec_path: str, out: Path, seed: int, sizes=None, heldout: str = "",
                 eval_group_fraction: float = 0.1, facts: str = "") -> dict:
    """``meshlm align data``: synthesise, split and write the dataset files; returns the manifest."""
    from meshlm.safety.datasets import (leak_check_facts, leak_check_files, leak_check_prompts, split_examples,
                                         write_dataset)
    from meshlm.safety.spec import load_spec
    from meshlm.safety.synth import synthesize

    spec = load_spec(spec_path or None)
    sizes = sizes or SynthSizes()
    files = leak_check_files(heldout, facts)
    split = split_examples(synthesize(spec, seed, sizes), seed, eval_group_fraction,
                           extra_eval_prompts=leak_check_prompts(files), max_refuse_share=sizes.max_refuse_share,
                           facts=leak_check_facts(files))
    extra = {"seed": seed, "spec": spec.path, "spec_version": spec.version, "spec_sha256": spec.sha256,
             "near_duplicate_check_against": [str(f) for f in files]}
    return write_dataset(split, out, extra)


def _train(raw: dict[str, Any], run_dir: Path, resume: bool, log: Log) -> Path:
    """One meshlm training run in this process; a finished run is reused when resuming."""
    from meshlm.config.loader import build_config, config_to_toml, inherit_init_from
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.plots import plot_loss
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    cfg = build_config(inherit_init_from(raw))  # the model's shape from checkpoint.init_from (SFT, DPO)
    final = run_dir / "checkpoints" / f"step-{cfg.training.steps:08d}"
    toml = config_to_toml(cfg)
    if resume and final.is_dir():
        _check_reusable(run_dir, final, toml)
        log(f"{run_dir.name}: complete, reused ({final})")
        return run_dir
    init_run_dir(run_dir, toml, resume=resume)
    Trainer(cfg, run_dir, resume=resume, callbacks=run_callbacks(cfg)).train()
    plot_loss(run_dir)
    return run_dir


def _check_reusable(run_dir: Path, final: Path, toml: str) -> None:
    """A finished stage is reused on resume only if it was trained as this run asks (its resolved config is the
    same but for the paths into the run directory, which move with it, and for keys added to meshlm since, read at
    their defaults; and it is not a LoRA merge where every weight is to train): a stage trained otherwise, and everything made from it, would be reported under settings
    it never had."""
    import tomllib

    from meshlm.checkpoint.manager import read_train_state
    from meshlm.config.loader import build_config, config_to_toml

    def settings(text: str) -> dict:
        table = tomllib.loads(text)
        try:  # a stage written before a key existed reads with that key at its default (what it trained with)
            table = tomllib.loads(config_to_toml(build_config(table)))
        except Exception:  # noqa: BLE001 - a config this meshlm cannot read: compared as written (and so refused)
            pass
        table.get("data", {}).pop("path", None)
        table.get("checkpoint", {}).pop("init_from", None)
        return table

    saved = run_dir / "config.resolved.toml"
    merged = read_train_state(final).get("merged_from")
    if merged or not saved.is_file() or settings(saved.read_text(encoding="utf-8")) != settings(toml):
        why = (f"holds LoRA adapters merged from {merged}, and this run trains every weight" if merged else
               "was trained with another configuration than this run asks (a changed "
               f"{run_dir.name.removesuffix('-lora')}.* key?)")
        raise ConfigError(f"--resume: the finished stage {run_dir} {why}; resume with the same settings, or use a "
                          f"new --run-dir (or delete {run_dir} and the stages and eval/ results after it)")


def _train_stage(raw: dict[str, Any], lora: dict[str, Any], run_dir: Path, resume: bool, log: Log) -> Path:
    """A training stage (SFT, DPO) into ``run_dir``: every weight trained, or with ``lora["rank"] > 0`` adapters
    trained in ``run_dir``-lora/ on the stage's start model (its ``checkpoint.init_from``) and merged into a full
    checkpoint in ``run_dir``, so the next stage, its frozen reference and every evaluation load one plain model."""
    if not lora["rank"]:
        return _train(raw, run_dir, resume, log)
    from meshlm.train.lora_merge import merge_lora_checkpoint, merged_is_current

    adapters = _train({**raw, "lora": lora}, run_dir.with_name(f"{run_dir.name}-lora"), resume, log)
    if resume and merged_is_current(adapters, run_dir):
        log(f"{run_dir.name}: merged adapters reused ({run_dir})")
        return run_dir
    start = time.perf_counter()
    merged = merge_lora_checkpoint(adapters, run_dir)
    log(f"{run_dir.name}: LoRA adapters of {adapters} merged into {merged} in {time.perf_counter() - start:.0f} s")
    return run_dir


def _common(cfg: AlignConfig) -> dict[str, Any]:
    return {"metrics": {"interval": 20, "progress": "plain", "tensorboard": False},
            "checkpoint": {"interval": 0, "keep_last": 1}}


def train_base(cfg: AlignConfig, run_dir: Path, resume: bool, log: Log) -> Path:
    raw = {**_common(cfg), "model": cfg.model.overrides(), "data": {"seq_len": cfg.model.seq_len},
           "optimizer": {"lr": cfg.base.lr}, "schedule": {"warmup_steps": min(20, cfg.base.steps // 5)},
           "training": {"steps": cfg.base.steps, "batch_size": cfg.base.batch_size, "eval_interval": 0}}
    return _train(raw, run_dir, resume, log)


def sft_rows(cfg: AlignConfig, data: Path, base: Path, resume: bool, log: Log, judge, cache: AlignCache) -> Path:
    """The SFT file: ``data/sft.jsonl``, or with ``sft.answer_targets = "base"`` ``data/sft_self.jsonl`` (the
    safe rows' targets in the base model's words, :mod:`meshlm.safety.selfdistill`)."""
    if cfg.sft.answer_targets == "template":
        return data / "sft.jsonl"
    from meshlm.safety.selfdistill import write_self_distilled

    def write(out: Path, generate) -> dict:
        return write_self_distilled(data, out, generate, judge.label, limit=cfg.sft.answer_rows, seed=cfg.data.seed,
                                    batch_size=cfg.eval.batch_size, warn_targets=cfg.sft.warn_targets,
                                    warn_referral=cfg.data.warn_referral)

    return _generated_file("self-distilled SFT rows", data / "sft_self.jsonl", data / "self_distill.json", base, cfg,
                           resume, log, write, judge.name, cache)


def generators(cache: AlignCache, checkpoint: Path, max_new_tokens: int) -> Callable[[str], Callable]:
    """``for_weights(weights) -> generate(prompts)``: the checkpoint's greedy generators, one per weight format
    over one model loaded at the first call (the cache's keys hold the weights' sha256), through ``cache``."""
    from meshlm.safety.generation import CheckpointGenerator

    loaded: list[CheckpointGenerator] = []

    def view(weights: str) -> CheckpointGenerator:
        if not loaded:
            loaded.append(CheckpointGenerator(checkpoint, max_new_tokens=max_new_tokens))
        return loaded[0].using(weights, "generation.weights")

    return lambda weights: cache.generator(lambda: view(weights))


def _generated_file(what: str, out: Path, summary: Path, model: Path, cfg: AlignConfig, resume: bool, log: Log,
                    write: Callable[[Path, Callable], dict], judge: str, cache: AlignCache) -> Path:
    """A data file made from ``model``'s answers (``generation.weights``, through the cache) by ``write(out,
    generate) -> counts``, labelled by the judge named ``judge``; its counts and that name go to ``summary`` (and
    so to the report); both are reused when resuming, whatever the judge then (the stages after them trained on
    these labels)."""
    if resume and out.is_file() and summary.is_file():
        log(f"{what}: reused {out}")
        return out
    generate = generators(cache, model, cfg.eval.max_new_tokens)(cfg.generation.weights)
    counts = {"judge": judge, **write(out, generate)}
    atomic_write_text(summary, json.dumps(counts, indent=1) + "\n")
    log(f"{what}: {counts}")
    return out


def train_sft(cfg: AlignConfig, rows: Path, init_from: Path, run_dir: Path, resume: bool, log: Log) -> Path:
    s = cfg.sft
    raw = {**_common(cfg), "model": cfg.model.overrides(), "data": {"seq_len": cfg.model.seq_len,
           "path": str(rows)}, "optimizer": {"lr": s.lr}, "schedule": {"warmup_steps": s.warmup_steps},
           "training": {"objective": "sft", "steps": s.steps, "batch_size": s.batch_size, "eval_interval": 0},
           "objective": {"packing": True, "eval_fraction": 0.02}, "checkpoint": {**_common(cfg)["checkpoint"],
           "init_from": str(init_from)}}  # fmt: skip
    return _train_stage(raw, lora_table(s), run_dir, resume, log)


def on_policy_data(cfg: AlignConfig, data: Path, sft: Path, resume: bool, log: Log, judge,
                   cache: AlignCache) -> Path:
    """``data/preference_on_policy.jsonl`` (see :mod:`meshlm.safety.onpolicy`; its answers labelled by ``judge``,
    ``eval.judge``'s), or ``preference.jsonl`` when ``dpo.on_policy_prompts`` and ``dpo.probe_prompts`` are both 0."""
    d = cfg.dpo
    if not d.on_policy_prompts and not d.probe_prompts:
        return data / "preference.jsonl"
    from meshlm.safety.onpolicy import write_on_policy_preferences

    def write(out: Path, generate) -> dict:
        return write_on_policy_preferences(data, out, generate, judge.label, prompts=d.on_policy_prompts,
                                           offline=d.offline_pairs, seed=cfg.data.seed, batch_size=cfg.eval.batch_size,
                                           probes=_probes(cfg, data), exclude=tuple(d.on_policy_exclude),
                                           warn_repeat=d.warn_pair_repeat, answer_repeat=d.answer_pair_repeat,
                                           refuse_repeat=d.refuse_pair_repeat)

    return _generated_file("on-policy pairs", data / "preference_on_policy.jsonl", data / "on_policy.json", sft, cfg,
                           resume, log, write, judge.name, cache)


def _probes(cfg: AlignConfig, data: Path) -> list[dict]:
    """Probe rows for on-policy pairs (:func:`meshlm.safety.onpolicy.probe_rows`), leak-checked against the
    synthetic evaluation prompts and every held-out file."""
    if not cfg.dpo.probe_prompts:
        return []
    from meshlm.safety.datasets import leak_check_files, leak_check_prompts, read_heldout
    from meshlm.safety.onpolicy import probe_rows
    from meshlm.safety.spec import load_spec

    manifest = json.loads((data / "manifest.json").read_text())
    avoid = [r["prompt"] for r in read_heldout(data / "eval_prompts.jsonl")]
    avoid += leak_check_prompts(leak_check_files(cfg.eval.heldout, _own_facts(cfg)))
    return probe_rows(load_spec(cfg.spec.path or None), manifest.get("eval_groups", []), avoid,
                      cfg.dpo.probe_prompts, cfg.data.seed)


def train_dpo(cfg: AlignConfig, data: Path, init_from: Path, run_dir: Path, resume: bool, log: Log,
              pairs: Path | None = None) -> Path:
    d = cfg.dpo
    raw = {**_common(cfg), "model": cfg.model.overrides(), "data": {"seq_len": cfg.model.seq_len,
           "path": str(pairs or data / "preference.jsonl")}, "optimizer": {"lr": d.lr}, "schedule": {"warmup_steps": 5},
           "training": {"objective": "dpo", "steps": d.steps, "batch_size": d.batch_size, "eval_interval": 0},
           "objective": {"loss_type": d.loss_type, "beta": d.beta, "rpo_alpha": d.rpo_alpha, "reference": "model",
                         "eval_fraction": 0.02},
           "checkpoint": {**_common(cfg)["checkpoint"], "init_from": str(init_from)}}  # fmt: skip
    return _train_stage(raw, lora_table(d), run_dir, resume, log)


def evaluation_sets(cfg: AlignConfig, data: Path) -> dict[str, list[dict]]:
    """The held-out set (hand-written prompts + red-team attacks on its refuse prompts) and the synthetic one."""
    from meshlm.safety.datasets import HELDOUT_FILE
    from meshlm.safety.evaluate import read_prompt_rows
    from meshlm.safety.redteam import SeedPrompt, attack

    held = read_prompt_rows(cfg.eval.heldout or HELDOUT_FILE)
    seeds = [SeedPrompt(r["prompt"], r.get("category"), "refuse") for r in held
             if r["expected"] == "refuse" and (r.get("family") or "direct") == "direct"]
    attacks = attack(seeds, cfg.redteam.families, seed=cfg.redteam.seed, split="eval")
    rng = random.Random(f"redteam:{cfg.redteam.seed}")
    picked = []
    for family in cfg.redteam.families:
        rows = [r for r in attacks if r["family"] == family]
        picked += rng.sample(rows, min(cfg.redteam.per_family, len(rows)))
    heldout = held + [{k: r[k] for k in ("prompt", "expected", "category", "family")} for r in picked]
    return {"heldout": heldout, "synthetic": read_prompt_rows(data / "eval_prompts.jsonl")}


def evaluate_model(name: str, checkpoint: Path, sets: dict[str, list[dict]], cfg: AlignConfig, out: Path,
                   gates: str | None, log: Log, resume: bool = False, judge=None,
                   cache: AlignCache | None = None) -> dict[str, dict]:
    """Greedy responses to every set, judged by ``judge`` (``eval.judge``'s, built here when None); writes
    eval/<name>/<set>/. With ``resume``, a set whose report exists for the same prompts and judge is reused. The
    held-out set (gated) decodes in fp32, the others with ``generation.weights``; answers and labels go through
    ``cache`` (none: no cache)."""
    from meshlm.safety.evaluate import evaluate_safety, write_outputs
    from meshlm.safety.judges import make_judge

    cache = cache or AlignCache(None)
    for_weights = generators(cache, checkpoint, cfg.eval.max_new_tokens)
    judge = judge or make_judge(cfg.eval.judge)
    reports = {}
    for set_name, rows in sets.items():
        done = out / name / set_name / "report.json"
        previous = json.loads(done.read_text()) if resume and done.is_file() else None
        weights = "fp32" if set_name == "heldout" else cfg.generation.weights
        if (previous is not None and previous.get("judge") == judge.name and previous.get("weights", "fp32") == weights
                and _same_prompts(out / name / set_name / "responses.jsonl", rows)):
            reports[set_name] = previous
            log(f"eval {name}/{set_name}: reused {done}")
            continue
        start = time.perf_counter()
        report = evaluate_safety(rows, for_weights(weights), judge=judge,
                                 gates=gates if set_name == "heldout" else None, batch_size=cfg.eval.batch_size)
        report["weights"] = weights
        write_outputs(report, out / name / set_name)
        reports[set_name] = {k: v for k, v in report.items() if k != "records"}
        log(f"eval {name}/{set_name}: {len(rows)} prompts in {time.perf_counter() - start:.0f} s; "
            + ", ".join(f"{m} {report[m]['rate']:.3f}" for m in HEADLINE if report[m]["n"]))
    return reports


def _same_prompts(responses: Path, rows: list[dict]) -> bool:
    if not responses.is_file():
        return False
    done = [json.loads(line)["prompt"] for line in responses.read_text(encoding="utf-8").splitlines() if line]
    return done == [r["prompt"] for r in rows]


def run_pipeline(cfg: AlignConfig, run_dir: Path, *, resume: bool = False, log: Log = print,
                 cache: bool = True) -> dict[str, Any]:
    """Every stage in order; returns the report (also written to RUN_DIR/report.json and report.md). With
    ``cache`` the generations and judge labels go through ``$MESHLM_CACHE/align`` (meshlm/safety/cache.py)."""
    from meshlm.safety.align_report import Stages, assemble_report, write_report
    from meshlm.safety.cache import cache_root
    from meshlm.safety.judges import make_judge

    store = AlignCache(cache_root() if cache else None)
    judge = store.judge(make_judge(cfg.eval.judge))  # a judge that cannot load fails here, before any training
    # (an llm: judge's URL and model name are checked for form only: the endpoint is first asked at evaluation)
    run_dir = Path(run_dir)
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise CheckpointError(f"run directory '{run_dir}' is not empty; pass --resume auto to continue it or "
                              "choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:  # a resume writes it once its stages are found or trained as it asks (_check_reusable)
        atomic_write_text(run_dir / "align.resolved.toml", cfg.to_toml())
    stages = Stages(store, log)
    data = run_dir / "data"
    with stages.run("data"):
        manifest = _dataset(cfg, data, resume)
    log(f"data: {manifest['counts']}")
    checkpoints: dict[str, Path] = {}
    with stages.run("base", training=not cfg.base.checkpoint):
        checkpoints["base"] = Path(cfg.base.checkpoint) if cfg.base.checkpoint else \
            train_base(cfg, run_dir / "base", resume, log)
    rows = data / "sft.jsonl"
    if cfg.sft.answer_targets != "template":
        with stages.run("self_distill"):
            rows = sft_rows(cfg, data, checkpoints["base"], resume, log, judge, store)
    with stages.run("sft", training=True):
        checkpoints["sft"] = train_sft(cfg, rows, checkpoints["base"], run_dir / "sft", resume, log)
    if cfg.dpo.enabled:
        with stages.run("on_policy"):
            pairs = on_policy_data(cfg, data, checkpoints["sft"], resume, log, judge, store)
        with stages.run("dpo", training=True):
            checkpoints["dpo"] = train_dpo(cfg, data, checkpoints["sft"], run_dir / "dpo", resume, log, pairs)
    if resume:
        atomic_write_text(run_dir / "align.resolved.toml", cfg.to_toml())
    sets = evaluation_sets(cfg, data)
    final = "dpo" if cfg.dpo.enabled else "sft"
    reports, facts = _evaluate_all(cfg, checkpoints, sets, final, run_dir / "eval", resume, log, judge, store, stages)
    report = assemble_report(cfg, _with_generated_counts(cfg, manifest, data), checkpoints, final, sets, reports,
                             facts, stages)
    write_report(report, run_dir)
    return report


def _own_facts(cfg: AlignConfig) -> str:
    """The config's own factual questions file for the leak check ("" for the shipped one or none: the shipped
    factual sets are checked always)."""
    return "" if cfg.eval.facts == "none" else cfg.eval.facts


def synth_sizes(cfg: AlignConfig) -> SynthSizes:
    """The synthesis sizes of an align config's [data] table."""
    return SynthSizes(refuse=cfg.data.refuse, warn=cfg.data.warn, answer=cfg.data.answer,
                      max_refuse_share=cfg.data.max_refuse_share, attack_fraction_refuse=cfg.data.attack_share,
                      attack_fraction_answer=cfg.data.attack_share_answer, warn_referral=cfg.data.warn_referral)


def _dataset(cfg: AlignConfig, data: Path, resume: bool) -> dict:
    if not (resume and (data / "manifest.json").is_file()):
        make_dataset(cfg.spec.path, data, cfg.data.seed, synth_sizes(cfg), cfg.eval.heldout,
                     cfg.data.eval_group_fraction, _own_facts(cfg))
    return json.loads((data / "manifest.json").read_text())


def _evaluate_all(cfg: AlignConfig, checkpoints: dict[str, Path], sets: dict[str, list[dict]], final: str, out: Path,
                  resume: bool, log: Log, judge, store: AlignCache, stages) -> tuple[dict, dict]:
    """Each model's judged evaluation (the base on the held-out set only) and factual accuracy, each a stage."""
    from meshlm.safety.generation import CheckpointGenerator
    from meshlm.safety.usefulness import evaluate_checkpoint_facts

    reports, facts = {}, {}
    for name, path in checkpoints.items():
        if name == "base" and not cfg.eval.evaluate_base:
            continue
        model_sets = {"heldout": sets["heldout"]} if name == "base" else sets  # the base is compared on heldout
        with stages.run(f"eval_{name}"):
            reports[name] = evaluate_model(name, path, model_sets, cfg, out, cfg.eval.gates or None if name == final
                                           else None, log, resume, judge, store)
        if cfg.eval.facts != "none":  # usefulness: factual accuracy beside the safety figures (fp32: gated)
            make = functools.partial(CheckpointGenerator, path, max_new_tokens=cfg.eval.facts_max_new_tokens)
            with stages.run(f"facts_{name}"):
                facts[name] = evaluate_checkpoint_facts(name, path, cfg.eval.facts, out, resume=resume,
                                                        max_new_tokens=cfg.eval.facts_max_new_tokens,
                                                        batch_size=cfg.eval.batch_size, log=log,
                                                        generate=store.generator(make))
    return reports, facts


def _with_generated_counts(cfg: AlignConfig, manifest: dict, data: Path) -> dict:
    """The data manifest with the on-policy and self-distillation counts of this run, when it made them."""
    on_policy = data / "on_policy.json"
    if cfg.dpo.enabled and (cfg.dpo.on_policy_prompts or cfg.dpo.probe_prompts) and on_policy.is_file():
        manifest = {**manifest, "on_policy": json.loads(on_policy.read_text())}
    if (data / "self_distill.json").is_file() and cfg.sft.answer_targets != "template":
        manifest = {**manifest, "self_distill": json.loads((data / "self_distill.json").read_text())}
    return manifest
