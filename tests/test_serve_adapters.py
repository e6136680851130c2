"""Many LoRA adapters on one base: registered with --adapter-of (both hashes recorded, a foreign base refused),
served on the base loaded once, rows of different adapters and of the base decoding in one batch with the merged
models' output, and loaded and unloaded at runtime by rollout and rollback through the admin API without dropping
a request in flight."""

from __future__ import annotations

import threading
import time

import httpx2
import pytest
import torch

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.errors import CheckpointError
from meshlm.models.lora import merge_lora
from meshlm.serve.fixtures import random_adapter, random_checkpoints
from meshlm.serve.registry import Registry
from tests.test_registry import write_report
from tests.test_serve_fields import LOGPROB_TOL, completion_prompt, start_in_process

TOKEN = "adapter-test-token-0123456789"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    base, other = random_checkpoints(root / "base", steps=(1, 2))
    adapters = [random_adapter(base, root / "a1", seed=1, rank=4, targets=("q", "v", "down")),
                random_adapter(base, root / "a2", seed=2, rank=2, targets=("q", "k", "o", "up")),
                random_adapter(base, root / "a3", seed=3, rank=8, targets=("v", "gate"))]
    report = write_report(root / "pass.json", True)
    reg = Registry(root / "reg.sqlite")
    reg.add_checkpoint(base, "base", report)  # base:v1
    reg.add_checkpoint(other, "other", report)  # other:v1: different weights
    for path in adapters:
        reg.add_adapter(path, "assistant", "base:v1", report)  # assistant:v1..v3
    merged = []
    for path in adapters:
        model = model_from_checkpoint(path)[0]
        merge_lora(model)  # the reference: base + B A folded into the weights
        merged.append(model)
    for running in start_in_process(reg, ["base:v1", "assistant:v1"], admin_token=TOKEN):
        yield running, reg, adapters, merged
    reg.close()


def admin(running, path: str, body: dict) -> httpx2.Response:
    return httpx2.post(running.url + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)


def greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens of ``model`` by a full forward each step, with their log-probs."""
    ids, out, lps = list(prompt), [], []
    with torch.inference_mode():
        for _ in range(steps):
            logp = torch.log_softmax(model(torch.tensor([ids]))[0, -1].float(), dim=-1)
            token = int(logp.argmax())
            out.append(token)
            lps.append(float(logp[token]))
            ids.append(token)
    return out, lps


def test_registry_records_both_hashes_and_refuses_a_foreign_base(setup):
    _, reg, adapters, _ = setup
    entry = reg.get("assistant:v1")
    assert entry.kind == "adapter" and entry.adapter["of"] == "base:v1"
    assert entry.adapter["base_weights_sha256"] == reg.get("base:v1").weights_sha256
    assert len({reg.get(f"assistant:v{i}").adapter["adapter_sha256"] for i in (1, 2, 3)}) == 3
    with pytest.raises(CheckpointError, match="another model"):
        reg.add_adapter(adapters[0], "x", "other:v1")


def test_adapters_and_base_decode_in_one_batch_as_merged_models(setup):
    running, _, _, merged = setup
    # pinnable: the test asks for each version by name (a candidate is otherwise reached through the share only)
    assert admin(running, "/admin/rollout", {"name": "assistant", "version": 2, "share": 0.5,
                                             "pinnable": True}).status_code == 200
    base = running.backend("base:v1")
    assert running.backend("assistant:v2").base is base  # the base is loaded once
    prompt = completion_prompt(base, PROMPT)
    expected = {"base:v1": greedy(base.engine.model, prompt, 10), "assistant:v1": greedy(merged[0], prompt, 10),
                "assistant:v2": greedy(merged[1], prompt, 10)}
    assert len({tuple(t) for t, _ in expected.values()}) == 3  # the adapters change the output
    for mode in ("grouped", "gather"):  # the rows of each adapter together, or each row's A/B gathered (bmm)
        base.bank.mode = mode
        results, before = {}, base.engine.status()

        def ask(ref: str) -> None:
            results[ref] = running.client().completions.create(model=ref, prompt=PROMPT, max_tokens=10,
                                                               temperature=0, logprobs=0)

        threads = [threading.Thread(target=ask, args=(ref,)) for ref in (*expected, *expected)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        after = base.engine.status()
        for ref, (tokens, lps) in expected.items():
            got = results[ref].choices[0].logprobs
            assert len(got.tokens) == len(tokens)
            assert max(abs(a - b) for a, b in zip(got.token_logprobs, lps)) < LOGPROB_TOL, (mode, ref)  # rounding
        texts = [results[r].choices[0].text for r in expected]
        assert texts == [base.tokenizer.decode(t, skip_special_tokens=True) for t, _ in expected.values()], mode
        steps = after["decode_steps"] - before["decode_steps"]
        assert steps < 6 * 10 and after["mean_batch"] > 1  # rows of the three models shared decode steps
    base.bank.mode = "grouped"


def test_runtime_load_and_unload_keep_requests_in_flight(setup):
    running, _, _, merged = setup
    base = running.backend("base:v1")
    prompt = completion_prompt(base, PROMPT)
    alone = base.tokenizer.decode(greedy(merged[0], prompt, 40)[0], skip_special_tokens=True)
    # Each forward of the base waits 50 ms while the admin calls run, so v1's stream is surely still decoding
    # when v1 stops being routed to (on a tiny model 40 tokens otherwise end before the first admin call).
    slow = base.engine.model.register_forward_pre_hook(lambda *_: time.sleep(0.05))
    stream = running.client().completions.create(model="assistant:v1", prompt=PROMPT, max_tokens=40, temperature=0,
                                                 stream=True)
    first = next(iter(stream)).choices[0].text
    # v2 is the candidate (whether or not the batch test above ran first, on this worker or another)
    assert admin(running, "/admin/rollout", {"name": "assistant", "version": 2, "share": 0.5}).status_code == 200
    # While it decodes: v2 becomes stable (v1 kept for a rollback), then v3 (loaded now) replaces it, so v1 is
    # no longer needed and is unloaded once its stream is done.
    assert admin(running, "/admin/promote", {"name": "assistant"}).status_code == 200
    assert admin(running, "/admin/rollout", {"name": "assistant", "version": 3, "share": 1.0}).status_code == 200
    assert admin(running, "/admin/promote", {"name": "assistant"}).status_code == 200
    assert base.engine.busy  # v1's row still decoding: its slot must outlive the promote that retired v1
    slow.remove()
    text = first + "".join(c.choices[0].text for c in stream)
    assert text == alone  # finished on v1's adapter, untouched by the loads beside it
    deadline = threading.Event()
    for _ in range(100):
        if "assistant:v1" not in base.bank.slots:
            break
        deadline.wait(0.1)
    assert "assistant:v1" not in base.bank.slots and set(base.bank.slots) == {"assistant:v2", "assistant:v3"}
    out = running.client().completions.create(model="assistant", prompt=PROMPT, max_tokens=6, temperature=0)
    assert out.system_fingerprint == "assistant:v3"
    assert out.choices[0].text == base.tokenizer.decode(greedy(merged[2], prompt, 6)[0], skip_special_tokens=True)
    assert admin(running, "/admin/rollback", {"name": "assistant"}).status_code == 200  # back to v2, still loaded
    back = running.client().completions.create(model="assistant", prompt=PROMPT, max_tokens=6, temperature=0)
    assert back.system_fingerprint == "assistant:v2"
    models = {m["id"]: m for m in httpx2.get(running.url + "/v1/models").json()["data"]}
    assert models["assistant:v2"]["parent"] == "base:v1" and "assistant:v1" not in models
    with pytest.raises(Exception) as err:
        running.client().completions.create(model="assistant:v1", prompt=PROMPT, max_tokens=2)
    assert getattr(err.value, "status_code", None) == 404


def test_bank_nbytes_reads_a_snapshot_of_its_layers():
    """/metrics reads nbytes() while add() (a worker thread) may insert layers: a layer appearing mid-sum (here
    inserted by the read itself, deterministically) no longer breaks the iteration."""
    from types import SimpleNamespace

    from meshlm.serve.multilora import AdapterBank

    bank = AdapterBank(torch.nn.Linear(2, 2))

    class Growing:
        @property
        def nbytes(self):
            bank.layers[f"new{len(bank.layers)}"] = SimpleNamespace(A=torch.zeros(1), B=torch.zeros(1))
            return 8

    bank.layers["a"] = SimpleNamespace(A=Growing(), B=torch.zeros(2))
    assert bank.nbytes() == 8 + 8
