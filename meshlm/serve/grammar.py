"""Structured outputs: ``response_format`` ``json_object`` / ``json_schema`` by constrained decoding.

A grammar engine compiles the schema to a grammar and, at each step, says which tokens keep the output inside it;
the row's logits outside that set become -inf before sampling (:class:`meshlm.generate.sampling.RowSampler`), so every
finished answer parses and validates. The mask belongs to the row, not the batch: constrained and free rows decode
in the same forward. When the grammar is complete (the JSON value closed) the row finishes with ``stop``.

The engine is llguidance (the Rust core of Guidance, also a structured-output backend of vLLM and SGLang):
its wheel has no dependencies (3 MB) and works with any torch, it reads a ``tokenizers`` JSON directly, and it
handles full JSON Schema including nesting. xgrammar 0.2.9 would pull triton and transformers into the install;
outlines-core compiles schemas to a regular expression, so ``json_object`` (arbitrary nesting) is out of its reach
(docs/serving.md has the comparison and the mask's measured cost). JSON is generated compact (no free
whitespace), so a model cannot wander in whitespace forever.

A schema is checked before it is compiled, within a budget (:data:`MAX_SCHEMA_BYTES`, :data:`MAX_SCHEMA_DEPTH`,
:data:`MAX_SCHEMA_STEPS`): it must have a finite value. ``{"$ref": "#"}`` or an object that requires a property
of its own type has none; llguidance compiles such a schema, then either stops at once (an empty answer that is
not JSON) or exceeds its parser limits at the first token. Both are 400s here, before the request is queued.
llguidance's own resource limits (:func:`parser_limits`) bound the compile and each step's mask.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import torch

from meshlm.serve.protocol import ApiError

_COMPACT = {"whitespace_flexible": False}
MAX_SCHEMA_BYTES = 64 << 10  # a schema's JSON text
MAX_SCHEMA_DEPTH = 64  # nesting of schema objects (through $refs too)
MAX_SCHEMA_STEPS = 20_000  # schema nodes visited by the finite-value check


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
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_BYTES:
            raise ApiError(400, f"response_format.json_schema.schema: {len(text)} bytes of JSON, above this "
                                f"server's limit of {MAX_SCHEMA_BYTES}", param="response_format")
        check_finite(schema)
        try:
            return ll.LLMatcher.grammar_from_json_schema(text, defaults=_COMPACT)
        except ValueError as exc:
            raise ApiError(400, f"response_format.json_schema.schema: {str(exc)[:200]}",
                           param="response_format") from None
    raise ApiError(400, "response_format.type: text, json_object or json_schema", param="response_format")


def parser_limits():
    """llguidance's limits with its error messages kept short (they would quote the grammar); the defaults bound a
    compile to about a second and a step's mask to a few milliseconds of the worst case."""
    return _llguidance().LLParserLimits(verbose_errors=False)


def check_finite(schema: dict[str, Any]) -> None:
    """ApiError 400 unless ``schema`` has a finite JSON value (by the keywords that force content: ``$ref``,
    ``allOf``/``anyOf``/``oneOf``, required properties, ``minItems``); within the depth and step budget."""
    if not _Finite(schema).value(schema, ("#",), 0):
        raise ApiError(400, "response_format.json_schema.schema: the schema cannot be enforced: it has no finite "
                            "value (a $ref loop that every value must follow, e.g. a required property of the "
                            "object's own type); make the recursion optional", param="response_format",
                       code="schema_without_value")


class _Finite:
    """Whether a schema node has a finite value: a depth-first walk in which a $ref back into the path being
    expanded counts as no value (the least fixed point); only 'has a value' results are cached, as a 'no value'
    found inside a loop may not hold outside it."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root, self.steps, self.known = root, 0, set()

    def value(self, node: Any, path: tuple[str, ...], depth: int) -> bool:
        self.steps += 1
        if self.steps > MAX_SCHEMA_STEPS or depth > MAX_SCHEMA_DEPTH:
            raise ApiError(400, f"response_format.json_schema.schema: nested deeper than {MAX_SCHEMA_DEPTH} levels "
                                f"or over {MAX_SCHEMA_STEPS} schema nodes to check; simplify the schema",
                           param="response_format", code="schema_too_complex")
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            return True  # not a schema: the compiler says what is wrong with it
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            if ref in path:
                return False
            if ref not in self.known:
                target = _pointer(self.root, ref)
                if target is not None and not self.value(target, (*path, ref), depth + 1):
                    return False
                self.known.add(ref)
        if not all(self.value(s, path, depth + 1) for s in _list(node.get("allOf"))):
            return False
        for key in ("anyOf", "oneOf"):
            branches = _list(node.get(key))
            if branches and not any(self.value(s, path, depth + 1) for s in branches):
                return False
        return self._content(node, path, depth)

    def _content(self, node: dict[str, Any], path: tuple[str, ...], depth: int) -> bool:
        """Objects need a value for each required property; arrays one for each item their minimum asks for."""
        types = node.get("type")
        types = set(types) if isinstance(types, list) else {types} if isinstance(types, str) else None
        if "enum" in node or "const" in node or (types is not None and types - {"object", "array"}):
            return True  # a scalar (or an enum's listed value) is always finite
        objects, arrays = types is None or "object" in types, types is None or "array" in types
        if objects and ("required" in node or "properties" in node):
            props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
            return all(self.value(props[k], path, depth + 1) for k in _list(node.get("required"))
                       if isinstance(k, str) and k in props)
        if arrays and isinstance(node.get("minItems"), int) and node["minItems"] > 0:
            prefix = _list(node.get("prefixItems"))
            needed = prefix[:node["minItems"]] + ([node["items"]] if node["minItems"] > len(prefix) and
                                                   "items" in node else [])
            return all(self.value(s, path, depth + 1) for s in needed)
        return True


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _pointer(root: dict[str, Any], ref: str) -> Any:
    """The node a local ``$ref`` (``#`` or ``#/a/b``) names, or None."""
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


class GrammarMask:
    """One row's grammar state (a :class:`meshlm.generate.sampling.TokenMask`)."""

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
        error = ll.LLMatcher.validate_grammar(grammar, self._lltok, limits=parser_limits())
        if error and not error.startswith("WARNING"):
            raise ApiError(400, f"response_format: the schema cannot be enforced ({error[:200]})",
                           param="response_format")
        masks = [GrammarMask(ll.LLMatcher(self._lltok, grammar, log_level=0, limits=parser_limits()))
                 for _ in range(n)]
        probe = masks[0].matcher.deep_copy()  # the first step's mask, before anything is queued
        probe.compute_logit_bias()
        if probe.is_error() or probe.is_stopped():
            raise ApiError(400, "response_format: the schema cannot be enforced (no JSON value can start under it)",
                           param="response_format", code="schema_without_value")
        return masks
