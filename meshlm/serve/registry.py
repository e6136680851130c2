"""The model registry: named, numbered versions (``NAME:vN``) of checkpoints or remote endpoints, in SQLite.

A checkpoint version records its path, the sha256 of every file of the checkpoint (from its manifest, re-hashed
when registered), the ``weights_sha256`` that ``meshlm inspect`` prints, its config, the safety report of
``meshlm eval safety`` with its gate status, and who registered it when. An endpoint version records the base
URL of an OpenAI-compatible server (vLLM, another meshlm server) and the model name to ask it for. An adapter
version is a LoRA checkpoint over a registered base version: it records the base's reference and weights hash
(which the adapter's own base must match) and the adapter tensors' hash; the server serves it on the loaded
base, batched with the base's other adapters.

Loading refuses a checkpoint whose files no longer hash to what was recorded (re-registering is the way to
accept new weights), and a version without a safety report, or whose gates failed, is "not servable": serving
or rolling it out needs ``--force``, which the server audits. The same file also holds the deployment state the
server writes (rollout.py), so one path names everything an operator needs.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import re
import sqlite3
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshlm.errors import CheckpointError, ConfigError, UserError
from meshlm.fileio import sha256_file
from meshlm.sections import to_dict

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_REF = re.compile(r"^(?P<name>[^:]+):v?(?P<version>\d+)$")
DEFAULT_REGISTRY = "meshlm-registry.sqlite"
MAX_VERSION = 2**63 - 1  # SQLite's INTEGER: a larger number cannot even be looked up

_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    remote_model TEXT,
    weights_sha256 TEXT,
    checkpoint_sha256 TEXT,
    files TEXT NOT NULL,
    config TEXT NOT NULL,
    report TEXT,
    gates_passed INTEGER,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS deployments (name TEXT PRIMARY KEY, state TEXT NOT NULL, updated_at TEXT NOT NULL);
"""


class RegistryError(UserError):
    """An unknown name or version, a malformed reference, or an unusable registry file."""


@dataclass(frozen=True)
class ModelVersion:
    """One registered version. ``kind`` is "checkpoint" (``source`` = its folder) or "endpoint" (a base URL)."""

    name: str
    version: int
    kind: str
    source: str
    remote_model: str | None
    weights_sha256: str | None
    checkpoint_sha256: str | None
    files: dict[str, str]  # checkpoint file (relative path) -> sha256
    config: dict[str, Any]
    report: dict[str, Any] | None  # {"path", "sha256", "gates"} of the safety report
    gates_passed: bool | None  # None: no report
    created_by: str
    created_at: str
    adapter: dict[str, Any] | None = None  # an adapter version: {"of", "base_weights_sha256", "adapter_sha256"}

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    @property
    def servable(self) -> bool:
        """Has a safety report whose gates passed (otherwise serving it needs --force)."""
        return self.gates_passed is True

    @property
    def gate_status(self) -> str:
        return {True: "passed", False: "failed", None: "no report"}[self.gates_passed]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ref": self.ref, "gate_status": self.gate_status, "servable": self.servable}


def parse_ref(ref: str) -> tuple[str, int]:
    """``NAME:vN`` (or ``NAME:N``) -> (NAME, N)."""
    match = _REF.match(ref.strip()) if isinstance(ref, str) else None
    if not match:
        raise RegistryError(f"'{ref}' is not a version reference; write NAME:vN, e.g. tiny:v1")
    version = int(match["version"]) if len(match["version"]) <= 20 else MAX_VERSION + 1
    if not 1 <= version <= MAX_VERSION:
        raise RegistryError(f"'{ref}': versions are numbered 1 to {MAX_VERSION}")
    return match["name"], version


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"--name '{name}': use 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                          "or digit (':' separates the version)")
    return name


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_report(path: str | Path) -> dict[str, Any]:
    """What the registry keeps of a safety report: path, sha256, the model it evaluated, the gates, and whether
    they passed. Accepts the report.json of ``meshlm eval safety`` (``"gates": [{"gate", "passed", ...}]`` and a
    top-level ``"passed"``) and the short form ``{"gates": {"passed": bool, ...}}``. A report without any gate
    has not passed: nothing was required of the model."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        report = json.loads(raw)
    except OSError as exc:
        raise ConfigError(f"--report {path}: cannot read it ({exc.strerror}); pass EVAL_DIR/report.json") from None
    except ValueError as exc:
        raise ConfigError(f"--report {path}: not valid JSON ({exc})") from None
    gates = report.get("gates") if isinstance(report, dict) else None
    if isinstance(gates, dict) and isinstance(gates.get("passed"), bool):
        passed = gates["passed"]
    elif isinstance(gates, list) and all(isinstance(g, dict) and isinstance(g.get("passed"), bool) for g in gates):
        passed = bool(gates) and all(g["passed"] for g in gates) and report.get("passed", True) is True
    else:
        raise ConfigError(f"--report {path}: no gates section with 'passed' values (expected the report.json of "
                          "`meshlm eval safety --gate ...`)")
    return {"path": str(path.resolve()), "sha256": hashlib.sha256(raw).hexdigest(), "source": report.get("source"),
            "gates": gates, "passed": passed}


class Registry:
    """The registry file. Each method opens its own short transaction, so several processes may share it."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise RegistryError(f"registry {self.path} does not exist; create it with `meshlm registry add`")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                         timeout=30.0)
            self._conn.executescript(_SCHEMA)
            columns = {r[1] for r in self._conn.execute("PRAGMA table_info(versions)")}
            if "adapter" not in columns:  # a registry written before adapter versions existed
                self._conn.execute("ALTER TABLE versions ADD COLUMN adapter TEXT")
        except sqlite3.DatabaseError as exc:
            raise RegistryError(f"registry {self.path} is not a usable SQLite file ({exc})") from None

    def close(self) -> None:
        self._conn.close()

    # --- adding versions -------------------------------------------------------------------------------------
    def add_checkpoint(self, checkpoint: str | Path, name: str, report: str | Path | None = None) -> ModelVersion:
        """Register a checkpoint (a run directory's newest valid one, or a step folder) as the next NAME:vN."""
        from meshlm.checkpoint.load import model_from_checkpoint, resolve_checkpoint, weights_sha256

        check_name(name)
        ckpt = resolve_checkpoint(checkpoint).resolve()  # verifies every file against the manifest
        manifest = json.loads((ckpt / "manifest.json").read_text())
        files = {rel: meta["sha256"] for rel, meta in sorted(manifest["files"].items())}
        files["manifest.json"] = _sha256(ckpt / "manifest.json")
        model, cfg, _, _ = model_from_checkpoint(ckpt, generates=True)  # also loads a LoRA checkpoint's base
        weights = weights_sha256(model)
        del model
        config = {section: to_dict(getattr(cfg, section)) for section in cfg.__dataclass_fields__}
        return self._insert(name, "checkpoint", str(ckpt), None, weights, files, config, report)

    def add_adapter(self, checkpoint: str | Path, name: str, adapter_of: str,
                    report: str | Path | None = None) -> ModelVersion:
        """Register a LoRA checkpoint as the next NAME:vN, an adapter of the registered checkpoint ``adapter_of``
        (its base weights must be that version's, bit for bit)."""
        from types import SimpleNamespace

        from meshlm.checkpoint.load import model_from_checkpoint, resolve_checkpoint, weights_sha256
        from meshlm.models.lora import lora_modules

        check_name(name)
        base = self.get(adapter_of)
        if base.kind != "checkpoint":
            raise ConfigError(f"--adapter-of {adapter_of}: a {base.kind} version; an adapter needs a checkpoint "
                              "version as its base")
        ckpt = resolve_checkpoint(checkpoint).resolve()
        manifest = json.loads((ckpt / "manifest.json").read_text())
        files = {rel: meta["sha256"] for rel, meta in sorted(manifest["files"].items())}
        files["manifest.json"] = _sha256(ckpt / "manifest.json")
        model, cfg, _, _ = model_from_checkpoint(ckpt, generates=True)
        if not lora_modules(model):
            raise ConfigError(f"{checkpoint}: not a LoRA checkpoint (lora.rank = 0); register it without "
                              "--adapter-of")
        state = model.state_dict()
        lora = {k: v for k, v in state.items() if ".lora_" in k}
        # weights_sha256 reads .state_dict(): hand it the base part and the adapter part separately.
        base_part = {k: v for k, v in state.items() if k not in lora}
        base_hash = weights_sha256(SimpleNamespace(state_dict=lambda: base_part))
        if base_hash != base.weights_sha256:
            raise CheckpointError(f"{checkpoint}: its base weights hash to {base_hash[:12]}, {adapter_of}'s to "
                                  f"{str(base.weights_sha256)[:12]}; it is an adapter of another model")
        adapter = {"of": base.ref, "base_weights_sha256": base_hash,
                   "adapter_sha256": weights_sha256(SimpleNamespace(state_dict=lambda: lora))}
        weights = weights_sha256(model)
        del model
        config = {section: to_dict(getattr(cfg, section)) for section in cfg.__dataclass_fields__}
        return self._insert(name, "adapter", str(ckpt), None, weights, files, config, report, adapter)

    def add_endpoint(self, url: str, name: str, remote_model: str | None = None,
                     report: str | Path | None = None) -> ModelVersion:
        """Register a model served elsewhere: ``url`` is the base URL an OpenAI client takes (…/v1)."""
        check_name(name)
        if not re.match(r"^https?://[^/\s]+", url or ""):
            raise ConfigError(f"--endpoint '{url}': give an http(s) base URL, e.g. http://127.0.0.1:8000/v1")
        return self._insert(name, "endpoint", url.rstrip("/"), remote_model or name, None, {}, {}, report)

    def _insert(self, name: str, kind: str, source: str, remote_model: str | None, weights: str | None,
                files: dict[str, str], config: dict, report_path: str | Path | None,
                adapter: dict[str, Any] | None = None) -> ModelVersion:
        report = read_report(report_path) if report_path is not None else None
        gates = None if report is None else report["passed"]
        digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest() if files else None
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")  # the version number and the row in one write transaction
        try:
            row = conn.execute("SELECT MAX(version) FROM versions WHERE name = ?", (name,)).fetchone()
            version = (row[0] or 0) + 1
            conn.execute("INSERT INTO versions (name, version, kind, source, remote_model, weights_sha256, "
                         "checkpoint_sha256, files, config, report, gates_passed, created_by, created_at, adapter) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (name, version, kind, source, remote_model, weights, digest, json.dumps(files),
                          json.dumps(config), json.dumps(report) if report else None,
                          None if gates is None else int(gates), _user(), _now(),
                          json.dumps(adapter) if adapter else None))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return self.get(f"{name}:v{version}")

    # --- reading ---------------------------------------------------------------------------------------------
    def get(self, ref: str) -> ModelVersion:
        name, version = parse_ref(ref)
        row = self._conn.execute("SELECT * FROM versions WHERE name = ? AND version = ?", (name, version)).fetchone()
        if row is None:
            known = [v.ref for v in self.versions(name)] or self.names()
            raise RegistryError(f"{ref} is not in the registry {self.path} (it has: {', '.join(known) or 'nothing'})")
        return _version(row)

    def versions(self, name: str | None = None) -> list[ModelVersion]:
        query, args = "SELECT * FROM versions", ()
        if name is not None:
            query, args = query + " WHERE name = ?", (name,)
        return [_version(r) for r in self._conn.execute(query + " ORDER BY name, version", args)]

    def names(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT DISTINCT name FROM versions ORDER BY name")]

    # --- small key/value state for the server (user-hash key, deployments) -------------------------------------
    def secret(self, key: str) -> str:
        """A random hex secret stored in the registry the first time it is asked for (e.g. the user-hash key)."""
        import secrets

        self._conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (key, secrets.token_hex(32)))
        return self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0]

    def save_deployment(self, name: str, state: dict[str, Any]) -> None:
        self._conn.execute("INSERT OR REPLACE INTO deployments(name, state, updated_at) VALUES (?, ?, ?)",
                           (name, json.dumps(state), _now()))

    def deployment(self, name: str) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT state FROM deployments WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else None


def verify_files(entry: ModelVersion) -> Path:
    """The checkpoint folder of ``entry`` after re-hashing every recorded file; refuses any difference."""
    folder = Path(entry.source)
    if not folder.is_dir():
        raise CheckpointError(f"{entry.ref}: checkpoint {folder} no longer exists; restore it or register "
                              "another version")
    for rel, expected in entry.files.items():
        file = folder / rel
        actual = _sha256(file) if file.is_file() else "missing"
        if actual != expected:
            raise CheckpointError(f"{entry.ref}: {file} does not match the sha256 recorded at registration "
                                  f"({actual[:12]} != {expected[:12]}); restore the file, or register the "
                                  "checkpoint again to accept it as a new version")
    return folder


def _sha256(path: Path) -> str:
    return sha256_file(path)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "unknown"


def _version(row: tuple) -> ModelVersion:
    (name, version, kind, source, remote_model, weights, digest, files, config, report, gates, by, at,
     adapter) = row
    return ModelVersion(name, version, kind, source, remote_model, weights, digest, json.loads(files),
                        json.loads(config), json.loads(report) if report else None,
                        None if gates is None else bool(gates), by, at, json.loads(adapter) if adapter else None)
