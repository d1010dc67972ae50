"""Resident memory of a one-shot process (``ki import``) where no library has a setting for it.

Measured with ``/proc/self/smaps`` (bench/results/import.md, "Memory of `ki import`"): chDB's static
initialisers leave ~165 MB of its 555 MB library resident of which an import uses ~85, and
pyarrow imports pandas (~55 MB) the first time it builds an array, to ask whether the argument
is a pandas Series.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = [
    "MALLOC_ARENAS",
    "MALLOC_TRIM_INTERVAL_S",
    "MallocTrimmer",
    "drop_library_pages",
    "dropping_library_pages",
    "limit_malloc_arenas",
    "modules_unimportable",
]

_MADV_DONTNEED = 4
#: glibc's mallopt parameter for the most arenas (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8
#: Arenas a long-running server keeps (``ki collector``): glibc gives each thread that allocates
#: while another holds an arena a new one, up to 8 per core, and each keeps what was freed in it.
#: The collector's query, ingest and flush threads free large arrays in turn, so most of those
#: arenas held memory no thread used (bench/results/fleet.md, "malloc arenas"). Python's own
#: small-object allocator is unaffected.
MALLOC_ARENAS = 2
#: How often ``ki collector`` hands the free pages inside glibc's heaps back to the kernel
#: (``malloc_trim``). glibc returns memory by itself only from the top of a heap; chDB's inserts
#: and merges free large blocks below live ones, and that free space stayed resident (under the
#: soak's load, 20-80 MB that one trim returned: bench/results/soak.md, "Memory").
MALLOC_TRIM_INTERVAL_S = 10.0
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ")


def drop_library_pages(name_part: str, smaps: Path = Path("/proc/self/smaps")) -> int:
    """Unmap the resident pages of a loaded library's read-only mappings that hold no modified page.

    ``name_part`` is looked for in the mapping's path (``"/"``: every mapped file).

    Such a page is the file's own content, kept in the page cache: ``MADV_DONTNEED`` only takes
    it out of this process' page tables, and the next use maps it back from the cache. Code
    that ran once (a library's static initialisers, a schema's first creation) stops counting
    in the resident set; code in use comes back at once. A mapping with copy-on-write pages
    (``Anonymous`` above 0: relocations) or write permission is left alone, since dropping it
    would lose them. Returns the bytes that were resident in the mappings dropped; 0 where
    ``smaps`` cannot be read (not Linux). Not for a library with text relocations while it
    loads (the loader writes its code between this look and the drop); chDB has none.
    """
    try:
        text = smaps.read_text()
    except OSError:
        return 0
    spans: list[tuple[int, int]] = []
    dropped = 0
    current: tuple[int, int] | None = None
    rss = 0
    for line in text.splitlines():
        m = _MAPPING.match(line)
        if m is not None:
            start, end, perms = int(m.group(1), 16), int(m.group(2), 16), m.group(3)
            rest = line[m.end() :].split(maxsplit=3)  # offset, device, inode, path (if any)
            path = rest[3] if len(rest) > 3 else ""
            readonly = perms in ("r-xp", "r--p")
            current = (start, end) if readonly and path.startswith("/") and name_part in path else None
        elif current is not None and line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif current is not None and line.startswith("Anonymous:"):
            if int(line.split()[1]) == 0 and rss:
                spans.append(current)
                dropped += rss
            current = None
    if spans:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for start, end in spans:
            if madvise(start, end - start, _MADV_DONTNEED) != 0:
                return 0
    return dropped


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for the threads this process starts from now on (call it before
    starting them). Leaves a ``MALLOC_ARENA_MAX`` the user set alone; returns whether the cap was
    set (False elsewhere than glibc)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


class MallocTrimmer:
    """A daemon thread calling glibc's ``malloc_trim(0)`` every ``interval_s`` (:meth:`start`,
    :meth:`stop`): it walks the free chunks of every arena and releases their whole pages
    (``MADV_DONTNEED``), a few milliseconds with the arena locked. Does nothing elsewhere than glibc."""

    def __init__(self, interval_s: float = MALLOC_TRIM_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trim: Callable[[], None] | None = None
        try:
            libc = ctypes.CDLL(None)
            trim = libc.malloc_trim
        except (OSError, AttributeError):
            return
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
        self._trim = lambda: trim(0)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def trim(self) -> None:
        if self._trim is not None:
            self._trim()
            self.trims += 1

    def start(self) -> MallocTrimmer:
        if self._trim is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ki-malloc-trim", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.trim()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


@contextlib.contextmanager
def dropping_library_pages(name_part: str, interval_s: float = 0.05) -> Iterator[None]:
    """Drop the library's pages (:func:`drop_library_pages`) every ``interval_s`` while the block
    runs, and once more at its end: for a block that loads the library and runs its static
    initialisers (``dlopen`` lets other threads run meanwhile), whose pages would otherwise all be
    resident at once. Each round walks ``/proc/self/smaps``, which costs CPU with chDB loaded.
    """
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            drop_library_pages(name_part)

    thread = threading.Thread(target=loop, name="ki-drop-pages", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        drop_library_pages(name_part)


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] in self.names:
            raise ModuleNotFoundError(f"{fullname} is not imported here (kept out of memory)", name=fullname)
        return None


@contextlib.contextmanager
def modules_unimportable(*names: str) -> Iterator[None]:
    """Within the block, importing one of these top-level packages fails as if it were not installed.

    For optional imports a library makes on its own: pyarrow imports pandas (~55 MB resident)
    the first time ``pa.array`` runs, only to test whether its argument is a pandas object,
    and carries on without it when the import fails. Packages already imported are unaffected.
    """
    finder = _Refuse([n for n in names if n not in sys.modules])
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
