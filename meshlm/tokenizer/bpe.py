"""Byte-level BPE tokenizer: trained with HF `tokenizers`, lossless on any UTF-8 string.

Text is mapped to bytes and every byte to one of 256 base tokens (the GPT-2 byte alphabet), so no input is ever
unknown and ``decode(encode(s)) == s`` for every string ``s`` that is valid Unicode. No prefix space is added
and no normaliser runs, so leading spaces, ``"\\r\\n"``, control characters and combining marks come back
unchanged.

The seven special tokens take ids 0..6 in the order of :data:`SPECIAL_TOKENS`. They are added by the code that
builds sequences (the data pipeline appends ``eos_id``, chat templates insert role markers), never by
:meth:`MeshTokenizer.encode`: with ``encode_special_tokens`` switched on, a special-token string inside user
text (``"<|assistant|>"``) is split into ordinary byte-level tokens, so user text cannot inject a role marker.
That switch is a runtime setting that `tokenizers` does not save in ``tokenizer.json``; this class sets it on
every construction path (``train``, ``load``, ``from_str``).

A *foreign* tokenizer (e.g. the Hugging Face ``tokenizer.json`` of a model imported with ``meshlm convert
from-hf``) has other special tokens. :meth:`MeshTokenizer.load` recognises one by a ``tokenizer_meta.json``
beside the ``tokenizer.json`` naming its bos/eos/pad tokens (bos and pad may be absent, e.g. Qwen has no bos);
``encode_special_tokens`` is switched on for it too. The meta file also says whether the model's prompts start
with bos (``add_bos_token``): SmolLM2's bos is ``<|im_start|>``, a chat marker that a plain prompt must not begin
with. A meta file without the key (older conversions) is answered by the tokenizer.json post-processor, as
transformers does.

The files that make up a tokenizer (:data:`TOKENIZER_FILES`) travel together: a checkpoint, a converted run and
an exported HF folder copy all of those present, so a chat template kept in ``chat_template.jinja`` (the file
transformers 5 writes) is never left behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from meshlm.errors import DataError
from meshlm.fileio import atomic_write_text

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
NUM_BYTE_TOKENS = 256
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + NUM_BYTE_TOKENS
MAX_VOCAB_SIZE = 2**32
TOKENIZER_META = "tokenizer_meta.json"  # beside a foreign tokenizer.json: {"bos_token", "eos_token", "pad_token"}
# Every file beside tokenizer.json that belongs to it: foreign specials and add_bos (tokenizer_meta.json), the HF
# chat template (a tokenizer_config.json key, or chat_template.jinja as transformers 5 writes it).
TOKENIZER_FILES = ("tokenizer.json", TOKENIZER_META, "tokenizer_config.json", "chat_template.jinja")
_MESHLM_ROLES = {"pad": "<|pad|>", "bos": "<|bos|>", "eos": "<|eos|>"}


class MeshTokenizer:
    """A byte-level BPE tokenizer with meshlm's special tokens (or a foreign one's, see the module docstring);
    wraps a ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizer: Tokenizer, source: str = "<memory>",
                 roles: dict[str, str | None] | None = None, add_bos: bool | None = None) -> None:
        """``roles`` maps "bos"/"eos"/"pad" to token strings for a foreign tokenizer; None means meshlm's.
        ``add_bos``: whether a prompt starts with bos (None: meshlm's always do; a foreign tokenizer's post-processor
        decides)."""
        native = roles is None
        if native:
            added = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
            missing = [s for s in SPECIAL_TOKENS if s not in added]
            if missing:
                raise DataError(
                    f"tokenizer {source} lacks the meshlm special tokens {missing}; "
                    "train one with `meshlm prepare` (omit --tokenizer) or pass a tokenizer.json written by meshlm"
                )
            specials, roles = SPECIAL_TOKENS, _MESHLM_ROLES
        else:
            specials = tuple(t for t in roles.values() if t)
            missing = [t for t in specials if tokenizer.token_to_id(t) is None]
            if missing or not roles.get("eos"):
                problem = f"names tokens {missing} that are not in the vocabulary" if missing else "names no eos_token"
                raise DataError(f"tokenizer {source}: {TOKENIZER_META} {problem}; fix it or convert the model again")
        # Special-token strings in text are encoded as plain text (see the module docstring).
        tokenizer.encode_special_tokens = True
        self._tok = tokenizer
        self._special_ids = {s: tokenizer.token_to_id(s) for s in specials}
        self._role_ids = {role: tokenizer.token_to_id(t) if t else None for role, t in roles.items()}
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        if add_bos is None:
            add_bos = native or post_processor_adds_bos(tokenizer, self._role_ids.get("bos"))
        self._add_bos = add_bos and self._role_ids.get("bos") is not None

    # --- construction ---------------------------------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, *, show_progress: bool = False) -> MeshTokenizer:
        """Train on ``texts``. ``vocab_size`` counts the special and byte tokens; a small corpus may stop short."""
        if not isinstance(vocab_size, int) or not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
            raise DataError(
                f"vocab_size {vocab_size!r} is out of range; use an integer from {MIN_VOCAB_SIZE} "
                f"({len(SPECIAL_TOKENS)} special + {NUM_BYTE_TOKENS} byte tokens) to {MAX_VOCAB_SIZE}"
            )
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is ever unknown
            show_progress=show_progress,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_str(cls, json_text: str, source: str = "<string>",
                 roles: dict[str, str | None] | None = None, add_bos: bool | None = None) -> MeshTokenizer:
        try:
            tok = Tokenizer.from_str(json_text)
        except Exception as e:  # tokenizers raises plain Exception subclasses with Rust messages
            raise DataError(f"tokenizer {source} is not a valid tokenizer.json ({e}); re-run `meshlm prepare`") from e
        return cls(tok, source=source, roles=roles, add_bos=add_bos)

    @classmethod
    def load(cls, path: str | os.PathLike) -> MeshTokenizer:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DataError(f"tokenizer file {path} does not exist; pass the tokenizer.json of a prepared dataset")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read tokenizer file {path} ({e}); check the path and its permissions") from e
        meta = _read_meta(path.with_name(TOKENIZER_META))
        if meta is None:
            return cls.from_str(text, source=str(path))
        roles = {role: meta.get(f"{role}_token") for role in ("bos", "eos", "pad")}
        add_bos = meta.get("add_bos_token")
        return cls.from_str(text, source=str(path), roles=roles, add_bos=add_bos if isinstance(add_bos, bool) else None)

    def to_str(self) -> str:
        return self._tok.to_str(pretty=True)

    def save(self, path: str | os.PathLike) -> None:
        """Write ``tokenizer.json`` atomically: a temp file in the same folder, fsync, then ``os.replace``."""
        atomic_write_text(path, self.to_str())

    # --- encoding -------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; adds no special tokens and never produces one from the text."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; special tokens are rendered as their strings unless ``skip_special_tokens``."""
        ids = [int(i) for i in ids]
        # tokenizers silently drops unknown ids; a wrong id is a bug upstream, so say so.
        bad = [i for i in ids if not 0 <= i < self._vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self._vocab_size})")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    # --- vocabulary -----------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def pad_id(self) -> int | None:
        """None only for a foreign tokenizer without a pad token."""
        return self._role_ids.get("pad")

    @property
    def bos_id(self) -> int | None:
        """None only for a foreign tokenizer without a bos token (e.g. Qwen's)."""
        return self._role_ids.get("bos")

    @property
    def add_bos(self) -> bool:
        """Whether a plain prompt starts with ``bos_id`` (meshlm's tokenizers: yes; a foreign one: as its HF
        tokenizer does; never without a bos token)."""
        return self._add_bos

    def prompt_ids(self, text: str) -> list[int]:
        """A plain (non-chat) prompt: bos where the tokenizer adds one, then ``encode(text)``."""
        return ([self.bos_id] if self._add_bos else []) + self.encode(text)

    @property
    def eos_id(self) -> int:
        return self._role_ids["eos"]

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self._special_ids)

    @property
    def backend(self) -> Tokenizer:
        """The wrapped ``tokenizers.Tokenizer`` (``encode_special_tokens`` is on)."""
        return self._tok

    def __repr__(self) -> str:
        return f"MeshTokenizer(vocab_size={self._vocab_size})"


def tokenizer_files(folder: str | os.PathLike) -> dict[str, Path]:
    """name -> path of each of :data:`TOKENIZER_FILES` present in ``folder`` (what a checkpoint copies)."""
    folder = Path(folder)
    return {name: folder / name for name in TOKENIZER_FILES if (folder / name).is_file()}


def _read_meta(meta_path: Path) -> dict | None:
    """A foreign tokenizer's ``tokenizer_meta.json`` (bos/eos/pad strings, add_bos_token); None if absent."""
    if not meta_path.is_file():
        return None
    fix = "fix or delete it (it names the tokenizer's bos/eos/pad tokens)"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {meta_path} ({e}); {fix}") from e
    if not isinstance(meta, dict):
        raise DataError(f"{meta_path} holds no JSON object; {fix}")
    return meta


def post_processor_adds_bos(tokenizer: Tokenizer, bos_id: int | None) -> bool:
    """Whether ``tokenizer``'s post-processor puts bos in front of a text (Llama 3's TemplateProcessing does;
    SmolLM2's and Qwen's tokenizers add nothing)."""
    if bos_id is None:
        return False
    ids = tokenizer.encode("a", add_special_tokens=True).ids
    return bool(ids) and ids[0] == bos_id
