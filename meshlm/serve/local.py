"""A registered checkpoint as a backend: verified against the registry, loaded once, served by a BatchEngine.

Requests are encoded here: chats through the checkpoint's chat template (meshlm's own, or the HF Jinja template a
converted checkpoint carries), completions as bos + text (or the given token ids). Chats also stop at the
template's end-of-turn token. Length checks happen before anything is queued, so a request that cannot fit the
context is a 400, never a failure halfway. An adapter version (:class:`AdapterBackend`) is a slot of its base's
adapter bank: its requests go to the base's engine, tagged with the slot.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import torch

from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256
from meshlm.data.posttrain.templates import chat_template_for
from meshlm.errors import CheckpointError, UserError
from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
from meshlm.serve.engine import BatchEngine, Sequence
from meshlm.serve.grammar import GrammarEngine
from meshlm.serve.multilora import AdapterBank, lora_tensors
from meshlm.serve.protocol import ApiError, Delta, Event, Failed, Finished, Job
from meshlm.serve.registry import ModelVersion, verify_files
from meshlm.serve.tools import encode_with_tools
from meshlm.tokenizer import MeshTokenizer


class Mailbox:
    """Events from the engine thread to the event loop with one loop wake-up per batch of events (a decode step
    posts one per active row), not one per event: the loop's per-token work is what limits many streams."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._posted: list[tuple[LocalHandle, Event]] = []

    def post(self, handle: LocalHandle, event: Event) -> None:  # engine thread
        with self._lock:
            self._posted.append((handle, event))
            first = len(self._posted) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
                pass

    def _deliver(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
        for handle, event in posted:
            handle.inbox.append(event)
            handle.ready.set()


class LocalHandle:
    """Events of one sequence. Text deltas that arrived together are sent as one (fewer, larger SSE chunks when
    the client or the loop falls behind the engine; token counts are unaffected)."""

    def __init__(self, engine: BatchEngine, mailbox: Mailbox) -> None:
        self._engine, self._mailbox = engine, mailbox
        self.inbox: list[Event] = []
        self.ready = asyncio.Event()
        self.seqs: list[Sequence] = []

    def put(self, event: Event) -> None:  # engine thread
        self._mailbox.post(self, event)

    async def events(self) -> AsyncIterator[Event]:
        """Until every choice has finished (or one failed)."""
        running = len(self.seqs)
        while True:
            await self.ready.wait()
            self.ready.clear()
            batch, self.inbox = self.inbox, []
            for event in _coalesce(batch):
                yield event
                running -= isinstance(event, Finished)
                if isinstance(event, Failed) or running == 0:
                    return

    def cancel(self) -> None:
        for seq in self.seqs:
            self._engine.cancel(seq)


def _coalesce(events: list[Event]) -> list[Event]:
    """Consecutive deltas of one choice become one."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, Delta) and isinstance(last, Delta) and last.index == event.index:
            out[-1] = Delta(last.text + event.text, event.index, last.logprobs + event.logprobs)
        else:
            out.append(event)
    return out


class LocalBackend:
    """One loaded checkpoint version."""

    def __init__(self, ref: str, model: torch.nn.Module, tokenizer, template, eos_ids: list[int],
                 chat_eos_ids: list[int], *, max_tokens_cap: int, max_batch: int, max_queue: int,
                 device: str, weights: str = "fp32") -> None:
        self.ref = ref
        self.tokenizer, self.template = tokenizer, template
        self.eos, self.chat_eos = frozenset(eos_ids), frozenset(chat_eos_ids)
        self.context = model.cfg.max_seq_len
        self.max_tokens_cap = max_tokens_cap
        self._mailbox: Mailbox | None = None
        self.grammar = GrammarEngine(tokenizer, sorted(self.eos | self.chat_eos))
        self.bank = AdapterBank(model)  # LoRA adapters served on this base (none until one is loaded)
        self.holders = 1  # this version's own deployment, plus one per adapter version served on it
        self.engine = BatchEngine(model, tokenizer, max_batch=max_batch, max_queue=max_queue, device=device,
                                  name=f"engine-{ref}", bank=self.bank, weights=weights)

    @classmethod
    def load(cls, entry: ModelVersion, *, device: str = "cpu", max_tokens_cap: int = 1024, max_batch: int = 16,
             max_queue: int = 64, weights: str = "fp32") -> LocalBackend:
        """Verify the files against the registry, load, and check the loaded weights' sha256 too (a LoRA
        checkpoint's base lives elsewhere; its change shows only there)."""
        folder = verify_files(entry)
        model, cfg, _, ckpt = model_from_checkpoint(folder, device)
        actual = weights_sha256(model)
        if actual != entry.weights_sha256:
            raise CheckpointError(f"{entry.ref}: the loaded weights hash to {actual[:12]}, the registry recorded "
                                  f"{str(entry.weights_sha256)[:12]} (a LoRA base changed?); register it again")
        model.requires_grad_(False)
        tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
        eos = checkpoint_eos_ids(ckpt, tokenizer.eos_id)
        end = tokenizer.special_ids.get("<|end|>")
        chat_eos = eos + ([end] if end is not None and end not in eos else [])
        return cls(entry.ref, model, tokenizer, chat_template_for(tokenizer, ckpt), eos, chat_eos,
                   max_tokens_cap=max_tokens_cap, max_batch=max_batch, max_queue=max_queue, device=device,
                   weights=weights)

    async def submit(self, job: Job, adapter: int = 0) -> LocalHandle:
        prompt = self._encode(job)
        max_new = self._max_new(len(prompt), job.sampling.max_tokens, "messages" if job.kind == "chat" else "prompt")
        loop = asyncio.get_running_loop()
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._mailbox = Mailbox(loop)
        self._check_bias(job.sampling)
        handle = LocalHandle(self.engine, self._mailbox)
        eos = self.chat_eos if job.kind == "chat" else self.eos
        echo = self._echo_text(job, prompt) if job.sampling.echo else None
        masks = self.grammar.masks(job.response_format, job.sampling.n) if job.response_format else None
        handle.seqs = self.engine.submit_choices(prompt, max_new, job.sampling, eos, handle.put, echo=echo,
                                                 masks=masks, adapter=adapter)
        return handle

    def status(self) -> dict[str, Any]:
        return {"kind": "checkpoint", "context": self.context, **self.engine.status()}

    async def aclose(self) -> None:
        """Release one holder; the engine stops (after its in-flight requests) when none is left."""
        self.holders -= 1
        if self.holders <= 0:
            await anyio.to_thread.run_sync(self.engine.close)

    @property
    def closed(self) -> bool:
        return self.holders <= 0

    # --- request checks ----------------------------------------------------------------------------------------
    def _encode(self, job: Job) -> list[int]:
        tok = self.tokenizer
        if job.kind == "chat":
            try:
                if job.tools is not None:
                    self._check_no_specials(job.tools)
                    return encode_with_tools(self.template, job.messages, job.tools, "messages")
                return self.template.encode_prompt(job.messages, where="messages")
            except UserError as exc:  # e.g. an HF template that refuses a role order
                raise ApiError(400, f"the chat template refused these messages ({type(exc).__name__})",
                               param="messages") from None
        if isinstance(job.prompt, list):
            bad = [t for t in job.prompt if not 0 <= t < tok.vocab_size]
            if bad:
                raise ApiError(400, f"prompt token id {bad[0]} is outside the vocabulary [0, {tok.vocab_size})",
                               param="prompt")
            ids = list(job.prompt)
        else:
            ids = tok.prompt_ids(job.prompt)  # bos only where the tokenizer adds one
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        return ids

    def _check_no_specials(self, tools: list[dict[str, Any]]) -> None:
        """Tool definitions reach the template as markup: a special token's text inside them would become that
        token (a forged end of turn), so refuse it."""
        text = json.dumps(tools, ensure_ascii=False)
        if any(s in text for s in self.tokenizer.special_ids):
            raise ApiError(400, "tools: a tool definition contains a special token's text", param="tools")

    def _check_bias(self, sampling) -> None:
        bad = [t for t, _ in sampling.logit_bias if not 0 <= t < self.tokenizer.vocab_size]
        if bad:
            raise ApiError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary [0, "
                                f"{self.tokenizer.vocab_size})", param="logit_bias")

    def _echo_text(self, job: Job, prompt: list[int]) -> str:
        """The prompt as the client sent it (text), or its ids decoded."""
        return job.prompt if isinstance(job.prompt, str) else self.tokenizer.decode(prompt, skip_special_tokens=True)

    def _max_new(self, prompt_len: int, max_tokens: int | None, prompt_param: str) -> int:
        if max_tokens is not None and max_tokens > self.max_tokens_cap:
            raise ApiError(400, f"max_tokens {max_tokens} is above this server's cap of {self.max_tokens_cap}",
                           param="max_tokens", code="max_tokens_above_cap")
        if prompt_len >= self.context or (max_tokens is not None and prompt_len + max_tokens > self.context):
            raise ApiError(400, f"this model's context is {self.context} tokens; the prompt has {prompt_len} and "
                                f"{max_tokens or 1} or more were asked for: shorten the prompt or lower max_tokens",
                           param=prompt_param, code="context_length_exceeded")
        return max_tokens if max_tokens is not None else min(self.max_tokens_cap, self.context - prompt_len)


class AdapterBackend:
    """A LoRA adapter version served on its loaded base: its rows decode in the base's batch, beside the base's
    own rows and other adapters' (meshlm/serve/multilora.py)."""

    def __init__(self, ref: str, base: LocalBackend, slot: int) -> None:
        self.ref, self.base, self.slot = ref, base, slot

    @classmethod
    def load(cls, entry: ModelVersion, base: LocalBackend) -> AdapterBackend:
        """Verify the adapter's files and weights against the registry, then load its tensors into a slot."""
        if entry.adapter is None or entry.adapter.get("base_weights_sha256") is None:
            raise CheckpointError(f"{entry.ref}: not an adapter version")
        folder = verify_files(entry)
        model, _, _, _ = model_from_checkpoint(folder, "cpu")
        actual = weights_sha256(model)
        if actual != entry.weights_sha256:
            raise CheckpointError(f"{entry.ref}: base + adapter hash to {actual[:12]}, the registry recorded "
                                  f"{str(entry.weights_sha256)[:12]} (its base changed?); register it again")
        tensors = lora_tensors(model)
        del model
        base.holders += 1
        return cls(entry.ref, base, base.bank.add(entry.ref, tensors))

    async def submit(self, job: Job) -> LocalHandle:
        return await self.base.submit(job, adapter=self.slot)

    def status(self) -> dict[str, Any]:
        return {"kind": "adapter", "base": self.base.ref, "slot": self.slot, "adapters_on_base":
                len(self.base.bank.slots), "adapter_bytes_on_base": self.base.bank.nbytes(),
                **self.base.engine.status()}

    async def aclose(self) -> None:
        """Called once nothing routes to this version any more: wait for its queued and in-flight rows (they decode
        with its slot to the end), then free the slot and release the base."""
        await anyio.to_thread.run_sync(self.base.engine.drain, self.slot)
        await anyio.to_thread.run_sync(self.base.bank.remove, self.ref)
        await self.base.aclose()
