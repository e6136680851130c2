"""Config sections of post-training: ``[objective]`` (the loss of sft / reward / dpo) and ``[lora]`` (adapters).

Definitions and defaults follow the DPO, IPO, SimPO papers and TRL (docs/post-training.md has the formulas).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshlm.errors import ConfigError
from meshlm.models.family import LINEARS
from meshlm.sections import option

# The DPO family's loss types, listed once (objectives/losses.py dispatches on them), with the β each defaults to
DEFAULT_BETA = {"sigmoid": 0.1, "ipo": 0.1, "simpo": 2.0, "hinge": 0.1, "orpo": 0.1, "kto": 0.1}
LOSS_TYPES = tuple(DEFAULT_BETA)
LORA_TARGETS = tuple(lin.target for lin in LINEARS)  # the generic block's projections (meshlm/models/family.py)


@dataclass
class ObjectiveConfig:
    beta: float = option(0.0, "DPO family: the temperature β; 0 means the loss type's default (0.1 for sigmoid, "
                              "ipo, hinge, kto and orpo's λ; 2.0 for simpo).")
    loss_type: str = option("sigmoid", "DPO family loss: sigmoid (DPO), ipo, simpo (reference-free), hinge, "
                                       "orpo (reference-free), kto (unpaired rows with a label, or preference "
                                       "rows split into a desirable and an undesirable item).", choices=LOSS_TYPES)
    desirable_weight: float = option(1.0, "KTO: weight λ_D of the desirable items' loss.")
    undesirable_weight: float = option(1.0, "KTO: weight λ_U of the undesirable items' loss.")
    label_smoothing: float = option(0.0, "cDPO label smoothing ε in [0, 0.5) (sigmoid and simpo).")
    simpo_gamma: float = option(0.5, "SimPO's target margin γ.")
    rpo_alpha: float = option(0.0, "DPO family (sigmoid, ipo, hinge, simpo): weight α of the chosen response's NLL "
                                   "per token added to each pair's loss (RPO; TRL's rpo_alpha). It keeps the chosen "
                                   "responses likely where the pair loss alone pushes both sides down; 0 = off.")
    ipo_normalize: bool = option(True, "IPO: divide each log-ratio by its token count (TRL) instead of using the "
                                       "sums (the paper).")
    reference: str = option("model", "DPO reference: 'model' keeps a frozen copy of checkpoint.init_from laid out "
                                     "like the policy; 'precomputed' computes every reference log-prob once before "
                                     "training and frees the copy (saves its memory).",
                            choices=("model", "precomputed"))
    reward_margin: float = option(0.0, "Reward model: margin m in −log σ(r⁺ − r⁻ − m).")
    reward_center_coef: float = option(0.0, "Reward model: centring coefficient c, adds c·(r⁺ + r⁻)² (TRL's "
                                            "center_rewards_coefficient; 0 = off).")
    packing: bool = option(True, "SFT: pack several rows per sequence (no cross-row attention); false pads one "
                                 "row per sequence.")
    eval_fraction: float = option(0.1, "Fraction of the JSONL rows held out for evaluation (the last rows).")
    # classify (objectives/classify.py)
    classes: list[str] = option([], "Classify: the class names, in the head's order; each labelled row's label is "
                                    "one of them (e.g. [\"refuse\", \"warn\", \"answer\"]).")
    prompt_tokens: int = option(32, "Classify: a long input keeps at least this many tokens of the prompt's end "
                                    "(the rest of data.seq_len goes to the response's start and end).")
    # PPO / GRPO (objectives/rl.py)
    reward_fn: str = option("", "PPO/GRPO: a Python reward function 'module:function' called with (prompts, "
                                "responses, extras) -> one float per response, e.g. "
                                "'meshlm.objectives.rewards:contains_number'.")
    reward_model: str = option("", "PPO/GRPO: a reward run's checkpoint (folder or run dir) scoring each response "
                                   "at its last token; use it or reward_fn, not both.")
    group_size: int = option(4, "PPO/GRPO: samples per prompt G (GRPO's group; PPO usually 1).")
    ppo_epochs: int = option(1, "PPO/GRPO: passes over each rollout.")
    ppo_minibatches: int = option(1, "PPO/GRPO: optimizer steps per pass; a rollout holds training.batch_size x "
                                     "ppo_minibatches sequences.")
    kl_coef: float = option(0.05, "PPO: per-token KL penalty in the reward; GRPO: β of the k3 KL term in the loss "
                                  "(0 = none).")
    gamma: float = option(1.0, "PPO: GAE discount γ.")
    lam: float = option(0.95, "PPO: GAE λ.")
    cliprange: float = option(0.2, "PPO/GRPO: policy ratio clip ε.")
    cliprange_value: float = option(0.2, "PPO: value clip ε around the rollout's values.")
    vf_coef: float = option(0.1, "PPO: weight of the value loss.")
    max_new_tokens: int = option(32, "PPO/GRPO: response length limit; prompts keep at most data.seq_len - "
                                     "max_new_tokens tokens.")
    temperature: float = option(1.0, "PPO/GRPO: sampling temperature (log-probs are those of logits / temperature).")
    top_k: int = option(0, "PPO/GRPO: sample from the k most likely tokens (0 = all).")
    top_p: float = option(1.0, "PPO/GRPO: nucleus sampling mass (1 = off).")

    def validate(self) -> None:
        if self.beta < 0:
            raise ConfigError(f"objective.beta must be >= 0 (0 = the loss type's default), got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"objective.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.rpo_alpha < 0:
            raise ConfigError(f"objective.rpo_alpha must be >= 0 (0 = off), got {self.rpo_alpha}")
        if self.rpo_alpha and self.loss_type in ("orpo", "kto"):
            raise ConfigError(f"objective.rpo_alpha = {self.rpo_alpha} does not apply to loss_type "
                              f"{self.loss_type!r} (orpo has its own NLL term, kto has no pairs); set it to 0")
        if self.desirable_weight < 0 or self.undesirable_weight < 0:
            raise ConfigError("objective.desirable_weight and objective.undesirable_weight must be >= 0; got "
                              f"{self.desirable_weight}, {self.undesirable_weight}")
        if self.reward_center_coef < 0:
            raise ConfigError(f"objective.reward_center_coef must be >= 0, got {self.reward_center_coef}")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"objective.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if len(set(self.classes)) != len(self.classes) or self.prompt_tokens < 1:
            raise ConfigError(f"objective.classes must be distinct names and objective.prompt_tokens >= 1; got "
                              f"{self.classes}, {self.prompt_tokens}")
        self._validate_rl()

    def _validate_rl(self) -> None:
        for key in ("group_size", "ppo_epochs", "ppo_minibatches", "max_new_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"objective.{key} must be at least 1, got {getattr(self, key)}")
        for key in ("kl_coef", "vf_coef", "cliprange", "cliprange_value"):
            if getattr(self, key) < 0:
                raise ConfigError(f"objective.{key} must be >= 0, got {getattr(self, key)}")
        if not (0 < self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ConfigError(f"objective.gamma must be in (0, 1] and objective.lam in [0, 1]; got {self.gamma}, "
                              f"{self.lam}")
        if self.temperature <= 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ConfigError("objective.temperature must be > 0, objective.top_k >= 0 and objective.top_p in "
                              f"(0, 1]; got {self.temperature}, {self.top_k}, {self.top_p}")
        if self.reward_fn and self.reward_model:
            raise ConfigError("set objective.reward_fn or objective.reward_model, not both")


@dataclass
class LoRAConfig:
    rank: int = option(0, "LoRA rank r; 0 turns LoRA off. With r > 0 the base (checkpoint.init_from) is frozen "
                          "and only the adapters train and are checkpointed.")
    alpha: float = option(16.0, "LoRA α: the update is scaled by α / r.")
    dropout: float = option(0.0, "Dropout on the adapters' input.")
    targets: list[str] = option(["q", "v"], "Projections to adapt, any of q, k, v, o, gate, up, down.")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def validate(self) -> None:
        if self.rank < 0 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.rank must be >= 0, lora.alpha > 0 and lora.dropout in [0, 1); got rank "
                              f"{self.rank}, alpha {self.alpha}, dropout {self.dropout}")
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        if unknown or (self.enabled and not self.targets):
            raise ConfigError(f"lora.targets {self.targets} must be a non-empty list of {', '.join(LORA_TARGETS)}")
