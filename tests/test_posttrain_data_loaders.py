"""Post-training data (meshlm/data/posttrain/packing.py, loaders.py): best-fit packing, the packed sequence
layout, packed == padded loss and gradients, and the SFT / preference / prompt loaders (order, ranks, resume,
refusing other data). Fast, single process."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from meshlm.data.posttrain import (
    PreferenceLoader,
    PromptLoader,
    RowEncoder,
    SFTLoader,
    build_sequence,
    encode_pairs,
    encode_prompts,
    pad_id_for,
    plan_packing,
    read_rows,
)
from meshlm.data.posttrain.templates import Encoded
from meshlm.errors import DataError
from meshlm.objectives.base import IGNORE_INDEX
from tests.posttrain_data_common import write_jsonl, tok  # noqa: F401 (fixtures)


# --- packing --------------------------------------------------------------------------------------------------------
def _examples(n: int, seed: int = 0) -> list[Encoded]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 15, (1,), generator=g))
        prompt = int(torch.randint(1, length - 1, (1,), generator=g))
        ids = torch.randint(7, 50, (length,), generator=g).tolist()
        out.append(Encoded(ids, [False] * prompt + [True] * (length - prompt)))
    return out


def test_packing_places_every_row_once_within_seq_len():
    lengths = [len(e.ids) for e in _examples(200)]
    bins = plan_packing(lengths, 32)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 32 for b in bins)
    assert len(bins) <= -(-sum(lengths) // 32) + 3  # near the lower bound on sequences
    assert plan_packing(lengths, 32) == bins
    with pytest.raises(DataError, match="does not fit seq_len"):
        plan_packing([5, 40], 32)


def test_packed_sequence_layout():
    ex = _examples(3, seed=1)
    seq = build_sequence(ex, [0, 1, 2], 48, pad_id=0)
    start = 0
    for doc, e in enumerate(ex):
        n = len(e.ids)
        assert seq["input_ids"][start : start + n].tolist() == e.ids
        assert seq["position_ids"][start : start + n].tolist() == list(range(n))
        assert (seq["document_ids"][start : start + n] == doc).all()
        labels = seq["labels"][start : start + n].tolist()
        assert labels[-1] == IGNORE_INDEX  # never the next row's first token
        assert labels[:-1] == [t if m else IGNORE_INDEX for t, m in zip(e.ids[1:], e.loss_mask[1:])]
        start += n
    assert (seq["document_ids"][start:] == 3).all() and (seq["labels"][start:] == IGNORE_INDEX).all()
    assert seq["position_ids"][start:].tolist() == list(range(48 - start))


class _DocAttentionLM(torch.nn.Module):
    """A one-layer causal LM that attends within a document and embeds position ids: the contract a packed batch
    needs from the model."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = torch.nn.Embedding(64, 16), torch.nn.Embedding(64, 16)
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 64)

    def forward(self, input_ids, position_ids, document_ids):
        x = self.tok(input_ids) + self.pos(position_ids)  # (B, T, D)
        q, k, v = self.qkv(x).chunk(3, -1)
        T = input_ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        same_doc = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & same_doc)
        return self.out(x + y)  # (B, T, V)


def _loss_sum_and_grads(model, batch):
    model.zero_grad()
    logits = model(batch["input_ids"], batch["position_ids"], batch["document_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_packed_and_padded_batches_give_the_same_loss_and_gradients():
    ex = _examples(12, seed=2)
    model = _DocAttentionLM()
    packed = SFTLoader(ex, 32, 1, pad_id=0, packing=True, shuffle=False)
    padded = SFTLoader(ex, 32, 1, pad_id=0, packing=False, shuffle=False)
    assert packed.num_sequences < padded.num_sequences == 12
    batch_p = _stack([packed.next_batch() for _ in range(packed.num_sequences)])
    batch_u = _stack([padded.next_batch() for _ in range(padded.num_sequences)])
    assert int((batch_p["labels"] != IGNORE_INDEX).sum()) == int((batch_u["labels"] != IGNORE_INDEX).sum())
    loss_p, grads_p = _loss_sum_and_grads(model, batch_p)
    loss_u, grads_u = _loss_sum_and_grads(model, batch_u)
    torch.testing.assert_close(loss_p, loss_u, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_p, grads_u):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # fp32 sums in another order


def _stack(batches):
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


# --- loaders --------------------------------------------------------------------------------------------------------
def test_sft_loader_is_deterministic_rank_aware_and_resumable():
    ex = _examples(40, seed=3)
    full = SFTLoader(ex, 24, 4, pad_id=0, seed=5)
    batches = [full.next_batch() for _ in range(6)]  # crosses an epoch boundary
    assert full.num_sequences < 24
    ranks = [SFTLoader(ex, 24, 4, pad_id=0, seed=5, dp_rank=r, dp_size=2) for r in range(2)]
    for b in batches[:3]:
        parts = [rk.next_batch() for rk in ranks]
        for k in b:
            assert torch.equal(b[k], torch.cat([p[k] for p in parts]))
    resumed = SFTLoader(ex, 24, 4, pad_id=0, seed=0, dp_size=4, dp_rank=1)
    resumed.load_state_dict(json.loads(json.dumps(ranks[0].state_dict())))  # saved under dp 2, JSON round trip
    assert torch.equal(resumed.next_batch()["input_ids"], batches[3]["input_ids"][1:2])
    one = SFTLoader(ex, 24, 1, pad_id=0, seed=5)
    epoch = [tuple(one.next_batch()["input_ids"][0].tolist()) for _ in range(one.num_sequences)]
    assert len(set(epoch)) == one.num_sequences  # each sequence once per epoch


def test_loader_state_refuses_other_data():
    a = SFTLoader(_examples(20, seed=4), 24, 2, pad_id=0)
    b = SFTLoader(_examples(20, seed=5), 24, 2, pad_id=0)
    with pytest.raises(DataError, match="changed since the checkpoint"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(DataError, match="seq_len"):
        SFTLoader(_examples(20, seed=4), 30, 2, pad_id=0).load_state_dict(a.state_dict())
    with pytest.raises(DataError, match="not divisible"):
        SFTLoader(_examples(20, seed=4), 24, 3, pad_id=0, dp_size=2)
    with pytest.raises(DataError, match="every row was dropped"):
        SFTLoader([], 24, 2, pad_id=0)


def test_preference_loader_layout(tok, tmp_path):
    rows = read_rows(write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "hello", "chosen": "fine", "rejected": "no, thank you"},
        {"prompt": "how are you?", "chosen": "I am fine", "rejected": "no"}]), objective="dpo")
    pairs, _ = encode_pairs(rows, RowEncoder(tok), max_tokens=16)
    loader = PreferenceLoader(pairs, 16, 2, pad_id=pad_id_for(tok), shuffle=False)
    batch = loader.next_batch()
    T = max(len(e.ids) for p in pairs for e in (p.chosen, p.rejected))  # padded to the longest, not to seq_len
    assert T < 16 and batch["input_ids"].shape == (4, T)
    for row, (pair, side) in enumerate([(pairs[0], "chosen"), (pairs[1], "chosen"),
                                        (pairs[0], "rejected"), (pairs[1], "rejected")]):
        enc = getattr(pair, side)
        n = int(batch["lengths"][row])
        assert n == len(enc.ids) and batch["input_ids"][row, :n].tolist() == enc.ids
        assert batch["attention_mask"][row].tolist() == [True] * n + [False] * (T - n)
        p = int(batch["prompt_lengths"][row])
        assert p == pair.prompt_len
        labels = batch["labels"][row]
        # labels are the response tokens (+eos) predicted from position p-1 on; nothing before, nothing after
        assert (labels[: p - 1] == IGNORE_INDEX).all() and (labels[n - 1 :] == IGNORE_INDEX).all()
        assert labels[p - 1 : n - 1].tolist() == enc.ids[p:]
        assert (batch["document_ids"][row, n:] == 1).all()
    other = PreferenceLoader(pairs, 16, 2, pad_id=pad_id_for(tok), shuffle=False)
    other.load_state_dict(loader.state_dict())
    assert other.samples_consumed == 2


def test_packing_invariance_on_the_debug_llama():
    """The real model (document_ids / position_ids inputs): packed and padded batches, same loss sum and grads."""
    from meshlm.models import build_model, flavor_config

    cfg = flavor_config("debug")
    model = build_model(cfg, "cpu", seed=0)
    ex = [Encoded([i % 2000 + 7 for i in e.ids], e.loss_mask) for e in _examples(10, seed=6)]
    results = []
    for packing in (True, False):
        loader = SFTLoader(ex, 32, 1, pad_id=0, packing=packing, shuffle=False)
        batch = _stack([loader.next_batch() for _ in range(loader.num_sequences)])
        model.zero_grad()
        logits = model(batch["input_ids"], position_ids=batch["position_ids"], document_ids=batch["document_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_p, grads_p), (loss_u, grads_u) = results
    torch.testing.assert_close(loss_p, loss_u, rtol=1e-6, atol=1e-5)
    for a, b in zip(grads_p, grads_u):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # fp32 sums over rows in another order


def test_prompt_loader_keeps_extras_and_resumes(tok, tmp_path):
    rows = read_rows(write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"question {i}", "answer": i} for i in range(6)]),
                     objective="grpo")
    prompts, _ = encode_prompts(rows, RowEncoder(tok), max_tokens=16)
    loader = PromptLoader(prompts, 4, extras=[r.extra for r in rows], max_prompt_tokens=16, seed=1)
    first, second = loader.next_batch(), loader.next_batch()
    for batch in (first, second):
        for i, ids, extra in zip(batch["index"], batch["prompt_ids"], batch["extra"]):
            assert ids == prompts[i] and extra == {"answer": i}
    assert sorted(first["index"] + second["index"][:2]) == list(range(6))  # the first epoch, in some order
    rank1 = PromptLoader(prompts, 4, extras=[r.extra for r in rows], max_prompt_tokens=16, seed=1, dp_rank=1,
                         dp_size=2)
    rank1.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    third = PromptLoader(prompts, 4, extras=[r.extra for r in rows], max_prompt_tokens=16, seed=1)
    third.load_state_dict(loader.state_dict())
    assert rank1.next_batch()["index"] == third.next_batch()["index"][2:]
