"""The collector's one owner of ClickHouse: every SQL statement and the schema (docs/storage.md).

``schema`` (the one table definition and the DDL generated from it), ``sql`` (how a statement is
written: identifiers quoted, values as server-side parameters), ``store`` (the two back ends,
embedded chDB and a server, and every write and maintenance statement), ``query`` (kql's storage
protocol over the tables). The API, the rules and the rest of the collector call these modules'
methods; none writes a statement of its own (tests/foundation/test_sql_owner.py).
"""
