"""Small Gemma 3 GGUF files as llama.cpp writes them, for the tests (written with the gguf package's writer).

- :func:`sentencepiece_vocab`: a sentencepiece-style vocabulary like Gemma's — control tokens first, Gemma's
  user-defined newline runs, space runs (stored with real spaces, as Gemma's GGUFs do) and an HTML tag, the 256
  ``<0xNN>`` byte tokens, then pieces learnt by BPE from meshlm's embedded corpus (``▁`` for a space) in the order
  they were learnt. The scores are shuffled against that order, so a rebuild that ranked merges by score would
  tokenise differently from one that ranks them by position (as Gemma's files need, see gguf_tokenizer.py).
- :func:`write_gemma3_gguf`: a random Gemma 3 model with that vocabulary: llama.cpp's tensor names, norm weights
  stored as 1 + w (its converter's shift), a tied head, six layers (the sixth global, llama.cpp's pattern), a
  short sliding window, head_dim 256 as in every Gemma 3 but 27B (the score scale transformers assumes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONTROL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
USER_DEFINED = ["\n", "\n\n", "\n\n\n", "  ", "   ", "    ", "</div>"]
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' "
                  "else m['role']) + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
NORMAL, CONTROL, USER, BYTE = 1, 3, 4, 6
SPACE = "\u2581"


def _learnt_pieces(size: int) -> list[str]:
    """BPE pieces of the embedded corpus with spaces as ▁ (characters first, then merges in learnt order)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from meshlm.data import embedded_documents

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(SPACE, behavior="merged_with_next")
    tok.train_from_iterator(embedded_documents()[:40], trainers.BpeTrainer(vocab_size=size, show_progress=False))
    vocab = tok.get_vocab()
    return sorted(vocab, key=vocab.get)


def sentencepiece_vocab(size: int = 600, seed: int = 0) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a Gemma-like sentencepiece vocabulary (see the module docstring)."""
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    pieces = [p for p in _learnt_pieces(size) if p not in USER_DEFINED]
    tokens = CONTROL_TOKENS + USER_DEFINED + bytes_ + pieces
    types = [CONTROL] * len(CONTROL_TOKENS) + [USER] * len(USER_DEFINED) + [BYTE] * 256 + [NORMAL] * len(pieces)
    rng = np.random.default_rng(seed)
    scores = [-1000.0] * (len(CONTROL_TOKENS) + len(USER_DEFINED)) + [0.0] * 256 + \
        (-rng.permutation(len(pieces)).astype(np.float64)).tolist()
    return tokens, scores, types


def write_gemma3_gguf(path: Path, *, seed: int = 0, template: str | None = GEMMA_TEMPLATE, window: int = 5,
                      types: dict | None = None, dim: int = 64, n_layers: int = 6, ffn: int = 96,
                      linear_rope: float = 0.0) -> dict:
    """A random Gemma 3 model as llama.cpp writes it; returns its shape (dim, layers, heads, ...)."""
    import gguf
    from gguf.constants import GGMLQuantizationType as Q
    from gguf.quants import quantize

    tokens, scores, token_types = sentencepiece_vocab()
    heads, kv_heads, head_dim = 2, 1, 256
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name("tiny-gemma3")
    w.add_context_length(128), w.add_embedding_length(dim), w.add_block_count(n_layers)
    w.add_feed_forward_length(ffn), w.add_head_count(heads), w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim), w.add_value_length(head_dim), w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0), w.add_sliding_window(window)
    if linear_rope:  # Gemma 3 4B+ scale their global layers' positions (llama.cpp: rope.scaling.*)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), w.add_rope_scaling_factor(linear_rope)
    w.add_tokenizer_model("llama"), w.add_tokenizer_pre("default")
    w.add_token_list(tokens), w.add_token_scores(scores), w.add_token_types(token_types)
    w.add_bos_token_id(2), w.add_eos_token_id(1), w.add_unk_token_id(3), w.add_pad_token_id(0)
    w.add_add_bos_token(True), w.add_add_eos_token(False), w.add_add_space_prefix(False)
    if template:
        w.add_chat_template(template)
    rng = np.random.default_rng(seed)
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"token_embd.weight": (len(tokens), dim), "output_norm.weight": (dim,)}
    for i in range(n_layers):
        block = {"attn_norm": (dim,), "attn_q": (q, dim), "attn_k": (kv, dim), "attn_v": (kv, dim),
                 "attn_q_norm": (head_dim,), "attn_k_norm": (head_dim,), "attn_output": (dim, q),
                 "post_attention_norm": (dim,), "ffn_norm": (dim,), "ffn_gate": (ffn, dim), "ffn_up": (ffn, dim),
                 "ffn_down": (dim, ffn), "post_ffw_norm": (dim,)}
        shapes.update({f"blk.{i}.{k}.weight": v for k, v in block.items()})
    for name, shape in shapes.items():
        values = rng.standard_normal(shape).astype(np.float32) * (0.3 if len(shape) == 1 else 0.1)
        if name.endswith("norm.weight"):
            values += 1.0  # llama.cpp's converter stores Gemma's norm weight w as 1 + w
        qtype = (types or {}).get(name.split(".")[-2], Q.F32) if len(shape) == 2 else Q.F32
        data = values.astype(np.float16) if qtype == Q.F16 else values if qtype == Q.F32 else quantize(values, qtype)
        w.add_tensor(name, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return {"dim": dim, "n_layers": n_layers, "n_heads": heads, "n_kv_heads": kv_heads, "head_dim": head_dim,
            "ffn_hidden_dim": ffn, "vocab_size": len(tokens), "sliding_window": window}
