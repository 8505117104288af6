"""The C heap policy of a batch ingest: freed memory kept for reuse, not handed back.

glibc serves a block above its mmap threshold (128 KiB, raised as such blocks are freed, at
most 32 MiB) by a fresh mapping and returns it when freed, and gives the top of its heap back
past its trim threshold; either way the next block of that size is new memory, whose every
4 KiB page costs a page fault when first written (a few microseconds under a hypervisor). An
ingest decodes 8 MiB blocks and builds a chunk's lines, records and tables again and again:
on a 1 GB vLLM log with 2 workers, ~460k minor faults. Keeping freed memory (blocks up to
64 MiB from the heap, 256 MiB of free heap kept) makes it ~290k, for 20-40 MB more peak
resident memory in the largest process; the system time saved was within the noise of the
2-core machine it was measured on. Worker processes forked after the call inherit it. Only
for a process that ends when its ingest ends (the CLI): a long-lived worker would keep its
peak heap for good. Arrow's buffers come from its own allocator (mimalloc), which hands freed
pages back after a delay: the CLI keeps those too, with ``MIMALLOC_PURGE_DELAY=-1`` set before
Arrow loads (``COMMAND_ENVIRONMENT`` in :mod:`jobs.cli`; it is read only then).
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: blocks below this come from the heap (and are reused when freed)
MMAP_THRESHOLD = 64 << 20
#: free memory at the heap's top kept, not trimmed
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Set this process's heap to keep freed memory for reuse; False where the C library has
    no ``mallopt`` (musl, macOS: their allocators keep their own policy) or refuses it."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    set_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    set_trim = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(set_mmap and set_trim)
