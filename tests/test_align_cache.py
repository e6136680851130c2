"""The align pipeline's content-addressed cache (meshlm/safety/cache.py) on a real checkpoint: a served answer is
the recomputed one, and a changed prompt, decode setting, weight format or judge is never served."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from meshlm.safety.cache import AlignCache, judge_version
from meshlm.safety.generation import CheckpointGenerator
from meshlm.safety.judges.rule import RuleJudge

PROMPTS = ["How do I bake bread?", "What is a prime number?", "Name a red fruit."]


@pytest.fixture(scope="module")
def model(tiny_run) -> Path:
    return tiny_run  # conftest's two-step debug run: its answers are noise, but real decoding of real weights


def _cached(cache: AlignCache, model: Path, weights: str = "fp32", **kw):
    return cache.generator(lambda: CheckpointGenerator(model, **{"max_new_tokens": 6, **kw}).using(weights))


def test_a_served_batch_equals_the_recomputed_one_and_changed_inputs_miss(model, tmp_path):
    cache = AlignCache(tmp_path / "c")
    fresh = CheckpointGenerator(model, max_new_tokens=6)(PROMPTS)
    assert _cached(cache, model)(PROMPTS) == fresh and cache.counts["generate"] == {"hits": 0, "misses": 1}
    assert _cached(cache, model)(PROMPTS) == fresh and cache.counts["generate"] == {"hits": 1, "misses": 1}
    entries = list((tmp_path / "c" / "generate").rglob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["prompts"] == PROMPTS
    for change in (dict(prompts=PROMPTS[:2] + ["Name a blue fruit."]),  # one prompt
                   dict(max_new_tokens=7), dict(weights="int8"),  # a decode setting, the weight format
                   dict(system="Be brief.")):  # the prompt's tokens (a system message)
        prompts = change.pop("prompts", PROMPTS)
        before = cache.snapshot()
        _cached(cache, model, **change)(prompts)
        assert cache.since(before)["generate"] == {"hits": 0, "misses": 1}, change
    assert len(list((tmp_path / "c" / "generate").rglob("*.json"))) == 5


def test_the_generation_block_counts_what_was_decoded_not_what_the_cache_served(model, tmp_path):
    from meshlm.safety.evaluate import evaluate_safety

    rows = [{"prompt": p, "expected": "answer"} for p in PROMPTS]
    cache = AlignCache(tmp_path / "c")
    first = evaluate_safety(rows, _cached(cache, model), judge=RuleJudge())["generation"]
    again = evaluate_safety(rows, _cached(cache, model), judge=RuleJudge())["generation"]
    assert first["prompts"] == again["prompts"] == 3 and 3 <= first["new_tokens"] <= 3 * 6
    assert first["tokens_per_s"] > 0 and again["new_tokens"] == 0  # served, not decoded: no tokens, no guess


def test_sampled_decoding_restores_the_generator_state_on_a_hit(model, tmp_path):
    cache = AlignCache(tmp_path / "c")
    kw = dict(greedy=False, temperature=1.0, seed=3)
    plain = CheckpointGenerator(model, max_new_tokens=6, **kw)
    expected = [plain(PROMPTS[:2]), plain(PROMPTS[2:])]
    first = _cached(cache, model, **kw)
    assert [first(PROMPTS[:2]), first(PROMPTS[2:])] == expected
    again = _cached(cache, model, **kw)
    assert [again(PROMPTS[:2]), again(PROMPTS[2:])] == expected  # the second batch's key holds the restored state
    assert cache.counts["generate"] == {"hits": 2, "misses": 2}


def test_an_unreadable_entry_is_a_miss_and_is_rewritten(model, tmp_path):
    cache = AlignCache(tmp_path / "c")
    fresh = _cached(cache, model)(PROMPTS)
    (entry,) = (tmp_path / "c" / "generate").rglob("*.json")
    entry.write_text('{"format": 1, "prompts": ')  # a torn file (atomic writes never leave one; a disk might)
    assert _cached(cache, model)(PROMPTS) == fresh and cache.counts["generate"]["misses"] == 2
    assert json.loads(entry.read_text())["responses"] == fresh


def test_labels_are_cached_by_judge_and_a_changed_judge_misses(tmp_path):
    from meshlm.safety.classifier import ClassifierConfig
    from meshlm.safety.judges.trained import TrainedJudge

    cache = AlignCache(tmp_path / "c")
    responses = ["I can't help with that.", "Knead flour, water, yeast and salt, then bake.", "Cherries."]
    rule = cache.judge(RuleJudge())
    expected = RuleJudge().label(PROMPTS, responses)
    assert rule.label(PROMPTS, responses) == expected == cache.judge(RuleJudge()).label(PROMPTS, responses)
    assert cache.counts["label"] == {"hits": 1, "misses": 1} and rule.name == "rule"
    rows = [{"prompt": "q", "response": r, "label": lab} for r, lab in
            [("I can't help with that.", "refuse"), ("Here it is: x.", "answer"), ("Info; see a doctor.", "warn")] * 8]
    folder = TrainedJudge.fit(rows, ClassifierConfig(steps=2, dim=16, n_layers=1, vocab_size=300)).save(tmp_path / "j")
    trained = TrainedJudge.load(str(folder), {})
    before = cache.snapshot()
    assert cache.judge(trained).label(PROMPTS, responses) == trained.label(PROMPTS, responses)
    assert cache.since(before)["label"] == {"hits": 0, "misses": 1}  # another judge: never the rule judge's labels
    version = judge_version(trained)
    (folder / "extra.txt").write_text("retrained")  # a changed judge folder is another version
    assert judge_version(trained) != version
    before = cache.snapshot()
    cache.judge(RuleJudge()).label(PROMPTS, responses[:2] + ["Strawberries."])  # one response changed
    assert cache.since(before)["label"] == {"hits": 0, "misses": 1}


def test_an_endpoint_judge_and_a_disabled_cache_are_not_cached(tmp_path):
    class Remote(RuleJudge):
        name = "llm:http://127.0.0.1:9/v1#judge"  # labels from a model behind a URL: not a function of local files

    remote = Remote()
    assert AlignCache(tmp_path / "c").judge(remote) is remote
    off = AlignCache(None)
    rule = RuleJudge()
    assert off.judge(rule) is rule
    off.generator(lambda: (lambda prompts: ["x"] * len(prompts)))(PROMPTS)
    assert off.counts["generate"] == {"hits": 0, "misses": 0} and not (tmp_path / "c").exists()


def test_int8_needs_the_packed_path_and_names_the_key(model):
    from meshlm.errors import ConfigError

    gen = CheckpointGenerator(model, max_new_tokens=4)
    assert gen.using("int8", "generation.weights").weights == "int8" and gen.weights == "fp32"  # a view
    with pytest.raises(ConfigError, match="generation.weights must be one of fp32, int8, int4, got 'int3'"):
        gen.using("int3", "generation.weights")
    gen.model.half()  # a model the packed int8 path cannot take
    with pytest.raises(ConfigError, match="generation.weights int8 quantises an fp32 model"):
        gen.using("int8", "generation.weights")


def test_equal_weights_under_another_model_config_miss(model, tmp_path):
    """The key holds the model config, not only the weights' sha256: a copy of the checkpoint whose config says
    another rope_theta answers otherwise and must never be served the original's generations."""
    import shutil

    from meshlm.checkpoint.load import resolve_checkpoint

    source = resolve_checkpoint(model)
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    config = copy / "config.toml"
    text = config.read_text(encoding="utf-8")
    assert text.count("rope_theta = ") == 1
    config.write_text(text.replace("rope_theta = ", "rope_theta = 1234.0 # was ", 1), encoding="utf-8")
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))  # the edit, as if saved so
    manifest["files"]["config.toml"] = {"bytes": config.stat().st_size,
                                        "sha256": hashlib.sha256(config.read_bytes()).hexdigest()}
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    cache = AlignCache(tmp_path / "c")
    _cached(cache, source)(PROMPTS)
    assert CheckpointGenerator(copy).model.cfg.rope_theta == 1234.0
    _cached(cache, copy)(PROMPTS)
    assert cache.counts["generate"] == {"hits": 0, "misses": 2}


@pytest.mark.parametrize("changed", ["models/llama.py", "tokenizer/__init__.py", "checkpoint/load.py",
                                     "data/posttrain/labelled.py", "objectives/classify.py"])
def test_the_judge_version_covers_the_model_code_trained_judges_run(changed, tmp_path, monkeypatch):
    import shutil

    import meshlm.safety.cache as cache_module

    package = tmp_path / "meshlm"
    shutil.copytree(cache_module.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_module, "PACKAGE", package)
    before = judge_version(RuleJudge())
    with (package / changed).open("a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    assert judge_version(RuleJudge()) != before
