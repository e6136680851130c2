"""``meshlm generate --json`` on a tiny Gemma 3 (tests/gemma3_gguf.py): the token that ends a generation is not
part of its text. Regression: the completion of a Gemma 3 reply ended with "<end_of_turn>" (its special token
rendered back), and so did a plain prompt's "text"; now every family's stop token ends the generation, is listed in
"generated_ids", and is left out of "completion" and "text".

The model is made to answer deterministically: with every block's output projections zeroed the last hidden state
is the last token's embedding, so (tied head) greedy decoding picks the token whose embedding row points most along
it. The rows of the prompt's last token, a reply token and <end_of_turn> are set so the chain is
prompt end -> reply -> <end_of_turn>.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gemma3_gguf import sentencepiece_vocab, write_gemma3_gguf  # noqa: E402

from meshlm.cli.main import main  # noqa: E402
from meshlm.interop.gguf import convert_from_gguf  # noqa: E402

NEWLINE, REPLY, END = "\n", "\u2581the", "<end_of_turn>"


def steer(path, tokens: list[str]) -> None:
    """Greedy after "\\n" emits REPLY, then END (see the module docstring); edits the F32 tensors in place."""
    reader = gguf.GGUFReader(str(path), "r+")
    for tensor in reader.tensors:
        data = tensor.data
        if tensor.name.split(".")[-2] in ("attn_output", "ffn_down"):
            data[...] = 0.0
        elif tensor.name == "output_norm.weight":
            data[...] = 1.0  # stored as 1 + w: w = 1 (any positive scale keeps the argmax)
        elif tensor.name == "token_embd.weight":
            rows = {t: tokens.index(t) for t in (NEWLINE, REPLY, END)}
            for i in rows.values():
                data[i] = 0.0
            data[rows[NEWLINE], 0] = 1.0
            data[rows[REPLY], 0], data[rows[REPLY], 1] = 10.0, 10.0  # after "\n": 10 against END's 0
            data[rows[END], 1] = 30.0  # after REPLY: 30/sqrt2 against REPLY's own 20/sqrt2
    reader.data.flush()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3-stop")
    write_gemma3_gguf(root / "g.gguf", n_layers=2)
    tokens = sentencepiece_vocab()[0]
    assert REPLY in tokens
    steer(root / "g.gguf", tokens)
    return convert_from_gguf(root / "g.gguf", root / "run")["checkpoint"]


def generate_json(args: list[str], capfd) -> dict:
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--greedy", "--max-new-tokens", "6", "--json", *args])
    out = capfd.readouterr().out
    assert exc.value.code == 0
    return json.loads(out)


def test_chat_completion_leaves_out_end_of_turn(run, capfd):
    from meshlm.tokenizer import MeshTokenizer

    tok = MeshTokenizer.load(f"{run}/tokenizer.json")
    end, reply = tok.backend.token_to_id(END), tok.backend.token_to_id(REPLY)
    record = generate_json(["--checkpoint", run, "--chat", "hello"], capfd)
    assert record["generated_ids"] == [reply, end] and record["finish_reason"] == "stop"
    assert end in record["eos_ids"]
    assert record["completion"] == tok.decode([reply]) and END not in record["completion"]
    assert record["text"] == "the"


def test_plain_prompt_text_leaves_out_the_stop_token(run, capfd):
    from meshlm.tokenizer import MeshTokenizer

    tok = MeshTokenizer.load(f"{run}/tokenizer.json")
    prompt = [tok.bos_id, tok.backend.token_to_id(NEWLINE)]
    end, reply = tok.backend.token_to_id(END), tok.backend.token_to_id(REPLY)
    record = generate_json(["--checkpoint", run, "--prompt-ids", ",".join(map(str, prompt))], capfd)
    assert record["generated_ids"] == [reply, end] and record["finish_reason"] == "stop"
    assert record["ids"] == prompt + [reply, end]
    assert record["completion"] == tok.decode([reply])
    assert record["text"] == tok.decode(prompt + [reply]) and not record["text"].endswith(END)
