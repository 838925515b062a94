"""Twins: one job recorded with a planted cause and again with the cause fixed (tests/data/twins).

On every twin, the saving the advisor predicts for the planted cause (its what-if replay where the
rule states a counterfactual, else the rule's own estimate) is within 30 % of the step change the
fix measured, the planted cause is the verdict on the cause side, and the fixed side raises nothing
of medium or more for that cause. The measured change is read here from the raw JSON, apart from the
advisor: the mean ``ProfilerStep#N`` duration (per step, the slowest rank's) with the cause less the
mean without it.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from advisor.analyze import analyze
from advisor.model import Finding, Report, Severity
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

TWINS = ROOT / "tests" / "data" / "twins"
WITHIN = 0.30


def measured_steps(side: Path) -> dict[str, float]:
    """ProfilerStep#N -> its duration (µs), per step the slowest rank's (one file per rank)."""
    out: dict[str, float] = defaultdict(float)
    for p in sorted(side.glob("*.pt.trace.json.gz")):
        with gzip.open(p, "rt", encoding="utf-8") as fh:
            for e in json.load(fh)["traceEvents"]:
                if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
                    out[e["name"]] = max(out[e["name"]], float(e["dur"]))
    return dict(out)


def noise(twin: str) -> float:
    """The standard error of the measured change (µs), from the spread of each side's steps."""
    import statistics

    se2 = 0.0
    for s in ("cause", "fixed"):
        v = list(measured_steps(TWINS / twin / s).values())
        se2 += statistics.variance(v) / len(v)
    return float(se2 ** 0.5)


def measured_change(twin: str) -> tuple[float, float, float]:
    """(mean step with the cause, mean step fixed, their difference), µs."""
    with_cause, fixed = (measured_steps(TWINS / twin / s) for s in ("cause", "fixed"))
    a, b = sum(with_cause.values()) / len(with_cause), sum(fixed.values()) / len(fixed)
    return a, b, a - b


@functools.cache
def report(twin: str, side: str) -> Report:
    return analyze(TWINS / twin / side)


def planted(rep: Report, cause: str) -> list[Finding]:
    return [f for f in rep.findings if f.cause == cause]


def best(rep: Report, cause: str) -> Finding | None:
    """The finding of ``cause`` with the largest saving: the report's prediction for fixing it (the
    replayed saving where the rule replays and every step reproduces, else the rule's own figure)."""
    found = planted(rep, cause)
    return max(found, key=lambda f: f.estimated_saving_us or 0.0) if found else None


#: twin -> the cause planted in it (docs/CAUSES.md), and why it misses where it does
CASES: dict[str, tuple[str, str | None]] = {
    "slow_dataloader": ("io.slow_data_processing", None),
    "python_gc": ("cpu.garbage_collection", None),
    "tiny_ops": ("cpu.operator_dispatch", None),
    "dynamic_shapes": ("cpu.operator_compilation", None),
    "step_outlier": ("cluster.step_fluctuation", None),
    "straggler": ("cluster.slow_rank", None),
    "ddp_buckets": ("comm.small_packet", None),
}


def _params() -> list[Any]:
    return [pytest.param(t, c, id=t, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [])
            for t, (c, why) in CASES.items()]


@pytest.mark.parametrize(("twin", "cause"), _params())
def test_predicted_saving_is_the_measured_change(twin: str, cause: str) -> None:
    _, _, change = measured_change(twin)
    f = best(report(twin, "cause"), cause)
    assert f is not None, f"{twin}: no {cause} finding on the cause side"
    saving = f.estimated_saving_us
    assert saving is not None, f"{twin}: {f.rule} predicts no saving"
    assert abs(saving - change) <= WITHIN * abs(change), (twin, f.rule, saving, change)


@pytest.mark.parametrize(("twin", "cause"), _params())
def test_the_planted_cause_is_the_verdict(twin: str, cause: str) -> None:
    rep = report(twin, "cause")
    assert rep.savings is not None
    verdict = next((f for f in rep.findings if f.id == rep.savings.get("verdict")), None)
    assert verdict is not None and verdict.cause == cause, (twin, verdict and (verdict.rule, verdict.cause))


@pytest.mark.parametrize("twin", [*CASES, "host_sync"])
def test_the_fixed_side_raises_nothing_for_the_cause(twin: str) -> None:
    cause = CASES[twin][0] if twin in CASES else "cpu.host_device_sync"
    loud = [f for f in planted(report(twin, "fixed"), cause) if f.severity >= Severity.MEDIUM]
    assert not loud, [(f.rule, f.severity.label, f.estimated_saving_us) for f in loud]


def test_a_sync_that_does_not_block_saves_nothing() -> None:
    """``.item()`` on a CPU-only build never waits for a device: the fix measures no change (within
    two standard errors of the steps' noise), and CPU003 reports the reads without a saving."""
    _, _, change = measured_change("host_sync")
    assert abs(change) <= 2 * noise("host_sync")
    (f,) = planted(report("host_sync", "cause"), "cpu.host_device_sync")
    assert f.severity < Severity.MEDIUM
    assert not (f.estimated_saving_us or 0.0)
    assert f.replay is None or not f.replay.get("saving_us")


def table() -> str:
    """The benchmarks/README.md table: per twin, the predicted saving, the measured change (± its
    standard error), their ratio (``python -m tests.test_twins``)."""
    rows = ["| twin | planted cause | rule | predicted saving | measured change | predicted / measured |",
            "|---|---|---|---:|---:|---:|"]
    for twin, cause in [*((t, c) for t, (c, _) in CASES.items()), ("host_sync", "cpu.host_device_sync")]:
        with_cause, fixed, change = measured_change(twin)
        f = best(report(twin, "cause"), cause)
        saving = f.estimated_saving_us if f else None
        ratio = f"{saving / change:.2f}" if saving is not None and change else "-"
        rows.append(f"| {twin} | {cause} | {f.rule if f else '-'} | "
                    f"{'-' if saving is None else f'{saving / 1000:.1f} ms'} | "
                    f"{change / 1000:.1f} ± {noise(twin) / 1000:.1f} ms ({with_cause / 1000:.1f} → "
                    f"{fixed / 1000:.1f}) | {ratio} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
