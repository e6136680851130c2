"""Pinning a version by name is a permission: a candidate at a small share is not reachable by every client who
names NAME:vK, and after a promote the old stable no longer answers by name. The admin token, or the rollout's
``pinnable`` flag, opens a version. And an admin rollout whose version does not fit SQLite's INTEGER is a 400
naming the field (it was a 500).

In-process server (uvicorn on 127.0.0.1, port 0), random-weight debug checkpoints, the official openai client."""

from __future__ import annotations

import httpx2
import openai
import pytest

from meshlm.serve.fixtures import random_checkpoints
from meshlm.serve.registry import Registry
from tests.helpers import meshlm_in_process
from tests.test_registry import write_report
from tests.test_serve_fields import start_in_process

TOKEN = "pin-test-admin-token-0123456789"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("pin")
    step1, step2 = random_checkpoints(root / "run", steps=(1, 2))
    reg = Registry(root / "reg.sqlite")
    report = write_report(root / "pass.json", True)
    reg.add_checkpoint(step1, "tiny", report)  # tiny:v1
    reg.add_checkpoint(step2, "tiny", report)  # tiny:v2
    for running in start_in_process(reg, ["tiny:v1"], admin_token=TOKEN):
        yield running, root / "reg.sqlite"
    reg.close()


def admin(running, path: str, body: dict) -> httpx2.Response:
    return httpx2.post(running.url + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)


def ask(running, model: str, api_key: str = "unused") -> str:
    client = openai.OpenAI(base_url=running.url + "/v1", api_key=api_key, max_retries=0, timeout=120)
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1).system_fingerprint


def model_ids(running, token: str | None = None) -> set[str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return {m["id"] for m in httpx2.get(running.url + "/v1/models", headers=headers).json()["data"]}


def test_a_candidate_and_a_retired_stable_are_not_pinnable_by_default(served):
    running, _ = served
    assert admin(running, "/admin/rollout", {"name": "tiny", "version": 2, "share": 0.01}).status_code == 200
    with pytest.raises(openai.PermissionDeniedError) as err:
        ask(running, "tiny:v2")  # the bypass: before the fix this answered from the 1% candidate
    assert err.value.status_code == 403 and err.value.body["code"] == "version_not_pinnable"
    assert err.value.body["param"] == "model" and "'tiny'" in err.value.body["message"]
    assert ask(running, "tiny:v1") == "tiny:v1"  # the stable version may be named (the same answer as "tiny")
    assert ask(running, "tiny:v2", api_key=TOKEN) == "tiny:v2"  # the operator, with the admin token, may pin
    assert "tiny:v2" not in model_ids(running) and "tiny:v2" in model_ids(running, TOKEN)

    assert admin(running, "/admin/promote", {"name": "tiny"}).status_code == 200
    assert ask(running, "tiny:v2") == "tiny:v2" and ask(running, "tiny") == "tiny:v2"
    assert "tiny:v1" in running.router.backends  # still loaded, for a rollback
    with pytest.raises(openai.PermissionDeniedError):
        ask(running, "tiny:v1")  # the old stable no longer answers by name
    assert admin(running, "/admin/rollback", {"name": "tiny"}).status_code == 200  # back to v1 stable
    assert ask(running, "tiny") == "tiny:v1"


def test_pinnable_rollout_opens_the_candidate_until_it_ends(served):
    running, _ = served
    r = admin(running, "/admin/rollout", {"name": "tiny", "version": 2, "share": 0.01, "pinnable": True})
    assert r.status_code == 200 and r.json()["deployment"]["pinnable"] == [2]
    assert ask(running, "tiny:v2") == "tiny:v2" and "tiny:v2" in model_ids(running)
    assert admin(running, "/admin/rollback", {"name": "tiny"}).status_code == 200  # drops the candidate
    assert admin(running, "/admin/rollout", {"name": "tiny", "version": 2, "share": 0.01}).status_code == 200
    with pytest.raises(openai.PermissionDeniedError):
        ask(running, "tiny:v2")  # a new rollout is closed again unless it says pinnable
    bad = admin(running, "/admin/rollout", {"name": "tiny", "version": 2, "share": 0.01, "pinnable": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "pinnable"
    assert admin(running, "/admin/rollback", {"name": "tiny"}).status_code == 200


@pytest.mark.parametrize("version", [10**30, -3, 0, "v" + "9" * 30, "tiny:v99999999999999999999"])
def test_an_out_of_range_version_is_a_400_naming_the_field(served, version):
    running, _ = served
    r = admin(running, "/admin/rollout", {"name": "tiny", "version": version, "share": 0.5})
    assert r.status_code == 400, r.text  # 10**30 was a 500 (SQLite cannot hold it)
    assert r.json()["error"]["param"] == "version" and "version" in r.json()["error"]["message"]


def test_an_out_of_range_version_on_the_cli_is_a_one_line_error(served):
    _, registry = served
    done = meshlm_in_process("registry", "show", "tiny:v" + "9" * 30, "--registry", str(registry))
    assert done.returncode == 2 and "versions are numbered 1 to" in done.stderr and "Traceback" not in done.stderr


def test_rollout_start_pinnable_on_the_cli(served, tmp_path):
    running, _ = served
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    common = ("--server", running.url, "--token-file", str(token_file))
    started = meshlm_in_process("rollout", "start", "tiny:v2", "--share", "0.01", "--pinnable", *common)
    assert started.returncode == 0 and "candidate tiny:v2 at share 0.01 (pinnable by version)" in started.stdout
    assert ask(running, "tiny:v2") == "tiny:v2"
    assert meshlm_in_process("rollout", "rollback", "tiny", *common).returncode == 0
    with pytest.raises(openai.NotFoundError):  # the dropped candidate is unloaded
        ask(running, "tiny:v2")
