"""Producer records packed here rather than by ``Ring``'s methods, so every record can carry flags.

The ring's producer methods set no flags beyond FAILED and FP_STRING; the
simulator must mark each record SIMULATED (docs/ring.md), so it packs the
48-byte record itself and publishes it with ``Ring.write_raw``.
"""

from __future__ import annotations

from collections.abc import Callable

from kernel_insight.agent.records import (
    COLLECTIVE_PAYLOAD,
    ERROR_PAYLOAD,
    FINGERPRINT_PAYLOAD,
    KERNEL_PAYLOAD,
    LAUNCH_PAYLOAD,
    MEMOP_PAYLOAD,
    REC_HEAD,
    SAMPLE_PAYLOAD,
    SYNC_PAYLOAD,
    RecordFlag,
    RecordType,
)

__all__ = ["FlaggedWriter"]

_U64 = (1 << 64) - 1


class FlaggedWriter:
    """Writes typed records with extra flags OR-ed into every one, strings included.

    Interning mirrors ``Ring.intern``: ids are numbered from 1 for this writer,
    and a name whose STRING chunks did not all land is registered again on its
    next use.  Use one writer per ring handle and do not mix it with that
    handle's own ``intern`` (the two would number ids independently).

    Example::

        ring = Ring.attach(ring_name(0), create=True)
        w = FlaggedWriter(ring.write_raw, RecordFlag.SIMULATED)
        w.kernel(w.intern("gemm"), 0, 1_000, 2_000, 7, 1, 42)
    """

    def __init__(self, write_raw: Callable[[bytes], int], flags: int = 0) -> None:
        self._write = write_raw
        self.flags = int(flags)
        self._ids: dict[str, int] = {}
        self._pending: set[str] = set()
        self._next_id = 1
        self.written = 0
        self.failed = 0

    def _put(self, rtype: int, flags: int, device: int, ident: int, ts_ns: int, payload: bytes) -> int:
        rec = REC_HEAD.pack(rtype, (self.flags | flags) & 0xFF, device, ident, ts_ns & _U64) + payload
        rc = self._write(rec)
        if rc == 0:
            self.written += 1
        else:
            self.failed += 1
        return rc

    def string(self, string_id: int, name: str, ts_ns: int) -> int:
        data = name.encode("utf-8")
        chunks = max(1, (len(data) + 31) // 32)
        for i in range(chunks):
            part = data[i * 32 : (i + 1) * 32].ljust(32, b"\0")
            last = RecordFlag.STRING_LAST if i == chunks - 1 else 0
            rc = self._put(RecordType.STRING, last, i, string_id, ts_ns, part)
            if rc != 0:
                return rc
        return 0

    def intern(self, name: str, ts_ns: int = 0) -> int:
        sid = self._ids.get(name)
        if sid is not None and name not in self._pending:
            return sid
        if sid is None:
            sid = self._next_id
            self._next_id += 1
            self._ids[name] = sid
        if self.string(sid, name, ts_ns) != 0:
            self._pending.add(name)
        else:
            self._pending.discard(name)
        return sid

    def kernel(
        self, name_id: int, device: int, start_ns: int, end_ns: int, stream: int, corr: int, pid: int
    ) -> int:
        return self._put(
            RecordType.KERNEL, 0, device, name_id, start_ns, KERNEL_PAYLOAD.pack(end_ns, stream, corr, pid)
        )

    def launch(
        self,
        function_id: int,
        device: int,
        ts_ns: int,
        pid: int,
        tid: int,
        grid: tuple[int, int, int] = (1, 1, 1),
        block: tuple[int, int, int] = (1, 1, 1),
    ) -> int:
        payload = LAUNCH_PAYLOAD.pack(pid, tid, *grid, *block)
        return self._put(RecordType.LAUNCH, 0, device, function_id, ts_ns, payload)

    def memop(
        self,
        kind: int,
        device: int,
        ts_ns: int,
        address: int,
        nbytes: int,
        pid: int,
        tid: int = 0,
        status: int = 0,
    ) -> int:
        flags = RecordFlag.FAILED if status else 0
        payload = MEMOP_PAYLOAD.pack(address, nbytes, pid, tid, status)
        return self._put(RecordType.MEMOP, flags, device, kind, ts_ns, payload)

    def collective(
        self,
        op: int,
        device: int,
        ts_ns: int,
        nbytes: int,
        duration_ns: int,
        comm: int,
        rank: int,
        nranks: int,
        failed: bool = False,
    ) -> int:
        payload = COLLECTIVE_PAYLOAD.pack(nbytes, duration_ns, comm, rank, nranks)
        flags = RecordFlag.FAILED if failed else 0
        return self._put(RecordType.COLLECTIVE, flags, device, op, ts_ns, payload)

    def sync(
        self, kind: int, device: int, ts_ns: int, duration_ns: int, handle: int, pid: int, tid: int = 0
    ) -> int:
        return self._put(
            RecordType.SYNC, 0, device, kind, ts_ns, SYNC_PAYLOAD.pack(duration_ns, handle, pid, tid)
        )

    def sample(self, metric: int, device: int, ts_ns: int, value: float, aux: int = 0) -> int:
        return self._put(RecordType.GPU_SAMPLE, 0, device, metric, ts_ns, SAMPLE_PAYLOAD.pack(value, aux))

    def fingerprint(self, field: int, device: int, ts_ns: int, value: int, is_string: bool = False) -> int:
        flags = RecordFlag.FP_STRING if is_string else 0
        return self._put(RecordType.FINGERPRINT, flags, device, field, ts_ns, FINGERPRINT_PAYLOAD.pack(value))

    def error(
        self, kind: int, device: int, ts_ns: int, code: int, aux: int = 0, pid: int = 0, detail_id: int = 0
    ) -> int:
        return self._put(
            RecordType.ERROR, 0, device, kind, ts_ns, ERROR_PAYLOAD.pack(code, aux, pid, detail_id)
        )
