"""The traced planner (observe/trace.py, modelplan/): FLOPs against hand counts, the traced
memory against a hand computation and against a real measured step, op costs, calibration."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from tensorpilot.modelplan import calibration, planner, sources
from tensorpilot.modelplan.costs import DeviceCosts, replay_time_s
from tensorpilot.modelplan.predict import class_times, predict_step, sharded_memory
from tensorpilot.observe.memory import profiled_step, storage_bytes
from tensorpilot.observe.trace import OpRecord, trace_step

IN, HID, OUT, B = 64, 128, 10, 32


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def _trace(model_fn, x_shape, opt=lambda ps: torch.optim.AdamW(ps, fused=True)):
    with torch.device("meta"):
        model = model_fn()
    return trace_step(model, lambda: (torch.randn(x_shape), torch.zeros(x_shape[0], dtype=torch.int64)),
                      F.cross_entropy, opt)


def test_mlp_flops_match_the_hand_count():
    trace = _trace(mlp, (B, IN))
    fwd = 2 * B * (IN * HID + HID * OUT)
    # backward: both layers' weight gradients; the input gradient of the second layer only (the
    # input of the first needs none)
    bwd = 2 * B * IN * HID + 2 * (2 * B * HID * OUT)
    assert trace.flops == fwd + bwd
    by_phase = {p: sum(o.flops for o in trace.ops if o.phase == p) for p in ("forward", "backward", "optimizer")}
    assert by_phase == {"forward": fwd, "backward": bwd, "optimizer": 0}
    # backward ops belong to the module whose forward made their autograd node
    assert trace.by_module()["0"]["flops"] == 2 * B * IN * HID * 2          # forward + weight gradient
    assert trace.by_module()["2"]["flops"] == 2 * B * HID * OUT * 3         # + the input gradient
    assert trace.by_module()["1"]["flops"] == 0                             # ReLU


def test_conv_flops_match_the_hand_count():
    h = w = 16
    trace = _trace(cnn, (4, 3, h, w))
    conv1 = 2 * 4 * 8 * h * w * 3 * 9                 # 2 x batch x C_out x H x W x C_in x k x k
    conv2 = 2 * 4 * 8 * h * w * 8 * 9
    lin = 2 * 4 * 8 * 10
    # conv1: forward + weight grad; conv2: forward + weight grad + input grad; linear likewise
    assert trace.flops == 2 * conv1 + 3 * conv2 + 3 * lin


def test_grouped_conv_flops_match_the_hand_count():
    """A depthwise convolution's weight gradient costs what its forward does (each output channel
    sees one input channel), not C_in times that (torch's registry before the groups correction)."""
    h = w = 16

    def dw():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    trace = _trace(dw, (4, 3, h, w))
    conv1 = 2 * 4 * 8 * h * w * 3 * 9
    depthwise = 2 * 4 * 8 * h * w * 1 * 9            # one input channel per output channel
    lin = 2 * 4 * 8 * 10
    assert trace.flops == 2 * conv1 + 3 * depthwise + 3 * lin


def test_traced_memory_of_an_mlp_is_the_hand_computation():
    trace = _trace(mlp, (B, IN))
    n = IN * HID + HID + HID * OUT + OUT
    assert trace.params == trace.trainable_params == n
    assert trace.memory["parameters"] == 4 * n
    # fused AdamW: exp_avg and exp_avg_sq (4 bytes each per parameter) and one fp32 step per tensor
    assert trace.memory["optimizer"] == 8 * n + 4 * 4
    # the steady-state peak is in the second step's backward, when the first layer's weight
    # gradient is computed: weights and optimizer state, the batch (x: B x IN fp32, targets: B
    # int64), the loss (8 B: fp32 value and its gradient), the second layer's finished gradients,
    # the gradient flowing into the first layer (B x HID) and the first layer's new weight and bias
    # gradients. The logits are gone: the step does not hold the output, and the log-softmax
    # cross-entropy saved was freed when its backward ran
    hand = (4 * n + (8 * n + 16) + 4 * B * IN + 8 * B + 8 + 4 * (HID * OUT + OUT)
            + 4 * B * HID + 4 * (HID * IN) + 4 * HID)
    assert trace.memory["total"] == hand
    assert trace.memory["gradients"] == 4 * (HID * OUT + OUT)


def test_a_forward_backward_step_without_optimizer_holds_no_state_by_hand():
    """optimizer "none" (a benchmark timing loss.backward() alone): the hand computation above
    without AdamW's two moments and step counts; gradients dropped before the next step."""
    trace = _trace(mlp, (B, IN), opt=planner.optimizer_factory("none"))
    n = IN * HID + HID + HID * OUT + OUT
    assert trace.memory.get("optimizer", 0) == 0
    hand = (4 * n + 4 * B * IN + 8 * B + 8 + 4 * (HID * OUT + OUT)
            + 4 * B * HID + 4 * (HID * IN) + 4 * HID)
    assert trace.memory["total"] == hand
    assert not [o for o in trace.ops if o.phase == "optimizer"]


@pytest.mark.parametrize("model_fn,shape", [(mlp, (B, IN)), (cnn, (16, 3, 32, 32))])
def test_traced_memory_matches_a_real_measured_step(model_fn, shape):
    trace = _trace(model_fn, shape)
    torch.manual_seed(0)
    model = model_fn()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    x, y = torch.randn(shape), torch.zeros(shape[0], dtype=torch.int64)

    def step():
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    step()                                           # creates the optimizer's state
    state = [t for s in opt.state.values() for t in s.values()]
    peak, _, method = profiled_step(step, storage_bytes(list(model.parameters()) + state + [x, y]))
    assert "allocator events" in method
    # CPU convolutions add oneDNN's blocked-layout buffers to MemTracker's peak (trace.cpu_peak)
    assert trace.cpu_peak == pytest.approx(peak, rel=0.05)


def test_cpu_flash_attention_has_flops():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(32, 96)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 16, 3, 2, 16).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, 32)
    with torch.device("meta"):
        model = Attn()
    trace = trace_step(model, lambda: (torch.randn(2, 16, 32), None), lambda o, y: o.sum(),
                       lambda ps: torch.optim.SGD(ps, lr=0.1))
    attn = [o for o in trace.ops if o.op_class == "attention"]
    assert attn, [o.op for o in trace.ops]
    # forward: QK^T and AV, 2 x (B x H x L x S x E) multiply-adds each = 4 B H L S E FLOPs
    fwd = [o for o in attn if o.phase == "forward"]
    assert sum(o.flops for o in fwd) == 4 * 2 * 2 * 16 * 16 * 16


def test_replayed_op_time_is_positive_and_cached_costs_interpolate():
    trace = _trace(mlp, (B, IN))
    mm = next(o for o in trace.ops if o.op_class == "matmul")
    assert replay_time_s(mm.replay, "cpu") > 0
    costs = DeviceCosts("x", True, {"fp32": 1e11}, [(1e3, 1e9), (1e6, 1e10)], 1e-6, 1e-7)
    assert costs.bytes_per_s(1e3) == 1e9 and costs.bytes_per_s(1e9) == 1e10
    assert 1e9 < costs.bytes_per_s(3e4) < 1e10


def test_reuse_distance_is_the_traffic_since_the_last_touch():
    """The first forward op reads the weights the previous step's optimizer updated; in between
    only the new batch was written (x by randn, then the targets by zeros)."""
    trace = _trace(mlp, (B, IN))
    first = next(o for o in trace.ops if o.phase == "forward" and o.op != "aten.t")
    assert first.op == "aten.addmm"                  # bias, x, W^T (a view of W's storage)
    (bias_b, bias_d), (x_b, x_d), (w_b, w_d) = first.reads
    assert (bias_b, x_b, w_b) == (4 * HID, 4 * B * IN, 4 * IN * HID)
    assert bias_d == w_d == 4 * B * IN + 8 * B
    assert x_d == 8 * B


def test_an_op_costs_between_warm_and_cold_by_its_share_of_distant_bytes():
    op = OpRecord("aten.mm", "", "forward", "matmul", 10, 200, 10, "float32", "sig", None,
                  reads=((50, 10), (150, 1000)))
    costs = DeviceCosts("x", True, {"fp32": 1e9}, [(1.0, 1e9)], 0.0, 0.0, measured_s={"sig": 1.0},
                        measured_cold_s={"sig": 3.0}, cache_bytes=100)
    assert costs.op_time_s(op) == pytest.approx(1.0 + 150 / 200 * (3.0 - 1.0))
    costs.cache_bytes = 1e9                          # everything still cached: the warm timing
    assert costs.op_time_s(op) == pytest.approx(1.0)


def test_step_time_is_the_sum_of_op_costs_and_calibration_scales_classes():
    trace = _trace(mlp, (B, IN))
    costs = DeviceCosts("x", True, {"fp32": 1e10}, [(1.0, 1e9)], 2e-6, 1e-7, host_per_op_s=1e-6)
    raw = class_times(trace, costs)
    plan = predict_step(trace, costs, model="m", batch_size=B, precision="fp32", optimizer="adamw")
    assert plan.step_time_s == pytest.approx(raw["compute"] + raw["memory"] + raw["host"])
    scaled = predict_step(trace, costs, model="m", batch_size=B, precision="fp32", optimizer="adamw",
                          factors={"compute": 2.0, "memory": 1.0, "host": 0.5})
    assert scaled.step_time_s == pytest.approx(2 * raw["compute"] + raw["memory"] + 0.5 * raw["host"])
    # two micro-batches: forward and backward twice, the optimizer once
    twice = class_times(trace, costs, grad_accum=2)
    opt_s = sum(costs.op_time_s(o) for o in trace.ops if o.phase == "optimizer")
    assert twice["compute"] + twice["memory"] == pytest.approx(2 * (raw["compute"] + raw["memory"]) - opt_s)


def test_the_stack_share_divides_op_and_host_times_by_hand():
    trace = _trace(mlp, (B, IN))
    costs = DeviceCosts("x", True, {"fp32": 1e10}, [(1.0, 1e9)], 2e-6, 1e-7, host_per_op_s=1e-6)
    raw = class_times(trace, costs)
    plan = predict_step(trace, costs, model="m", batch_size=B, precision="fp32", optimizer="adamw",
                        factors={"compute": 2.0, "memory": 1.0, "host": 1.0}, stack_efficiency=0.5,
                        host_efficiency=0.25)
    # the stack's share multiplies the calibration: compute 2 / 0.5, memory 1 / 0.5, host 1 / 0.25
    assert plan.time_breakdown_s["compute"] == pytest.approx(4 * raw["compute"])
    assert plan.time_breakdown_s["memory"] == pytest.approx(2 * raw["memory"])
    assert plan.time_breakdown_s["host"] == pytest.approx(4 * raw["host"])
    assert plan.calibration == {"compute": 2.0, "memory": 1.0, "host": 1.0}     # the calibration as stored
    assert sum(m["time_s"] for m in plan.modules) == pytest.approx(4 * raw["compute"] + 2 * raw["memory"])


@pytest.mark.parametrize("host_per_op_s,part,truth", [
    (1e-9, "stack_efficiency", 0.3),      # the host keeps ahead of the kernels: their share is measured
    (1e-3, "host_efficiency", 0.5),       # the device waits for the host: the host's share is
])
def test_one_measured_step_gives_back_the_share_that_made_it(host_per_op_s, part, truth):
    trace = _trace(mlp, (B, IN))
    costs = DeviceCosts("gpu", False, {"fp32": 1e10}, [(1.0, 1e9)], 2e-6, 1e-7, host_per_op_s=host_per_op_s,
                        async_host=True)

    def make(**stack):
        return predict_step(trace, costs, model="m", batch_size=B, precision="fp32", optimizer="adamw", **stack)
    measured = make(**{part: truth}).step_time_s
    plan, found = planner.anchor(make, measured)
    assert found.part == part and found.reached and found.efficiency == pytest.approx(truth, rel=2e-3)
    assert plan.step_time_s == pytest.approx(measured, rel=2e-3)
    assert plan.anchor["part"] == part and plan.anchor["unanchored_step_s"] == pytest.approx(make().step_time_s)
    # a step faster than four times the planner's rates: the share is clamped at its bound and says so
    _, clamped = planner.anchor(make, make().step_time_s / 100)
    assert not clamped.reached and clamped.efficiency == pytest.approx(4.0)


def test_sharding_divides_model_states_like_zero():
    mem = {"parameters": 8.0, "gradients": 8.0, "optimizer": 16.0, "activations": 4.0, "total": 36.0}
    assert sharded_memory(mem, 4, "zero1")["total"] == 8 + 8 + 4 + 4
    assert sharded_memory(mem, 4, "zero2")["total"] == 8 + 2 + 4 + 4
    assert sharded_memory(mem, 4, "fsdp")["total"] == 2 + 2 + 4 + 4
    assert sharded_memory(mem, 4, "none") == mem


@settings(max_examples=60, deadline=None)
@given(old=st.floats(0.01, 100), ratio=st.floats(0.001, 1000), cls=st.sampled_from(calibration.CLASSES))
def test_refit_moves_toward_the_measured_ratio_and_stays_in_bounds(old, ratio, cls):
    lo, hi = calibration.BOUNDS[cls]
    start = calibration.clamp(cls, old)
    new = calibration.refit({cls: start}, {cls: ratio})[cls]
    assert lo <= new <= hi
    target = calibration.clamp(cls, ratio)
    assert abs(math.log(new) - math.log(target)) <= abs(math.log(start) - math.log(target)) + 1e-12


def test_a_deliberately_wrong_factor_converges_to_the_measured_ratio(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPILOT_CACHE", str(tmp_path))
    calibration.observe("cpu", "m", {"compute": 1.0, "memory": 1.0, "host": 1.0},
                        {"compute": 10.0, "memory": 1.0, "host": 1.0})       # predicted 10x too slow
    first = calibration.factors("cpu")["compute"]
    assert first == calibration.BOUNDS["compute"][0] or first < 1.0
    for _ in range(20):
        calibration.observe("cpu", "m", {"compute": 1.5, "memory": 1.0, "host": 1.0},
                            {"compute": 1.0, "memory": 1.0, "host": 1.0})
    assert calibration.factors("cpu")["compute"] == pytest.approx(1.5, rel=1e-3)
    assert calibration.reset("cpu") and calibration.factors("cpu") == {}


def test_calibration_file_that_is_garbage_is_no_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPILOT_CACHE", str(tmp_path))
    calibration.path("cpu").parent.mkdir(parents=True, exist_ok=True)
    calibration.path("cpu").write_text('{"factors": {"compute": -3, "memory": "x", "host": 1e9}}')
    assert calibration.factors("cpu") == {"host": calibration.BOUNDS["host"][1]}
    calibration.path("cpu").write_text("not json")
    assert calibration.factors("cpu") == {}


def test_builtin_sources_trace_and_bad_shapes_say_so():
    src = sources.load("cnn")
    trace = planner.trace_source(src, batch_size=2, precision="bf16")
    assert trace.output_shape == (2, 10)
    assert any(o.dtype == "bfloat16" for o in trace.ops if o.op_class == "conv")
    with pytest.raises(Exception, match="check that --input-shape"):
        planner.trace_source(src, batch_size=2, input_shape=(7,))


def test_autotune_predicts_any_model_and_the_finder_starts_where_the_plan_says_it_fits(monkeypatch):
    from types import SimpleNamespace

    from tensorpilot.training import autotune, fits, predicted
    from tensorpilot.workloads.base import cross_entropy

    data = torch.utils.data.TensorDataset(torch.randn(64, IN), torch.randint(0, OUT, (64,)))
    trainer = SimpleNamespace(
        model=mlp(), workload=SimpleNamespace(train_data=data, loss=cross_entropy),
        cfg=SimpleNamespace(train=SimpleNamespace(seed=0), model=SimpleNamespace(name="mlp-test"),
                            optim=SimpleNamespace(grad_clip=1.0)),
        optim_cfg=SimpleNamespace(name="adamw"), device=torch.device("cpu"), choice=SimpleNamespace(autocast=None))

    def memory_at(n):
        batch = fits.meta_batch(data, n, 0)
        return predicted.predict_run(trainer.model, batch, cross_entropy, name="m", optimizer="adamw",
                                     device=trainer.device, autocast=None, micro_batch=n, grad_accum=1,
                                     n_devices=1, sharding="none", tokens_per_sample=None).plan.memory_bytes["total"]
    # memory is linear in the micro-batch: with exactly the memory of 8 samples free, 8 fit
    monkeypatch.setattr(fits, "free_bytes", lambda device: (memory_at(8), "test"))
    assert autotune.predicted_micro_limit(trainer, 64) == 8
    predict = autotune.traced_predictor(trainer)
    small, big = (predict(autotune.Candidate("fp32", m, 64 // m)) for m in (8, 16))
    assert small.fits and not big.fits and small.step_s > 0
    assert big.memory_bytes > small.memory_bytes


def test_an_op_mapping_fresh_pages_is_timed_five_times_and_its_fastest_run_kept():
    """An output above glibc's 32 MiB mmap ceiling page-faults afresh each run, several-fold
    slower in some runs on a virtual machine; the replay keeps the fastest of five. Smaller
    outputs keep the median of three. The op here sleeps a scripted time (no speed asserted)."""
    import time

    def scripted(sizes_mib, sleeps):
        calls = iter([0.0, *sleeps])                 # the first call is the untimed warm-up

        def op(_x):
            time.sleep(next(calls))
            return torch.empty(sizes_mib << 18)      # float32: MiB * 2**18 elements
        return op
    slow = [0.05, 0.05, 0.001, 0.05, 0.05]
    big = replay_time_s((scripted(40, slow), (torch.zeros(1),), {}), "cpu", flush=1 << 16)
    small = replay_time_s((scripted(1, slow[:3]), (torch.zeros(1),), {}), "cpu", flush=1 << 16)
    assert big < 0.01 <= 0.05 <= small               # fastest of five vs median of three


def test_op_timings_taken_while_other_processes_load_the_cpus_are_used_but_not_cached(tmp_path, monkeypatch):
    """A cached op cost is never measured again, so replays slowed by other processes (two busy
    loops here: the CPUs are fully loaded) must not be cached: the plan says so instead."""
    import os
    import shutil
    import subprocess
    import sys
    import time

    from tensorpilot.hardware.device import detect
    from tensorpilot.modelplan import costs

    cache = tmp_path / "cache"
    shutil.copytree(os.environ["TENSORPILOT_CACHE"], cache)       # the session's probe and bandwidth
    monkeypatch.setenv("TENSORPILOT_CACHE", str(cache))
    model = nn.Sequential(nn.Linear(123, 77), nn.ReLU(), nn.Linear(77, 5))      # shapes no other test times
    trace = trace_step(model, lambda: (torch.randn(33, 123), torch.randint(0, 5, (33,))), F.cross_entropy,
                       lambda ps: torch.optim.AdamW(ps))
    replayed = {o.signature for o in trace.ops if o.op_class == "matmul"}
    costs.local_costs(detect("cpu"), [])                           # the machine's fixed costs, measured quietly
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        time.sleep(0.5)                                             # the loops are running
        dc = costs.local_costs(detect("cpu"), trace.ops)
    finally:
        for p in busy:
            p.kill()
    assert replayed and replayed <= set(dc.measured_s)              # this plan uses them
    assert "not cached" in dc.name, dc.name
    assert not replayed & set(costs._load("cpu")["ops"])            # the cache does not keep them


def test_a_catalog_plan_beyond_one_node_reduces_gradients_over_the_network():
    from tensorpilot.hardware import catalog
    from tensorpilot.modelplan.predict import comm_time_s
    from tensorpilot.plan.predict import device_rates
    from tensorpilot.plan.timing import group_link

    acc = catalog.get("a100-sxm4-80gb")          # one 200 Gb/s NIC a GPU: the network is the slower link
    rates = device_rates(acc, "bf16")
    comm = {}
    for n in (8, 16):
        src = sources.load("gpt")
        trace = planner.trace_source(src, batch_size=4, precision="bf16", optimizer="adamw")
        plan = planner.plan_catalog(trace, src, acc, batch_size=4, precision="bf16", optimizer="adamw", n_devices=n)
        grads = max(float(trace.memory["gradients"]), trace.trainable_params * 4.0)
        bw, alpha = group_link(rates, n, 1)
        total, _ = comm_time_s(grads, float(trace.memory["parameters"]), n, "none", bw, alpha, 0.0)
        comm[n] = total
        assert f"data-parallel communication {total * 1e3:,.1f} ms" in " ".join(plan.notes)
    # eight devices share NVLink; sixteen span two nodes and reduce over the slower network
    assert group_link(rates, 8, 1)[0] == rates.link_bytes_per_s > group_link(rates, 16, 1)[0]
    assert comm[16] > comm[8]


def test_the_traced_batch_is_made_on_the_device_of_the_traced_model():
    """The loader's batch is on the host; the traced model's fake parameters are on the run's
    device. Made on the host, a token batch met cuda embedding weights and every traced
    prediction on an H100 failed ("found two different devices cuda:0, cpu"). Fake tensors
    need no GPU: this runs on a CPU-only build."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tensorpilot.training.predicted import _fake_like

    tokens, targets = torch.randint(0, 16, (4, 8)), torch.randn(4)
    with FakeTensorMode(allow_non_fake_inputs=True):
        weight = torch.empty(16, 3, device="cuda")
        (x,), y = _fake_like(((tokens,), targets), "cuda")()
        assert (x.device.type, x.dtype, tuple(x.shape)) == ("cuda", torch.int64, (4, 8))
        assert (y.device.type, y.dtype) == ("cuda", torch.float32)
        assert F.embedding(x, weight).shape == (4, 8, 3)
        (host,), _ = _fake_like(((tokens,), targets))()          # the default: where the loader left it
        with pytest.raises(RuntimeError, match="devices"):
            F.embedding(host, weight)


def test_an_accelerator_op_is_timed_by_events_behind_the_flush_without_its_launch():
    """costs.device_time_s on a virtual clock: the flush takes 5 ms, each run 2 ms at first and
    then 3 ms; the host's waits are not on the clock. The events bracket the op alone, so the
    median of three runs (2, 3, 3 ms) is 3 ms, and the flush is queued before each start."""
    from tensorpilot.modelplan.costs import device_time_s

    clock, log, durations = [0.0], [], iter([2.0, 3.0, 3.0])

    class Flush:
        def fill_(self, value):
            log.append("flush")
            clock[0] += 5.0

    class Event:
        def __init__(self, device, enable_timing):
            assert enable_timing
            self.t = None

        def record(self):
            log.append("event")
            self.t = clock[0]

        def elapsed_time(self, end):
            return end.t - self.t                       # ms, as torch.Event's

    def run():
        log.append("op")
        clock[0] += next(durations)

    assert device_time_s(run, "cpu", Flush(), 3, event=Event) == pytest.approx(0.003)
    assert log == ["flush", "event", "op", "event"] * 3


def _nchw_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1, groups=32),
                         nn.ReLU(), nn.Conv2d(32, 32, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def test_nchw_half_convolutions_pay_cudnn_layout_transforms_by_hand():
    from tensorpilot.modelplan import costs

    def traced(memory_format):
        with torch.device("meta"):
            model = _nchw_net().to(memory_format=memory_format)
        return trace_step(model, lambda: (torch.randn(4, 16, 8, 8), torch.zeros(4, dtype=torch.int64)),
                          F.cross_entropy, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                          autocast_dtype=torch.float16, gpu_autocast=True)
    convs = [o for o in traced(torch.contiguous_format).ops if "convolution" in o.op]
    moved = {(o.op, o.module): costs.nchw_transpose_bytes(o) for o in convs}
    x, y = 4 * 16 * 8 * 8 * 2, 4 * 32 * 8 * 8 * 2      # the first convolution's fp16 input and output
    # forward: x to NHWC, y back, each read and written; backward: the weight gradient only (the
    # network's input needs none): grad_output and x to NHWC
    assert moved[("aten.convolution", "0")] == (2 * (x + y), 2)
    assert moved[("aten.convolution_backward", "0")] == (2 * (y + x), 2)
    assert moved[("aten.convolution", "2")] == moved[("aten.convolution_backward", "2")] == (0, 0)   # depthwise
    # a 1x1 convolution on NCHW tensors is transformed like any other, although its contiguous weight's
    # strides also read as channels_last: y in and out forward; grad_output and input, for each of its
    # two backward kernels
    assert moved[("aten.convolution", "4")] == (4 * y, 2)
    assert moved[("aten.convolution_backward", "4")] == (2 * 2 * 2 * y, 4)
    # channels_last weights: the kernels' own layout; only the NCHW batch is converted, for the forward
    # and again for the weight gradient
    last = {(o.op, o.module): costs.nchw_transpose_bytes(o) for o in traced(torch.channels_last).ops
            if "convolution" in o.op}
    assert last == {("aten.convolution", "0"): (2 * x, 1), ("aten.convolution_backward", "0"): (2 * x, 1),
                    ("aten.convolution", "2"): (0, 0), ("aten.convolution_backward", "2"): (0, 0),
                    ("aten.convolution", "4"): (0, 0), ("aten.convolution_backward", "4"): (0, 0)}
    # the time: the bytes over the bandwidth plus one kernel floor per transform, on an NVIDIA part only
    dc = DeviceCosts("x", False, {"fp16": 1e14}, [(1.0, 1e12)], op_overhead_s=3e-6, view_overhead_s=0.0)
    on = DeviceCosts("x", False, {"fp16": 1e14}, [(1.0, 1e12)], op_overhead_s=3e-6, view_overhead_s=0.0,
                     nchw_transposes=True)
    fwd = next(o for o in convs if o.op == "aten.convolution" and o.module == "0")
    assert on.op_time_s(fwd) - dc.op_time_s(fwd) == pytest.approx(2 * (x + y) / 1e12 + 2 * 3e-6)
    from tensorpilot.hardware import catalog

    assert costs.catalog_costs(catalog.get("h100-sxm")).nchw_transposes
    assert not costs.catalog_costs(catalog.get("mi300x")).nchw_transposes


def test_plan_memory_format_channels_last_drops_the_transforms_and_leaves_the_model_as_it_was():
    from tensorpilot.hardware import catalog
    from tensorpilot.modelplan import costs

    src = sources.ModelSource("net", _nchw_net(), (16, 112, 112), torch.float32, 10)
    acc = catalog.get("h100-sxm")
    steps = {}
    for fmt in ("contiguous", "channels_last"):
        trace = planner.trace_source(src, batch_size=256, precision="fp16", optimizer="sgd", gpu_autocast=True,
                                     memory_format=fmt)
        steps[fmt] = planner.plan_catalog(trace, src, acc, batch_size=256, precision="fp16", optimizer="sgd")
    # a device-bound step (256 x 16 x 112 x 112): NCHW transforms the first convolution's x and y forward
    # and again for its weight gradient, 4 (x + y) bytes, and the 1x1 one's y in and out, forward and for
    # both backward kernels, 12 y; channels_last converts only the batch, 4 x: the saving is 16 y over
    # the bandwidth (the other ops' few extra kernels in NHWC aside)
    assert steps["contiguous"].time_breakdown_s["host"] == steps["channels_last"].time_breakdown_s["host"] == 0
    y = 256 * 32 * 112 * 112 * 2
    saved = steps["contiguous"].step_time_s - steps["channels_last"].step_time_s
    assert saved == pytest.approx(16 * y / costs.catalog_costs(acc).bytes_per_s(16 * y), rel=0.1)
    assert src.model[0].weight.is_contiguous()                 # the trace's layout was undone
    # ... and a model the caller keeps in NHWC stays NHWC
    nhwc = sources.ModelSource("net", _nchw_net().to(memory_format=torch.channels_last), (16, 112, 112),
                               torch.float32, 10)
    planner.trace_source(nhwc, batch_size=8, precision="fp16", optimizer="sgd", gpu_autocast=True,
                         memory_format="channels_last")
    assert nhwc.model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not nhwc.model[0].weight.is_contiguous()


def test_plan_cli_memory_format(capsys):
    import json

    from tensorpilot.cli import main

    compute = {}
    for fmt in ("contiguous", "channels_last"):
        assert main(["plan", "--model", "cnn", "--gpu", "h100-sxm", "--precision", "bf16", "--batch-size", "512",
                     "--memory-format", fmt, "--json"]) == 0
        compute[fmt] = json.loads(capsys.readouterr().out)["time_breakdown_s"]["compute"]
    # the built-in cnn's bf16 convolutions in NCHW carry cuDNN's transforms; in channels_last they do not
    assert compute["channels_last"] < compute["contiguous"]
