"""Decisions of the one-device engine: whether to compile, which attention kernels, how host
memory is kept. What is then done to the model (checkpointing, compiling) is
tensorpilot.modules, shared with the parallel runtime.
"""

from __future__ import annotations

import shutil

from torch import nn

from tensorpilot.hardware.device import DeviceCaps
from tensorpilot.hardware.hostmem import retain_freed_host_memory  # noqa: F401 - engine's choice, kept here


# compile=auto weighs the compile time against what compiled steps save over the rest of the run.
# Both are measured, per model and machine: the first compiled run of a model records the compile
# time of its blocks (its first compiled step minus an eager step) and the compiled step time,
# and later runs decide from that record. A model never compiled on this machine is judged with
# these priors: a cold inductor compile of one transformer block, forward and backward, takes
# 15-30 s on a CPU (benchmarks/RESULTS.md, compile_cost; identical blocks share the graph), and
# compiled steps of small models gain a few percent on CPUs, more on GPUs.
COLD_COMPILE_PRIOR_S = 30.0
GAIN_PRIOR = 0.10
# a decision needs the saving to exceed the compile time by this factor (the priors are rough,
# and a short run must never be made slower by compiling)
COMPILE_SAFETY = 1.5


def block_signature(model: nn.Module, *, micro_batch: int, precision: str, device_name: str) -> str:
    """What a compile record is valid for: the model's repeated blocks (class and parameter
    shapes), the micro-batch, precision, device and torch version."""
    import hashlib
    import json

    import torch

    from tensorpilot.modules import repeated_blocks

    blocks = repeated_blocks(model) or [model]
    desc = {"classes": sorted({f"{type(b).__module__}.{type(b).__qualname__}" for b in blocks}),
            "n_blocks": len(blocks), "root": type(model).__qualname__,
            "shapes": [list(p.shape) for p in blocks[0].parameters()],
            "micro_batch": micro_batch, "precision": precision, "device": device_name, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def _record_path(signature: str):
    from tensorpilot.hardware.probe import cache_dir

    return cache_dir() / f"compile-{signature}.json"


def load_compile_record(signature: str) -> dict | None:
    """{"compile_s", "eager_step_s", "compiled_step_s"} measured by an earlier run, or None."""
    import json

    try:
        rec = json.loads(_record_path(signature).read_text())
        if all(isinstance(rec.get(k), (int, float)) and rec[k] > 0
               for k in ("compile_s", "eager_step_s", "compiled_step_s")):
            return rec
    except (OSError, ValueError, AttributeError):
        pass
    return None


def save_compile_record(signature: str, compile_s: float, eager_step_s: float, compiled_step_s: float) -> None:
    import json

    from tensorpilot.errors import TensorpilotError
    from tensorpilot.files import write_atomic

    path = _record_path(signature)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"compile_s": max(compile_s, 1e-3), "eager_step_s": eager_step_s,
                                       "compiled_step_s": compiled_step_s}), "compile record")
    except (OSError, TensorpilotError):
        pass                                  # a read-only cache only costs the next run a prior


def compile_decision(requested: str, caps: DeviceCaps, remaining_steps: int,
                     eager_step_s: float | None = None, record: dict | None = None) -> tuple[bool | None, str]:
    """Whether to torch.compile, and why. ``None`` means 'time an eager step first'. 'auto'
    compiles when the time compiled steps would save over the remaining steps (at the measured
    eager step time) exceeds the compile time ``COMPILE_SAFETY`` times over; compile time and
    gain come from ``record`` (measured by an earlier run of this model here) or the priors."""
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
    if record is not None:
        compile_s = record["compile_s"]
        gain = 1 - record["compiled_step_s"] / record["eager_step_s"]
        basis = (f"measured here before: compile {compile_s:.0f} s, compiled step "
                 f"{gain:+.0%} vs eager" if gain <= 0 else
                 f"measured here before: compile {compile_s:.0f} s, compiled steps {gain:.0%} faster")
    else:
        compile_s, gain = COLD_COMPILE_PRIOR_S, GAIN_PRIOR
        basis = (f"not compiled here before: priors of {compile_s:.0f} s to compile and "
                 f"{gain:.0%} faster steps")
    if gain <= 0:
        return False, f"auto: not compiling, compiled steps were no faster ({basis})"
    saving = remaining_steps * eager_step_s * gain
    if saving < COMPILE_SAFETY * compile_s:
        return False, (f"auto: not compiling, the remaining {remaining_steps} steps would save ~{saving:.0f} s, "
                       f"less than {COMPILE_SAFETY:g}x the compile time ({basis})")
    return True, (f"auto: compiling, the remaining {remaining_steps} steps would save ~{saving:.0f} s, "
                  f"more than {COMPILE_SAFETY:g}x the compile time ({basis})")


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
