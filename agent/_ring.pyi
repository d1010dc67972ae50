from types import TracebackType
from typing import Any, Self

from typing_extensions import Buffer

VERSION: int
RECORD_SIZE: int
DEFAULT_CAPACITY: int
DROPPED: int
LOST: int

class RingError(OSError): ...

class Ring:
    @classmethod
    def create(
        cls,
        name: str,
        capacity: int = ...,
        mode: int = ...,
        group: str | int | None = ...,
        label: str | None = ...,
        producer: bool = ...,
        *,
        flags: int = ...,
    ) -> Self: ...
    @classmethod
    def attach(cls, name: str, create: bool = ..., producer: bool = ..., *, flags: int = ...) -> Self: ...
    @classmethod
    def unlink(cls, name: str) -> None: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def flags(self) -> int: ...
    @flags.setter
    def flags(self, value: int) -> None: ...
    def close(self) -> None: ...
    def kernel(
        self,
        name_id: int,
        device: int,
        start_ns: int,
        end_ns: int,
        stream: int = ...,
        correlation: int = ...,
        pid: int = ...,
        /,
    ) -> int: ...
    def launch(
        self,
        function_id: int,
        device: int,
        ts_ns: int,
        pid: int,
        tid: int,
        gx: int = ...,
        gy: int = ...,
        gz: int = ...,
        bx: int = ...,
        by: int = ...,
        bz: int = ...,
        /,
    ) -> int: ...
    def launch_span(
        self, name_id: int, device: int, ts_ns: int, pid: int, tid: int, correlation: int, host_ns: int, /
    ) -> int: ...
    def memop(
        self,
        kind: int,
        device: int,
        ts_ns: int,
        address: int,
        nbytes: int,
        pid: int,
        tid: int = ...,
        status: int = ...,
        /,
    ) -> int: ...
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
        failed: int = ...,
        /,
    ) -> int: ...
    def sync(
        self, kind: int, device: int, ts_ns: int, duration_ns: int, handle: int, pid: int, tid: int = ..., /
    ) -> int: ...
    def sample(self, metric: int, device: int, ts_ns: int, value: float, aux: int = ..., /) -> int: ...
    def fingerprint(
        self, field: int, device: int, ts_ns: int, value: int, is_string: int = ..., /
    ) -> int: ...
    def error(
        self,
        kind: int,
        device: int,
        ts_ns: int,
        code: int,
        aux: int = ...,
        pid: int = ...,
        detail_id: int = ...,
        /,
    ) -> int: ...
    def string(self, string_id: int, name: str | bytes, /) -> int: ...
    def intern(self, name: str, /) -> int: ...
    def write_raw(self, record: Buffer, /) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def producer_stats(self, producer_id: int, /) -> dict[str, int] | None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> bool: ...

class Consumer:
    @classmethod
    def open(
        cls, name: str, create: bool = ..., stall_timeout_ns: int = ..., stall_min_ns: int = ...
    ) -> Self: ...
    @property
    def capacity(self) -> int: ...
    @property
    def label(self) -> str: ...
    def close(self) -> None: ...
    def read_into(self, buffer: Any, /) -> int: ...
    def peek_into(self, buffer: Any, /) -> int: ...
    def commit(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def producer_stats(self, producer_id: int, /) -> dict[str, int] | None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> bool: ...
