"""What a generation asks for: one :class:`SamplingParams` type for ``generate()``, ``rollout()`` and the server.

The same fields mean the same thing everywhere (meshlm/generate/sampling.py applies them, in this order): the
logit bias is added, the presence/frequency penalties are subtracted (OpenAI's formula on the tokens generated
so far), then temperature 0 takes the argmax; otherwise the logits are divided by the temperature, cut to the
top-k, to the top-p nucleus and to min-p, and one token is drawn by inverse CDF from one uniform of the row's
own generator (seeded by ``seed``), so a seed gives the same tokens alone or in a batch, in every caller.

A bad value raises :class:`SamplingError` (a ConfigError: exit code 2 on the CLI) naming the field, when the
params are made. The server's request schemas check the OpenAI ranges first (a 400 naming the JSON field);
every value they let through is valid here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from meshlm.errors import ConfigError

SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed accepts


class SamplingError(ConfigError):
    """A sampling field out of range; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"sampling {field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation (module docstring for the order they apply in).

    ``max_tokens``: new tokens at most (None: as many as the context, and a server's cap, allow). ``temperature``
    0 is greedy. ``top_k`` 0, ``top_p`` 1 and ``min_p`` 0 disable their filter; the most likely token always
    survives top-p (``top_p`` 0 keeps it alone) and min-p (a token is dropped when its probability is below
    ``min_p`` times the most likely one's). ``presence_penalty`` / ``frequency_penalty``: OpenAI's, on the
    generated tokens. ``logit_bias``: (token id, bias) pairs added to the logits (-100 bans a token).
    ``stop_ids``: a generation ends after emitting any of them (included; meshlm/generate/stops.py gives a
    checkpoint's); ``stop``: strings that end it (not included; where text is decoded: the server). ``seed``:
    the row's generator (None: a fresh random seed). ``logprobs``: None returns none, k >= 0 the chosen token's
    model log-prob and the k most likely (the server). ``n`` choices and ``echo`` are the server's.
    """

    # The first eleven fields keep the order meshlm/serve/schemas.py passes a request's values in.
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    echo: bool = False
    top_k: int = 0
    min_p: float = 0.0
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self._normalise()
        _integer("max_tokens", self.max_tokens, 0, optional=True)
        _number("temperature", self.temperature, 0.0, None, "0 is greedy decoding")
        _number("top_p", self.top_p, 0.0, 1.0, "1 disables it")
        _number("min_p", self.min_p, 0.0, 1.0, "0 disables it")
        _integer("top_k", self.top_k, 0, hint=" (0 disables it)")
        _number("presence_penalty", self.presence_penalty, None, None)
        _number("frequency_penalty", self.frequency_penalty, None, None)
        _integer("seed", self.seed, SEED_RANGE[0], optional=True, most=SEED_RANGE[1])
        _integer("n", self.n, 1)
        _integer("logprobs", self.logprobs, 0, optional=True)
        for token, bias in self.logit_bias:
            _integer("logit_bias", token, 0, hint=" (a token id)")
            _number("logit_bias", bias, None, None)
        for token in self.stop_ids:
            _integer("stop_ids", token, 0, hint=" (a token id)")
        if any(not isinstance(s, str) for s in self.stop):
            raise SamplingError("stop", "stop strings must be strings")

    def _normalise(self) -> None:
        """The sequence fields as tuples (hashable, as the server builds them): one stop string or one stop id
        alone, lists, and a ``{token id: bias}`` mapping are accepted; a str is one stop string, never its
        characters (the engine would stop at any of them)."""
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        stop_ids = (self.stop_ids,) if isinstance(self.stop_ids, int) else self.stop_ids
        bias = tuple(self.logit_bias.items()) if isinstance(self.logit_bias, Mapping) else self.logit_bias
        for field, value, how in (("stop", stop, "strings"), ("stop_ids", stop_ids, "token ids"),
                                  ("logit_bias", bias, "(token id, bias) pairs or a {token id: bias} mapping")):
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise SamplingError(field, f"must be a sequence of {how}, got {value!r}")
            object.__setattr__(self, field, tuple(value))  # frozen: set once, here
        for pair in self.logit_bias:
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable) or len(tuple(pair)) != 2:
                raise SamplingError("logit_bias", f"must hold (token id, bias) pairs, got {pair!r}")
        object.__setattr__(self, "logit_bias", tuple(tuple(pair) for pair in self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def with_(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)


def _integer(field: str, value: Any, least: int, *, optional: bool = False, most: int | None = None,
             hint: str = "") -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        bound = f">= {least}" if most is None else f"in [{least}, {most}]"
        raise SamplingError(field, f"must be an integer {bound}{hint}, got {value!r}")


def _number(field: str, value: Any, least: float | None, most: float | None, hint: str = "") -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (least is None or value >= least) and (most is None or value <= most)
    if not ok:
        bound = {(True, True): "a finite number", (False, True): f"a number >= {least}",
                 (True, False): f"a number <= {most}", (False, False): f"a number in [{least}, {most}]"}
        what = bound[(least is None, most is None)]
        raise SamplingError(field, f"must be {what}{' (' + hint + ')' if hint else ''}, got {value!r}")
