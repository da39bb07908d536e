"""A traced eager step as ``torch.compile`` runs it: the memory-bound ops between two compute ops
become one fused kernel that reads from memory only what comes from outside it and writes only
what is used outside it.

Why this is the model: TorchInductor (the default ``torch.compile`` backend) keeps matmuls,
convolutions and fused attention as library calls (cuBLAS, cuDNN, the SDPA kernels: "extern
kernels"; the Triton GEMM templates that fuse epilogues need ``mode="max-autotune"``) and fuses
the pointwise ops and reductions between them into generated kernels, so an intermediate such as
a GELU's erf or a norm's mean never reaches memory (Ansel et al., "PyTorch 2", ASPLOS 2024,
section 4: "loop-level" fusion of pointwise, reduction and scatter ops; the forward and backward
are separate graphs made by AOTAutograd). The eager trace already says which tensors flow between
ops (``OpRecord.ins`` / ``outs``: one serial per allocation), so a fused region's traffic is

    read    = the distinct tensors its ops read that no op of the region wrote
    written = the distinct tensors its ops write that an op outside the region uses
              (the next GEMM's input, what backward reads of the forward, a gradient the
              optimizer reads, a state updated in place)

and its kernel count is one, at the device's memory bandwidth like any memory-bound op. What this
leaves out: a reduction whose result the same region broadcasts back (a norm over a row too long
for one block) can need a second pass over its input, and one over a non-inner dimension (batch
norm over N, H, W of NCHW) runs well below bandwidth; Inductor may split a region into a few
kernels (launches, not bytes); its partitioner recomputes cheap forward ops in backward rather
than saving them, which shrinks memory (not modelled: the compiled plan keeps the eager trace's
peak) and adds a little traffic; a run that compiles per block (``tensorpilot train``) leaves the
ops outside its blocks eager. The optimizer runs outside the compiled model
(``torch.compile(model)``), so its ops stay as they are, and views cost nothing once compiled.
Measured against an H100 in benchmarks/RESULTS.md, "Second GPU lease".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from tensorpilot.observe.trace import COMPUTE_CLASSES, MEMORY, VIEW, OpRecord, StepTrace

FUSED_PHASES = ("forward", "backward")       # the graphs torch.compile(model) makes


def _users(ops: list[OpRecord]) -> dict[int, set[int]]:
    """Serial -> indices of the ops that read or write it."""
    users: dict[int, set[int]] = defaultdict(set)
    for i, op in enumerate(ops):
        for s in op.ins:
            users[s].add(i)
        for s, _ in op.outs:
            users[s].add(i)
    return users


def _region(ops: list[OpRecord], idx: list[int], users: dict[int, set[int]], n: int) -> OpRecord:
    """One fused kernel standing for the memory-bound ops ``idx`` (consecutive, one phase)."""
    inside = set(idx)
    made: set[int] = set()
    read: dict[int, int] = {}
    written: dict[int, int] = {}
    for i in idx:
        op = ops[i]
        # operand bytes in ``reads`` are aligned with ``ins``
        for s, (nbytes, _) in zip(op.ins, op.reads):
            if s not in made:
                read[s] = max(read.get(s, 0), nbytes)
        for s, nbytes in op.outs:
            made.add(s)
            if users[s] - inside or s in read:          # used outside, or a tensor updated in place
                written[s] = max(written.get(s, 0), nbytes)
    first = ops[idx[0]]
    names = sorted({ops[i].op for i in idx})
    return OpRecord(op=f"fused[{len(idx)} ops]", module=first.module, phase=first.phase, op_class=MEMORY, flops=0,
                    bytes_read=sum(read.values()), bytes_written=sum(written.values()), dtype=first.dtype,
                    signature=f"fused#{n}:" + ",".join(names), replay=None,
                    reads=tuple((b, 1 << 62) for b in read.values()), ins=tuple(read), outs=tuple(written.items()))


def _groups(ops: list[OpRecord]) -> list[list[int] | int]:
    """The step in order: an int for an op kept as it is, a list of indices for one fused kernel.

    A memory-bound op joins the kernel before the compute ops just run when it reads nothing they
    wrote: the scheduler orders by dependencies, not by the eager order (a bias's gradient, summed
    after its weight's gradient GEMM, fuses with the op that produced the incoming gradient)."""
    out: list[list[int] | int] = []
    run: list[int] | None = None            # the open kernel: memory ops since the last compute op
    last: list[int] | None = None           # the phase's kernel before the compute ops since
    since: set[int] = set()                 # serials those compute ops wrote
    phase = None
    for i, op in enumerate(ops):
        if op.phase != phase:
            phase, run, last, since = op.phase, None, None, set()
        if op.phase not in FUSED_PHASES:
            out.append(i)
            continue
        if op.op_class == VIEW:
            continue
        if op.op_class in COMPUTE_CLASSES:
            out.append(i)
            if run is not None:
                last, run, since = run, None, set()
            since.update(s for s, _ in op.outs)
            continue
        if run is None and last is not None and not since.intersection(op.ins):
            last.append(i)
            continue
        if run is None:
            run = []
            out.append(run)
        run.append(i)
    return out


def fuse(trace: StepTrace) -> StepTrace:
    """The compiled step of ``trace`` (an eager trace, observe/trace.py): compute ops unchanged,
    the memory-bound ops between them (one phase) fused kernels, views gone; the optimizer's ops
    unchanged. Memory and notes are the eager trace's."""
    ops = trace.ops
    users = _users(ops)
    out: list[OpRecord] = []
    for g in _groups(ops):
        out.append(ops[g] if isinstance(g, int) else _region(ops, g, users, len(out)))
    return replace(trace, ops=out, notes=list(trace.notes) + [
        f"compiled: {sum(1 for o in ops if o.op_class == MEMORY and o.phase in FUSED_PHASES):,} memory-bound ops "
        f"as {sum(1 for o in out if o.op.startswith('fused['))} fused kernels (modelplan/fusion.py); memory is the "
        "eager step's"])


__all__ = ["FUSED_PHASES", "fuse"]
