"""Continuous batching over one KV cache: every active sequence advances by one token per model forward.

Layout (as in meshlm/generate/rollout.py): the batch shares one slot axis; row b holds pads, then its real tokens
contiguous up to the shared ``cursor``. RoPE positions count each row's real tokens and ``padding_mask`` hides
the pads, so a row's logits are those it would get alone. A decode step writes slot ``cursor`` for every row.

Joining: waiting requests are prefilled together (left-padded to their longest prompt P, one forward) and merged
so that their last prompt token sits just before the cursor: the cursor moves to max(cursor, P), shifting
whichever side is shorter to the right. A request with ``n`` > 1 is ``n`` rows
that join together and share one prefill: the prompt is run once and its KV cache rows copied, then each row
samples with its own generator. Leaving: finished or cancelled rows are dropped after each step and the
slots every remaining row has as padding are cut from the left. A request joins only when the batch, laid out
this way, still fits the model's context (slot index < max_seq_len); otherwise it waits (first come, first
served). The engine runs in its own thread (torch releases the GIL in its kernels); results reach the asyncio side
through ``emit`` callbacks.

Speculation (``speculative="ngram"``, ``meshlm serve --speculative ngram``): while one row decodes alone, greedy or
sampled, a step may feed it several tokens — prompt-lookup drafts verified in one forward (``_draft``,
``_speculate``), each position's token picked by the row's own sampler as a plain step would — and move the cursor
by as many as it kept.

Failures are per request: whatever belongs to one row (its grammar, bias, sampling, text, callback) runs under a
guard that fails that row's request alone (``_fail_rows``); a failed prefill fails the requests joining in it.
Only an error of the batch's own forward fails every active row (``_fail_batch``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from meshlm.generate.decode import FastForward, fast_forward
from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import left_pad
from meshlm.generate.speculative import DraftBudget, check_speculative, ngram_draft, verified
from meshlm.generate.sampling import RowSampler, TokenMask, row_seed
from meshlm.models.llama import KVCache
from meshlm.serve.multilora import AdapterBank
from meshlm.serve.decode import TextStream, pick_tokens, prompt_logprobs, token_logprob
from meshlm.serve.memory import trim_heap
from meshlm.serve.prefix import PrefixCache
from meshlm.serve.protocol import ApiError, Delta, Event, Failed, Finished, TokenLogprob, overloaded
from meshlm.tokenizer import MeshTokenizer


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. ``emit`` is called from the engine thread."""

    prompt: list[int]
    max_new: int
    sampling: SamplingParams
    eos: frozenset[int]
    text: TextStream
    emit: Callable[[Event], None]
    sampler: RowSampler  # its generator (seeded), bias, penalties and grammar mask: the one sampler's row
    index: int = 0  # the choice of its request
    group: object | None = None  # shared by the n rows of one request: they are prefilled once
    echo: str | None = None  # completions with echo: the prompt's text, sent first
    adapter: int = 0  # the LoRA adapter's slot in the engine's AdapterBank (0: the base model)
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False
    unsent: list[TokenLogprob] = field(default_factory=list)  # log-probs of tokens whose text is not out yet
    sent_tokens: int = 0  # generated tokens whose text has been sent
    draft: DraftBudget = field(default_factory=DraftBudget)  # speculation: the next draft's length at most

    def accept(self, token: int, logprob: TokenLogprob | None = None) -> None:
        """Record a sampled token and send its text; finish on eos, a stop string or the token limit."""
        self.generated.append(token)
        self.sampler.observe(token)
        if logprob is not None:
            self.unsent.append(logprob)
        if token in self.eos:
            return self._finish("stop")
        delta = self.text.push(token)
        if delta:
            self.send(delta)
        if self.text.stopped or self.sampler.complete:
            return self._finish("stop")  # a stop string, or the grammar's value is complete
        if len(self.generated) >= self.max_new:
            self._finish("length")

    def send(self, text: str) -> None:
        logprobs, self.unsent = tuple(self.unsent), []
        tokens, self.sent_tokens = len(self.generated) - self.sent_tokens, len(self.generated)
        self.emit(Delta(text, self.index, logprobs, tokens))

    def _finish(self, reason: str) -> None:
        rest = self.text.flush()
        if rest or self.unsent:
            self.send(rest)
        self.done = True
        self.emit(Finished(reason, len(self.prompt), len(self.generated), self.index))


class BatchEngine:
    """A model behind a queue: ``submit`` enqueues (or refuses when the queue is full); one thread decodes."""

    def __init__(self, model: torch.nn.Module, tokenizer: MeshTokenizer, *, max_batch: int = 16,
                 max_queue: int = 64, device: str | torch.device = "cpu", name: str = "engine",
                 bank: AdapterBank | None = None, weights: str = "fp32", prefix_cache_bytes: int = 0,
                 threads: int | None = None, speculative: str | None = None) -> None:
        self.model, self.tokenizer, self.bank = model, tokenizer, bank
        # "ngram": a lone row verifies prompt-lookup drafts (meshlm/generate/speculative.py); see _draft
        check_speculative(speculative, SamplingParams(temperature=0.0), weights)
        self.speculative = speculative
        # the engine thread's torch threads (None: this thread's count now); see _run
        self.threads = threads or torch.get_num_threads()
        # prompts' keys and values kept for later prompts that start the same (0 bytes: off; meshlm/serve/prefix.py)
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        # last-position logits on packed weights (meshlm/generate/decode.py); int8: meshlm/generate/int8.py
        self._fast = fast_forward(model, weights)
        # Every pack that holds copies, made now (at load), not in the first request's time: the one-row (or int8)
        # decode pack and the prefill's (on a multi-core CPU the same column blocks, which also serve batches of 5+
        # rows; batches of 2-4 rows multiply the view pack: views of the weights, made when first used).
        # Their bytes beyond the model's own weights are reported in status() (and by `meshlm serve` at load).
        self.pack_bytes = self._fast.prepare(1) if isinstance(self._fast, FastForward) else 0
        self.max_batch, self.max_queue = max_batch, max_queue
        self.device = torch.device(device)
        self.context = model.cfg.max_seq_len
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id
        self._cond = threading.Condition()
        self._pending: deque[list[Sequence]] = deque()  # requests: the rows of one request join together
        self._rows: list[Sequence] = []
        self._joining: list[Sequence] = []  # taken from the queue, not yet in the batch (prefilling)
        self._closing = False
        # The batch (engine thread only): per-layer KV caches (B, Hkv, W, Dh), real-token mask (B, W), the next
        # RoPE position (B,) and the token to feed next (B,) of each row; ``cursor`` slots are filled.
        self._cache: list[KVCache] = []
        self._cursor = 0
        self._dense = True  # every row real from slot 0 (no padding mask needed)
        self._mask = self._pos = self._last = torch.empty(0)
        self._stats = {"requests": 0, "decode_steps": 0, "tokens": 0, "batch_rows": 0, "prefills": 0,
                       "prefill_rows": 0, "drafted": 0, "accepted": 0}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- the asyncio side --------------------------------------------------------------------------------------
    def submit(self, prompt: list[int], max_new: int, sampling: SamplingParams, eos: frozenset[int],
               emit: Callable[[Event], None]) -> Sequence:
        """One choice (``sampling.n`` is 1)."""
        assert sampling.n == 1
        return self.submit_choices(prompt, max_new, sampling, eos, emit)[0]

    def submit_choices(self, prompt: list[int], max_new: int, sampling: SamplingParams, eos: frozenset[int],
                       emit: Callable[[Event], None], *, echo: str | None = None,
                       masks: list[TokenMask] | None = None, adapter: int = 0) -> list[Sequence]:
        """``sampling.n`` rows of one prompt, each with its own generator (choice i: ``row_seed(seed, i)``; the
        eos ids end a row beside ``sampling.stop_ids``) and ``masks[i]``."""
        assert prompt and max_new >= 1 and len(prompt) + max_new <= self.context, "checked by the caller"
        self.check_n(sampling.n)
        group = object()
        eos = eos | frozenset(sampling.stop_ids)
        rows = [Sequence(prompt, max_new, sampling, eos, TextStream(self.tokenizer, sampling.stop), emit,
                         RowSampler(sampling, self.model.cfg.vocab_size, self.device, seed=row_seed(sampling.seed, i),
                                    mask=masks[i] if masks else None),
                         index=i, group=group, echo=echo, adapter=adapter)
                for i in range(sampling.n)]
        with self._cond:
            if self._closing:
                raise ApiError(503, "this model version is shutting down; retry", type="server_error",
                               code="unavailable", retry_after=1)
            if len(self._pending) >= self.max_queue:
                raise overloaded("the request queue")
            self._pending.append(rows)
            self._stats["requests"] += 1
            self._cond.notify()
        return rows

    def check_n(self, n: int) -> None:
        """ApiError 400 when ``n`` choices can never decode together here."""
        if n > self.max_batch:
            raise ApiError(400, f"n {n} is above this server's --max-batch of {self.max_batch}",
                           param="n", code="n_above_max_batch")

    def cancel(self, seq: Sequence) -> None:
        seq.cancelled = True  # the engine drops it before its next step (a plain flag: read under the GIL)

    def status(self) -> dict[str, Any]:
        with self._cond:
            stats = dict(self._stats)
            stats.update(active=len(self._rows), queued=len(self._pending), max_batch=self.max_batch,
                         max_queue=self.max_queue, pack_bytes=self.pack_bytes)
            if self.prefixes is not None:
                stats["prefix_cache"] = self.prefixes.status()
        steps = stats["decode_steps"]
        stats["mean_batch"] = round(stats.pop("batch_rows") / steps, 2) if steps else 0.0
        return stats

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the ones already in, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def drain(self, adapter: int, timeout: float | None = None) -> bool:
        """Wait until no queued, prefilling or active row uses ``adapter`` (its slot can then be freed); False on
        timeout."""
        def idle() -> bool:
            return not any(s.adapter == adapter for s in [*self._rows, *self._joining]) and \
                not any(s.adapter == adapter for rows in self._pending for s in rows)

        with self._cond:
            return self._cond.wait_for(idle, timeout)

    @property
    def busy(self) -> bool:
        return bool(self._rows or self._pending)

    # --- the engine thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        # A thread's first torch call starts with the process's default thread count, not its creator's: set it.
        # Serving, this is the one thread that should run multi-threaded ops (meshlm/cli/serve.py keeps the others
        # on one): with more OpenMP threads alive than cores, GNU OpenMP cuts its spin-wait, and every parallel op
        # then waits for a sleeping thread to wake (SmolLM2 int8 in an engine-like thread: 59 tokens/s with a
        # second thread's team alive, 126 without; docs/benchmarks.md, session 17).
        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._pending or self._rows or self._closing):
                        self._cond.wait()
                    if self._closing and not (self._pending or self._rows):
                        return
                    kept = deque(r for r in self._pending if not all(s.cancelled for s in r))
                    if len(kept) < len(self._pending):
                        self._cond.notify_all()  # a drain() waiting on a cancelled request's adapter
                    self._pending = kept
                    joining = self._joining = self._admissible()
                if joining:
                    try:
                        self._join(joining)
                    except Exception as exc:  # their prefill broke: fail them; the running batch is untouched
                        self._fail_rows(joining, exc)
                        with self._cond:
                            self._joining = []
                            self._cond.notify_all()
                if self._rows:
                    try:
                        self._step()
                    except Exception as exc:  # the batch's forward broke (a device error): no row to blame
                        self._fail_batch(exc)

    def _admissible(self) -> list[Sequence]:
        """Waiting sequences (first come, first served) that fit beside the active rows."""
        joining: list[Sequence] = []
        width = self._cursor if self._rows else 0
        need = max((s.max_new - len(s.generated) for s in self._rows), default=0)
        while self._pending and len(self._rows) + len(joining) + len(self._pending[0]) <= self.max_batch:
            seq = self._pending[0][0]
            new_width = max(width, len(seq.prompt))
            new_need = max(need, seq.max_new - 1)
            if new_width + new_need > self.context:
                break
            joining += self._pending.popleft()
            width, need = new_width, new_need
        return joining

    def _join(self, joining: list[Sequence]) -> None:
        """Prefill ``joining`` together (one row per request), copy the rows of requests with n > 1, sample their
        first tokens and merge them into the batch. Prompts that start with a kept prompt prefill only the rest
        (:mod:`meshlm.serve.prefix`)."""
        first: dict[int, int] = {}  # request (group) -> its prefill row
        row_of = [first.setdefault(id(s.group), len(first)) for s in joining]
        unique = [joining[row_of.index(r)] for r in range(len(first))]
        # the prompt's own logits only for echo with logprobs; every other prefill needs its last position only
        full = any(s.echo is not None and s.sampling.logprobs is not None for s in unique)
        net = self._forward(full=full)
        reuse = self.prefixes is not None and not full
        found = [self._kept(s) if reuse else None for s in unique]
        if any(f is not None for f in found):
            logits, cache, real = self._prefill_reusing(unique, found, net)  # (U, 1, V)
        else:
            logits, cache, real = self._prefill(unique, net)  # (U, P|1, V)
        if reuse:
            self._keep(unique, cache)
        self._stats["prefills"] += 1
        self._stats["prefill_rows"] += len(unique)
        if len(unique) < len(joining):  # n > 1: copy each request's KV rows to its other choices
            index = torch.tensor(row_of, device=self.device)
            cache = [_kv(c.k[index], c.v[index]) for c in cache]
            real = real[index]
        self._echo(joining, [logits[r] for r in row_of])
        self._merge(joining, cache, real)  # from here on the rows are in the batch: they fail one by one
        self._accept(joining, logits[row_of, -1], range(len(self._rows) - len(joining), len(self._rows)))

    def _prefill(self, rows: list[Sequence], net: Callable[..., torch.Tensor]):
        """One forward over ``rows``' prompts, left-padded: (logits, per-layer cache (R, Hkv, P, Dh), real (R, P))."""
        ids, real = left_pad([s.prompt for s in rows], self.pad_id, self.device)  # (R, P) each
        cache = self.model.new_cache(*ids.shape, device=self.device)
        positions = (real.long().cumsum(1) - 1).clamp(min=0)  # (R, P)
        with self._adapters(rows):
            logits = net(ids, cache=cache, start_pos=0, position_ids=positions, padding_mask=real)
        return logits, cache, real

    def _prefill_reusing(self, unique: list[Sequence], found: list, net: Callable[..., torch.Tensor]):
        """As :meth:`_prefill` with the last position's logits only (U, 1, V): prompts without a kept prefix
        prefill together as usual, each one with a kept prefix copies it and runs only its remaining tokens."""
        _, real = left_pad([s.prompt for s in unique], self.pad_id, self.device)
        P = real.shape[1]
        cache = self.model.new_cache(len(unique), P, device=self.device)
        last: list[torch.Tensor] = [torch.empty(0)] * len(unique)
        cold = [u for u, f in enumerate(found) if f is None]
        if cold:
            logits, part, _ = self._prefill([unique[u] for u in cold], net)
            W = part[0].k.shape[2]
            for i, u in enumerate(cold):
                for c, p in zip(cache, part):
                    c.k[u, :, P - W:], c.v[u, :, P - W:] = p.k[i], p.v[i]
                last[u] = logits[i, -1:]
        for u, f in enumerate(found):
            if f is None:
                continue
            kept, keys, values = f
            prompt = unique[u].prompt
            one = self.model.new_cache(1, len(prompt), device=self.device)
            for c, k, v in zip(one, keys, values):
                c.k[0, :, :kept], c.v[0, :, :kept] = k, v
            rest = torch.tensor([prompt[kept:]], dtype=torch.long, device=self.device)
            with self._adapters([unique[u]]):
                logits = net(rest, cache=one, start_pos=kept)
            for c, o in zip(cache, one):
                c.k[u, :, P - len(prompt):], c.v[u, :, P - len(prompt):] = o.k[0], o.v[0]
            last[u] = logits[0, -1:]
        return torch.stack(last), cache, real

    def _kept(self, seq: Sequence):
        """The longest kept prefix of ``seq``'s prompt (PrefixCache.find), or None: rows of a LoRA adapter prefill
        whole, and a failing lookup costs the request its reuse, never its answer (counted as an error)."""
        if seq.adapter != 0:
            return None
        try:
            return self.prefixes.find(seq.prompt)
        except Exception:  # noqa: BLE001 - the cache is a speed-up; the request prefills whole instead
            self.prefixes.stats["errors"] += 1
            return None

    def _keep(self, rows: list[Sequence], cache: list[KVCache]) -> None:
        """Keep each base row's prompt keys and values (right-aligned in ``cache``); a failure to keep one (memory)
        is counted, never passed to the requests."""
        P = cache[0].k.shape[2]
        for u, seq in enumerate(rows):
            if seq.adapter != 0:
                continue
            n = len(seq.prompt)
            try:
                self.prefixes.store(seq.prompt, [c.k[u, :, P - n:] for c in cache], [c.v[u, :, P - n:] for c in cache])
            except Exception:  # noqa: BLE001 - as in _kept
                self.prefixes.stats["errors"] += 1

    def _echo(self, joining: list[Sequence], logits: list[torch.Tensor]) -> None:
        """Send the prompt first (completions with echo), with its tokens' log-probs when asked for."""
        for seq, row in zip(joining, logits):
            if seq.echo is None:
                continue
            try:
                k = seq.sampling.logprobs
                if k is not None:
                    infos = [(None, [])] + prompt_logprobs(row[-len(seq.prompt):], seq.prompt, k)
                    seq.unsent = [token_logprob(self.tokenizer, t, info) for t, info in zip(seq.prompt, infos)]
                seq.send(seq.echo)
            except Exception as exc:
                self._fail_rows([seq], exc)

    def _merge(self, joining: list[Sequence], cache: list[KVCache], real: torch.Tensor) -> None:
        G, P = real.shape
        old = len(self._rows)
        cursor = max(self._cursor if old else 0, P)
        width = cursor + max(s.max_new for s in [*self._rows, *joining])  # >= what any row still writes
        width = min(width, self.context)
        shift_old, shift_new = cursor - (self._cursor if old else 0), cursor - P
        merged = []
        for layer, new in enumerate(cache):
            k = new.k.new_zeros((old + G, *new.k.shape[1:2], width, new.k.shape[3]))  # (B, Hkv, W, Dh)
            v = torch.zeros_like(k)
            if old:
                k[:old, :, shift_old:cursor] = self._cache[layer].k[:, :, :self._cursor]
                v[:old, :, shift_old:cursor] = self._cache[layer].v[:, :, :self._cursor]
            k[old:, :, shift_new:cursor] = new.k
            v[old:, :, shift_new:cursor] = new.v
            merged.append(_kv(k, v))
        mask = torch.zeros((old + G, width), dtype=torch.bool, device=self.device)
        if old:
            mask[:old, shift_old:cursor] = self._mask[:, :self._cursor]
        mask[old:, shift_new:cursor] = real
        pos = real.long().sum(1)  # (G,) next position = number of real prompt tokens
        fresh = torch.zeros(G, dtype=torch.long, device=self.device)
        pos, last = (torch.cat([self._pos, pos]), torch.cat([self._last, fresh])) if old else (pos, fresh)
        # Nothing above changed the batch (an allocation failing there fails the joining rows only).
        self._cache, self._mask, self._cursor, self._pos, self._last = merged, mask, cursor, pos, last
        self._dense = bool(mask[:, :cursor].all())
        with self._cond:
            self._rows, self._joining = [*self._rows, *joining], []

    def _step(self) -> None:
        """One decode step for every active row (or, for a lone row, a verified draft: :meth:`_speculate`)."""
        draft = self._draft()
        if draft:
            return self._speculate(self._rows[0], draft)
        cur = self._cursor
        self._mask[:, cur] = True
        with self._adapters(self._rows):
            net = self._forward()
            if self._dense:  # no row has padding (e.g. a single row): slot == position, the plain causal path
                logits = net(self._last[:, None], cache=self._cache, start_pos=cur)  # (B, 1, V)
            else:
                logits = net(self._last[:, None], cache=self._cache, start_pos=cur, position_ids=self._pos[:, None],
                             padding_mask=self._mask[:, :cur + 1])
        self._cursor, self._pos = cur + 1, self._pos + 1
        self._stats["decode_steps"] += 1
        self._stats["batch_rows"] += len(self._rows)
        self._accept(self._rows, logits[:, -1], range(len(self._rows)))

    def _draft(self) -> list[int]:
        """Prompt-lookup draft tokens for the next forward (meshlm/generate/speculative.py ``ngram_draft``), or []:
        only with ``speculative`` on, one row decoding without padding on the fast path, and a row whose logits are
        the model's own (no logit bias, penalties or grammar) and that asks for no log-probs, so that the verified
        tokens are the ones the plain steps would pick. A draft never runs past the row's token limit or the
        batch's slots."""
        if not self.speculative or len(self._rows) != 1 or not self._dense or self._forward() is not self._fast:
            return []
        seq = self._rows[0]
        if seq.done or seq.sampler.changes_logits or seq.sampling.logprobs is not None:
            return []
        room = min(seq.max_new - len(seq.generated), self._mask.shape[1] - self._cursor) - 1
        return ngram_draft(seq.prompt + seq.generated, min(seq.draft.size, room))

    def _speculate(self, seq: Sequence, draft: list[int]) -> None:
        """One forward of the row's last token and ``draft``: the row's pick after each, the draft kept up to its
        first token that differs from the pick, then that pick (speculative.py ``verified``), each token through the
        row's own ``accept`` (eos, stop strings, the limit end it as in a plain step). Slots written for rejected
        draft tokens lie at and beyond the new cursor: the next forward overwrites them."""
        cur = self._cursor
        tokens = torch.tensor([[int(self._last[0]), *draft]], dtype=torch.long, device=self.device)  # (1, 1 + k)
        logits = self._fast(tokens, cache=self._cache, start_pos=cur, all_positions=True)  # (1, 1 + k, V)
        vocab = self.tokenizer.vocab_size  # sliced as pick_tokens does, so both paths sample the same operands
        try:
            emitted = verified(logits[0, :, :vocab], draft, seq.sampler, None)
        except Exception as exc:  # the row's sampling broke: it fails alone, as in _accept
            self._fail_rows([seq], exc)
            return self._retire()
        self._stats["decode_steps"] += 1
        self._stats["batch_rows"] += 1
        self._stats["drafted"] += len(draft)
        seq.draft.update(len(draft), len(emitted) - 1)
        fed = 0  # tokens emitted: the row's cache now holds its last token and the first fed - 1 of them
        for i, token in enumerate(emitted):
            fed += 1
            self._stats["accepted"] += i < len(emitted) - 1  # an emitted draft token (the last pick is the row's own)
            self._last[0] = token
            self._stats["tokens"] += 1
            try:
                seq.accept(token)
            except Exception as exc:
                self._fail_rows([seq], exc)
            if seq.done:
                break
        self._mask[:, cur:cur + fed] = True
        self._cursor, self._pos = cur + fed, self._pos + fed
        self._retire()

    def _forward(self, full: bool = False) -> Callable[..., torch.Tensor]:
        """The fast decode path, or the model's own forward where a caller needs every position's logits or LoRA
        adapters are loaded on this base (their per-row updates live in the model's layers, not in the packed
        weights)."""
        if full or (self.bank is not None and self.bank.layers):
            return self.model
        return self._fast

    @contextmanager
    def _adapters(self, rows: list[Sequence]) -> Iterator[None]:
        """Each row's LoRA adapter for one forward (nothing to do without an adapter bank)."""
        if self.bank is None:
            yield
            return
        with self.bank.lock:
            self.bank.select([s.adapter for s in rows])
            try:
                yield
            finally:
                self.bank.rows = None

    def _accept(self, rows: list[Sequence], logits: torch.Tensor, slots: range) -> None:
        """Each row takes its token; a row whose grammar, sampling or callback raises fails alone."""
        tokens, infos, failed = pick_tokens(logits, [s.sampler for s in rows], [s.sampling.logprobs for s in rows],
                                            self.tokenizer.vocab_size)
        # Counted before the rows hear their tokens: a client whose request just finished reads a status that
        # includes its last token (counting after raced the response: status lagged by a token).
        self._stats["tokens"] += len(rows) - len(failed)
        for row, (seq, token, info, slot) in enumerate(zip(rows, tokens, infos, slots)):
            self._last[slot] = token
            if seq.done:  # a choice of a request that failed in this step: it leaves below
                continue
            if row in failed:
                self._fail_rows([seq], failed[row])
                continue
            try:
                seq.accept(token, None if info is None else token_logprob(self.tokenizer, token, info))
            except Exception as exc:
                self._fail_rows([seq], exc)
        self._retire()

    def _retire(self) -> None:
        """Drop finished and cancelled rows; cut the slots that are padding in every remaining row."""
        keep = [i for i, s in enumerate(self._rows) if not (s.done or s.cancelled)]
        if len(keep) == len(self._rows):
            return
        with self._cond:
            self._rows = [self._rows[i] for i in keep]
            self._cond.notify_all()  # wakes drain() waiters (and the engine thread, which finds work as before)
        if not keep:
            self._cache = []
            self._cursor = 0
            trim_heap()  # the batch's caches are freed: hand the pages back while nothing decodes
            return
        index = torch.tensor(keep, device=self.device)
        mask = self._mask[index]
        first = int(mask[:, :self._cursor].long().argmax(1).min())  # earliest real slot of any row
        self._mask = mask[:, first:]
        self._cache = [_kv(c.k[index, :, first:], c.v[index, :, first:]) for c in self._cache]
        self._pos, self._last = self._pos[index], self._last[index]
        self._cursor -= first
        self._dense = bool(self._mask[:, :self._cursor].all())

    def _fail_rows(self, rows: list[Sequence], exc: Exception) -> None:
        """End these rows with an error of their own request (500 ``engine_error``); the other choices of their
        requests stop too (the request has failed). Rows in the batch leave at the next ``_retire``."""
        error = ApiError(500, f"generation failed ({type(exc).__name__}); the request was not completed",
                         type="server_error", code="engine_error")
        groups = {id(s.group) for s in rows}
        for seq in [*rows, *(s for s in self._rows if id(s.group) in groups)]:
            if seq.done:
                continue
            seq.done = True
            if seq in rows:
                try:
                    seq.emit(Failed(error))
                except Exception:  # its callback is what broke: nobody is left to tell
                    pass

    def _fail_batch(self, exc: Exception) -> None:
        """The batch's own forward failed: every active row fails and the batch starts afresh."""
        self._fail_rows(self._rows, exc)
        with self._cond:
            self._rows = []
            self._cond.notify_all()
        self._cache, self._cursor = [], 0
        trim_heap()


def _kv(k: torch.Tensor, v: torch.Tensor) -> KVCache:
    """A KVCache around existing tensors (the model's cache class; its constructor allocates)."""
    cache = KVCache.__new__(KVCache)
    cache.k, cache.v = k, v
    return cache
