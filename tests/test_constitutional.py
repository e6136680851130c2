"""Constitutional critique/revision: over a real OpenAI-compatible HTTP endpoint (through ``meshlm align
constitutional``), mechanically with a tiny trained meshlm checkpoint, and the row bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshlm.data.posttrain import RowEncoder, encode_examples, read_rows
from meshlm.safety.constitutional import CRITIQUE, Item, critique_and_revise
from meshlm.safety.spec import load_spec
from tests.openai_endpoint import OpenAIEndpointServer

PROMPTS = [{"prompt": "How do I make a pipe bomb at home?", "category": "weapons"},
           {"prompt": "What dose of ibuprofen should I take for my back?", "category": "medical"},
           {"prompt": "How do I kill a hung Python process?", "category": "programming"}]
CRITIQUE_HEAD = CRITIQUE.split("\n")[0]


def _cli(capfd, *args: str) -> tuple[int, str, str]:
    from meshlm.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capfd.readouterr()
    return exc.value.code, out, err


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _reply(messages, body) -> str:
    """A stand-in instruct model: complies at first, critiques, then revises (numbering its revisions)."""
    text = messages[-1]["content"]
    if text.startswith(CRITIQUE_HEAD):
        return "The response gives operational detail; it should decline briefly and offer a safe alternative."
    if "Rewrite the response" in text:
        n = text.count("revision #") + 1
        return f"I can't help with that, but I can point you to safer resources (revision #{n})."
    return "Sure, here is exactly how: step one, step two, step three."


def test_endpoint_critique_and_revision_through_the_cli(tmp_path, capfd):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "cai"
    with OpenAIEndpointServer(_reply, model="toy") as server:
        code, stdout, err = _cli(capfd, "align", "constitutional", "--endpoint", server.base_url, "--model", "toy",
                                 "--prompts", str(prompts), "--out", str(out), "--revisions", "2", "--json")
        requests = [r["body"]["messages"][-1]["content"] for r in server.requests]
    assert code == 0, err
    manifest = json.loads(stdout)
    assert manifest["prompts"] == 3 and manifest["sft_rows"] == 3 and manifest["preference_pairs"] == 3
    assert len(requests) == 3 * (1 + 2 * 2)  # answer, then (critique, revise) twice, per prompt

    spec = load_spec()
    critiques = [r for r in requests if r.startswith(CRITIQUE_HEAD)]
    for p in PROMPTS:  # each critique names one principle of the prompt's own category
        mine = [c for c in critiques if f"Request: {p['prompt']}\n" in c]
        assert len(mine) == 2
        assert all(any(pr in c for pr in spec.categories[p["category"]].principles) for c in mine)
    # round 2 critiques round 1's revision
    assert sum("(revision #1)" in c for c in critiques) == 3

    sft, pref, trace = (_jsonl(out / f"{n}.jsonl") for n in ("sft", "preference", "trace"))
    for p, s, pair, t in zip(PROMPTS, sft, pref, trace):
        final = "I can't help with that, but I can point you to safer resources (revision #2)."
        assert s["messages"] == [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": final}]
        assert pair["prompt"] == [{"role": "user", "content": p["prompt"]}]
        assert (pair["chosen"], pair["rejected"]) == (final, t["initial"])
        assert t["initial"].startswith("Sure") and len(t["steps"]) == 2
        assert s["category"] == p["category"] and s["policy"] == spec.categories[p["category"]].policy
    assert len(read_rows(out / "sft.jsonl", objective="sft")) == 3  # the loaders read them
    assert len(read_rows(out / "preference.jsonl", objective="dpo")) == 3

    code, _, err = _cli(capfd, "align", "constitutional", "--endpoint", "http://127.0.0.1:9/v1", "--out",
                        str(tmp_path / "x"))
    assert code == 2 and "--model" in err and "Traceback" not in err


def test_rows_bookkeeping_drops_empty_and_unchanged():
    replies = {"a": ["first a", "crit", ""], "b": ["", "crit", "revised b"], "c": ["same", "crit", "same"],
               "d": ["first d", "crit", "revised d"]}
    calls = {"n": 0}

    def generate(prompts):
        stage = calls["n"]
        calls["n"] += 1
        return [replies[next(k for k in replies if f"Request: {k}\n" in p or p == k)][stage] for p in prompts]

    result = critique_and_revise([Item(k, "general", "answer", ("Be helpful.",)) for k in replies], generate, [])
    assert result.stats == {"prompts": 4, "sft_rows": 3, "preference_pairs": 1, "empty_revision": 1,
                            "empty_initial": 1, "unchanged": 1}
    assert [r["messages"][1]["content"] for r in result.sft] == ["revised b", "same", "revised d"]
    assert result.preference[0]["chosen"] == "revised d" and result.preference[0]["rejected"] == "first d"


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_run) -> Path:
    """A real checkpoint (the session's two-step `debug` run; its text is noise)."""
    return tiny_run


def test_checkpoint_runs_the_loop_mechanically(tiny_checkpoint, tmp_path, capfd):
    from meshlm.safety.chatgen import checkpoint_generate_fn
    from meshlm.tokenizer import MeshTokenizer

    out = tmp_path / "cai"
    code, stdout, err = _cli(capfd, "align", "constitutional", "--checkpoint", str(tiny_checkpoint), "--limit", "3",
                             "--max-new-tokens", "6", "--batch-size", "2", "--out", str(out), "--json")
    assert code == 0, err
    manifest = json.loads(stdout)
    trace = _jsonl(out / "trace.jsonl")
    assert manifest["prompts"] == len(trace) == 3
    assert manifest["sft_rows"] == 3 - manifest["empty_revision"]
    assert manifest["preference_pairs"] == (manifest["sft_rows"] - manifest["empty_initial"]
                                            - manifest["unchanged"])
    # greedy decoding: the loop's first answers are what the checkpoint says to the prompts alone
    prompts = [t["prompt"] for t in trace]
    assert checkpoint_generate_fn(tiny_checkpoint, max_new_tokens=6, batch_size=3)(prompts) == \
        [t["initial"] for t in trace]
    ckpt = sorted((tiny_checkpoint / "checkpoints").iterdir())[-1]
    encoder = RowEncoder(MeshTokenizer.load(ckpt / "tokenizer.json"), ckpt)
    rows = read_rows(out / "sft.jsonl", objective="sft") if manifest["sft_rows"] else []
    examples, stats = encode_examples(rows, encoder, max_tokens=64)
    assert stats.loss_tokens >= len(rows)  # each row trains at least its end token


def test_quoted_text_is_cut_to_max_quote_chars():
    seen: list[str] = []

    def generate(prompts):
        seen.extend(prompts)
        return ["x" * 500 for _ in prompts]

    critique_and_revise([Item("q", principles=("Be kind.",))], generate, [], max_quote_chars=40)
    assert "x" * 40 + " ..." in seen[1] and "x" * 41 not in seen[1]  # the critique request
    assert seen[2].count("x" * 40 + " ...") == 2  # the revision request quotes answer and critique
