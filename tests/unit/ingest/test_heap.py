"""The batch ingest's heap policy: freed blocks are reused, not faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.ingest.heap import keep_freed_memory

#: allocates and frees a 40 MiB block 20 times, writing each, and prints the minor page faults
#: (glibc maps a block above 32 MiB afresh each time, whatever it was freed before)
_CYCLES = """
import resource, sys
from pipeline.ingest.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
block = bytearray(40 << 20)
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    block = bytearray(40 << 20)  # zeroed: every page written
    del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(policy: str) -> int:
    run = subprocess.run(
        [sys.executable, "-c", _CYCLES, policy], capture_output=True, text=True, check=True
    )
    return int(run.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_freed_blocks_are_reused_without_page_faults():
    if not keep_freed_memory():
        pytest.skip("this C library has no mallopt (not glibc)")
    pages = 20 * (40 << 20) // 4096
    assert _faults("default") > pages // 2  # each block a fresh mapping, each page a fault
    assert _faults("keep") < pages // 20  # the first block's pages, reused
