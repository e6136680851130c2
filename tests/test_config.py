"""Config loading: defaults, overrides, validation errors that name the key."""

import pytest

from meshlm.config.loader import apply_overrides, build_config, config_to_toml, load_config, read_toml
from meshlm.config.schema import SECTIONS
from meshlm.errors import ConfigError
from meshlm.models.flavors import FLAVORS, flavor_config
from meshlm.sections import describe


def test_flavor_then_overrides():
    cfg = load_config(None, ['model.flavor="small"', "model.n_layers=2", "training.steps=7"])
    assert cfg.model.dim == FLAVORS["small"]["dim"]
    assert cfg.model.n_layers == 2
    assert cfg.training.steps == 7


def test_resolved_toml_round_trips(tmp_path):
    cfg = load_config(None, ["training.seed=3", 'schedule.name="wsd"'])
    path = tmp_path / "c.toml"
    path.write_text(config_to_toml(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize("override, message", [
    ("training.stepz=3", "did you mean 'training.steps'"),
    ("trainin.steps=3", "did you mean 'training'"),
    ("training.steps=abc", "training.steps: expected an integer"),
    ("training.precision=fp8", "training.precision: 'fp8' is not one of"),
    ("training.steps=0", "training.steps must be at least 1"),
    ("model.n_kv_heads=3", "model.n_heads (4) must be a multiple of model.n_kv_heads (3)"),
    ('model.flavor="llama9"', "unknown flavour 'llama9'"),
    ("data.seq_len=100000", "larger than the model's context"),
    ("training.compile=maybe", "expected true or false"),
    ("notakey", "expected section.key=value"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [override])


def test_bad_toml_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[training\nsteps = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_toml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        read_toml(tmp_path / "missing.toml")


def test_overrides_parse_toml_values():
    raw = apply_overrides({}, ["optimizer.lr=1e-4", "training.compile=true", 'data.path="x y"', "data.path2=abc"])
    assert raw["optimizer"]["lr"] == 1e-4 and raw["training"]["compile"] is True
    assert raw["data"]["path"] == "x y" and raw["data"]["path2"] == "abc"


def test_every_key_is_documented():
    rows = [row for name, cls in SECTIONS.items() for row in describe(cls, name)]
    assert len(rows) > 40
    for key, tp, _default, doc in rows:
        assert doc, f"{key} has no documentation"
        assert tp in {"int", "float", "str", "bool", "list[str]"}, (key, tp)
    for stable in ("training.steps", "training.seed", "checkpoint.interval", "metrics.interval"):
        assert stable in {row[0] for row in rows}


def test_published_flavour_sizes():
    # Parameter counts of the released checkpoints (billions, from their model cards / safetensors index).
    published = {"llama3-8b": 8.03, "llama3-70b": 70.55, "llama3-405b": 405.85, "qwen2.5-7b": 7.62, "llama3.2-1b": 1.24,
                 "mistral-7b": 7.25}
    for name, billions in published.items():
        assert flavor_config(name).num_params() / 1e9 == pytest.approx(billions, abs=0.01), name


def test_unknown_section_rejected():
    with pytest.raises(ConfigError, match="unknown config section"):
        build_config({"trainer": {"steps": 1}})
