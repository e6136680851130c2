"""Pair batches (DPO, reward, KTO) are padded to their longest sequence, not to data.seq_len: the width follows
the batch, and the loss is the one of the same pairs padded to seq_len."""

from __future__ import annotations

import pytest
import torch

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.data.posttrain import PreferenceLoader, RowEncoder, encode_pairs, encode_unpaired, parse_row
from meshlm.objectives.preference import PreferenceObjective
from meshlm.tokenizer import MeshTokenizer
from meshlm.train.data_setup import PairMajor

SEQ_LEN = 64


@pytest.fixture(scope="module")
def pairs():
    tok = MeshTokenizer.train(["kind words and rude words", "say something about apples and pears"], 300)
    rows = [parse_row({"prompt": f"say {i}", "chosen": " kind" * (1 + 3 * i), "rejected": " rude" * (i % 3 + 1)},
                      f"x:{i}") for i in range(6)]
    encoded, _ = encode_pairs(rows, RowEncoder(tok), SEQ_LEN)
    return encoded


@pytest.fixture(scope="module")
def unpaired():
    """KTO's items (row, KL row) of the same rows: a preference row gives a desirable and an undesirable one."""
    tok = MeshTokenizer.train(["kind words and rude words", "say something about apples and pears"], 300)
    rows = [parse_row({"prompt": f"say {i}", "chosen": " kind" * (1 + 3 * i), "rejected": " rude" * (i % 3 + 1)},
                      f"x:{i}") for i in range(3)]
    encoded, _ = encode_unpaired(rows, RowEncoder(tok), SEQ_LEN)
    return encoded


def test_each_batch_is_as_wide_as_its_longest_sequence(pairs):
    loader = PreferenceLoader(pairs, SEQ_LEN, 2, pad_id=0, shuffle=False)
    widths = []
    for start in range(0, len(pairs), 2):
        batch = loader.next_batch()
        longest = max(len(e.ids) for p in pairs[start:start + 2] for e in (p.chosen, p.rejected))
        assert batch["input_ids"].shape == (4, longest) == batch["labels"].shape == batch["attention_mask"].shape
        assert int(batch["lengths"].max()) == longest
        widths.append(longest)
    assert len(set(widths)) == 3 and max(widths) < SEQ_LEN  # the rows grow: three widths, all below seq_len
    rounded = PreferenceLoader(pairs, SEQ_LEN, 2, pad_id=0, shuffle=False, pad_multiple=8)  # sequence parallel
    assert rounded.next_batch()["input_ids"].shape[1] == -(-widths[0] // 8) * 8
    with pytest.raises(ValueError, match="pad_multiple"):
        PreferenceLoader(pairs, SEQ_LEN, 2, pad_id=0, pad_multiple=0)


@pytest.mark.parametrize("loss_type", ["sigmoid", "simpo", "reward", "kto"])
def test_loss_equals_the_loss_padded_to_seq_len(pairs, unpaired, loss_type):
    import contextlib

    from meshlm.models import build_model, flavor_config
    from meshlm.objectives.kto import KTOObjective
    from meshlm.objectives.reward import RewardObjective

    policy = build_model(flavor_config("debug"), "cpu", seed=0)
    if loss_type == "reward":
        objective = RewardObjective(ObjectiveConfig())
        objective.adapt_model(policy)  # the score head
    else:
        kind = KTOObjective if loss_type == "kto" else PreferenceObjective
        objective = kind(ObjectiveConfig(**({} if loss_type == "kto" else {"loss_type": loss_type}), beta=0.5))
        objective.reference = build_model(flavor_config("debug"), "cpu", seed=1).eval()  # real margins
        objective.chunk, objective.autocast = 64, contextlib.nullcontext  # what setup() sets, for z0
        objective.engine = type("OneRank", (), {"dp_sum": staticmethod(lambda t: t)})()
    items = unpaired if loss_type == "kto" else pairs
    tight = PairMajor(PreferenceLoader(items, SEQ_LEN, 6, pad_id=0, shuffle=False)).next_batch()
    wide = PairMajor(PreferenceLoader(items, SEQ_LEN, 6, pad_id=0, shuffle=False, pad_multiple=SEQ_LEN)).next_batch()
    assert wide["input_ids"].shape[-1] == SEQ_LEN > tight["input_ids"].shape[-1]  # the old layout, for reference
    losses = []
    for batch in (tight, wide):
        policy.zero_grad()
        loss = objective.loss_sum(policy, batch)
        loss.backward()
        losses.append((loss.detach(), policy.output.weight.grad.clone()))
    # the same sums over the same real tokens; only the matmuls' shapes differ (fp32 rounding)
    torch.testing.assert_close(losses[0][0], losses[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(losses[0][1], losses[1][1], rtol=1e-4, atol=1e-6)
