"""Chat everywhere (issue 19 §2): the chat template survives conversion however the HF tokenizer stores it,
``meshlm generate`` adds bos only where the tokenizer does, ``--chat`` / ``--messages`` use the checkpoint's own
template (meshlm's for models trained here), stop at the template's end-of-turn token and print the reply only;
a converted run names its source and ``inspect`` shows the template and the parameter count (tied head once).

The reference for every prompt is transformers' own ``apply_chat_template`` / tokenizer on the HF folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from meshlm.cli.main import main  # noqa: E402
from meshlm.data.posttrain.templates import HFChatTemplate, MeshChatTemplate, chat_template_for  # noqa: E402
from meshlm.interop import convert_from_hf, convert_to_hf  # noqa: E402
from meshlm.tokenizer import MeshTokenizer  # noqa: E402
from tiny_hf import CHATML, chatml_tokenizer, make_bigram, write_chatml_llama  # noqa: E402

transformers.utils.logging.disable_progress_bar()
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tok():
    return chatml_tokenizer()


@pytest.fixture(scope="module")
def converted(tok, tmp_path_factory):
    """template kind -> (HF folder, converted run); both a SmolLM2-like tied model."""
    out = {}
    for kind in ("jinja", "config"):
        root = tmp_path_factory.mktemp(f"chat-{kind}")
        write_chatml_llama(root / "hf", tok, template_in=kind)
        convert_from_hf(root / "hf", root / "run")
        out[kind] = (root / "hf", root / "run")
    return out


def cli(args: list[str], capfd) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    captured = capfd.readouterr()
    return exc.value.code, captured.out, captured.err


def hf_chat_ids(hf_dir: Path, messages: list[dict]) -> list[int]:
    reference = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ids = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@pytest.mark.parametrize("kind", ["jinja", "config"])
def test_template_survives_conversion_and_encodes_as_transformers_does(kind, converted):
    """Regression: a template kept only in chat_template.jinja (transformers 5) was dropped by convert from-hf."""
    hf_dir, run = converted[kind]
    ckpt = next((run / "checkpoints").iterdir())
    assert (ckpt / "chat_template.jinja").is_file() == (kind == "jinja")
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    template = chat_template_for(tokenizer, ckpt)
    assert isinstance(template, HFChatTemplate)
    assert template.encode_prompt(CHAT) == hf_chat_ids(hf_dir, CHAT)
    assert template.end_of_turn_ids() == [tokenizer.backend.token_to_id("<|im_end|>")]


@pytest.mark.parametrize("kind", ["jinja", "config"])
def test_export_keeps_the_template_where_it_was(kind, converted, tmp_path):
    hf_dir, run = converted[kind]
    convert_to_hf(run, tmp_path / "back")
    assert (tmp_path / "back" / "chat_template.jinja").is_file() == (kind == "jinja")
    assert not (tmp_path / "back" / "tokenizer_meta.json").exists()  # meshlm's own file stays home
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "back").chat_template == CHATML
    assert hf_chat_ids(tmp_path / "back", CHAT) == hf_chat_ids(hf_dir, CHAT)


def test_plain_prompt_gets_no_chat_marker_as_bos(converted, capfd):
    """Regression: generate prepended bos (here, as in SmolLM2, <|im_start|>) to every plain prompt."""
    hf_dir, run = converted["jinja"]
    ckpt = next((run / "checkpoints").iterdir())
    assert json.loads((ckpt / "tokenizer_meta.json").read_text())["add_bos_token"] is False
    code, out, _ = cli(["generate", "--checkpoint", str(run), "--prompt", "The capital of France",
                        "--max-new-tokens", "3", "--greedy", "--json"], capfd)
    record = json.loads(out)
    reference = transformers.AutoTokenizer.from_pretrained(hf_dir)("The capital of France")["input_ids"]
    assert code == 0 and record["prompt_ids"] == list(reference)  # what transformers feeds the model
    assert record["text"].startswith("The capital of France") and len(record["generated_ids"]) == 3
    code, out, _ = cli(["generate", "--checkpoint", str(run), "--prompt", "The capital of France",
                        "--max-new-tokens", "3", "--greedy"], capfd)
    assert out.startswith("The capital of France")


def test_plain_text_rows_follow_the_tokenizer_on_bos(converted):
    """Plain prompt/completion rows (SFT, DPO) and plain RL prompts start with bos only where the tokenizer adds
    one: a converted ChatML model whose bos is <|im_start|> gets none (they always prepended it before)."""
    from meshlm.data.posttrain.encode import RowEncoder
    from meshlm.data.posttrain.rows import Row

    hf_dir, run = converted["jinja"]
    ckpt = next((run / "checkpoints").iterdir())
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    encoder = RowEncoder(tokenizer, ckpt)
    reference = transformers.AutoTokenizer.from_pretrained(hf_dir)("The capital of France")["input_ids"]
    encoded = encoder.prompt_completion("The capital of France", " is Paris")
    assert encoded.ids[: len(reference)] == list(reference) and tokenizer.bos_id not in encoded.ids
    row = Row(kind="prompt", where="row 1", prompt="The capital of France")
    assert encoder.prompt(row) == list(reference)


def test_bos_is_added_where_the_post_processor_adds_it(tok, tmp_path):
    """A Llama-3-style tokenizer.json whose post-processor puts bos first: plain prompts start with it."""
    from tokenizers.processors import TemplateProcessing

    bos = tok.token_to_id("<|im_start|>")
    with_bos = chatml_tokenizer()
    with_bos.post_processor = TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    write_chatml_llama(tmp_path / "hf", with_bos)
    convert_from_hf(tmp_path / "hf", tmp_path / "run")
    tokenizer = MeshTokenizer.load(next((tmp_path / "run" / "checkpoints").iterdir()) / "tokenizer.json")
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")("Hello there")["input_ids"]
    assert tokenizer.add_bos and tokenizer.prompt_ids("Hello there") == list(reference) and reference[0] == bos


def test_chat_reply_stops_at_end_of_turn_and_prints_the_reply_only(tok, tmp_path, capfd):
    """A bigram model whose greedy reply to the chat is ' Paris' then <|im_end|>. eos is <|endoftext|> (as in a
    base SmolLM2), so only the template's end-of-turn token can stop it."""
    hf_dir, run = tmp_path / "hf", tmp_path / "run"
    model = write_chatml_llama(hf_dir, tok, eos="<|endoftext|>", tied=False)
    prompt = hf_chat_ids(hf_dir, CHAT)
    reply = tok.encode(" Paris", add_special_tokens=False).ids
    end = tok.token_to_id("<|im_end|>")
    make_bigram(model, [prompt[-1], *reply, end])
    model.save_pretrained(hf_dir)
    convert_from_hf(hf_dir, run)
    args = ["generate", "--checkpoint", str(run), "--system", "Be brief.", "--chat", "What is the capital of France?",
            "--max-new-tokens", "12", "--greedy"]
    code, out, _ = cli(args, capfd)
    assert code == 0 and out == "Paris\n"
    code, out, _ = cli([*args, "--json"], capfd)
    record = json.loads(out)
    assert record["prompt_ids"] == prompt and record["generated_ids"] == [*reply, end]
    assert record["text"] == "Paris" and record["finish_reason"] == "stop" and end in record["eos_ids"]
    assert record["ids"] == prompt + record["generated_ids"]
    messages = tmp_path / "chat.json"
    messages.write_text(json.dumps(CHAT))
    code, out, _ = cli(["generate", "--checkpoint", str(run), "--messages", str(messages), "--greedy", "--json"],
                       capfd)
    assert json.loads(out)["generated_ids"] == [*reply, end]


def test_meshlm_models_chat_with_meshlm_template(tiny_run, capfd):
    ckpt = sorted((tiny_run / "checkpoints").iterdir())[-1]
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    template = chat_template_for(tokenizer, ckpt)
    assert isinstance(template, MeshChatTemplate)
    code, out, _ = cli(["generate", "--checkpoint", str(tiny_run), "--chat", "hello", "--max-new-tokens",
                        "4", "--json"], capfd)
    record = json.loads(out)
    assert code == 0 and record["prompt_ids"] == template.encode_prompt([{"role": "user", "content": "hello"}])
    assert tokenizer.special_ids["<|end|>"] in record["eos_ids"]
    assert record["text"] == tokenizer.decode(
        record["generated_ids"][:-1] if record["finish_reason"] == "stop" else record["generated_ids"],
        skip_special_tokens=True).strip()


@pytest.mark.parametrize("content, expected", [
    ("{not json", "is not readable JSON"),
    ('{"role": "user", "content": "hi"}', "holds a JSON dict; it must hold a list"),
    ('[{"role": "robot", "content": "hi"}]', "role is 'robot'; use one of system, user, assistant"),
    ('[{"role": "user"}]', "must be an object with 'role' and 'content'"),
    ('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]', "the last message is the "
                                                                                      "assistant's"),
])
def test_bad_messages_file_is_one_line_exit_2(content, expected, converted, tmp_path, capfd):
    path = tmp_path / "m.json"
    path.write_text(content)
    code, out, err = cli(["generate", "--checkpoint", str(converted["jinja"][1]), "--messages", str(path)], capfd)
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, _, err = cli(["generate", "--checkpoint", str(converted["jinja"][1]), "--messages", str(tmp_path / "x")],
                       capfd)
    assert code == 2 and "does not exist" in err


def test_converted_run_names_its_source_and_inspect_shows_template_and_count(converted, capfd):
    hf_dir, run = converted["jinja"]
    code, out, _ = cli(["inspect", str(run), "--json"], capfd)
    info = json.loads(out)
    reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
    assert info["num_params"] == sum(p.numel() for p in reference.parameters())  # the tied head once
    assert info["source"] == "hf" and info["config"]["model"]["flavor"] == "custom"
    assert info["chat_template"] == {"kind": "jinja", "file": "chat_template.jinja", "chars": len(CHATML)}
    code, out, _ = cli(["inspect", str(run)], capfd)
    assert "model          custom from hf:" in out and "chat template  chat_template.jinja" in out


def test_meshlm_model_exports_its_template_for_transformers(tiny_run, tmp_path):
    """A model trained here exports meshlm's template in Jinja: transformers renders the ids meshlm uses."""
    ckpt = sorted((tiny_run / "checkpoints").iterdir())[-1]
    convert_to_hf(tiny_run, tmp_path / "hf")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello twice."}]
    expected = MeshChatTemplate(MeshTokenizer.load(ckpt / "tokenizer.json")).encode_prompt(chat)
    assert hf_chat_ids(tmp_path / "hf", chat) == expected
