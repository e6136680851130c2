"""The demo's stages, each through the library function or command a user would run.

The align pipeline runs in this process (:func:`meshlm.safety.pipeline.run_pipeline`, what ``meshlm align``
calls); ``meshlm registry add`` and ``meshlm audit verify`` run in this process through the CLI's own parser and
handlers (so they print what they print on the command line); ``meshlm serve`` runs as its own process, as an
operator starts it, on 127.0.0.1 with a free port, and is stopped with SIGTERM (its graceful stop) before the
audit log is verified.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from meshlm.errors import CheckpointError

# The embedded align config (configs/align.toml) sized down so the demo's align stage takes a few minutes on two
# cores: fewer SFT steps and fewer prompts answered by the SFT model for DPO's on-policy pairs. Everything else
# (spec, data sizes, the `debug` flavour, DPO steps, red team, held-out evaluation, gates) is the default's.
DEMO_ALIGN: tuple[str, ...] = (
    "sft.steps=300",              # default 800
    "dpo.on_policy_prompts=200",  # default 800
    "dpo.probe_prompts=600",      # default 3000
)
MODEL_NAME = "demo"
QUESTION = "How much ibuprofen can I take for a headache?"  # a `warn` prompt of the spec: answer, caution, referral
MAX_TOKENS = 64
SERVER_START_TIMEOUT_S = 300.0  # model load and imports on a busy 2-core machine


class StageFailed(Exception):
    """A stage did not do its job (the server did not start, the request failed); the message says what happened
    and where to look."""


def cli(argv: list[str], say=print) -> int:
    """Run a meshlm command in this process, as typed on the command line: ``say`` gets the command line, then each
    line the command printed; returns its exit code. A user error (:class:`meshlm.errors.UserError`) propagates, so
    the demo stops with its one-line reason and exit code 2."""
    import io
    from contextlib import redirect_stdout

    from meshlm.cli.main import build_parser

    args = build_parser().parse_args(argv)
    say(f"$ {command_line(argv)}")
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            code = args.handler(args) or 0
    finally:
        for line in out.getvalue().splitlines():
            say(f"  {line}")
    return code


def command_line(argv: list[str]) -> str:
    import shlex

    return "meshlm " + " ".join(shlex.quote(a) for a in argv)


def fresh_run_dir(run_dir: str | None) -> Path:
    """The demo's output folder: ``run_dir`` if it is new or empty, else an error (the demo never writes into an
    existing run); without one, ``runs/demo-<time>`` (with a suffix if that exists already)."""
    if run_dir:
        path = Path(run_dir)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise CheckpointError(f"--run-dir {path} already exists and is not empty; the demo writes only into a "
                                  "new or empty folder: choose another --run-dir (or leave it out)")
        return path
    stem = Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = stem, 1
    while path.exists():
        n += 1
        path = stem.with_name(f"{stem.name}-{n}")
    return path


def openai_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("openai") is None


def register(align_dir: Path, report: dict[str, Any], registry: Path, say=print) -> Any:
    """``meshlm registry add`` of the pipeline's final model with its held-out safety report (its gates decide
    whether serving it needs --force). Returns the registered version."""
    from meshlm.serve.registry import Registry

    final = report["final_model"]
    safety = align_dir / "eval" / final / "heldout" / "report.json"
    argv = ["registry", "add", str(report["checkpoints"][final]), "--name", MODEL_NAME, "--report", str(safety),
            "--registry", str(registry)]
    cli(argv, say)
    reg = Registry(registry, create=False)
    try:
        return reg.versions(MODEL_NAME)[-1]
    finally:
        reg.close()


def serve_argv(registry: Path, ref: str, audit: Path, port_file: Path, force: bool) -> list[str]:
    return ["serve", "--registry", str(registry), "--model", ref, "--audit", str(audit), "--host", "127.0.0.1",
            "--port", "0", "--port-file", str(port_file), "--threads", "1", *(["--force"] if force else [])]


def start_server(argv: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "meshlm", *argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def wait_ready(proc: subprocess.Popen, port_file: Path, log: Path, timeout: float = SERVER_START_TIMEOUT_S) -> str:
    """The server's root URL once it listens (it writes ``port_file`` after loading the model and binding)."""
    deadline = time.monotonic() + timeout
    while not port_file.is_file():
        if proc.poll() is not None:
            raise StageFailed(f"meshlm serve exited with code {proc.returncode} before listening: "
                              f"{_last_line(log)} (whole log: {log})")
        if time.monotonic() > deadline:
            raise StageFailed(f"meshlm serve did not listen within {timeout:.0f} s (log: {log})")
        time.sleep(0.1)
    return json.loads(port_file.read_text())["url"]


def stop_server(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    """SIGTERM (the server finishes what is in flight and exits 0); SIGKILL if it does not stop in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def ask(base_url: str, model: str, question: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """One chat completion through the official openai client (greedy, so the demo's answer repeats)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="meshlm-demo", max_retries=0, timeout=300)
    start = time.perf_counter()
    try:
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                               max_tokens=max_tokens, temperature=0)
    except openai.OpenAIError as exc:
        raise StageFailed(f"the chat request to {base_url} failed: {exc}") from None
    choice = reply.choices[0]
    return {"question": question, "answer": choice.message.content, "finish_reason": choice.finish_reason,
            "version": reply.system_fingerprint, "prompt_tokens": reply.usage.prompt_tokens,
            "completion_tokens": reply.usage.completion_tokens, "latency_s": time.perf_counter() - start}


def serve_and_ask(registry: Path, entry, audit: Path, folder: Path, say) -> dict[str, Any]:
    """Start ``meshlm serve`` on the registered version, send one request (when the openai client is installed),
    stop the server. ``say`` prints a line."""
    port_file, log = folder / "serve-port.json", folder / "serve.log"
    argv = serve_argv(registry, entry.ref, audit, port_file, force=not entry.servable)
    say(f"$ {command_line(argv)} &")
    if not entry.servable:
        say(f"  gates {entry.gate_status}: served with --force, which the audit log records (a smoke run, not a "
            "release)")
    proc = start_server(argv, log)
    result: dict[str, Any] = {"command": command_line(argv), "log": str(log), "forced": not entry.servable}
    try:
        url = wait_ready(proc, port_file, log)
        say(f"  listening on {url} (model loaded; log {log})")
        result["url"] = url
        if openai_missing():
            say("  the `openai` client is not installed, so no request was sent: `pip install openai` (it is in "
                "meshlm's test extra, which `make demo` installs), then run the demo again")
        else:
            result["request"] = ask(url + "/v1", MODEL_NAME, QUESTION)
    finally:
        result["exit_code"] = stop_server(proc)
    return result


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    return lines[-1] if lines else "(no output)"


class Clock:
    """Numbered stages with their wall times: ``with clock.stage("registry", "title"):`` prints ``[k/N] title``
    before and the stage's time after, and keeps the times (seconds) in ``clock.times``."""

    def __init__(self, total: int, say=print) -> None:
        self.total, self.say, self.times, self._k = total, say, {}, 0

    @contextmanager
    def stage(self, key: str, title: str) -> Iterator[None]:
        self._k += 1
        self.say(f"\n[{self._k}/{self.total}] {title}")
        start = time.perf_counter()
        yield
        self.times[key] = time.perf_counter() - start
        self.say(f"    ({key}: {self.times[key]:.1f} s)")
