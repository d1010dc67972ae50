"""Agent enrolment keys: the collector's key store and the agent's key file (``ki keys``: keys_cli.py).

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

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_insight.collector.clickhouse.sql import is_store_url
from kernel_insight.collector.private_json import (
    CLUSTER_REFRESH_S,
    MISS_REFRESH_S,
    PrivateJsonFile,
    SecretStore,
    VersionedJsonTable,
    next_version,
    write_private,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "CLUSTER_REFRESH_S",
    "DEFAULT_STORE",
    "MAX_ACTIVE_KEYS",
    "MISS_REFRESH_S",
    "AgentCredentials",
    "AgentInfo",
    "ClickHouseKeyStore",
    "KeyStore",
    "KeyStoreBase",
    "KeyStoreError",
    "RevokedAgent",
    "UnknownAgent",
    "check_agent_name",
    "check_instance_labels",
    "is_store_url",
    "next_version",
    "parse_agent_id",
    "parse_label_args",
    "read_key_file",
]

#: Where ``ki keys`` and the collector look when nothing else is said (env KI_KEY_STORE overrides).
DEFAULT_STORE = Path("ki-data/keys.json")
#: Keys an agent may hold at once: the current one and the one being rotated in.
MAX_ACTIVE_KEYS = 2
KEY_SIZE = 32
_FORMAT_VERSION = 1
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class KeyStoreError(Exception):
    """A key store problem a person must fix; messages never contain key material."""


class UnknownAgent(KeyStoreError):
    """The agent id, or its key id, is not enrolled."""


class RevokedAgent(KeyStoreError):
    """The agent was enrolled and then revoked."""


def check_agent_name(name: str) -> None:
    """Agent names are labels for people: 1-200 characters on one line."""
    if not name or len(name) > 200 or any(c in name for c in "\n\r\0"):
        raise KeyStoreError("agent name must be 1-200 characters on one line")


#: Labels the collector sets itself on every series; an enrolment cannot claim them.
RESERVED_LABELS = frozenset({"__name__", "instance", "gpu", "gpu_product", "le", "simulated"})
#: Labels per instance at most, and the longest value (series carry them; see rows.SeriesLimits).
MAX_INSTANCE_LABELS = 16
MAX_LABEL_VALUE = 200


def check_instance_labels(labels: object) -> dict[str, str]:
    """Enrolment labels (model, host, rack, switch, anything) as a checked ``{name: value}``.

    Names are Prometheus label names (``[a-zA-Z_][a-zA-Z0-9_]*``, not ``__``-prefixed, not one
    of :data:`RESERVED_LABELS`); values are 1-200 characters on one line. Raises KeyStoreError.
    """
    if not isinstance(labels, dict):
        raise KeyStoreError('labels must be an object of strings, e.g. {"model": "llama-70b", "rack": "r1"}')
    if len(labels) > MAX_INSTANCE_LABELS:
        raise KeyStoreError(f"{len(labels)} labels: at most {MAX_INSTANCE_LABELS} per instance")
    out: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise KeyStoreError(f"invalid label name {str(name)[:60]!r}: expected [a-zA-Z_][a-zA-Z0-9_]*")
        if name in RESERVED_LABELS:
            raise KeyStoreError(f"label {name!r} is set by the collector and cannot be given at enrolment")
        if (
            not isinstance(value, str)
            or not value
            or len(value) > MAX_LABEL_VALUE
            or any(c in value for c in "\n\r\0")
        ):
            raise KeyStoreError(
                f"label {name!r}: the value must be 1-{MAX_LABEL_VALUE} characters on one line"
            )
        out[name] = value
    return dict(sorted(out.items()))


def parse_label_args(items: list[str] | None) -> dict[str, str]:
    """``--label k=v`` arguments (repeatable) as checked labels."""
    labels: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise KeyStoreError(f"--label {item!r}: expected NAME=VALUE")
        labels[name.strip()] = value.strip()
    return check_instance_labels(labels)


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
        write_private(path, self.key_file_text().encode())


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
    labels: dict[str, str] = field(default_factory=dict)


class KeyStoreBase(SecretStore[bytes]):
    """Agents and their keys, whatever holds them; the rules (rotation, retirement, revocation) live here.

    The records and their back end (a file or a ClickHouse table) are ``SecretStore``'s.
    """

    # ---- reading ---------------------------------------------------------------------

    def key_for(self, agent_id: bytes, key_id: int) -> bytes:
        """The active key (agent_id, key_id), or UnknownAgent / RevokedAgent."""
        with self._lock:
            try:
                return self._lookup(self._current(), agent_id, key_id)
            except RevokedAgent:
                raise
            except UnknownAgent:
                # Enrolled or rotated a moment ago through another collector? A 403 would make the
                # agent drop the batch, so look once more in a fresh copy before refusing.
                return self._lookup(self._current(miss=True), agent_id, key_id)

    @staticmethod
    def _lookup(agents: dict[bytes, dict[str, Any]], agent_id: bytes, key_id: int) -> bytes:
        agent = agents.get(agent_id)
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
            return [self._info(a) for a in self._current().values()]

    def agent(self, agent_id: bytes) -> AgentInfo:
        """One agent's record (no keys), or UnknownAgent."""
        with self._lock:
            agent = self._current().get(agent_id) or self._current(miss=True).get(agent_id)
            if agent is None:
                raise UnknownAgent(f"agent {agent_id.hex()} is not enrolled")
            return self._info(agent)

    @staticmethod
    def _info(a: dict[str, Any]) -> AgentInfo:
        return AgentInfo(
            a["agent_id"],
            a["name"],
            a["created"],
            bool(a.get("revoked")),
            tuple(k["id"] for k in a["keys"] if k["active"]),
            tuple(k["id"] for k in a["keys"] if not k["active"]),
            dict(a.get("labels") or {}),
        )

    def labels_of(self, instance: str) -> dict[str, str]:
        """The enrolment labels of the instance an agent feeds (its id in hex); {} when unknown.

        The collector's sink applies them to the instance and every series it derives.
        """
        agent = self._record_of(instance)
        return dict(agent.get("labels") or {}) if agent is not None else {}

    def name_of(self, instance: str) -> str | None:
        """The enrolment name of the instance an agent feeds (its id in hex); None when unknown.

        The health snapshot shows it beside the id (docs/api.md), for people to read.
        """
        agent = self._record_of(instance)
        return str(agent["name"]) if agent is not None else None

    def _record_of(self, instance: str) -> dict[str, Any] | None:
        try:
            agent_id = parse_agent_id(instance)
        except KeyStoreError:
            return None
        with self._lock:
            return self._current().get(agent_id) or self._current(miss=True).get(agent_id)

    # ---- writing ---------------------------------------------------------------------

    @staticmethod
    def _agent(agents: dict[bytes, dict[str, Any]], agent_id: bytes) -> dict[str, Any]:
        agent = agents.get(agent_id)
        if agent is None:
            raise UnknownAgent(f"agent {agent_id.hex()} is not enrolled")
        return agent

    def add_agent(self, name: str, labels: dict[str, str] | None = None) -> AgentCredentials:
        """Enrol a new agent with a fresh id and key; ``labels`` are its instance's (model, rack, ...)."""
        return self.add_agents([name], labels)[0]

    def add_agents(
        self, names: Sequence[str], labels: dict[str, str] | None = None
    ) -> list[AgentCredentials]:
        """Enrol one new agent per name (each its own id and key, all with ``labels``) in one edit
        of the store: a fleet's enrolment costs one write, not one per agent."""
        for name in names:
            check_agent_name(name)
        checked = check_instance_labels(labels or {})
        out = []
        with self._editing() as agents:
            for name in names:
                agent_id = secrets.token_bytes(16)
                key = secrets.token_bytes(KEY_SIZE)
                agents[agent_id] = {
                    "agent_id": agent_id.hex(),
                    "name": name,
                    "created": time.time(),
                    "revoked": False,
                    "labels": dict(checked),
                    "keys": [{"id": 1, "key": key.hex(), "created": time.time(), "active": True}],
                }
                out.append(AgentCredentials(agent_id, 1, key))
        return out

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


class KeyStore(KeyStoreBase):
    """The collector's table of agents and their keys, in one JSON file of mode 0600.

    Writers (``ki keys``) take an exclusive lock and replace the file
    atomically; a running collector notices the change on its next lookup,
    so a revocation takes effect within a second, without a restart.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        super().__init__(
            PrivateJsonFile(
                self.path,
                what="key store",
                field="agents",
                version=_FORMAT_VERSION,
                key=lambda a: bytes.fromhex(a["agent_id"]),
                error=KeyStoreError,
            )
        )


class ClickHouseKeyStore(KeyStoreBase):
    """The key store as a ClickHouse table, for several collectors over one store (cluster mode).

    One row per edit of an agent (``agent_id``, ``version``, ``doc``: the agent's JSON
    record); the newest version wins (``argMax``), and ReplacingMergeTree folds old
    rows away in the background. Every process re-reads the table at least every
    ``refresh_s`` (default :data:`CLUSTER_REFRESH_S`), and at once (at most every
    :data:`MISS_REFRESH_S`) when a lookup finds no such agent, so an enrolment made
    through one collector is usable through another at once and a revocation is
    honoured everywhere within ``refresh_s`` (plus replication delay on a cluster).
    Key material reaches the engine only as Arrow data, never inside SQL text, so no
    engine error message can quote it. Concurrent edits of one agent through two
    processes: the later write wins.
    """

    def __init__(self, store: Store, *, table: str = "agent_keys", refresh_s: float | None = None) -> None:
        self.store, self.table = store, table
        super().__init__(
            VersionedJsonTable(
                store,
                table,
                id_column="agent_id",
                what="key store table",
                comment="agent records and keys (docs/storage.md)",
                encode_id=bytes.hex,
                decode_id=bytes.fromhex,
                error=KeyStoreError,
                refresh_s=refresh_s,
            )
        )
