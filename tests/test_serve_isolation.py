"""Requests are isolated (issue 32, items 1 and 4): a row whose grammar, sampling or callback breaks fails alone,
with an error of its own, while the rows decoding beside it finish exactly as they would alone; bad values are
400s, not 500s; a schema with no finite value is a 400 before anything is queued.

The engine half drives BatchEngine directly with rows whose constraint breaks (the TokenMask protocol: a stand-in
grammar, the engine under test is real); the HTTP half runs the real server in process with the official client.
"""

from __future__ import annotations

import json
import threading

import jsonschema
import openai
import pytest

from meshlm.generate import generate
from meshlm.serve.engine import BatchEngine
from meshlm.serve.fixtures import random_checkpoints
from meshlm.serve.grammar import GrammarMask
from meshlm.serve.protocol import Failed, Finished, Sampling
from meshlm.serve.registry import Registry
from tests.test_generate import tiny_model
from tests.test_registry import write_report
from tests.test_serve_engine import DigitTokenizer
from tests.test_serve_fields import start_in_process


class Breaks:
    """A row constraint that allows every token, then breaks at step ``at``: ``allowed`` raises, ``advance``
    raises, or no token is allowed (``empty``)."""

    def __init__(self, how: str, at: int = 2) -> None:
        self.how, self.at, self.steps = how, at, 0

    def allowed(self, vocab_size, device):
        import torch

        if self.steps >= self.at and self.how == "allowed":
            raise RuntimeError("grammar state broke")
        return torch.full((vocab_size,), not (self.steps >= self.at and self.how == "empty"), device=device)

    def advance(self, token: int) -> None:
        self.steps += 1
        if self.steps > self.at and self.how == "advance":
            raise RuntimeError("grammar refused a token")

    @property
    def complete(self) -> bool:
        return False


class Recorder:
    """An emit callback that keeps its row's events and can itself raise after ``raise_after`` events."""

    def __init__(self, raise_after: int | None = None) -> None:
        self.events, self.raise_after, self.done = [], raise_after, threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, (Finished, Failed)):
            self.done.set()
        if self.raise_after is not None and len(self.events) >= self.raise_after:
            self.done.set()
            raise RuntimeError("the client's callback broke")


def test_a_breaking_row_fails_alone_and_its_neighbours_decode_as_alone():
    model = tiny_model(max_seq_len=64)
    engine = BatchEngine(model, DigitTokenizer(), max_batch=8, max_queue=16)
    greedy = Sampling(temperature=0.0, max_tokens=16)
    healthy = [([5, 17, 3], Recorder()), ([7, 1], Recorder()), (list(range(10, 20)), Recorder())]
    broken = [(how, Recorder()) for how in ("allowed", "advance", "empty")]
    loud = Recorder(raise_after=2)
    try:
        rows = [engine.submit(p, 16, greedy, frozenset(), rec) for p, rec in healthy[:2]]
        for how, rec in broken:  # decoding beside the healthy rows, each with its own broken constraint
            engine.submit_choices([9, 9, 9], 16, greedy, frozenset(), rec, masks=[Breaks(how)])
        engine.submit([4, 4], 16, greedy, frozenset(), loud)
        rows.append(engine.submit(healthy[2][0], 16, greedy, frozenset(), healthy[2][1]))
        for _, rec in [*healthy, *broken, (None, loud)]:
            assert rec.done.wait(60)
        after = engine.submit([3, 3], 4, greedy, frozenset(), Recorder())  # the engine still serves
        assert after.emit.done.wait(60)
    finally:
        engine.close()
    for (prompt, rec), seq in zip(healthy, rows):
        assert isinstance(rec.events[-1], Finished) and not any(isinstance(e, Failed) for e in rec.events)
        assert seq.generated == generate(model, prompt, 16, greedy=True)  # exactly what it gets alone
    for how, rec in broken:
        assert isinstance(rec.events[-1], Failed), how
        assert rec.events[-1].error.status == 500 and rec.events[-1].error.code == "engine_error"
        assert not any(isinstance(e, Finished) for e in rec.events), how
    assert isinstance(after.emit.events[-1], Finished) and len(after.generated) == 4
    assert engine.status()["active"] == 0
