"""A device's hardware series diverge from its peers' while the step times stay equal.

## Why it matters
In a synchronous job every rank waits for the slowest at each collective, so a device that runs
hotter, slower or busier than its peers often shows nothing in the step times until it fails or
gets worse. Moneo (§II-B) compares series by their normalised Euclidean distance; a device far
from the rest of the job on the same metric is the early sign.

## How it is detected
The hardware stage (:mod:`advisor.stages.hardware`) bins each kept metric over the profile's time
and, per device, computes Moneo's normalised distance (Eq. 1, each difference divided by the
metric's largest value, as a root mean square over the bins) between the device's series and the
peers' median series. A device whose largest distance is at least ``min_distance`` and
``min_ratio`` times the median device's fires (at least ``min_devices`` devices). The finding
says whether its rank's median step is within ``equal_steps`` of the peers' (hidden by
synchronisation) or not (then a slow rank: see CLU001 and the clock rules).

No saving is estimated.

## What to do
Compare the device with a peer on the named metric (nvidia-smi -q, npu-smi info, DCGM): a cooling
or power fault, a degraded link, a different data shard or expert load; drain and repair the
node before it slows the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from advisor.units import fmt_value
from rules.hardware._common import stage


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for HW004."""

    min_distance: float = knob(0.15, "fire when a device's normalised distance to the peers' median reaches this",
                               "Moneo Eq. 1 (distance divided by the metric's maximum)")
    min_ratio: float = knob(3.0, "and is at least this many times the median device's distance")
    min_devices: int = knob(4, "devices needed for a peers' median")
    equal_steps: float = knob(0.05, "step times count as equal within this share of the peers' median step")


@rule("HW004", "hardware.diverging-device", cause="cluster.diverging_device", scope="cluster", requires=("hw_metrics",),
      thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per device whose series diverge from its peers'."""
    hw = stage(ctx)
    if len(hw.devices) < ctx.t.min_devices:
        ctx.warn(f"{len(hw.devices)} device(s) with hardware series: fewer than {ctx.t.min_devices}, "
                 "no peers' median to compare with")
        return
    scores = hw.scores()
    if scores.empty:
        return
    typical = float(scores["distance"].median())
    summary = {m["metric"]: m for m in hw.metrics}
    for _, r in scores.sort_values("distance", ascending=False).iterrows():
        dev, metric, dist = str(r["dev"]), str(r["metric"]), float(r["distance"])
        if dist < ctx.t.min_distance or dist < ctx.t.min_ratio * typical:
            continue
        rank = hw.rank_of(dev)
        s = hw.series(metric)
        mine = float(s[s["dev"] == dev]["value"].mean())
        peers = float(s[s["dev"] != dev].groupby("dev")["value"].mean().median())
        own_step = ctx.step_us(rank) if rank is not None else None
        others = [int(x) for x in hw.devices["rank"].dropna() if int(x) != rank]
        peer_step = ctx.median_step_us(others) if others else None
        equal = None
        if own_step and peer_step:
            equal = abs(own_step / peer_step - 1.0) <= ctx.t.equal_steps
        how = ("step times equal: synchronisation hides it" if equal else
               "its rank is slower than its peers" if equal is False else "step times unknown")
        steps = sorted(int(x) for x in s[(s["dev"] == dev) & (s["step"] >= 0)]["step"].unique())
        yield ctx.finding(
            title=(f"{hw.label(dev)}: {metric} diverges from its peers (mean {fmt_value(metric, mine)} vs "
                   f"{fmt_value(metric, peers)}, distance {dist:.2f}); {how}"),
            evidence={
                "device": hw.label(dev),
                "metric": metric,
                "distance": round(dist, 4),
                "typical_distance": round(typical, 4),
                "device_mean": round(mine, 4),
                "peers_median_mean": round(peers, 4),
                "unit": summary.get(metric, {}).get("unit", ""),
                "step_us": None if own_step is None else round(own_step, 1),
                "peers_step_us": None if peer_step is None else round(peer_step, 1),
                "steps_equal": equal,
                "min_distance": ctx.t.min_distance,
                "min_ratio": ctx.t.min_ratio,
            },
            severity=Severity.LOW if equal or equal is None else Severity.MEDIUM,
            ranks=[] if rank is None else [rank],
            steps=steps,
        )
