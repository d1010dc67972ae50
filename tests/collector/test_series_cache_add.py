"""remote_write's series cache adds a request's new series in bulk (SeriesIndex.add_spans, then
publish): the ids, labels, fingerprints and metric names it keeps are those of the one-by-one
reference (a dict numbering label bytes in order of first appearance), and a failure between the
add and the publish leaves the cache as it was."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector import _decode
from kernel_insight.collector.remote_write import (
    DEFAULT_LIMITS,
    SeriesCache,
    decode_write_request,
    encode_write_request,
)
from kernel_insight.collector.rows import canonical_labels, series_fingerprint


def _spans(keys: list[bytes]) -> tuple[bytes, bytes]:
    """``keys`` laid end to end, and their int64 (start, end) pairs."""
    spans, at = [], 0
    for key in keys:
        spans.append((at, at + len(key)))
        at += len(key)
    return b"".join(keys), np.array(spans, np.int64).reshape(-1, 2).tobytes()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=6), max_size=20), max_size=6))
def test_add_spans_numbers_keys_as_a_dict_does_and_hides_them_until_published(requests):
    index = _decode.SeriesIndex()
    oracle: dict[bytes, int] = {}
    for keys in requests:
        buf, spans = _spans(keys)
        before = dict(oracle)
        got = np.frombuffer(index.add_spans(buf, spans), np.int32).tolist()
        assert got == [oracle.setdefault(k, len(oracle)) for k in keys]
        for key in keys:  # unpublished: the readers' get and lookup do not see them yet
            assert index.get(key) == before.get(key, -1)
        lookup = np.frombuffer(
            index.lookup(
                buf,
                np.array(
                    [(*s, 1) for s in np.frombuffer(spans, np.int64).reshape(-1, 2).tolist()], np.int64
                ).tobytes(),
            ),
            np.int32,
        ).tolist()
        assert lookup == [before.get(k, -1) for k in keys]
        index.publish()
        assert [index.get(k) for k in keys] == [oracle[k] for k in keys]
    assert len(index) == len(oracle)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=6), max_size=10), st.lists(st.binary(max_size=6), max_size=10))
def test_rollback_forgets_exactly_the_unpublished_keys(published, pending):
    index = _decode.SeriesIndex()
    buf, spans = _spans(published)
    index.add_spans(buf, spans)
    index.publish()
    oracle = {k: i for i, k in enumerate(dict.fromkeys(published))}
    buf, spans = _spans(pending)
    index.add_spans(buf, spans)
    if set(pending) - set(published):  # ids are pending: one-by-one adds would interleave with them
        with pytest.raises(RuntimeError, match="unpublished"):
            index.add(b"another")
    index.rollback()
    assert len(index) == len(oracle)
    for key in [*published, *pending]:
        assert index.get(key) == oracle.get(key, -1)
    # the next keys take the ids the forgotten ones had
    assert index.add(b"\xff" * 7) == len(oracle)


def test_add_spans_refuses_spans_outside_the_buffer_and_adds_nothing():
    index = _decode.SeriesIndex()
    for bad in ([(0, 2), (2, 9)], [(-1, 2)], [(3, 2)]):
        with pytest.raises(ValueError, match="outside the buffer"):
            index.add_spans(b"abcdef", np.array(bad, np.int64).tobytes())
        assert len(index) == 0
    with pytest.raises(ValueError, match="pairs"):
        index.add_spans(b"abcdef", b"1234")


_series = st.tuples(
    st.fixed_dictionaries(
        {"__name__": st.sampled_from(["up", "node_cpu_seconds_total", "m"])},
        optional={"job": st.sampled_from(["a", "b"]), "cpu": st.sampled_from(["0", "1", "é"])},
    ),
    st.lists(st.tuples(st.just(1_700_000_000_000), st.floats(allow_nan=False)), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_series, max_size=12), min_size=1, max_size=6))
def test_the_cache_keeps_what_the_one_by_one_reference_keeps(requests):
    """Random label sets, repeated within and across requests, some without samples: each request's
    ids, and the cache's labels, fingerprints and metric names per id, are the reference's."""
    cache = SeriesCache()
    ids_of: dict[bytes, int] = {}  # the reference: label bytes -> id, in order of first appearance
    labels_of: list[tuple[tuple[str, str], ...]] = []
    for series in requests:
        buf = encode_write_request(series, compress=False)
        scanned = _decode.write_request(buf)
        assert scanned is not None
        known, ids = cache.resolve(buf, scanned[0], DEFAULT_LIMITS)
        triples = np.frombuffer(scanned[0], np.int64).reshape(-1, 3).tolist()
        want = []
        for (start, end, count), (labels, _) in zip(triples, series, strict=True):
            if not count:
                want.append(-1)
                continue
            if buf[start:end] not in ids_of:
                ids_of[buf[start:end]] = len(labels_of)
                labels_of.append(canonical_labels(list(labels.items())))
            want.append(ids_of[buf[start:end]])
        assert ids.tolist() == want
        assert known.labels == labels_of
        n = len(labels_of)
        assert known.fingerprints[:n].tolist() == [series_fingerprint(s) for s in labels_of]
        assert [known.names[c] for c in known.codes[:n].tolist()] == [dict(s)["__name__"] for s in labels_of]
        assert len(known.index) == n


def test_a_failure_before_the_publish_leaves_the_cache_as_it_was(monkeypatch):
    cache = SeriesCache()
    first = encode_write_request([({"__name__": "up", "job": "a"}, [(1, 1.0)])], compress=False)
    decode_write_request(first, cache=cache)
    body = encode_write_request(
        [({"__name__": "up", "job": "b"}, [(1, 1.0)]), ({"__name__": "up", "job": "a"}, [(1, 2.0)])],
        compress=False,
    )

    def fail(*args: object, **kwargs: object) -> None:
        raise MemoryError

    with monkeypatch.context() as m:
        m.setattr(np, "fromiter", fail)
        with pytest.raises(MemoryError):
            decode_write_request(body, cache=cache)
    assert len(cache) == 1
    assert len(cache._known.index) == 1
    batch = decode_write_request(body, cache=cache)
    assert batch.series == [(("__name__", "up"), ("job", "b")), (("__name__", "up"), ("job", "a"))]
    assert batch.series_meta is not None
    assert batch.series_meta[0].tolist() == [series_fingerprint(s) for s in batch.series]
