"""The batch ingest's heap policy: freed blocks are reused, not faulted in again."""

from __future__ import annotations

import os
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


#: registers ``prewarm ingest`` as its run does, then has Arrow write and free 256 MiB in
#: 64 KiB arrays five times, idle 0.1 s after each (past the allocator's purge delay), and
#: prints the minor page faults of the cycles
_ARROW_CYCLES = """
import os, resource, sys, time
from jobs.cli import _register_commands
_register_commands(["ingest", "x.log"])
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
print(os.environ.get("MIMALLOC_PURGE_DELAY"))
if pa.default_memory_pool().backend_name != "mimalloc":
    print(-1)
    sys.exit()
base = pa.array(np.zeros(8192, np.int64))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    arrays = [pc.add(base, 1) for _ in range(4096)]
    del arrays
    time.sleep(0.1)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _arrow_faults(**environ: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MIMALLOC_PURGE_DELAY"} | environ
    run = subprocess.run(
        [sys.executable, "-c", _ARROW_CYCLES], capture_output=True, text=True, check=True, env=env
    )
    setting, faults = run.stdout.split()
    return setting, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-fault counts: Linux")
def test_prewarm_ingest_keeps_arrows_freed_pages_unless_told_otherwise():
    setting, kept = _arrow_faults()
    if kept < 0:
        pytest.skip("this pyarrow's default memory pool is not mimalloc")
    assert setting == "-1"  # set by the CLI before Arrow loaded
    told, purged = _arrow_faults(MIMALLOC_PURGE_DELAY="0")  # the caller's value is kept
    assert told == "0"
    assert purged > 2 * kept  # freed pages handed back, each faulted in again
