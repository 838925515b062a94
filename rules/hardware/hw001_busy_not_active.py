"""The device counts as busy, but few of its SMs / AI Cores are active: kernels too small for it.

## Why it matters
``util_gpu_pct`` (nvidia-smi's "GPU utilisation", npu-smi's usage) is the share of time *some*
kernel runs, however few of the device's cores it occupies; ``sm_active_pct`` (DCGM SM activity,
Moneo's "SM Active") or the Ascend AI Core / cube utilisation is the share of cores at work. A
device "92 % busy" whose SMs are 21 % active runs kernels that fill a fifth of it: launch-bound
small kernels, small batches, or grids smaller than the SM count. Moneo (§II, Table I) monitors
both for this reason.

## How it is detected
From ``hw_metrics``, per device, over the samples taken while the device computes (phase from the
device events at each sample; without events, every sample inside a step): the mean time-busy
metric (``util_gpu_pct``) and the mean activity metric (``sm_active_pct``, else
``aicore_util_pct`` / ``cube_util_pct``). It fires when busy >= ``min_busy_pct`` and activity /
busy <= ``max_active_ratio``. ``tensor_active_pct`` / ``cube_util_pct`` and both figures in the
communication and idle phases are added to the evidence where sampled. The steps named are those whose compute-phase means meet the same test.

The saving is the per-step device kernel time (breakdown) times ``1 - activity / busy``: what the
kernels would save if they filled the device (an upper bound).

## What to do
Make each kernel do more work: a larger batch or micro-batch, fused operators (torch.compile,
fused optimizers and norms), CUDA / ACL graphs to cut launch gaps; check for grids smaller than
the SM count (CMP006) and for host-bound launching (CPU007).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from rules.hardware._common import phase_samples, stage, steps_text

BUSY = ("util_gpu_pct",)
ACTIVE = ("sm_active_pct", "aicore_util_pct", "cube_util_pct")
TENSOR = ("tensor_active_pct", "cube_util_pct")


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for HW001."""

    min_busy_pct: float = knob(80.0, "the device counts as busy when util_gpu_pct averages at least this (%)")
    max_active_ratio: float = knob(0.35, "fire when SM / AI Core activity is at most this share of the busy time",
                                   "Moneo Table I: SM Active is time x share of SMs; a third of the SMs at work "
                                   "leaves two thirds of the device idle while it counts as busy")


def _by_dev_step(means: Any) -> dict[tuple[str, int], float]:
    """A (device, step) -> mean Series as a plain dict."""
    return {(str(d), int(s)): float(v) for (d, s), v in means.items()}


@rule("HW001", "hardware.busy-not-active", cause="compute.device_underfilled", scope="cluster", requires=("hw_metrics",),
      thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per device that is busy with few cores active."""
    hw = stage(ctx)
    have = set(hw.samples["metric"].unique()) if not hw.empty else set()
    busy_m = next((m for m in BUSY if m in have), None)
    active_m = next((m for m in ACTIVE if m in have), None)
    if busy_m is None or active_m is None:
        ctx.warn("hw_metrics lacks a time-busy series (util_gpu_pct) or an activity series (sm_active_pct, "
                 "aicore_util_pct, cube_util_pct): busy-but-idle devices cannot be told")
        return
    busy, basis = phase_samples(hw, busy_m, "compute")
    active, _ = phase_samples(hw, active_m, "compute")
    tensor_m = next((m for m in TENSOR if m in have and m != active_m), None)
    tensor = phase_samples(hw, tensor_m, "compute")[0] if tensor_m else None
    b_dev = busy.groupby("dev")["value"].mean()
    a_dev = active.groupby("dev")["value"].mean()
    b_step = busy[busy["step"] >= 0].groupby(["dev", "step"])["value"].mean()
    a_step = active[active["step"] >= 0].groupby(["dev", "step"])["value"].mean()
    b_map = _by_dev_step(b_step)
    a_map = _by_dev_step(a_step)
    bd = ctx.breakdown()
    for dev in sorted(set(b_dev.index) & set(a_dev.index)):
        b, a = float(b_dev[dev]), float(a_dev[dev])
        if b < ctx.t.min_busy_pct or b <= 0:
            continue
        ratio = a / b
        if ratio > ctx.t.max_active_ratio:
            continue
        steps = sorted(s for (d, s), v in b_map.items() if d == dev and (d, s) in a_map
                       and v >= ctx.t.min_busy_pct and a_map[(d, s)] / v <= ctx.t.max_active_ratio)
        rank = hw.rank_of(dev)
        kernel_us = None
        if rank is not None and not bd.empty and "kernel_us" in bd:
            sel = bd[bd["rank"] == rank]["kernel_us"]
            kernel_us = float(sel.median()) if len(sel) else None
        evidence = {
            "device": hw.label(dev),
            "busy_metric": busy_m,
            "busy_pct": round(b, 1),
            "active_metric": active_m,
            "active_pct": round(a, 1),
            "active_ratio": round(ratio, 3),
            "samples": int((busy["dev"] == dev).sum()),
            "over": basis,
            "min_busy_pct": ctx.t.min_busy_pct,
            "max_active_ratio": ctx.t.max_active_ratio,
            "kernel_us_per_step": None if kernel_us is None else round(kernel_us, 1),
        }
        # the other phases, for the reader: collectives run few SMs by design, idle time none
        bp = hw.by_phase
        for phase in ("comm", "idle"):
            for key, metric in (("busy", busy_m), ("active", active_m)):
                v = bp[(bp["dev"] == dev) & (bp["metric"] == metric) & (bp["phase"] == phase)]["mean"]
                if len(v):
                    evidence[f"{key}_{phase}_pct"] = round(float(v.iloc[0]), 1)
        if tensor is not None and tensor_m is not None:
            t = tensor[tensor["dev"] == dev]["value"]
            if len(t):
                evidence["tensor_metric"] = tensor_m
                evidence["tensor_active_pct"] = round(float(t.mean()), 1)
        yield ctx.finding(
            title=(f"{hw.label(dev)}: busy {b:.0f} %, {active_m.replace('_pct', '').replace('_', ' ')} {a:.0f} % "
                   f"({basis}): kernels too small for the device (steps {steps_text(steps)})"),
            evidence=evidence,
            saving_us=None if kernel_us is None else kernel_us * (1.0 - ratio),
            step_us=ctx.step_us(rank) if rank is not None else ctx.step_us(),
            severity=None if kernel_us is not None else Severity.MEDIUM,
            saving_basis="median per-step device kernel time x (1 - activity / busy): the kernels filling the device "
                         "(upper bound)",
            ranks=[] if rank is None else [rank],
            steps=steps,
        )
