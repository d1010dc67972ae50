"""kql remembers an aggregation's groups and a join's pairs per label lists (kql/vectors.py's
LabelsMemo): a remembered entry is used only for equal lists, so answers follow the series."""

from __future__ import annotations

from kernel_insight.kql.storage import Labels
from kernel_insight.kql.vectors import LabelsMemo


def _labels(*values: str) -> list[Labels]:
    return [(("__name__", "m"), ("i", v)) for v in values]


def test_an_entry_is_used_only_for_equal_lists() -> None:
    memo: LabelsMemo[str] = LabelsMemo()
    first = _labels("a", "b", "c")
    memo.put("spec", (first,), "abc")
    assert memo.get("spec", first) == "abc"
    assert memo.get("spec", list(first)) == "abc"  # a copy holding the same objects
    changed = [first[0], (("__name__", "m"), ("i", "x")), first[2]]  # same length and ends
    assert memo.get("spec", changed) is None
    assert memo.get("other", first) is None
    first[1] = changed[1]  # the list it was made from changed in place
    assert memo.get("spec", first) is None


def test_two_lists_are_both_compared() -> None:
    memo: LabelsMemo[int] = LabelsMemo()
    a, b = _labels("a", "b"), _labels("c", "d")
    memo.put(1, (a, b), 7)
    assert memo.get(1, a, b) == 7
    assert memo.get(1, a, [b[0], (("i", "z"),), b[1]]) is None
    assert memo.get(1, a, [b[0], (("i", "z"),)]) is None


def test_full_memo_forgets_and_answers_afresh() -> None:
    memo: LabelsMemo[int] = LabelsMemo(size=2)
    lists = [_labels(str(i)) for i in range(3)]
    for i, x in enumerate(lists):
        memo.put(0, (x,), i)
    assert memo.get(0, lists[2]) == 2
    assert memo.get(0, lists[0]) is None


def test_grouping_and_join_follow_the_series_at_every_evaluation() -> None:
    """The same expression asked twice over series whose labels changed in between (same count,
    same first and last series): the groups and the pairs are the new series'."""
    from kernel_insight.kql.engine import Engine
    from kernel_insight.kql.storage import MemoryStorage

    def store(middle: str) -> MemoryStorage:
        s = MemoryStorage()
        for inst, grp in (("a", "g1"), ("b", middle), ("c", "g1")):
            s.add({"__name__": "x", "instance": inst, "g": grp}, [0], [1.0])
            s.add({"__name__": "y", "instance": inst, "g": grp}, [0], [2.0])
        return s

    for middle, groups in (("g1", {"g1": 3.0}), ("g2", {"g1": 2.0, "g2": 1.0})):
        e = Engine(store(middle))
        got = {dict(s.labels)["g"]: s.value for s in e.instant_query("sum by (g) (x)", 0).value.samples}
        assert got == groups
        joined = e.instant_query("x / on (instance, g) y", 0).value.samples
        assert sorted(dict(s.labels)["g"] for s in joined) == sorted(["g1", middle, "g1"])
        assert all(s.value == 0.5 for s in joined)
