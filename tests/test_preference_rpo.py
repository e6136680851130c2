"""objective.rpo_alpha: the DPO family's pair loss plus α times the chosen response's NLL per token (RPO)."""

from __future__ import annotations

import pytest
import torch

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.data.posttrain import PreferenceLoader, RowEncoder, encode_pairs, parse_row
from meshlm.errors import ConfigError
from meshlm.objectives.base import pairs_to_rows
from meshlm.objectives.losses import split_pairs
from meshlm.objectives.preference import PreferenceObjective, pair_logps
from meshlm.tokenizer import MeshTokenizer
from meshlm.train.data_setup import PairMajor


@pytest.fixture(scope="module")
def batch():
    tok = MeshTokenizer.train(["kind words and rude words", "say something about apples and pears"], 300)
    rows = [parse_row({"prompt": f"say {i}", "chosen": " kind" * (1 + 2 * i), "rejected": " rude" * (i + 1)},
                      f"x:{i}") for i in range(4)]
    encoded, _ = encode_pairs(rows, RowEncoder(tok), 48)
    return PairMajor(PreferenceLoader(encoded, 48, 4, pad_id=0, shuffle=False)).next_batch()


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "simpo"])
def test_the_loss_adds_alpha_times_the_chosen_nll_per_token(batch, loss_type):
    from meshlm.models import build_model, flavor_config

    policy = build_model(flavor_config("debug"), "cpu", seed=0)
    reference = build_model(flavor_config("debug"), "cpu", seed=1).eval()
    losses = {}
    for alpha in (0.0, 0.7):
        objective = PreferenceObjective(ObjectiveConfig(loss_type=loss_type, rpo_alpha=alpha))
        objective.reference = reference
        losses[alpha] = objective.loss_sum(policy, batch).detach()
        metrics = objective.metrics()
        assert ("nll/chosen" in metrics) == (alpha > 0)
    with torch.no_grad():  # by hand: the chosen rows' summed log-probs over their response tokens
        logps = pair_logps(policy, pairs_to_rows(batch))
        chosen_sum, _ = split_pairs(logps.sum)
        chosen_count, _ = split_pairs(logps.count)
    nll_per_token = -(chosen_sum / chosen_count)
    assert bool((chosen_count > 1).all()) and len(set(chosen_count.tolist())) > 1  # lengths differ: per token matters
    torch.testing.assert_close(losses[0.7] - losses[0.0], 0.7 * nll_per_token.sum(), rtol=1e-5, atol=1e-5)


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="objective.rpo_alpha must be >= 0"):
        ObjectiveConfig(rpo_alpha=-1.0).validate()
    for loss_type in ("orpo", "kto"):
        with pytest.raises(ConfigError, match=f"does not apply to loss_type '{loss_type}'"):
            ObjectiveConfig(loss_type=loss_type, rpo_alpha=0.5).validate()
    ObjectiveConfig(loss_type="orpo").validate()


def test_the_align_key_reaches_the_dpo_stage():
    from meshlm.safety.align_config import load_align_config

    assert load_align_config(None).dpo.rpo_alpha == 0.0
    assert load_align_config(None, ["dpo.rpo_alpha=1.0"]).dpo.rpo_alpha == 1.0
    with pytest.raises(ConfigError, match="rpo_alpha"):
        load_align_config(None, ["dpo.rpo_alpha=-0.5"])
