"""Freed batches stay in the process: the next batch does not fault its pages in again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from eop_spark.speedups.malloc_tuning import TUNABLES_ENV, glibc_tunables

# Allocate a batch of 1 MiB blocks, write them, free them all; 30 times (the shape of
# an Arrow batch read, or of librdkafka's messages and requests).  The batches run in a
# forked child, as Spark's Python workers do after the daemon prepared itself.
# Prints the child's minor page faults.
PATTERN = textwrap.dedent(
    """
    import ctypes, os, resource, sys
    from eop_spark.speedups.malloc_tuning import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    pid = os.fork()
    if pid == 0:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(30):
            blocks = [libc.malloc(1 << 20) for _ in range(20)]
            for block in blocks:
                ctypes.memset(block, 1, 1 << 20)
            for block in blocks:
                libc.free(block)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    """
)


def page_faults(mode: str, env: dict[str, str] | None = None) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_batches_are_reused_without_new_page_faults() -> None:
    plain, kept = page_faults("plain"), page_faults("keep")
    one_batch = 20 * (1 << 20) // 4096
    # glibc by default hands the freed 20 MiB back and faults it in again for every batch.
    assert plain > 10 * one_batch
    # Kept: the first batch faults its pages in, the other 29 reuse them.
    assert kept < 2 * one_batch


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's tunables")
def test_a_process_started_with_the_tunables_reuses_freed_batches_too() -> None:
    """How the runner starts Spark's JVM, which cannot call mallopt itself."""
    one_batch = 20 * (1 << 20) // 4096
    assert page_faults("plain", {TUNABLES_ENV: glibc_tunables()}) < 2 * one_batch
