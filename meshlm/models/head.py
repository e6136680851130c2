"""The output head, and the summed next-token cross-entropy computed straight from the head's input.

Why fuse the head with the loss: the logits of one micro-batch are its largest activation (b·s·V values; at
Llama 3's V = 128k and 8k tokens, 4 GiB in fp32) and, on CPU, the memory passes over them cost as much as a
third of the head's matmuls. :class:`LinearCrossEntropy` never materialises them: it walks the rows in chunks,
and for each chunk computes the logits, their log-sum-exp, the loss and at once the gradient of the logits
(softmax − one-hot), which it multiplies back into the gradients of the head's input and weight. Backward only
scales those two by the incoming gradient. The matmuls are the three a plain head runs (forward, input gradient,
weight gradient), the element-wise work is one pass fewer, and what stays alive between forward and backward
is the two gradients (b·s·d and V·d) instead of the logits (b·s·V) — less whenever b·s exceeds d (2·d when
the weight gradient stays fp32 beside bf16 logits), i.e. always in training. Measured on the `small` flavour's
head (1,024 rows, d 256, V 4,096, one core, forward + backward): 72.5 ms through logits and the chunked
cross-entropy, 65.7 ms fused (docs/benchmarks.md).

Where it applies: plain tensors (single device, DDP, FSDP — inside the head's forward FSDP2 has gathered the
weight), the non-pipelined model called with ``labels``, fp32 or bf16 (fp16 takes the logits path: its loss scale
must apply before any fp16 rounding of the gradients). Tensor parallelism keeps logits sharded along the
vocabulary (loss parallelism, meshlm/objectives/pretrain.py; the chunked cross-entropy below otherwise) and pipeline stages hand logits to the schedule's
loss; both call the head without labels and use the chunked cross-entropy on logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IGNORE_INDEX = -100  # a label to skip (torch's default); meshlm.objectives.base re-exports it

# Rows of (rows, V) handled at once. The chunk's fp32 logits are the only (rows, V) temporaries: 1,024 × V is
# 16 MiB at V = 4,096 and 0.5 GiB at V = 128k. Measured on the `small` head: 256 and 1,024 rows run alike.
FUSED_CHUNK_ROWS = 1024


def _targets(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) mask of the rows that count, and labels with ignored rows pointed at column 0 (read, then zeroed)."""
    valid = labels != IGNORE_INDEX
    return valid, torch.where(valid, labels, 0)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    """The matmuls' dtype: autocast's when it is on (as F.linear would run), else the input's."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return h.dtype


# Rows of (rows, V) handled at once: 4096 × V fp32 is 64 MiB at V = 4096 and 2 GiB at V = 128k; the chunk is the
# only fp32 (rows, V) temporary, so memory stays flat in the sequence length. Measured on the `small` flavour it
# is as fast as one chunk (docs/benchmarks.md).
CHUNK_ROWS = 4096


class ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``logits`` (N, V) against ``labels`` (N,), ignoring IGNORE_INDEX.

    Forward keeps only each row's log-sum-exp (N fp32 values); backward rebuilds softmax − one-hot one chunk at
    a time, in fp32, and writes it straight into the gradient in the logits' dtype. Equal to
    ``F.cross_entropy(logits.float(), labels, reduction="sum")`` up to fp32 rounding (summation order).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # (N,)
        for start in range(0, logits.shape[0], chunk_rows):
            lse[start:start + chunk_rows] = torch.logsumexp(logits[start:start + chunk_rows].float(), dim=-1)
        valid, safe = _targets(labels)
        target = logits.gather(1, safe[:, None]).squeeze(1).float()  # (N,) the target's logit
        # Saved: the logits and labels (which exist anyway) and lse, 4 bytes per row; masks are rebuilt.
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_rows = chunk_rows
        return torch.where(valid, lse - target, 0.0).sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        valid, safe = _targets(labels)
        row_scale = grad.float() * valid  # (N,) 0 on ignored rows
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            probs = torch.exp(logits[rows].float() - lse[rows, None])  # (n, V) softmax
            probs.scatter_add_(1, safe[rows, None], -torch.ones_like(lse[rows, None]))  # − one-hot
            grad_logits[rows] = probs.mul_(row_scale[rows, None])
        return grad_logits, None, None


class LinearCrossEntropy(torch.autograd.Function):
    """Σ over rows with a label of cross_entropy(h · Wᵀ, label), fp32, with both gradients made in forward.

    h (N, d), weight (V, d), labels (N,) with IGNORE_INDEX rows skipped. Equal to
    ``F.cross_entropy(F.linear(h, weight).float(), labels, reduction="sum")`` up to rounding (summation order).
    Matmuls run in the compute dtype (autocast's, or the inputs'); the softmax is fp32 whatever it is; in 16
    bits the weight gradient is summed over chunks in fp32. Saves the two gradients only; backward may run once.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        cdt = _compute_dtype(h)
        valid, safe = _targets(labels)
        want_w = ctx.needs_input_grad[1]  # a frozen head (LoRA) needs no weight gradient
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(cdt), weight.to(cdt)  # no copy when the dtypes already match
            grad_h = torch.empty_like(h)  # (N, d) in h's dtype
            grad_w = None  # (V, d): one chunk's product, or an fp32 sum over chunks
            several = h.shape[0] > chunk_rows
            part = None  # 16 bits over several chunks: one (V, d) product buffer, reused
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            for start in range(0, h.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                # (n, V) this chunk's log-probabilities: one fused kernel (a logsumexp, then a subtraction and an
                # exp, takes a third longer on CPU)
                z = torch.log_softmax((hc[rows] @ wc.t()).float(), dim=-1)
                target = z.gather(1, safe[rows, None]).squeeze(1)  # (n,)
                loss -= torch.where(valid[rows], target, 0.0).sum()
                z.exp_()  # softmax, in place
                z.scatter_add_(1, safe[rows, None], torch.full_like(target[:, None], -1.0))  # − one-hot
                z.mul_(valid[rows, None])  # ignored rows: no gradient
                g = z.to(cdt)  # (n, V) d loss / d logits
                grad_h[rows] = g @ wc
                if not want_w:
                    continue
                if grad_w is None:
                    grad_w = g.t() @ hc[rows]
                    if several and cdt != torch.float32:  # summed over chunks in fp32, not in 16 bits
                        grad_w = grad_w.float()
                elif grad_w.dtype == cdt:
                    grad_w.addmm_(g.t(), hc[rows])
                else:
                    part = torch.mm(g.t(), hc[rows], out=part)
                    grad_w.add_(part)  # summed in fp32, converted element by element
        if grad_w is None:
            grad_w = torch.empty(0, device=weight.device)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype) if want_w else grad_w)
        ctx.spent = False
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.spent:
            raise RuntimeError("LinearCrossEntropy's backward scales its saved gradients in place and runs once; "
                               "retain_graph=True with a second backward is not supported")
        ctx.spent = True
        grad_h, grad_w = ctx.saved_tensors
        scale = grad.to(torch.float32)
        return grad_h.mul_(scale), grad_w.mul_(scale) if ctx.needs_input_grad[1] else None, None, None


def linear_cross_entropy_sum(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                             chunk_rows: int = FUSED_CHUNK_ROWS) -> torch.Tensor:
    """Summed fp32 cross-entropy of the head ``h · weightᵀ`` against ``labels``, without the logits.

    h (..., d) and labels (...) are flattened to rows. Without autograd (evaluation) only the loss is computed.
    """
    h, labels = h.reshape(-1, h.shape[-1]), labels.reshape(-1)
    if labels.shape[0] != h.shape[0]:
        raise ValueError(f"labels have {labels.shape[0]} positions, hidden states {h.shape[0]}")
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return LinearCrossEntropy.apply(h, weight, labels, chunk_rows)
    valid, safe = _targets(labels)
    loss = torch.zeros((), dtype=torch.float32, device=h.device)
    for start in range(0, h.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        z = F.linear(h[rows], weight).float()  # (n, V)
        target = z.gather(1, safe[rows, None]).squeeze(1)
        loss += torch.where(valid[rows], torch.logsumexp(z, dim=-1) - target, 0.0).sum()
    return loss


def uses_fused_head(model: nn.Module) -> bool:
    """Whether ``model(tokens, labels=...)`` returns the loss from its head: meshlm's decoder (bare, under DDP or
    compiled) whose output is an :class:`OutputHead` with the fused path on. Objectives ask this before choosing
    between the fused loss and the cross-entropy of logits."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    inner = getattr(inner, "_orig_mod", inner)
    head = getattr(inner, "output", None)
    return isinstance(head, OutputHead) and head.fused


class OutputHead(nn.Linear):
    """The vocabulary projection (an nn.Linear, so sharding plans, checkpoints and LoRA see a Linear), which
    returns the summed cross-entropy instead of the logits when given ``labels`` (see the module docstring).
    ``fused`` is turned off by tensor parallelism, whose logits stay sharded for the loss-parallel cross-entropy."""

    def __init__(self, in_features: int, out_features: int, **kwargs) -> None:
        super().__init__(in_features, out_features, bias=False, **kwargs)
        self.fused = True

    def forward(self, h: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if labels is None:
            return F.linear(h, self.weight)  # (..., V)
        if not self.fused:
            raise ValueError("this output head computes logits only (tensor parallelism): call it without labels "
                             "and take the cross-entropy of the logits")
        if _compute_dtype(h) == torch.float16:
            # fp16: the fused loss would round its unscaled gradient sums to fp16 before the loss scale applies
            # (an overflow the dynamic loss scaler cannot back off); the logits path scales first.
            logits = F.linear(h, self.weight)
            return ChunkedCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), CHUNK_ROWS)
        return linear_cross_entropy_sum(h, self.weight, labels)


def head_kind(model: nn.Module) -> str:
    """What ``model``'s output head is (``model.head``, meshlm/models/config.py), from the module itself: ``lm``
    (vocabulary logits), ``lm_value`` (vocabulary logits with a value head beside them, PPO), ``score`` (one
    output without a bias: a reward model) or ``classes`` (one logit per class, with a bias)."""
    out = model.output
    if isinstance(out, OutputHead) or (isinstance(out, nn.Linear) and out.out_features == model.cfg.vocab_size
                                       and not hasattr(out, "value") and out.bias is None):
        return "lm"
    if hasattr(out, "value"):
        return "lm_value"
    return "score" if out.out_features == 1 and out.bias is None else "classes"

