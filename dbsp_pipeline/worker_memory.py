"""How the engine's Spark tasks have their Python worker keep the memory it frees.

An owner or scatter task (``spark_session.run_tasks``) works on whole Arrow columns with numpy
and pyarrow: every elementwise step of a 500k-row column allocates a fresh array of a few
megabytes. glibc's ``malloc`` serves a block that big with its own ``mmap`` and gives it back
with ``munmap`` when freed (its threshold adapts only part of the way), so the next array of
the same size is fresh memory again and the kernel faults in each of its pages on first touch:
on this project's 2-core VM a numpy ``(a & 31).astype(uint64)`` of 1M values took 5.1 ms that
way (1,310 page faults) and 0.8 ms with the blocks reused (27 faults). ``keep_freed_memory``
therefore raises glibc's mmap threshold to its maximum (32 MiB: a bigger block is still mapped
and unmapped) and its trim threshold to 256 MiB (the free memory at the top of the heap a
process keeps instead of returning it to the system), once per process. Measured: the exact sum
and key hashing of a 600k-row change took 102 ms before and 61 ms after, in one process with
the setting switched at random between runs; the owner tasks of steps of 1M order changes at
1M orders forced onto Spark (W=2), 0.434 s median (0.554 mean) before and 0.387 s (0.438)
after, switched at random per stage (``make bench-lookup``'s ``orders_on_spark`` pattern).

Only the Python workers of Spark (processes Spark forks for the engine's tasks) are tuned, not
the driver, which is the user's process: its steps are small (a driver step of 10k changes
causes about 70 page faults) and its allocator is its owner's to choose. The cost is memory a
worker keeps after a task (at most the trim threshold above what it uses), which its next task
reuses. No effect on results. Not glibc (musl, macOS): nothing is done. ``DBSP_WORKER_MALLOC=0``
in a worker's environment turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: ``mallopt`` parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
#: the environment variable that turns the tuning off ("0")
SWITCH = "DBSP_WORKER_MALLOC"

_tuned_pid: int | None = None


def keep_freed_memory() -> bool:
    """Set this process's glibc malloc to keep and reuse the blocks it frees (see the module
    docstring), once per process (a forked child does it again). Returns whether the settings
    are in effect: False where ``SWITCH`` is "0" or the C library has no ``mallopt`` or
    refuses the values."""
    global _tuned_pid
    if _tuned_pid == os.getpid():
        return True
    if os.environ.get(SWITCH, "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD,
                                                                  TRIM_THRESHOLD)):
        return False
    _tuned_pid = os.getpid()
    return True
