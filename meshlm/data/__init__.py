"""Corpus reading, `prepare`, prepared datasets and the training loader (see docs/data.md).

``SequenceLoader`` needs torch and is imported on first use, so that tokenization workers stay light; so are the
post-training names (``meshlm.data.posttrain``: JSONL rows, chat templates, packing, SFT and preference loaders).
"""

from meshlm.data.corpus import CORPUS_VERSION, embedded_corpus_size, embedded_documents
from meshlm.data.dataset import TokenDataset, TokenStream
from meshlm.data.prepare import (
    default_cache_dir,
    ensure_embedded_dataset,
    prepare_dataset,
    split_position,
    token_dtype,
)
from meshlm.data.readers import ReadStats, iter_documents
from meshlm.data.stats import unigram_counts, unigram_entropy

_POSTTRAIN = ("PreferenceLoader", "RowEncoder", "SFTLoader", "encode_examples", "encode_pairs", "encode_prompts",
              "read_rows")

__all__ = [
    "CORPUS_VERSION",
    "PreferenceLoader",
    "ReadStats",
    "RowEncoder",
    "SFTLoader",
    "SequenceLoader",
    "TokenDataset",
    "TokenStream",
    "default_cache_dir",
    "embedded_corpus_size",
    "embedded_documents",
    "encode_examples",
    "encode_pairs",
    "encode_prompts",
    "ensure_embedded_dataset",
    "iter_documents",
    "prepare_dataset",
    "read_rows",
    "split_position",
    "token_dtype",
    "unigram_counts",
    "unigram_entropy",
]


def __getattr__(name: str):
    if name == "SequenceLoader":
        from meshlm.data.loader import SequenceLoader

        return SequenceLoader
    if name in _POSTTRAIN:
        from meshlm.data import posttrain

        return getattr(posttrain, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
