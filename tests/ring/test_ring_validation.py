"""Bad rings are refused with clear errors; permissions hold; the header builds everywhere it claims to."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from ringutil import HERE, INCLUDE, compile_c

from kernel_insight.agent import DEFAULT_CAPACITY, Ring, RingError, RingReader

SHM = Path("/dev/shm")


def _image(ring_name: str) -> bytearray:
    with Ring.create(ring_name, capacity=16):
        data = bytearray((SHM / ring_name[1:]).read_bytes())
    Ring.unlink(ring_name)
    return data


def _install(ring_name: str, data: bytes) -> None:
    path = SHM / ring_name[1:]
    path.write_bytes(data)
    path.chmod(0o600)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            lambda d: struct.pack_into("<Q", d, 0, 0x1122334455667788),
            r"bad magic 0x1122334455667788.*not a Kernel Insight ring",
        ),
        (
            lambda d: struct.pack_into("<I", d, 8, 1),
            r"incompatible layout version 1, this build understands version 2",
        ),
        (
            lambda d: struct.pack_into("<I", d, 12, 128),
            r"incompatible record size 128 bytes, this build uses 64 bytes",
        ),
        (lambda d: struct.pack_into("<Q", d, 16, 12), r"corrupt header \(capacity 12"),
        (
            lambda d: struct.pack_into("<Q", d, 16, 1 << 20),
            r"truncated: object is \d+ bytes, its header needs \d+",
        ),
    ],
    ids=["magic", "version", "record-size", "capacity", "truncated"],
)
def test_bad_ring_is_refused_with_a_clear_error(ring_name: str, patch, message: str) -> None:
    data = _image(ring_name)
    patch(data)
    _install(ring_name, bytes(data))
    with pytest.raises(RingError, match=message) as exc:
        Ring.attach(ring_name)
    assert ring_name in str(exc.value)
    with pytest.raises(RingError, match=message):
        RingReader.open(ring_name)


def test_object_smaller_than_a_header_is_refused(ring_name: str) -> None:
    _install(ring_name, b"KIRING\0\0short")
    with pytest.raises(RingError, match=r"truncated: object is 13 bytes, smaller than a ring header"):
        Ring.attach(ring_name)


def test_bad_ring_is_refused_by_the_c_consumer_too(ringtool: Path, ring_name: str) -> None:
    data = _image(ring_name)
    struct.pack_into("<I", data, 8, 7)
    _install(ring_name, bytes(data))
    out = subprocess.run([ringtool, "dump", ring_name, "1", "10"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "incompatible layout version 7, this build understands version 2" in out.stderr


@pytest.mark.parametrize("capacity", [0, 3, 1000, 1 << 31])
def test_capacity_must_be_a_power_of_two(ring_name: str, capacity: int) -> None:
    if capacity == 0:
        with Ring.create(ring_name, capacity=0) as ring:  # 0 means the default
            assert ring.capacity == DEFAULT_CAPACITY == 32768
        return
    with pytest.raises(RingError, match="capacity must be a power of two"):
        Ring.create(ring_name, capacity=capacity)


def test_ring_is_created_private_by_default(ring_name: str) -> None:
    with Ring.create(ring_name, capacity=8):
        st = (SHM / ring_name[1:]).stat()
        assert stat.S_IMODE(st.st_mode) == 0o600


def test_group_ring_is_created_0660_with_that_group(ring_name: str) -> None:
    group = grp.getgrgid(os.getgid()).gr_name if os.getuid() != 0 else "daemon"
    with Ring.create(ring_name, capacity=8, mode=0o660, group=group):
        st = (SHM / ring_name[1:]).stat()
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == grp.getgrnam(group).gr_gid
    with pytest.raises(RingError, match="mode must be 0600 or 0660"):
        Ring.create(ring_name + "x", mode=0o666)
    with pytest.raises(ValueError, match="unknown group 'no-such-group-ki'"):
        Ring.create(ring_name + "y", mode=0o660, group="no-such-group-ki")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a child as another user (nobody)")
def test_attaching_without_permission_fails_clearly(ringtool: Path, ring_name: str) -> None:
    nobody = 65534
    public = Path(tempfile.mkdtemp(prefix="ki-ringtool-"))
    try:
        public.chmod(0o755)
        tool = public / "ringtool"
        shutil.copy(ringtool, tool)
        with Ring.create(ring_name, capacity=8):
            out = subprocess.run(
                [tool, "produce", ring_name, "1", "1"],
                capture_output=True,
                text=True,
                user=nobody,
                group=nobody,
                extra_groups=[],
            )
    finally:
        shutil.rmtree(public)
    assert out.returncode == 2
    assert f"cannot attach to ring {ring_name}: permission denied" in out.stderr
    assert "mode 0600" in out.stderr
    assert "this process uid 65534" in out.stderr


def test_header_compiles_as_c_cpp_and_with_sanitizers(tmp_path: Path, ring_name: str) -> None:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.fail("g++ missing: run scripts/bootstrap.sh (build-essential)")
    src = tmp_path / "use.cpp"
    src.write_text('#include "ki_ring.h"\nint main() { struct ki_ring r; (void)r; return 0; }\n')
    subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{INCLUDE}",
            str(src),
            "-o",
            str(tmp_path / "cpp"),
        ],
        check=True,
    )
    tool = compile_c(
        HERE / "c" / "ringtool.c",
        tmp_path / "ringtool-asan",
        ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    )
    with Ring.create(ring_name, capacity=64, producer=False):
        subprocess.run([tool, "write-all", ring_name], check=True)
        out = subprocess.run(
            [tool, "dump", ring_name, "10", "2000"], capture_output=True, text=True, check=True
        )
    assert len(out.stdout.splitlines()) == 10
    assert "runtime error" not in out.stderr


def test_header_compiles_as_cuda_host_code(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )
    if nvcc is None:
        pytest.skip(
            "nvcc is not installed on this machine: the CUDA host-code build of ki_ring.h is not checked"
        )
    src = tmp_path / "use.cu"
    src.write_text(
        '#include "ki_ring.h"\n__global__ void k() {}\n'
        'int main() { struct ki_ring r; char e[64]; return ki_ring_attach(&r, "/x", 0, e, 64) == 0; }\n'
    )
    subprocess.run(
        [
            nvcc,
            f"-I{INCLUDE}",
            "-Xcompiler",
            "-Wall,-Wextra,-Werror",
            "-c",
            str(src),
            "-o",
            str(tmp_path / "use.o"),
        ],
        check=True,
    )
    assert (tmp_path / "use.o").stat().st_size > 0
