"""How this process's host memory allocator keeps freed memory: a property of the machine's
C library that the training step and the planner's op replays must share, or a replayed op and
the same op in a step see different page-fault costs."""

from __future__ import annotations

import ctypes
import platform

# glibc mallopt parameters (<malloc.h>)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
# glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): a block above it always
# gets a mapping of its own, so its pages fault afresh each time it is allocated
MMAP_CEILING = 32 << 20


def retain_freed_host_memory() -> str | None:
    """Ask glibc malloc to keep freed memory for reuse instead of handing it back to the kernel.

    By default glibc serves allocations above its mmap threshold (128 KiB, adapting up to
    32 MiB) with a fresh ``mmap`` and returns them with ``munmap`` on free, and trims the top of
    its heap: each training step's activations then arrive as fresh pages, and every first touch
    of a 4 KiB page is a page fault. Here blocks up to 32 MiB (glibc's own adaptive ceiling) come
    from the heap and the heap is never trimmed. Larger blocks keep their own mappings: serving
    them from the heap too lets aligned allocations of one recurring size fragment the heap.
    Page faults per step drop by orders of magnitude at the same peak resident memory
    (benchmarks/host_memory.py). PyTorch's CPU tuning guide gets the same effect by preloading
    jemalloc or tcmalloc; this needs no preload and no dependency. The cost: the process keeps its peak heap until it exits. Returns a description,
    or None where not applicable (not Linux/glibc, or mallopt refused)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    ok = (mallopt(_M_MMAP_THRESHOLD, MMAP_CEILING)       # blocks up to 32 MiB from the heap
          and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)   # never give the heap's top back
          and mallopt(_M_TOP_PAD, 64 << 20))          # grow the heap 64 MiB at a time
    return "glibc malloc keeps freed memory for reuse (fewer page faults)" if ok else None
