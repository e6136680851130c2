"""The generating objectives: PPO (actor-critic RLHF) and GRPO (group-relative policy optimisation).

Each trainer step is one optimizer update on one minibatch. ``next_batch`` serves minibatches from a rollout
buffer and refills it when it runs out: a rollout takes ``rollout_prompts`` prompts per rank (G samples each),
generates with the batched KV-cache sampler (meshlm/generate/rollout.py), scores the responses, computes
advantages, and is then served as ``ppo_epochs`` x ``ppo_minibatches`` minibatches of ``training.batch_size``
sequences (global; each rank its slice), reshuffled every epoch. Formulas: objectives/losses.py and
docs/post-training.md.

Layout (docs/post-training.md, "PPO and GRPO"): the actor is the trained model; PPO's critic is a value head on
the actor's trunk (``output.value``, shared-trunk actor-critic as in TRL's classic PPO), so it is trained,
sharded and checkpointed with the policy by the one optimizer; the reference (``checkpoint.init_from``, or the
seeded start) and the reward model (``objective.reward_model``) are frozen copies laid out like the policy.

Layout independence (loss parity with a single device under DDP / FSDP2): each sequence samples from its own
generator seeded by (training.seed, rollout number, its global index in the rollout), every rank left-pads its
prompts to the global longest and decodes until every rank is done, so a sequence's tokens do not depend on the
rank it ran on. After scoring, the ranks all-gather the rollout: advantages (GRPO's group statistics, PPO's
whitening) are computed over the whole global rollout, and every epoch's minibatch order is one global
permutation of which each rank takes its contiguous slice, as the single device would take the whole.

Resume: the samplers are seeded as above, so the next rollout is regenerated exactly; a checkpoint taken inside
a rollout's minibatches stores the (global) rollout buffer itself (``state_dict``, base64 of torch.save) because
the policy that generated it no longer exists; it resumes under any dp size.
"""

from __future__ import annotations

import base64
import hashlib
import io
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.data.posttrain import PromptLoader, pad_id_for
from meshlm.errors import ConfigError
from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import Rollout, rollout, unwrap
from meshlm.models.llama import ParamInit
from meshlm.objectives.base import IGNORE_INDEX, MetricSums, Objective, ObjectiveContext
from meshlm.objectives.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    entropy_from_logits,
    gae,
    group_advantages,
    grpo_token_losses,
    kl_penalty,
    masked_mean,
    rlhf_rewards,
    token_logps,
    whiten,
)
from meshlm.objectives.rewards import call_reward_fn, load_reward_fn, reward_model_scores


class ValueHead(nn.Linear):
    """dim -> 1 state value; starts at zero (every value 0), so the first rollout's advantages are the returns."""

    def param_init_local(self, local_name: str, full_name: str) -> ParamInit:
        return ParamInit("zeros")


class PolicyValueOutput(nn.Linear):
    """The vocabulary head ``output`` (its weight keeps the name ``output.weight``, and stays tied when the model
    ties it) with the value head ``output.value`` beside it. ``forward`` returns the logits and keeps the values
    of the same positions in ``self.values`` (B, T) fp32 for the objective to take."""

    def __init__(self, dim: int, vocab_size: int, device=None, dtype=None) -> None:
        super().__init__(dim, vocab_size, bias=False, device=device, dtype=dtype)
        self.value = ValueHead(dim, 1, device=device, dtype=dtype)
        self.values: torch.Tensor | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.values = self.value(h).squeeze(-1).float()  # (B, T)
        return super().forward(h)  # (B, T, V)

    def take_values(self) -> torch.Tensor:
        values, self.values = self.values, None
        assert values is not None, "the model has not run forward since the values were last taken"
        return values


def forward_sequences(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits predicting each response token (B, N, V), and the response labels (B, N) with IGNORE_INDEX off
    the response mask. The prompt width is P = L - N (all rows of a rollout share it)."""
    ids, mask = batch["input_ids"], batch["response_mask"]  # (B, L), (B, N)
    P = ids.shape[1] - mask.shape[1]
    logits = model(ids, position_ids=batch["position_ids"], padding_mask=batch["padding_mask"])  # (B, L, V)
    labels = torch.where(mask, ids[:, P:], IGNORE_INDEX)  # (B, N)
    return logits[:, P - 1:-1], labels  # slot t's logits predict slot t + 1


class RLObjective(Objective):
    """Shared by PPO and GRPO: the rollout buffer, its minibatches and resumable state."""

    name = "rl"
    data_kind = "prompt"
    config_keys = ("reward_fn", "reward_model", "group_size", "ppo_epochs", "ppo_minibatches", "kl_coef",
                   "max_new_tokens", "temperature", "top_k", "top_p", "cliprange", "eval_fraction")

    def __init__(self, cfg: ObjectiveConfig | None = None) -> None:
        super().__init__(cfg)
        self._metrics = MetricSums()
        self.buffer: dict[str, torch.Tensor] | None = None
        self.position = 0  # minibatches served from the buffer
        self.num_rollouts = 0
        self.loader = None  # a PromptLoader over rollout-sized batches, built in setup

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self, ctx: ObjectiveContext) -> None:
        job, self.engine, self.device = ctx.cfg, ctx.engine, ctx.device
        tc, oc = job.training, self.cfg
        if len(ctx.model_parts) != 1 or ctx.engine.dims.tp > 1:
            raise ConfigError(f"{self.name} runs on single device, DDP and FSDP2; set parallel.tp=1 and parallel.pp=1")
        if tc.eval_interval:
            raise ConfigError(f"{self.name} has no held-out loss to evaluate; set training.eval_interval=0")
        dp = ctx.engine.dp_size
        samples = tc.batch_size * oc.ppo_minibatches  # per rollout, global
        if samples % (oc.group_size * dp):
            raise ConfigError(f"training.batch_size x objective.ppo_minibatches ({samples} sequences per rollout) "
                              f"must be a multiple of objective.group_size x data-parallel ranks "
                              f"({oc.group_size} x {dp})")
        self.job, self.policy, self.tokenizer = job, ctx.model_parts[0], ctx.tokenizer
        self.autocast = ctx.autocast  # the trainer's precision, for the rollout's and the copies' forwards
        self.loader = PromptLoader(ctx.train_loader.prompts, samples // oc.group_size,
                                   extras=ctx.train_loader.extras, max_prompt_tokens=job.data.seq_len,
                                   dp_rank=ctx.engine.dp_rank, dp_size=dp, seed=tc.seed)
        self.chunk = tc.micro_batch_size or tc.batch_size // dp  # rows per no-grad forward while scoring
        from meshlm.checkpoint.load import resolve_checkpoint  # not at the top: both import meshlm.objectives
        from meshlm.generate.stops import stop_ids

        init_from = resolve_checkpoint(job.checkpoint.init_from) if job.checkpoint.init_from else None
        eos = stop_ids(ctx.tokenizer, init_from)  # the tokenizer's folder (data_setup.load_tokenizer)
        # The one SamplingParams (meshlm/generate/params.py); the config checked the ranges (temperature > 0).
        self.sampling = SamplingParams(max_tokens=oc.max_new_tokens, temperature=oc.temperature, top_k=oc.top_k,
                                       top_p=oc.top_p, stop_ids=tuple(sorted(eos)))
        self.pad_id, self.vocab_limit = pad_id_for(ctx.tokenizer), ctx.tokenizer.vocab_size
        self.reference = ctx.build_frozen(job.checkpoint.init_from or None)[0]
        self.reward_fn = load_reward_fn(oc.reward_fn) if oc.reward_fn else None
        self.reward_model = ctx.build_frozen(oc.reward_model)[0] if oc.reward_model else None
        if (self.reward_fn is None) == (self.reward_model is None):
            raise ConfigError(f"{self.name} needs exactly one of objective.reward_fn ('module:function') and "
                              "objective.reward_model (a reward run's checkpoint)")

    # ------------------------------------------------------------------------------------------- minibatches
    @property
    def steps_per_rollout(self) -> int:
        return self.cfg.ppo_epochs * self.cfg.ppo_minibatches

    def next_batch(self, loader: Any = None) -> dict[str, torch.Tensor]:
        if self.buffer is None or self.position == self.steps_per_rollout:
            self.buffer, self.position = self._collect(), 0
            self.num_rollouts += 1
        epoch, index = divmod(self.position, self.cfg.ppo_minibatches)
        self.position += 1
        size = next(iter(self.buffer.values())).shape[0] // self.cfg.ppo_minibatches  # global minibatch
        order = torch.randperm(size * self.cfg.ppo_minibatches, generator=self._generator("minibatch", epoch))
        local = size // self.engine.dp_size
        first = index * size + self.engine.dp_rank * local  # this rank's contiguous slice of the minibatch
        rows = order[first:first + local].to(self.device)
        return {k: v[rows] for k, v in self.buffer.items()}

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["response_mask"].sum()  # the loss is a mean over every response token of the global batch

    def metrics(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self._metrics.pop()

    # ---------------------------------------------------------------------------------------------- rollout
    def _seed(self, purpose: str, index: int = 0) -> int:
        """A seed for (training.seed, rollout number, purpose, index): the same on every layout, nothing to
        checkpoint."""
        key = f"{self.job.training.seed}:{self.num_rollouts}:{purpose}:{index}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1

    def _generator(self, purpose: str, index: int = 0) -> torch.Generator:
        return torch.Generator(device="cpu").manual_seed(self._seed(purpose, index))

    def _dp_group(self):
        return self.engine.mesh["dp"].get_group()

    def _global_max(self, value: int) -> int:
        if self.engine.dp_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._dp_group())
        return int(t.item())

    def _all_gather(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every rank's rows, concatenated in rank order (= global sample order); shapes agree across ranks."""
        if self.engine.dp_size == 1:
            return tensors
        out = {}
        for key, t in tensors.items():
            send = t.to(torch.uint8) if t.dtype == torch.bool else t.contiguous()  # gloo has no bool
            parts = [torch.empty_like(send) for _ in range(self.engine.dp_size)]
            dist.all_gather(parts, send, group=self._dp_group())
            out[key] = torch.cat(parts).to(t.dtype)
        return out

    def _all_finished(self, done: bool) -> bool:
        """True once every data-parallel rank is done: they must run the same number of forwards (FSDP)."""
        if self.engine.dp_size == 1:
            return done
        flag = torch.tensor([float(done)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._dp_group())
        return bool(flag.item())

    @torch.no_grad()
    def _generate(self) -> tuple[Rollout, list[dict]]:
        batch = self.loader.next_batch()
        G = self.cfg.group_size
        prompts = [p for p in batch["prompt_ids"] for _ in range(G)]  # the G samples of a prompt are adjacent
        extras = [e for e in batch["extra"] for _ in range(G)]
        first = self.engine.dp_rank * len(prompts)  # global index of this rank's first sequence in the rollout
        seeds = [self._seed("sample", first + i) for i in range(len(prompts))]
        width = self._global_max(max(len(p) for p in prompts))
        self.policy.eval()
        start = time.perf_counter()
        with self.autocast():
            # copies=False: the policy's own weights, multiplied as a sharded layout's plain forward multiplies them
            # (column blocks sum in another order and flipped sampled tokens against FSDP: test_rl's parity), and
            # no packed copy to rebuild after every optimizer step
            out = rollout(self.policy, prompts, self.sampling, pad_id=self.pad_id, vocab_limit=self.vocab_limit,
                          device=self.device, all_finished=self._all_finished, row_seeds=seeds, prompt_width=width,
                          copies=False)
        seconds = time.perf_counter() - start
        self.policy.train()
        self._metrics.add("rollout_tokens_per_s", torch.tensor(out.num_tokens / seconds))
        self._metrics.add("response_length", out.response_mask.sum(1).double())
        return out, extras

    @torch.no_grad()
    def _score_forward(self, model: nn.Module, batch: dict[str, torch.Tensor],
                       values: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token log-probs of the responses (B, N) and, with ``values``, the value head's (B, N), in chunks."""
        logps, vals = [], []
        B = batch["input_ids"].shape[0]
        for start in range(0, B, self.chunk):
            part = {k: v[start:start + self.chunk] for k, v in batch.items()}
            with self.autocast():
                logits, labels = forward_sequences(model, part)
            logps.append(token_logps(logits / self._temperature, labels))
            if values:
                P = part["input_ids"].shape[1] - part["response_mask"].shape[1]
                vals.append(unwrap(model).output.take_values()[:, P - 1:-1])
        return torch.cat(logps), (torch.cat(vals) if values else None)

    @property
    def _temperature(self) -> float:
        """Log-probs are those of the sampling temperature's distribution (as TRL), so that the first ratio is 1."""
        return self.cfg.temperature

    def _scores(self, out: Rollout, batch: dict[str, torch.Tensor], extras: list[dict]) -> torch.Tensor:
        """(B,) fp32 sequence scores from the reward function or the reward model."""
        if self.reward_model is not None:
            chunks = [reward_model_scores(self.reward_model, batch["input_ids"][s:s + self.chunk],
                                          batch["padding_mask"][s:s + self.chunk],
                                          batch["position_ids"][s:s + self.chunk])
                      for s in range(0, out.prompt_ids.shape[0], self.chunk)]
            return torch.cat(chunks).float()
        decode = self.tokenizer.decode
        prompts = [decode(p[m].tolist(), skip_special_tokens=True) for p, m in zip(out.prompt_ids, out.prompt_mask)]
        responses = [decode(r[m].tolist(), skip_special_tokens=True)
                     for r, m in zip(out.response_ids, out.response_mask)]
        return call_reward_fn(self.reward_fn, self.cfg.reward_fn, prompts, responses, extras, self.device)

    def _collect(self) -> dict[str, torch.Tensor]:
        """One rollout: generate and score this rank's sequences, gather the global rollout, and compute what the
        minibatches need (the subclass's advantages) over all of it."""
        out, extras = self._generate()
        ids, mask, positions = out.sequences()
        batch = {"input_ids": ids, "padding_mask": mask, "position_ids": positions,
                 "response_mask": out.response_mask}
        scores = self._scores(out, batch, extras)
        old_logps, old_values = self._score_forward(self.policy, batch, values=self.uses_values)
        ref_logps, _ = self._score_forward(self.reference, batch)
        response = out.response_mask
        self._metrics.add("reward", scores)
        self._metrics.add("kl", kl_penalty(old_logps, ref_logps, "k1")[response])
        batch.update(old_logps=old_logps, ref_logps=ref_logps, scores=scores)
        if old_values is not None:
            batch["old_values"] = old_values
        batch = self._all_gather(batch)
        scores = batch.pop("scores")
        batch.update(self.advantages(scores, batch["old_logps"], batch["ref_logps"], batch.get("old_values"),
                                     batch["response_mask"]))
        return batch

    # --------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        mid_rollout = self.buffer is not None and 0 < self.position < self.steps_per_rollout
        return {"loader": self.loader.state_dict(), "num_rollouts": self.num_rollouts, "position": self.position,
                "buffer": _encode({k: v.cpu() for k, v in self.buffer.items()}) if mid_rollout else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])
        self.num_rollouts, self.position = int(state["num_rollouts"]), int(state["position"])
        self.buffer = None
        if state.get("buffer") is not None:
            self.buffer = {k: v.to(self.device) for k, v in _decode(state["buffer"]).items()}
        else:
            self.position = self.steps_per_rollout  # the next step starts a new rollout


def _encode(tensors: dict[str, torch.Tensor]) -> str:
    data = io.BytesIO()
    torch.save(tensors, data)
    return base64.b64encode(data.getvalue()).decode("ascii")


def _decode(text: str) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True)


class GRPOObjective(RLObjective):
    """GRPO (Shao et al. 2024): one advantage per sequence, ``(r − mean) / (std + 1e-4)`` within its prompt's
    group of G samples; clipped surrogate per token; ``kl_coef`` · k3 to the reference in the loss; no critic."""

    name = "grpo"
    uses_values = False

    def advantages(self, scores, old_logps, ref_logps, old_values, response) -> dict[str, torch.Tensor]:
        adv = group_advantages(scores, self.cfg.group_size)  # (B,)
        return {"advantages": adv[:, None].expand_as(old_logps).contiguous()}  # (B, N)

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, labels = self._scaled_logits(model, batch)
        logps = token_logps(logits, labels)  # (B, N)
        mask = batch["response_mask"]
        out = grpo_token_losses(logps, batch["old_logps"], batch["advantages"], mask, batch["ref_logps"],
                                self.cfg.cliprange, self.cfg.kl_coef)
        self._loss_metrics(logits, mask, out)
        return out.losses.sum()

    def _scaled_logits(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits at the sampling temperature (the distribution the rollout drew from); no copy at 1.0."""
        logits, labels = forward_sequences(model, batch)
        return (logits if self._temperature == 1.0 else logits / self._temperature), labels

    def _loss_metrics(self, logits: torch.Tensor, mask: torch.Tensor, out) -> None:
        """``logits`` already at the sampling temperature."""
        with torch.no_grad():
            self._metrics.add("entropy", entropy_from_logits(logits)[mask])
            self._metrics.add("clip_fraction", out.clip_fraction)
            self._metrics.add("approx_kl", out.approx_kl)


class PPOObjective(GRPOObjective):
    """PPO with a KL-penalised reward (Ouyang et al. 2022): per-token rewards −kl_coef·k1 plus the score at the
    last response token; GAE(γ, λ) with the value head; whitened advantages; clipped policy and value losses,
    the value loss weighted by ``vf_coef``."""

    name = "ppo"
    uses_values = True
    config_keys = (*RLObjective.config_keys, "gamma", "lam", "cliprange_value", "vf_coef")

    def adapt_model(self, model: nn.Module) -> None:
        old = model.output
        model.output = PolicyValueOutput(old.in_features, old.out_features, device=old.weight.device,
                                         dtype=old.weight.dtype)
        model.tie_weights()

    def init_from_keep(self, key: str) -> bool:
        """A policy checkpoint (SFT, pretrain) has no value head: it keeps its zero start."""
        return not key.startswith("output.value.")

    def advantages(self, scores, old_logps, ref_logps, old_values, response) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        rewards = rlhf_rewards(scores, old_logps, ref_logps, response, cfg.kl_coef, "k1")  # (B, N)
        adv, returns = gae(rewards, old_values, response, cfg.gamma, cfg.lam)
        return {"advantages": whiten(adv, response), "returns": returns}

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, labels = self._scaled_logits(model, batch)
        P = batch["input_ids"].shape[1] - batch["response_mask"].shape[1]
        values = unwrap(model).output.take_values()[:, P - 1:-1]  # (B, N) value of the state before each token
        logps = token_logps(logits, labels)
        mask = batch["response_mask"]
        out = clipped_policy_loss(logps, batch["old_logps"], batch["advantages"], mask, self.cfg.cliprange)
        value_losses, value_clip = clipped_value_loss(values, batch["old_values"], batch["returns"], mask,
                                                      self.cfg.cliprange_value)
        self._loss_metrics(logits, mask, out)
        self._metrics.add("value_loss", masked_mean(value_losses.detach(), mask))
        self._metrics.add("value_clip_fraction", value_clip)
        return (out.losses + self.cfg.vf_coef * value_losses).sum()
