"""The family catalog (meshlm/models/families/) end to end, over every family it names (not a hand-kept list):
the fast decode path serves exactly the families that declare a packed block, any other decodes on its plain
forward, and either way decoding gives the tokens a full forward (no cache) gives; a checkpoint records its
family and head; an unknown family is a one-line error naming the known ones."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from meshlm.errors import ConfigError
from meshlm.generate import generate
from meshlm.generate.decode import FastForward, fast_forward
from meshlm.models import build_model, flavor_config
from meshlm.models.families import FAMILIES, family_spec, supports_packed

# fp32; the packed path sums in other groupings (tests/test_decode.py): 1e-4 absolute leaves room.
ATOL = 1e-4


def tiny(family: str, local_rope: bool):
    """A tiny random model of ``family`` (its flags on the debug shape) with a short window on some layers (with
    ``local_rope`` a RoPE base of their own), and its norm weights moved off their start."""
    spec = family_spec(family)
    cfg = dataclasses.replace(flavor_config("debug"), family=family, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                              ffn_hidden_dim=64, vocab_size=97, max_seq_len=48, init_std=0.2, sliding_window=5,
                              layer_kinds=["sliding", "global", "sliding"],
                              rope_local_theta=500.0 if local_rope else 0.0,
                              **(spec.flags or {}))
    model = build_model(cfg, "cpu", seed=0).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.linspace(-0.2, 0.2, p.shape[0]))
    return model


@pytest.mark.parametrize("local_rope", [False, True])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoding_equals_the_full_forward_on_the_path_the_family_declares(family, local_rope):
    model = tiny(family, local_rope)
    fast = fast_forward(model)
    # The packed block serves a family that declares one (every family today: Gemma 3's per-kind RoPE included).
    expected = family_spec(family).packed_decode
    assert isinstance(fast, FastForward) == expected == supports_packed(model.cfg)
    prompt = [5, 17, 3, 42, 8, 1, 30]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):  # greedy without a cache: the whole sequence through the plain forward each time
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
        # KV-cache steps on whichever path serves the family: the logits of the full forward, step by step
        cache = model.new_cache(1, 24)
        step = fast if isinstance(fast, FastForward) else (lambda t, **kw: model(t, **kw)[:, -1:])
        got = step(torch.tensor([prompt]), cache=cache, start_pos=0)
        full = model(torch.tensor([ids]))  # (1, 19, V)
        for pos in range(len(prompt), len(ids)):
            torch.testing.assert_close(got[0, -1], full[0, pos - 1], atol=ATOL, rtol=0)
            got = step(torch.tensor([[ids[pos]]]), cache=cache, start_pos=pos)
    assert generate(model, prompt, 12, greedy=True, eos_id=None) == ids[len(prompt):]


def test_unknown_family_is_one_line_naming_the_known_ones():
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(flavor_config("debug"), family="mamba").validate()
    assert str(err.value) == f"model.family: unknown model family 'mamba'; known: {', '.join(FAMILIES)}"
