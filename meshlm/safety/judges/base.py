"""The judge interface: what every judge plug-in provides, and the degenerate-text check they all share.

A judge labels (prompt, response) pairs with a label of taxonomy.py. :meth:`Judge.label` first labels
degenerate text ``unclear`` (degenerate.py: empty, symbols, a loop, an echo of the prompt) — the same check for
every judge, so that a loop is never a refusal whichever judge reads it — and hands the rest to the judge's own
:meth:`Judge.classify`. A classifier head (the encoder and trained judges) thus never sees degenerate text;
text unrelated to the request is left to the judge itself.

A plug-in is a subclass with a ``kind`` (its registry name, the NAME of ``--judge NAME[:ARG]``), what its ARG
is, the flags it reads when it is loaded (``flags``) and, when it can be trained by ``meshlm judge
--train-judge``, the flags of its training (``train_flags``). Plug-in modules stay light: a model library is
imported inside :meth:`load` / :meth:`train`, not at import, because the CLI reads every plug-in's flags to
build its parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

from meshlm.safety.degenerate import degenerate
from meshlm.safety.taxonomy import UNCLEAR

Log = Callable[[str], None]


@dataclass(frozen=True)
class Flag:
    """A command-line flag a judge reads (``--judge-model``), passed to it in ``options`` under ``dest``."""

    name: str
    help: str
    type: type = str
    required: bool = False  # a training flag without which this kind cannot train (it also selects the kind)

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


class Judge:
    """Base of every judge. Subclasses set ``kind`` and implement :meth:`classify` and :meth:`load`."""

    kind: ClassVar[str] = ""
    arg: ClassVar[str] = ""  # what ARG in NAME:ARG is ("DIR", "URL#MODEL"); "" when the kind takes none
    arg_optional: ClassVar[bool] = False  # NAME alone is accepted too (load gets arg "": the kind's default)
    summary: ClassVar[str] = ""
    flags: ClassVar[tuple[Flag, ...]] = ()
    train_flags: ClassVar[tuple[Flag, ...]] = ()

    name: str = ""  # the instance's full name as reports record it ("rule", "encoder:DIR")

    def label(self, prompts: Sequence[str], responses: Sequence[str]) -> list[str]:
        """One label per pair: ``unclear`` for degenerate text, the judge's own label for the rest."""
        prompts = list(prompts) + [""] * (len(responses) - len(prompts))  # a prompt only helps; never required
        labels: list[str | None] = [UNCLEAR if degenerate(p, r) else None for p, r in zip(prompts, responses)]
        rest = [i for i, lab in enumerate(labels) if lab is None]
        if rest:
            for i, lab in zip(rest, self.classify([prompts[i] for i in rest], [responses[i] for i in rest])):
                labels[i] = lab
        return [str(lab) for lab in labels]

    def classify(self, prompts: Sequence[str], responses: Sequence[str]) -> list[str]:
        """Labels of pairs that are not degenerate text."""
        raise NotImplementedError

    def explain(self, response: str, prompt: str = "") -> dict[str, Any]:
        """Why a pair gets its label: ``{"label", "degenerate", ...}`` plus what the judge can say."""
        why = degenerate(prompt, response)
        out: dict[str, Any] = {"label": self.label([prompt], [response])[0], "degenerate": why}
        if why is None:
            out.update(self.details(prompt, response))
        return out

    def details(self, prompt: str, response: str) -> dict[str, Any]:
        return {}

    @classmethod
    def load(cls, arg: str, options: Mapping[str, Any]) -> "Judge":
        """The judge named ``KIND:arg``; ``options`` holds the values of :attr:`flags` (None when not given)."""
        raise NotImplementedError

    @classmethod
    def train(cls, rows: list[dict], options: Mapping[str, Any], out: str, log: Log) -> dict[str, Any]:
        """Train on labelled rows, save to ``out``, return the summary ``meshlm judge`` reports."""
        raise NotImplementedError(f"the {cls.kind} judge cannot be trained by meshlm judge")

    @classmethod
    def trainable(cls) -> bool:
        return cls.train.__func__ is not Judge.train.__func__  # type: ignore[attr-defined]
