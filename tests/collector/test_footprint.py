"""footprint: library pages dropped from the resident set keep their content; imports refused only within the block."""

from __future__ import annotations

import importlib
import mmap
import sys
from pathlib import Path

import pytest

from kernel_insight.collector.footprint import drop_library_pages, modules_unimportable

PAGE = mmap.PAGESIZE


def _mapping_rss_kb(path: Path) -> int:
    """Resident kB of this process' mappings of ``path`` (summed over its mappings)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def test_dropped_pages_leave_the_resident_set_and_read_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "lib.so"
    content = bytes(range(256)) * (64 * PAGE // 256)
    path.write_bytes(content)
    with path.open("rb") as f:
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    try:
        assert sum(m[i] for i in range(0, len(m), PAGE)) >= 0  # touch every page
        assert _mapping_rss_kb(path) >= 64 * PAGE // 1024
        dropped = drop_library_pages(str(path))
        assert dropped >= 64 * PAGE
        assert _mapping_rss_kb(path) == 0
        assert m[:] == content  # faulted back in from the page cache
        assert drop_library_pages(str(path)) == 64 * PAGE  # resident again after the read
    finally:
        m.close()


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def test_a_written_private_mapping_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"\0" * (4 * PAGE))
    with path.open("r+b") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # rw-p: copy-on-write pages
    try:
        m[:5] = b"hello"
        assert drop_library_pages(str(path)) == 0
        assert m[:5] == b"hello"
    finally:
        m.close()


def test_a_missing_smaps_drops_nothing(tmp_path: Path) -> None:
    assert drop_library_pages("anything", smaps=tmp_path / "absent") == 0


def test_modules_are_refused_only_inside_the_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ki_heavy_optional").mkdir()
    (tmp_path / "ki_heavy_optional" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "ki_heavy_optional" / "part.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with modules_unimportable("ki_heavy_optional"):
        with pytest.raises(ModuleNotFoundError, match="kept out of memory"):
            importlib.import_module("ki_heavy_optional")
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("ki_heavy_optional.part")
    assert importlib.import_module("ki_heavy_optional.part").VALUE == 2
    # Already imported: unaffected.
    with modules_unimportable("ki_heavy_optional"):
        assert importlib.import_module("ki_heavy_optional").VALUE == 1
    for name in ("ki_heavy_optional.part", "ki_heavy_optional"):
        sys.modules.pop(name, None)
