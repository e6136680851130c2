"""Tokenizers across the HF boundary.

Import: the HF ``tokenizer.json`` is copied as is, and ``tokenizer_meta.json`` records which of its tokens are
bos / eos / pad (:class:`meshlm.tokenizer.MeshTokenizer` reads it, so ``meshlm generate`` works on a converted
checkpoint). Which tokens those are follows what transformers itself would use:

- ``tokenizer_config.json``'s ``bos_token`` / ``eos_token`` / ``pad_token`` when the key is there (even null:
  Qwen's tokenizer declares no bos although its config.json names one, and prompts must not start with it);
- otherwise ``generation_config.json``'s ``*_token_id``, then ``config.json``'s.

Whether a plain prompt starts with bos (``add_bos_token``) is recorded too, from ``tokenizer_config.json``'s key
or else from what tokenizer.json's post-processor does; ``meshlm generate --prompt`` follows it.

All the eos ids of ``generation_config.json`` (Llama 3.1 Instruct has three) are kept in the meta file and
written back on export; ``meshlm generate`` stops at any of them (:func:`checkpoint_eos_ids`).

Export: ``tokenizer.json`` as is, plus the checkpoint's original ``tokenizer_config.json`` and
``chat_template.jinja`` when it came from HF (either may carry the chat template), else a minimal
tokenizer_config.json naming ``PreTrainedTokenizerFast``, the special tokens and meshlm's chat template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshlm.errors import CheckpointError, DataError
from meshlm.tokenizer.bpe import post_processor_adds_bos

META_FORMAT = "meshlm-tokenizer-meta"


def load_hf_tokenizer(hf_dir: Path):
    """The ``tokenizers.Tokenizer`` of an HF folder (tokenizer.json is required)."""
    from tokenizers import Tokenizer

    path = hf_dir / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"{hf_dir} has no tokenizer.json; meshlm needs the fast tokenizer file (save it with "
                        "AutoTokenizer.from_pretrained(...).save_pretrained(HF_DIR))")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exceptions with Rust messages
        raise DataError(f"{path} is not a valid tokenizer.json ({exc}); re-save the tokenizer") from None


def tokenizer_meta(hf_dir: Path, tokenizer, hf_config: dict[str, Any], vocab_rows: int) -> dict[str, Any]:
    """The bos/eos/pad tokens (strings and ids) of an HF folder's tokenizer; checks ids fit the embedding."""
    source = hf_dir / "tokenizer.json"
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_rows:
        raise DataError(f"{source} has {size} tokens but the model's embedding has {vocab_rows} rows "
                        "(vocab_size in config.json); use the tokenizer that belongs to this model")
    tok_cfg = _optional_json(hf_dir / "tokenizer_config.json")
    gen_cfg = _optional_json(hf_dir / "generation_config.json")
    roles: dict[str, Any] = {}
    for role in ("bos", "eos", "pad"):
        if f"{role}_token" in tok_cfg:
            roles[role] = _token_content(tok_cfg[f"{role}_token"])
        else:
            ident = _first_id(gen_cfg.get(f"{role}_token_id", hf_config.get(f"{role}_token_id")))
            roles[role] = tokenizer.id_to_token(ident) if ident is not None and 0 <= ident < size else None
        if roles[role] is not None and tokenizer.token_to_id(roles[role]) is None:
            raise DataError(f"{source}: the {role} token {roles[role]!r} named by the HF config is not in the "
                            "vocabulary; use the tokenizer that belongs to this model")
    if roles["eos"] is None:
        raise DataError(f"{hf_dir}: no eos token in tokenizer_config.json, generation_config.json or config.json; "
                        "add eos_token to tokenizer_config.json")
    eos_id = tokenizer.token_to_id(roles["eos"])
    eos_ids = _all_ids(gen_cfg.get("eos_token_id", hf_config.get("eos_token_id")))
    eos_ids = [eos_id] + [i for i in eos_ids if i != eos_id and 0 <= i < size]
    return {"format": META_FORMAT, "bos_token": roles["bos"], "eos_token": roles["eos"],
            "pad_token": roles["pad"], "eos_ids": eos_ids, "add_bos_token": _adds_bos(tokenizer, tok_cfg, roles["bos"])}


def _adds_bos(tokenizer, tok_cfg: dict[str, Any], bos: str | None) -> bool:
    """Whether the HF tokenizer starts a prompt with bos: tokenizer_config.json's ``add_bos_token`` when it says,
    else whether tokenizer.json's post-processor adds it (Llama 3 yes; SmolLM2, whose bos is the chat marker
    ``<|im_start|>``, and Qwen no)."""
    if bos is None:
        return False
    if isinstance(tok_cfg.get("add_bos_token"), bool):
        return tok_cfg["add_bos_token"]
    return post_processor_adds_bos(tokenizer, tokenizer.token_to_id(bos))


def _optional_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{path} is not valid JSON ({exc}); fix or delete it") from None
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string, or an AddedToken dict with 'content'."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _all_ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _first_id(value: Any) -> int | None:
    ids = _all_ids(value)
    return ids[0] if ids else None


def read_meta(ckpt: Path) -> dict[str, Any] | None:
    path = ckpt / "tokenizer_meta.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc}); the checkpoint is damaged") from None


def checkpoint_eos_ids(ckpt: Path, eos_id: int) -> list[int]:
    """Every id that ends a generation for the checkpoint in ``ckpt``: the tokenizer's ``eos_id`` first, then the
    other ``eos_ids`` of its tokenizer_meta.json (from an HF generation_config.json); just ``eos_id`` otherwise."""
    meta = read_meta(ckpt) or {}
    extra = meta.get("eos_ids") or []
    return [eos_id] + [i for i in _all_ids(extra) if i != eos_id]


def hf_tokenizer_config(bos: str | None, eos: str, pad: str | None, max_len: int,
                        chat_template: str | None = None) -> dict[str, Any]:
    """A tokenizer_config.json that AutoTokenizer (transformers 4.x and 5.x) loads as a fast tokenizer."""
    out = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
           "model_max_length": max_len, "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        out["chat_template"] = chat_template
    return out
