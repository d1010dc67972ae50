"""The server back end of the store: a ClickHouse server or cluster through clickhouse-connect.

:class:`~kernel_insight.collector.clickhouse.store.Store` holds every statement; this module only
hands a statement or an Arrow table to the client, with the parameters in the text chDB reads too.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.errors import engine_errors
from kernel_insight.collector.clickhouse.schema import Retention
from kernel_insight.collector.clickhouse.sql import Params
from kernel_insight.collector.clickhouse.store import Store

__all__ = ["ServerStore"]


class ServerStore(Store):
    """A ClickHouse server or cluster through clickhouse-connect (any client it returns works).

    Example::

        store = ServerStore.connect("http://default:@clickhouse:8123", cluster="ki")
    """

    def __init__(
        self,
        client: Any,
        database: str = "ki",
        retention: Retention | None = None,
        *,
        cluster: str | None = None,
        create_schema: bool = True,
    ) -> None:
        super().__init__(database, retention, cluster)
        self._client = client
        if create_schema:
            try:
                self.create_schema()
            except BaseException:
                self.close()
                raise

    @classmethod
    def connect(
        cls,
        dsn: str,
        database: str = "ki",
        retention: Retention | None = None,
        *,
        cluster: str | None = None,
        **kwargs: Any,
    ) -> ServerStore:
        """Connect through clickhouse-connect; ``kwargs`` go to ``clickhouse_connect.get_client``."""
        import clickhouse_connect

        # One client serves every thread of a collector; a clickhouse-connect session would
        # refuse concurrent queries ("concurrent queries within the same session"), and the
        # store needs no session state, so none is made unless the caller asks for one.
        if "autogenerate_session_id" not in dsn:
            kwargs.setdefault("autogenerate_session_id", False)
        with engine_errors("cannot connect to ClickHouse"):
            client = clickhouse_connect.get_client(dsn=dsn, **kwargs)
        return cls(client, database, retention, cluster=cluster)

    def _command(self, sql: str, params: Params | None = None) -> None:
        with engine_errors("ClickHouse"):
            self._client.command(sql, **_passed_through(params))

    def _query(self, sql: str, params: Params | None = None) -> pa.Table:
        with engine_errors("ClickHouse"):
            result: pa.Table = self._client.query_arrow(sql, **_passed_through(params))
        return result

    def _query_blob(self, sql: str, params: Params | None = None) -> bytes:
        with engine_errors("ClickHouse"):
            data: bytes = self._client.raw_query(sql, fmt="RawBLOB", **_passed_through(params))
        return data

    def _insert(self, name: str, data: pa.Table, token: str | None) -> None:
        settings = {"insert_deduplication_token": token} if token else {}
        self._check_open()
        with engine_errors("ClickHouse insert"):
            self._client.insert_arrow(self._table(name), data, settings=settings)

    def _close(self) -> None:
        self._client.close()


class _Text:
    """A parameter already in ClickHouse's text form: clickhouse-connect sends ``str()`` of it as is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _passed_through(params: Params | None) -> dict[str, dict[str, _Text]]:
    """clickhouse-connect's ``parameters`` argument, formatted as for chDB so both engines read the same text."""
    return {"parameters": {k: _Text(v) for k, v in params.texts().items()}} if params else {}
