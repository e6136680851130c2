"""The OpenAI fields over HTTP with the official client, each value checked against a direct computation on the
served model: log-probs and top log-probs (chat and completions, streamed or not) against log-softmax of one
plain forward, n > 1 (one prefill, independent seeded choices, usage summed), presence/frequency penalties and
logit_bias against a hand-written greedy loop with OpenAI's formula, stop strings that span tokens, echo.

The server runs in this process (uvicorn on 127.0.0.1, port 0, in a thread), so the test reads the very model the
engine decodes with; the client talks to it over a real socket."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass

import openai
import pytest
import torch

from meshlm.serve.decode import token_piece
from meshlm.serve.launch import ServeOptions, make_loader
from meshlm.serve.local import LocalBackend
from meshlm.serve.registry import Registry
from meshlm.serve.rollout import Router
from meshlm.serve.server import Server
from meshlm.serve.fixtures import random_checkpoints
from tests.test_registry import write_report

LOGPROB_TOL = 1e-4  # fp32: a batched decode step vs one full forward differ by float rounding only


class NullAudit:
    """The audit log is tested elsewhere (test_audit, test_serve); here records are kept in memory."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.lines: list[str] = []

    def append(self, record: dict) -> None:
        self.records.append(record)


@dataclass
class InProcess:
    url: str
    router: Router
    audit: NullAudit
    loop: asyncio.AbstractEventLoop

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def backend(self, ref: str) -> LocalBackend:
        return self.router.backends[ref]

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)


def start_in_process(registry: Registry, refs: list[str], admin_token: str | None = None, max_batch: int = 8):
    """A Server on a loop of its own thread; yields InProcess, then stops it."""
    import uvicorn

    load = make_loader(ServeOptions(str(registry.path), [], "", device="cpu", max_batch=max_batch, max_queue=32,
                                    max_tokens_cap=96), registry)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    router = Router(registry, load, registry.secret("user_hash_key"))
    for ref in refs:
        asyncio.run_coroutine_threadsafe(router.serve(ref), loop).result(120)
    audit = NullAudit()
    server = Server(router, audit, admin_token, log=audit.lines.append)  # the server's log lines, for debugging
    sock = socket.socket()
    # A fixed send buffer for the accepted connections (they inherit it): autotuned, the kernel's grows up to
    # tcp_wmem's 4 MB, which can hold a whole stream a test's client never reads, so the server would never see the
    # client stop reading (test_serve_isolation's bound on unread events).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    uv = uvicorn.Server(uvicorn.Config(server.app, log_level="warning", access_log=False, lifespan="off"))
    done = asyncio.run_coroutine_threadsafe(uv.serve(sockets=[sock]), loop)
    while not uv.started:
        time.sleep(0.01)
    running = InProcess(f"http://127.0.0.1:{sock.getsockname()[1]}", router, audit, loop)
    try:
        yield running
    finally:
        uv.should_exit = True
        done.result(60)
        asyncio.run_coroutine_threadsafe(router.aclose(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        sock.close()


def serve_tiny(tmp_path_factory, name: str):
    """One random tiny checkpoint registered as ``tiny:v1`` in a fresh registry (folder ``name``) and served by
    :func:`start_in_process`; yields InProcess, then stops the server and closes the registry. For the module
    fixtures of tests that need a served model, not what it learned (random weights)."""
    root = tmp_path_factory.mktemp(name)
    step1, = random_checkpoints(root / "run", steps=(1,))
    reg = Registry(root / "reg.sqlite")
    reg.add_checkpoint(step1, "tiny", write_report(root / "pass.json", True))
    yield from start_in_process(reg, ["tiny:v1"])
    reg.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory, "fields")


# --- direct computation on the served model ------------------------------------------------------------------
def model_logprobs(backend: LocalBackend, ids: list[int]) -> torch.Tensor:
    """(len(ids), V) log-softmax of one plain forward over ``ids``, restricted to the tokenizer's vocabulary."""
    with torch.inference_mode():
        logits = backend.engine.model(torch.tensor([ids]))[0].float()  # (T, V)
    return torch.log_softmax(logits[:, :backend.tokenizer.vocab_size], dim=-1)


def ids_of(backend: LocalBackend, pieces: list[bytes]) -> list[int]:
    """Token ids from the exact bytes the server returned (each token's bytes name it: the vocabulary's pieces)."""
    table: dict[bytes, int] = {}
    for t in range(backend.tokenizer.vocab_size):
        table.setdefault(bytes(token_piece(backend.tokenizer, t)[1]), t)
    return [table[p] for p in pieces]


def completion_prompt(backend: LocalBackend, text: str) -> list[int]:
    tok = backend.tokenizer
    return ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(text)


def greedy_reference(backend: LocalBackend, prompt: list[int], steps: int, presence=0.0, frequency=0.0,
                     bias: dict[int, float] | None = None) -> list[int]:
    """The greedy tokens with OpenAI's penalties and a logit bias, by a full forward each step."""
    ids, out = list(prompt), []
    counts = torch.zeros(backend.tokenizer.vocab_size)
    for _ in range(steps):
        logits = model_logprobs(backend, ids)[-1].clone()  # log-softmax shifts every logit equally: same argmax
        for t, b in (bias or {}).items():
            logits[t] += b
        logits -= counts * frequency + (counts > 0).float() * presence
        token = int(logits.argmax())
        out.append(token)
        ids.append(token)
        counts[token] += 1
        if token in backend.eos:
            break
    return out


# --- tests -----------------------------------------------------------------------------------------------------
def test_completion_logprobs_match_the_model(served):
    backend, client = served.backend("tiny:v1"), served.client()
    out = client.completions.create(model="tiny", prompt="The river", max_tokens=8, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    prompt = completion_prompt(backend, "The river")
    assert out.usage.prompt_tokens == len(prompt) and out.usage.completion_tokens == len(lp.tokens)
    pieces = [bytes(token_piece(backend.tokenizer, t)[1]) for t in range(backend.tokenizer.vocab_size)]
    generated = greedy_reference(backend, prompt, out.usage.completion_tokens)
    assert lp.tokens == [token_piece(backend.tokenizer, t)[0] for t in generated]
    ref = model_logprobs(backend, prompt + generated)
    for step, token in enumerate(generated):
        row = ref[len(prompt) - 1 + step]  # the position before the token predicts it
        assert abs(lp.token_logprobs[step] - float(row[token])) < LOGPROB_TOL
        top = torch.topk(row, 3)
        expected = {token_piece(backend.tokenizer, t)[0]: float(v) for t, v in zip(top.indices, top.values)}
        assert lp.top_logprobs[step].keys() == expected.keys()
        assert all(abs(lp.top_logprobs[step][k] - v) < LOGPROB_TOL for k, v in expected.items())
    assert len(set(pieces)) > backend.tokenizer.vocab_size - 10  # bytes identify tokens (ids_of relies on it)


def test_chat_logprobs_streamed_and_not_are_the_models(served):
    backend, client = served.backend("tiny:v1"), served.client()
    messages = [{"role": "user", "content": "Tell me a story"}]
    kw = dict(model="tiny", messages=messages, max_tokens=10, temperature=1.0, seed=5, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)
    ids = ids_of(backend, [bytes(c.bytes) for c in content])
    prompt = backend.template.encode_prompt(messages, where="messages")
    assert whole.usage.prompt_tokens == len(prompt)
    ref = model_logprobs(backend, prompt + ids)
    for step, (c, token) in enumerate(zip(content, ids)):  # sampled at T=1, reported under the model
        assert abs(c.logprob - float(ref[len(prompt) - 1 + step, token])) < LOGPROB_TOL
        row = ref[len(prompt) - 1 + step]
        top = ids_of(backend, [bytes(t.bytes) for t in c.top_logprobs])
        assert top == torch.topk(row, 2).indices.tolist()
        assert all(abs(t.logprob - float(row[i])) < LOGPROB_TOL for t, i in zip(c.top_logprobs, top))
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]  # same seed: the same sample
    assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, content)) < LOGPROB_TOL
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole.choices[0].message.content


def test_n_choices_share_one_prefill_and_follow_their_seeds(served):
    backend, client = served.backend("tiny:v1"), served.client()
    before = backend.engine.status()
    kw = dict(model="tiny", prompt="Once upon a time", max_tokens=12, temperature=1.5, seed=11, n=4, logprobs=0)
    first = client.completions.create(**kw)
    after = backend.engine.status()
    assert after["prefill_rows"] - before["prefill_rows"] == 1  # the prompt ran once for four choices
    again = client.completions.create(**kw)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert texts == [c.text for c in again.choices]  # same seed: every choice repeats
    assert len(set(texts)) > 1  # choice i has its own derived seed
    single = client.completions.create(**{**kw, "n": 1})
    assert single.choices[0].text == texts[0]  # choice 0 uses the request's seed itself
    prompt = completion_prompt(backend, "Once upon a time")
    assert first.usage.prompt_tokens == len(prompt)  # counted once
    assert first.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in first.choices)
    for choice in first.choices:  # each choice is a sample of the model: its log-probs are the model's
        ids = ids_of(backend, [t.encode("utf-8", "surrogateescape") for t in choice.logprobs.tokens]) \
            if all("\ufffd" not in t for t in choice.logprobs.tokens) else None
        if ids is None:
            continue
        ref = model_logprobs(backend, prompt + ids)
        for step, token in enumerate(ids):
            assert abs(choice.logprobs.token_logprobs[step] - float(ref[len(prompt) - 1 + step, token])) < LOGPROB_TOL
    streamed = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    by_index = {i: "".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == i)
                for i in range(4)}
    assert [by_index[i] for i in range(4)] == texts and streamed[-1].usage.completion_tokens == \
        first.usage.completion_tokens


def test_penalties_and_logit_bias_follow_openais_formula(served):
    backend, client = served.backend("tiny:v1"), served.client()
    prompt = completion_prompt(backend, "In the morning")
    for presence, frequency in ((0.0, 0.0), (1.5, 0.0), (0.0, 2.0), (-1.0, 0.5)):
        out = client.completions.create(model="tiny", prompt="In the morning", max_tokens=12, temperature=0,
                                        presence_penalty=presence, frequency_penalty=frequency, logprobs=0)
        expected = greedy_reference(backend, prompt, 12, presence, frequency)
        assert out.choices[0].logprobs.tokens == [token_piece(backend.tokenizer, t)[0] for t in expected], \
            (presence, frequency)
    plain = greedy_reference(backend, prompt, 4)
    banned = client.completions.create(model="tiny", prompt="In the morning", max_tokens=4, temperature=0,
                                       logit_bias={str(plain[0]): -100}, logprobs=0)
    expected = greedy_reference(backend, prompt, 4, bias={plain[0]: -100})
    assert expected[0] != plain[0]
    assert banned.choices[0].logprobs.tokens == [token_piece(backend.tokenizer, t)[0] for t in expected]
    word = backend.tokenizer.encode(" river")[0]
    forced = client.completions.create(model="tiny", prompt="In the morning", max_tokens=5, temperature=1.0,
                                       seed=1, logit_bias={str(word): 100}, logprobs=0)
    assert forced.choices[0].logprobs.tokens == [token_piece(backend.tokenizer, word)[0]] * 5
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logit_bias={"99999": 5})
    assert err.value.body["param"] == "logit_bias"


def test_stop_strings_across_tokens_and_echo(served):
    backend, client = served.backend("tiny:v1"), served.client()
    full = client.completions.create(model="tiny", prompt="The river", max_tokens=16, temperature=0, logprobs=0)
    tokens = full.choices[0].logprobs.tokens
    text = full.choices[0].text
    assert "".join(tokens) == text
    # A stop string made of the end of one token and the start of the next (both pieces non-empty).
    k = next(i for i in range(2, len(tokens) - 1) if len(tokens[i]) >= 2 and tokens[i + 1]
             and (tokens[i][-1] + tokens[i + 1][0]) not in "".join(tokens[:i]) + tokens[i][:-1])
    stop = tokens[k][-1] + tokens[k + 1][0]
    cut_at = len("".join(tokens[:k])) + len(tokens[k]) - 1
    assert text.find(stop) == cut_at
    for stream in (False, True):
        out = client.completions.create(model="tiny", prompt="The river", max_tokens=16, temperature=0, stop=[stop],
                                        stream=stream)
        got = "".join(c.choices[0].text for c in out) if stream else out.choices[0].text
        assert got == text[:cut_at]  # streamed: nothing that later turned out to be the stop string was sent
    echo = client.completions.create(model="tiny", prompt="The river", max_tokens=4, temperature=0, echo=True,
                                     logprobs=1)
    lp = echo.choices[0].logprobs
    assert echo.choices[0].text == "The river" + text[:len(echo.choices[0].text) - len("The river")]
    prompt = completion_prompt(backend, "The river")
    assert len(lp.tokens) == echo.usage.prompt_tokens + echo.usage.completion_tokens and lp.token_logprobs[0] is None
    ref = model_logprobs(backend, prompt)
    for t in range(1, len(prompt)):
        assert abs(lp.token_logprobs[t] - float(ref[t - 1, prompt[t]])) < LOGPROB_TOL
    streamed = client.completions.create(model="tiny", prompt="The river", max_tokens=4, temperature=0, echo=True,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == echo.choices[0].text


def test_audit_record_counts_every_choice(served):
    client = served.client()
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                         n=2, temperature=1.0, seed=3)
    record = next(r for r in served.audit.records if r["request_id"] == out.id)
    assert record["response"] == [c.message.content for c in out.choices]
    assert record["completion_tokens"] == out.usage.completion_tokens and record["prompt_tokens"] == \
        out.usage.prompt_tokens
    assert record["finish_reason"] == [c.finish_reason for c in out.choices]


def test_abandoned_prepare_work_still_counts_against_the_limit(monkeypatch):
    """A request past its prepare budget is a 503, but its worker runs on (abandon_on_cancel): the next requests
    must not start more than PREPARE_THREADS schema compiles beside it."""
    import anyio
    from anyio import CapacityLimiter
    from types import SimpleNamespace

    from meshlm.serve import local
    from meshlm.serve.protocol import ApiError

    monkeypatch.setattr(local, "PREPARE_BUDGET_S", 0.3)
    release, entered, lock = threading.Event(), [], threading.Lock()

    class Stuck:
        def masks(self, response_format, n):
            with lock:
                entered.append(n)
            release.wait(30)
            return None

    backend = SimpleNamespace(grammar=Stuck(), _encode=lambda job: [1],
                              _prepare_slots=CapacityLimiter(local.PREPARE_THREADS),
                              _prepare_running=threading.BoundedSemaphore(local.PREPARE_THREADS))
    job = SimpleNamespace(response_format={"type": "json_object"}, sampling=SimpleNamespace(n=1))

    async def wave(k: int) -> list[str]:
        codes: list[str] = []

        async def one() -> None:
            try:
                await LocalBackend._prepare(backend, job)
            except ApiError as error:
                codes.append(error.code)

        async with anyio.create_task_group() as tg:
            for _ in range(k):
                tg.start_soon(one)
        return codes

    try:
        first = anyio.run(wave, local.PREPARE_THREADS)  # both stuck past the budget, their workers abandoned
        second = anyio.run(wave, 2)  # the limiter's slots are free again; the workers are not
    finally:
        release.set()
    assert first == second == ["prepare_budget_exceeded"] * 2
    assert len(entered) == local.PREPARE_THREADS, entered
