"""``ki tokens create|revoke|list`` (bearer tokens) and ``ki api serve`` (the collector app with the query and health API)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from kernel_insight.api.auth import DEFAULT_TOKEN_STORE, Scope, TokenError, TokenStore

__all__ = ["add_commands", "token_store_path"]

Handler = Callable[[argparse.Namespace], int]


def token_store_path(explicit: str | None = None) -> Path:
    """``explicit``, else $KI_TOKEN_STORE, else ki-data/tokens.json."""
    return Path(explicit or os.environ.get("KI_TOKEN_STORE") or DEFAULT_TOKEN_STORE)


def _create(args: argparse.Namespace) -> int:
    created = TokenStore(token_store_path(args.store)).create(args.name, args.scope)
    if args.json:
        print(json.dumps({"token": created.token, **asdict(created.info)}))
    else:
        print(created.token)
        print(
            f"token id {created.info.id}, scopes {','.join(created.info.scopes)}: shown once, keep it",
            file=sys.stderr,
        )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    TokenStore(token_store_path(args.store)).revoke(args.token_id)
    print(f"revoked {args.token_id}")
    return 0


def _list(args: argparse.Namespace) -> int:
    infos = TokenStore(token_store_path(args.store)).list()
    if args.json:
        print(json.dumps([asdict(i) for i in infos]))
        return 0
    for i in infos:
        state = "revoked" if i.revoked else "active"
        print(f"{i.id}  {state:7}  {','.join(i.scopes):24}  {i.name}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from kernel_insight.api.app import create_api_app, serve
    from kernel_insight.collector.store import StorageError, open_store

    try:
        tokens = None if args.local_dev else TokenStore(token_store_path(args.tokens))
        store = open_store(args.store)
    except (StorageError, ValueError) as exc:
        print(f"ki api serve: {exc}", file=sys.stderr)
        return 2
    try:
        app = create_api_app(store, tokens=tokens, local_dev=args.local_dev, interval_s=args.interval)
        serve(app, args.host, args.port, local_dev=args.local_dev)
    except ValueError as exc:
        print(f"ki api serve: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0


def _errors_to_exit(fn: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (TokenError, OSError) as exc:
            print(f"ki tokens: {exc}", file=sys.stderr)
            return 1

    return run


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tokens = sub.add_parser("tokens", help="bearer tokens for the query and health API")
    tsub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")

    def action(name: str, fn: Handler, help_: str) -> argparse.ArgumentParser:
        p = tsub.add_parser(name, help=help_)
        p.add_argument("--store", help=f"token file (default $KI_TOKEN_STORE or {DEFAULT_TOKEN_STORE})")
        p.set_defaults(handler=_errors_to_exit(fn))
        return p

    c = action("create", _create, "create a token and print it (once)")
    c.add_argument(
        "--scope",
        action="append",
        required=True,
        choices=[s.value for s in Scope],
        help="a scope the token carries; repeat for several",
    )
    c.add_argument("--name", default="", help="a label for people, e.g. grafana")
    c.add_argument("--json", action="store_true", help="print JSON")
    r = action("revoke", _revoke, "refuse a token from now on")
    r.add_argument("token_id", help="the token id (or the whole token)")
    lst = action("list", _list, "list tokens (ids, scopes, names; never secrets)")
    lst.add_argument("--json", action="store_true", help="print JSON")

    api = sub.add_parser("api", help="serve the collector with the query and health API")
    asub = api.add_subparsers(dest="api_command", required=True, metavar="ACTION")
    s = asub.add_parser("serve", help="run the collector app with the query, health and instance endpoints")
    s.add_argument("--store", default="./ki-data", help="data directory (embedded) or ClickHouse URL")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8428, help="port (0: any free port, printed at start)")
    s.add_argument("--tokens", help=f"token file (default $KI_TOKEN_STORE or {DEFAULT_TOKEN_STORE})")
    s.add_argument(
        "--local-dev",
        action="store_true",
        help="no tokens checked; binds 127.0.0.1 only and says so at start",
    )
    s.add_argument("--interval", type=float, default=5.0, help="seconds between health snapshot rebuilds")
    s.set_defaults(handler=_serve)
