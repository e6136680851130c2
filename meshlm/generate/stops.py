"""The one stop rule: which token ids end a generation for a checkpoint.

A generation ends at any of the checkpoint's eos ids — its tokenizer's eos first, then the other eos ids a
converted model's ``generation_config.json`` listed (kept in ``tokenizer_meta.json``: Llama 3.1 Instruct ends
with several) — and, for a chat, at its chat template's end-of-turn token (ChatML's ``<|im_end|>``, Llama 3's
``<|eot_id|>``, meshlm's ``<|end|>``). ``meshlm generate``, the server, the safety generator and the RL
objectives all take their stop ids from :func:`stop_ids`, so a model stops at the same token everywhere. The stop
token ends a generation but is not part of its text: :func:`split_stop` takes it off before decoding.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from meshlm.data.posttrain.templates import ChatTemplate, chat_template_for, read_hf_chat_template
from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
from meshlm.tokenizer import SPECIAL_TOKENS, MeshTokenizer


def chat_template_or_none(tokenizer: MeshTokenizer, checkpoint: str | Path | None) -> ChatTemplate | None:
    """The checkpoint's chat template (its HF Jinja template, else meshlm's), or None when it has neither: a
    tokenizer without meshlm's chat tokens and no HF template cannot hold a chat."""
    has_hf = checkpoint is not None and read_hf_chat_template(checkpoint) is not None
    if not has_hf and any(s not in tokenizer.special_ids for s in SPECIAL_TOKENS[3:]):
        return None
    return chat_template_for(tokenizer, checkpoint)


def stop_ids(tokenizer: MeshTokenizer, checkpoint: str | Path | None = None, *, chat: bool = True,
             template: ChatTemplate | None = None) -> list[int]:
    """Every id that ends a generation from ``checkpoint`` (module docstring), without repeats, the tokenizer's
    eos first. ``chat=False`` (a plain completion) leaves out the end-of-turn tokens. ``template`` is the chat
    template a caller already built (else the checkpoint's own is read); ``checkpoint=None`` (a model trained
    here from the embedded tokenizer) has no extra eos ids."""
    ids = checkpoint_eos_ids(Path(checkpoint), tokenizer.eos_id) if checkpoint is not None else [tokenizer.eos_id]
    if chat:
        template = template if template is not None else chat_template_or_none(tokenizer, checkpoint)
        if template is not None:
            ids += template.end_of_turn_ids()
    return list(dict.fromkeys(ids))


def split_stop(new_ids: Sequence[int], stop: Collection[int]) -> tuple[list[int], bool]:
    """The generated ids without the stop id that ended them, and whether one did. Decode the first part: the stop
    token (Gemma's ``<end_of_turn>``, ChatML's ``<|im_end|>``) is a special token whose text would otherwise be
    rendered back."""
    stopped = bool(new_ids) and new_ids[-1] in stop
    return list(new_ids[:-1] if stopped else new_ids), stopped
