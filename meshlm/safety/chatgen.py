"""``generate(prompts) -> replies`` from a meshlm checkpoint or an OpenAI-compatible endpoint.

Both the red-team attacker and the constitutional loop only need single-turn chat: each prompt is one user
message and the reply is the assistant's turn. A checkpoint goes through its own chat template (meshlm's
``<|user|> ... <|end|><|assistant|>`` or a converted model's Jinja template) and the batched KV-cache sampler
(meshlm/generate/rollout.py), stopping at eos or the template's ``<|end|>``; an endpoint goes through
meshlm.safety.endpoint. A model source is written ``http(s)://...`` (an endpoint, with a model name) or a path
(a run directory or a checkpoint folder).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from meshlm.errors import CheckpointError, ConfigError

Generate = Callable[[list[str]], list[str]]


def is_endpoint(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def generate_fn(source: str, model: str | None = None, *, max_new_tokens: int = 128, temperature: float = 0.0,
                seed: int = 0, batch_size: int = 8, device: str = "cpu", flag: str = "--checkpoint",
                model_flag: str | None = None) -> Generate:
    """A generator for ``source`` (an endpoint URL with ``model``, or a checkpoint path). Greedy when
    ``temperature`` is 0. ``flag`` and ``model_flag`` name the options in error messages."""
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {temperature}")
    if is_endpoint(source):
        from meshlm.safety.endpoint import Endpoint

        if not model:
            raise ConfigError(f"{flag} {source} is an endpoint: also give its model name ({model_flag or flag + '-model'} NAME)")
        return Endpoint(source, model).generate_fn(max_tokens=max_new_tokens, temperature=temperature)
    return checkpoint_generate_fn(source, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                  batch_size=batch_size, device=device)


def checkpoint_generate_fn(path: str | Path, *, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                           batch_size: int = 8, device: str = "cpu") -> Generate:
    """Replies from a meshlm checkpoint, ``batch_size`` prompts decoded together. A prompt longer than the
    context leaves keeps its end (the request), and its leading bos."""
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.data.posttrain import RowEncoder, pad_id_for
    from meshlm.generate.rollout import SamplingConfig, rollout
    from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
    from meshlm.tokenizer import MeshTokenizer

    model, cfg, _, ckpt = model_from_checkpoint(path, device)
    if cfg.training.objective == "reward":
        raise CheckpointError(f"{ckpt} is a reward model (a score head) and cannot generate; pass a policy "
                              "checkpoint")
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    template = RowEncoder(tokenizer, ckpt).template
    special = tokenizer.special_ids
    eos = set(checkpoint_eos_ids(ckpt, tokenizer.eos_id)) | ({special["<|end|>"]} if "<|end|>" in special else set())
    sampling = SamplingConfig(max_new_tokens, tuple(sorted(eos)), pad_id_for(tokenizer),
                              temperature=temperature or 1.0, greedy=temperature == 0,
                              vocab_limit=tokenizer.vocab_size)
    budget = cfg.model.max_seq_len - max_new_tokens
    if budget < 8:
        raise ConfigError(f"--max-new-tokens {max_new_tokens} leaves {budget} prompt tokens of the model's "
                          f"{cfg.model.max_seq_len}; lower it")
    generator = torch.Generator(device=device).manual_seed(seed)
    bos = tokenizer.bos_id

    def prompt_ids(text: str) -> list[int]:
        ids = template.encode_prompt([{"role": "user", "content": text}])
        if len(ids) > budget:
            head = ids[:1] if bos is not None and ids[0] == bos else []
            ids = head + ids[len(ids) - (budget - len(head)):]
        return ids

    def generate(prompts: list[str]) -> list[str]:
        replies = []
        for start in range(0, len(prompts), batch_size):
            out = rollout(model, [prompt_ids(p) for p in prompts[start:start + batch_size]], sampling,
                          generator=generator, device=device)
            for ids, mask in zip(out.response_ids.tolist(), out.response_mask.tolist()):
                tokens = [t for t, m in zip(ids, mask) if m and t not in eos]
                replies.append(tokenizer.decode(tokens, skip_special_tokens=True).strip())
        return replies

    return generate
