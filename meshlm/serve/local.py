"""A registered checkpoint as a backend: verified against the registry, loaded once, served by a BatchEngine.

Requests are encoded here: chats through the checkpoint's chat template (meshlm's own, or the HF Jinja template a
converted checkpoint carries), completions as bos + text (or the given token ids). Chats also stop at the
template's end-of-turn token. Length checks happen before anything is queued, so a request that cannot fit the
context is a 400, never a failure halfway. An adapter version (:class:`AdapterBackend`) is a slot of its base's
adapter bank: its requests go to the base's engine, tagged with the slot.

Checks run cheapest first (docs/serving.md, "Order of checks"): integer limits, then a prompt whose characters
alone prove it cannot fit (no token is longer than the tokenizer's longest, so ``chars / longest`` tokens at
least), then the schema compile and the tokenising, in a worker thread under a time budget
(:data:`PREPARE_BUDGET_S`, :data:`PREPARE_THREADS` at a time per model), and last the exact token count.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import torch
from anyio import CapacityLimiter

from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256
from meshlm.data.posttrain.templates import chat_template_for
from meshlm.errors import CheckpointError, UserError
from meshlm.generate.stops import stop_ids
from meshlm.serve.engine import BatchEngine, Sequence
from meshlm.serve.grammar import GrammarEngine
from meshlm.serve.multilora import AdapterBank, lora_tensors
from meshlm.serve.protocol import ApiError, Delta, Event, Failed, Finished, Job
from meshlm.serve.registry import ModelVersion, verify_files
from meshlm.serve.tools import encode_with_tools
from meshlm.tokenizer import MeshTokenizer

PREPARE_BUDGET_S = 10.0  # schema compile + tokenising of one request, waiting for a worker included
PREPARE_THREADS = 2  # requests of one model prepared at once (a flood of big prompts waits, within its budget)
MAX_UNREAD_EVENTS = 1024  # a stream's events its client has not taken yet; beyond: the client stopped reading
MAX_UNREAD_BYTES = 1 << 20  # ... or their estimated size (a token with 20 top log-probs holds about 5 KB)


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
            handle.receive(event)


class LocalHandle:
    """Events of one sequence. Text deltas that arrived together are sent as one (fewer, larger SSE chunks when
    the client or the loop falls behind the engine; token counts are unaffected).

    What a stream's client has not taken yet is bounded (``bounded``; a non-streamed answer is read as it comes):
    past :data:`MAX_UNREAD_EVENTS` events or :data:`MAX_UNREAD_BYTES` (estimated) the client has stopped reading
    (its socket is full): generation stops (``stalled``) and the events end with a 499 ``client_stopped_reading``
    error after what was already made."""

    def __init__(self, engine: BatchEngine, mailbox: Mailbox, bounded: bool = False) -> None:
        self._engine, self._mailbox, self.bounded = engine, mailbox, bounded
        self.inbox: list[Event] = []
        self.unread_bytes = 0
        self.stalled = False
        self.ready = asyncio.Event()
        self.seqs: list[Sequence] = []

    def put(self, event: Event) -> None:  # engine thread
        self._mailbox.post(self, event)

    def receive(self, event: Event) -> None:  # event loop
        if self.stalled:
            return
        self.inbox.append(event)
        self.unread_bytes += _size(event)
        if self.bounded and (len(self.inbox) > MAX_UNREAD_EVENTS or self.unread_bytes > MAX_UNREAD_BYTES):
            self.stalled = True
            self.cancel()
            self.inbox.append(Failed(ApiError(499, "the client stopped reading the stream; generation stopped",
                                              code="client_stopped_reading")))
        self.ready.set()

    async def events(self) -> AsyncIterator[Event]:
        """Until every choice has finished (or one failed)."""
        running = len(self.seqs)
        while True:
            await self.ready.wait()
            self.ready.clear()
            batch, self.inbox, self.unread_bytes = self.inbox, [], 0
            for event in _coalesce(batch):
                yield event
                running -= isinstance(event, Finished)
                if isinstance(event, Failed) or running == 0:
                    return

    def cancel(self) -> None:
        for seq in self.seqs:
            self._engine.cancel(seq)


def _size(event: Event) -> int:
    """A Delta's memory, roughly: its text, and per token log-prob an object of ~250 bytes per entry (the chosen
    token and each top alternative: a str, a bytes tuple, a float, a tuple)."""
    if not isinstance(event, Delta):
        return 200
    return 200 + len(event.text) + sum(250 * (1 + len(t.top)) for t in event.logprobs)


def _coalesce(events: list[Event]) -> list[Event]:
    """Consecutive deltas of one choice become one."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, Delta) and isinstance(last, Delta) and last.index == event.index:
            out[-1] = Delta(last.text + event.text, event.index, last.logprobs + event.logprobs,
                            last.tokens + event.tokens)
        else:
            out.append(event)
    return out


class LocalBackend:
    """One loaded checkpoint version."""

    def __init__(self, ref: str, model: torch.nn.Module, tokenizer, template, eos_ids: list[int],
                 chat_eos_ids: list[int], *, max_tokens_cap: int, max_batch: int, max_queue: int,
                 device: str, weights: str = "fp32", prefix_cache_bytes: int = 0, threads: int | None = None,
                 speculative: str | None = None) -> None:
        self.ref = ref
        self.tokenizer, self.template = tokenizer, template
        self.eos, self.chat_eos = frozenset(eos_ids), frozenset(chat_eos_ids)
        self.context = model.cfg.max_seq_len
        self.max_tokens_cap = max_tokens_cap
        self._mailbox: Mailbox | None = None
        self.grammar = GrammarEngine(tokenizer, sorted(self.eos | self.chat_eos))
        self.token_chars = longest_token_chars(tokenizer)
        self._prepare_slots = CapacityLimiter(PREPARE_THREADS)
        # Held by the worker thread itself: a request past its budget releases its limiter slot while its abandoned
        # worker runs on, and that work must still count against PREPARE_THREADS.
        self._prepare_running = threading.BoundedSemaphore(PREPARE_THREADS)
        self.bank = AdapterBank(model)  # LoRA adapters served on this base (none until one is loaded)
        self.holders = 1  # this version's own deployment, plus one per adapter version served on it
        self.engine = BatchEngine(model, tokenizer, max_batch=max_batch, max_queue=max_queue, device=device,
                                  name=f"engine-{ref}", bank=self.bank, weights=weights,
                                  prefix_cache_bytes=prefix_cache_bytes, threads=threads, speculative=speculative)

    @classmethod
    def load(cls, entry: ModelVersion, *, device: str = "cpu", max_tokens_cap: int = 1024, max_batch: int = 16,
             max_queue: int = 64, weights: str = "fp32", prefix_cache_bytes: int = 0,
             threads: int | None = None, speculative: str | None = None) -> LocalBackend:
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
        template = chat_template_for(tokenizer, ckpt)
        eos, chat_eos = stop_ids(tokenizer, ckpt, chat=False), stop_ids(tokenizer, ckpt, template=template)
        return cls(entry.ref, model, tokenizer, template, eos, chat_eos,
                   max_tokens_cap=max_tokens_cap, max_batch=max_batch, max_queue=max_queue, device=device,
                   weights=weights, prefix_cache_bytes=prefix_cache_bytes, threads=threads, speculative=speculative)

    async def submit(self, job: Job, adapter: int = 0) -> LocalHandle:
        param = "messages" if job.kind == "chat" else "prompt"
        self._check_cap(job.sampling.max_tokens)  # integers first: nothing is compiled, tokenised or allocated
        self._check_bias(job.sampling)
        self.engine.check_n(job.sampling.n)
        self._check_chars(job, param)
        prompt, masks = await self._prepare(job)
        max_new = self._max_new(len(prompt), job.sampling.max_tokens, param)
        loop = asyncio.get_running_loop()
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._mailbox = Mailbox(loop)
        handle = LocalHandle(self.engine, self._mailbox, bounded=job.body.get("stream") is True)
        eos = self.chat_eos if job.kind == "chat" else self.eos
        echo = self._echo_text(job, prompt) if job.sampling.echo else None
        handle.seqs = self.engine.submit_choices(prompt, max_new, job.sampling, eos, handle.put, echo=echo,
                                                 masks=masks, adapter=adapter)
        return handle

    async def _prepare(self, job: Job) -> tuple[list[int], list | None]:
        """The schema compiled, then the prompt tokenised, in a worker thread (the event loop keeps serving the
        other requests); ApiError 503 past :data:`PREPARE_BUDGET_S` (the worker finishes in the background, its
        work bounded by the character check, and keeps its slot until then)."""
        deadline = time.monotonic() + PREPARE_BUDGET_S

        def work() -> tuple[list[int], list | None] | None:
            if not self._prepare_running.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return None  # abandoned work still held every slot until the budget ran out
            try:
                masks = self.grammar.masks(job.response_format, job.sampling.n) if job.response_format else None
                return self._encode(job), masks
            finally:
                self._prepare_running.release()

        with anyio.move_on_after(PREPARE_BUDGET_S):
            prepared = await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=self._prepare_slots)
            if prepared is not None:
                return prepared
        raise ApiError(503, f"preparing the request took longer than {PREPARE_BUDGET_S:g} s (the server is busy "
                            "with large prompts); retry, or send a shorter prompt", type="server_error",
                       code="prepare_budget_exceeded", retry_after=1)

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

    def _check_cap(self, max_tokens: int | None) -> None:
        if max_tokens is not None and max_tokens > self.max_tokens_cap:
            raise ApiError(400, f"max_tokens {max_tokens} is above this server's cap of {self.max_tokens_cap}",
                           param="max_tokens", code="max_tokens_above_cap")

    def _check_chars(self, job: Job, param: str) -> None:
        """context_length_exceeded for a prompt whose length alone proves it cannot fit: text of ``chars``
        characters is at least ``chars / token_chars`` tokens (token ids: one each), before any tokenising."""
        room = self.context - (job.sampling.max_tokens or 1)
        if isinstance(job.prompt, list):
            size, most, unit = len(job.prompt), room, "token ids"
        else:
            texts = [m.get("content") or "" for m in job.messages] if job.kind == "chat" else [job.prompt or ""]
            size, most, unit = sum(len(t) for t in texts), room * self.token_chars, "characters"
        if size > most:
            raise ApiError(400, f"this model's context is {self.context} tokens and {job.sampling.max_tokens or 1} "
                                f"or more were asked for; the prompt has {size} {unit}, more than {max(room, 0)} "
                                f"tokens can hold (no token here is longer than {self.token_chars} characters): "
                                "shorten the prompt or lower max_tokens", param=param, code="context_length_exceeded")

    def _max_new(self, prompt_len: int, max_tokens: int | None, prompt_param: str) -> int:
        if prompt_len >= self.context or (max_tokens is not None and prompt_len + max_tokens > self.context):
            raise ApiError(400, f"this model's context is {self.context} tokens; the prompt has {prompt_len} and "
                                f"{max_tokens or 1} or more were asked for: shorten the prompt or lower max_tokens",
                           param=prompt_param, code="context_length_exceeded")
        return max_tokens if max_tokens is not None else min(self.max_tokens_cap, self.context - prompt_len)


def longest_token_chars(tokenizer: MeshTokenizer) -> int:
    """Characters of prompt text one token can cover at most: the longest vocabulary entry (a byte-level entry
    has one character per byte, so the text it decodes to is no longer). A normalizer may shorten text before it
    is split (NFKC composes up to 3 characters into one), so then 3× that."""
    longest = max((len(t) for t in tokenizer.backend.get_vocab(with_added_tokens=True)), default=1)
    return longest * (3 if tokenizer.backend.normalizer is not None else 1)


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
