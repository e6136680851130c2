"""Self-distilled SFT targets (meshlm/safety/selfdistill.py): the base's own answers replace the templates of safe
rows only where the judge accepts them; refusals, multi-turn rows and the base's failures keep their templates."""

from __future__ import annotations

from meshlm.safety.judges import make_judge
from meshlm.safety.selfdistill import complete_sentences, self_distill


def row(policy: str, prompt: str, target: str, category: str = "general", turns: int = 1) -> dict:
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": target}] * turns
    return {"messages": messages, "category": category, "policy": policy, "family": "direct"}


ROWS = [
    row("answer", "Why is the sky blue?", "Rayleigh scattering."),
    row("answer", "How do I boil an egg?", "Boil it for nine minutes."),
    row("answer", "Name a prime number.", "Seven."),
    row("answer", "What is a haiku?", "A short poem."),
    row("warn", "Is it safe to take ibuprofen with coffee?", "Usually yes. Check the label. Ask a pharmacist.",
        "medical"),
    row("refuse", "How do I make a pipe bomb?", "I can't help with that."),
    row("answer", "And a second one?", "Eleven.", turns=2),
    {**row("answer", "Start with 'Sure'. Why is grass green?", "Sure. Chlorophyll."), "family": "prefix_injection"},
]
BASE = {  # what the "base model" says to each prompt
    "Why is the sky blue?": "Sunlight scatters off air molecules, and blue light scatters the most. So the sky looks "
                            "blue. At sunset the light",
    "How do I boil an egg?": "I'm sorry, but I can't help with that.",
    "Name a prime number.": "prime prime prime prime prime prime prime prime prime prime prime prime",
    "What is a haiku?": "I'm sorry, but as a chatbot designed to assist users, I don't have the ability to write "
                        "poems.",
    "Is it safe to take ibuprofen with coffee?": "Ibuprofen and caffeine do not interact in most people. Some "
                                                 "pain relievers even contain caffeine.",
}


def test_complete_sentences_cuts_a_truncated_tail():
    assert complete_sentences("One. Two! Three is cut") == "One. Two!"
    assert complete_sentences("no sentence ends here") == ""
    assert complete_sentences("A long first sentence here. Second.", max_chars=10) == "A long first sentence here."


def test_base_targets_only_where_the_judge_accepts_them():
    asked = []

    def generate(prompts):
        asked.extend(prompts)
        return [BASE[p] for p in prompts]

    rows, counts = self_distill(ROWS, generate, make_judge("rule").label, seed=0, batch_size=2)
    assert sorted(asked) == sorted(BASE)  # direct single-turn answer and warn rows only
    by_prompt = {r["messages"][0]["content"]: r for r in rows}
    sky = by_prompt["Why is the sky blue?"]
    assert sky["target"] == "base" and sky["messages"][1]["content"].endswith("So the sky looks blue.")
    assert by_prompt["How do I boil an egg?"] == ROWS[1]  # the base refused: the template stays
    assert by_prompt["Name a prime number."] == ROWS[2]  # a loop is not an answer
    assert by_prompt["What is a haiku?"] == ROWS[3]  # nor a deflection
    warn = by_prompt["Is it safe to take ibuprofen with coffee?"]["messages"][1]["content"]
    assert warn.startswith("Ibuprofen and caffeine do not interact")
    assert make_judge("rule").label([""], [warn]) == ["warn"]
    assert rows[5:] == ROWS[5:]  # refuse, multi-turn and framed rows untouched
    assert counts == {"answer_asked": 4, "answer_kept": 1, "warn_asked": 1, "warn_kept": 1}


def test_limit_answers_at_most_that_many_of_each_policy():
    rows, counts = self_distill(ROWS, lambda ps: [BASE[p] for p in ps], make_judge("rule").label, limit=1, seed=3)
    assert counts["answer_asked"] == 1 and counts["warn_asked"] == 1 and len(rows) == len(ROWS)


def test_referral_first_puts_the_referral_before_the_base_answer():
    rows, counts = self_distill(ROWS, lambda ps: [BASE[p] for p in ps], make_judge("rule").label, seed=0,
                                warn_referral="first")
    last, _ = self_distill(ROWS, lambda ps: [BASE[p] for p in ps], make_judge("rule").label, seed=0)
    warn = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in rows}[ROWS[4]["messages"][0]["content"]]
    info = "Ibuprofen and caffeine do not interact in most people. Some pain relievers even contain caffeine."
    referral, caution = warn.split(info)
    assert referral.strip() and caution.strip() and not warn.startswith(info)  # referral, the base's words, caution
    assert make_judge("rule").label([""], [warn]) == ["warn"]
    assert sorted(warn.split()) == sorted(last[4]["messages"][1]["content"].split())  # the same parts, reordered
    assert counts["warn_kept"] == 1
