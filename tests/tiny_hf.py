"""Tiny ChatML Llama folders written by the tests, shaped like SmolLM2 (bos is the chat marker ``<|im_start|>``, a
tied head, the chat template in ``chat_template.jinja`` or in ``tokenizer_config.json``'s key), and a "bigram"
variant whose greedy reply is known in advance.

The bigram variant zeroes every block's output projections, so the residual stream at a position is the
embedding of its token and the logits depend on the last token only; embedding rows are basis vectors and the
head rows point at them, so greedy decoding walks a chosen chain of tokens and then emits ``<|im_end|>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
VOCAB_ROWS = 384  # not meshlm's default 2048: init_from must take it from the checkpoint


def chatml_tokenizer(vocab: int = 320):
    """A byte-level BPE (``tokenizers``) with SmolLM2's special tokens, trained on a few embedded documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from meshlm.data import embedded_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(embedded_documents()[:40], trainer=trainer)
    return tok


def write_chatml_llama(folder: Path, tok, *, template_in: str = "jinja", eos: str = "<|im_end|>",
                       tied: bool = True, seed: int = 0):
    """A random tiny LlamaForCausalLM + tokenizer in ``folder``; the chat template only in ``chat_template.jinja``
    (``template_in="jinja"``), only in tokenizer_config.json (``"config"``) or nowhere (``"none"``)."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128, vocab_size=VOCAB_ROWS,
                                      tie_word_embeddings=tied, bos_token_id=tok.token_to_id("<|im_start|>"),
                                      eos_token_id=tok.token_to_id(eos))
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token=eos)
    fast.save_pretrained(folder)
    set_template(folder, CHATML if template_in != "none" else None, template_in)
    return model


def set_template(folder: Path, template: str | None, where: str) -> None:
    """Put the chat template exactly where asked, whatever this transformers version's save_pretrained did."""
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.pop("chat_template", None)
    if template is not None and where == "jinja":
        (folder / "chat_template.jinja").write_text(template)
    elif template is not None:
        config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2))


@torch.no_grad()
def make_bigram(model, chain: list[int], scale: float = 10.0) -> None:
    """Greedy decoding after token ``chain[0]`` emits ``chain[1:]`` in order (an untied head; the tokens of
    ``chain[:-1]`` distinct, fewer than hidden_size). Other tokens' logits are 0, the chain's next one 8 * scale."""
    assert not model.config.tie_word_embeddings and len(set(chain[:-1])) == len(chain) - 1
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    head.zero_()
    model.model.norm.weight.fill_(1.0)
    for i, (token, successor) in enumerate(zip(chain, chain[1:])):
        emb[token].zero_()
        emb[token, i] = 1.0  # RMSNorm turns it into sqrt(hidden) * e_i
        head[successor, i] = scale
