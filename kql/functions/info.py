"""info(): enrich series with the data labels of info metrics (``target_info``, ``gpu_info``, ...).

An info series joins a series when they agree on the identifying labels (``instance`` and
``job``) the series has. Its other labels are added unless the series already has them.
The optional second argument filters: ``__name__`` matchers pick the info metrics (default
``target_info``; with only negative ones, among the ``*_info`` metrics), other matchers select
info series and name the only labels to add.
"""

from __future__ import annotations

import numpy as np

from kernel_insight.kql.ast import VectorSelector
from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.functions._common import V
from kernel_insight.kql.functions.registry import function
from kernel_insight.kql.lexical import go_quote
from kernel_insight.kql.storage import Labels, Matcher
from kernel_insight.kql.values import Arg, CallContext, StepVector, as_vector

__all__ = ["IDENTIFYING_LABELS"]

#: Labels that tie a series to the info series describing its target.
IDENTIFYING_LABELS = ("instance", "job")
_DEFAULT_INFO = Matcher("__name__", "=", "target_info")
_ANY_INFO = Matcher("__name__", "=~", ".+_info")


@function("info", (V, V), V, variadic=1, experimental=True, unevaluated=(1,))
def _info(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Add the data labels of matching info series (default ``target_info``) to each series."""
    base = as_vector(args[0])
    selector = args[1] if len(args) > 1 else None
    if not isinstance(selector, VectorSelector | None):  # pragma: no cover - the checker rules it out
        raise TypeError(f"info: the label selector is a {type(selector).__name__}")
    matchers = selector.all_matchers() if selector is not None else ()
    name_matchers = [m for m in matchers if m.name == "__name__"] or [_DEFAULT_INFO]
    if not any(m.op in ("=", "=~") for m in name_matchers):
        name_matchers.append(_ANY_INFO)  # only exclusions given: choose among the *_info metrics
    data_matchers = [m for m in matchers if m.name != "__name__"]
    wanted = {m.name for m in data_matchers} if data_matchers else None
    required = any(not m.matches_empty() for m in data_matchers)
    if len(base) == 0:
        return base
    refs = ctx.data_times(ctx.node.args[0])
    infos = ctx.lookup([*name_matchers, *data_matchers], refs)
    info_maps = [dict(lb) for lb in infos.labels]
    info_hists = infos.hist_present() if infos.has_hists else None

    rows: dict[tuple[int, Labels], np.ndarray] = {}
    for i, labels in enumerate(base.labels):
        if i % 64 == 63:
            ctx.check()
        lookup = dict(labels)
        if all(m.matches(lookup.get("__name__", "")) for m in name_matchers):
            rows[(i, labels)] = base.present[i].copy()  # info series pass through untouched
            continue
        ident = {k: lookup[k] for k in IDENTIFYING_LABELS if k in lookup}
        candidates = [
            j for j, im in enumerate(info_maps) if ident and all(im.get(k) == v for k, v in ident.items())
        ]
        for step in np.flatnonzero(base.present[i]):
            if info_hists is not None and info_hists[candidates, step].any():
                raise KqlEvaluationError("info sample should be float")
            added = _data_labels(infos, info_maps, candidates, int(step), wanted, lookup)
            if added is None:
                if required:
                    continue  # no info series, and the filter demands one
                added = {}
            enriched = tuple(sorted({**added, **lookup}.items()))
            mask = rows.setdefault((i, enriched), np.zeros(ctx.steps, dtype=bool))
            mask[step] = True
    keys = list(rows)
    index = np.array([i for i, _ in keys], dtype=np.intp)
    present = np.array([rows[k] for k in keys], dtype=bool).reshape(len(keys), ctx.steps)
    return StepVector(
        [labels for _, labels in keys],
        base.values[index] if len(keys) else np.zeros((0, ctx.steps)),
        present,
        base.drop_name[index] if len(keys) else np.zeros(0, dtype=bool),
    ).compact()


def _data_labels(
    infos: StepVector,
    info_maps: list[dict[str, str]],
    candidates: list[int],
    step: int,
    wanted: set[str] | None,
    base: dict[str, str],
) -> dict[str, str] | None:
    """Labels the info series present at ``step`` add; None when no info series matches."""
    latest: dict[str, int] = {}
    for j in candidates:
        if not infos.present[j, step]:
            continue
        name = info_maps[j].get("__name__", "")
        # Two versions of the same info metric: the one with the newer sample wins.
        if name not in latest or _sample_ts(infos, j, step) > _sample_ts(infos, latest[name], step):
            latest[name] = j
    if not latest:
        return None
    added: dict[str, str] = {}
    for j in latest.values():
        for key, value in info_maps[j].items():
            if key == "__name__" or key in IDENTIFYING_LABELS or key in base:
                continue
            if wanted is not None and key not in wanted:
                continue
            if key in added and added[key] != value:
                raise KqlEvaluationError(
                    f"conflicting label {go_quote(key)}: info series disagree ({go_quote(added[key])} and "
                    f"{go_quote(value)})"
                )
            added[key] = value
    return added


def _sample_ts(vec: StepVector, row: int, step: int) -> int:
    return int(vec.sample_ts[row, step]) if vec.sample_ts is not None else 0
