"""Prometheus relabelling for series that arrive by remote_write or ``ki import``.

Agents label their instance at enrolment and in their configuration, but series written by a
Prometheus or imported from a file carry whatever labels their source gave them: a ``model`` the
SDK routes on, a ``rack`` the topology groups by, or labels nobody should store. Users already
write these rules for Prometheus (``metric_relabel_configs``, ``write_relabel_configs``), so the
collector reads the same YAML and applies it with Prometheus' semantics (``model/relabel``):
anchored RE2 regexes, Go's ``$1``/``${name}`` expansion, empty values deleting labels, and every
action Prometheus 3 has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from kernel_insight.collector.rows import HistogramBatch, SampleBatch
from kernel_insight.kql.functions.labels import expand_template
from kernel_insight.kql.regex import Regex, RegexError, compile_anchored

__all__ = [
    "ACTIONS",
    "RelabelConfig",
    "RelabelError",
    "Relabeler",
    "load_relabel_configs",
    "parse_relabel_configs",
    "relabel",
]

Labels = tuple[tuple[str, str], ...]

#: Every action of Prometheus 3's ``relabel_config``.
ACTIONS = (
    "replace",
    "keep",
    "drop",
    "keepequal",
    "dropequal",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
)

_DEFAULT_REGEX = "(.*)"
_DEFAULT_SEPARATOR = ";"
_DEFAULT_REPLACEMENT = "$1"
_FIELDS = frozenset(
    {"source_labels", "separator", "regex", "modulus", "target_label", "replacement", "action"}
)
_NEEDS_TARGET = frozenset({"replace", "hashmod", "lowercase", "uppercase", "keepequal", "dropequal"})


class RelabelError(ValueError):
    """A relabel configuration Prometheus would refuse; the message names the rule and the field."""


@dataclass(frozen=True, slots=True)
class RelabelConfig:
    """One rule, with Prometheus' defaults filled in."""

    action: str = "replace"
    source_labels: tuple[str, ...] = ()
    separator: str = _DEFAULT_SEPARATOR
    regex: str = _DEFAULT_REGEX
    modulus: int = 0
    target_label: str = ""
    replacement: str = _DEFAULT_REPLACEMENT

    @property
    def compiled(self) -> Regex:
        return compile_anchored(self.regex)


def _has_variable(template: str) -> bool:
    return "$" in template


def _check(i: int, c: RelabelConfig) -> None:
    where = f"relabel rule {i}"
    if c.action not in ACTIONS:
        raise RelabelError(f"{where}: unknown relabel action {c.action!r} (one of {', '.join(ACTIONS)})")
    try:
        c.compiled  # noqa: B018 (compiling is the check)
    except RegexError as e:
        raise RelabelError(f"{where}: regex {c.regex!r}: {e}") from None
    if c.action == "hashmod" and c.modulus <= 0:
        raise RelabelError(f"{where}: relabel configuration for hashmod requires non-zero modulus")
    if c.action in _NEEDS_TARGET and not c.target_label:
        raise RelabelError(
            f"{where}: relabel configuration for {c.action} action requires 'target_label' value"
        )
    if c.action in ("lowercase", "uppercase", "hashmod", "keepequal", "dropequal") and _has_variable(
        c.target_label
    ):
        raise RelabelError(f"{where}: {c.target_label!r} is invalid 'target_label' for {c.action} action")
    if c.action in ("labeldrop", "labelkeep") and (
        c.source_labels
        or c.target_label
        or c.modulus
        or c.separator != _DEFAULT_SEPARATOR
        or c.replacement != _DEFAULT_REPLACEMENT
    ):
        raise RelabelError(f"{where}: {c.action} action requires only 'regex', and no other fields")
    if c.action in ("keepequal", "dropequal") and (
        c.regex != _DEFAULT_REGEX
        or c.modulus
        or c.separator != _DEFAULT_SEPARATOR
        or c.replacement != _DEFAULT_REPLACEMENT
    ):
        raise RelabelError(
            f"{where}: {c.action} action requires only 'source_labels' and 'target_label', and no other fields"
        )


def parse_relabel_configs(raw: Any) -> tuple[RelabelConfig, ...]:
    """Rules from parsed YAML: a list of mappings with Prometheus' field names."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RelabelError("relabel configuration must be a list of rules")
    out: list[RelabelConfig] = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise RelabelError(f"relabel rule {i}: must be a mapping, got {type(item).__name__}")
        unknown = set(item) - _FIELDS
        if unknown:
            raise RelabelError(f"relabel rule {i}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        sources = item.get("source_labels") or []
        if isinstance(sources, str) or not all(isinstance(s, str) for s in sources):
            raise RelabelError(f"relabel rule {i}: source_labels must be a list of label names")
        try:
            modulus = int(item.get("modulus", 0) or 0)
        except (TypeError, ValueError):
            raise RelabelError(f"relabel rule {i}: modulus must be an integer") from None
        config = RelabelConfig(
            action=str(item.get("action", "replace")).lower(),
            source_labels=tuple(sources),
            separator=str(item.get("separator", _DEFAULT_SEPARATOR)),
            regex=str(item.get("regex", _DEFAULT_REGEX)),
            modulus=modulus,
            target_label=str(item.get("target_label", "") or ""),
            replacement=str(item.get("replacement", _DEFAULT_REPLACEMENT)),
        )
        _check(i, config)
        out.append(config)
    return tuple(out)


def load_relabel_configs(path: str | Path) -> tuple[RelabelConfig, ...]:
    """Rules from a YAML file: a bare list, or a mapping with ``relabel_configs`` (or Prometheus'
    ``metric_relabel_configs`` / ``write_relabel_configs``) holding the list."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise RelabelError(f"cannot read relabel configuration {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise RelabelError(f"relabel configuration {path} is not valid YAML: {e}") from None
    if isinstance(raw, Mapping):
        keys = [k for k in ("relabel_configs", "metric_relabel_configs", "write_relabel_configs") if k in raw]
        if len(keys) != 1 or len(raw) != 1:
            raise RelabelError(
                f"relabel configuration {path}: expected a list of rules or one key relabel_configs"
            )
        raw = raw[keys[0]]
    return parse_relabel_configs(raw)


def _apply(c: RelabelConfig, lb: dict[str, str]) -> bool:
    """One rule on a label builder (Prometheus' ``relabel``): False drops the series."""
    val = c.separator.join(lb.get(name, "") for name in c.source_labels)
    action = c.action
    if action == "drop":
        return not c.compiled.matches(val)
    if action == "keep":
        return c.compiled.matches(val)
    if action == "dropequal":
        return lb.get(c.target_label, "") != val
    if action == "keepequal":
        return lb.get(c.target_label, "") == val
    if action == "replace":
        if (
            val == ""
            and c.regex == _DEFAULT_REGEX
            and not _has_variable(c.target_label)
            and not _has_variable(c.replacement)
        ):
            _set(lb, c.target_label, c.replacement)
            return True
        m = c.compiled.match(val)
        if m is None:
            return True
        target = expand_template(c.target_label, m)
        if not target:  # Prometheus 3 accepts any non-empty UTF-8 name
            return True
        _set(lb, target, expand_template(c.replacement, m))
    elif action == "lowercase":
        _set(lb, c.target_label, val.lower())
    elif action == "uppercase":
        _set(lb, c.target_label, val.upper())
    elif action == "hashmod":
        digest = hashlib.md5(val.encode(), usedforsecurity=False).digest()
        _set(lb, c.target_label, str(int.from_bytes(digest[8:], "big") % c.modulus))
    elif action == "labelmap":
        for name, value in list(lb.items()):
            m = c.compiled.match(name)
            if m is not None:
                _set(lb, expand_template(c.replacement, m), value)
    elif action == "labeldrop":
        for name in [n for n in lb if c.compiled.matches(n)]:
            del lb[name]
    elif action == "labelkeep":
        for name in [n for n in lb if not c.compiled.matches(n)]:
            del lb[name]
    return True


def _set(lb: dict[str, str], name: str, value: str) -> None:
    if value:
        lb[name] = value
    else:  # an empty value is no label, as in Prometheus' labels.Builder
        lb.pop(name, None)


def relabel(configs: Sequence[RelabelConfig], labels: Labels) -> Labels | None:
    """Prometheus' ``relabel.Process``: the new sorted label set, or None when a rule drops it."""
    lb = dict(labels)
    for c in configs:
        if not _apply(c, lb):
            return None
    return tuple(sorted(lb.items()))


class Relabeler:
    """Applies rules to label sets, remembering answers: a remote_write stream repeats its series.

    ``apply`` returns the new sorted label set, or None when a rule dropped the series (or the
    rules removed its metric name, which no table can store).
    """

    __slots__ = ("_cache", "_max_cache", "configs", "dropped", "dropped_samples")

    def __init__(self, configs: Sequence[RelabelConfig], max_cache: int = 65_536) -> None:
        self.configs = tuple(configs)
        self._cache: dict[Labels, Labels | None] = {}
        self._max_cache = max_cache
        self.dropped = 0  # series (distinct or repeated) the rules dropped
        self.dropped_samples = 0  # samples of those series, through apply_batch (the /metrics figure)

    def apply_batch(self, batch: SampleBatch) -> SampleBatch:
        """The batch with every series relabelled: rules run once per series, samples move as columns.

        Series the rules drop lose their samples; series the rules make equal are merged.
        """
        if not self.configs or not batch.series:
            return batch
        new_series, remap = self._remap(batch.series)
        idx = remap[batch.series_idx]
        keep = idx >= 0
        st = batch.st_ms
        if keep.all():
            return SampleBatch(new_series, idx, batch.ts_ms, batch.values, st_ms=st)
        self.dropped_samples += int(len(keep) - np.count_nonzero(keep))
        return SampleBatch(
            new_series,
            idx[keep],
            batch.ts_ms[keep],
            batch.values[keep],
            st_ms=None if st is None else st[keep],
        )

    def _remap(self, series: list[Labels]) -> tuple[list[Labels], npt.NDArray[np.int32]]:
        """The relabelled series (each once) and, per input series, its new index (-1: dropped)."""
        new_series: list[Labels] = []
        index: dict[Labels, int] = {}
        remap = np.empty(len(series), np.int32)
        for i, labels in enumerate(series):
            out = self.apply(labels)
            if out is None:
                remap[i] = -1
                continue
            k = index.get(out)
            if k is None:
                k = index[out] = len(new_series)
                new_series.append(out)
            remap[i] = k
        return new_series, remap

    def apply_histograms(self, batch: HistogramBatch) -> HistogramBatch:
        """:meth:`apply_batch` for native histogram samples (remote_write): same rules, same series."""
        if not self.configs or not batch.series:
            return batch
        new_series, remap = self._remap(batch.series)
        idx = remap[batch.series_idx]
        keep = np.flatnonzero(idx >= 0)
        self.dropped_samples += len(idx) - len(keep)
        return batch.take(keep, new_series, idx[keep])

    def __bool__(self) -> bool:
        return bool(self.configs)

    def apply(self, labels: Labels) -> Labels | None:
        try:
            out = self._cache[labels]
        except KeyError:
            out = self._compute(labels)
            if len(self._cache) >= self._max_cache:
                self._cache.clear()
            self._cache[labels] = out
        if out is None:
            self.dropped += 1
        return out

    def _compute(self, labels: Labels) -> Labels | None:
        out = relabel(self.configs, labels)
        if out is None or not any(k == "__name__" for k, _ in out):
            return None
        return out
