"""The hardware rules (HW001-HW005) and CMP005 on the full synthetic job of tests/hardware_fixtures.py
(8 ranks x 10 steps of 100 ms, every series): each planted case is found by its rule, the healthy
set stays quiet, the chain links a throttled device to the slow rank it causes, and a rule that
cannot decide says so. Expected figures are worked out from the fixture's stated levels."""

from __future__ import annotations

from typing import Any

import pytest

from advisor.analyze import analyze_context
from advisor.config import Config
from advisor.model import Report
from advisor.testing import context_from_tables
from tests.conftest import report_json
from tests.hardware_fixtures import insert_series, job, series

HW_RULES = {"HW001", "HW002", "HW003", "HW004", "HW005", "CMP005"}


def _run(*, extra: tuple[str, ...] = (), **kw: Any) -> Report:
    """The job's report with the hardware rules (and ``extra``) only."""
    return analyze_context(job(**kw), Config(select=sorted(HW_RULES | set(extra))))


def _hw(rep: Report) -> list[Any]:
    return [f for f in rep.findings if f.rule in HW_RULES]


def test_healthy_series_stay_quiet() -> None:
    rep = _run()
    report_json(rep)
    assert _hw(rep) == []
    ran = {o.rule: o.status for o in rep.rules if o.rule in HW_RULES}
    assert ran == dict.fromkeys(HW_RULES, "ran")


#: one job, one planted case per device (0 and 7 healthy, 4 left alone: tests/rules/cases/HW004.toml
#: plants a diverging device on its own, as a job where most devices differ has no typical device)
PLANTS = {"underfill": 1, "saturate": 2, "throttle": (3, 5), "leak": 5, "nvlink_off": 6}
EXPECT = {"HW001": 1, "HW002": 2, "CMP005": 3, "HW005": 5, "HW003": 6}


@pytest.fixture(scope="module")
def planted() -> Report:
    rep = _run(plants=PLANTS)
    report_json(rep)
    return rep


def test_each_planted_case_is_found_by_its_rule(planted: Report) -> None:
    found = _hw(planted)
    assert sorted((f.rule, f.ranks) for f in found if f.rule != "HW004") == sorted(
        (rule, (rank,)) for rule, rank in EXPECT.items())
    # the devices also diverge from their peers (HW004), each explained by its own planted cause
    by_rank = {f.ranks: f.id for f in found if f.rule != "HW004"}
    for f in found:
        if f.rule == "HW004":
            assert f.ranks in by_rank and f.explained_by == (by_rank[f.ranks],)
    # a saving is never above the 100 ms step
    assert all(f.estimated_saving_us is None or f.estimated_saving_us <= 100_000 for f in found)
    assert not [f for f in found if 0 in f.ranks or 7 in f.ranks or 4 in f.ranks]


def test_savings_follow_from_the_planted_levels(planted: Report) -> None:
    got = {f.rule: f for f in _hw(planted) if f.rule != "HW004"}
    # HW001: 60 ms of kernel per step x (1 - 15/95)
    assert got["HW001"].estimated_saving_us == pytest.approx(60_000 * (1 - 15 / 95), rel=0.01)
    # ... and the other phases as planted: communicating 90 % busy / 20 % SMs, idle 3 % / 1 %
    ev = got["HW001"].evidence
    assert (ev["busy_comm_pct"], ev["active_comm_pct"], ev["busy_idle_pct"], ev["active_idle_pct"]) == \
        pytest.approx((90.0, 20.0, 3.0, 1.0), abs=0.5)
    # HW003: 30 ms exposed communication x (1 - 20/300)
    assert got["HW003"].estimated_saving_us == pytest.approx(30_000 * (1 - 20 / 300), rel=0.01)
    # HW002: 295 of 300 GB/s while communicating
    assert got["HW002"].evidence["share"] == pytest.approx(295 / 300, abs=0.005)
    # HW005: 50 GB + 1 GB per step after the first, 80 GB: 59 GB at step 10 -> step 10 + 21
    assert got["HW005"].evidence["run_out_step"] == 31
    # CMP005: steps 5-10 at 1100 of 1410 MHz, 60 ms of kernel each
    f = got["CMP005"]
    assert f.steps == (5, 6, 7, 8, 9, 10)
    assert f.evidence["drop"] == pytest.approx(1 - 1100 / 1410, abs=0.002)
    assert f.estimated_saving_us == pytest.approx(60_000 * (1 - 1100 / 1410), rel=0.01)
    assert f.evidence["why"] == "power at its cap, hot"


def test_throttled_device_explains_the_slow_rank() -> None:
    """Rank 3 at 1100 MHz in every step and its kernel 1410/1100 times longer: CLU001 names it the
    straggler, CMP005 explains it (and the divergence of its power series)."""
    rep = _run(plants={"throttle": (3, 1)}, slow=(3, 1410 / 1100), extra=("CLU001",))
    report_json(rep)
    clu = [f for f in rep.findings if f.rule == "CLU001"]
    cmp5 = [f for f in rep.findings if f.rule == "CMP005"]
    assert len(clu) == 1 and clu[0].ranks == (3,) and len(cmp5) == 1
    assert cmp5[0].id in clu[0].explained_by
    assert clu[0].id in cmp5[0].explains


def test_unranked_devices_without_events() -> None:
    """Series that name only node/device, no trace events: the devices are judged on every sample;
    rank 1's busy-but-idle SMs: util (12 x 95 + 6 x 90 + 2 x 3) / 20 = 84.3 %, SM activity
    (12 x 15 + 6 x 20 + 2 x 1) / 20 = 15.1 %."""
    ctx = context_from_tables({})
    insert_series(ctx, series(plants={"underfill": 1}, ranked=False))
    rep = analyze_context(ctx, Config(select=sorted(HW_RULES)))
    report_json(rep)
    f = [f for f in rep.findings if f.rule == "HW001"]
    assert len(f) == 1 and f[0].ranks == () and f[0].evidence["device"] == "node0/GPU-1"
    assert f[0].evidence["busy_pct"] == pytest.approx(84.3, abs=1.0)
    assert f[0].evidence["active_pct"] == pytest.approx(15.1, abs=0.3)
    assert f[0].evidence["over"] == "whole profile"
    notes = " ".join(w.message for w in rep.warnings)
    assert "HW003" in notes and "communication phases unknown" in notes


def test_rules_that_cannot_decide_say_so() -> None:
    """An unknown device (no link figure, no nominal clock) and no activity series."""
    tables = {"ranks": [{"rank": r, "source": "kineto", "device_name": "Mystery GPU", "has_device": True,
                         "rank_source": "test", "files": ""} for r in range(2)]}
    ctx = context_from_tables(tables)
    insert_series(ctx, series(n_dev=2, n_steps=2, metrics=("util_gpu_pct", "nvlink_tx_bps", "clock_sm_mhz")))
    rep = analyze_context(ctx, Config(select=sorted(HW_RULES)))
    notes = {w.message.split(" ", 1)[0]: w.message for w in rep.warnings if w.code == "rule_undecided"}
    assert "link peak unknown" in notes["HW002"]
    assert "activity series" in notes["HW001"]
    assert "nominal clock" in notes["CMP005"]
    assert not _hw(rep)


def test_a_step_with_too_few_clock_samples_is_not_slowed() -> None:
    """Rank 2's step 3 keeps two of its six compute samples, both at 1100 MHz (every other sample at
    1410): two samples are under the 3-sample floor, so no step is slowed, and the mean over all of
    rank 2's 20 compute samples, (18 x 1410 + 2 x 1100) / 20 = 1379 MHz, is 2.2 % below nominal."""
    from tests.hardware_fixtures import MS, T0, events

    ctx = context_from_tables(events(4, 4))
    df = series(n_dev=4, n_steps=4, spp=10, metrics=("clock_sm_mhz",))
    t = df["ts_ns"] - T0
    step3_compute = (df["rank"] == 2) & (t >= 200 * MS) & (t < 260 * MS)
    assert step3_compute.sum() == 6
    drop = step3_compute & (t >= 220 * MS)
    df.loc[step3_compute & ~drop, "value"] = 1100.0
    insert_series(ctx, df[~drop])
    rep = analyze_context(ctx, Config(select=["CMP005"]))
    assert _hw(rep) == []
    # with the floor at two samples the step counts
    rep = analyze_context(ctx, Config(select=["CMP005"], overrides={"CMP005": {"min_step_samples": 2}}))
    assert [(f.rule, f.ranks, f.steps) for f in _hw(rep)] == [("CMP005", (2,), (3,))]
