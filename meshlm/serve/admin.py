"""The admin API: staged rollout, promote, rollback and status, behind a bearer token; every call audited.

The token is compared with ``hmac.compare_digest`` (constant time); a missing or wrong token is a 401, and that
attempt is audited too. Without ``--admin-token-file`` the admin API refuses every call. Rolling out a version
whose safety gates have not passed needs ``"force": true``; the audit record then says ``forced`` and the gate
status.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from meshlm.serve.protocol import ApiError
from meshlm.serve.registry import MAX_VERSION
from meshlm.serve.rollout import Router
from meshlm.serve.schemas import parse_body


def error_response(error: ApiError) -> JSONResponse:
    """The OpenAI error object with its status; Retry-After on 429/503, WWW-Authenticate on 401."""
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else {}
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error.to_json(), status_code=error.status, headers=headers or None)


def _name(body: dict[str, Any], router: Router) -> str:
    name = body.get("name")
    if name is None and len(router.deployments) == 1:
        return next(iter(router.deployments))
    if not isinstance(name, str):
        raise ApiError(400, "name: give the served model name (a string)", param="name")
    return name


def _version(value: Any) -> int:
    """3, "3", "v3" or "NAME:v3" -> 3; a version is 1 .. MAX_VERSION (what SQLite's INTEGER holds)."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        text = value.rsplit(":", 1)[-1].lstrip("v")
        if text.isdigit() and len(text) <= 20:
            number = int(text)
    if number is None or not 1 <= number <= MAX_VERSION:
        raise ApiError(400, f"version: give a version number from 1 to {MAX_VERSION}, such as 3 or \"v3\"",
                       param="version")
    return number


class AdminApi:
    def __init__(self, router: Router, write: Callable[[dict], Awaitable[None]], token: str | None,
                 audit_head: Callable[[], dict] | None = None) -> None:
        self.router, self._write, self._audit_head = router, write, audit_head
        self._token = token.encode() if token else None
        self.started = time.time()

    def add_routes(self, app: FastAPI) -> None:
        app.add_api_route("/admin/status", self.status, methods=["GET"])
        app.add_api_route("/admin/rollout", self.rollout, methods=["POST"])
        app.add_api_route("/admin/promote", self.promote, methods=["POST"])
        app.add_api_route("/admin/rollback", self.rollback, methods=["POST"])

    async def status(self, request: Request) -> Response:
        async def act(body: dict) -> tuple[dict, dict]:
            head = self._audit_head() if self._audit_head else None  # to anchor the chain elsewhere
            return {**self.router.status(), "uptime_s": round(time.time() - self.started, 1), "audit_head": head}, {}
        return await self._call(request, "status", act, read_body=False)

    async def rollout(self, request: Request) -> Response:
        async def act(body: dict) -> tuple[dict, dict]:
            name, version = _name(body, self.router), _version(body.get("version"))
            share, force = body.get("share"), body.get("force", False)
            pinnable = body.get("pinnable", False)
            if isinstance(share, bool) or not isinstance(share, (int, float)):
                raise ApiError(400, "share: a number in (0, 1]", param="share")
            for key, value in (("force", force), ("pinnable", pinnable)):
                if not isinstance(value, bool):
                    raise ApiError(400, f"{key}: true or false", param=key)
            dep, entry = await self.router.start(name, version, float(share), force, pinnable)
            forced = force and not entry.servable
            return ({"deployment": dep.to_json(), "forced": forced, "gate_status": entry.gate_status},
                    {"name": name, "version": entry.ref, "share": float(share), "forced": forced,
                     "gate_status": entry.gate_status, "pinnable": pinnable})
        return await self._call(request, "rollout", act)

    async def promote(self, request: Request) -> Response:
        async def act(body: dict) -> tuple[dict, dict]:
            name = _name(body, self.router)
            dep = await self.router.promote(name)
            return {"deployment": dep.to_json()}, {"name": name, "version": dep.to_json()["stable_ref"]}
        return await self._call(request, "promote", act)

    async def rollback(self, request: Request) -> Response:
        async def act(body: dict) -> tuple[dict, dict]:
            name = _name(body, self.router)
            dep, what = await self.router.rollback(name)
            return ({"deployment": dep.to_json(), "action": what},
                    {"name": name, "version": dep.to_json()["stable_ref"], "detail": what})
        return await self._call(request, "rollback", act)

    async def _call(self, request: Request, action: str, act, read_body: bool = True) -> Response:
        record: dict[str, Any] = {"kind": "admin", "time": time.time(), "action": action,
                                  "request_id": "admin-" + uuid.uuid4().hex, "status": 200}
        try:
            self._authorize(request)
            body = parse_body(await request.body() or b"{}") if read_body else {}
            result, details = await act(body)
            record.update(details)
            response: Response = JSONResponse(result)
        except ApiError as error:
            record.update(status=error.status, error=error.message)
            response = error_response(error)
        await self._write(record)
        return response

    def is_admin(self, request: Request) -> bool:
        """Does the request carry the admin bearer token (e.g. an OpenAI client whose api_key is the token)?"""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return (self._token is not None and scheme.lower() == "bearer"
                and hmac.compare_digest(given.strip().encode(), self._token))

    def _authorize(self, request: Request) -> None:
        if self._token is None:
            raise ApiError(401, "the admin API is disabled: start the server with --admin-token-file",
                           type="authentication_error", code="admin_disabled")
        if not self.is_admin(request):
            raise ApiError(401, "missing or wrong admin bearer token", type="authentication_error",
                           code="invalid_token")
