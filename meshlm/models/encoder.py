"""A BERT-family text encoder (post-LayerNorm, learned positions, token types, GELU), loaded from a Hugging Face
folder: ``config.json`` + ``model.safetensors`` + ``tokenizer.json``.

meshlm uses it as a pretrained trunk for classifiers that must read meaning rather than surface cues — the
encoder judge (``meshlm/safety/encoder_judge.py``) fine-tunes one, e.g. all-MiniLM-L6-v2 (6 layers, 384 wide,
22.7M parameters). Weights are read with ``safetensors`` and text is tokenized with HF ``tokenizers``; the
module reproduces ``transformers``' ``BertModel`` outputs (tests/test_encoder_judge.py checks it on a tiny random
model), so no ``transformers`` import is needed at run time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from meshlm.errors import DataError

_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# our module names → BertModel's, outside the layers and inside each encoder.layer.<i>
_HF_TOP = {"word": "embeddings.word_embeddings", "position": "embeddings.position_embeddings",
           "token_type": "embeddings.token_type_embeddings", "embed_norm": "embeddings.LayerNorm"}
_HF_LAYER = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
             "attn_out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
             "up": "intermediate.dense", "down": "output.dense", "ffn_norm": "output.LayerNorm"}


@dataclass
class EncoderConfig:
    vocab_size: int
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    dropout: float = 0.1  # hidden dropout while training (BERT's hidden_dropout_prob)
    attention_dropout: float = 0.1  # BERT's attention_probs_dropout_prob

    @classmethod
    def from_hf(cls, cfg: dict, where: str) -> "EncoderConfig":
        if not isinstance(cfg, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
        kind = cfg.get("model_type")
        if kind != "bert" and (kind is not None or "bert" not in str(cfg.get("architectures", "")).lower()):
            raise DataError(f"{where}: model_type {cfg.get('model_type')!r} is not a BERT encoder "
                            "(meshlm's encoder reads BERT-family folders such as all-MiniLM-L6-v2)")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise DataError(f"{where}: position_embedding_type {cfg['position_embedding_type']!r} is not supported "
                            "(only 'absolute')")
        if cfg.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "relu"):
            raise DataError(f"{where}: hidden_act {cfg['hidden_act']!r} is not supported (gelu, gelu_new, relu)")
        if "vocab_size" not in cfg:
            raise DataError(f"{where}: 'vocab_size' is missing")
        source = {**cfg, "dropout": cfg.get("hidden_dropout_prob"),
                  "attention_dropout": cfg.get("attention_probs_dropout_prob")}  # BERT's names for the two rates
        kwargs: dict = {}
        for f in fields(cls):
            value = source.get(f.name)
            if value is None:  # absent: the field's default
                continue
            want = {"int": int, "float": (int, float), "str": str}[str(f.type)]
            if isinstance(value, bool) or not isinstance(value, want):
                raise DataError(f"{where}: {f.name!r} must be {str(f.type)}, got {value!r}")
            kwargs[f.name] = float(value) if f.type == "float" else value
        hidden, heads = kwargs.get("hidden_size", 384), kwargs.get("num_attention_heads", 12)
        if heads < 1 or hidden % heads:
            raise DataError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        return cls(**kwargs)


class _Layer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.n_heads = cfg.num_attention_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out, self.attn_norm = nn.Linear(h, h), nn.LayerNorm(h, eps=eps)
        self.up, self.down = nn.Linear(h, cfg.intermediate_size), nn.Linear(cfg.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=eps)
        self.act = {"gelu": F.gelu, "relu": F.relu,
                    "gelu_new": lambda x: F.gelu(x, approximate="tanh")}[cfg.hidden_act]
        self.dropout, self.attention_dropout = nn.Dropout(cfg.dropout), cfg.attention_dropout

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (proj(x).view(b, s, self.n_heads, -1).transpose(1, 2) for proj in (self.query, self.key, self.value))
        p = self.attention_dropout if self.training else 0.0  # BERT drops attention probabilities and both sublayer outputs
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
        x = self.attn_norm(x + self.dropout(self.attn_out(a.transpose(1, 2).reshape(b, s, h))))
        return self.ffn_norm(x + self.dropout(self.down(self.act(self.up(x)))))


class TextEncoder(nn.Module):
    """Token ids → hidden states (b, s, hidden); :meth:`pool` averages them over the real tokens."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.word = nn.Embedding(cfg.vocab_size, h)
        self.position = nn.Embedding(cfg.max_position_embeddings, h)
        self.token_type = nn.Embedding(cfg.type_vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, type_ids: torch.Tensor | None = None) -> torch.Tensor:
        s = ids.shape[1]
        if s > self.cfg.max_position_embeddings:
            raise ValueError(f"{s} tokens exceed the encoder's {self.cfg.max_position_embeddings} positions")
        types = torch.zeros_like(ids) if type_ids is None else type_ids
        x = self.word(ids) + self.position(torch.arange(s, device=ids.device)) + self.token_type(types)
        x = self.dropout(self.embed_norm(x))
        # additive key mask: 0 where a token is real, the dtype's minimum where it is padding
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        return x

    @staticmethod
    def pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)

    # ---- Hugging Face folders ---------------------------------------------------------------------------
    @staticmethod
    def hf_name(ours: str) -> str:
        """Our parameter name → the BertModel name it is stored under in a HF folder."""
        head, _, leaf = ours.rpartition(".")
        if head in _HF_TOP:
            return f"{_HF_TOP[head]}.{leaf}"
        _, index, module = head.split(".")  # layers.<i>.<module>
        return f"encoder.layer.{index}.{_HF_LAYER[module]}.{leaf}"

    @classmethod
    def from_folder(cls, folder: str | Path) -> tuple["TextEncoder", "EncoderTokenizer"]:
        """Load weights and tokenizer from a HF BERT folder (``bert.``-prefixed names are accepted)."""
        from safetensors import safe_open

        folder = Path(folder)
        missing = [n for n in _FILES if not (folder / n).is_file()]
        if missing:
            raise DataError(f"{folder}: not an encoder folder, missing {', '.join(missing)} "
                            "(expected a Hugging Face BERT folder with config.json, model.safetensors, tokenizer.json)")
        try:
            hf_cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{folder / 'config.json'}: not valid JSON ({exc})") from None
        cfg = EncoderConfig.from_hf(hf_cfg, str(folder / "config.json"))
        model = cls(cfg)
        state = {}
        weights = folder / "model.safetensors"
        try:
            f = safe_open(str(weights), "pt")
        except Exception as exc:  # safetensors raises its own error type on a damaged header
            raise DataError(f"{weights}: not a readable safetensors file ({exc}); re-download or re-train it") from None
        with f:
            stored = set(f.keys())
            for name, param in model.state_dict().items():
                key = cls.hf_name(name)
                key = key if key in stored else f"bert.{key}"
                if key not in stored:
                    raise DataError(f"{weights}: tensor {cls.hf_name(name)!r} is missing")
                try:
                    tensor = f.get_tensor(key)
                except Exception as exc:
                    raise DataError(f"{weights}: tensor {key!r} cannot be read ({exc})") from None
                if tensor.shape != param.shape:
                    raise DataError(f"{weights}: {key} has shape {tuple(tensor.shape)}, "
                                    f"config.json implies {tuple(param.shape)}")
                state[name] = tensor.float()
        model.load_state_dict(state)
        return model.eval(), EncoderTokenizer(folder / "tokenizer.json", cfg)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under BertModel's names, as :meth:`from_folder` reads them."""
        return {self.hf_name(k): v.detach().contiguous() for k, v in self.state_dict().items()}

    def hf_config(self) -> dict:
        cfg = asdict(self.cfg)
        hidden, attention = cfg.pop("dropout"), cfg.pop("attention_dropout")
        return {"model_type": "bert", "architectures": ["BertModel"], "position_embedding_type": "absolute",
                "hidden_dropout_prob": hidden, "attention_probs_dropout_prob": attention, **cfg}


class EncoderTokenizer:
    """HF ``tokenizers`` with the folder's own normaliser and [CLS] A [SEP] B [SEP] template; padding and
    truncation are set here (the file's fixed-length padding is ignored)."""

    def __init__(self, path: Path, cfg: EncoderConfig) -> None:
        from tokenizers import Tokenizer

        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise DataError(f"{path}: not a tokenizers JSON file ({exc})") from None
        if self.tok.get_vocab_size() > cfg.vocab_size:
            raise DataError(f"{path}: the tokenizer has {self.tok.get_vocab_size()} tokens but config.json's "
                            f"vocab_size is {cfg.vocab_size}: the two files are from different models")
        self.tok.no_padding()
        self.tok.no_truncation()
        self.path, self.pad_id = path, cfg.pad_token_id

    def batch(self, firsts: list[str], seconds: list[str] | None, max_len: int) -> dict[str, torch.Tensor]:
        """Encode (first, second) pairs, the longer side truncated first, padded to the batch's longest."""
        self.tok.enable_truncation(max_len, strategy="longest_first")
        inputs = list(zip(firsts, seconds)) if seconds is not None else firsts
        encs = self.tok.encode_batch(inputs)
        width = max(len(e.ids) for e in encs)
        ids = torch.full((len(encs), width), self.pad_id, dtype=torch.long)
        types = torch.zeros((len(encs), width), dtype=torch.long)
        mask = torch.zeros((len(encs), width), dtype=torch.long)
        for row, e in enumerate(encs):
            n = len(e.ids)
            ids[row, :n] = torch.tensor(e.ids)
            types[row, :n] = torch.tensor(e.type_ids)
            mask[row, :n] = 1
        return {"ids": ids, "mask": mask, "type_ids": types}

