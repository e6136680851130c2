"""Hugging Face checkpoints in and out: ``convert_from_hf`` and ``convert_to_hf``.

Tensor names map one to one (no permutation: meshlm uses HF's rotate-half RoPE layout, see docs/model.md), and
every tensor is checked for presence and shape before anything is written. Both directions write into a temp
folder next to OUT and rename it into place, so a failure leaves nothing at OUT. See docs/interop.md.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultSavePlanner, SavePlanner
from torch.distributed.checkpoint.metadata import MetadataIndex

from meshlm.checkpoint.load import model_from_checkpoint, resolve_checkpoint
from meshlm.checkpoint.manager import CheckpointManager
from meshlm.config.loader import config_to_toml, load_config
from meshlm.data.posttrain.templates import MESHLM_CHAT_TEMPLATE
from meshlm.errors import CheckpointError, ConfigError
from meshlm.interop.hf_config import architecture_of, hf_config_from_model, model_config_from_hf
from meshlm.interop.hf_files import (
    SafetensorsWeights,
    atomic_folder,
    check_output,
    read_json,
    write_json,
    write_safetensors,
)
from meshlm.interop.hf_tokenizer import hf_tokenizer_config, load_hf_tokenizer, read_meta, tokenizer_meta
from meshlm.interop.peft import write_peft_adapter
from meshlm.models.config import CUSTOM_FLAVOR, ModelConfig
from meshlm.models.families import family_spec
from meshlm.models.llama import Transformer
from meshlm.models.lora import merge_lora
from meshlm.tokenizer import SPECIAL_TOKENS, MeshTokenizer
from meshlm.tokenizer.bpe import TOKENIZER_META, tokenizer_files
from meshlm.train.run_dir import RESOLVED

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # "5GB", transformers' default
EXPORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Tensors older HF checkpoints carry that are derived, not learned: skipped on import.
_DERIVED = re.compile(r"\.rotary_emb\.inv_freq$")


def hf_name(name: str, family: str) -> str:
    """The HF name of a meshlm state-dict key in ``family`` (the model config's ``family``), e.g.
    layers.3.attention.wq.weight -> model.layers.3.self_attn.q_proj.weight (meshlm/models/families/)."""
    return family_spec(family).external_name(name, "hf")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """meshlm name -> shape of every stored tensor (a tied output head is the embedding, so not listed)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if cfg.tie_embeddings:
        del shapes["output.weight"]
    return shapes


# ------------------------------------------------------------------------------------------------- import
def convert_from_hf(hf_dir: str | Path, out: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Write the HF model in ``hf_dir`` as a meshlm run directory ``out`` (config.resolved.toml +
    checkpoints/step-00000000/), usable by ``meshlm generate/inspect`` and ``checkpoint.init_from``."""
    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise CheckpointError(f"'{hf_dir}' is not a folder; pass a Hugging Face model folder (config.json, "
                              "*.safetensors, tokenizer.json)")
    hf_config = read_json(hf_dir / "config.json", "pass the folder written by save_pretrained")
    cfg, notes = model_config_from_hf(hf_config, hf_dir / "config.json")
    weights = SafetensorsWeights(hf_dir)
    hf_names = _check_tensors(weights, cfg)
    tokenizer = load_hf_tokenizer(hf_dir)
    meta = tokenizer_meta(hf_dir, tokenizer, hf_config, cfg.vocab_size)
    check_output(out, overwrite, [hf_dir])

    arch = architecture_of(hf_config, hf_dir / "config.json")
    meta["converted_from"] = {"format": "huggingface", "architecture": arch, "path": str(hf_dir.resolve())}
    with atomic_folder(out) as tmp, tempfile.TemporaryDirectory() as staging:
        # Every tokenizer file the folder has (the chat template lives in tokenizer_config.json or, as
        # transformers 5 writes it, chat_template.jinja); tokenizer_meta.json is meshlm's, written here.
        extra = {**tokenizer_files(hf_dir), TOKENIZER_META: Path(staging) / TOKENIZER_META}
        write_json(extra[TOKENIZER_META], meta)
        ckpt = _save_run_dir(tmp, cfg, _StreamingPlanner(weights, hf_names), meta["converted_from"], extra)
    return {"out": str(out), "checkpoint": str(out / ckpt.relative_to(tmp)), "architecture": arch,
            "num_params": cfg.num_params(), "notes": notes}


def _check_tensors(weights: SafetensorsWeights, cfg: ModelConfig) -> dict[str, str]:
    """meshlm name -> HF name for every expected tensor, each present with the right shape; nothing unknown. A
    multimodal checkpoint's language model is read under its own prefix, its other towers left out (the family
    spec's hf_text_prefixes / hf_skip_prefixes)."""
    spec = family_spec(cfg.family)
    names = {}
    for name, shape in expected_shapes(cfg).items():
        hf = hf_name(name, cfg.family)
        inner = [p + hf.removeprefix("model.") for p in spec.hf_text_prefixes if hf.startswith("model.")]
        hf = next((n for n in [hf, *inner] if n in weights.entries), hf)
        if hf not in weights.entries:
            raise CheckpointError(f"tensor '{hf}' is missing from the weights; the files do not match "
                                  "config.json (or the download is incomplete)")
        found = weights.entries[hf][1]
        if found != shape:
            raise CheckpointError(f"tensor '{hf}' has shape {list(found)}, config.json implies {list(shape)}; the "
                                  "weights and config.json do not belong together")
        weights.check_float(hf)
        names[name] = hf
    ignorable = {"lm_head.weight"} if cfg.tie_embeddings else set()  # HF ties it to the embedding on load too
    unknown = sorted(n for n in weights.entries if n not in names.values() and n not in ignorable
                     and not _DERIVED.search(n) and not n.startswith(spec.hf_skip_prefixes or ("\0",)))
    if unknown:
        raise CheckpointError(f"tensor '{unknown[0]}' (and {len(unknown) - 1} more) has no meshlm counterpart; "
                              "this variant of the architecture is not supported")
    return names


class _StreamingPlanner(DefaultSavePlanner):
    """A DCP save planner that plans from a meta-device model and reads each tensor from the safetensors files
    only when DCP writes it, so converting holds one tensor (in fp32) at a time, never the model.

    DCP asks ``lookup_object`` for each tensor in turn while writing (one file, serially, on one process);
    bf16/fp16 weights are upcast exactly to the fp32 the meshlm model keeps.
    """

    def __init__(self, weights: SafetensorsWeights, hf_names: dict[str, str]) -> None:
        super().__init__()
        self._weights = weights
        self._hf_names = dict(hf_names)  # a tied head is saved once, as tok_embeddings.weight (no lookup of its own)

    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = super().lookup_object(index)
        if isinstance(obj, torch.Tensor) and obj.is_meta:  # the checkpoint key is "model.<meshlm name>"
            tensor = self._weights.read(self._hf_names[index.fqn.removeprefix("model.")])
            return tensor.to(torch.float32)
        return obj


def _save_run_dir(run_dir: Path, cfg: ModelConfig, planner: SavePlanner, source: dict[str, Any],
                  extra_files: dict[str, Path]) -> Path:
    """config.resolved.toml and a weights-only step-0 checkpoint whose tensors ``planner`` supplies. ``source``
    (format, path, ...) is recorded in train_state.json; the model's flavour becomes "custom" and ``model.source``
    the name of ``source["path"]`` unless ``cfg.source`` is set."""
    job = load_config(None)
    # A converted model has no named flavour; model.source names the file or folder it came from.
    job.model = dataclasses.replace(cfg, flavor=CUSTOM_FLAVOR, source=cfg.source or Path(source["path"]).name)
    job.data.seq_len = min(job.data.seq_len, cfg.max_seq_len)
    job.validate()
    toml = config_to_toml(job)
    (run_dir / RESOLVED).write_text(toml, encoding="utf-8")
    state = {"tokens_seen": 0, "converted_from": source}
    with torch.device("meta"):
        model = Transformer(job.model)  # shapes and names only: the planner reads each tensor when it is written
    return CheckpointManager(run_dir, keep_last=1).save(0, [model], None, state, toml, extra_files=extra_files,
                                                        planner=planner)


# ------------------------------------------------------------------------------------------------- export
def convert_to_hf(checkpoint: str | Path, out_dir: str | Path, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                  overwrite: bool = False, dtype: str = "fp32", adapter_only: bool = False) -> dict[str, Any]:
    """Write a meshlm checkpoint (run dir or step folder, any parallel layout) as an HF folder that
    ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` loads with no custom code; the weights are
    stored in ``dtype`` (fp32, bf16 or fp16; round to nearest even from meshlm's fp32). A LoRA checkpoint is
    exported merged (base + adapters), or with ``adapter_only`` as a PEFT adapter folder; a reward model as a
    one-label ``...ForSequenceClassification``."""
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(EXPORT_DTYPES)}")
    out_dir = Path(out_dir)
    ckpt = resolve_checkpoint(checkpoint)
    check_output(out_dir, overwrite, [Path(checkpoint), ckpt])
    if not (ckpt / "tokenizer.json").is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no tokenizer.json; it cannot be exported with its tokenizer")
    model, job, _, ckpt = model_from_checkpoint(ckpt)
    if adapter_only:
        return _export_adapter(model, job, ckpt, out_dir, overwrite)
    merge_lora(model)  # no-op without adapters
    head = model.cfg.head  # the checkpoint's model.head (checkpoint/load.py)
    if head == "classes":
        raise CheckpointError(f"{ckpt} has a classes head (one logit per class, with a bias), which no transformers "
                              "...ForSequenceClassification holds (their score has no bias); it has no HF form yet")
    reward = head == "score"
    cfg = model.cfg if reward else job.model  # a reward model's head is untied from the embedding
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")  # reads tokenizer_meta.json when converted from HF
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{ckpt / 'tokenizer.json'} has {tokenizer.vocab_size} tokens, more than the "
                              f"model's {cfg.vocab_size} embedding rows; the checkpoint is inconsistent")
    meta = read_meta(ckpt) or {}
    eos_ids = meta.get("eos_ids") or [tokenizer.eos_id]
    torch_dtype = EXPORT_DTYPES[dtype]
    config = hf_config_from_model(cfg, tokenizer.bos_id, eos_ids, tokenizer.pad_id,
                                  dtype=str(torch_dtype).removeprefix("torch."))
    tensors = _export_tensors(model, cfg, torch_dtype)
    if reward:
        config, tensors = _as_sequence_classifier(config, tensors)
    with atomic_folder(out_dir) as tmp:
        write_json(tmp / "config.json", config)
        write_json(tmp / "generation_config.json", {key: config[key] for key in
                                                    ("bos_token_id", "eos_token_id", "pad_token_id")})
        files = write_safetensors(tensors, tmp, max_shard_bytes)
        _export_tokenizer(ckpt, tokenizer, cfg.max_seq_len, tmp)
    return {"out": str(out_dir), "checkpoint": str(ckpt), "architecture": config["architectures"][0],
            "num_params": model.num_params(), "weight_files": files}


def _export_tokenizer(ckpt: Path, tokenizer, max_len: int, out: Path) -> None:
    """The checkpoint's tokenizer files as HF has them (tokenizer_meta.json is meshlm's own, left out); a
    checkpoint without a tokenizer_config.json gets a minimal one, with meshlm's chat template when its
    tokenizer has meshlm's chat tokens."""
    for name, src in tokenizer_files(ckpt).items():
        if name != TOKENIZER_META:
            shutil.copyfile(src, out / name)
    if (ckpt / "tokenizer_config.json").is_file():
        return
    token = tokenizer.backend.id_to_token
    meshlm_chat = all(s in tokenizer.special_ids for s in SPECIAL_TOKENS)
    write_json(out / "tokenizer_config.json", hf_tokenizer_config(
        token(tokenizer.bos_id) if tokenizer.bos_id is not None else None, token(tokenizer.eos_id),
        token(tokenizer.pad_id) if tokenizer.pad_id is not None else None, max_len,
        MESHLM_CHAT_TEMPLATE if meshlm_chat and not (ckpt / "chat_template.jinja").is_file() else None))


def _export_tensors(model: torch.nn.Module, cfg: ModelConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """HF name -> tensor in ``dtype``. In fp32 these are the model's own parameters (no second copy of the model:
    parameters never share storage once the tied head is left out); fp16 refuses values it cannot hold."""
    tensors = {}
    for name, t in model.state_dict().items():
        if cfg.tie_embeddings and name == "output.weight":
            continue  # HF ties lm_head to the embedding on load
        if name.endswith((".lora_A", ".lora_B")) or name.startswith("output.value."):
            continue  # merged into the base weight; a PPO value head is no part of the HF language model
        out = t.detach().to(dtype).contiguous()
        if dtype == torch.float16 and torch.isinf(out).any() and not torch.isinf(t).any():
            raise CheckpointError(f"tensor '{name}' has values beyond fp16's range (|x| > 65504, max "
                                  f"{t.abs().max().item():.3g}); export with --dtype bf16 or fp32")
        tensors[hf_name(name, cfg.family)] = out
    return tensors


def _as_sequence_classifier(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """A reward model as transformers' ``<Family>ForSequenceClassification`` with one label: the score head is
    ``score.weight``; transformers reads it at the last token that is not ``pad_token_id``, as meshlm does at
    ``length − 1`` of a right-padded row."""
    if config.get("pad_token_id") is None:
        raise CheckpointError("a reward model exports as a sequence classifier only with a pad token (transformers "
                              "finds each row's last token by it); its tokenizer has none")
    arch = config["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")
    config = {**config, "architectures": [arch], "num_labels": 1, "id2label": {"0": "LABEL_0"},
              "label2id": {"LABEL_0": 0}, "tie_word_embeddings": False}
    tensors = {("score.weight" if k == "lm_head.weight" else k): v for k, v in tensors.items()}
    return config, tensors


def _export_adapter(model: torch.nn.Module, job, ckpt: Path, out_dir: Path, overwrite: bool) -> dict[str, Any]:
    """A LoRA checkpoint's adapters as a PEFT folder; its base is the checkpoint's ``checkpoint.init_from``
    (export that with ``convert to-hf`` too and load the adapter onto it)."""
    lora = job.lora
    if not lora.enabled:
        raise CheckpointError(f"{ckpt} has no LoRA adapters (lora.rank = 0); drop --adapter-only to export the "
                              "whole model")
    with atomic_folder(out_dir) as tmp:
        files = write_peft_adapter(model, tmp, lora.targets, lora.rank, lora.alpha, lora.dropout,
                                   base=job.checkpoint.init_from)
    num = sum(p.numel() for n, p in model.named_parameters() if n.endswith((".lora_A", ".lora_B")))
    return {"out": str(out_dir), "checkpoint": str(ckpt), "architecture": "PEFT LoRA adapter",
            "num_params": num, "weight_files": files, "base": job.checkpoint.init_from}
