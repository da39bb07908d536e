"""Layout search and deadline sizing on top of :func:`tensorpilot.plan.predict.predict`.

The space: tp (powers of two inside a node, dividing the heads) x pp (dividing the remaining
devices, at most the layer count) x dp (the rest, dividing the global batch) x micro-batch
(powers of two dividing the per-replica batch, up to 16) x context parallelism (powers of two up
to 32, from 16k-token sequences) x sharding (none, zero1, zero2, fsdp)
x recomputation (none, selective, full of the fewest blocks a chunk that fit: predict.least_recompute)
x schedule (1f1b; interleaved with 2 chunks when pp > 1), sequence parallelism always on with
tp > 1 (it only saves memory and traffic is the same).
Pruning: recomputation only costs time, so a layout stops at the first recompute mode that fits;
a predict() costs ~0.1 ms, so even 405B on 16,384 devices (~2,000 candidates) answers in well
under a second.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field, replace

from tensorpilot.errors import ConfigError
from tensorpilot.hardware.catalog import Accelerator
from tensorpilot.plan import calibration as cal
from tensorpilot.plan import memory as mem
from tensorpilot.plan.flops import model_flops_per_token
from tensorpilot.plan.limits import MAX_DEVICES, check_count
from tensorpilot.plan.models import ModelSpec
from tensorpilot.plan.predict import (Layout, Plan, TrainSetup, check_layout, hourly_price, least_recompute,
                                      predict)

__all__ = ["SearchResult", "candidate_layouts", "cheapest_for_deadline", "divisors", "explain_winner",
           "parse_duration_s", "prime_factors", "search"]

OBJECTIVES = ("throughput", "cost")
# Layouts (before recomputation modes) one search evaluates at most: ~3 predictions each at
# ~0.1 ms keep it under ~5 s. Published shapes stay far below: llama3.1-405b on 8,648,640 devices
# (448 divisors, the most of any count up to MAX_DEVICES) with a global batch they all divide
# yields 5,220; only a config with thousands of layers reaches the limit.
MAX_SEARCH_LAYOUTS = 20_000
# Sequence length from which the search also splits sequences over context-parallel ranks: 16k.
# Long-context stages split them (Llama 3 405B's 128k stage: cp 16, Dubey et al. 2024, Table 4);
# 8k pretraining, the most common length, keeps the search of the largest device counts within
# MAX_SEARCH_LAYOUTS. A pruning bound, not a prediction: a stated cp is planned at any length.
LONG_CONTEXT_SEQ = 16384
# ... over at most 32 ranks, each keeping at least 2k tokens of a sequence (pruning bounds too)
MAX_CP = 32
MIN_CP_TOKENS = 2048
# Largest count --deadline tries (powers of two): the size of the largest published runs (Llama 3).
DEADLINE_MAX_DEVICES = 16384


@dataclass(slots=True)
class SearchResult:
    ranked: list[Plan]                  # fitting layouts, best first
    considered: int = 0
    invalid: int = 0
    not_fitting: int = 0
    objective: str = "throughput"
    why: list[str] = field(default_factory=list)


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of ``n`` >= 1 by trial division. Each factor found shrinks ``n``, and the
    loop stops once d^2 exceeds what is left, so it costs at most ~sqrt(n)/2 divisions, reached
    only when n is a prime or has a prime factor near sqrt(n) (n = 9,999,991, a prime: 1,581)."""
    if n < 1:
        raise ValueError(f"n must be a positive integer, not {n}")
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1 if d == 2 else 2            # 2, then odd candidates only
    if n > 1:                              # what is left has no factor <= its square root: a prime
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """Every divisor of ``n`` >= 1, ascending: the products of its prime powers."""
    divs = [1]
    for p, k in prime_factors(n).items():
        divs = [d * p**e for d in divs for e in range(k + 1)]
    return sorted(divs)


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def candidate_layouts(spec: ModelSpec, n_devices: int, setup: TrainSetup, *,
                      gpus_per_node: int = cal.GPUS_PER_NODE, max_micro: int = 16):
    """Yield (layout without recompute) candidates that pass the divisibility rules. Context
    parallelism (cp, powers of two up to MAX_CP whose 2 cp load-balanced chunks divide the sequence
    and leave MIN_CP_TOKENS a rank) joins the space from LONG_CONTEXT_SEQ tokens a sequence, where
    long-context recipes split sequences (Megatron-LM's and torchtitan's context parallelism as a
    ring; DeepSpeed-Ulysses's all-to-alls where cp divides a tensor-parallel rank's heads)."""
    for tp in _powers_of_two(min(gpus_per_node, n_devices)):
        if n_devices % tp or spec.heads % tp or (spec.n_kv_heads % tp and tp % spec.n_kv_heads):
            continue
        cps = [c for c in _powers_of_two(min(MAX_CP, n_devices // tp)) if (n_devices // tp) % c == 0
               and setup.seq_len % (2 * c) == 0 and setup.seq_len // c >= MIN_CP_TOKENS] \
            if setup.seq_len >= LONG_CONTEXT_SEQ else [1]
        for cp in cps:
            for pp in divisors(n_devices // (tp * cp)):
                if pp > spec.layers:
                    break
                dp = n_devices // (tp * pp * cp)
                if setup.global_batch % dp:
                    continue
                per_replica = setup.global_batch // dp
                for mb in _powers_of_two(min(max_micro, per_replica)):
                    if per_replica % mb:
                        continue
                    schedules = [("1f1b", 1)]
                    if pp > 1 and spec.layers % (2 * pp) == 0 and per_replica // mb >= pp:
                        schedules.append(("interleaved", 2))
                    shardings = ("none", "zero1", "zero2", "fsdp") if dp * cp > 1 else ("none",)
                    # Ulysses where cp divides a tp rank's heads (each cp rank takes whole heads)
                    modes = ("ring", "ulysses") if cp > 1 and (spec.heads // tp) % cp == 0 else ("ring",)
                    for sharding in shardings:
                        for schedule, v in schedules:
                            for mode in modes:
                                yield Layout(tp=tp, pp=pp, dp=dp, cp=cp, cp_mode=mode, sharding=sharding,
                                             sequence_parallel=tp > 1, micro_batch=mb, schedule=schedule,
                                             virtual_stages=v)


def _score(plan: Plan, objective: str) -> float:
    """Lower is better: seconds per token, or dollars per token (seconds x devices x price)."""
    per_token_s = 1 / plan.tokens_per_s
    if objective == "cost":
        return per_token_s * plan.n_devices * plan.price_per_gpu_hour
    return per_token_s


def search(spec: ModelSpec, acc: Accelerator, n_devices: int, setup: TrainSetup, *,
           objective: str = "throughput", top: int = 5, recompute_modes=("none", "selective", "full")) -> SearchResult:
    if objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}; use {' or '.join(OBJECTIVES)}.")
    check_count("the number of devices", n_devices, MAX_DEVICES)
    if objective == "cost" and hourly_price(setup, acc) is None:
        raise ConfigError(f"ranking by cost needs a price: {acc.key} has no catalog price; pass --price-per-hour USD.")
    result = SearchResult(ranked=[], objective=objective)
    plans: list[Plan] = []
    candidates = list(itertools.islice(candidate_layouts(spec, n_devices, setup), MAX_SEARCH_LAYOUTS + 1))
    if len(candidates) > MAX_SEARCH_LAYOUTS:
        raise ConfigError(f"{spec.name} on {n_devices:,} devices with a global batch of {setup.global_batch:,} "
                          f"has more than {MAX_SEARCH_LAYOUTS:,} layouts to search; choose a global batch or "
                          "device count with fewer divisors.")
    for base in candidates:
        fitted = False
        for rec in recompute_modes:
            result.considered += 1
            layout = replace(base, recompute=rec)
            try:
                check_layout(spec, layout, setup)
            except ConfigError:
                result.invalid += 1
                break
            # full recomputation of the fewest blocks that fit (the rest keep their activations)
            plan = least_recompute(spec, acc, layout, setup) if rec == "full" else \
                predict(spec, acc, layout, setup, check=False)
            if plan.fits:
                plans.append(plan)
                fitted = True
                break                  # more recomputation would only be slower
        if not fitted:
            result.not_fitting += 1
    plans.sort(key=lambda p: _score(p, objective))
    result.ranked = plans[:top]
    result.why = explain_winner(plans, objective)
    return result


_REASONS = {"compute": "compute", "memory_bound": "memory-bound ops", "tp_comm": "tensor-parallel communication",
            "pipeline_bubble": "pipeline bubble", "pp_comm": "pipeline transfers",
            "dp_comm_exposed": "exposed data-parallel communication", "optimizer": "optimizer step",
            "casts": "fp8 / fp4 casts", "cp_comm": "exposed context-parallel key/value exchange",
            "host_dispatch": "waiting for the host to dispatch eager ops",
            "host_offload": "host offload (transfers and the CPU optimizer step)"}


def explain_winner(plans: list[Plan], objective: str) -> list[str]:
    """Sentences on why the best plan beats the best plan of a *different* layout family."""
    if not plans:
        return []
    best = plans[0]
    lines = [f"best: {best.layout_detail.describe()} -> {best.tokens_per_s_per_device:,.0f} tokens/s/device, "
             f"MFU {best.mfu:.1%}, {best.memory_bytes['total'] / 2**30:,.1f} GiB of "
             f"{best.memory_limit_bytes / 2**30:,.1f} GiB usable."]
    rival = next((p for p in plans[1:] if p.layout != best.layout), None)
    if rival is None:
        return lines
    gain = rival.step_time_s / best.step_time_s - 1
    lines.append(f"it beats the best '{rival.layout}' layout ({rival.layout_detail.describe()}) by {gain:.1%} "
                 "in step time" + (" per dollar" if objective == "cost" else "") + ".")
    diffs = sorted(((rival.time_breakdown_s[k] - best.time_breakdown_s[k], k) for k in best.time_breakdown_s),
                   reverse=True)
    saved = [f"{_REASONS[k]} {best.time_breakdown_s[k]:.3g} s vs {rival.time_breakdown_s[k]:.3g} s"
             for d, k in diffs[:2] if d > 0.01 * rival.step_time_s]
    if saved:
        lines.append("where the time goes differently: " + "; ".join(saved) + ".")
    return lines


def cheapest_for_deadline(spec: ModelSpec, tokens: float, deadline_s: float, setup: TrainSetup, *,
                          accelerators: list[Accelerator], max_devices: int = DEADLINE_MAX_DEVICES
                          ) -> list[tuple[Plan, float]]:
    """For each accelerator with a price: the smallest power-of-two device count whose best
    layout trains ``tokens`` within ``deadline_s`` (and the next count, if cheaper).
    Returns [(plan, cost_usd)] cheapest first."""
    found: list[tuple[Plan, float]] = []
    for acc in accelerators:
        price = hourly_price(setup, acc)
        peak = acc.peak_flops_per_s(_compute_dtype(setup.precision))
        if price is None or not peak:
            continue
        best: tuple[Plan, float] | None = None
        fewest = _fewest_devices(spec, acc, setup, tokens, deadline_s, peak)
        n = 1
        while n <= max_devices and n < fewest:         # counts that cannot work: skipped unsearched
            n *= 2
        while n <= max_devices:
            res = search(spec, acc, n, setup, top=1)
            if res.ranked:
                plan = res.ranked[0]
                train_s = tokens / plan.tokens_per_s / setup.goodput_on(n)
                if train_s <= deadline_s:
                    cost = train_s / 3600 * n * price
                    if best is not None:           # one doubling past the first success, then stop
                        best = min(best, (plan, cost), key=lambda pc: pc[1])
                        break
                    best = (plan, cost)
            n *= 2
        if best is not None:
            plan, cost = best
            plan.goodput = setup.goodput_on(plan.n_devices)
            plan.time_to_train_s = tokens / plan.tokens_per_s / plan.goodput
            plan.gpu_hours = plan.time_to_train_s * plan.n_devices / 3600
            plan.price_per_gpu_hour = price
            plan.cost_usd = cost
            found.append(best)
    found.sort(key=lambda pc: pc[1])
    return found


def _fewest_devices(spec: ModelSpec, acc: Accelerator, setup: TrainSetup, tokens: float, deadline_s: float,
                    peak_flops_per_s: float) -> float:
    """A lower bound on the devices that can train ``tokens`` within ``deadline_s``; fewer cannot:
    - no prediction beats 100% MFU: n x deadline x peak >= tokens x FLOPs per token;
    - no layout holds less than the model states fully sharded over all n devices (each device
      keeps at least n_params x state bytes / n: the busiest pipeline stage holds at least its
      share) plus the CUDA context, within the usable memory predict() allows."""
    ideal_device_s = tokens * model_flops_per_token(spec, setup.seq_len) / peak_flops_per_s
    prec = mem.precision(setup.precision, setup.optimizer, grad_dtype=setup.grad_dtype)
    state_bytes = sum(mem.model_state_bytes(spec.n_params, prec).values())
    usable_bytes = (acc.mem_gb or 0) * 2**30 * (1 - cal.SAFETY_MARGIN_FRACTION) - cal.CONTEXT_BYTES
    by_memory = state_bytes / usable_bytes if usable_bytes > 0 else math.inf
    return max(ideal_device_s / deadline_s, by_memory)


def _compute_dtype(precision_name: str) -> str:
    return mem.precision(precision_name).compute


_DURATION = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([wdhms]?)\s*", re.IGNORECASE)
_UNIT_S = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "": 1}


def parse_duration_s(text: str) -> float:
    """'14d', '36h', '90m', '3600s', '2w' or a number of seconds -> seconds (finite, > 0)."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ConfigError(f"cannot read duration {text!r}; write a positive number with a unit, e.g. 14d, "
                          "36h, 90m or 3600s.")
    value = float(m.group(1)) * _UNIT_S[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"duration {text!r} must be more than 0 and finite.")
    return value
