"""``generate(prompts) -> replies`` from a meshlm checkpoint or an OpenAI-compatible endpoint.

Both the red-team attacker and the constitutional loop only need single-turn chat: each prompt is one user
message and the reply is the assistant's turn. A checkpoint goes through its own chat template (meshlm's
``<|user|> ... <|end|><|assistant|>`` or a converted model's Jinja template) and the batched KV-cache sampler
(meshlm/generate/rollout.py), stopping at eos or the template's ``<|end|>`` (meshlm.safety.generation); an
endpoint goes through meshlm.safety.endpoint. A model source is written ``http(s)://...`` (an endpoint, with a
model name) or a path (a run directory or a checkpoint folder).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from meshlm.errors import ConfigError

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
        from meshlm.safety.evaluate import CountingEndpoint

        if not model:
            name_flag = model_flag or f"{flag}-model"
            raise ConfigError(f"{flag} {source} is an endpoint: also give its model name ({name_flag} NAME)")
        return CountingEndpoint(source, model).generator(max_tokens=max_new_tokens, temperature=temperature)
    return checkpoint_generate_fn(source, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                  batch_size=batch_size, device=device)


def checkpoint_generate_fn(path: str | Path, *, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                           batch_size: int = 8, device: str = "cpu") -> Generate:
    """Replies from a meshlm checkpoint (safety-eval's :class:`CheckpointGenerator`), ``batch_size`` prompts
    decoded together so that memory stays bounded however many prompts there are."""
    from meshlm.safety.generation import CheckpointGenerator

    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    model = CheckpointGenerator(path, max_new_tokens=max_new_tokens, device=device, greedy=temperature == 0,
                                temperature=temperature or 1.0, seed=seed)

    def generate(prompts: list[str]) -> list[str]:
        return [reply for start in range(0, len(prompts), batch_size)
                for reply in model(prompts[start:start + batch_size])]

    generate.stats = model.stats  # type: ignore[attr-defined]  # what it decoded (meshlm.safety.generation.Measured)
    return generate
