"""What kql raises. Catch :class:`KqlError` for everything, or one branch of the tree below.

::

    KqlError
    ├── KqlParseError          the query is not valid kql (syntax, unknown function, bad duration)
    │   └── KqlTypeError       it parses but a value has the wrong type (names function and argument)
    └── KqlExecutionError      a valid query failed while running
        ├── QueryTimeoutError      ran longer than the timeout
        ├── QueryCancelledError    its cancel token was set
        ├── TooManySamplesError    loaded more samples than allowed
        ├── TooManySeriesError     selected or produced more series than allowed
        ├── StorageError           the storage back end failed (``retryable``: try again later)
        └── KqlEvaluationError     the data made it fail (duplicate label sets, NaN parameter, ...)

Parse and type errors carry a position; ``str()`` shows ``line:column: parse error: message``
followed by the query and a caret under the problem.
"""

from __future__ import annotations

__all__ = [
    "KqlError",
    "KqlEvaluationError",
    "KqlExecutionError",
    "KqlParseError",
    "KqlTypeError",
    "QueryCancelledError",
    "QueryTimeoutError",
    "StorageError",
    "TooManySamplesError",
    "TooManySeriesError",
]


class KqlError(Exception):
    """Base of every kql error; ``message`` is the text without position or query."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class KqlParseError(KqlError):
    """The query is not valid kql: ``line`` and ``column`` are 1-based; ``start``/``end`` are offsets.

    >>> from kernel_insight.kql import parse
    >>> try:
    ...     parse("sum(rate(x[5m])")
    ... except KqlParseError as e:
    ...     print(e)
    1:16: parse error: unexpected end of input, expected ")" or ","
      sum(rate(x[5m])
                     ^
    """

    kind = "parse error"

    def __init__(self, message: str, query: str = "", start: int = 0, end: int | None = None) -> None:
        super().__init__(message)
        self.query = query
        self.start = max(0, min(start, len(query)))
        self.end = self.start if end is None else max(self.start, min(end, len(query)))
        before = query[: self.start]
        self.line = before.count("\n") + 1
        self.column = self.start - (before.rfind("\n") + 1) + 1

    @property
    def brief(self) -> str:
        """One line: ``1:16: parse error: message``, the form the Prometheus HTTP API returns."""
        return f"{self.line}:{self.column}: {self.kind}: {self.message}"

    def caret(self) -> str:
        """The query line holding the problem with ``^`` marks under it."""
        if not self.query:
            return ""
        lines = self.query.split("\n")
        text = lines[self.line - 1]
        width = max(1, min(self.end, self.start + len(text) - self.column + 1) - self.start)
        return f"  {text}\n  {' ' * (self.column - 1)}{'^' * width}"

    def __str__(self) -> str:
        caret = self.caret()
        return f"{self.brief}\n{caret}" if caret else self.brief


class KqlTypeError(KqlParseError):
    """A well-formed query with a type mistake, e.g. an instant vector where a range vector is needed."""

    kind = "type error"


class KqlExecutionError(KqlError):
    """A valid query failed while it ran."""


class QueryTimeoutError(KqlExecutionError):
    """The query ran longer than its timeout."""

    @classmethod
    def after(cls, timeout_s: float) -> QueryTimeoutError:
        """The error every part of a query raises at its deadline (Prometheus' text, plus the timeout)."""
        return cls(f"query timed out in expression evaluation (timeout {timeout_s:g}s)")


class QueryCancelledError(KqlExecutionError):
    """The query's cancel token was set."""


class TooManySamplesError(KqlExecutionError):
    """The query would hold more samples in memory at once than the engine's ``max_samples``."""

    #: Prometheus' text for ``ErrTooManySamples``.
    MESSAGE = "query processing would load too many samples into memory in query execution"

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)


class TooManySeriesError(KqlExecutionError):
    """The query selected or produced more series than the engine's ``max_series``."""


class StorageError(KqlExecutionError):
    """The storage back end failed; the original exception is ``__cause__``.

    The one storage error of the project: the collector's store raises it (and its subclass
    ``StorageUnavailable``) too, so every layer reads one notion of ``retryable``: the same
    request may succeed later (store unreachable, overloaded, closed), answered 503 with
    ``Retry-After``. A permanent one (the engine refused the statement or its values) is not
    retried. Wrapping keeps it: an error raised ``from`` a retryable one is retryable.

    >>> StorageError("disk full", retry_after_s=30).retryable
    True
    """

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self._retry_after_s = retry_after_s

    @property
    def retry_after_s(self) -> int | None:
        """Seconds to wait before the same request may succeed; ``None`` when retrying cannot help."""
        if self._retry_after_s is not None:
            return self._retry_after_s
        cause = self.__cause__
        return cause.retry_after_s if isinstance(cause, StorageError) else None

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later (HTTP 503 with ``Retry-After``)."""
        return self.retry_after_s is not None


class KqlEvaluationError(KqlExecutionError):
    """The data made evaluation fail, e.g. two output series with the same labels."""
