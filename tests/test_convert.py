"""HF checkpoints in and out (meshlm/interop): logits and greedy ids equal to transformers, bitwise round trips,
a checkpoint trained with FSDP converted out and back through the CLI, and one-line exit-2 answers to bad input.

Tolerance: max |logits difference| < 1e-4 in fp32. Both sides compute the same operations in the same order
(fp32 RMSNorm cast back before the weight, rotate-half RoPE with fp32 tables, sdpa attention), so the measured
difference is 0 or a few ulps (see docs/interop.md); 1e-4 (~1000 ulps at |logit| ~ 1) leaves room for another
BLAS kernel or sdpa backend, and is orders of magnitude below what a wrong mapping gives (a swapped or
untransposed weight, wrong RoPE pairing or a missing bias change logits by 1e-2 .. 1).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402

from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256  # noqa: E402
from meshlm.errors import CheckpointError  # noqa: E402
from meshlm.generate import generate  # noqa: E402
from meshlm.interop import convert_from_hf, convert_to_hf  # noqa: E402
from meshlm.interop.hf import hf_name  # noqa: E402
from meshlm.models import build_model  # noqa: E402
from meshlm.tokenizer import MeshTokenizer  # noqa: E402
from helpers import meshlm

transformers.utils.logging.disable_progress_bar()
TOLERANCE = 1e-4
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, rms_norm_eps=1e-6)
# name -> (config class, model class, config overrides, tokenizer specials (bos, eos), save_pretrained shard size)
FAMILIES = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
               ("<|begin_of_text|>", "<|end_of_text|>"), None),
    # vocab 512 > the tokenizer's 320: padded embedding rows, as Qwen ships them; no bos token, as Qwen.
    # Sliding window 40 on layer 1 only (max_window_layers 1): meshlm's full_attention_layers.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True, rope_theta=1e6, vocab_size=512,
                                                      use_sliding_window=True, sliding_window=40, max_window_layers=1),
              (None, "<|endoftext|>"), None),
    # head_dim 32 != hidden / heads = 16; saved in several shards.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, rope_theta=1e6), (None, "<|im_end|>"), "40KB"),
    # sliding window 48 < the 128 positions compared: every layer attends to 48 keys at most.
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=48, head_dim=16), ("<s>", "</s>"), None),
}
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<s>", "</s>"]
TOKENIZER_VOCAB = 320


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A byte-level BPE with HF-style special tokens, trained on a few documents (exactly TOKENIZER_VOCAB)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from meshlm.data import embedded_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(embedded_documents()[:40], trainer=trainer)
    assert tok.get_vocab_size() == TOKENIZER_VOCAB
    return tok


def build_hf(family: str, hf_tokenizer, folder: Path, seed: int = 0):
    """A tiny random HF model of `family` saved with its tokenizer in `folder`; returns the model (eval, fp32)."""
    config_cls, model_cls, overrides, (bos, eos), shard = FAMILIES[family]
    ids = {"bos_token_id": hf_tokenizer.token_to_id(bos) if bos else None, "eos_token_id": hf_tokenizer.token_to_id(eos)}
    config = getattr(transformers, config_cls)(**{**SHAPE, "vocab_size": TOKENIZER_VOCAB, **overrides, **ids})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # HF initialises norms to 1 and biases to 0; randomise all so every mapping is tested
        for name, param in model.named_parameters():
            param.normal_(1.0, 0.1) if "norm" in name else param.normal_(0.0, 0.08)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer, bos_token=bos, eos_token=eos)
    fast.save_pretrained(folder)
    return model


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    return tensors


def hf_greedy(model, prompt: list[int], num_new: int) -> list[int]:
    model.generation_config.eos_token_id = None  # never stop early: compare all num_new tokens
    out = model.generate(torch.tensor([prompt]), max_new_tokens=num_new, do_sample=False, pad_token_id=0)
    assert out.shape[1] == len(prompt) + num_new
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hf_family_logits_generation_and_round_trip(family, hf_tokenizer, tmp_path):
    hf_dir, out, back = tmp_path / "hf", tmp_path / "meshlm", tmp_path / "hf-again"
    reference = build_hf(family, hf_tokenizer, hf_dir)
    if FAMILIES[family][4]:
        assert (hf_dir / "model.safetensors.index.json").is_file()  # the sharded reader is exercised
    result = convert_from_hf(hf_dir, out)
    model, job, _, ckpt = model_from_checkpoint(out)
    assert result["num_params"] == sum(p.numel() for p in reference.parameters())

    seq = job.model.max_seq_len  # 128: longer than the mistral and qwen2 windows
    tokens = torch.randint(0, reference.config.vocab_size, (2, seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(tokens) - reference(tokens).logits).abs().max().item()
    assert diff < TOLERANCE, f"{family}: max |logits diff| {diff}"

    prompt = [5, 17, 42, 99]
    ours = generate(model, prompt, 20, greedy=True, eos_id=None)
    assert ours == hf_greedy(reference, prompt, 20)

    convert_to_hf(out, back)
    original, exported = read_safetensors(hf_dir), read_safetensors(back)
    assert exported.keys() == original.keys()  # a tied lm_head is absent from both
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype and torch.equal(exported[name], tensor), name
    again, info = transformers.AutoModelForCausalLM.from_pretrained(back, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert type(again).__name__ == type(reference).__name__
    with torch.no_grad():
        assert (again.eval()(tokens).logits - reference(tokens).logits).abs().max().item() < TOLERANCE

    # The converted tokenizer: HF's specials as bos/eos, and special strings in text stay text.
    tok, hf_tok = MeshTokenizer.load(ckpt / "tokenizer.json"), transformers.AutoTokenizer.from_pretrained(back)
    assert (tok.bos_id, tok.eos_id) == (hf_tok.bos_token_id, hf_tok.eos_token_id)
    assert tok.eos_id not in tok.encode(f"hi {hf_tok.eos_token} there")


@pytest.mark.parametrize("family, window, full_layers", [("mistral", 48, 0), ("qwen2", 40, 1)])
def test_sliding_window_is_read_and_matters(family, window, full_layers, hf_tokenizer, tmp_path):
    """The window comes from config.json as transformers reads it, and changes logits beyond it (so the parity
    test above checks the windowed computation, not a context clamped to the window)."""
    build_hf(family, hf_tokenizer, tmp_path / "hf")
    result = convert_from_hf(tmp_path / "hf", tmp_path / "out")
    model, job, _, _ = model_from_checkpoint(tmp_path / "out")
    assert (job.model.sliding_window, job.model.full_attention_layers, job.model.max_seq_len) == (window, full_layers,
                                                                                                   128)
    assert f"sliding attention window of {window} tokens" in result["notes"][0]
    unwindowed = build_model(dataclasses.replace(job.model, sliding_window=0), "cpu")
    unwindowed.load_state_dict(model.state_dict())
    x = torch.randint(0, 320, (1, 128), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        diff = (model(x) - unwindowed.eval()(x)).abs()
    assert diff[:, :window].max() == 0 and diff[:, window:].max() > 1e-3


def test_fsdp_checkpoint_to_hf_and_back_through_the_cli(debug_dataset, tmp_path):
    """Train with FSDP on 2 ranks, export, check transformers' logits; import again and sample via the CLI."""
    run, hf_dir, back = tmp_path / "run", tmp_path / "hf", tmp_path / "back"
    common = ["--set", "training.steps=2", "--set", "metrics.tensorboard=false", "--set", "training.eval_interval=0",
              "--set", "data.seq_len=32"]
    meshlm("train", "configs/debug.toml", "--nproc", "2", "--set", "parallel.dp_shard=2", *common,
           "--run-dir", str(run))
    meshlm("convert", "to-hf", str(run), str(hf_dir), "--max-shard-size", "600KB")
    assert (hf_dir / "model.safetensors.index.json").is_file()
    ours, job, _, _ = model_from_checkpoint(run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    tokens = torch.randint(0, job.model.vocab_size, (2, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(tokens) - hf(tokens).logits).abs().max().item() < TOLERANCE
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")

    meshlm("convert", "from-hf", str(hf_dir), str(back))
    sample = json.loads(meshlm("generate", "--checkpoint", str(back), "--prompt-ids", "1,2,3", "--max-new-tokens",
                               "16", "--greedy", "--json").stdout)
    expected = hf.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=16, do_sample=False)[0].tolist()
    assert sample["ids"] == expected  # both stop at eos (id 2) if they meet it
    info = json.loads(meshlm("inspect", str(back), "--json").stdout)
    assert info["step"] == 0 and info["weights_sha256"] == weights_sha256(ours)  # FSDP -> HF -> meshlm: bitwise

    # Fine-tuning from the converted run directory (checkpoint.init_from) with its own config; a learning rate of
    # 1e-12 leaves the weights where init_from put them (a random init would differ by ~0.02).
    meshlm("train", str(back / "config.resolved.toml"), "--set", f'checkpoint.init_from="{back}"', *common,
           "--set", "training.steps=1", "--set", "optimizer.lr=1e-12", "--run-dir", str(tmp_path / "tuned"))
    tuned = model_from_checkpoint(tmp_path / "tuned")[0].state_dict()
    assert max((tuned[k] - v).abs().max().item() for k, v in ours.state_dict().items()) < 1e-9


# ------------------------------------------------------------------------------------------------ bad input
def run_cli(args: list[str], capsys) -> tuple[int, str]:
    from meshlm.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    return exc.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def good_hf(hf_tokenizer, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("good") / "hf"
    build_hf("llama3", hf_tokenizer, folder)
    return folder


def _copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for file in src.iterdir():
        if file.name not in skip:
            (dst / file.name).write_bytes(file.read_bytes())
    return dst


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _bad_folder(case: str, good: Path, tmp: Path) -> Path:
    """A copy of the good HF folder broken in one way."""
    bad = _copy(good, tmp / case, skip={"no_config": ("config.json",), "no_weights": ("model.safetensors",),
                                        "no_tokenizer": ("tokenizer.json",)}.get(case, ()))
    if case == "architecture":
        _edit_json(bad / "config.json", architectures=["GPT2LMHeadModel"])
    elif case == "shape":
        _edit_json(bad / "config.json", intermediate_size=96)
    elif case == "missing_tensor":
        tensors = read_safetensors(good)
        del tensors["model.layers.1.mlp.up_proj.weight"]
        from safetensors.torch import save_file
        save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    elif case == "vocab":  # a consistent model with fewer embedding rows than the tokenizer has tokens
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE, vocab_size=256)).save_pretrained(bad)
    elif case == "pickle":
        (bad / "model.safetensors").unlink()
        (bad / "pytorch_model.bin").write_bytes(b"not loaded")
    return bad


BAD_CASES = {
    "no_config": "has no config.json",
    "no_weights": "has no weights",
    "no_tokenizer": "has no tokenizer.json",
    "architecture": "unsupported architecture ['GPT2LMHeadModel']; meshlm converts LlamaForCausalLM",
    "shape": "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64], config.json implies [96, 64]",
    "missing_tensor": "tensor 'model.layers.1.mlp.up_proj.weight' is missing",
    "vocab": "has 320 tokens but the model's embedding has 256 rows",
    "pickle": "only pickle weights",
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_hf_input_exits_2_with_one_line_and_writes_nothing(case, good_hf, tmp_path, capsys):
    bad = _bad_folder(case, good_hf, tmp_path)
    out = tmp_path / "out"
    capsys.readouterr()  # only the command's own output counts
    code, err = run_cli(["convert", "from-hf", str(bad), str(out)], capsys)
    assert code == 2 and BAD_CASES[case] in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == [case]  # no temp folder left either


def test_existing_output_is_refused_unless_overwrite(good_hf, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = run_cli(["convert", "from-hf", str(good_hf), str(out)], capsys)
    assert code == 2 and "already exists; pass --overwrite" in err and (out / "keep.txt").read_text() == "mine"
    code, _ = run_cli(["convert", "from-hf", str(good_hf), str(out), "--overwrite"], capsys)
    assert code == 0 and not (out / "keep.txt").exists() and (out / "config.resolved.toml").is_file()
    code, err = run_cli(["convert", "to-hf", str(out), str(good_hf)], capsys)
    assert code == 2 and "already exists" in err
    code, err = run_cli(["convert", "to-hf", str(out), str(out / "checkpoints"), "--overwrite"], capsys)
    assert code == 2 and "would replace the input" in err
    code, err = run_cli(["convert", "to-hf", str(out), str(tmp_path / "x"), "--max-shard-size", "big"], capsys)
    assert code == 2 and "--max-shard-size 'big'" in err and not (tmp_path / "x").exists()


def test_generate_cli_stops_at_any_eos_id_of_generation_config(good_hf, tmp_path, capfd):
    """An HF model whose generation_config.json lists two eos ids (as Llama 3.1 Instruct lists three) stops at the
    second one too, which it meets before the tokenizer's own eos."""
    out = convert_from_hf(good_hf, tmp_path / "plain")["out"]
    model = model_from_checkpoint(out)[0]
    eos = MeshTokenizer.load(model_from_checkpoint(out)[3] / "tokenizer.json").eos_id
    free = generate(model, [1, 2, 3], 12, greedy=True, eos_id=None)
    stop_at = next(i for i in range(1, 11) if free[i] not in free[:i])  # first met at step stop_at < 11
    assert eos not in free[:stop_at + 1]  # so only the second eos id can stop it there
    hf_dir = _copy(good_hf, tmp_path / "hf")
    _edit_json(hf_dir / "generation_config.json", eos_token_id=[eos, free[stop_at]])
    convert_from_hf(hf_dir, tmp_path / "two-eos")
    from meshlm.cli.main import main

    capfd.readouterr()  # file-descriptor capture: --json writes its document to the real stdout descriptor
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--checkpoint", str(tmp_path / "two-eos"), "--prompt-ids", "1,2,3", "--greedy",
              "--max-new-tokens", "12", "--json"])
    assert exc.value.code == 0
    sample = json.loads(capfd.readouterr().out)
    assert sample["eos_ids"] == [eos, free[stop_at]]
    assert sample["generated_ids"] == free[:stop_at + 1]  # shorter than the 12 it would give without the stop


@pytest.mark.parametrize("dtype, torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_to_hf_dtype_writes_that_dtype(dtype, torch_dtype, good_hf, tmp_path, capsys):
    run = convert_from_hf(good_hf, tmp_path / "m")["out"]
    code, err = run_cli(["convert", "to-hf", run, str(tmp_path / "hf"), "--dtype", dtype], capsys)
    assert code == 0, err
    ours = model_from_checkpoint(run)[0]
    exported = read_safetensors(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == str(torch_dtype).removeprefix("torch.")
    assert {t.dtype for t in exported.values()} == {torch_dtype}
    for name, tensor in ours.state_dict().items():  # each value rounded once from meshlm's fp32
        assert torch.equal(exported[hf_name(name, "llama")], tensor.to(torch_dtype)), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    rounded = model_from_checkpoint(run)[0]
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch_dtype).float())
        x = torch.randint(0, 320, (1, 32), generator=torch.Generator().manual_seed(4))
        assert (hf(x).logits - rounded(x)).abs().max().item() < TOLERANCE


def test_to_hf_fp16_refuses_values_out_of_range(good_hf, tmp_path):
    run = convert_from_hf(good_hf, tmp_path / "m")["out"]
    model, job, _, ckpt = model_from_checkpoint(run)
    from meshlm.interop.hf import _export_tensors

    with torch.no_grad():
        model.norm.weight[0] = 1e5
    with pytest.raises(CheckpointError, match="tensor 'norm.weight' has values beyond fp16's range"):
        _export_tensors(model, job.model, torch.float16)
    assert _export_tensors(model, job.model, torch.bfloat16)["model.norm.weight"][0] == 99840.0  # bf16 holds it


def test_from_hf_streams_one_tensor_at_a_time(good_hf, tmp_path, monkeypatch):
    """convert_from_hf never holds more than one weight tensor read from the files (so never the model): the
    storage of each tensor read is freed before the next one is read."""
    import gc
    import weakref

    from meshlm.interop.hf_files import SafetensorsWeights

    alive: list[weakref.ref] = []
    most = [0]
    read = SafetensorsWeights.read

    def counting_read(self, name):
        gc.collect()
        most[0] = max(most[0], sum(ref() is not None for ref in alive))  # storages of earlier reads still held
        tensor = read(self, name)
        alive.append(weakref.ref(tensor.untyped_storage()))  # dies only when no tensor uses the memory
        return tensor

    monkeypatch.setattr(SafetensorsWeights, "read", counting_read)
    convert_from_hf(good_hf, tmp_path / "m")
    # Every tensor read; at most one earlier one still alive (DCP's write loop variable holds the last written
    # tensor until the next is resolved). Writing all tensors into one DCP file would keep all 21 alive.
    assert len(alive) >= 2 * 9 + 3 and most[0] <= 1, most
    model = model_from_checkpoint(tmp_path / "m")[0]
    original = read_safetensors(good_hf)
    assert all(torch.equal(t, original[hf_name(n, "llama")]) for n, t in model.state_dict().items())


def test_failure_midway_leaves_nothing(good_hf, tmp_path, monkeypatch):
    import meshlm.interop.hf as hf

    def explode(*args, **kwargs):
        raise CheckpointError("disk full (simulated)")

    monkeypatch.setattr(hf, "write_safetensors", explode)
    with pytest.raises(CheckpointError):
        convert_to_hf(convert_from_hf(good_hf, tmp_path / "m")["out"], tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_parse_size():
    from meshlm.interop.hf_files import parse_size

    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30
    assert parse_size("600KB") == 600_000 and parse_size("1234") == 1234


def _hf_config(arch: str, **extra) -> dict:
    return {"architectures": [arch], "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 320, "max_position_embeddings": 128, **extra}


@pytest.mark.parametrize("arch, extra, expected", [
    ("MistralForCausalLM", {"sliding_window": None}, (0, 0)),
    ("MistralForCausalLM", {"sliding_window": 32}, (32, 0)),
    ("Qwen2ForCausalLM", {"sliding_window": 32, "max_window_layers": 1}, (0, 0)),  # use_sliding_window false
    ("Qwen3ForCausalLM", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2}, (32, 2)),
    ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 32,
                          "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}, (32, 1)),
    ("LlamaForCausalLM", {"sliding_window": 32}, (0, 0)),  # Llama has no window; transformers ignores the key
])
def test_window_fields_follow_transformers(arch, extra, expected):
    from meshlm.interop.hf_config import hf_config_from_model, model_config_from_hf

    cfg, _ = model_config_from_hf(_hf_config(arch, **extra), Path("config.json"))
    assert (cfg.sliding_window, cfg.full_attention_layers) == expected
    again, _ = model_config_from_hf(hf_config_from_model(cfg, None, [1], None), Path("config.json"))
    assert (again.sliding_window, again.full_attention_layers) == expected  # written back, read again


def test_window_patterns_meshlm_cannot_run_are_refused():
    from meshlm.interop.hf_config import hf_config_from_model, model_config_from_hf

    odd = _hf_config("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=32,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    with pytest.raises(CheckpointError, match=r"sliding-window attention on layers \[0, 2\]"):
        model_config_from_hf(odd, Path("config.json"))
    cfg, _ = model_config_from_hf(_hf_config("MistralForCausalLM", sliding_window=32), Path("config.json"))
    with pytest.raises(CheckpointError, match="full_attention_layers > 0"):
        hf_config_from_model(dataclasses.replace(cfg, full_attention_layers=1), None, [1], None)
