"""Structured outputs: ``response_format`` ``json_object`` / ``json_schema`` by constrained decoding.

A grammar engine compiles the schema to a grammar and, at each step, says which tokens keep the output inside it;
the row's logits outside that set become -inf before sampling (:class:`meshlm.serve.decode.RowLogits`), so every
finished answer parses and validates. The mask belongs to the row, not the batch: constrained and free rows decode
in the same forward. When the grammar is complete (the JSON value closed) the row finishes with ``stop``.

The engine is llguidance (the Rust core of Guidance, also a structured-output backend of vLLM and SGLang):
its wheel has no dependencies (3 MB) and works with any torch, it reads a ``tokenizers`` JSON directly, and it
handles full JSON Schema including nesting. xgrammar 0.2.9 would pull triton and transformers into the install;
outlines-core compiles schemas to a regular expression, so ``json_object`` (arbitrary nesting) is out of its reach
(docs/serving.md has the comparison and the mask's measured cost). JSON is generated compact (no free
whitespace), so a model cannot wander in whitespace forever.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from meshlm.serve.protocol import ApiError

_COMPACT = {"whitespace_flexible": False}


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a dependency of meshlm; say what to do if it is missing
        raise ApiError(400, "response_format needs the llguidance package on the server (pip install llguidance)",
                       param="response_format", code="unsupported_parameter") from None
    return llguidance


def grammar_for(response_format: dict[str, Any] | None) -> str | None:
    """The llguidance grammar of a ``response_format`` (None for text); ApiError 400 for a bad one."""
    if not response_format or response_format.get("type") == "text":
        return None
    ll = _llguidance()
    kind = response_format.get("type")
    if kind == "json_object":
        return ll.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_COMPACT)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format.json_schema.schema: a JSON Schema object is required",
                           param="response_format")
        try:
            return ll.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_COMPACT)
        except ValueError as exc:
            raise ApiError(400, f"response_format.json_schema.schema: {str(exc)[:200]}",
                           param="response_format") from None
    raise ApiError(400, "response_format.type: text, json_object or json_schema", param="response_format")


class GrammarMask:
    """One row's grammar state (a :class:`meshlm.serve.decode.TokenMask`)."""

    def __init__(self, matcher) -> None:
        self.matcher = matcher

    def allowed(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        bias = self.matcher.compute_logit_bias()  # one byte per token: 200 allowed, 0 not
        allowed = torch.frombuffer(bytearray(bias), dtype=torch.uint8)[:vocab_size] > 0
        return allowed.to(device)

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):  # only masked tokens are sampled: a bug if this fails
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()[:200]}")

    @property
    def complete(self) -> bool:
        """The value is closed: nothing but the end may follow."""
        return self.matcher.is_stopped()


class GrammarEngine:
    """The grammar engine's view of one served tokenizer, built on first use (a few ms for 512 tokens, about a
    second for 50k) and kept by the backend."""

    def __init__(self, tokenizer, eos: list[int]) -> None:
        self._tokenizer, self._eos = tokenizer, eos
        self._lltok = None

    def masks(self, response_format: dict[str, Any] | None, n: int) -> list[GrammarMask] | None:
        """``n`` fresh row states for ``response_format`` (None for text); ApiError 400 when it cannot be
        enforced with this tokenizer."""
        grammar = grammar_for(response_format)
        if grammar is None:
            return None
        ll = _llguidance()
        if self._lltok is None:
            tok = self._tokenizer
            self._lltok = ll.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=list(self._eos))
        error = ll.LLMatcher.validate_grammar(grammar, self._lltok)
        if error and not error.startswith("WARNING"):
            raise ApiError(400, f"response_format: the schema cannot be enforced ({error[:200]})",
                           param="response_format")
        return [GrammarMask(ll.LLMatcher(self._lltok, grammar, log_level=0)) for _ in range(n)]
