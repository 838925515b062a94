"""The device clock runs below its nominal frequency (AI Core frequency or GPU clock drop).

## Why it matters
A lowered clock slows every compute-bound operator in proportion, and on one rank of a
synchronous job it slows the whole job. Hermes (§4.2.2) checks compute-bound operators for a
node "downclocked over the threshold (often 5 %)"; thermal or power capping and faulty cooling
are the usual causes.

## How it is detected
From ``hw_metrics`` (the AI Core frequency series of Ascend exports, ``aicore_freq_mhz``, or a
GPU clock series, ``gpu_clock_mhz`` / ``sm_clock_mhz``), per rank: the mean sampled clock is
compared with the nominal clock - ``nominal_mhz`` when set, else the device's entry in
``rules/compute/devices.toml``, else (with a warning) the highest clock sampled on any rank.
The rule fires when ``1 - mean / nominal`` exceeds ``max_drop``. Traces without such a series
are skipped (``requires hw_metrics``).

The saving is the per-step device kernel time times the drop: what the same work would take at
the nominal clock if it were all clock-bound (an upper bound).

## What to do
Check cooling, power capping and the power supply of the node (``npu-smi info`` /
``nvidia-smi -q -d CLOCK,PERFORMANCE`` show the throttle reasons); isolate the node if it
keeps throttling.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from rules.compute._common import device_label, rank_devices


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CMP005."""

    max_drop: float = knob(0.05, "fire when the mean clock is more than this share below nominal",
                           "Hermes §4.2.2: downclocked over the threshold (often 5 %)")
    nominal_mhz: float = knob(0.0, "nominal clock in MHz; 0 = the device's entry in rules/compute/devices.toml")


FREQ_METRICS = ("aicore_freq_mhz", "aicore_freq", "ai_core_freq_mhz", "gpu_clock_mhz", "sm_clock_mhz",
                "gpu_sm_clock_mhz", "graphics_clock_mhz")

SQL = """
SELECT rank, any_value(metric) AS metric, count(*) AS samples, avg(value) AS mean_mhz, min(value) AS min_mhz,
       max(value) AS max_mhz
FROM hw_metrics WHERE lower(metric) IN (SELECT unnest($metrics)) AND value > 0
GROUP BY rank ORDER BY rank
"""


@rule("CMP005", "compute.frequency-drop", cause="compute.frequency_drop", requires=("hw_metrics",),
      thresholds=Thresholds, scope="cluster")
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose mean clock is below nominal by more than ``max_drop``."""
    rows = ctx.query(SQL, {"metrics": list(FREQ_METRICS)})
    if not rows:
        ctx.warn("hw_metrics has no clock series (" + ", ".join(FREQ_METRICS) + ")")
        return
    devices = rank_devices(ctx)
    fleet_max = max(float(r["max_mhz"]) for r in rows)
    bd = ctx.breakdown()
    for r in rows:
        rank = int(r["rank"])
        name, dev = devices.get(rank, (None, None))
        if ctx.t.nominal_mhz > 0:
            nominal, basis = ctx.t.nominal_mhz, "override"
        elif dev is not None and dev.nominal_mhz:
            nominal, basis = float(dev.nominal_mhz), f"devices.toml {dev.id}"
        else:
            nominal, basis = fleet_max, "highest sampled clock"
            ctx.warn(f"rank {rank}: nominal clock of device {device_label(name)} unknown; compared with the highest sampled "
                     f"clock ({fleet_max:.0f} MHz) - set CMP005.nominal_mhz")
        mean = float(r["mean_mhz"])
        drop = 1.0 - mean / nominal
        if drop <= ctx.t.max_drop:
            continue
        kernel_us = None
        if not bd.empty and "kernel_us" in bd:
            sel = bd[bd["rank"] == rank]["kernel_us"]
            kernel_us = float(sel.median()) if len(sel) else None
        yield ctx.finding(
            title=(f"Rank {rank}: device clock {mean:.0f} MHz on average, {drop:.1%} below nominal {nominal:.0f} MHz "
                   f"(min {float(r['min_mhz']):.0f} MHz over {int(r['samples'])} samples)"),
            evidence={
                "metric": r["metric"],
                "mean_mhz": round(mean, 1),
                "min_mhz": round(float(r["min_mhz"]), 1),
                "nominal_mhz": nominal,
                "nominal_basis": basis,
                "drop": round(drop, 4),
                "max_drop": ctx.t.max_drop,
                "samples": int(r["samples"]),
                "device": name,
                "kernel_us_per_step": None if kernel_us is None else round(kernel_us, 1),
            },
            saving_us=None if kernel_us is None else kernel_us * drop,
            step_us=ctx.step_us(rank),
            severity=None if kernel_us is not None else Severity.MEDIUM,
            saving_basis="median per-step device kernel time x the clock drop (all of it clock-bound: upper bound)",
            ranks=[rank],
        )
