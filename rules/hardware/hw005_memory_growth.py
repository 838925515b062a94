"""Device memory in use grows step after step: a leak, and the step it would run out at.

## Why it matters
Memory that grows with every step (outputs kept in a list with their graphs, caches that never
shrink) ends in an out-of-memory failure hours into the run, and before that in allocator retries
and fragmentation that slow the steps. A profile of a few steps shows the slope long before.

## How it is detected
From ``hw_metrics`` ``mem_used_bytes``, per device: the largest sample of each step, and a
least-squares line through them (at least ``min_steps`` steps). It fires when the memory grows by
at least ``min_growth_share`` of the device's memory over the profiled steps, the fit explains at
least ``min_r2`` of the variation, and at least ``min_rising`` of the step-to-step changes are
increases. The device's memory is the largest ``mem_total_bytes`` sample, else its
``rules/compute/devices.toml`` ``memory_gb``; the step it would run out at is where the line
reaches it. Without a known total the finding gives the growth per step only.

No time saving is estimated; the severity is high when the memory runs out within
``soon_steps`` steps of the last profiled one.

## What to do
Find what each step keeps: tensors appended to lists without ``.detach()`` / ``.item()``,
``retain_graph=True``, caches keyed by shape; take a memory snapshot
(``torch.cuda.memory._record_memory_history``) and compare two steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from advisor.units import fmt_value
from rules.hardware._common import spec_of, stage, steps_text


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for HW005."""

    min_steps: int = knob(4, "steps with memory samples needed to fit a slope")
    min_growth_share: float = knob(0.02, "fire when memory grows by at least this share of the device's memory")
    min_r2: float = knob(0.8, "least-squares fit of the per-step peaks must explain this share of their variation")
    min_rising: float = knob(0.75, "share of step-to-step changes that must be increases")
    soon_steps: int = knob(1000, "high severity when the memory runs out within this many steps")


@rule("HW005", "hardware.memory-growth", cause="memory.leak", scope="cluster", requires=("hw_metrics",), thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per device whose memory in use grows across the steps."""
    hw = stage(ctx)
    used = hw.series("mem_used_bytes")
    if used.empty:
        ctx.warn("hw_metrics has no mem_used_bytes series: memory growth not judged")
        return
    used = used[used["step"] >= 0]
    totals = hw.series("mem_total_bytes").groupby("dev")["value"].max()
    few = 0
    for dev, g in used.groupby("dev"):
        dev = str(dev)
        peaks = g.groupby("step")["value"].max().sort_index()
        if len(peaks) < ctx.t.min_steps:
            few += 1
            continue
        x = peaks.index.to_numpy(np.float64)
        y = peaks.to_numpy(np.float64)
        slope, icpt = np.polyfit(x, y, 1)
        fit = slope * x + icpt
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        r2 = 1.0 - float(np.sum((y - fit) ** 2)) / ss_tot if ss_tot > 0 else 0.0
        rising = float(np.mean(np.diff(y) > 0))
        growth = float(y[-1] - y[0])
        total, basis = None, ""
        if dev in totals.index and totals[dev] > 0:
            total, basis = float(totals[dev]), "mem_total_bytes"
        else:
            _name, spec = spec_of(ctx, hw, dev)
            if spec is not None and spec.memory_gb:
                total, basis = float(spec.memory_gb) * 1e9, f"devices.toml {spec.id}"
        ref = total if total else float(y.max())
        if slope <= 0 or growth < ctx.t.min_growth_share * ref or r2 < ctx.t.min_r2 or rising < ctx.t.min_rising:
            continue
        last_step = int(x[-1])
        oom_step = None
        if total:
            left = (total - float(fit[-1])) / slope
            oom_step = last_step + max(0, math.ceil(round(left, 6)))  # the fit's rounding is no step
        rank = hw.rank_of(dev)
        soon = oom_step is not None and oom_step - last_step <= ctx.t.soon_steps
        steps = [int(s) for s in peaks.index]
        where = (f"runs out of its {fmt_value('mem_total_bytes', total)} at about step {oom_step}" if oom_step is not None
                 else "device memory unknown: run-out step not estimated")
        yield ctx.finding(
            title=(f"{hw.label(dev)}: device memory grows {fmt_value('mem_used_bytes', slope)} per step "
                   f"({fmt_value('mem_used_bytes', float(y[0]))} -> {fmt_value('mem_used_bytes', float(y[-1]))} over "
                   f"steps {steps_text(steps)}); {where}"),
            evidence={
                "device": hw.label(dev),
                "growth_bytes_per_step": round(float(slope)),
                "first_bytes": round(float(y[0])),
                "last_bytes": round(float(y[-1])),
                "total_bytes": None if total is None else round(total),
                "total_basis": basis or None,
                "run_out_step": oom_step,
                "r2": round(r2, 4),
                "rising_share": round(rising, 3),
                "min_growth_share": ctx.t.min_growth_share,
                "min_r2": ctx.t.min_r2,
            },
            severity=Severity.HIGH if soon else Severity.MEDIUM,
            ranks=[] if rank is None else [rank],
            steps=steps,
        )
    if few:
        ctx.warn(f"{few} device(s) with mem_used_bytes in fewer than {ctx.t.min_steps} steps: memory growth not judged")
