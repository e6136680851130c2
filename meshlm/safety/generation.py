"""Batched chat generation from a meshlm checkpoint, for evaluation (``generate(prompts) -> responses``).

Each prompt becomes a one-turn conversation (an optional system message, then the user's prompt) rendered by
the checkpoint's chat template (meshlm's own, or the Hugging Face template of a converted model), left-padded
and decoded together with one KV cache by :func:`meshlm.generate.rollout.rollout`. Decoding stops at the
checkpoint's stop ids (meshlm.generate.stops: its eos ids and its chat template's end-of-turn token). A prompt too
long for ``model.max_seq_len − max_new_tokens`` keeps its end (the generation prompt), as the post-training
truncation rule does.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any, Callable

import torch

from meshlm.errors import ConfigError


# weights_sha256 of a checkpoint folder by its manifest's sha256 (which holds every file's): hashing a real model's
# weights takes a second or two, and one run asks it of the same base for several stages.
_WEIGHTS_SHA256: dict[tuple[str, str], str] = {}


def generation_stats(seconds: float, prompts: int, new_tokens: int | None, calls: int) -> dict[str, Any]:
    """The ``generation`` block reports carry: wall seconds spent generating, prompts, new tokens (None where the
    generator cannot count them) and new tokens per second."""
    rate = round(new_tokens / seconds, 2) if new_tokens is not None and seconds > 0 else None
    return {"seconds": round(seconds, 3), "calls": calls, "prompts": prompts, "new_tokens": new_tokens,
            "tokens_per_s": rate}


class Measured:
    """``generate(prompts) -> responses`` that counts its own use: wall seconds and prompts of its calls, and the
    new tokens the wrapped generator reports through its ``stats()`` (a :class:`CheckpointGenerator`, an endpoint
    generator reading the API's usage); None when it has no ``stats()`` or cannot count."""

    def __init__(self, generate: Callable[[list[str]], list[str]]) -> None:
        self.generate = generate
        self.seconds, self.prompts, self.calls = 0.0, 0, 0
        self.new_tokens: int | None = 0

    def __call__(self, prompts: list[str]) -> list[str]:
        before = _new_tokens(self.generate)
        start = time.perf_counter()
        out = self.generate(prompts)
        self.seconds += time.perf_counter() - start
        after = _new_tokens(self.generate)
        self.calls, self.prompts = self.calls + 1, self.prompts + len(prompts)
        if before is None or after is None or self.new_tokens is None:
            self.new_tokens = None
        else:
            self.new_tokens += after - before
        return out

    def stats(self) -> dict[str, Any]:
        return generation_stats(self.seconds, self.prompts, self.new_tokens, self.calls)


def _new_tokens(generate: Any) -> int | None:
    stats = getattr(generate, "stats", None)
    return stats().get("new_tokens") if callable(stats) else None


class CheckpointGenerator:
    def __init__(self, path: str | Path, *, max_new_tokens: int = 128, device: str = "cpu",
                 system: str | None = None, greedy: bool = True, temperature: float = 1.0, seed: int = 0,
                 weights: str = "fp32") -> None:
        from meshlm.checkpoint.load import model_from_checkpoint
        from meshlm.data.posttrain import RowEncoder, pad_id_for
        from meshlm.generate.params import SamplingParams
        from meshlm.generate.stops import stop_ids
        from meshlm.tokenizer import MeshTokenizer

        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model, cfg, _, self.checkpoint = model_from_checkpoint(path, device, generates=True)
        self.tokenizer = MeshTokenizer.load(self.checkpoint / "tokenizer.json")
        self.template = RowEncoder(self.tokenizer, self.checkpoint).template
        eos = stop_ids(self.tokenizer, self.checkpoint, template=self.template)
        if not greedy and not temperature > 0:
            raise ConfigError(f"temperature must be > 0 when sampling, got {temperature}; use greedy decoding")
        # The one SamplingParams (meshlm/generate/params.py); sampled rows draw from self.generator (seeded).
        self.sampling = SamplingParams(max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature,
                                       stop_ids=tuple(sorted(eos)))
        self.pad_id = pad_id_for(self.tokenizer)
        self.max_prompt = cfg.model.max_seq_len - max_new_tokens
        if self.max_prompt < 1:
            raise ConfigError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in model.max_seq_len "
                              f"{cfg.model.max_seq_len}; lower it")
        self.system, self.device, self.weights = system, device, "fp32"
        self.generator = None if greedy else torch.Generator(device).manual_seed(seed)
        self._identity: dict[str, Any] = {}  # shared by every view (using): filled once, by cache_key
        # What this generator (and every view of it) decoded, cumulatively: stats().
        self._counts: dict[str, Any] = {"seconds": 0.0, "calls": 0, "prompts": 0, "new_tokens": 0}
        manifest = self.checkpoint / "manifest.json"  # read now: the files just loaded (and verified against it)
        self._files = None if cfg.lora.enabled or not manifest.is_file() else (  # LoRA: the base's weights too
            str(self.checkpoint.resolve()), hashlib.sha256(manifest.read_bytes()).hexdigest())
        if weights != "fp32":
            self._check_weights(weights, "--weights")
            self.weights = weights

    def using(self, weights: str, key: str = "--weights") -> "CheckpointGenerator":
        """A view of this generator (the same loaded model) decoding with ``weights`` (fp32 or int8, refused with
        a ConfigError naming ``key`` where the packed decode path cannot run this model)."""
        if weights != "fp32":
            self._check_weights(weights, key)
        view = copy.copy(self)
        view.weights = weights
        return view

    def _check_weights(self, weights: str, key: str) -> None:
        from meshlm.generate.int8 import check_weight_format
        from meshlm.generate.packed import unsupported_reason

        param = next(self.model.parameters())
        check_weight_format(weights, param.device, param.dtype, key)
        reason = unsupported_reason(self.model)
        if reason is not None:
            raise ConfigError(f"{key} = {weights!r} needs meshlm's packed decode path, which the model of "
                              f"{self.checkpoint} cannot use ({reason}); use fp32")

    def cache_key(self, prompts: list[str]) -> dict:
        """What this generator's responses to ``prompts`` depend on (meshlm/safety/cache.py): the weights' and
        the tokenizer's sha256, the model config (RoPE, layer kinds, norms, score scale: equal weights under
        another config answer otherwise; ``source`` only says where the weights came from), the prompts' token
        ids, the sampling settings, the weight format and the device."""
        if not self._identity:
            from meshlm.fileio import sha256_file

            model_config = {k: v for k, v in dataclasses.asdict(self.model.cfg).items() if k != "source"}
            self._identity.update(weights_sha256=self._weights_sha256(), model_config=model_config,
                                  tokenizer_sha256=sha256_file(self.checkpoint / "tokenizer.json"))
        return {**self._identity, "prompt_ids": [self.prompt_ids(p) for p in prompts],
                "sampling": dataclasses.asdict(self.sampling), "weights": self.weights,
                "device": torch.device(self.device).type}

    def prompt_ids(self, prompt: str) -> list[int]:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
                   [{"role": "user", "content": prompt}]
        ids = self.template.encode_prompt(messages)
        return ids if len(ids) <= self.max_prompt else ids[-self.max_prompt:]

    def _weights_sha256(self) -> str:
        from meshlm.checkpoint.load import weights_sha256

        if self._files is None:
            return weights_sha256(self.model)
        if self._files not in _WEIGHTS_SHA256:
            _WEIGHTS_SHA256[self._files] = weights_sha256(self.model)
        return _WEIGHTS_SHA256[self._files]

    def stats(self) -> dict[str, Any]:
        """Cumulative counts of this generator and its views: seconds, calls, prompts, new tokens (the response
        ids decoded, stop ids excluded) and tokens_per_s."""
        return generation_stats(**self._counts)

    def __call__(self, prompts: list[str]) -> list[str]:
        from meshlm.generate.rollout import rollout

        if not prompts:
            return []
        start = time.perf_counter()
        encoded = [self.prompt_ids(p) for p in prompts]
        # Batch rows of similar length together: less padding, and the batch's outputs do not depend on order.
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        result = rollout(self.model, [encoded[i] for i in order], self.sampling, pad_id=self.pad_id,
                         vocab_limit=self.tokenizer.vocab_size, generator=self.generator, device=self.device,
                         weights=self.weights)
        eos = set(self.sampling.stop_ids)
        texts: list[str] = [""] * len(prompts)
        for row, index in enumerate(order):
            ids = result.response_ids[row][result.response_mask[row]].tolist()
            ids = [t for t in ids if t not in eos]
            self._counts["new_tokens"] += len(ids)
            texts[index] = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        self._counts["seconds"] += time.perf_counter() - start
        self._counts["calls"] += 1
        self._counts["prompts"] += len(prompts)
        return texts
