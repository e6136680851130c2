"""Post-training loss formulas (meshlm/objectives/losses.py): against independent element-wise computations and,
where `trl` is installed, against TRL's own loss code (called unbound on a stand-in for the trainer)."""

from __future__ import annotations

import collections
import math
import os
import statistics
from types import SimpleNamespace

import pytest
import torch

from meshlm.objectives import losses as L
from meshlm.objectives.base import IGNORE_INDEX

# fp32 element-wise formulas vs fp64 Python math: a few ulps of fp32 on values of order 1-10.
TOL = dict(rtol=1e-5, atol=1e-5)
APPROX = dict(rel=1e-5, abs=1e-5)


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x > 0 else x - math.log1p(math.exp(x))


@pytest.fixture
def pair_logps():
    g = torch.Generator().manual_seed(0)
    n = 6
    pc, pr, rc, rr = (-(torch.rand(n, generator=g) * 20 + 1) for _ in range(4))
    nc = torch.randint(1, 12, (n,), generator=g)
    nr = torch.randint(1, 12, (n,), generator=g)
    return pc, pr, rc, rr, nc, nr


def _trl_module(name: str):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl")
    import importlib

    return importlib.import_module(name)


# --- log-probabilities ----------------------------------------------------------------------------------------
def test_token_and_sequence_logps_match_a_direct_log_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 11, generator=g) * 3
    labels = torch.randint(0, 11, (3, 7), generator=g)
    labels[0, :3] = IGNORE_INDEX
    labels[2, :] = IGNORE_INDEX
    got = L.sequence_logps(logits, labels)
    for b in range(3):
        expect = sum(torch.log_softmax(logits[b, t].double(), -1)[labels[b, t]].item()
                     for t in range(7) if labels[b, t] != IGNORE_INDEX)
        assert got.sum[b].item() == pytest.approx(expect, abs=1e-4)
    assert got.count.tolist() == [4, 7, 0]
    assert got.mean[2].item() == 0.0  # no loss token: mean is 0, not NaN
    assert torch.allclose(got.mean[:2], got.sum[:2] / got.count[:2])


def test_sequence_logps_match_trl_get_batch_logps():
    cpo = _trl_module("trl.experimental.cpo.cpo_trainer")
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 9, 13, generator=g)
    labels = torch.randint(0, 13, (4, 9), generator=g)
    labels[:, :4] = IGNORE_INDEX
    # TRL shifts inside (labels[:, 1:] vs logits[:, :-1]); meshlm's labels are already shifted.
    trl_labels = torch.cat([torch.full((4, 1), IGNORE_INDEX), labels], dim=1)
    trl_logits = torch.cat([logits, torch.zeros(4, 1, 13)], dim=1)
    ours = L.sequence_logps(logits, labels)
    for average, value in ((False, ours.sum), (True, ours.mean)):
        ref = cpo.CPOTrainer.get_batch_logps(trl_logits, trl_labels, average_log_prob=average)
        torch.testing.assert_close(value, ref, **TOL)


# --- preference losses vs independent element-wise formulas ------------------------------------------------
@pytest.mark.parametrize("beta,eps", [(0.1, 0.0), (0.5, 0.0), (0.1, 0.2)])
def test_dpo_and_cdpo_match_the_formula(pair_logps, beta, eps):
    pc, pr, rc, rr, *_ = pair_logps
    out = L.dpo_loss(pc, pr, rc, rr, beta, eps)
    for i in range(len(pc)):
        delta = (pc[i] - rc[i] - (pr[i] - rr[i])).item()
        expect = -(1 - eps) * _logsig(beta * delta) - eps * _logsig(-beta * delta)
        assert out.losses[i].item() == pytest.approx(expect, **APPROX)
        assert out.chosen_rewards[i].item() == pytest.approx(beta * (pc[i] - rc[i]).item(), **APPROX)


def test_dpo_is_log2_at_zero_margin_and_falls_as_the_margin_grows():
    z = torch.zeros(3)
    assert torch.allclose(L.dpo_loss(z, z, z, z).losses, torch.full((3,), math.log(2)))
    margins = torch.tensor([-2.0, 0.0, 2.0, 5.0])
    losses = L.dpo_loss(margins, torch.zeros(4), torch.zeros(4), torch.zeros(4)).losses
    assert (losses[1:] < losses[:-1]).all()


def test_ipo_normalised_and_summed(pair_logps):
    pc, pr, rc, rr, nc, nr = pair_logps
    beta = 0.3
    norm = L.ipo_loss(pc, pr, rc, rr, nc, nr, beta)
    summed = L.ipo_loss(pc, pr, rc, rr, nc, nr, beta, normalize=False)
    for i in range(len(pc)):
        dc, dr = (pc[i] - rc[i]).item(), (pr[i] - rr[i]).item()
        assert norm.losses[i].item() == pytest.approx((dc / nc[i].item() - dr / nr[i].item() - 1 / (2 * beta)) ** 2,
                                                      rel=1e-5)
        assert summed.losses[i].item() == pytest.approx((dc - dr - 1 / (2 * beta)) ** 2, rel=1e-5)


def test_hinge_simpo_orpo_match_the_formulas(pair_logps):
    pc, pr, rc, rr, nc, nr = pair_logps
    hinge = L.hinge_loss(pc, pr, rc, rr, beta=0.1)
    mc, mr = pc / nc, pr / nr
    simpo = L.simpo_loss(mc, mr, beta=2.0, gamma=0.7)
    orpo = L.orpo_loss(mc, mr, lam=0.25)
    for i in range(len(pc)):
        delta = (pc[i] - rc[i] - (pr[i] - rr[i])).item()
        assert hinge.losses[i].item() == pytest.approx(max(0.0, 1 - 0.1 * delta), abs=1e-5)
        a, b = mc[i].item(), mr[i].item()
        assert simpo.losses[i].item() == pytest.approx(-_logsig(2.0 * (a - b) - 0.7), **APPROX)
        log_odds = (a - math.log(1 - math.exp(a))) - (b - math.log(1 - math.exp(b)))
        assert orpo.losses[i].item() == pytest.approx(-a - 0.25 * _logsig(log_odds), **APPROX)


def test_orpo_is_finite_and_differentiable_near_probability_one():
    chosen = torch.tensor([-1e-9, -1e-3, -30.0], requires_grad=True)
    out = L.orpo_loss(chosen, torch.tensor([-0.5, -1e-9, -1e-3]))
    out.losses.sum().backward()
    assert torch.isfinite(out.losses).all() and torch.isfinite(chosen.grad).all()


def test_preference_loss_dispatch_from_logits_equals_the_direct_calls():
    g = torch.Generator().manual_seed(3)
    logits, ref_logits = torch.randn(4, 6, 10, generator=g), torch.randn(4, 6, 10, generator=g)
    labels = torch.randint(0, 10, (4, 6), generator=g)
    labels[:, :2] = IGNORE_INDEX
    labels[1, 5] = IGNORE_INDEX  # chosen and rejected of different lengths
    pol, ref = L.sequence_logps(logits, labels), L.sequence_logps(ref_logits, labels)
    (pc, pr), (rc, rr) = pol.sum.chunk(2), ref.sum.chunk(2)
    nc, nr = pol.count.chunk(2)
    mc, mr = pol.mean.chunk(2)
    cases = {"sigmoid": L.dpo_loss(pc, pr, rc, rr, 0.1, 0.1), "ipo": L.ipo_loss(pc, pr, rc, rr, nc, nr, 0.1),
             "hinge": L.hinge_loss(pc, pr, rc, rr, 0.1), "simpo": L.simpo_loss(mc, mr, 2.0, 0.5, 0.1),
             "orpo": L.orpo_loss(mc, mr, 0.1)}
    for loss_type, direct in cases.items():
        got = L.preference_loss(loss_type, pol, ref, label_smoothing=0.1)
        torch.testing.assert_close(got.losses, direct.losses)
    with pytest.raises(ValueError, match="reference"):
        L.preference_loss("sigmoid", pol, None)
    with pytest.raises(ValueError, match="loss_type"):
        L.preference_loss("dpo", pol, ref)


def test_preference_metrics_use_trl_names():
    out = L.PreferenceLoss(torch.zeros(3), torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 1.0, 1.0]))
    m = {name: values.mean().item() for name, values in L.preference_metrics(out).items()}
    assert m == pytest.approx({"rewards/chosen": 1.0, "rewards/rejected": 2 / 3, "rewards/margins": 1 / 3,
                               "rewards/accuracies": 2 / 3})


# --- against TRL's loss code ------------------------------------------------------------------------------------
def _cpo_self(loss_type: str, beta: float, eps: float = 0.0, gamma: float = 0.5):
    return SimpleNamespace(alpha=0.0, loss_type=loss_type, beta=beta, label_smoothing=eps, simpo_gamma=gamma,
                           accelerator=SimpleNamespace(device=torch.device("cpu")))


@pytest.mark.parametrize("loss_type,eps", [("sigmoid", 0.0), ("sigmoid", 0.15), ("hinge", 0.0), ("ipo", 0.0)])
def test_dpo_family_matches_trl(pair_logps, loss_type, eps):
    """TRL's CPO loss is DPO's with the log-ratios in place of the log-probs; IPO there uses the summed form."""
    cpo = _trl_module("trl.experimental.cpo.cpo_trainer")
    pc, pr, rc, rr, nc, nr = pair_logps
    trl_losses, trl_chosen, _ = cpo.CPOTrainer.cpo_loss(_cpo_self(loss_type, 0.2, eps), pc - rc, pr - rr)
    if loss_type == "sigmoid":
        ours = L.dpo_loss(pc, pr, rc, rr, 0.2, eps)
    elif loss_type == "hinge":
        ours = L.hinge_loss(pc, pr, rc, rr, 0.2)
    else:
        ours = L.ipo_loss(pc, pr, rc, rr, nc, nr, 0.2, normalize=False)
    torch.testing.assert_close(ours.losses, trl_losses, **TOL)
    torch.testing.assert_close(ours.chosen_rewards, trl_chosen, **TOL)


def test_simpo_matches_trl(pair_logps):
    cpo = _trl_module("trl.experimental.cpo.cpo_trainer")
    pc, pr, _, _, nc, nr = pair_logps
    trl_losses, trl_chosen, trl_rejected = cpo.CPOTrainer.cpo_loss(_cpo_self("simpo", 2.5, 0.1, 1.2), pc / nc, pr / nr)
    ours = L.simpo_loss(pc / nc, pr / nr, beta=2.5, gamma=1.2, label_smoothing=0.1)
    torch.testing.assert_close(ours.losses, trl_losses, **TOL)
    torch.testing.assert_close(ours.rejected_rewards, trl_rejected, **TOL)


def test_orpo_odds_ratio_term_matches_trl(pair_logps):
    orpo = _trl_module("trl.experimental.orpo.orpo_trainer")
    pc, pr, _, _, nc, nr = pair_logps
    trl_self = SimpleNamespace(beta=0.1, accelerator=SimpleNamespace(device=torch.device("cpu")))
    trl_ratio_losses, *_ = orpo.ORPOTrainer.odds_ratio_loss(trl_self, pc / nc, pr / nr)
    ours = L.orpo_loss(pc / nc, pr / nr, lam=0.1)
    # TRL returns λ·log σ(log odds) and subtracts its mean from the NLL; ours is per pair NLL − that term.
    torch.testing.assert_close(ours.losses, -(pc / nc) - trl_ratio_losses, **TOL)


def test_bradley_terry_matches_trl_reward_trainer():
    reward_trainer = _trl_module("trl.trainer.reward_trainer")
    g = torch.Generator().manual_seed(4)
    chosen, rejected, margin = torch.randn(5, generator=g), torch.randn(5, generator=g), torch.rand(5, generator=g)
    logits = torch.cat([chosen, rejected]).unsqueeze(-1)  # (2N, 1), chosen first as TRL's collator does
    model = lambda **kw: SimpleNamespace(logits=logits)  # noqa: E731
    acc = SimpleNamespace(gather_for_metrics=lambda x: x, gather=lambda x: x)
    fake = SimpleNamespace(model=SimpleNamespace(training=False), args=SimpleNamespace(center_rewards_coefficient=0.01),
                           accelerator=acc, _metrics={"eval": collections.defaultdict(list)},
                           _total_train_tokens=0, _tp_size=1)
    trl_loss = reward_trainer.RewardTrainer.compute_loss(fake, model, {"margin": margin})
    ours = L.bradley_terry_loss(chosen, rejected, margin, center_coef=0.01).mean()
    torch.testing.assert_close(ours, trl_loss, **TOL)


# --- reward model -------------------------------------------------------------------------------------------------
def test_bradley_terry_formula_and_last_token_scores():
    values = torch.arange(12.0).view(2, 6)
    assert L.last_token_scores(values, torch.tensor([3, 6])).tolist() == [2.0, 11.0]  # not the padding
    c, r = torch.tensor([1.0, -0.5]), torch.tensor([0.0, 0.5])
    got = L.bradley_terry_loss(c, r, margin=0.3, center_coef=0.1)
    for i in range(2):
        expect = -_logsig(c[i].item() - r[i].item() - 0.3) + 0.1 * (c[i].item() + r[i].item()) ** 2
        assert got[i].item() == pytest.approx(expect, **APPROX)


# --- PPO / GRPO ---------------------------------------------------------------------------------------------------
def _rollout(seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 8
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 2:8] = True  # prompt of 2, response to the end
    mask[1, 3:6] = True  # right padding after the response
    mask[2, 1:2] = True  # a one-token response
    return (torch.randn(B, T, generator=g), torch.randn(B, T, generator=g), mask)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0)])
def test_gae_equals_the_discounted_sum_of_td_errors(gamma, lam):
    rewards, values, mask = _rollout()
    adv, ret = L.gae(rewards, values, mask, gamma, lam)
    for b in range(3):
        idx = mask[b].nonzero().flatten().tolist()
        v = [values[b, t].item() for t in idx] + [0.0]  # V after the last response token is 0
        deltas = [rewards[b, t].item() + gamma * v[k + 1] - v[k] for k, t in enumerate(idx)]
        for k, t in enumerate(idx):
            expect = sum((gamma * lam) ** j * deltas[k + j] for j in range(len(idx) - k))
            assert adv[b, t].item() == pytest.approx(expect, abs=1e-5)
            assert ret[b, t].item() == pytest.approx(expect + v[k], abs=1e-5)
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


def test_whiten_over_the_mask():
    x, _, mask = _rollout(6)
    w = L.whiten(x * 3 + 2, mask)
    vals = w[mask].double()
    assert vals.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert vals.std().item() == pytest.approx(1.0, abs=1e-5)  # unbiased
    kept = L.whiten(x * 3 + 2, mask, shift_mean=False)[mask]
    assert kept.mean().item() == pytest.approx((x * 3 + 2)[mask].mean().item(), abs=1e-5)
    assert (w[~mask] == 0).all()


def test_kl_estimators_are_unbiased_where_claimed():
    # Categorical q (policy) and p (reference): sample from q, average the estimators, compare to KL(q||p).
    q = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p = torch.tensor([0.25, 0.25, 0.25, 0.25])
    true_kl = (q * (q / p).log()).sum().item()
    samples = torch.multinomial(q, 200_000, replacement=True, generator=torch.Generator().manual_seed(7))
    logq, logp = q.log()[samples], p.log()[samples]
    for est in ("k1", "k3"):
        assert L.kl_penalty(logq, logp, est).mean().item() == pytest.approx(true_kl, abs=0.01)
    assert (L.kl_penalty(logq, logp, "k3") >= 0).all()
    assert torch.allclose(L.kl_penalty(logq, logp, "k2"), 0.5 * (logq - logp) ** 2)
    with pytest.raises(ValueError):
        L.kl_penalty(logq, logp, "k4")


def test_rlhf_rewards_put_the_score_on_the_last_response_token():
    logps, ref, mask = _rollout(8)
    scores = torch.tensor([1.0, 2.0, -1.0])
    r = L.rlhf_rewards(scores, logps, ref, mask, kl_coef=0.1)
    for b, last in enumerate([7, 5, 1]):
        for t in range(8):
            expect = -0.1 * (logps[b, t] - ref[b, t]).item() if mask[b, t] else 0.0
            expect += scores[b].item() if t == last else 0.0
            assert r[b, t].item() == pytest.approx(expect, abs=1e-6)
    mask[2] = False  # an empty response: no score anywhere
    assert (L.rlhf_rewards(scores, logps, ref, mask)[2] == 0).all()


def test_clipped_policy_loss_per_token_and_gradients():
    old = torch.zeros(1, 4)
    logps = torch.tensor([[0.1, 0.5, -0.5, 0.0]], requires_grad=True)  # ratios 1.105, 1.649, 0.607, 1
    adv = torch.tensor([[1.0, 1.0, -1.0, 2.0]])
    mask = torch.tensor([[True, True, True, False]])
    out = L.clipped_policy_loss(logps, old, adv, mask, clip_eps=0.2)
    ratio = logps.detach().exp()
    expect = [max(-a * r, -a * min(max(r, 0.8), 1.2)) for a, r in zip(adv[0].tolist(), ratio[0].tolist())]
    expect[3] = 0.0
    torch.testing.assert_close(out.losses[0], torch.tensor(expect), **TOL)
    out.losses.sum().backward()
    # Token 1 (ratio above 1+ε with A > 0) and token 2 (below 1−ε with A < 0) are clipped: no gradient.
    assert logps.grad[0, 1] == 0 and logps.grad[0, 2] == 0 and logps.grad[0, 0] != 0
    assert out.clip_fraction.item() == pytest.approx(2 / 3)
    assert out.approx_kl.item() == pytest.approx((0.01 + 0.25 + 0.25) / 2 / 3, rel=1e-5)


def test_clipped_value_loss():
    values = torch.tensor([[1.0, 2.0, 0.0]])
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 3.0, 1.0]])
    mask = torch.tensor([[True, True, False]])
    losses, frac = L.clipped_value_loss(values, old, returns, mask, clip_range=0.2)
    # token 0: unclipped (1-0)^2=1, clipped (0.7-0)^2=0.49 -> 0.5; token 1: 1 vs (0.7-3)^2=5.29 -> 2.645
    torch.testing.assert_close(losses, torch.tensor([[0.5, 2.645, 0.0]]), **TOL)
    assert frac.item() == pytest.approx(0.5)


def test_group_advantages_match_per_group_statistics():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 5.0])
    adv = L.group_advantages(rewards, group_size=4)
    for g in range(2):
        group = rewards[g * 4 : g * 4 + 4].tolist()
        mean, std = statistics.mean(group), statistics.stdev(group)
        for i in range(4):
            assert adv[g * 4 + i].item() == pytest.approx((group[i] - mean) / (std + 1e-4), abs=1e-5)
    same = L.group_advantages(torch.full((4,), 2.0), group_size=4)
    assert (same == 0).all()  # identical rewards: no signal, no NaN
    with pytest.raises(ValueError):
        L.group_advantages(rewards, group_size=3)


def test_grpo_adds_k3_kl_to_the_clipped_surrogate():
    logps, ref, mask = _rollout(9)
    old = logps.detach() + 0.05
    adv = torch.tensor([1.0, -0.5, 2.0])
    plain = L.grpo_token_losses(logps, old, adv, mask)
    with_kl = L.grpo_token_losses(logps, old, adv, mask, ref_logps=ref, kl_coef=0.04)
    torch.testing.assert_close(with_kl.losses - plain.losses, 0.04 * L.kl_penalty(logps, ref, "k3") * mask)
    torch.testing.assert_close(plain.losses, L.clipped_policy_loss(logps, old, adv[:, None].expand(3, 8), mask).losses)


def test_entropy_from_logits():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(10))
    expect = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(L.entropy_from_logits(logits), expect, **TOL)
