"""``meshlm bench generate`` and ``bench train --checkpoint`` on a tiny converted checkpoint: the JSON fields, the
fast decode path's greedy tokens identical to transformers' ``generate`` on the same weights (``--compare-hf``),
LoRA on every projection against PEFT with the trainable-parameter count of the adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from meshlm.interop import convert_from_hf  # noqa: E402

transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A random 2-layer GQA Llama (HF), with a small trained byte-level BPE, converted to a meshlm run."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from meshlm.data import embedded_documents

    root = tmp_path_factory.mktemp("bench")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(embedded_documents()[:20], trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger than HF's init, so that greedy paths branch
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.1) if "norm" in name else p.normal_(0.0, 0.1)
    model.save_pretrained(root / "hf")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(
        root / "hf")
    return Path(convert_from_hf(root / "hf", root / "run")["out"])


def test_bench_generate_json_and_greedy_tokens_identical_to_hf(checkpoint, capfd):
    from meshlm.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "generate", "--checkpoint", str(checkpoint), "--batch", "3", "--prompt-len", "5",
              "--new-tokens", "12", "--repeats", "1", "--warmup", "0", "--compare-hf", "--device", "cpu", "--json"])
    out = capfd.readouterr().out  # --json writes the document to the real stdout descriptor
    assert exc.value.code == 0
    r = json.loads(out)
    assert r["batch"] == 3 and r["new_tokens"] == 12 and r["fast"] is True
    assert r["hf_identical"] is True and r["hf_identical_rows"] == 3
    for key in ("tokens_per_s", "time_to_first_token_s", "ms_per_step", "hf_tokens_per_s", "ratio_to_hf",
                "bandwidth_bound_ms_per_step", "copy_bytes_per_s"):
        assert r[key] > 0, key
    assert r["weight_bytes"] == 4 * r["params"]  # fp32, the tied head counted once


def test_bench_train_on_a_checkpoint_with_lora_against_peft_and_the_full_step(checkpoint, capfd):
    from meshlm.cli.main import main
    from meshlm.models.config import ModelConfig
    from meshlm.models.lora import expected_lora_params

    with pytest.raises(SystemExit) as exc:
        main(["bench", "train", "--checkpoint", str(checkpoint), "--lora-rank", "2", "--compare-hf", "--compare-full",
              "--batch", "1", "--seq", "8", "--steps", "1", "--warmup", "0", "--device", "cpu", "--json"])
    out = capfd.readouterr().out
    assert exc.value.code == 0
    r = json.loads(out)
    cfg = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=128)
    assert r["lora_targets"] == ["q", "k", "v", "o", "gate", "up", "down"]
    assert r["trainable_params"] == expected_lora_params(cfg, r["lora_targets"], 2)
    assert r["hf_peft"] is True and r["checkpoint"] == str(checkpoint)
    for key in ("step_time_s", "hf_step_time_s", "full_step_time_s", "lora_to_full_step", "ratio_to_hf"):
        assert r[key] > 0, key


def test_prompt_plus_new_tokens_beyond_the_context_exits_2(checkpoint, capsys):
    from meshlm.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "generate", "--checkpoint", str(checkpoint), "--prompt-len", "60", "--new-tokens", "10",
              "--device", "cpu"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "--prompt-len 60 + --new-tokens 10" in err and "Traceback" not in err
