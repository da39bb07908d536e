"""The optimizer step's implementation (fused / foreach / loop) in the planner, against what
torch.optim's AdamW actually dispatches: every op's tensors read and written, counted with a
TorchDispatchMode on a small model, per parameter."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tensorpilot.hardware import catalog
from tensorpilot.plan import calibration as cal
from tensorpilot.plan import memory as mem
from tensorpilot.plan.models import get_model
from tensorpilot.plan.validate import _optimizer_impl

pr = importlib.import_module("tensorpilot.plan.predict")   # the module; tensorpilot.plan.predict is also the function


class _Traffic(TorchDispatchMode):
    """Bytes each op reads (its distinct tensor arguments) and writes (the arguments whose values it
    changed, and the tensors it returns new); scalars and one-element step counters are left out,
    as are ops on them alone, which the device does not run for the parameters."""

    def __init__(self):
        super().__init__()
        self.read = self.written = 0
        self.param_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.numel() > 1]
        distinct = list({t.data_ptr(): t for t in ins}.values())
        before = [t.clone() for t in distinct]
        out = func(*args, **kwargs)
        if not distinct:
            return out
        self.param_ops += 1
        self.read += sum(t.numel() * t.element_size() for t in distinct)
        self.written += sum(t.numel() * t.element_size() for t, b in zip(distinct, before) if not torch.equal(t, b))
        ptrs = {t.data_ptr() for t in distinct}
        self.written += sum(t.numel() * t.element_size() for t in tree_flatten(out)[0]
                            if isinstance(t, torch.Tensor) and t.numel() > 1 and t.data_ptr() not in ptrs)
        return out


def _measure(impl: str, dtype: torch.dtype) -> tuple[float, float]:
    """(bytes per parameter, ops per parameter tensor) of one AdamW step after the first."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64)).to(dtype)
    params = list(model.parameters())
    kw = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    # values large enough that every write changes bf16 numbers too (a write that leaves them equal
    # would go uncounted); the traffic does not depend on them
    opt = torch.optim.AdamW(params, lr=0.5, betas=(0.5, 0.5), weight_decay=0.5, eps=0.5, **kw)
    for step in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        if step == 0:
            opt.step()       # creates the moments
    traffic = _Traffic()
    with traffic:
        opt.step()
    n = sum(p.numel() for p in params)
    return (traffic.read + traffic.written) / n, traffic.param_ops / len(params)


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16-pure", torch.bfloat16)])
@pytest.mark.parametrize("impl", ["fused", "foreach", "loop"])
def test_optimizer_bytes_per_parameter_match_torch_adamw(impl, precision, dtype):
    measured, _ = _measure(impl, dtype)
    prec = mem.precision(precision, "adam")
    assert pr._optimizer_bytes_per_param(prec, "adam", impl) == pytest.approx(measured, rel=0.02)


def test_unfused_adamw_moves_twenty_accesses_a_parameter_in_fp32():
    # hand count: 4 + 3 + 5 + 2 + 6 accesses of 4 bytes; fused: (2 + 2 + 2 + 1) x 4
    prec = mem.precision("fp32", "adam")
    assert pr._optimizer_bytes_per_param(prec, "adam", "foreach") == 80
    assert pr._optimizer_bytes_per_param(prec, "adam", "fused") == 28
    # optimizers whose unfused form is not counted keep the one-pass figure
    assert pr._optimizer_bytes_per_param(prec, "sgd", "foreach") == pr._optimizer_bytes_per_param(prec, "sgd", "fused")


def test_loop_dispatches_the_planned_ops_per_tensor():
    _, ops = _measure("loop", torch.float32)
    # the step counter's increment runs on a one-element host tensor: not a parameter op
    assert ops == pr.LOOP_OPS_PER_TENSOR - 1


def test_layer_tensors_by_family():
    llama = get_model("llama3-8b")          # q, k, v, o, gate, up, down + two RMSNorm scales
    gpt = get_model("gpt2")                 # q, k, v, o, up, down with biases + two LayerNorms' scale and shift
    assert llama.layer_tensors == 9
    assert gpt.layer_tensors == 16


def _plan(impl: str, model: str = "gpt2", batch: int = 8):
    return pr.predict(get_model(model), catalog.get("a100-sxm4-40gb"), pr.Layout(dp=1),
                      pr.TrainSetup(seq_len=1024, global_batch=batch, precision="bf16-amp", optimizer_impl=impl))


def test_step_time_orders_fused_foreach_loop_by_the_optimizer_alone():
    fused, foreach, loop = (_plan(i) for i in ("fused", "foreach", "loop"))
    opt = [p.time_breakdown_s["optimizer"] for p in (fused, foreach, loop)]
    assert opt[1] == pytest.approx(opt[0] * 80 / 28)     # bf16-amp: fp32 weights, gradients and moments
    assert opt[0] < opt[1] <= opt[2]
    for p, t in ((foreach, opt[1]), (loop, opt[2])):
        assert p.step_time_s - fused.step_time_s == pytest.approx(t - opt[0])


def test_loop_is_host_bound_on_a_small_model():
    spec = get_model("gpt2")
    loop = _plan("loop")
    tensors = spec.layers * spec.layer_tensors + 4
    host = tensors * (pr.LOOP_OPS_PER_TENSOR * cal.HOST_SECONDS_PER_OP + pr.LOOP_LAUNCHES_PER_TENSOR
                      * cal.KERNEL_LAUNCH_S)
    assert loop.time_breakdown_s["optimizer"] == pytest.approx(host)


def test_unknown_implementation_is_one_sentence():
    with pytest.raises(Exception, match="optimizer_impl must be one of fused, foreach, loop"):
        pr.TrainSetup(seq_len=8, global_batch=1, optimizer_impl="apex")


@pytest.mark.parametrize("notes,impl", [
    ("HF Trainer optim 'adamw_hf' (transformers' own AdamW)", "loop"),
    ("hand-written AdamW, per-parameter python loop", "loop"),
    ("torch.optim.AdamW(foreach=False)", "loop"),
    ("torch.optim.AdamW(lr=3e-4)", "foreach"),
    ("optimizer adamw_torch, bf16 autocast", "foreach"),
    ("AdamW with the default (non-fused) implementation", "foreach"),
    ("torch.optim.AdamW(fused=True)", "fused"),
    ("optim adamw_torch_fused", "fused"),
    ("Megatron-LM, apex FusedAdam", "fused"),
    ("", "fused"),
    ("optimizer plain SGD. attention: Megatron's unfused softmax", "fused"),
    # the named software's default where no implementation is named: HF's Trainer stepped its own AdamW
    # loop until transformers 4.32 (pull request #25109), torch's non-fused AdamW until PyTorch 2.8
    # (#37358); torch.optim looped until PyTorch 2.0
    ("HF Trainer run_clm.py, transformers ~4.2 (Jan 2021), default AdamW", "loop"),
    ("run_mlm.py with transformers==4.26.1", "loop"),
    ("HF Trainer, transformers 4.36, default optimizer", "foreach"),           # adamw_torch
    ("HF Trainer, version unstated", "foreach"),
    ("HF Trainer, transformers 4.56, PyTorch 2.8", "fused"),                   # pull request #37358
    ("HF Trainer with PyTorch 1.13", "loop"),
    ("optimum-habana GaudiTrainer (an HF Trainer subclass), optimizer not named", "fused"),  # use_fused_adam
    ("transformers 4.20 model code in a custom loop", "fused"),              # no Trainer named
    ("torch.optim.AdamW(lr=3e-4), PyTorch 1.13", "loop"),
    ("torch.optim.AdamW(lr=3e-4), PyTorch 2.1", "foreach"),
])
def test_validate_reads_the_implementation_from_the_notes(notes, impl):
    assert _optimizer_impl({"flops_convention": notes}) == impl
    # the software's default is AdamW's: a row that names another optimizer keeps it fused
    if "Trainer" in notes and "adamw_hf" not in notes:
        assert _optimizer_impl({"flops_convention": notes, "optimizer": "adafactor"}) == "fused"


def test_cli_plans_the_named_implementation(capsys):
    import json

    from tensorpilot.cli import main

    flags = ["plan", "--model", "gpt2", "--gpu", "a100-sxm4-40gb", "--seq-len", "1024", "--global-batch", "8",
             "--precision", "bf16-amp", "--json"]
    steps = {}
    for impl in ("fused", "foreach"):
        assert main([*flags, "--optimizer-impl", impl]) == 0
        steps[impl] = json.loads(capsys.readouterr().out)["time_breakdown_s"]["optimizer"]
    assert steps["foreach"] == pytest.approx(steps["fused"] * 80 / 28)


class _LiveBytes(TorchDispatchMode):
    """The most bytes held at once by tensors the ops create (outputs that are none of their inputs),
    each released when Python frees it."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import weakref

        ptrs = {t.data_ptr() for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.numel() > 1 and t.data_ptr() not in ptrs:
                size = t.numel() * t.element_size()
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, size)
        return out

    def _free(self, size: int) -> None:
        self.live -= size


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_the_step_temporary_is_what_torch_adamw_allocates(impl):
    # one real AdamW step after the first (the moments exist): the bytes it allocates on top of the
    # weights, gradients and moments, beside the planner's temporary for the same states
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64))
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, **({"fused": True} if impl == "fused" else {"foreach": True}))
    for step in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        if step:
            with _LiveBytes() as live:
                opt.step()
        else:
            opt.step()
    n = sum(p.numel() for p in params)
    states = {"params": 4 * n, "grads": 4 * n, "master_params": 0, "optimizer": 8 * n}   # fp32 AdamW
    planned = pr.optimizer_step_temporary_bytes(states, "adamw", impl)
    assert planned == (4 * n if impl == "foreach" else 0)
    assert live.peak == pytest.approx(planned, abs=64 * len(params))   # a few step-counter scalars aside


def test_the_step_temporary_sets_the_peak_only_where_activations_are_fewer():
    # Llama-2 7B on 2 A100s under FSDP, full recompute, one sequence of 2048: the foreach step's
    # moment-sized temporary (4 bytes x 3.37e9 parameters a rank) outgrows the backward's
    # activations, logits and buffers, so the peak grows by the difference; under no recompute and
    # 8 sequences the activations stay larger and the peak is the backward's
    from tensorpilot.layout import Layout

    spec, acc = get_model("llama2-7b"), catalog.get("a100-sxm4-80gb")
    for recompute, micro, grows in (("full", 1, True), ("none", 8, False)):
        lo = Layout(tp=1, pp=1, dp=2, micro_batch=micro, sharding="fsdp", recompute=recompute)
        kw = dict(seq_len=2048, global_batch=2 * micro, precision="bf16")
        fused = pr.predict(spec, acc, lo, pr.TrainSetup(**kw, optimizer_impl="fused")).memory_bytes
        foreach = pr.predict(spec, acc, lo, pr.TrainSetup(**kw, optimizer_impl="foreach")).memory_bytes
        held = foreach["activations"] + foreach["logits_and_loss"] + foreach["buffers"]
        moment = foreach["optimizer"] / 2
        assert moment == pytest.approx(4 * spec.n_params / 2)
        assert fused["optimizer_step"] == 0
        assert foreach["optimizer_step"] == pytest.approx(max(0.0, moment - held))
        assert (foreach["optimizer_step"] > 0) is grows
        assert foreach["total"] - fused["total"] == pytest.approx(
            foreach["optimizer_step"] * (1 + cal.ALLOCATOR_OVERHEAD_FRACTION))
