"""Post-training data for the trainer: the tokenizer, the JSONL rows of ``data.path`` (or the synthetic default)
encoded for the objective, and rank-aware train / held-out loaders.

The tokenizer is ``checkpoint.init_from``'s ``tokenizer.json`` (with its chat template, for converted models),
else the embedded corpus's. The held-out rows are the last ``objective.eval_fraction`` of the file(s).
Preference batches are handed to the trainer as (B, 2, T) — pair-major — so that slicing micro-batches along
dim 0 keeps each chosen sequence with its rejected one; objectives flatten them to (2B, T), chosen first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from meshlm.checkpoint.load import resolve_checkpoint
from meshlm.config.schema import JobConfig
from meshlm.data import TokenDataset, default_cache_dir, ensure_embedded_dataset
from meshlm.data.posttrain import (
    PreferenceLoader,
    PromptLoader,
    RowEncoder,
    SFTLoader,
    check_vocab,
    encode_examples,
    encode_pairs,
    encode_prompts,
    encode_unpaired,
    pad_id_for,
    read_rows,
)
from meshlm.data.posttrain.labelled import LabelledLoader, encode_labelled
from meshlm.data.synthetic import ensure_synthetic
from meshlm.errors import ConfigError, DataError
from meshlm.tokenizer import MeshTokenizer, tokenizer_files

# the synthetic set for each data kind (an objective's data_kind) when data.path is empty
SYNTHETIC_KIND = {"sft": "chat", "preference": "preference", "unpaired": "preference", "prompt": "prompt"}


@dataclass
class PostTrainData:
    tokenizer: MeshTokenizer
    tokenizer_dir: Path
    train_loader: Any
    eval_loader: Any | None
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer_files(self) -> dict[str, Path]:
        """The tokenizer's files, for the checkpoint (so generate/convert use the same tokenizer and template)."""
        return tokenizer_files(self.tokenizer_dir)


def load_tokenizer(cfg: JobConfig) -> tuple[MeshTokenizer, Path]:
    """init_from's tokenizer, else the embedded corpus's; checked against model.vocab_size."""
    if cfg.checkpoint.init_from:
        folder = resolve_checkpoint(cfg.checkpoint.init_from)
    else:
        cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else default_cache_dir()
        dataset = TokenDataset(ensure_embedded_dataset(cache, cfg.model.vocab_size, num_workers=cfg.data.num_workers),
                               verify=False)
        folder = Path(dataset.tokenizer_path).parent
    tokenizer = MeshTokenizer.load(folder / "tokenizer.json")
    check_vocab(tokenizer, cfg.model.vocab_size, str(folder / "tokenizer.json"))
    return tokenizer, folder


def data_path(cfg: JobConfig, data_kind: str) -> Path:
    """``data.path``, or the synthetic set of the objective (generated from training.seed on first use)."""
    if cfg.data.path:
        path = Path(cfg.data.path)
        if not path.exists():
            raise DataError(f"data.path {path} does not exist; name a JSONL file or a folder of them")
        return path
    if data_kind not in SYNTHETIC_KIND:
        raise DataError(f"training.objective {cfg.training.objective!r} has no synthetic default data; set "
                        f"data.path to a JSONL file of {data_kind} rows")
    cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else default_cache_dir()
    return ensure_synthetic(SYNTHETIC_KIND[data_kind], cache, seed=cfg.training.seed)


def prompt_budget(cfg: JobConfig) -> int:
    """Prompt tokens kept for generation (PPO/GRPO): the sequence minus the response's room."""
    budget = cfg.data.seq_len - cfg.objective.max_new_tokens
    if budget < 1:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) leaves no room for a prompt beside "
                          f"objective.max_new_tokens ({cfg.objective.max_new_tokens}); raise data.seq_len")
    return budget


def split_rows(rows: list, fraction: float, need_eval: bool) -> tuple[list, list]:
    """(train, held-out): the last ``fraction`` of the rows are held out (at least one when evaluating)."""
    if not need_eval:
        return rows, []
    num_eval = max(1, math.floor(len(rows) * fraction))
    if num_eval >= len(rows):
        raise DataError(f"data.path has {len(rows)} rows, too few to hold out {num_eval} for evaluation; add rows "
                        "or set training.eval_interval=0")
    return rows[:-num_eval], rows[-num_eval:]


def open_posttrain_data(cfg: JobConfig, data_kind: str, dp_rank: int, dp_size: int,
                        micro_batch: int) -> PostTrainData:
    """Tokenizer, encoded rows and loaders for ``data_kind`` (the objective's: sft, preference, unpaired, prompt,
    labelled)."""
    tokenizer, tok_dir = load_tokenizer(cfg)
    path = data_path(cfg, data_kind)
    rows = read_rows(path, objective=cfg.training.objective, data_kind=data_kind)
    train_rows, eval_rows = split_rows(rows, cfg.objective.eval_fraction, cfg.training.eval_interval > 0)
    encoder = RowEncoder(tokenizer, tok_dir)
    seq_len, tc = cfg.data.seq_len, cfg.training
    common = dict(pad_id=pad_id_for(tokenizer), dp_rank=dp_rank, dp_size=dp_size)
    eval_batch = micro_batch * dp_size

    if data_kind == "sft":
        def loader(subset, batch, offset=0, **kw):
            examples, stats = encode_examples(subset, encoder, seq_len)
            return SFTLoader(examples, seq_len, batch, packing=cfg.objective.packing, **common, **kw), stats
    elif data_kind in ("preference", "unpaired"):
        def loader(subset, batch, offset=0, **kw):
            pairs, stats = (encode_unpaired if data_kind == "unpaired" else encode_pairs)(subset, encoder, seq_len)
            sp = cfg.parallel.tp if cfg.parallel.tp > 1 and cfg.parallel.sequence_parallel else 1  # T splits over tp
            return PairMajor(PreferenceLoader(pairs, seq_len, batch, **common, pad_multiple=sp, **kw), offset), stats
    elif data_kind == "prompt":
        def loader(subset, batch, offset=0, **kw):
            budget = prompt_budget(cfg)
            prompts, stats = encode_prompts(subset, encoder, budget)
            return PromptLoader(prompts, batch, extras=[r.extra for r in subset], max_prompt_tokens=budget,
                                dp_rank=dp_rank, dp_size=dp_size, **kw), stats
    elif data_kind == "labelled":
        def loader(subset, batch, offset=0, **kw):
            examples, stats = encode_labelled(subset, tokenizer, cfg.objective.classes, seq_len,
                                              cfg.objective.prompt_tokens)
            return LabelledLoader(examples, seq_len, batch, **common, **kw), stats
    else:
        raise DataError(f"training.objective {cfg.training.objective!r} reads {data_kind!r} data, which "
                        "meshlm train does not load yet")
    train_loader, train_stats = loader(train_rows, tc.batch_size, seed=tc.seed)
    offset = train_loader.num_pairs if data_kind in ("preference", "unpaired") else 0
    eval_loader, eval_stats = (loader(eval_rows, eval_batch, seed=0, shuffle=False, offset=offset) if eval_rows
                               else (None, None))
    stats = {"data_path": str(path), "train": vars(train_stats), "eval": vars(eval_stats) if eval_stats else None}
    return PostTrainData(tokenizer, tok_dir, train_loader, eval_loader, stats)


class PairMajor:
    """A PreferenceLoader whose batches are pair-major: (2B, T) chosen-then-rejected becomes (B, 2, T), and
    (2B,) becomes (B, 2); :func:`meshlm.objectives.base.pairs_to_rows` undoes it inside the objective. ``index``
    is shifted by ``offset`` so that the train and held-out pairs have distinct numbers (precomputed reference log-probs)."""

    def __init__(self, loader: PreferenceLoader, offset: int = 0) -> None:
        self.loader, self.offset = loader, offset

    @property
    def num_pairs(self) -> int:
        return len(self.loader.pairs)

    def next_batch(self) -> dict[str, torch.Tensor]:
        return self._pair_major(self.loader.next_batch())

    def every_pair(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Every pair once, in order, ``batch_size`` pairs at a time (the last batch may be smaller)."""
        for start in range(0, self.num_pairs, batch_size):
            yield self._pair_major(self.loader.batch_for(range(start, min(start + batch_size, self.num_pairs))))

    def _pair_major(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch["index"] = batch["index"] + self.offset
        return {k: v.reshape(2, -1, *v.shape[1:]).transpose(0, 1).contiguous() for k, v in batch.items()}

    def reset(self) -> None:
        self.loader.reset()

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
