"""Decisions of the one-device engine: whether to compile, which attention kernels, how host
memory is kept. What is then done to the model (checkpointing, compiling) is
tensorpilot.modules, shared with the parallel runtime.
"""

from __future__ import annotations

import ctypes
import platform
import shutil

from torch import nn

from tensorpilot.hardware.device import DeviceCaps


# glibc mallopt parameters (<malloc.h>)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


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
    ok = (mallopt(_M_MMAP_THRESHOLD, 32 << 20)       # blocks up to 32 MiB from the heap
          and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)   # never give the heap's top back
          and mallopt(_M_TOP_PAD, 64 << 20))          # grow the heap 64 MiB at a time
    return "glibc malloc keeps freed memory for reuse (fewer page faults)" if ok else None


# compile=auto compiles when the rest of the run, at the eager step time, lasts longer than this.
# A cold compile of a small transformer takes tens of seconds on a CPU and the gain per step is
# model- and device-specific (a few percent either way on small CPU models, larger on GPUs), so
# the rule asks for a run long enough to repay a cold compile several times over; figures in
# benchmarks/RESULTS.md (compile_cost, techniques). --optimize auto measures instead.
COMPILE_WORTH_S = 400.0


def compile_decision(requested: str, caps: DeviceCaps, remaining_steps: int,
                     eager_step_s: float | None = None) -> tuple[bool | None, str]:
    """Whether to torch.compile, and why. ``None`` means 'time an eager step first': 'auto'
    compiles when the rest of the run, at the measured eager step time, would last longer
    than ``COMPILE_WORTH_S``."""
    if requested == "off":
        return False, "compile off as requested"
    has_cxx = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
    if requested == "on":
        note = "" if has_cxx or caps.kind != "cpu" else " (no C++ compiler found: it will probably fall back)"
        return True, "compile on as requested" + note
    if caps.kind == "cpu" and not has_cxx:
        return False, "auto: not compiling, inductor needs a C++ compiler on CPU and none was found"
    if caps.kind == "mps":
        return False, "auto: not compiling on MPS (inductor support there is experimental)"
    if eager_step_s is None:
        return None, "auto: deciding after timing an eager step"
    rest_s = remaining_steps * eager_step_s
    if rest_s < COMPILE_WORTH_S:
        return False, (f"auto: not compiling, the remaining {remaining_steps} steps take ~{rest_s:.0f} s "
                       f"eager, too short to repay compilation (< {COMPILE_WORTH_S:.0f} s)")
    return True, (f"auto: compiling, the remaining {remaining_steps} steps would take ~{rest_s:.0f} s "
                  "eager, long enough to repay compilation")


def compiler_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the compiler failed" (dynamo, inductor, the C++/CUDA compilers):
    the only ones a compiled step falls back to eager for. An OOM or a bug in the user's loss
    raised while running compiled code is not among them, and surfaces as itself."""
    import torch._dynamo.exc as dynamo_exc
    import torch._inductor.exc as inductor_exc

    found = [dynamo_exc.TorchDynamoException]           # BackendCompilerFailed, InductorError, ...
    found += [getattr(inductor_exc, n) for n in ("CppCompileError", "CUDACompileError", "LoweringException")
              if hasattr(inductor_exc, n)]
    return tuple(found)
