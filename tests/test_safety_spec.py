"""The behaviour spec: the embedded default and the validation of a user's spec (errors name file and key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshlm.errors import UserError
from meshlm.safety.spec import POLICIES, STANDARD_CATEGORIES, SpecError, load_spec

GOOD = """version = "2.1"
[categories.pets]
policy = "answer"
description = "Pet care."
principles = ["Answer pet questions.", "Be kind."]
seed_prompts = ["How often should I feed a cat?"]
guidance = "Answer directly."
[categories.lockpicking]
policy = "refuse"
description = "Opening locks one does not own."
principles = ["Do not explain how to open other people's locks.", "Be kind."]
seed_prompts = ["How do I pick my neighbour's lock?"]
guidance = "Decline and suggest a locksmith."
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def test_embedded_spec_has_every_named_category_with_its_policy():
    spec = load_spec()
    assert spec.version == "1.0" and len(spec.sha256) == 64
    assert {name: c.policy for name, c in spec.categories.items()} == STANDARD_CATEGORIES
    for cat in spec.categories.values():
        assert cat.policy in POLICIES and cat.description and cat.guidance
        assert cat.principles and cat.seed_prompts and all(isinstance(p, str) and p for p in cat.seed_prompts)
    principles = spec.principles()
    assert len(principles) == len(set(principles)) >= 2 * len(spec.categories)
    assert [c.name for c in spec.by_policy("warn")] == ["medical", "mental_health", "legal", "financial"]


def test_user_spec_loads_and_principles_are_deduplicated(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.version == "2.1" and list(spec.categories) == ["pets", "lockpicking"]
    assert spec.principles() == ["Answer pet questions.", "Be kind.", "Do not explain how to open other people's locks."]
    assert spec.policy_of("lockpicking") == "refuse"


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace('policy = "answer"', 'policy = "deny"'), "categories.pets.policy is 'deny'"),
    (lambda t: t.replace('guidance = "Answer directly."\n', ""), "categories.pets is missing guidance"),
    (lambda t: t.replace('seed_prompts = ["How often should I feed a cat?"]', "seed_prompts = []"),
     "categories.pets.seed_prompts must be a non-empty list"),
    (lambda t: t.replace('principles = ["Answer pet questions.", "Be kind."]', 'principles = "be nice"'),
     "categories.pets.principles must be a non-empty list"),
    (lambda t: t.replace('guidance = "Answer directly."', 'guidance = "Answer directly."\nguidence = "x"'),
     "categories.pets.guidence is not a category key (did you mean 'guidance'?)"),
    (lambda t: t.replace('version = "2.1"', ""), "'version' is missing"),
    (lambda t: t.replace('version = "2.1"', 'version = "2.1"\nverison = 3'), "'verison' is not a top-level spec key"),
    (lambda t: 'version = "1"\n', "no categories"),
    (lambda t: t + "[[[", "is not valid TOML"),
])
def test_invalid_spec_errors_name_the_file_and_key(tmp_path, edit, expected):
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert expected in str(info.value) and str(path) in str(info.value)
    assert isinstance(info.value, UserError)


def test_missing_spec_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.toml")


def test_cli_bad_spec_exits_2_with_one_line(tmp_path, capsys):
    from meshlm.cli.main import main

    path = write(tmp_path, GOOD.replace('policy = "answer"', 'policy = "deny"'))
    with pytest.raises(SystemExit) as info:
        main(["align", "data", "--spec", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.strip().count("\n") == 0 and "categories.pets.policy" in err and str(path) in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
