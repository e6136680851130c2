"""Loss formulas for post-training, as pure functions of log-probabilities, rewards and values.

Nothing here runs a model or touches a process group: objectives compute log-probs with a forward pass and call
these. Per-example (per pair, per token) losses are returned unreduced so that an objective can sum them and
let the trainer divide by the global count (see objectives/base.py). Conventions:

- ``labels`` are already shifted (``labels[:, t]`` is the target of position t, as the loaders produce them)
  and IGNORE_INDEX (-100) marks positions outside the loss.
- A *pair* batch puts the N chosen sequences first and their N rejected ones after (PreferenceLoader).
- Log-ratios: ``Δ = [log πθ(y⁺|x) − log πref(y⁺|x)] − [log πθ(y⁻|x) − log πref(y⁻|x)]``, log-probs summed over
  the response tokens (its eos included).

Definitions and defaults (docs/post-training.md has the table):

- DPO, ``sigmoid`` (Rafailov et al. 2023, arXiv 2305.18290): ``−log σ(βΔ)``, β = 0.1. With label smoothing ε,
  conservative DPO (cDPO, Mitchell 2023): ``−(1−ε)·log σ(βΔ) − ε·log σ(−βΔ)``.
- IPO (Azar et al. 2023, arXiv 2310.12036, eq. 17): ``(Δ − 1/(2β))²``. As TRL does (confirmed with the
  authors), each side's log-ratio is divided by its token count unless ``ipo_normalize=False`` (the paper's sums).
- hinge (SLiC, Zhao et al. 2023, arXiv 2305.10425): ``max(0, 1 − βΔ)``.
- SimPO (Meng et al. 2024, arXiv 2405.14734), reference-free: ``−log σ(β·(ℓ̄⁺ − ℓ̄⁻) − γ)``, ℓ̄ the mean token
  log-prob of the policy; β = 2.0, γ = ``simpo_gamma`` = 0.5 (TRL's default); label smoothing as in cDPO.
- ORPO (Hong et al. 2024, arXiv 2403.07691): ``−ℓ̄⁺ − λ·log σ(log odds(y⁺) − log odds(y⁻))`` with
  ``log odds(y) = ℓ̄ − log(1 − exp ℓ̄)``, reference-free, λ = β = 0.1. The NLL term is per pair here (TRL averages
  it over the batch's chosen tokens).
- KTO (Ethayarajh et al. 2024, arXiv 2402.01306, eq. 7; TRL's KTOTrainer), unpaired: with r = log πθ(y|x) −
  log πref(y|x) and the reference point z₀ = max(0, mean over mismatched pairs (x, y') of log πθ(y'|x) −
  log πref(y'|x)), detached: desirable ``λ_D·(1 − σ(β(r − z₀)))``, undesirable ``λ_U·(1 − σ(β(z₀ − r)))``;
  β = 0.1, λ_D = λ_U = 1.
- Rewards logged under TRL's names: β·(log πθ − log πref) for DPO/IPO/hinge, β·ℓ̄ for SimPO and ORPO.
- Bradley–Terry reward model (Ouyang et al. 2022; TRL's RewardTrainer): ``−log σ(r⁺ − r⁻ − m) + c·(r⁺ + r⁻)²``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshlm.config.posttrain import DEFAULT_BETA, LOSS_TYPES
from meshlm.objectives.base import IGNORE_INDEX

PREFERENCE_LOSS_TYPES = tuple(t for t in LOSS_TYPES if t != "kto")  # kto: kto_loss, on unpaired items
REFERENCE_FREE = frozenset({"simpo", "orpo"})
DEFAULT_SIMPO_GAMMA = 0.5


# --- log-probabilities -------------------------------------------------------------------------------------
def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) at every position, 0 where the label is IGNORE_INDEX. (B, T, V), (B, T) -> (B, T) fp32.

    Computed as ``logit[label] − logsumexp(logits)`` in fp32, which never materialises a (B, T, V) log-softmax.
    """
    mask = labels != IGNORE_INDEX
    safe = torch.where(mask, labels, torch.zeros_like(labels))
    logits = logits.float()
    picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return torch.where(mask, picked - torch.logsumexp(logits, dim=-1), torch.zeros_like(picked))


@dataclass
class SequenceLogps:
    """Per-sequence log-probabilities over the loss tokens."""

    sum: torch.Tensor  # (B,) fp32
    count: torch.Tensor  # (B,) number of loss tokens

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / self.count.clamp(min=1)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> SequenceLogps:
    """Sum and count of the label log-probs of each sequence. (B, T, V), (B, T) -> (B,)."""
    return SequenceLogps(token_logps(logits, labels).sum(-1), (labels != IGNORE_INDEX).sum(-1))


def split_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(2N, ...) with chosen first -> (chosen (N, ...), rejected (N, ...))."""
    assert x.shape[0] % 2 == 0, "a pair batch has an even number of rows"
    return x.chunk(2, dim=0)


# --- preference losses -------------------------------------------------------------------------------------
@dataclass
class PreferenceLoss:
    losses: torch.Tensor  # (N,) one per pair
    chosen_rewards: torch.Tensor  # (N,) detached
    rejected_rewards: torch.Tensor  # (N,) detached


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.1, label_smoothing: float = 0.0) -> PreferenceLoss:
    """DPO, or cDPO when ``label_smoothing`` > 0. Inputs: summed log-probs, (N,) each."""
    chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    logits = beta * (chosen - rejected)
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


def ipo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, chosen_count: torch.Tensor, rejected_count: torch.Tensor,
             beta: float = 0.1, normalize: bool = True) -> PreferenceLoss:
    """IPO; ``normalize`` divides each log-ratio by its token count (TRL), else uses the sums (the paper)."""
    chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    if normalize:
        delta = chosen / chosen_count.clamp(min=1) - rejected / rejected_count.clamp(min=1)
    else:
        delta = chosen - rejected
    return PreferenceLoss((delta - 1 / (2 * beta)) ** 2, beta * chosen.detach(), beta * rejected.detach())


def hinge_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
               ref_rejected: torch.Tensor, beta: float = 0.1) -> PreferenceLoss:
    chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    return PreferenceLoss(torch.relu(1 - beta * (chosen - rejected)), beta * chosen.detach(), beta * rejected.detach())


def simpo_loss(chosen_mean: torch.Tensor, rejected_mean: torch.Tensor, beta: float = 2.0,
               gamma: float = DEFAULT_SIMPO_GAMMA, label_smoothing: float = 0.0) -> PreferenceLoss:
    """SimPO on mean token log-probs of the policy (no reference model)."""
    logits = beta * (chosen_mean - rejected_mean) - gamma
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return PreferenceLoss(losses, beta * chosen_mean.detach(), beta * rejected_mean.detach())


def orpo_loss(chosen_mean: torch.Tensor, rejected_mean: torch.Tensor, lam: float = 0.1) -> PreferenceLoss:
    """ORPO: NLL of the chosen response plus λ times the odds-ratio term, from mean token log-probs."""
    chosen_mean, rejected_mean = chosen_mean.float(), rejected_mean.float()
    # log(1 - p) with p = exp(l) < 1, computed stably as log(-expm1(l)); clamp keeps l = 0 finite.
    log_odds = (chosen_mean - rejected_mean) - (_log1mexp(chosen_mean) - _log1mexp(rejected_mean))
    losses = -chosen_mean - lam * F.logsigmoid(log_odds)
    return PreferenceLoss(losses, lam * chosen_mean.detach(), lam * rejected_mean.detach())


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    x = x.clamp(max=-1e-7)
    # Mächler's split: log1p(-exp(x)) is accurate for x < -log 2, log(-expm1(x)) above.
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def preference_loss(loss_type: str, policy: SequenceLogps, reference: SequenceLogps | None = None, *,
                    beta: float | None = None, label_smoothing: float = 0.0,
                    simpo_gamma: float = DEFAULT_SIMPO_GAMMA, ipo_normalize: bool = True) -> PreferenceLoss:
    """Dispatch on ``objective.loss_type``; ``policy``/``reference`` hold a pair batch (chosen first, (2N,))."""
    if loss_type not in PREFERENCE_LOSS_TYPES:
        raise ValueError(f"loss_type {loss_type!r} is not one of {PREFERENCE_LOSS_TYPES}")
    beta = DEFAULT_BETA[loss_type] if beta is None else beta
    (pc, pr), (nc, nr) = split_pairs(policy.sum), split_pairs(policy.count)
    if loss_type in REFERENCE_FREE:
        mc, mr = split_pairs(policy.mean)
        if loss_type == "simpo":
            return simpo_loss(mc, mr, beta, simpo_gamma, label_smoothing)
        return orpo_loss(mc, mr, beta)
    if reference is None:
        raise ValueError(f"loss_type {loss_type!r} needs reference log-probs")
    rc, rr = split_pairs(reference.sum)
    if loss_type == "sigmoid":
        return dpo_loss(pc, pr, rc, rr, beta, label_smoothing)
    if loss_type == "ipo":
        return ipo_loss(pc, pr, rc, rr, nc, nr, beta, ipo_normalize)
    return hinge_loss(pc, pr, rc, rr, beta)


@dataclass
class KTOLoss:
    losses: torch.Tensor  # (N,) one per item
    rewards: torch.Tensor  # (N,) β·(log πθ − log πref), detached
    desirable: torch.Tensor  # (N,) bool


def kto_reference_point(policy_kl: torch.Tensor, ref_kl: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the KL rows' log-ratios log πθ(y'|x) − log πref(y'|x), detached: the caller sums both
    over every rank (and micro-batch) of the global batch, then z₀ = max(0, sum / count)."""
    diff = (policy_kl - ref_kl).detach().float()
    return diff.sum(), torch.tensor(float(diff.numel()), device=diff.device)


def kto_loss(policy: torch.Tensor, reference: torch.Tensor, desirable: torch.Tensor, kl: torch.Tensor | float,
             beta: float = 0.1, desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> KTOLoss:
    """KTO (module docstring). ``policy``/``reference``: (N,) summed response log-probs of each item;
    ``desirable``: (N,) bool; ``kl``: the reference point z₀ (already clamped at 0, detached)."""
    ratio = policy - reference
    kl = torch.as_tensor(kl, dtype=ratio.dtype, device=ratio.device).detach()
    losses = torch.where(desirable, desirable_weight * (1 - torch.sigmoid(beta * (ratio - kl))),
                         undesirable_weight * (1 - torch.sigmoid(beta * (kl - ratio))))
    return KTOLoss(losses, beta * ratio.detach(), desirable)


def preference_metrics(out: PreferenceLoss) -> dict[str, torch.Tensor]:
    """TRL's metric names -> per-pair values (detached, on the device; the caller averages them when it logs)."""
    chosen, rejected = out.chosen_rewards.detach().float(), out.rejected_rewards.detach().float()
    return {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": chosen - rejected,
            "rewards/accuracies": (chosen > rejected).float()}


# --- reward model ------------------------------------------------------------------------------------------
def last_token_scores(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The score at each sequence's last real token (right padding). (B, T), (B,) -> (B,)."""
    return values.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | float | None = None,
                       center_coef: float | None = None) -> torch.Tensor:
    """Per-pair ``−log σ(r⁺ − r⁻ − margin) + c·(r⁺ + r⁻)²`` (the last term, reward centring, only with c)."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    losses = -F.logsigmoid(diff)
    if center_coef:
        losses = losses + center_coef * (chosen + rejected) ** 2
    return losses


# --- PPO and GRPO ------------------------------------------------------------------------------------------
# Shapes: (B, T) per-token tensors over a rollout, ``mask`` (B, T) true on the response tokens (those whose
# log-prob, value and reward count). References: Schulman et al. 2017 (PPO, arXiv 1707.06347), 2015 (GAE,
# arXiv 1506.02438); Ouyang et al. 2022 (RLHF); Huang et al. 2024 ("The N+ implementation details of RLHF with
# PPO"); Shao et al. 2024 (GRPO, arXiv 2402.03300); Schulman 2020, "Approximating KL divergence" (k1, k2, k3).
KL_ESTIMATORS = ("k1", "k2", "k3", "abs")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / std over the masked entries (unbiased variance); ``shift_mean=False`` keeps the mean
    (used for rewards: only their scale changes). Entries outside the mask are returned as 0."""
    m = mask.to(x.dtype)
    count = m.sum()
    mean = (x * m).sum() / count.clamp(min=1)
    var = (((x - mean) * m) ** 2).sum() / (count - 1).clamp(min=1)  # Bessel's correction
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(πθ ‖ πref) from samples of πθ. (B, T) -> (B, T).

    k1 = log r, k2 = ½(log r)², k3 = (1/r − 1) + log r with r = πθ/πref (unbiased, always ≥ 0; GRPO's choice),
    abs = |log r|.
    """
    log_ratio = logps.float() - ref_logps.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    if estimator == "abs":
        return log_ratio.abs()
    raise ValueError(f"KL estimator {estimator!r} is not one of {KL_ESTIMATORS}")


def rlhf_rewards(scores: torch.Tensor, logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor,
                 kl_coef: float = 0.05, estimator: str = "k1") -> torch.Tensor:
    """Per-token rewards: −kl_coef·KL on every response token, plus the sequence score on the last one. (B, T).

    A row with an empty response gets no reward at all."""
    rewards = -kl_coef * kl_penalty(logps, ref_logps, estimator) * mask
    last = mask.long().cumsum(-1).argmax(-1)  # index of the last response token (first max of the running count)
    scores = scores.float() * mask.any(-1)
    return rewards.scatter_add(1, last.unsqueeze(1), scores.unsqueeze(1))


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's response tokens -> (advantages, returns), (B, T).

    δ_t = r_t + γ·V(t+1) − V(t), A_t = δ_t + γλ·A_(t+1), with V and A past the last response token taken as 0;
    returns = A + V. Entries outside the mask are 0.
    """
    m = mask.to(values.dtype)
    values, rewards = values * m, rewards * m
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        # Outside the response the recursion carries the later advantage through unchanged.
        advantages[:, t] = torch.where(m[:, t] > 0, adv, next_adv)
        next_value = torch.where(m[:, t] > 0, values[:, t], next_value)
        next_adv = advantages[:, t]
    advantages = advantages * m
    return advantages, (advantages + values) * m


@dataclass
class PolicyLoss:
    losses: torch.Tensor  # (B, T) per-token loss, 0 outside the mask
    clip_fraction: torch.Tensor  # scalar: share of response tokens whose ratio was clipped
    approx_kl: torch.Tensor  # scalar: mean of ½(log πθ − log π_old)² over response tokens


def clipped_policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip_eps: float = 0.2) -> PolicyLoss:
    """PPO's ``max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε))`` per token, ρ = exp(log πθ − log π_old).

    ``advantages`` is (B, T) (PPO) or (B,) (GRPO: one per sequence, broadcast over its tokens).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    log_ratio = logps.float() - old_logps.float()
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_eps, 1 + clip_eps)
    losses = torch.maximum(unclipped, clipped) * mask
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)
        approx_kl = masked_mean(0.5 * log_ratio**2, mask)
    return PolicyLoss(losses, clip_fraction, approx_kl)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       clip_range: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``½·max((V − R)², (clip(V, V_old ± ε) − R)²)`` (B, T), and the clipped share (scalar)."""
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped_values - returns) ** 2
    losses = 0.5 * torch.maximum(loss_unclipped, loss_clipped) * mask
    with torch.no_grad():
        clip_fraction = masked_mean((loss_clipped > loss_unclipped).float(), mask)
    return losses, clip_fraction


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO's ``(r_i − mean(r)) / (std(r) + eps)`` within each group of ``group_size`` consecutive samples
    (std unbiased, as torch and TRL compute it); ``scale=False`` only centres (Dr. GRPO). (N·G,) -> (N·G,)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)  # (N, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def grpo_token_losses(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      ref_logps: torch.Tensor | None = None, clip_eps: float = 0.2,
                      kl_coef: float = 0.0) -> PolicyLoss:
    """GRPO per token: the clipped surrogate with per-sequence advantages (B,), plus kl_coef·k3 to the reference.

    Aggregation is the objective's choice: the paper averages per sequence then over sequences; TRL's default
    sums over all tokens and divides by their count.
    """
    out = clipped_policy_loss(logps, old_logps, advantages, mask, clip_eps)
    if ref_logps is not None and kl_coef:
        out.losses = out.losses + kl_coef * kl_penalty(logps, ref_logps, "k3") * mask
    return out


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the softmax, fp32. (B, T, V) -> (B, T)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
