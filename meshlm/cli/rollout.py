"""``meshlm rollout start|promote|rollback|status``: the admin API of a running ``meshlm serve``."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError, UserError


class RolloutError(UserError):
    """The server refused the call (or could not be reached)."""


def register(sub, add_config_args) -> None:
    p = sub.add_parser("rollout", help="staged rollout on a running server: start, promote, rollback, status")
    rsub = p.add_subparsers(dest="rollout_command", required=True, metavar="{start,promote,rollback,status}")
    start = rsub.add_parser("start", help="send a share of traffic (sticky per user) to NAME:vN")
    start.add_argument("ref", metavar="NAME:vN")
    start.add_argument("--share", type=float, required=True, help="fraction of users, in (0, 1]")
    start.add_argument("--force", action="store_true", help="roll out a version whose safety gates have not "
                                                           "passed (audited)")
    start.add_argument("--pinnable", action="store_true",
                       help="let any client ask for NAME:vN by version (off: only the rollout share reaches it, "
                            "and requests carrying the admin token)")
    promote = rsub.add_parser("promote", help="make the candidate the stable version")
    rollback = rsub.add_parser("rollback", help="drop the candidate, or go back to the previous stable version")
    status = rsub.add_parser("status", help="deployments, loaded versions and their queues")
    for q in (promote, rollback):
        q.add_argument("name", nargs="?", help="the served name (optional when the server serves one)")
    for q in (start, promote, rollback, status):
        q.add_argument("--server", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
        q.add_argument("--token-file", required=True, help="the file holding the admin bearer token")
        q.add_argument("--json", action="store_true")
        q.set_defaults(handler=run)


def call(server: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    """One admin call; the server's error message as a RolloutError on a 4xx/5xx."""
    url = server.rstrip("/").removesuffix("/v1") + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise RolloutError(f"{path}: HTTP {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RolloutError(f"cannot reach {url} ({getattr(exc, 'reason', exc)}); is `meshlm serve` running "
                           "there?") from None


def run(args: argparse.Namespace) -> int:
    from meshlm.cli.serve import read_token
    from meshlm.serve.registry import parse_ref

    token = read_token(args.token_file)
    command = args.rollout_command
    if command == "start":
        if not 0 < args.share <= 1:
            raise ConfigError(f"--share {args.share}: give a fraction in (0, 1]")
        name, version = parse_ref(args.ref)
        result = call(args.server, token, "POST", "/admin/rollout",
                      {"name": name, "version": version, "share": args.share, "force": args.force,
                       "pinnable": args.pinnable})
    elif command == "status":
        result = call(args.server, token, "GET", "/admin/status")
    else:
        body = {"name": args.name} if args.name else {}
        result = call(args.server, token, "POST", f"/admin/{command}", body)
    if args.json:
        emit(result)
    else:
        _print(command, result)
    return 0


def _print(command: str, result: dict) -> None:
    deployments = result["deployments"].values() if command == "status" else [result["deployment"]]
    for dep in deployments:
        line = f"{dep['name']}: stable {dep['stable_ref']}"
        if dep["candidate_ref"]:
            line += f", candidate {dep['candidate_ref']} at share {dep['share']:g}"
            if dep.get("candidate") in dep.get("pinnable", []):
                line += " (pinnable by version)"
        if dep["history"]:
            line += f", rollback to {dep['name']}:v{dep['history'][-1]}"
        print(line)
    if result.get("action"):
        print(result["action"])
    if result.get("forced"):
        print(f"forced past gate status '{result['gate_status']}' (audited)")
    for ref, info in result.get("loaded", {}).items():
        print(f"  {ref}: {info.get('kind')} active {info.get('active')} queued {info.get('queued', '-')}")
