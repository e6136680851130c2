"""Many LoRA adapters on one loaded base: rows of different adapters decode in the same batch.

Each adapted projection of the base becomes a :class:`MultiLoRALinear`: the base ``nn.Linear`` unchanged, plus the
adapters' A (S, R, in) and B (S, out, R) stacked over slots (slot 0 is "no adapter": zeros; ranks below R are
zero-padded, which adds nothing; B carries the adapter's alpha / r). Before each forward the engine says which
slot every batch row uses, and the layer adds ``B[s_b] (A[s_b] x_b)`` to the base's ``W x_b``. Two ways, equal up
to float rounding: ``gather`` copies each row's A and B and applies two batched matmuls (``bmm``; the form of
Punica's BGMV kernel, in plain torch), ``grouped`` takes the rows of each adapter together and applies two plain
matmuls per adapter in the batch (the segment form, SGMV), with no per-row copy of A and B. Without a fused kernel
the copies cost more than the extra launches (scripts/bench_serve.py --adapters measures both), so ``grouped`` is
the default. Either equals the merged model's ``(W + B A) x_b`` up to float rounding, and a batch whose rows all use
slot 0 runs the base alone. Loading or unloading an adapter writes its slot between decode steps (the engine's lock), so rows of other
adapters decoding at that moment are untouched.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from meshlm.models.lora import lora_modules


class MultiLoRALinear(nn.Module):
    """A base projection with per-row adapters (see the module docstring)."""

    def __init__(self, base: nn.Linear, bank: AdapterBank) -> None:
        super().__init__()
        self.base, self.bank = base, bank
        w = base.weight
        self.A = torch.zeros(1, 0, base.in_features, dtype=w.dtype, device=w.device)  # (S, R, in)
        self.B = torch.zeros(1, base.out_features, 0, dtype=w.dtype, device=w.device)  # (S, out, R)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)  # (B, T, out)
        rows = self.bank.rows
        if rows is None or self.A.shape[1] == 0:
            return out
        if self.bank.mode == "gather":
            a, b = self.A[rows], self.B[rows]  # (B, R, in), (B, out, R): each row's adapter
            return out + torch.bmm(torch.bmm(x, a.transpose(1, 2)), b.transpose(1, 2))  # (B, T, R) -> (B, T, out)
        for slot, index in self.bank.groups:  # the rows of one adapter at a time
            update = (x[index] @ self.A[slot].T) @ self.B[slot].T  # (b, T, R) -> (b, T, out)
            out.index_add_(0, index, update)
        return out

    def put(self, slot: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Write (or with None, clear) one slot, growing the slot and rank axes as needed."""
        rank = 0 if a is None else a.shape[0]
        slots, width = max(self.A.shape[0], slot + 1), max(self.A.shape[1], rank)
        if (slots, width) != tuple(self.A.shape[:2]):
            A = self.A.new_zeros(slots, width, self.A.shape[2])
            B = self.B.new_zeros(slots, self.B.shape[1], width)
            A[:self.A.shape[0], :self.A.shape[1]] = self.A
            B[:self.B.shape[0], :, :self.B.shape[2]] = self.B
            self.A, self.B = A, B
        self.A[slot].zero_()
        self.B[slot].zero_()
        if a is not None:
            self.A[slot, :rank] = a.to(self.A)
            self.B[slot, :, :rank] = b.to(self.B)


class AdapterBank:
    """The adapters of one base model. ``rows`` (B,) is set by the engine before each forward (None: base only)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.rows: torch.Tensor | None = None
        self.groups: list[tuple[int, torch.Tensor]] = []  # (slot, its rows) of the next forward, slot 0 left out
        self.mode = "grouped"  # or "gather" (module docstring)
        self.slots: dict[str, int] = {}  # adapter ref -> slot (1 ..)
        self.layers: dict[str, MultiLoRALinear] = {}  # module name in the model -> its layer
        self.lock = threading.Lock()  # held by the engine around each forward and by add/remove

    def add(self, ref: str, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Load ``adapters`` (module name -> (A (r, in), B·alpha/r (out, r))) into a free slot; its number."""
        with self.lock:
            used = set(self.slots.values())
            slot = next(s for s in range(1, len(used) + 2) if s not in used)
            for name, (a, b) in adapters.items():
                self._layer(name).put(slot, a, b)
            for name, layer in self.layers.items():  # every layer has every slot (zeros where not adapted)
                if name not in adapters:
                    layer.put(slot, None, None)
            self.slots[ref] = slot
            return slot

    def remove(self, ref: str) -> None:
        with self.lock:
            slot = self.slots.pop(ref, None)
            if slot is not None:
                for layer in self.layers.values():
                    layer.put(slot, None, None)

    def select(self, slots: list[int]) -> None:
        """The slot of every row of the next forward (the engine thread, under ``lock``)."""
        if not any(slots):
            self.rows, self.groups = None, []
            return
        device = next(self.model.parameters()).device
        self.rows = torch.tensor(slots, device=device)
        self.groups = [(s, torch.tensor([i for i, t in enumerate(slots) if t == s], device=device))
                       for s in sorted(set(slots) - {0})]

    def nbytes(self) -> int:
        # A snapshot: /metrics and status read this while add() (a worker thread) may be inserting layers.
        return sum(layer.A.nbytes + layer.B.nbytes for layer in list(self.layers.values()))

    def _layer(self, name: str) -> MultiLoRALinear:
        layer = self.layers.get(name)
        if layer is None:
            parent_name, _, child = name.rpartition(".")
            parent = self.model.get_submodule(parent_name)
            layer = MultiLoRALinear(getattr(parent, child), self)
            slots = max(self.slots.values(), default=0)
            if slots:
                layer.put(slots, None, None)  # as many slots as the other layers
            setattr(parent, child, layer)
            self.layers[name] = layer
        return layer


def lora_tensors(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A loaded LoRA model's adapters: module name -> (A, B scaled by alpha / r)."""
    return {name: (m.lora_A.detach().clone(), (m.lora_B.detach().float() * m.scaling).to(m.lora_B.dtype))
            for name, m in lora_modules(model).items()}
