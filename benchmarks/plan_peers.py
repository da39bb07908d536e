"""Peak-memory predictions from the tools users have today, for a training step of any nn.Module.

Each function returns ``{"bytes": float | None, "method": str, "note": str}``; ``bytes`` is None
(with a one-line note) when the tool cannot make the prediction. Neither function raises.

kitsune_peak_bytes -- torch-kitsune 0.7.0, ``kitsune.predict.predict_memory(model, input_shape,
    batch_size, dtype, optimizer, training=True, gpu=None)``. Its ``total_bytes`` is
    params + grads + optimizer states (fp32, 2 per element for adam/adamw, 0 for plain sgd)
    + activations + a flat 15% overhead. It needs no GPU: gpu=None only skips the "fits on X"
    comparison. Activations are the max of (a) torch.fx trace + ShapeProp summing every node's
    output, (b) a meta-device forward summing leaf-module outputs, and a per-layer formula only
    when both fail. It sees one input *shape* and feeds ``torch.randn(..., dtype)``: integer inputs
    (token ids) therefore break (a) and (b), and ``dtype`` sets both the input dtype and the
    activation element size. It ignores targets, the loss, what autograd really saves (it sums
    forward outputs instead), backward and optimizer-step temporaries and allocator behaviour;
    params are counted per module, so tied weights are counted twice in the parameter term.

accelerate_bytes -- accelerate 1.15.0 (version also recorded in "method"), the "Training using
    Adam" column of ``accelerate estimate-memory``: ``calculate_maximum_sizes(model)`` (params +
    buffers) fed to ``accelerate.commands.estimate.estimate_training_usage(size, dtype)``, of
    which the CLI prints ``max(values)``: 4 x model bytes for float32 (its "step" term), 2 x model
    bytes for mixed precision. It ignores activations, batch size, inputs and the optimizer
    choice (always Adam).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]


def _result(nbytes, method: str, note: str) -> dict:
    return {"bytes": None if nbytes is None else float(nbytes), "method": method, "note": note}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _torchvision_ok() -> None:
    # accelerate.commands.estimate imports timm, which imports torchvision; the CUDA torchvision
    # wheel here fails on CPU torch unless its missing op schemas are declared first.
    try:
        if str(_REPO) not in sys.path:
            sys.path.insert(0, str(_REPO))
        from benchmarks.user_models import _torchvision_importable

        _torchvision_importable()
    except Exception:
        pass


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage().splitlines()[0])


def _activation_path(lines: list[str]) -> str:
    """Which of kitsune's activation estimators produced a number (it logs each at DEBUG)."""
    ok = [tag for tag in ("fx", "meta", "formula")
          if any(l.startswith(f"[{tag}]") and "fail" not in l.lower() for l in lines)]
    return ("max of " + "/".join(ok)) if len(ok) > 1 else (ok[0] if ok else "unknown")


def kitsune_peak_bytes(build, inputs, targets, loss_fn, *, precision: str, optimizer: str,
                       batch_size: int) -> dict:
    try:
        import kitsune
        from kitsune.predict import predict_memory
    except ImportError:
        return _result(None, "kitsune.predict.predict_memory", "not installed")
    try:
        first = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
        extra = len(inputs) - 1 if isinstance(inputs, (tuple, list)) else 0
        shape = tuple(first.shape[1:])
        # kitsune's dtype is the model/input dtype; with autocast weights stay fp32 (its param,
        # grad and optimizer terms read the real fp32 model) and activations are bf16.
        dtype = {"fp32": "float32", "bf16": "bfloat16"}[precision]
        opt = {"adamw": "adamw", "sgd": "sgd"}[optimizer]
        method = (f"kitsune {kitsune.__version__} predict_memory(model, input_shape={shape}, "
                  f"batch_size={batch_size}, dtype={dtype!r}, optimizer={opt!r}, training=True, "
                  f"gpu=None).total_bytes")
        log = logging.getLogger("kitsune.predict.activation_estimator")
        cap, old = _Capture(), (log.level, log.propagate)
        log.addHandler(cap)
        log.setLevel(logging.DEBUG)
        log.propagate = False
        try:
            # torch.fx's ShapeProp prints the traceback of a failed trace that kitsune then
            # recovers from; which estimator succeeded is reported in the note instead.
            with contextlib.redirect_stderr(io.StringIO()):
                r = predict_memory(build(), input_shape=shape, batch_size=batch_size, dtype=dtype,
                                   optimizer=opt, training=True, gpu=None)
        finally:
            log.removeHandler(cap)
            log.setLevel(old[0])
            log.propagate = old[1]
        notes = [f"params {r.param_bytes} + grads {r.gradient_bytes} + opt {r.optimizer_bytes} + "
                 f"act {r.activation_bytes} ({_activation_path(cap.lines)}) + 15% {r.overhead_bytes}"]
        if r.param_bytes > r.gradient_bytes:
            notes.append("param term > grad term: tied/shared (or frozen) params counted per module")
        if not first.dtype.is_floating_point:
            notes.append(f"kitsune feeds randn, not {first.dtype} ids, so fx/meta fail on it")
        if extra:
            notes.append(f"only the first of {extra + 1} inputs is seen")
        notes.append("targets/loss ignored; device-independent (no CUDA needed)")
        return _result(r.total_bytes, method, "; ".join(notes))
    except Exception as exc:
        return _result(None, "kitsune.predict.predict_memory", _one_line(exc))


def accelerate_bytes(build, *, precision: str, optimizer: str) -> dict:
    try:
        import accelerate
        from accelerate.utils import calculate_maximum_sizes, convert_bytes
    except ImportError:
        return _result(None, "accelerate estimate-memory", "not installed")
    try:
        _torchvision_ok()
        from accelerate.commands.estimate import estimate_training_usage

        # The CLI offers float32/float16/int8/int4. For bf16 autocast the honest row is
        # "float16": estimate_training_usage treats float16 and bfloat16 alike as mixed
        # precision (fp32 weights + half-precision compute + fp32 Adam states).
        row = {"fp32": "float32", "bf16": "float16"}[precision]
        total_size, _largest = calculate_maximum_sizes(build())
        sizes = estimate_training_usage(total_size, row)
        peak = max(sizes.values())           # what estimate_command prints for the column
        method = (f"accelerate {accelerate.__version__}: max(estimate_training_usage("
                  f"calculate_maximum_sizes(model)[0]={total_size}, {row!r}).values())")
        if peak == -1:
            return _result(None, method, f"no training estimate for {row}")
        note = (f"CLI row {row} 'Training using Adam' = {convert_bytes(peak)}; {sizes}; "
                "ignores activations, batch size and inputs")
        if optimizer != "adamw":
            return _result(None, method, f"accelerate models Adam only (its Adam figure: "
                                         f"{convert_bytes(peak)}); ignores activations")
        return _result(peak, method, note)
    except Exception as exc:
        return _result(None, "accelerate estimate-memory", _one_line(exc))


def _self_check() -> int:
    import torch
    from torch import nn
    from torch.nn import functional as F

    _torchvision_ok()                        # transformers may pull torchvision in
    from transformers import GPT2Config, GPT2LMHeadModel

    def mlp():
        return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))

    def gpt2():
        cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
        return GPT2LMHeadModel(cfg)

    def ce(out, y):
        logits = out.logits if hasattr(out, "logits") else out
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    g = torch.Generator().manual_seed(0)
    cases = {
        "mlp": (mlp, torch.randn(64, 512, generator=g), torch.randint(0, 10, (64,), generator=g), 64),
        "gpt2": (gpt2, torch.randint(0, 1000, (4, 128), generator=g),
                 torch.randint(0, 1000, (4, 128), generator=g), 4),
    }
    for name, (build, x, y, bs) in cases.items():
        n = sum(p.numel() for p in build().parameters())
        print(f"== {name} ({n} params, fp32 adamw, batch {bs})")
        for tool, res in (
            ("kitsune", kitsune_peak_bytes(build, x, y, ce, precision="fp32", optimizer="adamw",
                                           batch_size=bs)),
            ("accelerate", accelerate_bytes(build, precision="fp32", optimizer="adamw")),
        ):
            mib = "n/a" if res["bytes"] is None else f"{res['bytes'] / 2**20:.3f} MiB"
            print(f"  {tool:10s} {res['bytes']} B ({mib})\n    method: {res['method']}\n"
                  f"    note:   {res['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(_self_check())
