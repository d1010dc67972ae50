"""Rate-limited logging for the server: one line per message per interval, with a count of the rest.

Under attack the same error repeats thousands of times a second (a flood once wrote 292 MB of
identical "Too many open files" tracebacks in two minutes); the first occurrence says all there
is to say, the count says how bad it is.

    >>> import logging
    >>> f = RepeatFilter(interval_s=60)
    >>> r = lambda: logging.LogRecord("x", logging.WARNING, "f", 1, "refused %s", ("a",), None)
    >>> [f.filter(r()) for _ in range(3)]
    [True, False, False]
"""

from __future__ import annotations

import logging
import sys
import threading
import time

__all__ = ["DEFAULT_REPEAT_INTERVAL_S", "RepeatFilter", "install_repeat_filter"]

#: Seconds between two lines of the same message.
DEFAULT_REPEAT_INTERVAL_S = 10.0
#: Messages remembered at once; past this the oldest are forgotten (each may then print once more).
_MAX_KEYS = 1024


class RepeatFilter(logging.Filter):
    """Passes a message (logger, level, format string) at most once per ``interval_s``.

    The next line that passes says how many were held back since the last one. Arguments
    are not part of the key, so "refused agent %s" with a thousand agent ids is one message.
    """

    def __init__(self, interval_s: float = DEFAULT_REPEAT_INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            since, held = self._seen.get(key, (-1.0, 0))
            if since >= 0 and now - since < self.interval_s:
                self._seen[key] = (since, held + 1)
                return False
            self._seen.pop(key, None)
            if len(self._seen) >= _MAX_KEYS:
                self._seen.pop(next(iter(self._seen)))
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} [{held} more like this in the last {now - since:.0f} s]"
        return True


def install_repeat_filter(
    interval_s: float = DEFAULT_REPEAT_INTERVAL_S, loggers: tuple[str, ...] = ("uvicorn", "uvicorn.access")
) -> RepeatFilter:
    """Put one :class:`RepeatFilter` on every handler of the root logger and of ``loggers``.

    A root logger without handlers gets a stderr handler at WARNING first, so that asyncio's and
    this package's warnings pass through the filter instead of Python's unfiltered last resort.
    """
    flt = RepeatFilter(interval_s)
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        if root.level > logging.WARNING or root.level == logging.NOTSET:
            root.setLevel(logging.WARNING)
    for logger in (root, *(logging.getLogger(name) for name in loggers)):
        for h in logger.handlers:
            if not any(isinstance(f, RepeatFilter) for f in h.filters):
                h.addFilter(flt)
    return flt
