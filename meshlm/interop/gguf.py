"""GGUF files (llama.cpp, ollama, LM Studio) in: ``convert_from_gguf`` writes a meshlm run directory.

The file's header is parsed by :mod:`meshlm.interop.gguf_file`; the model config comes from its metadata
(``{arch}.block_count``, ``embedding_length``, ...), and each tensor is dequantised to fp32 (every type
``gguf.quants.dequantize`` handles: F32, F16, BF16, Q4_0 ... Q8_0, the K-quants, the IQ types) only when DCP
writes it, through the same streaming planner ``convert from-hf`` uses — so converting holds one tensor at a
time, never the model. The architecture (``general.architecture``) picks the model family
(meshlm/models/families/): its llama.cpp tensor names, the architectures whose Q/K rows llama.cpp interleaved
(``llama``: put back into meshlm's rotate-half order, :mod:`meshlm.interop.gguf_names`), what llama.cpp's
converter added to the norm weights (Gemma's are stored as 1 + w; meshlm's (1 + w) norm keeps w, so the one is
subtracted again) and the family's config fields beyond the common shape keys (Gemma 3's layer kinds, local RoPE
base, score scale). The tokenizer is rebuilt from ``tokenizer.ggml.*`` (:mod:`meshlm.interop.gguf_tokenizer`).
Export is :mod:`meshlm.interop.gguf_export`. See docs/interop.md.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshlm.errors import CheckpointError, ConfigError
from meshlm.interop.gguf_file import GGUFFile
from meshlm.interop.gguf_names import heads_of
from meshlm.interop.gguf_tokenizer import tokenizer_from_gguf
from meshlm.interop.hf import _save_run_dir, _StreamingPlanner, expected_shapes
from meshlm.interop.hf_files import atomic_folder, check_output, write_json
from meshlm.models.config import ModelConfig
from meshlm.models.families import FAMILIES, family_of_gguf, family_spec, spec_of
from meshlm.models.family import FamilySpec
from meshlm.models.llama import rope_inv_freq

ROPE_FREQS = "rope_freqs.weight"
_LAYER = re.compile(r"^layers\.\d+\.")


@functools.cache
def _dequantisable(qtype) -> bool:
    """Whether the gguf package can dequantise this tensor type (tried on one zero block)."""
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    if qtype.name in ("F32", "F16"):
        return True
    if qtype.name.startswith(("I", "F64")) and not qtype.name.startswith("IQ"):
        return False  # integer (and f64) tensors hold no weights
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True


# ------------------------------------------------------------------------------------------------- config
def model_config_from_gguf(gguf: GGUFFile) -> tuple[ModelConfig, str, list[str]]:
    """(the ModelConfig, the GGUF architecture, notes for the user) from the file's metadata."""
    meta, source = gguf.meta, gguf.path
    arch = meta.get("general.architecture")
    family = family_of_gguf(arch) if isinstance(arch, str) else ""
    if not family:
        known = [a for name in FAMILIES for a in family_spec(name).gguf_architectures]
        raise CheckpointError(f"{source}: architecture {arch!r} (general.architecture) is not supported; meshlm "
                              f"converts {', '.join(known)} (llama.cpp writes Mistral models as llama)")

    def req(key: str) -> int:
        value = meta.get(f"{arch}.{key}")
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise CheckpointError(f"{source}: metadata '{arch}.{key}' is missing or not a positive integer; the "
                                  "file is damaged or was not written for llama.cpp")
        return value

    dim, n_heads = req("embedding_length"), req("attention.head_count")
    head_dim = meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count") or dim // n_heads
    rotary = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim or meta.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise CheckpointError(f"{source}: rope.dimension_count {rotary} / value_length differ from the head size "
                              f"{head_dim}; meshlm rotates whole heads of equal q/k/v size")
    scaling = _rope_scaling(meta, arch, source)
    if "token_embd.weight" not in gguf.tensors:
        raise CheckpointError(f"{source}: no tensor 'token_embd.weight'; the file holds no language model")
    vocab = gguf.shape("token_embd.weight")[0]
    spec = family_spec(family)
    fields = spec.gguf_config_in(meta, arch) if spec.gguf_config_in else {}
    fields.update(qkv_bias=arch == "qwen2", qk_norm=fields.get("qk_norm", arch == "qwen3"),
                  tie_embeddings="output.weight" not in gguf.tensors, **scaling)  # the file decides, not the family
    cfg = ModelConfig(
        flavor="debug",  # only the loader's base: every field below is explicit
        dim=dim, n_layers=req("block_count"), n_heads=n_heads,
        n_kv_heads=meta.get(f"{arch}.attention.head_count_kv") or n_heads,
        head_dim=head_dim if head_dim != dim // n_heads else 0,
        ffn_hidden_dim=req("feed_forward_length"), vocab_size=vocab,
        max_seq_len=req("context_length"),
        norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)), **fields,
    )
    try:
        cfg.validate()
    except ConfigError as exc:
        raise CheckpointError(f"{source}: the model shape is not valid for meshlm ({exc})") from None
    notes = [f"dequantised {t} tensors to fp32" for t in sorted({gguf.type_name(n) for n in gguf.tensors}
                                                                 - {"F32"})]
    if cfg.sliding_window and "sliding" in cfg.resolved_layer_kinds():
        notes.append(f"{family}: sliding attention window of {cfg.sliding_window} tokens on "
                     f"{cfg.resolved_layer_kinds().count('sliding')} of {cfg.n_layers} layers")
    if cfg.rope_scaling == "linear":
        notes.append(f"linear RoPE scaling, factor {cfg.rope_scaling_factor:g}"
                     + (" (global layers; the sliding ones unscaled, as llama.cpp runs them)"
                        if "sliding" in cfg.resolved_layer_kinds() and cfg.rope_local_theta else ""))
    if ROPE_FREQS in gguf.tensors:
        cfg = _llama3_rope(gguf, cfg)
        notes.append(f"Llama 3.1 RoPE scaling (factor {cfg.rope_scaling_factor:g}) read from {ROPE_FREQS}")
    return cfg, arch, notes


def _rope_scaling(meta: dict[str, Any], arch: str, source: Path) -> dict[str, Any]:
    """ModelConfig fields of ``{arch}.rope.scaling.*``: none, or linear (positions divided by the factor, as
    llama.cpp's freq_scale; Gemma 3 4B+ on its global layers). Llama 3.1's comes as a tensor (rope_freqs)."""
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling in ("none", None):
        return {}
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if scaling != "linear" or not isinstance(factor, (int, float)) or factor <= 0:
        raise CheckpointError(f"{source}: RoPE scaling '{scaling}' ({arch}.rope.scaling.type, factor {factor!r}) is "
                              "not supported; meshlm implements none, linear with a positive factor and Llama 3.1's "
                              "(a rope_freqs tensor in GGUF)")
    return {"rope_scaling": "linear", "rope_scaling_factor": float(factor)}


def _llama3_rope(gguf: GGUFFile, cfg: ModelConfig) -> ModelConfig:
    """``rope_freqs.weight`` — llama.cpp's per-frequency divisors of the RoPE frequencies, how its convert script
    stores Llama 3.1+ scaling — as meshlm's llama3 settings. GGUF keeps only the divisors: the factor is their
    largest, and the other parameters are Meta's for every Llama 3.1/3.2/3.3 model (low 1, high 4, original
    context 8192), accepted only when they reproduce every divisor."""
    divisors = gguf.read(ROPE_FREQS).reshape(-1).double()  # (Dh/2,)
    scaled = dataclasses.replace(cfg, rope_scaling="llama3", rope_scaling_factor=float(divisors.max()),
                                 rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192)
    if divisors.numel() == cfg.resolved_head_dim // 2:
        expected = rope_inv_freq(cfg).double() / rope_inv_freq(scaled).double()
        if torch.allclose(expected, divisors, rtol=1e-5, atol=0.0):  # both computed in fp32 from the same formula
            return scaled
    raise CheckpointError(f"{gguf.path}: {ROPE_FREQS} holds RoPE frequency divisors that are not Llama 3.1's "
                          "scaling with low/high frequency factors 1/4 and an original context of 8192; meshlm "
                          "cannot run this RoPE variant")


def _check_tensors(gguf: GGUFFile, cfg: ModelConfig, arch: str) -> dict[str, str]:
    """meshlm name -> GGUF name for every expected tensor, each present with the right shape and a type the gguf
    package dequantises; nothing unknown. Marks the q/k weights of a ``llama`` file to be un-permuted and the norm
    weights of a family whose converter shifted them to be shifted back."""
    names, spec = {}, spec_of(cfg)
    for name, shape in expected_shapes(cfg).items():
        gname = spec.external_name(name, "gguf")
        if gname not in gguf.tensors:
            raise CheckpointError(f"{gguf.path}: tensor '{gname}' is missing; the file does not hold a complete "
                                  f"{arch} model")
        if gguf.shape(gname) != shape:
            raise CheckpointError(f"{gguf.path}: tensor '{gname}' has shape {list(gguf.shape(gname))}, the metadata "
                                  f"implies {list(shape)}; the file is damaged")
        if not _dequantisable(gguf.qtype(gname)):
            raise CheckpointError(f"{gguf.path}: tensor '{gname}' has type {gguf.type_name(gname)}, which the gguf "
                                  "package cannot dequantise; re-quantise the model to a common type (e.g. Q8_0)")
        heads = heads_of(name, cfg.n_heads, cfg.n_kv_heads)
        if heads and arch in spec.gguf_interleaved_qk:
            gguf.unpermute(gname, heads)
        if norm_offset(spec, name):
            gguf.shift(gname, -norm_offset(spec, name))
        names[name] = gname
    unknown = sorted(set(gguf.tensors) - set(names.values()) - {ROPE_FREQS})
    if unknown:
        raise CheckpointError(f"{gguf.path}: tensor '{unknown[0]}' (and {len(unknown) - 1} more) has no meshlm "
                              f"counterpart; this variant of {arch} is not supported")
    return names


def norm_offset(spec: FamilySpec, name: str) -> float:
    """What llama.cpp's converter adds to meshlm tensor ``name`` of this family: the family's norm offset for a
    norm weight (any block norm, or the final one), else 0 (import subtracts it, export adds it)."""
    if not spec.gguf_norm_offset:
        return 0.0
    norms = {f"{norm.module}.weight" for norm in spec.norms} | {"norm.weight"}
    return spec.gguf_norm_offset if _LAYER.sub("", name) in norms else 0.0


# ------------------------------------------------------------------------------------------------- import
def _family_chat_template(spec: FamilySpec, tokenizer: Any, tok_config: dict[str, Any]) -> list[str]:
    """A file without a chat template (a base model) gets its family's turn format when the vocabulary holds
    that format's tokens (``tok_config`` gains it); the note says so."""
    if "chat_template" in tok_config or not spec.chat_template:
        return []
    if any(tokenizer.token_to_id(t) is None for t in spec.chat_tokens):
        return []
    tok_config["chat_template"] = spec.chat_template
    return [f"no chat template in the file: {spec.name}'s turn format ({', '.join(spec.chat_tokens)}) written "
            "as the checkpoint's template"]


def convert_from_gguf(path: str | Path, out: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Write the model in GGUF file ``path`` as a meshlm run directory ``out`` (config.resolved.toml +
    checkpoints/step-00000000/ with the tokenizer and chat template), as ``convert_from_hf`` does."""
    path, out = Path(path), Path(out)
    gguf = GGUFFile(path)
    cfg, arch, notes = model_config_from_gguf(gguf)
    names = _check_tensors(gguf, cfg, arch)
    tokenizer, meta, tok_config = tokenizer_from_gguf(gguf.meta, path, cfg.vocab_size, cfg.max_seq_len)
    notes += _family_chat_template(spec_of(cfg), tokenizer, tok_config)
    check_output(out, overwrite, [path])
    source = {"format": "gguf", "architecture": arch, "path": str(path.resolve()),
              "name": gguf.meta.get("general.name")}
    meta["converted_from"] = source
    with atomic_folder(out) as tmp, tempfile.TemporaryDirectory() as staging:
        staged = Path(staging)
        tokenizer.save(str(staged / "tokenizer.json"))
        write_json(staged / "tokenizer_meta.json", meta)
        write_json(staged / "tokenizer_config.json", tok_config)
        extra = {n: staged / n for n in ("tokenizer.json", "tokenizer_meta.json", "tokenizer_config.json")}
        if "chat_template" in tok_config:  # where transformers 5 keeps it; read_hf_chat_template looks here first
            (staged / "chat_template.jinja").write_text(tok_config["chat_template"], encoding="utf-8")
            extra["chat_template.jinja"] = staged / "chat_template.jinja"
        ckpt = _save_run_dir(tmp, cfg, _StreamingPlanner(gguf, names), source, extra)
    return {"out": str(out), "checkpoint": str(out / ckpt.relative_to(tmp)), "architecture": arch,
            "num_params": cfg.num_params(), "chat_template": "chat_template" in tok_config, "notes": notes}
