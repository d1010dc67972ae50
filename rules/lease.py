"""Which collector evaluates a rule group: a lease per group in a ClickHouse table.

Several collectors over one ClickHouse load the same rule files; each group must be
evaluated by exactly one of them, or every alert would reach Alertmanager twice and
recorded series would be written twice. ClickHouse has no compare-and-set, but it
has insert deduplication: two inserts carrying the same ``insert_deduplication_token``
store one block. A lease is a sequence of *terms*; taking term ``n + 1`` is an insert
under the token ``<group>:<n + 1>``, so when two collectors race for it exactly one
row lands, and both read back the same holder. The holder renews its term at every
evaluation (a row with a later ``expires_ms``); a term whose expiry has passed may be
taken by anyone. Expiry is 1.5 intervals after the last renewal, so a dead holder's
groups move within two intervals. Clocks of the collectors are assumed to agree to
well under half an interval.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.schema import DEDUP_WINDOW
from kernel_insight.collector.clickhouse.sql import qualified
from kernel_insight.collector.clickhouse.store import Store
from kernel_insight.collector.clickhouse.versioned import latest_lease_term, replacing_table_ddl

__all__ = ["LEASE_TABLE", "Lease", "LeaseState", "holder_id"]

#: The table holding every group's lease terms.
LEASE_TABLE = "rule_leases"


def holder_id() -> str:
    """This process's name in the lease table: host, pid and a random part (a restarted pid differs)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The newest term of a group's lease."""

    term: int
    holder: str
    expires_ms: int


class Lease:
    """Take and renew group leases for ``holder`` in ``store``'s ``rule_leases`` table."""

    def __init__(self, store: Store, holder: str | None = None, *, table: str = LEASE_TABLE) -> None:
        self.store = store
        self.holder = holder or holder_id()
        self.table = qualified(store.database, table)
        self._name = table
        store.command(
            replacing_table_ddl(
                store,
                table,
                "group_key String, term UInt64, holder String, expires_ms Int64, version UInt64",
                "(group_key, term)",
                "which collector evaluates each rule group (docs/rules.md)",
                dedup_window=DEDUP_WINDOW,
            )
        )

    def current(self, group_key: str) -> LeaseState | None:
        """The newest term of ``group_key``'s lease, or None if nobody ever held it."""
        r = latest_lease_term(self.store, self._name, group_key)
        if r is None:
            return None
        return LeaseState(int(r["term"]), str(r["holder"]), int(r["expires"]))

    def _write(self, group_key: str, term: int, expires_ms: int, token: str | None) -> None:
        data = pa.table(
            {
                "group_key": pa.array([group_key], pa.string()),
                "term": pa.array([term], pa.uint64()),
                "holder": pa.array([self.holder], pa.string()),
                "expires_ms": pa.array([expires_ms], pa.int64()),
                "version": pa.array([time.time_ns()], pa.uint64()),
            }
        )
        self.store.insert_table(self._name, data, dedup_token=token)

    def hold(self, group_key: str, ttl_ms: int, now_ms: int | None = None) -> bool:
        """Renew this holder's lease or take a free one; True when this process holds it now."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        state = self.current(group_key)
        if state is not None and state.holder == self.holder:
            self._write(group_key, state.term, now + ttl_ms, f"{group_key}:{state.term}:{self.holder}:{now}")
            after = self.current(group_key)
            return after is not None and after.term == state.term
        if state is not None and state.expires_ms > now:
            return False
        term = 1 if state is None else state.term + 1
        # The one insert per term that ClickHouse keeps is the winner's (dedup by token).
        self._write(group_key, term, now + ttl_ms, f"lease:{group_key}:{term}")
        after = self.current(group_key)
        return after is not None and after.term == term and after.holder == self.holder

    def release(self, group_key: str) -> None:
        """Give the lease up at once (shutdown): the next collector need not wait for expiry."""
        state = self.current(group_key)
        if state is not None and state.holder == self.holder:
            self._write(group_key, state.term, 0, f"{group_key}:{state.term}:{self.holder}:release")
