"""The device clock runs below its nominal frequency (AI Core frequency or GPU clock drop).

## Why it matters
A lowered clock slows every compute-bound operator in proportion, and on one rank of a
synchronous job it slows the whole job. Hermes (§4.2.2) checks compute-bound operators for a
node "downclocked over the threshold (often 5 %)"; thermal or power capping and faulty cooling
are the usual causes.

## How it is detected
From ``hw_metrics`` (the AI Core frequency series of Ascend exports, ``aicore_freq_mhz``, or a
GPU clock series, ``clock_sm_mhz`` / ``gpu_clock_mhz`` / ``sm_clock_mhz``), per device, over the
samples taken while the device computes (phase from the rank's device events, see
:mod:`advisor.stages.hardware`; a device with no sample there - no events, or a series sampled
only when its value changes, as Ascend's - with every sample inside a step, else all):
the sampled clock is compared with the nominal clock - ``nominal_mhz`` when set, else the
device's entry in ``rules/compute/devices.toml``, else (with a warning) the highest clock sampled
on any device. The steps it slowed are those whose mean clock is more than ``max_drop`` below
nominal (with at least ``min_step_samples`` samples); the rule fires when there are such steps
or the mean over every sample is that far below. Where sampled, the temperature (``temp_gpu_c``), the power against its limit (``power_w``,
``power_limit_w``) and the throttle reasons in those steps say why: power at cap (within
``power_cap_share`` of the limit), hot (at least ``hot_c``), or neither. Traces without a clock
series are skipped (``requires hw_metrics``).

The saving is the per-step device kernel time times the drop in the slowed steps: what the same
work would take at the nominal clock if it were all clock-bound (an upper bound).

## What to do
Check cooling, power capping and the power supply of the node (``npu-smi info`` /
``nvidia-smi -q -d CLOCK,PERFORMANCE`` show the throttle reasons); isolate the node if it
keeps throttling.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from rules.compute._common import device_label, rank_devices
from rules.hardware._common import Hardware, steps_text


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CMP005."""

    max_drop: float = knob(0.05, "fire when the mean clock is more than this share below nominal",
                           "Hermes §4.2.2: downclocked over the threshold (often 5 %)")
    nominal_mhz: float = knob(0.0, "nominal clock in MHz; 0 = the device's entry in rules/compute/devices.toml")
    power_cap_share: float = knob(0.97, "power counts as at its cap from this share of power_limit_w")
    min_step_samples: int = knob(3, "a step counts as slowed only with at least this many clock samples in it "
                                    "(one low sample is a dip, not a slowed step)")
    hot_c: float = knob(85.0, "the device counts as hot from this temperature (°C)",
                        "NVIDIA data-centre GPUs start thermal slowdown in the mid-80s °C (nvidia-smi -q "
                        "'GPU Slowdown Temp')")


FREQ_METRICS = ("aicore_freq_mhz", "clock_sm_mhz", "aicore_freq", "ai_core_freq_mhz", "gpu_clock_mhz", "sm_clock_mhz",
                "gpu_sm_clock_mhz", "graphics_clock_mhz")


def _why(hw: Hardware, dev: str, steps: list[int], t: Thresholds) -> dict[str, Any]:
    """Temperature, power against its limit and throttle reasons of a device in ``steps``."""
    out: dict[str, Any] = {}

    def mean(metric: str, agg: str = "mean") -> float | None:
        s = hw.series(metric)
        s = s[s["dev"] == dev]
        if steps:
            s = s[s["step"].isin(steps)]
        return float(getattr(s["value"], agg)()) if len(s) else None

    temp, power, limit = mean("temp_gpu_c"), mean("power_w"), mean("power_limit_w", "max")
    reasons = mean("throttle_reasons", "max")
    hints = []
    if power is not None:
        out["power_w"] = round(power, 1)
        if limit:
            out["power_limit_w"] = round(limit, 1)
            if power >= t.power_cap_share * limit:
                hints.append("power at its cap")
    if temp is not None:
        out["temp_c"] = round(temp, 1)
        if temp >= t.hot_c:
            hints.append("hot")
    if reasons:
        out["throttle_reasons"] = int(reasons)
        hints.append(f"throttle reasons 0x{int(reasons):x}")
    out["why"] = ", ".join(hints) if hints else ("no power or temperature series" if power is None and temp is None
                                                 else "neither power cap nor heat")
    return out


@rule("CMP005", "compute.frequency-drop", cause="compute.frequency_drop", requires=("hw_metrics",),
      thresholds=Thresholds, scope="cluster")
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per device whose clock is below nominal by more than ``max_drop`` (in some steps or overall)."""
    hw = ctx.hardware()
    have = set(hw.samples["metric"].unique()) if not hw.empty else set()
    metrics = [m for m in FREQ_METRICS if m in have]
    if not metrics:
        ctx.warn("hw_metrics has no clock series (" + ", ".join(FREQ_METRICS) + ")")
        return
    devices = rank_devices(ctx)
    judged: list[tuple[str, str, Any, str]] = []
    for metric in metrics:
        s, basis = hw.in_phase(metric, "compute")
        s = s[s["value"] > 0]
        for dev, g in s.groupby("dev"):
            if not any(j[0] == dev for j in judged):
                judged.append((str(dev), metric, g, basis))
    if not judged:
        ctx.warn("hw_metrics clock series have no positive sample")
        return
    fleet_max = max(float(g["value"].max()) for _, _, g, _ in judged)
    bd = ctx.breakdown()
    for dev, metric, g, basis in judged:
        rank = hw.rank_of(dev)
        name, spec = devices.get(rank, (None, None)) if rank is not None else (None, None)
        if ctx.t.nominal_mhz > 0:
            nominal, nbasis = ctx.t.nominal_mhz, "override"
        elif spec is not None and spec.nominal_mhz:
            nominal, nbasis = float(spec.nominal_mhz), f"devices.toml {spec.id}"
        else:
            nominal, nbasis = fleet_max, "highest sampled clock"
            ctx.warn(f"{hw.label(dev)}: nominal clock of device {device_label(name)} unknown; compared with the highest "
                     f"sampled clock ({fleet_max:.0f} MHz) - set CMP005.nominal_mhz")
        per_step = g[g["step"] >= 0].groupby("step")["value"].agg(["mean", "size"])
        slowed = sorted(int(str(k)) for k, r in per_step.iterrows()
                        if r["size"] >= ctx.t.min_step_samples and 1.0 - r["mean"] / nominal > ctx.t.max_drop)
        mean_all = float(g["value"].mean())
        sel = g[g["step"].isin(slowed)] if slowed else g
        mean = float(sel["value"].mean())
        drop = 1.0 - mean / nominal
        if drop <= ctx.t.max_drop:
            continue
        kernel_us = None
        if rank is not None and not bd.empty and "kernel_us" in bd:
            ks = bd[bd["rank"] == rank]
            if slowed:
                ks = ks[ks["step"].isin(slowed)]
            kernel_us = float(ks["kernel_us"].median()) if len(ks) else None
        why = _why(hw, dev, slowed, ctx.t)
        where = f"in steps {steps_text(slowed)}" if slowed else "on average"
        reason = f"; {why['why']}" if why.get("why") and not why["why"].startswith(("no ", "neither")) else ""
        who = f"Rank {rank}" if rank is not None else hw.label(dev)
        yield ctx.finding(
            title=(f"{who}: device clock {mean:.0f} MHz {where}, {drop:.1%} below nominal {nominal:.0f} MHz "
                   f"(min {float(sel['value'].min()):.0f} MHz over {len(sel)} samples){reason}"),
            evidence={
                "metric": metric,
                "mean_mhz": round(mean, 1),
                "mean_all_mhz": round(mean_all, 1),
                "min_mhz": round(float(sel["value"].min()), 1),
                "nominal_mhz": nominal,
                "nominal_basis": nbasis,
                "drop": round(drop, 4),
                "max_drop": ctx.t.max_drop,
                "samples": len(sel),
                "over": basis,
                "device": name if rank is not None else hw.label(dev),
                "steps_slowed": len(slowed),
                **why,
                "kernel_us_per_step": None if kernel_us is None else round(kernel_us, 1),
            },
            saving_us=None if kernel_us is None else kernel_us * drop,
            step_us=ctx.step_us(rank) if rank is not None else ctx.step_us(),
            severity=None if kernel_us is not None else Severity.MEDIUM,
            saving_basis="median per-step device kernel time of the slowed steps x the clock drop (all of it "
                         "clock-bound: upper bound)",
            ranks=[] if rank is None else [rank],
            steps=slowed,
        )

