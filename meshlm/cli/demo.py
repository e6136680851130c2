"""``meshlm demo``: the whole path on the embedded default, offline, in a few minutes on two CPU cores."""

from __future__ import annotations

import argparse
import time
from importlib import resources
from pathlib import Path

PROMPTS = ["The ", "A list is", "To open a file,"]


def register(sub, add_config_args) -> None:
    p = sub.add_parser("demo", help="prepare the embedded corpus, train `small`, sample, plot")
    p.add_argument("--run-dir", help="default runs/demo-<time>")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of the demo config (configs/small.toml)")
    p.add_argument("--margin", type=float, default=0.5,
                   help="nats/token the held-out loss must end below the unigram baseline")
    p.set_defaults(handler=run)


def packaged_config(name: str) -> Path:
    return Path(str(resources.files("meshlm") / "configs" / f"{name}.toml"))


def run(args: argparse.Namespace) -> int:
    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.data import unigram_entropy
    from meshlm.generate import generate
    from meshlm.plots import plot_loss
    from meshlm.tokenizer import MeshTokenizer
    from meshlm.train.run_dir import init_run_dir
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.train.trainer import Trainer

    started = time.perf_counter()
    cfg = load_config(packaged_config("small"), ["training.eval_interval=100", *args.overrides])
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"[1/4] preparing the embedded corpus (tokenizer with {cfg.model.vocab_size} tokens; cached after the "
          "first run)", flush=True)
    init_run_dir(run_dir, config_to_toml(cfg), resume=False)
    trainer = Trainer(cfg, run_dir, callbacks=run_callbacks(cfg))
    baseline = unigram_entropy(trainer.dataset, "train")
    print(f"[2/4] training `{cfg.model.flavor}` for {cfg.training.steps} steps; unigram baseline "
          f"{baseline:.3f} nats/token", flush=True)
    summary = trainer.train()
    eval_loss = summary.get("eval_loss", trainer.evaluate())
    print("[3/4] sampling", flush=True)
    tokenizer = MeshTokenizer.load(trainer.dataset.tokenizer_path)
    model = trainer.model.eval()
    for i, prompt in enumerate(PROMPTS):
        ids = [tokenizer.bos_id] + tokenizer.encode(prompt)
        new = generate(model, ids, 40, temperature=0.8, top_k=50, eos_id=tokenizer.eos_id, seed=i,
                       device=str(trainer.device), vocab_limit=tokenizer.vocab_size)
        print("   > " + (prompt + tokenizer.decode(new, skip_special_tokens=True)).replace("\n", " ⏎ "))
    plot = plot_loss(run_dir, baseline=baseline)
    print(f"[4/4] done in {time.perf_counter() - started:.0f} s")
    print(f"   run directory   {run_dir}")
    print(f"   metrics         {run_dir / 'metrics.jsonl'}")
    print(f"   loss plot       {plot}")
    print(f"   checkpoints     {run_dir / 'checkpoints'}")
    print(f"   held-out loss   {eval_loss:.3f} vs unigram baseline {baseline:.3f} nats/token")
    print(f"   try: meshlm generate --checkpoint {run_dir} --prompt 'The '")
    if eval_loss > baseline - args.margin:
        print(f"demo: the held-out loss did not get {args.margin} nats below the unigram baseline")
        return 1
    return 0
