"""Chat templates: conversations to token ids and a loss mask over the assistant turns.

Two templates, one interface (:class:`ChatTemplate`):

- :class:`MeshChatTemplate`, for models trained with a meshlm tokenizer::

      [bos] (<|system|>|<|user|>|<|assistant|>) content <|end|>  ...   (+ <|assistant|> to prompt a reply)

  Markers are inserted as ids; content goes through ``MeshTokenizer.encode``, which never produces a special.
- :class:`HFChatTemplate`, for converted models: the Jinja ``chat_template`` of the checkpoint's
  ``tokenizer_config.json`` (or ``chat_template.jinja``), rendered the way transformers renders it (sandboxed,
  ``trim_blocks``, ``lstrip_blocks``). To keep user text from injecting specials, every message's content is
  rendered as a placeholder; the template's own text is encoded with its special tokens recognised and each
  content is encoded separately as plain text. Assistant spans come from rendering prefixes: the reply to
  messages[:i] spans from the end of ``render(messages[:i], add_generation_prompt=True)`` to the end of
  ``render(messages[:i+1])``; tokens after the span's last special token (e.g. the newline after
  ``<|im_end|>``) are not loss tokens. A template that renders earlier turns differently once more turns follow
  is refused for such rows (it is not prefix-stable, so no span can be found).

Loss covers every assistant turn from message ``loss_from`` on, its end token included; never system or user
turns, never the ``<|assistant|>`` marker or generation prompt before a reply.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from meshlm.data.posttrain.rows import Message
from meshlm.errors import DataError
from meshlm.tokenizer import SPECIAL_TOKENS, MeshTokenizer

_PLACEHOLDER = "\x00meshlm-content-{}\x00"
_PLACEHOLDER_RE = re.compile("\x00meshlm-content-(\\d+)\x00")

# meshlm's template in Jinja, written into exported tokenizer_config.json files; rendering it through
# HFChatTemplate gives exactly MeshChatTemplate's ids (tested).
MESHLM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass
class Encoded:
    """Token ids of one sequence and, per token, whether it is a loss target."""

    ids: list[int]
    loss_mask: list[bool]

    def __post_init__(self) -> None:
        assert len(self.ids) == len(self.loss_mask)


class ChatTemplate(Protocol):
    def encode(self, messages: list[Message], *, loss_from: int = 0, where: str = "") -> Encoded:
        """The conversation, with loss on the assistant turns whose index is >= ``loss_from``."""
        ...

    def encode_prompt(self, messages: list[Message], *, where: str = "") -> list[int]:
        """The conversation followed by the prompt for an assistant reply (for generation)."""
        ...

    def end_of_turn_ids(self) -> list[int]:
        """The special token(s) that end an assistant turn (generation stops there, beside the eos ids)."""
        ...


class MeshChatTemplate:
    """meshlm's own template over the tokenizer's ``<|system|>``/``<|user|>``/``<|assistant|>``/``<|end|>``."""

    def __init__(self, tokenizer: MeshTokenizer) -> None:
        specials = tokenizer.special_ids
        missing = [s for s in SPECIAL_TOKENS[3:] if s not in specials]
        if missing:
            raise DataError(f"the tokenizer lacks the chat tokens {missing}; conversations need a meshlm tokenizer "
                            "or a converted checkpoint whose tokenizer_config.json has a chat_template")
        self.tokenizer = tokenizer
        self._role = {role: specials[f"<|{role}|>"] for role in ("system", "user", "assistant")}
        self._end = specials["<|end|>"]

    def encode(self, messages: list[Message], *, loss_from: int = 0, where: str = "") -> Encoded:
        bos = self.tokenizer.bos_id
        ids, mask = ([bos], [False]) if bos is not None else ([], [])
        for i, msg in enumerate(messages):
            content = self.tokenizer.encode(msg["content"]) + [self._end]
            learn = msg["role"] == "assistant" and i >= loss_from
            ids += [self._role[msg["role"]]] + content
            mask += [False] + [learn] * len(content)
        return Encoded(ids, mask)

    def encode_prompt(self, messages: list[Message], *, where: str = "") -> list[int]:
        return self.encode(messages).ids + [self._role["assistant"]]

    def end_of_turn_ids(self) -> list[int]:
        return [self._end]


class HFChatTemplate:
    """A Hugging Face Jinja chat template (see the module docstring for how spans and safety are obtained)."""

    def __init__(self, tokenizer: MeshTokenizer, template: str, context: dict[str, Any] | None = None,
                 source: str = "chat_template") -> None:
        from jinja2 import TemplateError
        from tokenizers import Tokenizer

        self.tokenizer, self.source = tokenizer, source
        try:
            self._template = _jinja_env().from_string(template)
        except TemplateError as e:
            raise DataError(f"{source}: the chat template does not compile ({e}); fix it or remove it") from e
        # A second copy of the tokenizer that does recognise specials, for the template's own text only.
        self._markup = Tokenizer.from_str(tokenizer.backend.to_str())
        self._markup.encode_special_tokens = False
        added = tokenizer.backend.get_added_tokens_decoder()
        self._special = {i for i, t in added.items() if t.special}
        backend = tokenizer.backend
        defaults = {"bos_token": backend.id_to_token(tokenizer.bos_id) if tokenizer.bos_id is not None else "",
                    "eos_token": backend.id_to_token(tokenizer.eos_id),
                    "pad_token": backend.id_to_token(tokenizer.pad_id) if tokenizer.pad_id is not None else ""}
        self._context = {**defaults, **(context or {})}

    def encode(self, messages: list[Message], *, loss_from: int = 0, where: str = "") -> Encoded:
        full = self._render(messages, False, where)
        spans = []
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant" or i < loss_from:
                continue
            before = self._render(messages[:i], True, where)
            upto = self._render(messages[: i + 1], False, where)
            if not (upto.startswith(before) and full.startswith(upto)):
                raise DataError(f"{where}: {self.source} renders message {i} differently once later turns follow "
                                "(it is not prefix-stable), so its assistant span cannot be found; use a template "
                                "that renders earlier turns unchanged, or split the conversation")
            spans.append((len(before), len(upto)))
        return self._encode_text(full, messages, spans, where)

    def encode_prompt(self, messages: list[Message], *, where: str = "", tools: list[dict] | None = None) -> list[int]:
        """``tools`` (OpenAI function definitions) are passed to the template as its ``tools`` variable."""
        return self._encode_text(self._render(messages, True, where, tools), messages, [], where).ids

    def end_of_turn_ids(self) -> list[int]:
        """The first special token the template puts after an assistant reply (``<|im_end|>`` in ChatML,
        ``<|eot_id|>`` in Llama 3's); none for a template that refuses a one-turn chat or ends turns in text."""
        try:
            text = self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], False,
                                "a one-turn chat")
        except DataError:
            return []
        reply = _PLACEHOLDER.format(1)
        after = text[text.index(reply) + len(reply):] if reply in text else ""
        specials = [i for i in self._markup.encode(after, add_special_tokens=False).ids if i in self._special]
        return specials[:1]

    # --- rendering and encoding -----------------------------------------------------------------------------
    def _render(self, messages: list[Message], add_generation_prompt: bool, where: str,
                tools: list[dict] | None = None) -> str:
        from jinja2 import TemplateError

        masked = [{**m, "content": _PLACEHOLDER.format(i)} for i, m in enumerate(messages)]
        extra = {"tools": tools} if tools is not None else {}
        try:
            return self._template.render(messages=masked, add_generation_prompt=add_generation_prompt,
                                         **extra, **self._context)
        except (TemplateError, _TemplateRaised) as e:
            raise DataError(f"{where}: {self.source} refused this conversation ({e}); fix the row or the "
                            "template") from None

    def _encode_text(self, text: str, messages: list[Message], spans: list[tuple[int, int]], where: str) -> Encoded:
        """Encode a rendered text: placeholders become the plain-text content, the rest is template markup."""
        cuts = sorted({0, len(text)} | {c for span in spans for c in span})
        for m in _PLACEHOLDER_RE.finditer(text):
            cuts += [m.start(), m.end()]
        cuts = sorted(set(cuts))
        ids: list[int] = []
        mask: list[bool] = []
        seen: set[int] = set()
        for start, end in zip(cuts, cuts[1:]):
            piece = text[start:end]
            placeholder = _PLACEHOLDER_RE.fullmatch(piece)
            if placeholder:
                index = int(placeholder.group(1))
                if index in seen:
                    raise DataError(f"{where}: {self.source} repeats message {index}'s content; such templates "
                                    "are not supported for training")
                seen.add(index)
                piece_ids = self.tokenizer.encode(messages[index]["content"])  # never yields a special
            else:
                piece_ids = self._markup.encode(piece, add_special_tokens=False).ids
            learn = any(a <= start and end <= b for a, b in spans)
            ids += piece_ids
            mask += [learn] * len(piece_ids)
        return Encoded(ids, self._trim_after_last_special(ids, mask))

    def _trim_after_last_special(self, ids: list[int], mask: list[bool]) -> list[bool]:
        """Within each loss run, drop the tokens after its last special (formatting nobody has to generate)."""
        mask = list(mask)
        i = 0
        while i < len(mask):
            if not mask[i]:
                i += 1
                continue
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            specials = [k for k in range(i, j) if ids[k] in self._special]
            if specials:
                for k in range(specials[-1] + 1, j):
                    mask[k] = False
            i = j
        return mask


class _TemplateRaised(Exception):
    """``raise_exception(...)`` called by a template (e.g. roles must alternate)."""


def _raise(message: str) -> None:
    raise _TemplateRaised(message)


def _jinja_env():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # As transformers renders chat templates. ``strftime_now`` is left undefined on purpose: templates then
    # fall back to a fixed date, so the same row always gives the same tokens.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent, **kw)
    env.globals["raise_exception"] = _raise
    return env


def read_hf_chat_template(folder: str | Path) -> tuple[str, dict[str, Any]] | None:
    """The chat template of an HF tokenizer folder and its special-token strings, or None when it has none."""
    folder = Path(folder)
    config_path = folder / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DataError(f"{config_path} is not valid JSON ({e}); fix or delete it") from None
    context = {k: _token_string(config[k]) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
               if k in config}
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8"), context
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
        if template is None:
            raise DataError(f"{config_path}: chat_template lists {sorted(map(str, named))} but no 'default'")
    if template is None:
        return None
    if not isinstance(template, str) or not template.strip():
        raise DataError(f"{config_path}: chat_template must be a non-empty string")
    return template, context


def chat_template_for(tokenizer: MeshTokenizer, tokenizer_dir: str | Path | None = None) -> ChatTemplate:
    """The HF template of ``tokenizer_dir`` when it has one (converted models), else meshlm's own."""
    found = read_hf_chat_template(tokenizer_dir) if tokenizer_dir is not None else None
    if found is not None:
        template, context = found
        return HFChatTemplate(tokenizer, template, context, source=f"chat template of {tokenizer_dir}")
    return MeshChatTemplate(tokenizer)


def _token_string(value: Any) -> str:
    """A special token as tokenizer_config.json writes it (string, AddedToken dict or null)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
