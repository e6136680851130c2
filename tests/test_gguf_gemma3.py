"""``convert from-gguf`` of Gemma 3 (the gemma3 family, meshlm/models/families/gemma3.py): logits equal to
transformers' own GGUF loader on small random files the tests write (tests/gemma3_gguf.py) — fp32 weights, and
quantised ones both sides dequantise alike — over sequences longer than the sliding window, so the global layer,
the windowed layers and their two RoPE bases all count.

Tolerance 1e-4 (max |Δ logits|, fp32): both models compute the same fp32 operations, so the difference measured
is 0.0 (as for the llama files, tests/test_gguf.py); the norm weights read without llama.cpp's 1 + w shift taken
off, or the wrong score scale or RoPE base, move logits by 1e-1 .. 10.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from gemma3_gguf import write_gemma3_gguf  # noqa: E402
from gguf.constants import GGMLQuantizationType as Q  # noqa: E402

from meshlm.checkpoint.load import model_from_checkpoint  # noqa: E402
from meshlm.cli.main import main  # noqa: E402
from meshlm.interop.gguf import convert_from_gguf  # noqa: E402
from meshlm.interop.gguf_file import GGUFFile  # noqa: E402

transformers.utils.logging.disable_progress_bar()
TOL = 1e-4
QUANTISED = {"attn_q": Q.Q8_0, "attn_v": Q.Q4_0, "ffn_down": Q.F16, "ffn_up": Q.Q5_0, "token_embd": Q.Q8_0}


def hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("types", [{}, QUANTISED], ids=["f32", "quantised"])
def test_logits_equal_transformers_gguf_loader(types, tmp_path):
    shape = write_gemma3_gguf(tmp_path / "g.gguf", types=types, seed=len(types))
    result = convert_from_gguf(tmp_path / "g.gguf", tmp_path / "run")
    assert result["architecture"] == "gemma3" and result["chat_template"] is True
    model, cfg, _, _ = model_from_checkpoint(tmp_path / "run")
    assert cfg.model.family == "gemma3" and cfg.model.tie_embeddings
    assert cfg.model.layer_kinds == ["sliding"] * 5 + ["global"] and cfg.model.sliding_window == 5
    assert (cfg.model.rope_theta, cfg.model.rope_local_theta, cfg.model.query_pre_attn_scalar) == (1e6, 1e4, 256)
    ids = torch.randint(0, shape["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids).float()
    ref = hf_logits(tmp_path / "g.gguf", ids)
    assert ref.abs().max() > 0.1
    assert (ours - ref).abs().max().item() <= TOL


def test_norm_weights_are_stored_as_one_plus_w(tmp_path):
    """meshlm keeps Gemma's w (its norm scales by 1 + w); the file holds 1 + w, so every norm is read minus 1."""
    write_gemma3_gguf(tmp_path / "g.gguf")
    convert_from_gguf(tmp_path / "g.gguf", tmp_path / "run")
    model = model_from_checkpoint(tmp_path / "run")[0]
    stored = GGUFFile(tmp_path / "g.gguf")
    state = model.state_dict()
    pairs = {"norm.weight": "output_norm.weight", "layers.2.attention.k_norm.weight": "blk.2.attn_k_norm.weight",
             "layers.5.post_ffn_norm.weight": "blk.5.post_ffw_norm.weight"}
    for ours, theirs in pairs.items():
        assert torch.equal(state[ours], stored.read(theirs) - 1.0), ours
    assert torch.equal(state["layers.0.attention.wq.weight"], stored.read("blk.0.attn_q.weight"))  # no q/k reorder


def test_cli_convert_reports_the_window(tmp_path, capfd):
    write_gemma3_gguf(tmp_path / "g.gguf", template=None)
    with pytest.raises(SystemExit) as info:
        main(["convert", "from-gguf", str(tmp_path / "g.gguf"), str(tmp_path / "run"), "--json"])
    out = capfd.readouterr().out
    assert info.value.code == 0, out
    report = json.loads(out)
    assert report["architecture"] == "gemma3" and report["chat_template"] is True  # the family's, see below
    assert any("sliding attention window of 5 tokens on 5 of 6 layers" in n for n in report["notes"])
    assert any("no chat template in the file: gemma3's turn format" in n for n in report["notes"])


def test_a_file_without_template_gets_gemmas_turns(tmp_path):
    """A base model's GGUF has no template (the real 270M file); the conversion writes Gemma's turn format, so SFT
    and chat use "<start_of_turn>user ... <start_of_turn>model" (before: SFT refused, lacking meshlm's chat
    tokens). The system message opens the first user turn; loss on the reply and its <end_of_turn> only."""
    from meshlm.data.posttrain.templates import HFChatTemplate, chat_template_for
    from meshlm.tokenizer import MeshTokenizer

    write_gemma3_gguf(tmp_path / "g.gguf", template=None)
    result = convert_from_gguf(tmp_path / "g.gguf", tmp_path / "run")
    assert result["chat_template"] is True
    ckpt = Path(result["checkpoint"])
    tok = MeshTokenizer.load(ckpt / "tokenizer.json")
    template = chat_template_for(tok, ckpt)
    assert isinstance(template, HFChatTemplate)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "world"}]
    encoded = template.encode(messages)
    text = tok.decode(encoded.ids, skip_special_tokens=False)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nhello<end_of_turn>\n<start_of_turn>model\n"
                    "world<end_of_turn>\n"), text
    learnt = tok.decode([i for i, m in zip(encoded.ids, encoded.loss_mask) if m], skip_special_tokens=False)
    assert learnt == "world<end_of_turn>"
    prompt = template.encode_prompt(messages[:2])
    assert tok.decode(prompt, skip_special_tokens=False).endswith("<end_of_turn>\n<start_of_turn>model\n")
    assert template.end_of_turn_ids() == [tok.backend.token_to_id("<end_of_turn>")]


def test_to_gguf_is_read_back_by_transformers(tmp_path):
    """Export (f32): transformers' GGUF loader reads the written gemma3 file with meshlm's logits and the original
    file's token ids; meshlm reads it back to the same logits."""
    from meshlm.interop.gguf_export import convert_to_gguf

    shape = write_gemma3_gguf(tmp_path / "g.gguf", types=QUANTISED)
    convert_from_gguf(tmp_path / "g.gguf", tmp_path / "run")
    (tmp_path / "out").mkdir()
    result = convert_to_gguf(tmp_path / "run", tmp_path / "out" / "e.gguf")
    assert result["architecture"] == "gemma3" and result["chat_template"] is True
    ids = torch.randint(0, shape["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model_from_checkpoint(tmp_path / "run")[0](ids).float()
    assert (hf_logits(tmp_path / "out" / "e.gguf", ids) - ours).abs().max().item() <= TOL
    convert_from_gguf(tmp_path / "out" / "e.gguf", tmp_path / "again")
    with torch.no_grad():
        assert torch.equal(model_from_checkpoint(tmp_path / "again")[0](ids).float(), ours)
    source, exported = (transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
                        for p in (tmp_path / "g.gguf", tmp_path / "out" / "e.gguf"))
    for text in ["Hello  world\n\n🙂 東京", "  leading spaces\tand </div> tags", "naïve café — it's 12345"]:
        assert exported(text)["input_ids"] == source(text)["input_ids"], repr(text)


def test_to_gguf_refuses_a_gemma3_llama_cpp_would_run_differently(tmp_path):
    """llama.cpp fixes the local RoPE base (10000) and the layer pattern (every sixth global) for gemma3 files."""
    import dataclasses

    from meshlm.errors import CheckpointError
    from meshlm.interop.gguf_export import gguf_architecture

    write_gemma3_gguf(tmp_path / "g.gguf")
    convert_from_gguf(tmp_path / "g.gguf", tmp_path / "run")
    cfg = model_from_checkpoint(tmp_path / "run")[1].model
    assert gguf_architecture(cfg) == "gemma3"
    with pytest.raises(CheckpointError, match="rope_local_theta differ from what llama.cpp assumes"):
        gguf_architecture(dataclasses.replace(cfg, rope_local_theta=5000.0))
    with pytest.raises(CheckpointError, match="layer_kinds differ"):
        gguf_architecture(dataclasses.replace(cfg, layer_kinds=["global"] + cfg.layer_kinds[1:]))


def test_linear_rope_scaling_scales_the_global_layers_only(tmp_path):
    """Gemma 3 4B+ files say rope.scaling.type linear (factor 8): llama.cpp divides the positions of the global
    layers by it and leaves the sliding layers unscaled. (transformers' GGUF loader reads no rope.scaling key for
    gemma3, so there is no reference to compare logits with: the config and the RoPE tables are checked.)"""
    from meshlm.models.rope import rope_inv_freq

    write_gemma3_gguf(tmp_path / "g.gguf", linear_rope=8.0)
    result = convert_from_gguf(tmp_path / "g.gguf", tmp_path / "run")
    cfg = model_from_checkpoint(tmp_path / "run")[1].model
    assert (cfg.rope_scaling, cfg.rope_scaling_factor) == ("linear", 8.0)
    assert any(n.startswith("linear RoPE scaling, factor 8 (global layers") for n in result["notes"])
    plain = 1.0 / (1e6 ** (torch.arange(0, 256, 2).float() / 256))
    assert torch.allclose(rope_inv_freq(cfg), plain / 8.0)
    assert torch.allclose(rope_inv_freq(cfg, local=True), 1.0 / (1e4 ** (torch.arange(0, 256, 2).float() / 256)))


def test_gguf_score_scale_is_dim_over_heads_for_the_62_layer_27b():
    """llama.cpp's gemma3 graph scales 27B (n_layer == 62) scores by (n_embd / n_head) ** -0.5, every other size
    by key_length ** -0.5; export writes no scale, so it accepts a 27B-shaped model only with that scalar."""
    import dataclasses

    from meshlm.errors import CheckpointError
    from meshlm.interop.gguf_export import gguf_architecture
    from meshlm.models import flavor_config
    from meshlm.models.families.gemma3 import config_from_gguf

    def meta(layers, dim, heads, key_length):
        return {"gemma3.block_count": layers, "gemma3.embedding_length": dim, "gemma3.attention.head_count": heads,
                "gemma3.attention.key_length": key_length, "gemma3.attention.sliding_window": 1024}

    assert config_from_gguf(meta(62, 5376, 32, 128), "gemma3")["query_pre_attn_scalar"] == 168.0  # 27B
    assert config_from_gguf(meta(48, 3840, 16, 256), "gemma3")["query_pre_attn_scalar"] == 256.0  # 12B
    small = flavor_config("gemma3-270m")
    kinds = ["sliding" if (i + 1) % 6 else "global" for i in range(62)]
    big = dataclasses.replace(small, n_layers=62, dim=5376, n_heads=32, n_kv_heads=16, head_dim=128,
                              layer_kinds=kinds, query_pre_attn_scalar=168.0)
    assert gguf_architecture(big) == "gemma3"
    with pytest.raises(CheckpointError, match="query_pre_attn_scalar differ"):
        gguf_architecture(dataclasses.replace(big, query_pre_attn_scalar=128.0))
    # 0 means head_dim: what llama.cpp uses below 62 layers
    assert gguf_architecture(dataclasses.replace(small, query_pre_attn_scalar=0.0)) == "gemma3"
