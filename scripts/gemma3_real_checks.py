"""The real Gemma 3 270M through meshlm's commands, checked against transformers (docs/real-models.md, "Gemma 3
270M"). Each check runs the CLI as a user would (subprocesses of ``meshlm``) and prints one JSON object.

    python scripts/gemma3_real_checks.py greedy RUN [--gguf FILE]     # meshlm generate vs transformers, greedy
    python scripts/gemma3_real_checks.py roundtrip RUN OUT_DIR        # to-gguf, from-gguf again, max |Δ logit|
    python scripts/gemma3_real_checks.py serve RUN WORK_DIR           # meshlm serve + the official openai client
    python scripts/gemma3_real_checks.py plan SFT_RUN_DIR             # plan_prediction.json vs the run's metrics
    python scripts/gemma3_real_checks.py packed RUN                   # packed block vs plain forward; int8 vs fp32
    python scripts/gemma3_real_checks.py smoke-data - OUT_DIR         # the small eval files of the align smoke run

RUN is a run directory of ``meshlm convert from-gguf`` (or a fine-tuned one); FILE defaults to where ``meshlm
fetch gemma3-270m`` puts the GGUF. CPU, fp32; set OMP_NUM_THREADS (2 on these machines) before running.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Water boils at a temperature of", "The three primary colors are"]
ROUNDTRIP_PROMPT = "The quick brown fox jumps over the lazy dog. In 1969, the first humans walked on the Moon,"
MESHLM = [sys.executable, "-m", "meshlm.cli.main"]


def load() -> list[str]:
    return open("/proc/loadavg").read().split()[:3]


def meshlm(*args: str, timeout: float = 1800) -> dict:
    """Run ``meshlm ARGS --json`` and parse its document (or, for ``generate``, its last line); exit code checked."""
    done = subprocess.run([*MESHLM, *args, "--json"], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"meshlm {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    try:
        return json.loads(done.stdout)  # one document (indented)
    except json.JSONDecodeError:
        return json.loads(done.stdout.strip().splitlines()[-1])  # generate: one object per line


def transformers_model(gguf: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()


def check_greedy(run: Path, gguf: Path, new_tokens: int) -> dict:
    """``meshlm generate --greedy`` (its CLI, its decode path) against transformers' greedy ``generate`` from the
    GGUF, token by token, on the prompt ids meshlm used."""
    import torch

    ref, rows = transformers_model(gguf), []
    for prompt in PROMPTS:
        start = time.perf_counter()
        ours = meshlm("generate", "--checkpoint", str(run), "--prompt", prompt, "--greedy",
                      "--max-new-tokens", str(new_tokens), "--device", "cpu")
        wall = time.perf_counter() - start
        with torch.no_grad():
            out = ref.generate(torch.tensor([ours["prompt_ids"]]), max_new_tokens=new_tokens, do_sample=False)
        theirs = out[0, len(ours["prompt_ids"]):].tolist()
        same = next((i for i, (a, b) in enumerate(zip(ours["generated_ids"], theirs)) if a != b), None)
        rows.append({"prompt": prompt, "completion": ours["completion"], "meshlm_ids": len(ours["generated_ids"]),
                     "equal": ours["generated_ids"] == theirs[:len(ours["generated_ids"])],
                     "first_difference": same, "meshlm_generate_wall_s": round(wall, 1)})
    return {"check": "greedy", "new_tokens": new_tokens, "rows": rows,
            "all_equal": all(r["equal"] for r in rows)}


def logits(run: Path, text: str):
    import torch

    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.tokenizer import MeshTokenizer

    model, _, _, ckpt = model_from_checkpoint(run)
    ids = torch.tensor([MeshTokenizer.load(ckpt / "tokenizer.json").prompt_ids(text)])
    with torch.no_grad():
        return ids, model(ids).float()


def check_roundtrip(run: Path, out: Path) -> dict:
    """``convert to-gguf`` (f32) of RUN, ``from-gguf`` of that file, logits of both runs on one prompt; and
    transformers' GGUF loader on the exported file."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    exported, again = out / "gemma3-270m-export.gguf", out / "again"
    start = time.perf_counter()
    written = meshlm("convert", "to-gguf", str(run), str(exported), "--overwrite")
    to_s = time.perf_counter() - start
    start = time.perf_counter()
    read = meshlm("convert", "from-gguf", str(exported), str(again), "--overwrite")
    from_s = time.perf_counter() - start
    ids, first = logits(run, ROUNDTRIP_PROMPT)
    second = logits(again, ROUNDTRIP_PROMPT)[1]
    with torch.no_grad():
        hf = transformers_model(exported)(ids).logits.float()
    return {"check": "roundtrip", "tokens": ids.shape[1], "to_gguf": written, "to_gguf_wall_s": round(to_s, 1),
            "from_gguf_notes": read.get("notes"), "from_gguf_wall_s": round(from_s, 1),
            "gguf_bytes": exported.stat().st_size,
            "max_abs_logit_diff_meshlm_reread": (first - second).abs().max().item(),
            "max_abs_logit_diff_transformers_on_export": (first - hf).abs().max().item()}


def check_serve(run: Path, work: Path) -> dict:
    """``registry add`` + ``meshlm serve --port 0`` on loopback, one chat request not streamed and one streamed
    through the official ``openai`` client, then SIGTERM (the server drains and exits)."""
    from openai import OpenAI

    work.mkdir(parents=True, exist_ok=True)
    registry, port_file = work / "registry.sqlite", work / "port.json"
    port_file.unlink(missing_ok=True)
    meshlm("registry", "add", str(run), "--name", "gemma3", "--registry", str(registry))
    log = open(work / "serve.log", "w")
    server = subprocess.Popen([*MESHLM, "serve", "--registry", str(registry), "--model", "gemma3:v1", "--force",
                               "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
                               "--device", "cpu", "--threads", os.environ.get("OMP_NUM_THREADS", "2")],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while not port_file.exists():
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the server did not start: {(work / 'serve.log').read_text()[-2000:]}")
            time.sleep(1)
        client = OpenAI(base_url=json.loads(port_file.read_text())["base_url"], api_key="unused")
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        start = time.perf_counter()
        plain = client.chat.completions.create(model="gemma3", messages=messages, max_tokens=24, temperature=0)
        plain_s = time.perf_counter() - start
        start = time.perf_counter()
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="gemma3", messages=messages, max_tokens=24, temperature=0, stream=True) if c.choices]
        stream_s = time.perf_counter() - start
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
    return {"check": "serve", "answer": plain.choices[0].message.content, "finish": plain.choices[0].finish_reason,
            "usage": plain.usage.model_dump() if plain.usage else None, "wall_s": round(plain_s, 1),
            "streamed": "".join(pieces), "stream_chunks": len(pieces), "stream_wall_s": round(stream_s, 1),
            "streamed_equals_plain": "".join(pieces) == plain.choices[0].message.content, "server_exit": code}


def check_plan(run: Path) -> dict:
    """The planner's prediction a training run wrote (plan_prediction.json) against what the run measured: peak
    memory (the largest ``memory_gib`` of metrics.jsonl: peak RSS on CPU) and step time (the median
    ``step_time_s`` of the logged steps after the first); measured / predicted for each."""
    import statistics

    prediction = json.loads((run / "plan_prediction.json").read_text())["predicted"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "step_time_s" in r and "loss" in r]
    peak = max(r["memory_gib"] for r in steps)
    step_s = statistics.median(r["step_time_s"] for r in steps[1:] or steps)
    return {"check": "plan", "memory_kind": steps[-1].get("memory_kind"),
            "predicted_gib": prediction["total"], "measured_peak_gib": peak,
            "memory_measured_over_predicted": peak / prediction["total"],
            "predicted_step_s": prediction["step_time_s"], "measured_median_step_s": step_s,
            "step_measured_over_predicted": step_s / prediction["step_time_s"], "steps": len(steps)}


def check_packed(run: Path, prompts: int = 4, steps: int = 32) -> dict:
    """The packed decode block against the model's plain forward (fp32: the largest logit difference over a 32-token
    prefill and ``steps`` steps, and ``generate``'s greedy tokens both ways), and its int8 weights against its fp32
    ones (teacher-forced on fp32's greedy tokens: top-1 agreement and relative logit error). Random prompts, seeded."""
    import torch

    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate import generate
    from meshlm.generate.decode import FastForward

    model, *_ = model_from_checkpoint(str(run))
    model.eval()
    fp32, int8 = FastForward(model), FastForward(model, weights="int8")
    worst, scale, agree, total, errors, identical = 0.0, 0.0, 0, 0, [], 0
    for seed in range(prompts):
        ids = torch.randint(0, model.cfg.vocab_size, (1, 32), generator=torch.Generator().manual_seed(seed))
        caches = [model.new_cache(1, 32 + steps) for _ in range(3)]
        with torch.no_grad():
            plain = model(ids, cache=caches[0])[:, -1:]
            fast, quant = fp32(ids, cache=caches[1]), int8(ids, cache=caches[2])
            for pos in range(32, 32 + steps):
                worst, scale = max(worst, (plain - fast).abs().max().item()), max(scale, plain.abs().max().item())
                token = fast[:, -1].argmax(-1, keepdim=True)
                agree, total = agree + int(token.item() == quant[:, -1].argmax(-1).item()), total + 1
                errors.append(((fast - quant).norm() / fast.norm()).item())
                plain = model(token, cache=caches[0], start_pos=pos)
                fast, quant = fp32(token, cache=caches[1], start_pos=pos), int8(token, cache=caches[2], start_pos=pos)
        prompt = ids[0].tolist()
        identical += generate(model, prompt, steps, greedy=True, eos_id=None) == \
            generate(model, prompt, steps, greedy=True, eos_id=None, fast=False)
    errors.sort()
    return {"prompts": prompts, "steps": steps, "max_abs_logit_diff_packed_vs_plain": worst, "largest_logit": scale,
            "greedy_identical_packed_vs_plain": f"{identical}/{prompts}", "int8_top1_agreement": f"{agree}/{total}",
            "int8_relative_logit_error_median": errors[len(errors) // 2], "int8_relative_logit_error_max": errors[-1]}


def smoke_data(out: Path, heldout_every: int = 14, facts_every: int = 12) -> dict:
    """Every n-th row of the embedded held-out prompts and factual questions (order kept, so each category and
    topic keeps a share): the evaluation sets of configs/align-gemma3-270m-smoke.toml."""
    from importlib import resources

    out.mkdir(parents=True, exist_ok=True)
    data = resources.files("meshlm.safety") / "data"
    counts = {}
    for name, every in (("heldout_prompts.jsonl", heldout_every), ("factual_qa.jsonl", facts_every)):
        rows = [line for line in data.joinpath(name).read_text().splitlines() if line.strip()][::every]
        (out / name).write_text("\n".join(rows) + "\n")
        counts[name] = len(rows)
    return {"check": "smoke-data", "out": str(out), "rows": counts}


def main() -> None:
    from meshlm.cli.fetch import model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=("greedy", "roundtrip", "serve", "plan", "packed", "smoke-data"))
    parser.add_argument("run", type=Path)
    parser.add_argument("out", type=Path, nargs="?", default=Path("gemma3-checks"))
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    report = {"load_before": load()}
    if args.check == "greedy":
        report |= check_greedy(args.run, args.gguf or model_path("gemma3-270m"), args.new_tokens)
    elif args.check == "roundtrip":
        report |= check_roundtrip(args.run, args.out)
    elif args.check == "serve":
        report |= check_serve(args.run, args.out)
    elif args.check == "plan":
        report |= check_plan(args.run)
    elif args.check == "packed":
        report |= check_packed(args.run)
    else:
        report |= smoke_data(args.out)
    report["load_after"] = load()
    print(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
