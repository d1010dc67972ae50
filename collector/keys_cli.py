"""``ki keys ...``: enrol agents and manage their keys in the collector's key store (collector/keys.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kernel_insight.collector.keys import (
    DEFAULT_STORE,
    AgentCredentials,
    AgentInfo,
    ClickHouseKeyStore,
    KeyStore,
    KeyStoreBase,
    KeyStoreError,
    parse_agent_id,
    parse_label_args,
    read_key_file,
)
from kernel_insight.collector.private_json import opened_secret_store, read_secret_file, write_private
from kernel_insight.kql.errors import StorageError

__all__ = ["add_commands"]

Handler = Callable[[argparse.Namespace], int]


@contextlib.contextmanager
def _opened(args: argparse.Namespace, *, create: bool = False) -> Iterator[KeyStoreBase]:
    """The file store, or the table store of a ClickHouse URL (closed again afterwards). Only
    ``create`` (enrolling) may start a new file; the other commands refuse a path with no store."""
    target = args.store or os.environ.get("KI_KEY_STORE", str(DEFAULT_STORE))
    existing = None if create else "key store"
    with opened_secret_store(target, KeyStore, ClickHouseKeyStore, KeyStoreError, existing=existing) as store:
        yield store


def _key_file(args: argparse.Namespace, creds: AgentCredentials) -> Path:
    path = Path(args.key_file or f"ki-agent-{creds.agent_id.hex()}.key")
    creds.write_key_file(path)
    return path


def _add(args: argparse.Namespace) -> int:
    with _opened(args, create=True) as store:
        creds = store.add_agent(args.name, parse_label_args(args.label))
    path = _key_file(args, creds)
    print(
        f"enrolled agent {creds.agent_id.hex()} ({args.name}), key {creds.key_id}; key file {path} (mode 0600)"
    )
    return 0


def _rotate(args: argparse.Namespace) -> int:
    with _opened(args) as store:
        creds = store.rotate(parse_agent_id(args.agent_id))
    path = _key_file(args, creds)
    print(f"agent {creds.agent_id.hex()}: new key {creds.key_id}; key file {path} (mode 0600)")
    return 0


def _retire(args: argparse.Namespace) -> int:
    with _opened(args) as store:
        store.retire(parse_agent_id(args.agent_id), args.key_id)
    print(f"agent {args.agent_id}: key {args.key_id} retired")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    with _opened(args) as store:
        store.revoke(parse_agent_id(args.agent_id))
    print(f"agent {args.agent_id}: revoked")
    return 0


def _list(args: argparse.Namespace) -> int:
    with _opened(args) as store:
        infos = store.agents()
    if args.json:
        print(json.dumps([_asdict(i) for i in infos], indent=2))
        return 0
    for i in infos:
        state = "revoked" if i.revoked else "active"
        keys = ",".join(map(str, i.active_key_ids)) or "-"
        labels = ",".join(f"{k}={v}" for k, v in i.labels.items())
        print(f"{i.agent_id}  {state:7}  keys {keys:7}  {i.name}" + (f"  {{{labels}}}" if labels else ""))
    return 0


def _asdict(info: AgentInfo) -> dict[str, Any]:
    return {f: getattr(info, f) for f in AgentInfo.__slots__}


def _enrol(args: argparse.Namespace) -> int:
    """Enrol over the collector's API (``POST /v1/agents``, scope ``ingest-admin``): what a node's
    init step runs, so that agents never hold the key store's or ClickHouse's credentials."""
    import httpx

    path = Path(args.key_file)
    if path.exists():
        read_key_file(path)  # a damaged file is an error, not a reason to enrol again
        print(f"{path} exists; not enrolling again")
        return 0
    token = read_secret_file(Path(args.token_file)) if args.token_file else os.environ.get("KI_TOKEN", "")
    if not token:
        raise KeyStoreError(
            "enrolment needs a token with the ingest-admin scope: --token-file FILE or $KI_TOKEN"
        )
    verify: str | bool = args.ca_file or True
    try:
        answer = httpx.post(
            args.collector.rstrip("/") + "/v1/agents",
            json={"name": args.name, "labels": parse_label_args(args.label)},
            headers={"Authorization": f"Bearer {token}"},
            verify=verify,
            timeout=30,
        )
    except httpx.HTTPError as exc:
        raise KeyStoreError(f"cannot reach the collector at {args.collector}: {exc}") from None
    if answer.status_code != 201:
        raise KeyStoreError(
            f"the collector refused the enrolment ({answer.status_code}): {answer.text[:300]}"
        )
    write_private(path, answer.json()["key_file"].encode())
    creds = read_key_file(path)
    print(
        f"enrolled agent {creds.agent_id.hex()} ({args.name}), key {creds.key_id}; key file {path} (mode 0600)"
    )
    return 0


def _errors_to_exit(fn: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (KeyStoreError, StorageError, OSError) as exc:
            print(f"ki keys: {exc}", file=sys.stderr)
            return 1

    return run


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="enrol agents and manage their keys (the collector's key store)")
    ksub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    def action(name: str, fn: Handler, help_: str, aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
        p = ksub.add_parser(name, help=help_, aliases=list(aliases))
        p.add_argument(
            "--store",
            help=f"key store file, or a ClickHouse URL for the cluster table (default $KI_KEY_STORE or {DEFAULT_STORE})",
        )
        p.set_defaults(handler=_errors_to_exit(fn))
        return p

    a = action("add-agent", _add, "enrol a new agent; writes its key file", aliases=("add",))
    a.add_argument("name", help="a label for people, e.g. host-17/gpu0")
    a.add_argument("--key-file", help="where to write the agent's key file (default ki-agent-<id>.key)")
    a.add_argument(
        "--label",
        action="append",
        metavar="NAME=VALUE",
        help="a label of the agent's instance (model, host, rack, switch, ...); repeatable",
    )
    e = ksub.add_parser(
        "enrol", help="enrol this agent through a collector's API and write its key file (once; idempotent)"
    )
    e.add_argument("name", help="a label for people, e.g. host-17/gpu0")
    e.add_argument("--collector", required=True, help="collector URL, e.g. https://collector:8470")
    e.add_argument("--key-file", required=True, help="the key file to write (nothing happens when it exists)")
    e.add_argument(
        "--token-file", help="file holding a token with the ingest-admin scope (default: $KI_TOKEN)"
    )
    e.add_argument(
        "--label",
        action="append",
        metavar="NAME=VALUE",
        help="a label of the agent's instance (model, host, rack, switch, ...); repeatable",
    )
    e.add_argument("--ca-file", help="PEM CA bundle trusted for an https collector (default: the system's)")
    e.set_defaults(handler=_errors_to_exit(_enrol))
    r = action("rotate", _rotate, "give an agent a new key (the two newest stay active)")
    r.add_argument("agent_id")
    r.add_argument("--key-file", help="where to write the new key file (default ki-agent-<id>.key)")
    t = action("retire", _retire, "deactivate one of an agent's keys")
    t.add_argument("agent_id")
    t.add_argument("key_id", type=int)
    v = action("revoke", _revoke, "refuse everything from an agent from now on")
    v.add_argument("agent_id")
    lst = action("list", _list, "list agents and their key ids (never the keys)")
    lst.add_argument("--json", action="store_true", help="print JSON")
