"""A meshlm checkpoint out as a GGUF file: ``convert_to_gguf``.

The checkpoint is loaded with :func:`~meshlm.checkpoint.load.model_from_checkpoint` (any parallel layout;
LoRA adapters merged into the base) and written with the ``gguf`` package's ``GGUFWriter`` under llama.cpp's
names, metadata keys and (for ``llama``) interleaved Q/K rows, with the tokenizer as ``tokenizer.ggml.*`` and the
chat template. Architecture: ``gemma3`` for the gemma3 family (norm weights written as 1 + w, as llama.cpp's
converter does; Gemma's sentencepiece vocabulary as ``tokenizer.ggml.model = "llama"``; refused where llama.cpp's
fixed gemma3 rules would run the model differently); ``qwen3`` with qk-norm, ``qwen2`` with q/k/v bias, else
``llama``; Llama 3.1 RoPE
scaling is written as llama.cpp's ``rope_freqs`` tensor (the divisor of each frequency). Matrices are
stored in the chosen type (f32, f16, bf16 or q8_0); norms and other 1-D tensors stay f32, as llama.cpp keeps
them, and a q8_0 matrix whose rows are not a multiple of 32 values falls back to f16 (llama.cpp does the same).

The writer is given every tensor's name, shape and type first; then each tensor is converted and written in turn,
so beside the model only one converted tensor is in memory. The file is written beside OUT under a temporary
name and renamed into place: a failure leaves OUT as it was.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshlm.checkpoint.load import model_from_checkpoint, resolve_checkpoint
from meshlm.data.posttrain.templates import MESHLM_CHAT_TEMPLATE, read_hf_chat_template
from meshlm.errors import CheckpointError, ConfigError
from meshlm.interop.gguf import norm_offset
from meshlm.interop.gguf_names import gguf_name, heads_of, to_interleaved
from meshlm.interop.gguf_tokenizer import tokenizer_to_gguf
from meshlm.interop.hf_tokenizer import read_meta
from meshlm.models.families import spec_of
from meshlm.models.llama import rope_inv_freq
from meshlm.models.lora import merge_lora
from meshlm.tokenizer import SPECIAL_TOKENS, MeshTokenizer

EXPORT_TYPES = ("f32", "f16", "bf16", "q8_0")


def convert_to_gguf(checkpoint: str | Path, out: str | Path, *, dtype: str = "f32",
                    overwrite: bool = False) -> dict[str, Any]:
    """Write the meshlm checkpoint (run dir or step folder) as the GGUF file ``out``."""
    if dtype not in EXPORT_TYPES:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(EXPORT_TYPES)}")
    out = Path(out)
    ckpt = resolve_checkpoint(checkpoint)
    _check_output(out, overwrite)
    if not (ckpt / "tokenizer.json").is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no tokenizer.json; it cannot be exported with its tokenizer")
    model, job, _, ckpt = model_from_checkpoint(ckpt)
    if model.cfg.head not in ("lm", "lm_value"):
        raise CheckpointError(f"{ckpt} has a {model.cfg.head} head, not a language-model head; GGUF holds language "
                              "models — export a score head with `meshlm convert to-hf` instead")
    merge_lora(model)  # no-op without adapters
    cfg = job.model
    arch = gguf_architecture(cfg)
    fields, template = _tokenizer_fields(ckpt, cfg.vocab_size)
    plan = _plan(model, cfg, dtype)
    tmp = _temp_beside(out)
    try:
        _write(tmp, arch, cfg, getattr(cfg, "source", "") or ckpt.parent.parent.name, fields, template, plan, dtype)
        _finish(tmp)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    types = Counter(qtype.name for _, _, qtype, _ in plan)
    return {"out": str(out), "checkpoint": str(ckpt), "architecture": arch, "dtype": dtype,
            "num_params": model.num_params(), "tensor_types": dict(sorted(types.items())),
            "bytes": out.stat().st_size, "chat_template": template is not None}


def gguf_architecture(cfg) -> str:
    """The llama.cpp architecture of a meshlm model; refuses what GGUF cannot say for it."""
    if cfg.family == "gemma3":
        return _gemma3_architecture(cfg)
    if cfg.family != "llama":
        raise CheckpointError(f"GGUF export of the {cfg.family} family is not implemented (meshlm writes llama, "
                              "qwen2 and qwen3 files); export it with `meshlm convert to-hf` instead")
    if cfg.qk_norm and cfg.qkv_bias:
        raise CheckpointError("the model has both qk_norm and qkv_bias; no llama.cpp architecture has exactly that")
    if cfg.sliding_window:
        raise CheckpointError(f"the model attends through a sliding window (model.sliding_window = "
                              f"{cfg.sliding_window}), which llama.cpp's llama/qwen2/qwen3 graphs do not apply; "
                              "GGUF export would change its outputs")
    arch = "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"
    if cfg.rope_scaling != "none" and arch != "llama":
        raise CheckpointError(f"RoPE scaling '{cfg.rope_scaling}' on a {arch} model: llama.cpp reads Llama 3.1 "
                              "scaling (a rope_freqs tensor) for llama models only")
    return arch


def _gemma3_architecture(cfg) -> str:
    """``gemma3``, when what llama.cpp reads back from the metadata written (its fixed layer pattern, local RoPE
    base and score scale: the family's ``gguf_config_in``) is the model."""
    meta = {f"gemma3.{k}": v for k, v in (("block_count", cfg.n_layers), ("embedding_length", cfg.dim),
                                           ("attention.head_count", cfg.n_heads),
                                           ("attention.key_length", cfg.resolved_head_dim),
                                           ("attention.sliding_window", cfg.sliding_window))}
    read = spec_of(cfg).gguf_config_in(meta, "gemma3")
    have = {"layer_kinds": (cfg.layer_kinds, list(cfg.resolved_layer_kinds())),
            "rope_local_theta": (cfg.rope_local_theta,),
            "query_pre_attn_scalar": (cfg.query_pre_attn_scalar or cfg.resolved_head_dim,)}  # 0 means head_dim
    wrong = [k for k, values in have.items() if read[k] not in values]
    if wrong or cfg.rope_scaling != "none":
        raise CheckpointError(f"the gemma3 model's {', '.join(wrong) or 'RoPE scaling'} differ from what llama.cpp "
                              "assumes for gemma3 files (every sixth layer global, local RoPE base 10000, scores "
                              "scaled by head_dim ** -0.5, or (dim / heads) ** -0.5 at 62 layers (27B), no RoPE "
                              "scaling); GGUF export would change its outputs")
    return "gemma3"


def _check_output(out: Path, overwrite: bool) -> None:
    if out.is_dir():
        raise CheckpointError(f"output '{out}' is a folder; pass a file path such as {out / 'model.gguf'}")
    if out.exists() and not overwrite:
        raise CheckpointError(f"output file '{out}' already exists; pass --overwrite to replace it or choose "
                              "another path")


def _temp_beside(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.tmp-")
    os.close(fd)
    return Path(name)


def _finish(tmp: Path) -> None:
    """fsync the written file and give it the modes the umask allows (mkstemp made it 0600)."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)


def _tokenizer_fields(ckpt: Path, vocab_rows: int) -> tuple[dict[str, Any], str | None]:
    """The tokenizer's ``tokenizer.ggml.*`` values and the chat template (the checkpoint's, else meshlm's for a
    tokenizer meshlm trained, else none)."""
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    if tokenizer.vocab_size > vocab_rows:
        raise CheckpointError(f"{ckpt / 'tokenizer.json'} has {tokenizer.vocab_size} tokens, more than the model's "
                              f"{vocab_rows} embedding rows; the checkpoint is inconsistent")
    fields = tokenizer_to_gguf(tokenizer, read_meta(ckpt), vocab_rows, ckpt / "tokenizer.json")
    found = read_hf_chat_template(ckpt)
    if found is not None:
        template = found[0]
    elif all(s in tokenizer.special_ids for s in SPECIAL_TOKENS):  # trained by meshlm: meshlm's template
        template = MESHLM_CHAT_TEMPLATE
    else:
        template = None
    return fields, template


# ------------------------------------------------------------------------------------------------ tensors
def _plan(model: torch.nn.Module, cfg, dtype: str) -> list[tuple[str, str, Any, torch.Tensor]]:
    """(meshlm name, GGUF name, tensor type, tensor) of every tensor to write, in state-dict order."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    wanted = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}[dtype]
    plan = []
    for name, t in model.state_dict().items():
        if (cfg.tie_embeddings and name == "output.weight") or name.endswith((".lora_A", ".lora_B")):
            continue  # a tied head is the embedding; adapters are merged into the base weight
        qtype = wanted if t.dim() == 2 else Q.F32
        if t.shape[-1] % GGML_QUANT_SIZES[qtype][0]:
            qtype = Q.F16
        if norm_offset(spec_of(cfg), name):  # Gemma: llama.cpp stores the norm weight w as 1 + w
            t = t.float() + norm_offset(spec_of(cfg), name)
        plan.append((name, gguf_name(name, cfg.family), qtype, t))
    if cfg.rope_scaling == "llama3":  # llama.cpp divides each RoPE frequency by its factor (convert_hf_to_gguf)

        plain = rope_inv_freq(dataclasses.replace(cfg, rope_scaling="none"))
        plan.append(("rope_freqs", "rope_freqs.weight", Q.F32, plain / rope_inv_freq(cfg)))
    return plan


def _array(name: str, tensor: torch.Tensor, qtype, cfg, permute: bool) -> np.ndarray:
    """The tensor as the bytes (or f32/f16 values) GGUF stores, in llama.cpp's row order."""
    from gguf.constants import GGMLQuantizationType as Q
    from gguf.quants import quantize

    values = tensor.detach().to(torch.float32)
    heads = heads_of(name, cfg.n_heads, cfg.n_kv_heads)
    if heads and permute:
        values = to_interleaved(values, heads)
    values = values.contiguous().numpy()
    if qtype == Q.F32:
        return values
    if qtype == Q.F16:
        half = values.astype(np.float16)
        if np.isinf(half).any() and not np.isinf(values).any():
            raise CheckpointError(f"tensor '{name}' has values beyond f16's range (|x| > 65504); export with "
                                  "--dtype bf16 or f32")
        return half
    return quantize(values, qtype)


def _write(path: Path, arch: str, cfg, name: str, tok: dict[str, Any], template: str | None,
           plan: list[tuple[str, str, Any, torch.Tensor]], dtype: str) -> None:
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    writer = gguf.GGUFWriter(str(path), arch)
    _write_metadata(writer, cfg, name, dtype)
    _write_tokenizer(writer, tok, template)
    for _, gname, qtype, tensor in plan:  # every tensor's name, shape and type, then the data in the same order
        block, size = GGML_QUANT_SIZES[qtype]
        writer.add_tensor_info(gname, tuple(tensor.shape), np.float16 if qtype == Q.F16 else np.float32,
                               tensor.numel() * size // block, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    permute = arch in spec_of(cfg).gguf_interleaved_qk
    for mname, _, qtype, tensor in plan:
        writer.write_tensor_data(_array(mname, tensor, qtype, cfg, permute))
    writer.close()


def _write_metadata(writer, cfg, name: str, dtype: str) -> None:
    from gguf.constants import LlamaFileType

    writer.add_name(name)
    writer.add_context_length(cfg.max_seq_len)
    writer.add_embedding_length(cfg.dim)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.ffn_hidden_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.resolved_head_dim)
    if cfg.resolved_head_dim != cfg.dim // cfg.n_heads:
        writer.add_key_length(cfg.resolved_head_dim)
        writer.add_value_length(cfg.resolved_head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    if cfg.family == "gemma3" and cfg.sliding_window:
        writer.add_sliding_window(cfg.sliding_window)
    writer.add_file_type({"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16,
                          "bf16": LlamaFileType.MOSTLY_BF16, "q8_0": LlamaFileType.MOSTLY_Q8_0}[dtype])
    if dtype == "q8_0":
        writer.add_quantization_version(2)  # ggml's current block layout (GGML_QNT_VERSION)


def _write_tokenizer(writer, tok: dict[str, Any], template: str | None) -> None:
    writer.add_tokenizer_model(tok.get("model", "gpt2"))
    writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    if tok.get("model") == "llama":  # sentencepiece: scores rank the merges, no merges listed, no prefix space
        writer.add_token_scores(tok["scores"])
        writer.add_add_space_prefix(False)
        if tok.get("unk") is not None:
            writer.add_unk_token_id(tok["unk"])
    else:
        writer.add_token_merges(tok["merges"])
    if tok["bos"] is not None:
        writer.add_bos_token_id(tok["bos"])
    writer.add_eos_token_id(tok["eos"])
    if tok["pad"] is not None:
        writer.add_pad_token_id(tok["pad"])
    writer.add_add_bos_token(tok["add_bos"])
    writer.add_add_eos_token(False)
    if template is not None:
        writer.add_chat_template(template)
