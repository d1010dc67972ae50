"""``ki tokens create|revoke|list``: bearer tokens for the query and health API (``ki collector`` serves it)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

from kernel_insight.api.tokens import (
    DEFAULT_TOKEN_STORE,
    Scope,
    TokenError,
    TokenStore,
    TokenStoreBase,
    open_token_store,
)

__all__ = ["add_commands", "token_store_path"]

Handler = Callable[[argparse.Namespace], int]


def token_store_path(explicit: str | None = None) -> Path:
    """``explicit``, else $KI_TOKEN_STORE, else ki-data/tokens.json."""
    return Path(explicit or os.environ.get("KI_TOKEN_STORE") or DEFAULT_TOKEN_STORE)


@contextlib.contextmanager
def _opened(args: argparse.Namespace, *, create: bool = False) -> Iterator[TokenStoreBase]:
    """The token file, or the token table of a ClickHouse URL (several collectors share it). Only
    ``create`` may start a new file; list and revoke refuse a path with no store."""
    from kernel_insight.collector.private_json import opened_secret_store

    target = args.store or os.environ.get("KI_TOKEN_STORE") or str(DEFAULT_TOKEN_STORE)
    existing = None if create else "token store"
    with opened_secret_store(target, TokenStore, open_token_store, TokenError, existing=existing) as tokens:
        yield tokens


def _create(args: argparse.Namespace) -> int:
    with _opened(args, create=True) as tokens:
        created = tokens.create(args.name, args.scope)
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
    with _opened(args) as tokens:
        tokens.revoke(args.token_id)
    print(f"revoked {args.token_id}")
    return 0


def _list(args: argparse.Namespace) -> int:
    with _opened(args) as tokens:
        infos = tokens.list()
    if args.json:
        print(json.dumps([asdict(i) for i in infos]))
        return 0
    for i in infos:
        state = "revoked" if i.revoked else "active"
        print(f"{i.id}  {state:7}  {','.join(i.scopes):24}  {i.name}")
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
        p.add_argument(
            "--store",
            help=f"token file, or a ClickHouse URL for the shared token table (default $KI_TOKEN_STORE or {DEFAULT_TOKEN_STORE})",
        )
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
