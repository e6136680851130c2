"""Which version answers a request: the stable version of each served name, or a candidate for a share of users.

A user is placed by a hash of (name, candidate version, hashed user id): the same user lands on the same version
for the whole rollout, and raising the share only adds users (a user's hash does not change). Requests without
``user`` are placed by their request id (no stickiness). Promote makes the candidate stable (the old stable goes
on the history); rollback drops a candidate in progress, or, with none, brings back the previous stable. Each
call changes the routing table at once: a request keeps the backend it was routed to, so in-flight requests finish
on their version while new ones go to the new one. Versions no longer stable, candidate or first in line for a
rollback are closed once their in-flight requests are done.

Naming a version (``model: "NAME:vK"``) pins a request to it, past the rollout. A client may pin the stable
version (the same answer as asking for NAME) and versions the operator opened with ``pinnable`` at rollout
start; a request carrying the admin token may pin any loaded version. Every other pin is refused (403): a
candidate at a 1% share must not serve everyone who guesses its name, nor the previous stable keep answering
after a promote.

The state of each name is written to the registry file on every change (``deployments`` table).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from meshlm.errors import UserError
from meshlm.serve.protocol import ApiError, Backend
from meshlm.serve.registry import ModelVersion, Registry, RegistryError, parse_ref


@dataclass
class Deployment:
    name: str
    stable: int
    candidate: int | None = None
    share: float = 0.0
    history: list[int] = field(default_factory=list)  # earlier stable versions, the latest last
    pinnable: list[int] = field(default_factory=list)  # versions besides the stable one clients may name

    def refs(self) -> set[str]:
        """The versions to keep loaded: stable, candidate and the rollback target."""
        keep = {self.stable, *([self.candidate] if self.candidate is not None else []), *self.history[-1:]}
        return {f"{self.name}:v{v}" for v in keep}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stable_ref": f"{self.name}:v{self.stable}",
                "candidate_ref": None if self.candidate is None else f"{self.name}:v{self.candidate}"}


def bucket(name: str, version: int, key: str) -> float:
    """A number in [0, 1) fixed by (name, candidate version, user hash): below the share means the candidate."""
    digest = hashlib.sha256(f"{name}\x00{version}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class Router:
    """The routing table and the loaded backends. Admin changes are serialised by one lock."""

    def __init__(self, registry: Registry, load: Callable[[ModelVersion], Awaitable[Backend]],
                 user_key: str) -> None:
        self.registry, self._load = registry, load
        self._user_key = user_key.encode()
        self.deployments: dict[str, Deployment] = {}
        self.backends: dict[str, Backend] = {}
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task] = set()

    def user_hash(self, user: str | None) -> str | None:
        """A keyed hash of the client's ``user`` (the key lives in the registry file, so it survives restarts)."""
        if user is None:
            return None
        return hmac.new(self._user_key, user.encode(), hashlib.sha256).hexdigest()[:32]

    # --- routing ---------------------------------------------------------------------------------------------
    def route(self, model: str, user_hash: str | None, request_id: str, admin: bool = False) -> Backend:
        """The backend for ``model``: a served NAME (rollout applies) or a loaded NAME:vN (pinned: the stable
        version, a version opened as pinnable, or any loaded one for the admin token)."""
        if ":" in model:
            try:
                name, version = parse_ref(model)
            except RegistryError:
                raise _unknown(model) from None
            ref = f"{name}:v{version}"
            backend = self.backends.get(ref)
            if backend is None:
                raise _unknown(model)
            if not (admin or self.pinnable(ref)):
                raise ApiError(403, f"{ref} is not open to requests by version: ask for model '{name}' (the rollout "
                                    "places each user), or have the operator open it with `meshlm rollout start "
                                    f"{ref} --pinnable`", type="permission_error", param="model",
                               code="version_not_pinnable")
            return backend
        dep = self.deployments.get(model)
        if dep is None:
            raise _unknown(model)
        version = dep.stable
        if dep.candidate is not None and bucket(dep.name, dep.candidate, user_hash or request_id) < dep.share:
            version = dep.candidate
        return self.backends[f"{dep.name}:v{version}"]

    def pinnable(self, ref: str) -> bool:
        """May any client name ``ref`` (NAME:vN)? Its name's stable version, or one opened as pinnable."""
        name, version = parse_ref(ref)
        dep = self.deployments.get(name)
        return dep is not None and (version == dep.stable or version in dep.pinnable)

    # --- admin -----------------------------------------------------------------------------------------------
    async def serve(self, ref: str) -> Deployment:
        """Start serving ``ref`` as the stable version of its name (server start-up)."""
        entry = self.registry.get(ref)
        async with self._lock:
            await self._ensure_loaded(entry)
            dep = self.deployments[entry.name] = Deployment(entry.name, entry.version)
            self._changed(dep)
        return dep

    async def start(self, name: str, version: int, share: float, force: bool,
                    pinnable: bool = False) -> tuple[Deployment, ModelVersion]:
        entry = self._entry(name, version)
        if not 0.0 < share <= 1.0:
            raise ApiError(400, f"share must be in (0, 1], got {share}", param="share")
        if not entry.servable and not force:
            raise ApiError(409, f"{entry.ref} has gate status '{entry.gate_status}': its safety gates have not "
                                "passed; pass force (audited) to roll it out anyway", code="gates_not_passed")
        async with self._lock:
            dep = self._deployment(name)
            if version == dep.stable:
                raise ApiError(409, f"{entry.ref} is already the stable version", code="already_stable")
            await self._ensure_loaded(entry)
            dep.candidate, dep.share = version, share
            dep.pinnable = [version] if pinnable else []
            self._changed(dep)
        return dep, entry

    async def promote(self, name: str) -> Deployment:
        async with self._lock:
            dep = self._deployment(name)
            if dep.candidate is None:
                raise ApiError(409, f"{name} has no rollout in progress to promote", code="no_candidate")
            dep.history.append(dep.stable)
            dep.stable, dep.candidate, dep.share, dep.pinnable = dep.candidate, None, 0.0, []
            self._changed(dep)
        return dep

    async def rollback(self, name: str) -> tuple[Deployment, str]:
        """Drop the candidate, or (none in progress) go back to the previous stable version."""
        async with self._lock:
            dep = self._deployment(name)
            if dep.candidate is not None:
                what = f"dropped candidate {name}:v{dep.candidate}"
                dep.candidate, dep.share = None, 0.0
            elif dep.history:
                previous = dep.history.pop()
                await self._ensure_loaded(self._entry(name, previous))
                what = f"stable {name}:v{dep.stable} -> {name}:v{previous}"
                dep.stable = previous
            else:
                raise ApiError(409, f"{name} has no previous version to roll back to", code="nothing_to_roll_back")
            dep.pinnable = []
            self._changed(dep)
        return dep, what

    def status(self) -> dict[str, Any]:
        return {"deployments": {n: d.to_json() for n, d in self.deployments.items()},
                "loaded": {ref: b.status() for ref, b in self.backends.items()}}

    async def aclose(self) -> None:
        backends, self.backends = list(self.backends.values()), {}
        await asyncio.gather(*(b.aclose() for b in backends), *self._closing, return_exceptions=True)

    # --- internals -------------------------------------------------------------------------------------------
    def _entry(self, name: str, version: int) -> ModelVersion:
        try:
            return self.registry.get(f"{name}:v{version}")
        except RegistryError as exc:
            raise ApiError(404, str(exc), param="version", code="version_not_found") from None

    def _deployment(self, name: str) -> Deployment:
        dep = self.deployments.get(name)
        if dep is None:
            raise ApiError(404, f"this server does not serve '{name}' (it serves {sorted(self.deployments)})",
                           param="name", code="model_not_found")
        return dep

    async def _ensure_loaded(self, entry: ModelVersion) -> None:
        if entry.ref not in self.backends:
            try:
                self.backends[entry.ref] = await self._load(entry)
            except UserError as exc:  # e.g. files that no longer match their recorded sha256
                raise ApiError(409, f"cannot load {entry.ref}: {exc}", code="load_failed") from None

    def _changed(self, dep: Deployment) -> None:
        """Persist the new state and retire backends nothing routes to any more."""
        self.registry.save_deployment(dep.name, dep.to_json())
        keep = set().union(*(d.refs() for d in self.deployments.values()))
        for ref in [r for r in self.backends if r not in keep]:
            task = asyncio.get_running_loop().create_task(self.backends.pop(ref).aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


def _unknown(model: str) -> ApiError:
    return ApiError(404, "the model does not exist or is not served here (GET /v1/models lists them)",
                    param="model", code="model_not_found")
