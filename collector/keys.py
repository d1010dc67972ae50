"""Agent enrolment keys: the collector's key store, the agent's key file, and ``ki keys ...``.

Key material never appears in a repr, a log line or an error message; only
agent ids (public, they travel in every batch header) and key ids do.

Exceptions::

    KeyStoreError
    +-- UnknownAgent    no such agent id (or no such key id for it)  -> 403
    +-- RevokedAgent    the agent was revoked                        -> 403

Example::

    store = KeyStore(Path("ki-data/keys.json"))
    creds = store.add_agent("host-17/gpu0")
    creds.write_key_file(Path("/etc/kernel-insight/agent.key"))
    store.key_for(creds.agent_id, creds.key_id)  # the 32-byte key
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_STORE",
    "MAX_ACTIVE_KEYS",
    "AgentCredentials",
    "AgentInfo",
    "KeyStore",
    "KeyStoreError",
    "RevokedAgent",
    "UnknownAgent",
    "add_commands",
    "parse_agent_id",
    "read_key_file",
]

#: Where ``ki keys`` and the collector look when nothing else is said (env KI_KEY_STORE overrides).
DEFAULT_STORE = Path("ki-data/keys.json")
#: Keys an agent may hold at once: the current one and the one being rotated in.
MAX_ACTIVE_KEYS = 2
KEY_SIZE = 32
_FORMAT_VERSION = 1
_RELOAD_CHECK_S = 0.5


class KeyStoreError(Exception):
    """A key store problem a person must fix; messages never contain key material."""


class UnknownAgent(KeyStoreError):
    """The agent id, or its key id, is not enrolled."""


class RevokedAgent(KeyStoreError):
    """The agent was enrolled and then revoked."""


def parse_agent_id(text: str) -> bytes:
    """An agent id as printed (32 hex digits, dashes allowed) to its 16 bytes."""
    raw = text.strip().replace("-", "")
    try:
        value = bytes.fromhex(raw)
    except ValueError:
        raise KeyStoreError(f"invalid agent id {text!r}: expected 32 hex digits") from None
    if len(value) != 16:
        raise KeyStoreError(f"invalid agent id {text!r}: expected 32 hex digits")
    return value


@dataclass(frozen=True, slots=True)
class AgentCredentials:
    """What one agent needs to seal batches; written to its key file, never logged."""

    agent_id: bytes
    key_id: int
    key: bytes = field(repr=False)

    def key_file_text(self) -> str:
        return (
            "# Kernel Insight agent key (docs/agent.md). Secret: keep it mode 0600.\n"
            f"agent_id = {self.agent_id.hex()}\n"
            f"key_id = {self.key_id}\n"
            f"key = {self.key.hex()}\n"
        )

    def write_key_file(self, path: Path) -> None:
        """Create the file 0600 from the start, so the key is never readable by others."""
        _write_private(path, self.key_file_text().encode())


def read_key_file(path: Path) -> AgentCredentials:
    """Parse an agent key file (the format ki-agent reads)."""
    values: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise KeyStoreError(f"{path}:{lineno}: expected 'name = value'")
        values[name.strip()] = value.strip()
    try:
        key = bytes.fromhex(values["key"])
        creds = AgentCredentials(parse_agent_id(values["agent_id"]), int(values["key_id"]), key)
    except (KeyError, ValueError) as exc:
        raise KeyStoreError(f"{path}: incomplete or invalid key file ({type(exc).__name__})") from None
    if len(creds.key) != KEY_SIZE:
        raise KeyStoreError(f"{path}: the key must be {KEY_SIZE} bytes")
    return creds


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What may be shown about an agent: everything but the keys."""

    agent_id: str
    name: str
    created: float
    revoked: bool
    active_key_ids: tuple[int, ...]
    retired_key_ids: tuple[int, ...]


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class KeyStore:
    """The collector's table of agents and their keys, in one JSON file of mode 0600.

    Writers (``ki keys``) take an exclusive lock and replace the file
    atomically; a running collector notices the change on its next lookup,
    so a revocation takes effect within a second, without a restart.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._agents: dict[bytes, dict[str, Any]] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self._load()

    # ---- reading ---------------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> None:
        stamp = self._file_stamp()
        if stamp is None:
            self._agents, self._stamp = {}, None
            return
        st = self.path.stat()
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise KeyStoreError(
                f"key store {self.path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 it"
            )
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("version") != _FORMAT_VERSION:
                raise KeyStoreError(
                    f"key store {self.path}: unsupported format version {doc.get('version')!r}"
                )
            agents = {bytes.fromhex(a["agent_id"]): a for a in doc["agents"]}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KeyStoreError(f"key store {self.path} is corrupt ({type(exc).__name__})") from None
        self._agents, self._stamp = agents, stamp

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < _RELOAD_CHECK_S:
            return
        self._checked = now
        if self._file_stamp() != self._stamp:
            self._load()

    def key_for(self, agent_id: bytes, key_id: int) -> bytes:
        """The active key (agent_id, key_id), or UnknownAgent / RevokedAgent."""
        with self._lock:
            self._refresh()
            agent = self._agents.get(agent_id)
            if agent is None:
                raise UnknownAgent(f"agent {agent_id.hex()} is not enrolled")
            if agent.get("revoked"):
                raise RevokedAgent(f"agent {agent_id.hex()} was revoked")
            for k in agent["keys"]:
                if k["id"] == key_id and k["active"]:
                    return bytes.fromhex(k["key"])
            raise UnknownAgent(f"agent {agent_id.hex()} has no active key {key_id}")

    def agents(self) -> list[AgentInfo]:
        with self._lock:
            self._refresh()
            return [self._info(a) for a in self._agents.values()]

    @staticmethod
    def _info(a: dict[str, Any]) -> AgentInfo:
        return AgentInfo(
            a["agent_id"],
            a["name"],
            a["created"],
            bool(a.get("revoked")),
            tuple(k["id"] for k in a["keys"] if k["active"]),
            tuple(k["id"] for k in a["keys"] if not k["active"]),
        )

    # ---- writing ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict[bytes, dict[str, Any]]]:
        """Lock the file against other writers, reload, edit, write back atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with self._lock:
                self._load()
                yield self._agents
                doc = {"version": _FORMAT_VERSION, "agents": list(self._agents.values())}
                _write_private(self.path, json.dumps(doc, indent=1).encode())
                self._stamp = self._file_stamp()
        finally:
            os.close(fd)

    def _agent(self, agents: dict[bytes, dict[str, Any]], agent_id: bytes) -> dict[str, Any]:
        agent = agents.get(agent_id)
        if agent is None:
            raise UnknownAgent(f"agent {agent_id.hex()} is not enrolled")
        return agent

    def add_agent(self, name: str) -> AgentCredentials:
        """Enrol a new agent with a fresh id and key."""
        if not name or len(name) > 200 or any(c in name for c in "\n\r\0"):
            raise KeyStoreError("agent name must be 1-200 characters on one line")
        agent_id = secrets.token_bytes(16)
        key = secrets.token_bytes(KEY_SIZE)
        with self._editing() as agents:
            agents[agent_id] = {
                "agent_id": agent_id.hex(),
                "name": name,
                "created": time.time(),
                "revoked": False,
                "keys": [{"id": 1, "key": key.hex(), "created": time.time(), "active": True}],
            }
        return AgentCredentials(agent_id, 1, key)

    def rotate(self, agent_id: bytes) -> AgentCredentials:
        """Add a new key; with two already active, the older one is retired."""
        key = secrets.token_bytes(KEY_SIZE)
        with self._editing() as agents:
            agent = self._agent(agents, agent_id)
            if agent.get("revoked"):
                raise RevokedAgent(f"agent {agent_id.hex()} was revoked; enrol a new agent instead")
            key_id = max(k["id"] for k in agent["keys"]) + 1
            active = [k for k in agent["keys"] if k["active"]]
            for k in active[: max(0, len(active) - MAX_ACTIVE_KEYS + 1)]:
                k["active"] = False
            agent["keys"].append({"id": key_id, "key": key.hex(), "created": time.time(), "active": True})
        return AgentCredentials(agent_id, key_id, key)

    def retire(self, agent_id: bytes, key_id: int) -> None:
        """End a key's life once the agent runs on its successor."""
        with self._editing() as agents:
            agent = self._agent(agents, agent_id)
            for k in agent["keys"]:
                if k["id"] == key_id:
                    k["active"] = False
                    return
            raise UnknownAgent(f"agent {agent_id.hex()} has no key {key_id}")

    def revoke(self, agent_id: bytes) -> None:
        """Refuse everything from this agent from now on (403)."""
        with self._editing() as agents:
            self._agent(agents, agent_id)["revoked"] = True


# ---- ki keys ... -----------------------------------------------------------------------

Handler = Callable[[argparse.Namespace], int]


def _store(args: argparse.Namespace) -> KeyStore:
    return KeyStore(Path(args.store or os.environ.get("KI_KEY_STORE", str(DEFAULT_STORE))))


def _key_file(args: argparse.Namespace, creds: AgentCredentials) -> Path:
    path = Path(args.key_file or f"ki-agent-{creds.agent_id.hex()}.key")
    creds.write_key_file(path)
    return path


def _add(args: argparse.Namespace) -> int:
    creds = _store(args).add_agent(args.name)
    path = _key_file(args, creds)
    print(
        f"enrolled agent {creds.agent_id.hex()} ({args.name}), key {creds.key_id}; key file {path} (mode 0600)"
    )
    return 0


def _rotate(args: argparse.Namespace) -> int:
    creds = _store(args).rotate(parse_agent_id(args.agent_id))
    path = _key_file(args, creds)
    print(f"agent {creds.agent_id.hex()}: new key {creds.key_id}; key file {path} (mode 0600)")
    return 0


def _retire(args: argparse.Namespace) -> int:
    _store(args).retire(parse_agent_id(args.agent_id), args.key_id)
    print(f"agent {args.agent_id}: key {args.key_id} retired")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    _store(args).revoke(parse_agent_id(args.agent_id))
    print(f"agent {args.agent_id}: revoked")
    return 0


def _list(args: argparse.Namespace) -> int:
    infos = _store(args).agents()
    if args.json:
        print(json.dumps([_asdict(i) for i in infos], indent=2))
        return 0
    for i in infos:
        state = "revoked" if i.revoked else "active"
        keys = ",".join(map(str, i.active_key_ids)) or "-"
        print(f"{i.agent_id}  {state:7}  keys {keys:7}  {i.name}")
    return 0


def _asdict(info: AgentInfo) -> dict[str, Any]:
    return {f: getattr(info, f) for f in AgentInfo.__slots__}


def _errors_to_exit(fn: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (KeyStoreError, OSError) as exc:
            print(f"ki keys: {exc}", file=sys.stderr)
            return 1

    return run


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="enrol agents and manage their keys (the collector's key store)")
    ksub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    def action(name: str, fn: Handler, help_: str) -> argparse.ArgumentParser:
        p = ksub.add_parser(name, help=help_)
        p.add_argument("--store", help=f"key store file (default $KI_KEY_STORE or {DEFAULT_STORE})")
        p.set_defaults(handler=_errors_to_exit(fn))
        return p

    a = action("add", _add, "enrol a new agent; writes its key file")
    a.add_argument("name", help="a label for people, e.g. host-17/gpu0")
    a.add_argument("--key-file", help="where to write the agent's key file (default ki-agent-<id>.key)")
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
