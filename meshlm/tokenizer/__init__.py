"""Byte-level BPE tokenizer (see docs/data.md)."""

from meshlm.tokenizer.bpe import MIN_VOCAB_SIZE, SPECIAL_TOKENS, TOKENIZER_FILES, MeshTokenizer, tokenizer_files

__all__ = ["MIN_VOCAB_SIZE", "SPECIAL_TOKENS", "TOKENIZER_FILES", "MeshTokenizer", "tokenizer_files"]
