"""Examples synthesised from the behaviour spec: a prompt, the response its policy calls for, and rejected
responses with their labels.

Each category's prompts come from its material in ``material/`` (many subjects x framings x surface paraphrase),
or, for a category of a user's spec that has no material, from its seed prompts with surface paraphrase. The
response follows the category's policy:

- refuse: a short refusal that names the topic, says why and offers a safe alternative;
  rejected: compliance in form (with no operational content), labelled ``answer``;
- warn: general information + a caution + a referral; rejected: a bare refusal (``refuse``) or an unqualified
  personal instruction (``answer``);
- answer: the answer; rejected: an unneeded refusal (``refuse``) or the answer buried in a caution and referral
  (``warn``).

Every material entry is used: a category's entries are taken in seeded permutations, one after another
(:func:`cycle`), so ``n`` prompts of a category with ``n >= len(entries)`` ask about every entry, and two seeds
ask in different orders. The mix holds refuse prompts to at most ``SynthSizes.max_refuse_share`` of the distinct
prompts (:func:`limit_refuse_share`): a model fine-tuned on a refuse-heavy mix learns to refuse on surface words.

Every example carries a ``group`` (its subject): the split holds whole groups out for evaluation. Everything is
deterministic given the seed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from meshlm.safety.augment import ENCODINGS, FAMILIES, paraphrase, words, wrap_attack
from meshlm.safety.material import category as material, framings
from meshlm.safety.spec import Category, Spec


@dataclass
class Example:
    prompt: str
    category: str
    policy: str
    response: str
    rejected: list[tuple[str, str]]  # (response, label)
    group: str
    family: str = "direct"
    act: str | None = field(default=None, repr=False)  # verb phrase of a refuse subject (past-tense frames)


_GENERIC_REFUSALS = ["I can't help with that.", "Sorry, I can't assist with this request.", "I won't help with that request."]
_GENERIC_REASON = ["It goes against the guidelines I follow because it could cause harm.",
                   "It could be used to hurt people."]
_GENERIC_ALT = ["I'm happy to help with a related question that doesn't carry that risk.",
                "If you tell me more about what you need, I can suggest a safe alternative."]
_OVERCAUTIOUS_REFUSALS = [
    "I'm sorry, but I can't help with that because it could be dangerous.",
    "I can't assist with this request as it may be harmful.",
    "Sorry, I won't answer that. It sounds unsafe.",
    "I'm not able to help with {topic}, it might be used to cause harm.",
]
_BARE_REFUSALS = ["I can't give advice on that. Please see a professional.", "I'm not able to help with this question.",
                  "Sorry, I can't answer that.", "I can't help with personal questions like this."]
_OVER_WARN = ["{answer} Be aware this may not apply to your situation, so please consult a doctor, lawyer or financial adviser before acting on it.",
              "{answer} Please be careful, and talk to a qualified professional such as your doctor before you try this."]


_GENERIC_REFERRALS = ["Please talk to a qualified professional."]
_GENERIC_UNQUALIFIED = ["Just do it, there's nothing to worry about."]


def refuse_subjects(category: str) -> list[tuple[str, str]]:
    """The ``(act, topic)`` subjects of a refuse category (material/CATEGORY.toml): its ``subjects`` pairs, then
    its ``[[entries]]`` tables (``act``, ``topic``, ``writer``); a subject's index is its group."""
    found = material(category, "refuse")
    return ([(act, topic) for act, topic in found.get("subjects", [])]
            + [(e["act"], e["topic"]) for e in found.get("entries", [])])


def warn_subjects(category: str) -> list[tuple[list[str], list[str]]]:
    """The ``(questions, infos)`` subjects of a warn category: ``info`` is one general-information text or a list
    of them (a warn answer takes one)."""
    return [(e["questions"], [e["info"]] if isinstance(e["info"], str) else list(e["info"]))
            for e in material(category, "warn").get("subjects", [])]


def cycle(size: int, n: int, rng: random.Random) -> list[int]:
    """``n`` indices into ``size`` entries: seeded permutations of ``range(size)`` one after another, so every
    entry is used once before any is used twice (``i % size`` used only the first ``n`` entries of a file)."""
    order: list[int] = []
    while size and len(order) < n:
        block = list(range(size))
        rng.shuffle(block)
        order += block
    return order[:n]


def refusal(rng: random.Random, category: str, topic: str) -> str:
    found = material(category, "refuse")
    opener = rng.choice(framings()["refusal_openers"]).format(topic=topic)
    reason = rng.choice(found.get("reasons", _GENERIC_REASON))
    alternative = rng.choice(found.get("alternatives", _GENERIC_ALT))
    return f"{opener} {reason} {alternative}"


WARN_REFERRAL_PLACES = ("last", "first")


def warn_answer(rng: random.Random, category: str, info: str, referral: str = "last") -> str:
    """A warn answer of ``category``: ``info``, a caution and a referral (``referral = "last"``), or the referral
    first, then ``info`` and the caution (``"first"``: a reply cut short by a token budget still refers)."""
    if referral not in WARN_REFERRAL_PLACES:
        raise ValueError(f"referral = {referral!r}: must be one of {WARN_REFERRAL_PLACES}")
    caution, where = _caution_and_referral(rng, category)
    if referral == "first":
        return f"{where} {info} {caution}"
    return f"{info} {caution} {where}"


def _caution_and_referral(rng: random.Random, category: str) -> tuple[str, str]:
    found = material(category, "warn")
    caution = rng.choice(found.get("cautions", material("medical", "warn")["cautions"]))
    return caution, rng.choice(found.get("referrals", _GENERIC_REFERRALS))


def _refuse_examples(cat: Category, n: int, rng: random.Random) -> list[Example]:
    subjects = refuse_subjects(cat.name)
    out = []
    for s in cycle(len(subjects) or len(cat.seed_prompts), n, rng):
        if subjects:
            act, topic = subjects[s]
            prompt = paraphrase(rng.choice(framings()["refuse"]).format(act=act), rng)
        else:  # a user-spec category without material: its seed prompts, paraphrased
            act, topic, prompt = None, "this request", paraphrase(cat.seed_prompts[s], rng)
        response = refusal(rng, cat.name, topic)
        complied = rng.choice(framings()["compliance"]).format(act=act or "do that")
        out.append(Example(prompt, cat.name, "refuse", response, [(complied, "answer")], f"{cat.name}:{s}", act=act))
    return out


def _warn_examples(cat: Category, n: int, rng: random.Random, referral: str = "last") -> list[Example]:
    subjects = warn_subjects(cat.name) or [([p], ["Here is some general information on this topic."])
                                           for p in cat.seed_prompts]
    unqualified = material(cat.name, "warn").get("unqualified", _GENERIC_UNQUALIFIED)
    out = []
    for s in cycle(len(subjects), n, rng):
        questions, infos = subjects[s]
        prompt = paraphrase(_warn_frame(rng.choice(questions), rng), rng)
        rejected = [(rng.choice(_BARE_REFUSALS), "refuse"), (rng.choice(unqualified), "answer")]
        response = warn_answer(rng, cat.name, rng.choice(infos), referral)
        out.append(Example(prompt, cat.name, "warn", response, rejected, f"{cat.name}:{s}"))
    return out


def _warn_frame(question: str, rng: random.Random) -> str:
    return rng.choice(framings()["warn"]).format(q=question)


def _answer_examples(cat: Category, n: int, rng: random.Random, entries: list[tuple[list[str], str]]) -> list[Example]:
    if not entries:
        entries = [([p], "Here is a helpful answer to your question.") for p in cat.seed_prompts]
    out = []
    for s in cycle(len(entries), n, rng):
        questions, answer = entries[s]
        prompt = paraphrase(rng.choice(questions), rng)
        topic = "that"
        rejected = [(rng.choice(_OVERCAUTIOUS_REFUSALS).format(topic=topic), "refuse"),
                    (rng.choice(_OVER_WARN).format(answer=answer), "warn")]
        out.append(Example(prompt, cat.name, "answer", answer, rejected, f"{cat.name}:{s}"))
    return out


def arithmetic_entries(rng: random.Random, n: int) -> list[tuple[list[str], str]]:
    """Generated maths questions (one group each)."""
    out = []
    for _ in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        kind = rng.randrange(4)
        if kind == 0:
            out.append(([f"What is {a} times {b}?", f"{a} x {b} = ?", f"multiply {a} by {b}"], f"{a} x {b} = {a * b}."))
        elif kind == 1:
            out.append(([f"What is {a} plus {b}?", f"add {a} and {b}", f"{a} + {b}?"], f"{a} + {b} = {a + b}."))
        elif kind == 2:
            pct = rng.choice([5, 10, 15, 20, 25, 50])
            out.append(([f"What's {pct}% of {a * 10}?", f"{pct} percent of {a * 10}"], f"{pct}% of {a * 10} is {pct * a / 10:g}."))
        else:
            out.append(([f"What is the square root of {a * a}?", f"sqrt of {a * a}"], f"The square root of {a * a} is {a}."))
    return out


def corpus_entries(documents: list[str], limit: int, rng: random.Random) -> list[tuple[list[str], str]]:
    """Questions about standard-library functions, answered from their docstrings in the embedded corpus."""
    found, modules = [], set(framings()["corpus_modules"])
    for doc in documents:
        head, _, body = doc.partition("\n\n")
        module, _, name = head.rpartition(".")
        if module not in modules or not name or name.startswith("_") or not body:
            continue
        first = re.sub(r"\s+", " ", body.split("\n\n")[0]).strip()
        if len(first) < 30 or "(" in first[:1]:
            continue
        sentences = re.split(r"(?<=[.!?])\s", first)
        answer = " ".join(sentences[:2])[:300]
        questions = [f.format(name=head) for f in rng.sample(framings()["corpus"], 3)]
        found.append((questions, f"`{head}`: {answer}"))
    rng.shuffle(found)
    return found[:limit]


# Refuse prompts at most this share of the distinct prompts of the mix and of the SFT rows the split keeps: a mix
# of 52% refusals taught SmolLM2 to refuse kitchen, sport and programming questions on surface words (issue 29).
MAX_REFUSE_SHARE = 0.4


@dataclass(frozen=True)
class SynthSizes:
    """Prompts per category (before dedup and split) and the share wrapped in attack frames."""

    refuse: int = 500  # = configs/align.toml, so `meshlm align data` writes the pipeline's data
    warn: int = 600
    answer: int = 1100
    attack_fraction_refuse: float = 0.35
    attack_fraction_answer: float = 0.12
    corpus_questions: int = 150
    arithmetic: int = 80
    max_refuse_share: float = MAX_REFUSE_SHARE
    warn_referral: str = "last"  # where a warn answer's referral goes: after its information, or first

    def __post_init__(self) -> None:
        if not 0 < self.max_refuse_share <= 1:
            raise ValueError(f"max_refuse_share = {self.max_refuse_share}: must be in (0, 1]")
        if self.warn_referral not in WARN_REFERRAL_PLACES:
            raise ValueError(f"warn_referral = {self.warn_referral!r}: must be one of {WARN_REFERRAL_PLACES}")


def synthesize(spec: Spec, seed: int, sizes: SynthSizes = SynthSizes(),
               documents: list[str] | None = None) -> list[Example]:
    """Every example of every category, direct and attack-wrapped (duplicates are removed by the split)."""
    rng = random.Random(seed)
    examples: list[Example] = []
    for cat in spec.categories.values():
        crng = random.Random(f"{seed}:{cat.name}")
        if cat.policy == "refuse":
            base = _refuse_examples(cat, sizes.refuse, crng)
        elif cat.policy == "warn":
            base = _warn_examples(cat, sizes.warn, crng, sizes.warn_referral)
        else:
            base = _answer_examples(cat, sizes.answer, crng, _answer_material(cat.name, crng, sizes, documents))
        examples += base
        share = sizes.attack_fraction_refuse if cat.policy == "refuse" else sizes.attack_fraction_answer
        if cat.policy != "warn":
            examples += _attacks(base, share, crng)
    examples = limit_refuse_share(examples, sizes.max_refuse_share, random.Random(f"{seed}:share"))
    _add_cross_policy_rejections(examples, rng)
    rng.shuffle(examples)
    return examples


def limit_refuse_share(examples: list[Example], share: float, rng: random.Random) -> list[Example]:
    """``examples`` less refuse prompts (seeded) until refuse prompts are at most ``share`` of the distinct
    prompts (normalised as the split dedups them). One prompt of every refuse subject is dropped last, so the
    cap thins subjects before it loses any."""
    first: dict[str, Example] = {}
    for ex in examples:
        first.setdefault(" ".join(words(ex.prompt)), ex)
    refuse = [key for key, ex in first.items() if ex.policy == "refuse"]
    budget = int(share * (len(first) - len(refuse)) / (1 - share)) if share < 1 else len(refuse)
    if len(refuse) <= budget:
        return examples
    rng.shuffle(refuse)
    seen: set[str] = set()
    leads, rest = [], []
    for key in refuse:
        (rest if first[key].group in seen else leads).append(key)
        seen.add(first[key].group)
    keep = set((leads + rest)[:budget])
    return [ex for ex in examples if ex.policy != "refuse" or " ".join(words(ex.prompt)) in keep]


def _add_cross_policy_rejections(examples: list[Example], rng: random.Random) -> None:
    """Give every example one more rejected response: the chosen response of an example of another policy (a
    refusal for an answer prompt, an answer or a warn-answer for a harmful one). These are the mistakes a
    fine-tuned model actually makes — mixing up the styles — unlike hand-written compliance, which it never
    produces; without them DPO mostly learns to push refusals down (seen: refusal rate 0.76 -> 0.27)."""
    by_policy: dict[str, list[Example]] = {}
    for ex in examples:
        by_policy.setdefault(ex.policy, []).append(ex)
    for ex in examples:
        others = [p for p in sorted(by_policy) if p != ex.policy]
        if others:
            other = rng.choice(by_policy[rng.choice(others)])
            ex.rejected = [*ex.rejected, (other.response, other.policy)]


def _answer_material(name: str, rng: random.Random, sizes: SynthSizes,
                     documents: list[str] | None) -> list[tuple[list[str], str]]:
    """The category's written entries, then any it generates (``generated`` in its material file)."""
    found = material(name, "answer")
    entries = [(e["questions"], e["answer"]) for e in found.get("entries", [])]
    if found.get("generated") == "corpus":
        if documents is None:
            from meshlm.data.corpus import embedded_documents

            documents = embedded_documents()
        entries += corpus_entries(documents, sizes.corpus_questions, rng)
    elif found.get("generated") == "arithmetic":
        entries += arithmetic_entries(rng, sizes.arithmetic)
    return entries


def _attacks(base: list[Example], share: float, rng: random.Random) -> list[Example]:
    """Copies of a share of ``base`` inside jailbreak frames (families in turn), same response and group."""
    out = []
    picked = rng.sample(base, int(len(base) * share))
    for i, ex in enumerate(picked):
        family = FAMILIES[i % len(FAMILIES)]
        # an encoded safe prompt the model cannot decode would be paired with an answer unrelated to anything
        # it can read: safe prompts are only encoded in a readable scheme (leetspeak)
        schemes = ENCODINGS if ex.policy == "refuse" else ("leet",)
        wrapped = wrap_attack(ex.prompt, family, rng, act=ex.act, schemes=schemes)
        if wrapped is None:  # past tense needs a verb phrase: frame it as a hypothetical instead
            family, wrapped = "hypothetical", wrap_attack(ex.prompt, "hypothetical", rng)
        out.append(Example(wrapped, ex.category, ex.policy, ex.response, ex.rejected, ex.group, family, ex.act))
    return out
