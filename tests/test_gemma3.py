"""Gemma 3 (the gemma3 family, meshlm/models/families/gemma3.py) against transformers' Gemma3ForCausalLM: a tiny
random model the test writes (tied head, eager attention), converted from-hf and back.

Tolerance: max |logits difference| < 1e-4 in fp32, as tests/test_convert.py explains; a wrong flag (a norm without
its + 1, a missing post-norm, silu for GELU, the wrong score scale or RoPE base) moves logits by 1e-2 .. 1.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from meshlm.checkpoint.load import model_from_checkpoint  # noqa: E402
from meshlm.errors import CheckpointError, ConfigError  # noqa: E402
from meshlm.interop import convert_from_hf, convert_to_hf  # noqa: E402
from meshlm.models import build_model, flavor_config  # noqa: E402
from tiny_hf import chatml_tokenizer  # noqa: E402

transformers.utils.logging.disable_progress_bar()
TOLERANCE = 1e-4
VOCAB = 320
# Six layers: five sliding (window 5 < the 40 positions compared) and one global, as Gemma 3's pattern; or all
# global. query_pre_attn_scalar 24 != head_dim 16, and distinct RoPE bases, so each one's use is tested.
LAYOUTS = {"sliding": ["sliding_attention"] * 5 + ["full_attention"], "global": ["full_attention"] * 6}


def gemma3_config(layer_types: list[str], **overrides):
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=len(layer_types),
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                  rms_norm_eps=1e-6, sliding_window=5, layer_types=layer_types, query_pre_attn_scalar=24,
                  rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, tie_word_embeddings=True,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Gemma3TextConfig(**{**fields, **overrides})


def write_gemma3(folder, layer_types, seed=0):
    """A random tiny Gemma3ForCausalLM + a BPE tokenizer in ``folder``; returns the model (eval, fp32, eager)."""
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(gemma3_config(layer_types)).eval()
    with torch.no_grad():  # norms start at 0 (an offset from one); randomise all so every mapping is tested
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.3) if "norm" in name else param.normal_(0.0, 0.08)
    model.save_pretrained(folder)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=chatml_tokenizer(VOCAB), bos_token="<|im_start|>",
                                                eos_token="<|im_end|>")
    fast.save_pretrained(folder)
    model.config._attn_implementation = "eager"
    return model


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gemma3_logits_equal_transformers_and_round_trip(layout, tmp_path):
    hf_dir, out, back = tmp_path / "hf", tmp_path / "meshlm", tmp_path / "hf-again"
    reference = write_gemma3(hf_dir, LAYOUTS[layout])
    result = convert_from_hf(hf_dir, out)
    model, job, _, _ = model_from_checkpoint(out)
    assert job.model.family == "gemma3" and result["architecture"] == "Gemma3ForCausalLM"
    assert result["num_params"] == sum(p.numel() for p in reference.parameters())
    assert job.model.layer_kinds == (["sliding"] * 5 + ["global"] if layout == "sliding" else ["global"] * 6)
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(tokens).logits
        diff = (model(tokens) - expected).abs().max().item()
    assert diff < TOLERANCE, f"max |logits diff| {diff}"

    convert_to_hf(out, back)
    original = transformers.Gemma3ForCausalLM.from_pretrained(hf_dir).state_dict()
    again, info = transformers.AutoModelForCausalLM.from_pretrained(back, output_loading_info=True,
                                                                    attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert type(again).__name__ == "Gemma3ForCausalLM"
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    assert json.loads((back / "config.json").read_text())["layer_types"] == LAYOUTS[layout]
    with torch.no_grad():
        assert (again.eval()(tokens).logits - expected).abs().max().item() < TOLERANCE


def test_sliding_layers_and_their_rope_base_matter(tmp_path):
    """The window and the local RoPE base change logits (so the parity test checks them, not a no-op)."""
    write_gemma3(tmp_path / "hf", LAYOUTS["sliding"])
    convert_from_hf(tmp_path / "hf", tmp_path / "out")
    model, job, _, _ = model_from_checkpoint(tmp_path / "out")
    x = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(3))
    for change in ({"layer_kinds": ["global"] * 6}, {"rope_local_theta": job.model.rope_theta}):
        other = build_model(type(job.model)(**{**vars(job.model), **change}), "cpu")
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert (model(x) - other.eval()(x)).abs().max() > 1e-3, change


def test_unsupported_gemma3_settings_are_refused(tmp_path):
    write_gemma3(tmp_path / "hf", LAYOUTS["global"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    with pytest.raises(CheckpointError, match="final_logit_softcapping"):
        convert_from_hf(tmp_path / "hf", tmp_path / "out")


def test_gemma3_flavour_and_family_flags():
    cfg = flavor_config("gemma3-270m")
    assert cfg.num_params() == 268_098_176  # Gemma 3 270M: 170M embedding + 98M in the blocks
    assert cfg.resolved_layer_kinds().count("global") == 3
    with pytest.raises(ConfigError, match="model.family 'gemma3' needs model.norm_unit_offset = true"):
        type(cfg)(**{**vars(cfg), "norm_unit_offset": False}).validate()
    with pytest.raises(ConfigError, match="unknown model family 'gemma9'; known: llama, gemma3"):
        type(cfg)(**{**vars(cfg), "family": "gemma9"}).validate()


def test_a_conditional_generation_checkpoint_converts_its_text_model(tmp_path):
    """Gemma3ForConditionalGeneration (4B and up): the config's text_config, the language model's tensors under
    model.language_model., the vision tower's left out — the same logits as the text-only model."""
    from safetensors.torch import load_file, save_file

    reference = write_gemma3(tmp_path / "hf", LAYOUTS["sliding"])
    folder = tmp_path / "hf"
    text = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForConditionalGeneration"],
                                                    "model_type": "gemma3", "text_config": text,
                                                    "vision_config": {"hidden_size": 8}}))
    tensors = {k.replace("model.", "model.language_model.", 1): v
               for k, v in load_file(folder / "model.safetensors").items()}
    tensors["model.vision_tower.patch_embedding.weight"] = torch.zeros(8, 3)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    result = convert_from_hf(folder, tmp_path / "out")
    assert result["architecture"] == "Gemma3ForConditionalGeneration"
    model, _, _, _ = model_from_checkpoint(tmp_path / "out")
    tokens = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(tokens) - reference(tokens).logits).abs().max().item() < TOLERANCE
