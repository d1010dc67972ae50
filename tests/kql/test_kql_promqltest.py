"""The Prometheus PromQL test scripts, run against kql; every failing case must be in the skip file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_insight.kql.promqltest import (
    NEWER_FILES,
    SKIP_FILE,
    STANDARD_FILES,
    FileReport,
    Load,
    ScriptError,
    _load,
    default_dir,
    expand_values,
    load_skips,
    main,
    parse_script,
    parse_series,
    parse_start_offsets,
    run_file,
)
from kernel_insight.kql.storage import Matcher, MemoryStorage, SelectHints

SCRIPTS = default_dir()


@pytest.fixture(scope="module")
def reports() -> dict[str, FileReport]:
    if not SCRIPTS.is_dir():
        pytest.fail(f"the PromQL test scripts are missing: expected them in {SCRIPTS}")
    return {path.name: run_file(path) for path in sorted(SCRIPTS.glob("*.test"))}


def test_all_scripts_are_classified(reports: dict[str, FileReport]) -> None:
    assert set(reports) == set(STANDARD_FILES) | set(NEWER_FILES)
    for report in reports.values():
        evals = sum(
            1 for line in (SCRIPTS / report.file).read_text().splitlines() if line.strip().startswith("eval")
        )
        assert report.count("float") + report.count("native-histogram") == len(report.results) == evals


def test_standard_files_pass_at_least_95_percent_of_float_cases(reports: dict[str, FileReport]) -> None:
    passed = sum(reports[f].count("float", True) for f in STANDARD_FILES)
    total = sum(reports[f].count("float") for f in STANDARD_FILES)
    print(f"standard files: float {passed}/{total}")
    assert passed / total >= 0.95


def test_every_failing_case_is_listed_with_a_reason(reports: dict[str, FileReport]) -> None:
    skips = load_skips()
    failing = {r.case.id for report in reports.values() for r in report.results if not r.passed}
    unlisted = sorted(failing - set(skips))
    assert not unlisted, f"failing cases missing from {SKIP_FILE.name}: {unlisted[:20]}"
    assert all(reason.strip() for reason in skips.values())


def test_no_listed_case_passes(reports: dict[str, FileReport]) -> None:
    skips = load_skips()
    passing = {r.case.id for report in reports.values() for r in report.results if r.passed}
    stale = sorted(passing & set(skips))
    assert not stale, f"cases pass now, remove them from {SKIP_FILE.name}: {stale[:20]}"


def test_runner_command_line_ends_with_the_totals(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["-q", str(SCRIPTS / "literals.test"), str(SCRIPTS / "staleness.test")])
    lines = capsys.readouterr().out.strip().split("\n")
    assert lines[0] == "literals.test: float 25/25 passed, native-histogram 0/0 passed"
    assert lines[-1] == "42 passed, 0 failed"
    assert status == 0


def test_series_lines_expand_like_upstream() -> None:
    labels, rest = parse_series('http_requests{job="api", instance="0"}  0+10x3 _ stale -2.5')
    assert labels == (("__name__", "http_requests"), ("instance", "0"), ("job", "api"))
    values = expand_values(rest.split())
    assert [v.value for v in values[:4]] == [0, 10, 20, 30]
    assert [v.kind for v in values[4:]] == ["skip", "stale", "float"]
    assert [v.value for v in expand_values(["1x2", "8000-10x1"])] == [1, 1, 1, 8000, 7990]


def test_skip_file_lives_next_to_the_runner() -> None:
    assert SKIP_FILE.resolve() == Path(__file__).resolve().parents[2] / "kql" / "promqltest_skips.txt"


def test_start_timestamp_lines_expand_like_upstream(tmp_path: Path) -> None:
    """``@st`` lines (Prometheus' parseSTSequence): offsets from each sample's time, ``_`` unset."""
    assert parse_start_offsets("_ _x2 -30s-1mx2 +1m 0 -1msx1 1ms+1sx1") == [
        None, None, None, -30_000, -90_000, -150_000, 60_000, 0, -1, -1, 1, 1_001,
    ]  # fmt: skip
    with pytest.raises(ScriptError, match="bad @st item"):
        parse_start_offsets("1m*2")
    script = tmp_path / "st.test"
    script.write_text("load 1m\n    c@st _ -30s -1m\n    c    _ 5 7\n    d 1 2 3\n")
    (load,) = parse_script(script)
    assert isinstance(load, Load)
    assert load.starts == {0: [None, -30_000, -60_000]}
    storage = MemoryStorage()
    _load(storage, load)
    both = [Matcher("__name__", "=~", "c|d")]
    assert [x.start_timestamps for x in storage.select(both, 0, 600_000)] == [None, None]  # not asked for
    c, d = storage.select(both, 0, 600_000, SelectHints(start_timestamps=True))  # as for rate and friends
    assert c.start_timestamps is not None
    assert c.start_timestamps.tolist() == [60_000 - 30_000, 120_000 - 60_000]
    assert d.start_timestamps is None  # a series without: nothing carried
    for body, message in (
        ("    c@st _ 1m\n    d _ 1\n", "does not match"),
        ("    c@st _ 1m 1m\n    c _ 1\n", "has 3 values but sample line has 2"),
        ("    c@st _ 1m\n", "no following sample line"),
        ("    c@st _ 1m\n    c@st _ 1m\n    c _ 1\n", "no following sample line"),
    ):
        script.write_text("load 1m\n" + body)
        with pytest.raises(ScriptError, match=message):
            parse_script(script)
