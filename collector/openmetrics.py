"""Parse Prometheus text exposition and OpenMetrics text, timestamps included, for backfill (`ki import`).

Errors name the line and column (``line 3, column 14: ...``), because these files are
written by people and by scripts, and "invalid input" helps neither.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.csv as pa_csv  # type: ignore[import-untyped]

from kernel_insight.collector.rows import (
    MAX_TS_MS,
    MIN_TS_MS,
    Labels,
    SampleBatch,
    SampleBuilder,
    SeriesLimits,
    canonical_labels,
    validate_series,
)

__all__ = [
    "DEFAULT_LIMITS",
    "Exposition",
    "ExpositionReader",
    "MetricMeta",
    "OpenMetricsError",
    "detect_format",
    "parse_exposition",
]

#: Prometheus' classic names and Mimir's size limits (rows.SeriesLimits).
DEFAULT_LIMITS = SeriesLimits()

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NAME_RE = re.compile(_NAME)
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUOTED_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_FLOAT_RE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf(?:inity)?)|(?i:nan))")
_INT_RE = re.compile(r"[+-]?\d+")
_WS_RE = re.compile(r"[ \t]+")
_FAST_RE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\})?)[ \t]+(\S+)(?:[ \t]+(\S+))?[ \t]*$'
)

_COMMENT_LINE = re.compile(rb"^#[^\n]*", re.M)
_COMMENT_LINE_NL = re.compile(rb"^#[^\n]*(?:\n|\Z)", re.M)

# The columnar path: Arrow's CSV reader (C++) splits ``series value timestamp`` lines at their
# single spaces and parses both numbers. Quotes are plain characters to it, so a label value is
# never unescaped here (the series text is parsed by our own parser, once per series). On the
# calling thread: ``ki import`` inserts on another, so Arrow's threads bought no CPU (1.3 s for
# the bench's 3.4M samples either way) and held ~10 MB more of blocks in flight at the peak.
_CSV_READ = pa_csv.ReadOptions(column_names=["series", "value", "ts"], use_threads=False, block_size=1 << 20)
_CSV_PARSE = pa_csv.ParseOptions(
    delimiter=" ", quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=False
)


def _csv_convert(ts_type: pa.DataType) -> pa_csv.ConvertOptions:
    return pa_csv.ConvertOptions(
        column_types={"series": pa.dictionary(pa.int32(), pa.binary()), "value": pa.float64(), "ts": ts_type},
        null_values=[],
        true_values=[],
        false_values=[],
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )


_CSV_CONVERT_MS = _csv_convert(pa.int64())
_CSV_CONVERT_SECONDS = _csv_convert(pa.float64())
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_TYPES = {
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
    "untyped",
    "unknown",
}


class OpenMetricsError(ValueError):
    """Malformed exposition text; ``line`` and ``column`` are 1-based."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column
        self.message = message


@dataclass(slots=True)
class MetricMeta:
    type: str = "unknown"
    help: str = ""
    unit: str = ""


@dataclass(slots=True)
class Exposition:
    samples: SampleBatch
    metadata: dict[str, MetricMeta] = field(default_factory=dict)
    format: str = "prometheus"  # or "openmetrics"
    defaulted_timestamps: int = 0  # samples that had no timestamp and got the default


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), text)


class _Line:
    __slots__ = ("no", "pos", "text")

    def __init__(self, no: int, text: str) -> None:
        self.no = no
        self.text = text
        self.pos = 0

    def fail(self, message: str, pos: int | None = None) -> OpenMetricsError:
        return OpenMetricsError(self.no, (self.pos if pos is None else pos) + 1, message)

    def match(self, pattern: re.Pattern[str]) -> str | None:
        m = pattern.match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group(0)

    def expect(self, char: str) -> None:
        if not self.text.startswith(char, self.pos):
            got = repr(self.text[self.pos]) if self.pos < len(self.text) else "end of line"
            raise self.fail(f"expected {char!r}, got {got}")
        self.pos += len(char)

    def skip_ws(self) -> bool:
        return self.match(_WS_RE) is not None

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def quoted(self) -> str:
        start = self.pos
        m = _QUOTED_RE.match(self.text, self.pos)
        if m is None:
            raise self.fail("unterminated or invalid quoted string", start)
        self.pos = m.end()
        return _unescape(m.group(1))


def _labels(ln: _Line, name: str | None) -> tuple[str | None, list[tuple[str, str]]]:
    """Parse ``{...}``; a bare quoted string is the metric name (Prometheus 3 UTF-8 names)."""
    ln.expect("{")
    labels: list[tuple[str, str]] = []
    seen: set[str] = set()
    while True:
        ln.skip_ws()
        if ln.text.startswith("}", ln.pos):
            ln.pos += 1
            return name, labels
        start = ln.pos
        if ln.text.startswith('"', ln.pos):
            key = ln.quoted()
            ln.skip_ws()
            if ln.text.startswith((",", "}"), ln.pos):
                if name is not None:
                    raise ln.fail("the metric name is given twice", start)
                name = key
                if ln.text.startswith(",", ln.pos):
                    ln.pos += 1
                continue
        else:
            got = ln.match(_LABEL_NAME_RE)
            if got is None:
                raise ln.fail("expected a label name")
            key = got
            ln.skip_ws()
        ln.expect("=")
        ln.skip_ws()
        if not ln.text.startswith('"', ln.pos):
            raise ln.fail("expected a quoted label value")
        value = ln.quoted()
        if key in seen or key == "__name__":
            raise ln.fail(f"label {key!r} appears twice", start)
        seen.add(key)
        labels.append((key, value))
        ln.skip_ws()
        if ln.text.startswith(",", ln.pos):
            ln.pos += 1
        elif not ln.text.startswith("}", ln.pos):
            raise ln.fail("expected ',' or '}' after a label")


def _float(ln: _Line, what: str) -> float:
    start = ln.pos
    text = ln.match(_FLOAT_RE)
    if text is None and ln.text.startswith("{", start):
        # The composite native-histogram value of the OpenMetrics 2.0 draft and of promqltest's
        # {{...}}: no text format Prometheus reads carries one (docs/storage.md, "Import paths").
        raise ln.fail(
            f"invalid {what}: a native histogram ({{count:..., buckets:...}}) has no form in the Prometheus "
            "text or OpenMetrics 1.0 formats; send it by remote_write (Prometheus scrapes it as protobuf)",
            start,
        )
    if text is None or (not ln.at_end() and ln.text[ln.pos] not in " \t"):
        raise ln.fail(f"invalid {what}", start)
    return float(text)


def parse_exposition(
    text: str,
    *,
    default_timestamp_ms: int | None = None,
    format: str = "auto",
    limits: SeriesLimits = DEFAULT_LIMITS,
) -> Exposition:
    """Samples of every line; a sample without a timestamp gets ``default_timestamp_ms`` or is an error.

    ``format="auto"`` reads OpenMetrics (timestamps in seconds) when the text ends with ``# EOF``,
    else Prometheus text (timestamps in milliseconds). Big files go through
    :class:`ExpositionReader` instead, a chunk at a time.
    """
    raw = text.encode()
    if format == "auto":
        format = detect_format(raw[-64:])
    reader = ExpositionReader(format=format, default_timestamp_ms=default_timestamp_ms, limits=limits)
    batch = reader.feed(raw)
    reader.finish()
    return Exposition(batch, reader.metadata, format, reader.defaulted)


def detect_format(tail: bytes) -> str:
    """``openmetrics`` when the text's last bytes are its ``# EOF`` line, else ``prometheus``."""
    if tail.endswith(b"\n"):
        tail = tail[:-1]
    if tail.endswith(b"\r"):
        tail = tail[:-1]
    return "openmetrics" if tail == b"# EOF" or tail.endswith(b"\n# EOF") else "prometheus"


class ExpositionReader:
    """Parses exposition text a chunk of whole lines at a time, so a file of any size fits in memory.

    Lines of the usual shape (``series value timestamp``, single spaces) take a fast path:
    Arrow's CSV reader splits the lines and parses the numbers in C++ (the series texts come
    out dictionary-encoded, so each distinct one is looked up once per block, and parsed and
    checked once, in full); a chunk it cannot take (a space inside a label value) goes through
    numpy instead (the last two spaces of each line, a dict lookup per line). A chunk with
    anything else (missing timestamps, tabs, CRLF, exemplars, an error) goes through the
    line-by-line parser, which also gives the error its line and column.

    >>> r = ExpositionReader(format="prometheus")
    >>> len(r.feed(b"up 1 1000\nup 0 2000\n"))
    2
    """

    def __init__(
        self,
        *,
        format: str = "prometheus",
        default_timestamp_ms: int | None = None,
        limits: SeriesLimits = DEFAULT_LIMITS,
    ) -> None:
        if format not in ("prometheus", "openmetrics"):
            raise ValueError(f"unknown format {format!r}: use prometheus or openmetrics")
        self.format = format
        self.om = format == "openmetrics"
        self.default_timestamp_ms = default_timestamp_ms
        self.limits = limits
        self.metadata: dict[str, MetricMeta] = {}
        self.defaulted = 0  # samples that had no timestamp and got the default
        self.lines = 0  # lines consumed so far
        self.eof_seen = False
        self._ids: dict[bytes, int] = {}  # series text -> index in _series (fast path)
        self._series: list[Labels] = []
        self._known: dict[str, Labels] = {}  # series text -> labels (line-by-line path)

    def feed(self, chunk: bytes) -> SampleBatch:
        """Samples of ``chunk``: whole lines (the stream's last chunk may lack the final newline)."""
        first = self.lines + 1
        nlines = chunk.count(b"\n") + (0 if not chunk or chunk.endswith(b"\n") else 1)
        saved = self.eof_seen, {k: MetricMeta(m.type, m.help, m.unit) for k, m in self.metadata.items()}
        batch = self._columnar(chunk, first, nlines)
        if batch is None:  # undo what the comment pass learnt, then the numpy path
            self.eof_seen, self.metadata = (
                saved[0],
                {k: MetricMeta(m.type, m.help, m.unit) for k, m in saved[1].items()},
            )
            batch = self._fast(chunk, first, nlines)
        if batch is None:  # the same, then line by line
            self.eof_seen, self.metadata = saved
            batch = self._slow(chunk, first)
        self.lines += nlines
        return batch

    def finish(self) -> None:
        """Call after the last chunk: OpenMetrics text must have ended with ``# EOF``."""
        if self.om and not self.eof_seen:
            raise OpenMetricsError(max(self.lines, 1), 1, "OpenMetrics text must end with '# EOF'")

    # ---- the fast paths ------------------------------------------------------------

    def _columnar(self, chunk: bytes, first: int, nlines: int) -> SampleBatch | None:
        if self.eof_seen or b"\r" in chunk or b"\t" in chunk:
            return None
        # Arrow's number parsers take a little more than the formats do: NaN payloads ("nan(1)")
        # and hexadecimal integers ("0x10"). A chunk where either could hide takes the numpy path.
        if b"(" in chunk or (not self.om and (b"0x" in chunk or b"0X" in chunk)):
            return None
        body, comments = chunk, 0
        if chunk.startswith(b"#") or b"\n#" in chunk:
            comments = self._comments(chunk, first)
            if comments < 0:
                return None
            body = _COMMENT_LINE_NL.sub(b"", chunk)
        if nlines == comments and not body:
            return SampleBatch.empty()
        try:
            table_ = pa_csv.read_csv(
                pa.BufferReader(body),
                _CSV_READ,
                _CSV_PARSE,
                _CSV_CONVERT_SECONDS if self.om else _CSV_CONVERT_MS,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None  # another shape, a number the formats do not allow, an empty line...
        if table_.num_rows + comments != nlines:
            return None
        parts = []
        for block in table_.column("series").chunks:
            ids = self._series_ids(block.dictionary.to_pylist())
            if ids is None:
                return None
            parts.append(ids[block.indices.to_numpy(zero_copy_only=False)])
        ids_all = np.concatenate(parts) if len(parts) != 1 else parts[0]
        v = table_.column("value").to_numpy()
        if self.om:
            seconds = table_.column("ts").to_numpy()
            if not np.isfinite(seconds).all():
                return None
            ts = np.round(seconds * 1000)
            if ts.min() < MIN_TS_MS or ts.max() > MAX_TS_MS:
                return None
            ts_ms = ts.astype(np.int64)
        else:
            ts_ms = table_.column("ts").to_numpy()
            if ts_ms.min() < MIN_TS_MS or ts_ms.max() > MAX_TS_MS:
                return None
        return self._batch(ids_all, ts_ms, v)

    def _batch(
        self, ids: npt.NDArray[np.int64], ts_ms: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
    ) -> SampleBatch:
        """A batch of the series ``ids`` (indexes of ``_series``) use, numbered in that order."""
        present = np.zeros(len(self._series), dtype=bool)
        present[ids] = True
        used = np.flatnonzero(present)
        local = np.empty(len(self._series), dtype=np.int32)
        local[used] = np.arange(len(used), dtype=np.int32)
        series = [self._series[i] for i in used.tolist()]
        return SampleBatch(series, local[ids], np.ascontiguousarray(ts_ms), np.ascontiguousarray(values))

    def _fast(self, chunk: bytes, first: int, nlines: int) -> SampleBatch | None:
        if self.eof_seen or b"\r" in chunk or b"\t" in chunk:
            return None
        comments = 0
        if chunk.startswith(b"#") or b"\n#" in chunk:
            comments = self._comments(chunk, first)
            if comments < 0:
                return None
        buf = np.frombuffer(chunk, dtype=np.uint8)
        ends = np.flatnonzero(buf == 0x0A)
        if not chunk.endswith(b"\n"):
            ends = np.append(ends, len(buf))
        starts = np.empty_like(ends)
        if len(ends):
            starts[0] = 0
            starts[1:] = ends[:-1] + 1
        if comments:
            keep = buf[np.minimum(starts, len(buf) - 1)] != 0x23  # '#'
            starts, ends = starts[keep], ends[keep]
        if len(starts) + comments != nlines:
            return None
        if not len(starts):
            return SampleBatch.empty()
        # Each line: series, space, value, space, timestamp; the last two spaces split it (a label
        # value may hold spaces, values and timestamps cannot). A line of another shape gives a
        # series text that does not parse, and the chunk goes line by line.
        spaces = np.flatnonzero(buf == 0x20)
        last = np.searchsorted(spaces, ends) - 1
        if last.min() < 1:
            return None
        s1, s2 = spaces[last], spaces[last - 1]
        if np.any((s2 <= starts) | (s1 >= ends - 1) | (s2 >= s1 - 1)):
            return None
        texts = [chunk[a:b] for a, b in zip(starts.tolist(), s2.tolist(), strict=True)]
        ids = self._series_ids(texts)
        if ids is None:
            return None
        v = _gathered_numbers(buf, s2 + 1, s1, np.float64)
        if v is None:
            return None
        if self.om:
            seconds = _gathered_numbers(buf, s1 + 1, ends, np.float64)
            if seconds is None or not np.isfinite(seconds).all():
                return None
            ts = np.round(seconds * 1000)
            if ts.min() < MIN_TS_MS or ts.max() > MAX_TS_MS:
                return None
            ts_ms = ts.astype(np.int64)
        else:
            ints = _gathered_numbers(buf, s1 + 1, ends, np.int64)
            if ints is None or ints.min() < MIN_TS_MS or ints.max() > MAX_TS_MS:
                return None
            ts_ms = ints
        return self._batch(ids, ts_ms, v)

    def _series_ids(self, texts: list[bytes]) -> npt.NDArray[np.int64] | None:
        get = self._ids.get
        ids = list(map(get, texts))
        if None in ids:
            for text in set(texts) - self._ids.keys():
                labels = self._parse_series(text)
                if labels is None:
                    return None
                self._ids[text] = len(self._series)
                self._series.append(labels)
            ids = list(map(get, texts))
        return np.array(ids, dtype=np.int64)

    def _parse_series(self, text: bytes) -> Labels | None:
        """The labels of a series text, or None when it is not one whole valid series (the slow path says why)."""
        try:
            ln = _Line(0, text.decode("utf-8"))
        except UnicodeDecodeError:
            return None
        name = ln.match(_NAME_RE)
        labels: list[tuple[str, str]] = []
        try:
            if ln.text.startswith("{", ln.pos):
                name, labels = _labels(ln, name)
            if name is None or not ln.at_end():
                return None
            canonical = canonical_labels([("__name__", name), *labels])
            validate_series(canonical, self.limits)
        except (OpenMetricsError, ValueError):
            return None
        return canonical

    def _comments(self, chunk: bytes, first: int) -> int:
        """Handle the chunk's ``#`` lines; the count, or -1 when the chunk must go line by line."""
        n = 0
        line = first
        pos = 0
        for m in _COMMENT_LINE.finditer(chunk):
            line += chunk.count(b"\n", pos, m.start())
            pos = m.start()
            try:
                text = m.group(0).decode("utf-8")
            except UnicodeDecodeError:
                return -1
            if _comment(_Line(line, text), self.metadata, self.om):
                if chunk[m.end() :].strip(b"\n") or m.end() < len(chunk) - 1:
                    return -1  # text after '# EOF': the slow path reports it
                self.eof_seen = True
            n += 1
        return n

    # ---- line by line --------------------------------------------------------------

    def _slow(self, chunk: bytes, first: int) -> SampleBatch:
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = first + chunk.count(b"\n", 0, exc.start)
            column = exc.start - chunk.rfind(b"\n", 0, exc.start)  # in bytes
            raise OpenMetricsError(line, column, "not valid UTF-8") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        om = self.om
        out = SampleBuilder()
        known = self._known
        ts_re = _FLOAT_RE if om else _INT_RE
        for no, raw in enumerate(lines, start=first):
            text = raw[:-1] if raw.endswith("\r") else raw
            fast = None if self.eof_seen else _FAST_RE.match(text)
            if fast is not None:
                series = known.get(fast.group(1))
                v, t = fast.group(2), fast.group(3)
                if series is not None and _FLOAT_RE.fullmatch(v) and t is not None and ts_re.fullmatch(t):
                    t_num = float(t) if om else int(t)
                    if math.isfinite(t_num):
                        ts_fast = round(t_num * 1000) if om else int(t_num)
                        if MIN_TS_MS <= ts_fast <= MAX_TS_MS:
                            out.add(series, ts_fast, float(v))
                            continue
            ln = _Line(no, text)
            if self.eof_seen:
                raise ln.fail("text after '# EOF'", 0)
            if ln.text.strip() == "":
                continue
            if ln.text.startswith("#"):
                self.eof_seen = _comment(ln, self.metadata, om)
                continue
            name = ln.match(_NAME_RE)
            labels: list[tuple[str, str]] = []
            if ln.text.startswith("{", ln.pos):
                name, labels = _labels(ln, name)
            if name is None:
                raise ln.fail("expected a metric name")
            if not ln.skip_ws():
                raise ln.fail("expected whitespace before the value")
            value = _float(ln, "value")
            ts_ms: int | None = None
            ln.skip_ws()
            if not ln.at_end() and not ln.text.startswith("#", ln.pos):
                start = ln.pos
                if om:
                    seconds = _float(ln, "timestamp")
                    if not math.isfinite(seconds):
                        raise ln.fail("the timestamp must be finite", start)
                    ts_ms = round(seconds * 1000)
                else:
                    got = ln.match(_INT_RE)
                    if got is None or (not ln.at_end() and ln.text[ln.pos] not in " \t"):
                        raise ln.fail("invalid timestamp (Prometheus text wants integer milliseconds)", start)
                    ts_ms = int(got)
                ln.skip_ws()
            if not ln.at_end() and not (om and ln.text.startswith("# ", ln.pos)):
                raise ln.fail("unexpected text after the sample")  # OpenMetrics exemplars are ignored
            if ts_ms is not None and not MIN_TS_MS <= ts_ms <= MAX_TS_MS:
                raise ln.fail(f"timestamp {ts_ms} ms is outside 1970-01-01 .. 2149-06-06", 0)
            if ts_ms is None:
                if self.default_timestamp_ms is None:
                    raise ln.fail("the sample has no timestamp", 0)
                ts_ms = self.default_timestamp_ms
                self.defaulted += 1
            try:
                canonical = canonical_labels([("__name__", name), *labels])
                validate_series(canonical, self.limits)
            except ValueError as exc:
                raise ln.fail(str(exc), 0) from None
            if fast is not None:
                known[fast.group(1)] = canonical
            out.add_canonical(canonical, ts_ms, value)
        return out.build()


def _gathered_numbers(
    buf: npt.NDArray[np.uint8],
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    dtype: type[np.float64] | type[np.int64],
) -> npt.NDArray[Any] | None:
    """Parse the number tokens ``buf[start[i]:end[i]]`` in bulk (as fixed-width byte strings); None
    when any is not one the text formats allow (the line-by-line parser then says which)."""
    lens = end - start
    width = int(lens.max())
    if width > 40:
        return None
    at = start[:, None] + np.arange(width)
    cells = np.where(at < end[:, None], buf[np.minimum(at, len(buf) - 1)], 0).astype(np.uint8)
    if np.any((cells == 0x5F) | (cells >= 0x80)):
        return None  # Python (and numpy) accept 1_000 and Unicode digits; the formats do not
    try:
        return cells.view(f"S{width}").reshape(-1).astype(dtype)
    except (ValueError, OverflowError):
        return None


def _comment(ln: _Line, meta: dict[str, MetricMeta], om: bool) -> bool:
    """Handle a ``#`` line; returns True for ``# EOF``."""
    parts = ln.text.split(None, 3)
    if ln.text.rstrip() == "# EOF":
        return True
    if len(parts) < 2 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE", "UNIT"):
        if om:
            raise ln.fail("OpenMetrics allows only # HELP, # TYPE, # UNIT and # EOF comments", 0)
        return False  # a plain comment
    if len(parts) < 3 or not _NAME_RE.fullmatch(parts[2]):
        raise ln.fail(f"# {parts[1]} needs a metric name", 0)
    entry = meta.setdefault(parts[2], MetricMeta())
    rest = parts[3] if len(parts) > 3 else ""
    if parts[1] == "TYPE":
        if rest.strip() not in _TYPES:
            raise ln.fail(f"unknown metric type {rest.strip()!r}", 0)
        entry.type = rest.strip()
    elif parts[1] == "HELP":
        entry.help = _unescape(rest)
    else:
        entry.unit = rest.strip()
    return False
