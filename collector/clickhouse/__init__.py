"""The collector's one owner of ClickHouse: every SQL statement and the schema (docs/storage.md).

``schema`` (the one table definition and the DDL generated from it), ``sql`` (how a statement is
written: identifiers quoted, values as server-side parameters), ``store`` (every write and
maintenance statement; its back ends ``embedded``, chDB in-process, and ``server``,
clickhouse-connect; its parts ``errors``,
``arrow_rows``, ``series_index``, ``ingest_groups``, ``schema_sync``, ``head_load``,
``known_metrics``), ``query`` (kql's storage
protocol over the tables), and the named reads and writes the rest calls: ``timeline``
(spans, per-call rows, events, trace exports), ``capture_rows``, ``health`` (the snapshot's
reads besides kql's), ``versioned`` (key and token tables, rule leases), ``freeze`` (backup and
restore). The API, the rules and the rest of the collector call these; none writes a statement
of its own (tests/foundation/test_sql_owner.py).
"""
