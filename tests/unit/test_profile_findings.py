"""`tensorpilot profile`'s analysis on hand-made profiler events and fake devices: the breakdown's
arithmetic (every expected number is worked out in a comment), the op classes, and each finding's
trigger and flag. Nothing is run or measured here; tests/integration/test_profile.py profiles
real, deliberately bottlenecked runs."""

from __future__ import annotations

import argparse
import shlex

import pytest

from tensorpilot.profiling import breakdown as bd
from tensorpilot.profiling import findings as fd
from tensorpilot.profiling.events import ev

US = 1e-6


def approx(x):
    return pytest.approx(x, abs=1e-9)


# ------------------------------------------------------------------------------- op classes

@pytest.mark.parametrize("name,cls", [
    ("aten::addmm", "matmul_conv"), ("aten::mm", "matmul_conv"), ("aten::linear", "matmul_conv"),
    ("aten::convolution_backward", "matmul_conv"), ("aten::mkldnn_convolution", "matmul_conv"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_scaled_dot_product_attention_math", "attention"), ("aten::_efficient_attention_backward", "attention"),
    ("aten::native_layer_norm_backward", "normalization"), ("aten::native_batch_norm", "normalization"),
    ("aten::_log_softmax", "softmax_loss"), ("aten::nll_loss_backward", "softmax_loss"),
    ("aten::cross_entropy_loss", "softmax_loss"),
    ("aten::_fused_adamw_", "optimizer"), ("aten::_foreach_norm", "optimizer"), ("aten::_foreach_mul_", "optimizer"),
    ("aten::copy_", "casts_copies"), ("aten::_to_copy", "casts_copies"), ("aten::embedding_dense_backward", "casts_copies"),
    ("aten::gelu", "elementwise"), ("aten::add_", "elementwise"), ("aten::threshold_backward", "elementwise"),
    ("aten::view", "framework"), ("aten::t", "framework"), ("aten::empty_strided", "framework"),
    ("aten::as_strided", "framework"), ("aten::zeros", "framework"),
])
def test_op_classes(name, cls):
    assert bd.classify(name) == cls


def test_kernel_classes_by_name():
    assert bd.kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul_conv"
    # cuBLAS's Hopper GEMMs carry no "gemm" in their names (seen missing on an H100: the matmuls
    # of a bf16 step landed in elementwise)
    assert bd.kernel_class("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT") == "matmul_conv"
    assert bd.kernel_class("void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>") == "matmul_conv"
    assert bd.kernel_class("void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4, false>") == "matmul_conv"
    assert bd.kernel_class("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "communication"
    assert bd.kernel_class("pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert bd.kernel_class("void at::native::vectorized_layer_norm_kernel<float>") == "normalization"
    assert bd.kernel_class("void at::native::elementwise_kernel<128, 2, ...>") == "elementwise"


# --------------------------------------------------------------------------- the CPU breakdown

def one_step(opt_children=None):
    """A 1000 us step: data 0-200, a Linear in module "fc", a ReLU, the loss, the backward of
    the Linear's addmm (sequence number 5), the optimizer."""
    return ev("tensorpilot.step#0", 0, 1000,
              ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 200,
                 ev("aten::stack", 10, 50)),                      # inside the loader: data, not copies
              ev("tensorpilot.module:fc", 210, 200,
                 ev("aten::linear", 210, 190,
                    ev("aten::t", 212, 3),                         # a view: framework (host)
                    ev("aten::addmm", 220, 170, ev("aten::copy_", 230, 20), seq=5))),
              ev("aten::relu", 420, 20),
              ev("aten::cross_entropy_loss", 450, 50, ev("aten::log_softmax", 455, 25),
                 ev("aten::nll_loss_nd", 482, 13)),
              ev("autograd::engine::evaluate_function: AddmmBackward0", 520, 180, seq=5, *[
                 ev("AddmmBackward0", 521, 178, ev("aten::mm", 530, 70), ev("aten::sum", 610, 20))]),
              ev("Optimizer.step#AdamW.step", 720, 180, *(opt_children or [
                 ev("aten::_fused_adamw_", 730, 70), ev("aten::view", 810, 2)])))


def test_cpu_step_shares_by_hand():
    s = bd.cpu_step(one_step())
    # data: the loader's whole 200 us; matmul: linear self 190-3-170 = 17, addmm self 170-20 = 150,
    # its bias copy 20 (a helper of the matmul), backward mm 70 -> 257; elementwise: relu 20 +
    # bias-gradient sum 20 = 40; softmax_loss: cross_entropy self 50-25-13 = 12, +25 +13 = 50;
    # optimizer: the fused kernel 70 (the view and the optimizer's Python are host)
    assert s.wall_s == approx(1000 * US)
    assert s.seconds["data_loading"] == approx(200 * US)
    assert s.seconds["matmul_conv"] == approx(257 * US)
    assert s.seconds["elementwise"] == approx(40 * US)
    assert s.seconds["softmax_loss"] == approx(50 * US)
    assert s.seconds["optimizer"] == approx(70 * US)
    assert s.seconds["casts_copies"] == 0
    # host: 1000 - 200 - 257 - 40 - 50 - 70 = 383
    assert s.seconds["host_overhead"] == approx(383 * US)
    assert sum(s.seconds.values()) == approx(s.wall_s)
    assert s.optimizer_step_s == approx(180 * US)
    # modules: fc forward 187 + its backward (through sequence number 5) 70 + 20 = 277
    assert s.modules["fc"] == approx(277 * US)
    assert s.modules["(data)"] == approx(200 * US) and s.modules["(optimizer)"] == approx(70 * US)
    assert bd.top_modules(s, 1) == [("fc", pytest.approx(277 * US))]


def test_dispatch_floor_moves_small_op_time_to_host():
    s = bd.cpu_step(one_step(), floor_ns=5_000)
    # 10 non-view ops outside the loader each lose 5 us to host: linear 12, addmm 145, copy 15,
    # mm 65 -> matmul 237; relu 15 + sum 15 = 30; cross_entropy 7 + 20 + 8 = 35; fused 65
    assert s.seconds["matmul_conv"] == approx(237 * US)
    assert s.seconds["elementwise"] == approx(30 * US)
    assert s.seconds["softmax_loss"] == approx(35 * US)
    assert s.seconds["optimizer"] == approx(65 * US)
    assert s.seconds["host_overhead"] == approx((383 + 50) * US)


def test_exposed_and_overlapped_communication():
    step = ev("tensorpilot.step#0", 0, 100, ev("aten::mm", 0, 40))
    allreduce = ev("gloo:all_reduce", 30, 60, tid=2)                 # 30-90 on gloo's thread
    s = bd.cpu_step(step, [allreduce])
    # the training thread ran no op in 40-100; the all-reduce ran there 40-90: 50 us exposed,
    # 30-40 overlapped the matmul: 10 us; host = 100 - 40 - 50 = 10
    assert s.seconds["communication"] == approx(50 * US)
    assert s.comm_total_s == approx(60 * US) and s.comm_overlapped_s == approx(10 * US)
    assert s.seconds["host_overhead"] == approx(10 * US)


def test_idle_is_sleep_outside_data_and_peers():
    step = ev("tensorpilot.step#0", 0, 100, ev("enumerate(DataLoader)#x", 0, 30), ev("aten::mm", 30, 20))
    # slept 70 us, 30 of them in the loader: 40 idle, taken from the 50 us nothing else explains
    s = bd.cpu_step(step, blocked_ns=70_000)
    assert s.seconds["idle"] == approx(40 * US)
    assert s.seconds["host_overhead"] == approx(10 * US)


def test_attention_math_path_and_its_backward():
    step = ev("tensorpilot.step#0", 0, 400,
              ev("aten::scaled_dot_product_attention", 0, 100,
                 ev("aten::_scaled_dot_product_attention_math", 5, 90,
                    ev("aten::bmm", 10, 30, seq=7), ev("aten::_softmax", 45, 20, seq=8), ev("aten::bmm", 70, 20, seq=9))),
              ev("autograd::engine::evaluate_function: BmmBackward0", 150, 60, ev("aten::bmm", 155, 50), seq=9),
              ev("autograd::engine::evaluate_function: MmBackward0", 250, 60, ev("aten::mm", 255, 50)))
    s = bd.cpu_step(step)
    # forward: sdpa self 100-90 = 10, math self 90-70 = 20, bmm 30 + softmax 20 + bmm 20 -> 100;
    # the backward of the math path's bmm (seq 9) is attention too: 50; the other mm is a matmul
    assert s.seconds["attention"] == approx(150 * US)
    assert s.seconds["matmul_conv"] == approx(50 * US)
    assert list(s.attention_paths) == ["aten::_scaled_dot_product_attention_math"]


def test_blocked_attention_marker_and_recompute():
    step = ev("tensorpilot.step#0", 0, 500,
              ev("tensorpilot.module:blocks.0", 0, 100,
                 ev("tensorpilot.attention", 10, 80, ev("aten::matmul", 20, 30, seq=3), ev("aten::softmax", 55, 20))),
              ev("autograd::engine::evaluate_function: CheckpointFunctionBackward", 200, 250,
                 ev("tensorpilot.module:blocks.0", 210, 100,          # the block's forward again
                    ev("tensorpilot.attention", 215, 80, ev("aten::matmul", 220, 30), ev("aten::softmax", 255, 20))),
                 ev("aten::mm", 320, 100)))
    s = bd.cpu_step(step)
    # attention: 30 + 20 forward, 30 + 20 recomputed; the recomputed block is 100 us of backward
    assert s.seconds["attention"] == approx(100 * US)
    assert s.recompute_s == approx(100 * US)
    assert "blocked matmuls (engine.attention)" in s.attention_paths


def test_gpu_step_from_kernels():
    step = ev("tensorpilot.step#0", 0, 1000, ev("enumerate(DataLoader)#x", 0, 100))
    kernels = [ev("ampere_sgemm_128x64_tn", 100, 300, tid=-1), ev("vectorized_elementwise_kernel", 400, 100, tid=-1),
               ev("ncclDevKernel_AllReduce_Sum_f32", 450, 250, tid=-1)]
    s = bd.gpu_step(step, kernels)
    # busy 100-500 (gemm 300 + elementwise 100); NCCL 450-700 overlaps compute 450-500: 200
    # exposed, 50 overlapped; data 100 (the device idled meanwhile); host = 1000 - 400 - 200 - 100
    assert s.seconds["matmul_conv"] == approx(300 * US) and s.seconds["elementwise"] == approx(100 * US)
    assert s.seconds["communication"] == approx(200 * US) and s.comm_overlapped_s == approx(50 * US)
    assert s.seconds["data_loading"] == approx(100 * US)
    assert s.seconds["host_overhead"] == approx(300 * US)


def test_profiler_cost_on_a_gpu_comes_off_the_host_not_the_kernels():
    """Kernel times come from the device timeline, which the profiler's host-side recording does not
    stretch; on an H200 taking its cost off by host-event counts left a step's GEMMs at 0 ms."""
    step = ev("tensorpilot.step#0", 0, 1000, ev("aten::mm", 0, 300), ev("aten::mm", 350, 300),
              ev("aten::add", 700, 100))
    kernels = [ev("nvjet_tst_128x256_64x4_2x1_v_bz_TNN", 100, 200, tid=-1),
               ev("nvjet_tst_128x256_64x4_2x1_v_bz_TNN", 450, 200, tid=-1),
               ev("vectorized_elementwise_kernel", 800, 50, tid=-1)]
    s = bd.gpu_step(step, kernels)
    # busy 450 us (GEMMs 400, elementwise 50); host 550
    assert s.seconds["matmul_conv"] == approx(400 * US) and s.seconds["host_overhead"] == approx(550 * US)
    c = bd.without_profiler(s, unprofiled_wall_s=700 * US)
    # the 300 us the profiler added are host time: the kernels keep theirs, host 550 -> 250
    assert c.seconds["matmul_conv"] == approx(400 * US) and c.seconds["elementwise"] == approx(50 * US)
    assert c.seconds["host_overhead"] == approx(250 * US) and c.wall_s == approx(700 * US)


class _KinetoEvent:
    """What events.device_kernels reads of torch's _KinetoEvent (no GPU in CI to record one)."""

    def __init__(self, name, activity, start_us, dur_us, on_device=True):
        from torch.autograd import DeviceType

        self._name, self._activity, self._start, self._dur = name, activity, int(start_us * 1000), int(dur_us * 1000)
        self._device = DeviceType.CUDA if on_device else DeviceType.CPU

    def name(self):
        return self._name

    def activity_type(self):
        return self._activity

    def is_user_annotation(self):
        return self._activity in ("user_annotation", "gpu_user_annotation")

    def device_type(self):
        return self._device

    def start_ns(self):
        return self._start

    def duration_ns(self):
        return self._dur


def test_device_timeline_annotations_are_not_kernels():
    """Kineto mirrors each record_function range (the step marker, module markers) onto the GPU
    timeline; counted as kernels, the step marker made a whole H100 step one 'elementwise'
    kernel and the module 'attn' marker an 'attention' one."""
    from types import SimpleNamespace

    from tensorpilot.profiling.events import device_kernels

    recorded = [_KinetoEvent("tensorpilot.step#0", "gpu_user_annotation", 0, 1000),
                _KinetoEvent("tensorpilot.module:blocks.0.attn", "gpu_user_annotation", 100, 300),
                _KinetoEvent("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "kernel", 100, 300),
                _KinetoEvent("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 0, 50),
                _KinetoEvent("cudaStreamSynchronize", "cuda_sync", 500, 400),
                _KinetoEvent("aten::mm", "cpu_op", 100, 300, on_device=False)]
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: recorded)))
    kernels = device_kernels(prof)
    assert [k.name for k in kernels] == ["Memcpy HtoD (Pinned -> Device)", "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT"]
    s = bd.gpu_step(ev("tensorpilot.step#0", 0, 1000), kernels)
    # the GEMM's 300 us and the copy's 50; the other 650 us the device had nothing to run
    assert s.seconds["matmul_conv"] == approx(300 * US) and s.seconds["casts_copies"] == approx(50 * US)
    assert s.seconds["elementwise"] == 0 and s.seconds["attention"] == 0
    assert s.seconds["host_overhead"] == approx(650 * US)


class _OldKinetoEvent(_KinetoEvent):
    """torch 2.11's _KinetoEvent: no activity_type (seen on the H100 lease)."""

    def __getattribute__(self, name):
        if name == "activity_type":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_events_without_an_activity_type_are_told_apart_by_name():
    from types import SimpleNamespace

    from tensorpilot.profiling.events import device_kernels

    recorded = [_OldKinetoEvent("tensorpilot.step#0", "gpu_user_annotation", 0, 1000),
                _OldKinetoEvent("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "kernel", 100, 300),
                _OldKinetoEvent("Memset (Device)", "gpu_memset", 0, 5),
                _OldKinetoEvent("Stream Sync", "cuda_sync", 500, 400),
                _OldKinetoEvent("cudaStreamSynchronize", "cuda_sync", 500, 400)]
    assert not hasattr(recorded[1], "activity_type")
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: recorded)))
    assert [k.name for k in device_kernels(prof)] == ["Memset (Device)", "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT"]


def test_typical_step_is_robust_to_one_descheduled_step():
    def step(mm_us, wall_us):
        return bd.cpu_step(ev("tensorpilot.step#0", 0, wall_us, ev("aten::mm", 0, mm_us)))
    t = bd.typical([step(50, 100), step(52, 100), step(900, 1000)])
    # medians: wall 100; mm of (50, 52, 900) 52; host of (50, 48, 100) 50; scaled to sum to the
    # wall: x 100/102 -- the 1000 us outlier decides nothing
    assert t.wall_s == approx(100 * US)
    assert t.seconds["matmul_conv"] == approx(52 * 100 / 102 * US)
    assert t.seconds["host_overhead"] == approx(50 * 100 / 102 * US)


def test_profiler_cost_comes_off_where_its_events_are():
    s = bd.cpu_step(ev("tensorpilot.step#0", 0, 100, ev("aten::mm", 0, 40), ev("aten::view", 45, 2),
                       ev("autograd::engine::evaluate_function: MmBackward0", 50, 10)))
    assert s.events == {"matmul_conv": 1, "host_overhead": 2}          # the view and the autograd node
    c = bd.without_profiler(s, unprofiled_wall_s=70 * US)
    # 30 us of profiler over 3 events: the matmul gives 10 (40 -> 30), host 20 (60 -> 40); the step
    # sums to the unprofiled 70
    assert c.seconds["matmul_conv"] == approx(30 * US) and c.seconds["host_overhead"] == approx(40 * US)
    assert c.wall_s == approx(70 * US)
    # 90 us: the matmul's third is 30, host's 60 -- all of host's 60; never below zero
    c = bd.without_profiler(s, unprofiled_wall_s=10 * US)
    assert c.seconds["matmul_conv"] == approx(10 * US) and c.seconds["host_overhead"] == 0


def test_sleep_only_the_profiled_steps_had_is_profiler_cost():
    s = bd.cpu_step(ev("tensorpilot.step#0", 0, 100, ev("aten::mm", 0, 40)), blocked_ns=30_000)
    assert s.seconds["idle"] == approx(30 * US) and s.seconds["host_overhead"] == approx(30 * US)
    # 20 us of profiler; unprofiled steps slept 10 us: idle 30 -> 10 takes all of it
    c = bd.without_profiler(s, unprofiled_wall_s=80 * US, unprofiled_sleep_s=10 * US)
    assert c.seconds["idle"] == approx(10 * US) and c.seconds["host_overhead"] == approx(30 * US)
    assert c.seconds["matmul_conv"] == approx(40 * US)


# ------------------------------------------------------------------------------- findings

def times(wall_us=1000, **seconds_us):
    sec = {c: seconds_us.pop(c, 0) * US for c in bd.CATEGORIES}
    sec["host_overhead"] = wall_us * US - sum(sec.values())
    return bd.StepTimes(wall_us * US, sec, **{k: v * US if k.endswith("_s") else v for k, v in seconds_us.items()})


def kinds(found):
    return [f.kind for f in found]


def test_data_loading_first_with_workers_flag():
    found = fd.find(times(data_loading=600, matmul_conv=200), fd.RunFacts(cpu_count=8))
    assert kinds(found)[0] == "data_loading"
    assert found[0].share_of_step == pytest.approx(0.6) and found[0].setting == {"data.num_workers": 8}
    assert found[0].flag == "--data.num_workers 8"
    # already 4 workers: double them; a user's own DataLoader: our workers do not apply
    assert fd.find(times(data_loading=600), fd.RunFacts(num_workers=4))[0].setting == {"data.num_workers": 8}
    assert "data_loading" not in kinds(fd.find(times(data_loading=600), fd.RunFacts(user_loader=True)))


def test_host_overhead_flag_by_device():
    step = times(matmul_conv=300)                                  # host 700 of 1000
    cpu = fd.find(step, fd.RunFacts(micro_batch=2))
    assert kinds(cpu) == ["host_overhead"] and cpu[0].setting == {"data.batch_size": 8}
    gpu = fd.find(step, fd.RunFacts(device_kind="cuda", micro_batch=2))
    assert gpu[0].setting == {"engine.compile": "on"}
    assert fd.find(times(matmul_conv=800), fd.RunFacts()) == []     # host 20 %: below the threshold


def test_precision_needs_fast_bf16_units_measured_faster():
    step = times(matmul_conv=700, elementwise=100)
    ampere = fd.RunFacts(device_kind="cuda", precision="tf32", bf16_fast=True, bf16_over_fp32=2.0)
    found = fd.find(step, ampere)
    assert kinds(found)[0] == "precision" and found[0].flag == "--engine.precision bf16"
    assert found[0].share_of_step == pytest.approx(0.7)
    avx512_bf16 = fd.RunFacts(precision="fp32", bf16_fast=True, bf16_over_fp32=None)   # not measured: trust the units
    assert "precision" in kinds(fd.find(step, avx512_bf16))
    for facts in (fd.RunFacts(precision="fp32", bf16_fast=False),                      # no bf16 units
                  fd.RunFacts(precision="fp32", bf16_fast=True, bf16_over_fp32=0.6),   # measured slower
                  fd.RunFacts(precision="bf16", bf16_fast=True)):                      # already bf16
        assert "precision" not in kinds(fd.find(step, facts))


def test_memory_bound_only_when_compilation_can_help():
    step = times(elementwise=300, normalization=100, matmul_conv=400)     # memory-bound 40 %
    assert kinds(fd.find(step, fd.RunFacts())) == ["memory_bound"]
    assert fd.find(step, fd.RunFacts(compiled=True)) == []
    assert fd.find(step, fd.RunFacts(can_compile=False)) == []


def test_attention_on_a_slow_path():
    math = times(attention=400, matmul_conv=400, attention_paths={"aten::_scaled_dot_product_attention_math": 1})
    for mode in ("sdpa", "auto"):             # auto times SDPA without dropout: it may still land on math
        found = fd.find(math, fd.RunFacts(attention_mode=mode))
        assert kinds(found) == ["attention"] and found[0].flag == "--engine.attention blocked"
    assert fd.find(math, fd.RunFacts(attention_mode="blocked")) == []      # calls blocked cannot take
    flash = times(attention=400, matmul_conv=400, attention_paths={"aten::_flash_attention_forward": 1})
    roof = [{"op_class": "attention", "achieved_flops_per_s": 1e9}, {"op_class": "matmul_conv", "achieved_flops_per_s": 4e9}]
    found = fd.find(flash, fd.RunFacts(attention_mode="sdpa"), roof)        # 25 % of the matmul rate
    assert kinds(found) == ["attention"] and found[0].flag == "--engine.attention auto"
    assert fd.find(flash, fd.RunFacts(attention_mode="auto"), roof) == []   # auto already chose per shape
    assert fd.find(flash, fd.RunFacts(attention_mode="sdpa")) == []          # no rates: no evidence of slowness
    # on a GPU auto keeps SDPA (the trainer routes on CPUs only): suggesting it would change nothing
    assert fd.find(flash, fd.RunFacts(attention_mode="sdpa", device_kind="cuda"), roof) == []


def test_communication_recompute_optimizer():
    comm = times(communication=500, matmul_conv=400, comm_total_s=600, comm_overlapped_s=100)
    found = fd.find(comm, fd.RunFacts(world_size=2))
    assert kinds(found) == ["communication"] and found[0].setting == {"engine.grad_accum": 4}
    assert fd.find(comm, fd.RunFacts(world_size=1)) == []
    ac = times(matmul_conv=850, recompute_s=300)
    assert kinds(fd.find(ac, fd.RunFacts(checkpointing=True)))[0] == "recompute"
    assert fd.find(ac, fd.RunFacts(checkpointing=True))[0].flag == "--no-engine.activation_checkpointing"
    loop = times(optimizer=100, matmul_conv=750, optimizer_step_s=250)     # Python of a for-loop AdamW
    found = fd.find(loop, fd.RunFacts(optimizer_impl="loop"))
    assert kinds(found) == ["optimizer"] and found[0].share_of_step == pytest.approx(0.25)
    assert fd.find(loop, fd.RunFacts(optimizer_impl="fused")) == []


def test_findings_are_ranked_by_share():
    step = times(data_loading=200, elementwise=300, normalization=100, communication=150, matmul_conv=200)
    found = fd.find(step, fd.RunFacts(world_size=2))
    assert kinds(found) == ["memory_bound", "data_loading", "communication"]
    assert [f.share_of_step for f in found] == sorted((f.share_of_step for f in found), reverse=True)
    assert set(fd.KINDS) >= set(kinds(found))


def test_every_flag_pastes_onto_train():
    """Each finding's flag is accepted by train's own parser and sets what ``setting`` says."""
    from tensorpilot.trainargs import add_train_arguments, build_config

    steps = [times(data_loading=600), times(matmul_conv=100), times(matmul_conv=700),
             times(elementwise=500, matmul_conv=400), times(attention=400, attention_paths={"math": 1}),
             times(communication=500, matmul_conv=400), times(matmul_conv=850, recompute_s=300),
             times(matmul_conv=800, optimizer=150, optimizer_step_s=150)]
    facts = fd.RunFacts(precision="fp32", bf16_fast=True, attention_mode="sdpa", world_size=2, checkpointing=True,
                        optimizer_impl="foreach", micro_batch=4)
    seen = set()
    for step in steps:
        for f in fd.find(step, facts) + fd.find(step, fd.RunFacts(device_kind="cuda")):
            parser = argparse.ArgumentParser()
            add_train_arguments(parser)
            args = parser.parse_args(shlex.split(f.flag) + ["--print-config"])
            cfg = build_config(args)
            for dotted, value in f.setting.items():
                section, key = dotted.split(".")
                assert getattr(getattr(cfg, section), key) == value, f.flag
            seen.add(f.kind)
    assert seen == set(fd.KINDS)
