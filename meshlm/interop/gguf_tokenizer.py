"""Tokenizers across the GGUF boundary: ``tokenizer.ggml.*`` metadata <-> a Hugging Face ``tokenizer.json``.

A GGUF stores no tokenizer.json; llama.cpp keeps the vocabulary (``tokens``, ``token_type``), the BPE ``merges``,
the special ids and a *name* for the pre-tokenizer (``tokenizer.ggml.pre``), whose regexes live in llama.cpp's
source. Import rebuilds the tokenizer that name stands for, as the model's own tokenizer.json spelled it:

- ``gpt2`` (also ``mpt``, ``olmo``, ``jais``): byte-level with GPT-2's regex;
- ``smollm`` (also ``starcoder``, ``refact``, ``codeshell``): every digit on its own, then GPT-2's regex;
- ``llama-bpe`` (also ``llama3``, ``llama-v3``, ``dbrx``, ``smaug-bpe``): Llama 3's regex (numbers in runs of
  up to three digits) and merges skipped for words in the vocabulary, as llama.cpp does for that vocabulary;
- ``qwen2`` (also ``deepseek-r1-qwen``): Qwen2's regex (single digits) after NFC normalisation.

A sentencepiece vocabulary (``tokenizer.ggml.model = "llama"``) is rebuilt for the files of a family whose spec
says ``tokenizer = "sentencepiece"`` (gemma3) as the BPE model transformers' GGUF loader rebuilds for Gemma: text
with every space written ``▁`` and no prefix space, pieces merged by BPE, characters outside the vocabulary
spelled by the ``<0xNN>`` byte tokens (byte fallback), ``<unk>`` fused. The file holds no merges, so they are
derived from the vocabulary: every split of a token into two tokens is a merge, ranked by the merged token's
position in the file (in Gemma 3 270M's file the ``scores`` fall with the position but in two places; ranking by
position is what gives transformers' ids, scripts/bench_gemma3.py). Gemma's GGUFs store the tokens made
of spaces with real spaces; they are spelled with ``▁`` as the model looks them up. ``<end_of_turn>``, where the
vocabulary has it, also ends a generation (llama.cpp ends generations there too). A
sentencepiece vocabulary of any other architecture (Llama 2's, with a prefix space) is refused.

Token types: CONTROL tokens become special added tokens (kept whole, and — meshlm's
:class:`~meshlm.tokenizer.MeshTokenizer` switches ``encode_special_tokens`` on — read as plain text inside user
text), USER_DEFINED ones plain added tokens (Gemma's newline runs and HTML tags: matched whole, as llama.cpp
does).

Export goes the other way from a checkpoint's tokenizer.json, naming the pre-tokenizer llama.cpp must use; the
vocabulary is padded with ``[PAD<i>]`` (type UNUSED) to the model's embedding rows, as llama.cpp's convert script
does, because llama.cpp requires one token per row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from meshlm.errors import CheckpointError
from meshlm.interop.hf_tokenizer import META_FORMAT, hf_tokenizer_config
from meshlm.models.families import family_of_gguf, family_spec

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")

# llama.cpp pre-tokenizer name -> the family of regexes it stands for (see the module docstring).
PRE_TOKENIZERS = {
    **dict.fromkeys(("gpt2", "mpt", "olmo", "jais"), "gpt2"),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell"), "smollm"),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe"), "llama-bpe"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), "qwen2"),
}


def _pre_tokenizer(family: str) -> pre_tokenizers.PreTokenizer:
    if family == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if family == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = _LLAMA3_SPLIT if family == "llama-bpe" else _QWEN2_SPLIT
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# ------------------------------------------------------------------------------------------------- import
SPACE = "\u2581"  # sentencepiece's visible space
END_OF_TURN = "<end_of_turn>"  # Gemma's end of a chat turn: an end of generation too


def tokenizer_from_gguf(meta: dict[str, Any], source: Path, vocab_rows: int,
                        max_len: int) -> tuple[Tokenizer, dict[str, Any], dict[str, Any]]:
    """(the tokenizers.Tokenizer, tokenizer_meta.json, tokenizer_config.json) of a GGUF's ``tokenizer.*`` keys."""
    kind, arch = meta.get("tokenizer.ggml.model"), meta.get("general.architecture")
    family = family_of_gguf(arch) if isinstance(arch, str) else ""
    if kind == "llama" and (not family or family_spec(family).tokenizer != "sentencepiece"):
        raise CheckpointError(f"{source}: tokenizer.ggml.model is a sentencepiece vocabulary of a {arch!r} file; "
                              "meshlm rebuilds the sentencepiece vocabularies of Gemma 3 files and gpt2-style "
                              "byte-level BPE")
    if kind not in ("gpt2", "llama"):
        what = "no tokenizer" if kind is None else repr(kind)
        raise CheckpointError(f"{source}: tokenizer.ggml.model is {what}; meshlm rebuilds gpt2-style byte-level BPE "
                              "tokenizers (tokenizer.ggml.model = \"gpt2\") and Gemma's sentencepiece (\"llama\")")
    tokens = list(meta.get("tokenizer.ggml.tokens") or [])
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(tokens) != vocab_rows or len(types) != len(tokens) or len(set(tokens)) != len(tokens):
        raise CheckpointError(f"{source}: the vocabulary ({len(tokens)} tokens, {len(types)} token types, "
                              f"{len(set(tokens))} distinct) does not match the embedding's {vocab_rows} rows; the "
                              "file is damaged or not a model llama.cpp loads")
    roles = _roles(meta, tokens, source)
    if kind == "gpt2":
        tok, bos_default = _byte_level_bpe(meta, tokens, source)
    else:
        tok, bos_default = _sentencepiece_bpe(tokens, roles["unk"], source), True  # llama.cpp's default for spm
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind_ in zip(tokens, types) if kind_ == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)  # not Gemma's respelled runs of spaces
                    for t, kind_ in zip(tokens, types) if kind_ == USER_DEFINED and tok.token_to_id(t) is not None])
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    add_bos = (bool(add_bos) if add_bos is not None else bos_default) and roles["bos"] is not None
    if add_bos:
        bos = f"{roles['bos']}"
        tok.post_processor = processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                                           special_tokens=[(bos, tokens.index(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False) if kind == "gpt2" else None
    eos_id = tokens.index(roles["eos"])
    ends = [meta.get(f"tokenizer.ggml.{key}_token_id") for key in ("eot", "eom")]
    if kind == "llama" and END_OF_TURN in tokens:
        ends.append(tokens.index(END_OF_TURN))
    eos_ids = [eos_id] + [i for i in ends if isinstance(i, int) and 0 <= i < len(tokens) and i != eos_id]
    tok_meta = {"format": META_FORMAT, "bos_token": roles["bos"], "eos_token": roles["eos"],
                "pad_token": roles["pad"], "eos_ids": list(dict.fromkeys(eos_ids)), "add_bos_token": add_bos}
    config = hf_tokenizer_config(roles["bos"], roles["eos"], roles["pad"], max_len)
    config.update(unk_token=roles["unk"], add_bos_token=add_bos, add_eos_token=False)
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        config["chat_template"] = template
    return tok, tok_meta, config


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], source: Path) -> tuple[Tokenizer, bool]:
    """A gpt2-style vocabulary with its merges and named pre-tokenizer; whether llama.cpp adds bos by default."""
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"{source}: tokenizer.ggml.pre {pre!r} is not one meshlm knows; supported: "
                              f"{', '.join(sorted(PRE_TOKENIZERS))}")
    family = PRE_TOKENIZERS[pre]
    pairs = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges") or []]
    if any(len(p) != 2 for p in pairs):
        raise CheckpointError(f"{source}: tokenizer.ggml.merges has an entry that is not two tokens "
                              "separated by one space; the file is damaged")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, pairs, fuse_unk=False, byte_fallback=False,
                               ignore_merges=family == "llama-bpe"))
    if family == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer(family)
    tok.decoder = decoders.ByteLevel()
    return tok, family == "llama-bpe"


def _sentencepiece_bpe(tokens: list[str], unk: str | None, source: Path) -> Tokenizer:
    """Gemma's sentencepiece vocabulary as a BPE tokenizer with byte fallback (see the module docstring)."""
    spelled = [SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]  # "  " is looked up as "▁▁"
    vocab = {t: i for i, t in enumerate(spelled)}
    if len(vocab) != len(spelled):
        twice = next(t for i, t in enumerate(spelled) if vocab[t] != i)
        raise CheckpointError(f"{source}: the vocabulary holds the run of {len(twice)} spaces both as spaces and as "
                              f"{twice!r}; one token would hide the other, so the file cannot be tokenised as is")
    tok = Tokenizer(models.BPE(vocab, sentencepiece_merges(spelled, vocab), unk_token=unk, fuse_unk=True,
                               byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")  # as Gemma's tokenizer.json
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def sentencepiece_merges(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The BPE merges a merge-less vocabulary implies: (left, right) for every token that splits into two tokens,
    ranked by the token's position, and within one token the longer left part first."""
    ranked = []
    for token, index in vocab.items():
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((index, len(token) - cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def _roles(meta: dict[str, Any], tokens: list[str], source: Path) -> dict[str, str | None]:
    roles: dict[str, str | None] = {}
    for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
        ident = meta.get(f"tokenizer.ggml.{key}_token_id")
        if ident is not None and not (isinstance(ident, int) and 0 <= ident < len(tokens)):
            raise CheckpointError(f"{source}: tokenizer.ggml.{key}_token_id = {ident!r} is not a token id of its "
                                  f"{len(tokens)}-token vocabulary; the file is damaged")
        roles[role] = tokens[ident] if ident is not None else None
    if roles["eos"] is None:
        raise CheckpointError(f"{source}: no tokenizer.ggml.eos_token_id; meshlm needs an end-of-sequence token")
    return roles


# ------------------------------------------------------------------------------------------------- export
def tokenizer_to_gguf(tokenizer, meta: dict[str, Any] | None, vocab_rows: int, source: Path) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` values of a checkpoint's tokenizer (a :class:`MeshTokenizer`): model (``gpt2``,
    or ``llama`` for a sentencepiece-style vocabulary such as Gemma's), pre, tokens, token_type, scores, merges,
    bos/eos/pad/unk ids and add_bos_token."""
    spec = json.loads(tokenizer.backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise CheckpointError(f"{source}: the tokenizer is a {model.get('type')} model; GGUF export writes "
                              "BPE tokenizers only (byte-level, or sentencepiece-style with byte fallback)")
    sentencepiece = _is_sentencepiece(spec)
    pre = "default" if sentencepiece else _pre_name(spec, source)
    added = {i: t for i, t in tokenizer.backend.get_added_tokens_decoder().items()}
    tokens, types, scores = [], [], []
    for i in range(vocab_rows):
        token = tokenizer.backend.id_to_token(i) if i < tokenizer.vocab_size else None
        kind = (UNUSED if token is None else CONTROL if i in added and added[i].special else
                USER_DEFINED if i in added else NORMAL)
        if sentencepiece and kind == NORMAL and len(token or "") > 1 and not token.strip(SPACE):
            token, kind = " " * len(token), USER_DEFINED  # Gemma's runs of 2+ spaces, as its files spell them
        elif sentencepiece and kind == NORMAL and _BYTE_TOKEN.fullmatch(token or ""):
            kind = BYTE
        tokens.append(token if token is not None else f"[PAD{i}]")
        types.append(kind)
        # falling with the position for the pieces, so llama.cpp (it merges by score) and transformers (by
        # position) rank the merges alike; sentencepiece's -1000 / 0 for the others
        scores.append(-float(i) if kind == NORMAL else 0.0 if kind == BYTE else -1000.0)
    merges = [] if sentencepiece else [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    add_bos = (meta or {}).get("add_bos_token")
    if add_bos is None:  # meshlm's own tokenizers: prompts start with bos (generate, the SFT encoders)
        add_bos = tokenizer.bos_id is not None
    unk = model.get("unk_token")
    return {"model": "llama" if sentencepiece else "gpt2", "pre": pre, "tokens": tokens, "types": types,
            "scores": scores, "merges": merges, "bos": tokenizer.bos_id, "eos": tokenizer.eos_id,
            "pad": tokenizer.pad_id, "unk": tokenizer.backend.token_to_id(unk) if unk else None,
            "add_bos": bool(add_bos)}


_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")


def _is_sentencepiece(spec: dict[str, Any]) -> bool:
    """Whether a tokenizer.json is the sentencepiece-style BPE :func:`tokenizer_from_gguf` builds for Gemma (and
    Gemma's own tokenizer.json is): byte fallback, spaces replaced by ▁, no byte-level pre-tokenizer."""
    norm = spec.get("normalizer") or {}
    replaces_spaces = norm.get("type") == "Replace" and norm.get("content") == SPACE and \
        (norm.get("pattern") or {}).get("String") == " "
    return bool((spec.get("model") or {}).get("byte_fallback")) and replaces_spaces


def _pre_name(spec: dict[str, Any], source: Path) -> str:
    """The llama.cpp pre-tokenizer name whose regexes are this tokenizer.json's pre-tokenizer."""
    norm = spec.get("normalizer")
    found = _comparable(spec.get("pre_tokenizer"))
    for name in ("gpt2", "smollm", "llama-bpe", "qwen2"):
        if found == _comparable(json.loads(_as_tokenizer(name).to_str())["pre_tokenizer"]):
            if norm is None or (name == "qwen2" and norm.get("type") == "NFC"):
                return name
    raise CheckpointError(f"{source}: the tokenizer's normalizer/pre-tokenizer is not one llama.cpp names (meshlm "
                          "exports byte-level BPE with the gpt2, smollm, llama-bpe or qwen2 pre-tokenizer)")


def _as_tokenizer(family: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer(family)
    return tok


def _comparable(node: Any) -> Any:
    """A pre-tokenizer's JSON without the settings that do not change the split (offsets trimming)."""
    if isinstance(node, dict):
        return {k: _comparable(v) for k, v in node.items() if k != "trim_offsets"}
    if isinstance(node, list):
        return [_comparable(v) for v in node]
    return node
