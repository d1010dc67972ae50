"""close() racing readers: a consumer handle is never unmapped under a read that runs without the GIL.

The race runs in a child process, so an unguarded unmap shows as a crash (SIGSEGV)
of the child rather than of the test runner.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    from kernel_insight.agent import RECORD_DTYPE, Ring
    from kernel_insight.agent import _ring

    name = sys.argv[1]
    outcomes = {"read": 0, "closed": 0}
    lock = threading.Lock()
    raw = bytes([1]) + bytes(47)
    for rnd in range(12):
        ring = Ring.create(name, capacity=1 << 18)
        for i in range(250000):  # a 16 MB copy: a read stays GIL-free for milliseconds
            ring.write_raw(raw)
        consumer = _ring.Consumer.open(name, False, 250_000_000, 2_000_000)
        start = threading.Barrier(5)

        def reader(peek):
            buf = np.empty(1 << 18, dtype=RECORD_DTYPE)
            start.wait()
            for _ in range(50):
                try:
                    n = consumer.peek_into(buf) if peek else consumer.read_into(buf)
                    if peek:
                        consumer.commit()
                except ValueError as exc:
                    assert "closed" in str(exc), exc
                    with lock:
                        outcomes["closed"] += 1
                    return
                with lock:
                    outcomes["read"] += 1

        threads = [threading.Thread(target=reader, args=(i % 2 == 0,)) for i in range(4)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(0.0005 * (rnd % 6))
        consumer.close()  # while a reader is (most likely) inside a GIL-free copy
        for t in threads:
            t.join()
        consumer.close()  # twice is fine
        ring.close()
        Ring.unlink(name)
    print(outcomes)
    assert outcomes["closed"] > 0
    """
)


def test_close_waits_for_reads_in_progress_and_later_reads_raise(ring_name: str) -> None:
    r = subprocess.run([sys.executable, "-c", CHILD, ring_name], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"child exited {r.returncode}: {r.stderr[-2000:]}"
    assert "closed" in r.stdout
