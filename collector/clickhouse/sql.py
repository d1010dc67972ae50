"""The one place SQL text is put together: identifiers quoted here, values sent as server-side parameters.

User text (label names and values, regexes, instance ids, batch ids) never enters a statement's
text: it travels as a ClickHouse query parameter, written ``{name:Type}`` in the text and
parsed by the server as a value of that type, so no value can change a statement's meaning.
Identifiers (databases, tables, columns) cannot be parameters where they name schema objects in
DDL, so ``ident`` quotes them; ``literal`` is only for the few places the engine takes no
parameter at all (DDL comments and engine arguments, ``SETTINGS`` of an ``INSERT``).

Example::

    p = Params()
    sql = f"SELECT count() FROM {qualified('ki', 'series')} WHERE metric = {p('up', 'String')}"
    store.query(sql, p)

Both back ends send the same text for a parameter (``param_text``): chDB reads it as the
server reads an HTTP ``param_<name>``, and clickhouse-connect passes it through unchanged.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_SCALE",
    "VALUE_ALIAS",
    "Params",
    "ident",
    "is_store_url",
    "literal",
    "ms_time",
    "ns_time",
    "param_text",
    "qualified",
]

#: Largest scale of a sample's decimal form (collector/valuecodec.py): 10**15 is exact as a float
#: (as is every power of ten up to 10**22).
MAX_SCALE = 15

#: The ``value`` column's expression: the same IEEE division as valuecodec's ``decode_values``, so
#: every read (kql, the push-downs, the health snapshot) sees the float that was written. ClickHouse
#: converts the Int64 to Float64 (exact below 2**53) and divides by an exact power of ten.
VALUE_ALIAS = (
    f"if(scale < 0, float_value, mantissa / [{', '.join(f'1e{k}' for k in range(MAX_SCALE + 1))}][scale + 1])"
)

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Words that read as syntax where an identifier is expected; such names are always quoted.
_KEYWORDS = frozenset(
    {
        "all", "and", "any", "array", "as", "asc", "between", "by", "case", "cluster", "database",
        "date", "default", "desc", "distinct", "else", "end", "false", "final", "format", "from",
        "global", "group", "having", "in", "index", "interval", "is", "join", "key", "like",
        "limit", "not", "null", "offset", "on", "or", "order", "prewhere", "primary", "sample",
        "select", "settings", "table", "then", "time", "timestamp", "to", "true", "ttl", "union",
        "when", "where", "with",
    }
)  # fmt: skip


def ident(name: str) -> str:
    """A ClickHouse identifier: bare when it is a plain word that is no keyword, else backquoted."""
    if _BARE.fullmatch(name) and name.lower() not in _KEYWORDS:
        return name
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def qualified(database: str, name: str) -> str:
    """``database.name`` with both parts quoted as identifiers."""
    return f"{ident(database)}.{ident(name)}"


def ms_time(ms: int) -> str:
    """A UTC DateTime64(3) from milliseconds since the epoch (an integer: no value text enters)."""
    return f"fromUnixTimestamp64Milli(toInt64({int(ms)}), 'UTC')"


def ns_time(ns: int) -> str:
    """A UTC DateTime64(9) from nanoseconds since the epoch (an integer: no value text enters)."""
    return f"fromUnixTimestamp64Nano(toInt64({int(ns)}), 'UTC')"


def literal(text: str) -> str:
    """A string literal, for the few places that take no parameter (DDL, an INSERT's SETTINGS)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Params(dict[str, Any]):
    """The values of a statement's ``{name:Type}`` placeholders, named ``p0``, ``p1``, ... in order of use.

    Calling it with a value and its ClickHouse type records the value and returns the
    placeholder to write into the statement; the object is then the statement's parameters.
    """

    def __call__(self, value: Any, type_: str) -> str:
        name = f"p{len(self)}"
        self[name] = value
        return f"{{{name}:{type_}}}"

    def texts(self) -> dict[str, str]:
        """Each value as ``param_text``: what the engine is handed."""
        return {k: param_text(v) for k, v in self.items()}


_ESCAPED = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"})
_QUOTED = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0", "'": "\\'"})


def param_text(value: Any) -> str:
    """``value`` in ClickHouse's escaped text form: how the server reads a query parameter.

    Top-level strings are the raw text with backslash escapes for the separator characters;
    arrays and tuples are read as literals, so their strings are quoted.
    """
    if isinstance(value, str):
        return value.translate(_ESCAPED)
    return _nested(value) if isinstance(value, list | tuple) else _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"no ClickHouse parameter form for {type(value).__name__}")


def _nested(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.translate(_QUOTED) + "'"
    if isinstance(value, list):
        return "[" + ",".join(_nested(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ",".join(_nested(v) for v in value) + ")"
    return _scalar(value)


def is_store_url(text: str | Path) -> bool:
    """Whether ``text`` names a ClickHouse (rather than a file): the URLs ``open_store`` connects to."""
    return re.match(r"^(https?|clickhouse|chdb)://", str(text)) is not None
