"""Post-training data: JSONL rows, chat templates, tokenization, truncation, packing and loaders.

See docs/post-training.md. Typical use (SFT)::

    rows = read_rows(path, objective="sft")
    examples, stats = encode_examples(rows, RowEncoder(tokenizer, tokenizer_dir), max_tokens=seq_len)
    loader = SFTLoader(examples, seq_len, global_batch_size, pad_id=pad_id_for(tokenizer), dp_rank=r, dp_size=d)
"""

from meshlm.data.posttrain.encode import (
    EncodeStats,
    PreferencePair,
    RowEncoder,
    check_vocab,
    encode_examples,
    encode_pairs,
    encode_prompts,
    encode_unpaired,
)
from meshlm.data.posttrain.loaders import PreferenceLoader, PromptLoader, SFTLoader
from meshlm.data.posttrain.packing import build_sequence, plan_packing, plan_padded, row_labels
from meshlm.data.posttrain.rows import DATA_KINDS, Row, check_kinds, parse_row, read_rows
from meshlm.data.posttrain.templates import (
    MESHLM_CHAT_TEMPLATE,
    ChatTemplate,
    Encoded,
    HFChatTemplate,
    MeshChatTemplate,
    chat_template_for,
    read_hf_chat_template,
)
from meshlm.tokenizer import MeshTokenizer


def pad_id_for(tokenizer: MeshTokenizer) -> int:
    """The id that fills padding: the pad token, else eos (padding is never a label, so either is safe)."""
    return tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id


__all__ = [
    "MESHLM_CHAT_TEMPLATE",
    "DATA_KINDS",
    "ChatTemplate",
    "EncodeStats",
    "Encoded",
    "HFChatTemplate",
    "MeshChatTemplate",
    "PreferenceLoader",
    "PreferencePair",
    "PromptLoader",
    "Row",
    "RowEncoder",
    "SFTLoader",
    "build_sequence",
    "chat_template_for",
    "check_kinds",
    "check_vocab",
    "encode_examples",
    "encode_pairs",
    "encode_prompts",
    "encode_unpaired",
    "pad_id_for",
    "parse_row",
    "plan_packing",
    "plan_padded",
    "read_hf_chat_template",
    "read_rows",
    "row_labels",
]
