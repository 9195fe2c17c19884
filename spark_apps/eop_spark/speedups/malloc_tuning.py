"""Keep freed memory in the process instead of handing it back to the kernel at once.

The processes that move records (Spark's Python workers in partitioned mode,
the runner itself in coordinated mode) allocate and free the same large
blocks over and over: every Arrow batch read from the JVM is a new ~1 MB
buffer, every batch of ``rd_kafka_message_t`` a new numpy array, and every
produce request librdkafka builds a new buffer of up to ``batch.size``.
glibc serves blocks over its mmap threshold (128 KiB until it adapts) with
``mmap`` and returns them with ``munmap``, and trims the heap's free top
above its trim threshold; the next block then starts on fresh pages, which
the kernel must fault in and zero one by one.  Measured with ``perf`` on a
partitioned copy of 1,000,000 100-byte records: a third of the Python
workers' CPU and a fifth of librdkafka's sending thread went to those page
faults (``clear_page_erms``).

:func:`keep_freed_memory` raises both thresholds (``mallopt``), so such
blocks come from the heap and go back to it, and up to
:data:`TRIM_THRESHOLD` bytes of free heap stay mapped for the next batch.
The cost is that memory: a worker's resident size does not drop below its
peak until it is idle below the threshold again.  On a C library without
``mallopt`` (musl, macOS) it does nothing.

Spark's JVM does the same with Arrow's buffers in partitioned mode: a task
thread allocates the vectors of every Arrow batch it sends to a Python worker
(16 MB for 10,000 records of 1 KiB, over the 4 MB chunks Arrow's allocator
pools) and frees them after.  The JVM cannot call ``mallopt``, so the runner
starts it with the same thresholds in :data:`TUNABLES_ENV`
(:func:`glibc_tunables`, see :mod:`eop_spark.runtime.session`).  Measured on
copies of 1,000,000 1 KiB records through Arrow: the JVM's minor page faults fell
from 120,000-175,000 to 1,000-57,000, and in ``perf`` the kernel's page
zeroing and fault handling, 13 % of all the machine's samples while the copy
ran (``clear_page_erms`` alone 8 %), left the JVM's task threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks up to this size come from the heap (glibc's maximum: 32 MiB on 64-bit).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free heap kept mapped before glibc gives memory back.
TRIM_THRESHOLD = 256 * 1024 * 1024


#: The environment variable glibc reads its tunables from when a process starts.
TUNABLES_ENV = "GLIBC_TUNABLES"


def glibc_tunables() -> str:
    """:data:`TUNABLES_ENV`'s value for a process to start with both thresholds raised."""
    return (
        f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"
    )


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; ``False`` if not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it)
    except (OSError, AttributeError, TypeError):
        log.debug("no glibc mallopt: allocator thresholds left as they are")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = int(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) == 1
    ok = int(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) == 1 and ok
    if not ok:
        log.debug("mallopt refused the allocator thresholds")
    return ok
