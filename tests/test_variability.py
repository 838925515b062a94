"""Variability (PRISM): op_step_stats, the composition (series covariance, product of CDFs), the
prediction at scale, sensitivity, the rule VAR001 and the section in every format.

Every expected number is worked out by hand in the test (or drawn from the generator's own
construction, ``tests/test_variability_cluster.py``), never pasted from the code's output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advisor import variability as var
from advisor.analyze import analyze, analyze_context
from advisor.config import Config
from advisor.render import html, markdown, terminal
from advisor.stages import variability as var_stage
from advisor.testing import context_from_tables
from tests.conftest import report_json, validate_report
from tests.test_variability_cluster import STEPS, draw, true_step_ms, write_cluster

# one worker runs this module: its module-scoped fixtures are built once
pytestmark = pytest.mark.xdist_group("variability")

MS = 1_000_000
BASE = 1_700_000_000_000_000_000
HOST = {"pid": "1", "tid": "1", "device": False}
DEV = {"pid": "0", "tid": "7", "device": True, "stream": 7}


def _cluster(compute_ms: list[list[float]], comm_ms: float = 2.0, extra: dict[str, list[list[float]]] | None = None,
             group: str = "g") -> dict[str, list[dict[str, Any]]]:
    """Ranks x steps: each rank runs kernel ``k`` (``compute_ms``), then kernels of ``extra`` one after
    another, then an AllReduce that ends on every rank ``comm_ms`` after the last rank arrives."""
    ev: list[dict[str, Any]] = []
    co: list[dict[str, Any]] = []
    ranks, steps = len(compute_ms), len(compute_ms[0])
    t = BASE
    for s in range(steps):
        work = [compute_ms[r][s] + sum(x[r][s] for x in (extra or {}).values()) for r in range(ranks)]
        end = t + int((max(work) + comm_ms) * MS)
        for r in range(ranks):
            ev.append({"rank": r, "kind": "step", "name": f"ProfilerStep#{s}", "start_ns": t, "dur_ns": end - t,
                       "cat": "user_annotation", **HOST})
            at = t
            for name, d in (("k", compute_ms[r][s]), *((n, x[r][s]) for n, x in (extra or {}).items() if x[r][s])):
                ev.append({"rank": r, "kind": "kernel", "name": name, "start_ns": at, "dur_ns": int(d * MS), **DEV})
                at += int(d * MS)
            ev.append({"rank": r, "kind": "comm", "name": "nccl:all_reduce", "start_ns": at, "dur_ns": end - at, **DEV})
            co.append({"rank": r, "step": s, "name": "nccl:all_reduce", "op_type": "allreduce", "group_name": group,
                       "start_ns": at, "dur_ns": end - at})
        t = end + 1000
    return {"events": ev, "comm_ops": co}


# -- op_step_stats ---------------------------------------------------------------------------------
def test_op_step_stats_sums_device_ops_and_host_ops_of_ranks_without_a_device() -> None:
    us = 1000
    ev = [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#0", "start_ns": 0, "dur_ns": 100 * us, **HOST},
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 100 * us, "dur_ns": 100 * us, **HOST},
        {"rank": 0, "kind": "host_op", "name": "aten::mm", "start_ns": 1 * us, "dur_ns": 5 * us, **HOST},
        {"rank": 0, "kind": "kernel", "name": "k", "start_ns": 10 * us, "dur_ns": 2 * us, **DEV},
        {"rank": 0, "kind": "kernel", "name": "k", "start_ns": 20 * us, "dur_ns": 3 * us, **DEV},
        {"rank": 0, "kind": "comm", "name": "c", "start_ns": 30 * us, "dur_ns": 5 * us, **DEV},
        {"rank": 0, "kind": "kernel", "name": "k", "start_ns": 110 * us, "dur_ns": 4 * us, **DEV},
        # rank 1: CPU only -- its host collective and its top-level operators (not the nested one)
        {"rank": 1, "kind": "step", "name": "ProfilerStep#0", "start_ns": 0, "dur_ns": 100 * us, **HOST},
        {"rank": 1, "kind": "host_op", "name": "outer", "start_ns": 0, "dur_ns": 10 * us, **HOST},
        {"rank": 1, "kind": "host_op", "name": "inner", "start_ns": 1 * us, "dur_ns": 2 * us, **HOST},
        {"rank": 1, "kind": "comm", "name": "gloo:all_reduce", "start_ns": 20 * us, "dur_ns": 7 * us, **HOST},
    ]
    ctx = context_from_tables({"events": ev}, run_stages=False)
    ctx.ensure_derived(["op_step_stats"])
    got = {(r, s, k, n): rest for r, s, k, n, *rest in
           ctx.con.execute("SELECT rank, step, kind, name, n, total_ns, min_ns, max_ns, sumsq_ns2 FROM op_step_stats")
           .fetchall()}
    assert got == {
        (0, 0, "kernel", "k"): [2, 5 * us, 2 * us, 3 * us, float((2 * us) ** 2 + (3 * us) ** 2)],
        (0, 1, "kernel", "k"): [1, 4 * us, 4 * us, 4 * us, float((4 * us) ** 2)],
        (0, 0, "comm", "c"): [1, 5 * us, 5 * us, 5 * us, float((5 * us) ** 2)],
        (1, 0, "comm", "gloo:all_reduce"): [1, 7 * us, 7 * us, 7 * us, float((7 * us) ** 2)],
        (1, 0, "host_op", "outer"): [1, 10 * us, 10 * us, 10 * us, float((10 * us) ** 2)],
    }


# -- composition by hand -------------------------------------------------------------------------
def test_the_maximum_over_ranks_is_the_product_of_their_cdfs() -> None:
    # rank A: 1 or 2, rank B: 1 or 3, equally likely. P(max = 1) = 1/4, P(max = 2) = F_A(2) F_B(2) - 1/4 = 1/2 - 1/4,
    # P(max = 3) = 1 - 1/2
    support, mass = var.max_distribution(np.array([[1.0, 2.0], [1.0, 3.0]]))
    assert support.tolist() == [1.0, 2.0, 3.0]
    assert mass.tolist() == pytest.approx([0.25, 0.25, 0.5])
    st = var.dist_stats(support, mass)
    assert st["mean_us"] == pytest.approx(2.25)
    assert st["var"] == pytest.approx(0.25 * 1.25 ** 2 + 0.25 * 0.25 ** 2 + 0.5 * 0.75 ** 2)
    assert (st["p50_us"], st["p95_us"]) == (2.0, 3.0)


def test_prediction_is_the_pooled_cdf_to_the_power_n() -> None:
    # F at 1, 2, 3, 4 = 1/4 .. 1; at n = 2, F^2 = 1/16, 4/16, 9/16, 1: median 3 (first >= 1/2), p95 4 (the sample's
    # maximum: a lower bound), mean (1*1 + 2*3 + 3*5 + 4*7) / 16; P(step > 2 * 1.05) = 1 - (2/4)^2
    p = var.predict_max(np.array([4.0, 1.0, 3.0, 2.0]), 2, baseline=2.0)
    assert (p["p50_us"], p["p95_us"], p["extrapolated"]) == (3.0, 4.0, True)
    assert p["mean_us"] == pytest.approx(50 / 16, abs=1e-3)
    assert p["p_slowdown_5"] == pytest.approx(0.75)
    # n = 1 is the sample itself: median 2 (first with F >= 1/2), nothing beyond the range at p95 ... but 0.95 > 3/4
    one = var.predict_max(np.array([1.0, 2.0, 3.0, 4.0]), 1, baseline=2.0)
    assert one["p50_us"] == 2.0 and one["mean_us"] == pytest.approx(2.5)


def test_series_shares_are_covariances_with_the_step() -> None:
    # one rank, 8 steps: A's deviations +-2, B's +-1, uncorrelated: variances 4 and 1, shares 4/5 and 1/5
    a = [10 + d for d in (2, 2, -2, -2, 2, 2, -2, -2)]
    b = [5 + d for d in (1, -1, 1, -1, 1, -1, 1, -1)]
    ctx = context_from_tables(_cluster([a], comm_ms=0.0, extra={"b": [b]}))
    v = var_stage.compute(ctx)
    assert v is not None
    shares = {o["name"]: o["series_share"] for o in v["ops"]}
    assert shares["k"] == pytest.approx(0.8, abs=1e-3) and shares["b"] == pytest.approx(0.2, abs=1e-3)
    assert "one rank" in v["note"] and "prediction" not in v


def test_own_time_is_the_step_without_the_wait_for_the_last_rank() -> None:
    # rank 0 computes 10 ms, rank 1 10..14 ms; the AllReduce ends 2 ms after the last arrival on both. Rank 0 waits
    # in it for rank 1; its own time is 10 + 2 ms, rank 1's its compute + 2 ms, the step the larger one
    c0 = [10.0] * 6
    c1 = [10.0, 11.0, 12.0, 13.0, 14.0, 12.0]
    ctx = context_from_tables(_cluster([c0, c1]))
    v = var_stage.compute(ctx)
    assert v is not None and v["steps"] == 6
    own = sorted([12.0] * 6 + [c + 2.0 for c in c1])
    assert v["own_time"]["p50_us"] == pytest.approx(float(np.median(own)) * 1000, abs=1)
    assert v["own_time"]["wait_mean_us"] == pytest.approx(np.mean([c - 10.0 for c in c1]) / 2 * 1000, abs=1)
    assert v["step_time"]["p50_us"] == pytest.approx((float(np.median(c1)) + 2.0) * 1000, abs=1)
    ar = next(o for o in v["ops"] if o["kind"] == "comm")
    assert ar["name"] == "allreduce" and ar["group"] == "g"
    assert ar["p50_us"] == pytest.approx(2000, abs=1)  # the last arrival's time in it: the transfer
    assert ar["measured"]["p95_us"] > 2000  # the waits, left out of its own part
    # all the variance is rank 1's kernel: holding k at its median removes it
    assert v["ops"][0]["name"] == "k" and v["ops"][0]["parallel_share"] == pytest.approx(1.0, abs=1e-6)
    tp = v["sensitivity"]["tp"]
    assert tp["group_sizes"] == [2] and next(r for r in tp["rows"] if r["size"] == 2)["in_profile"]


def test_without_comm_ops_the_waits_come_from_the_collectives_of_op_step_stats() -> None:
    # the same two ranks as above, with no comm_ops rows (as a CPU-only gloo trace): the AllReduce
    # events themselves give the waits, per name
    c1 = [10.0, 11.0, 12.0, 13.0, 14.0, 12.0]
    rows = _cluster([[10.0] * 6, c1])
    del rows["comm_ops"]
    v = var_stage.compute(context_from_tables(rows))
    assert v is not None
    own = sorted([12.0] * 6 + [c + 2.0 for c in c1])
    assert v["own_time"]["p50_us"] == pytest.approx(float(np.median(own)) * 1000, abs=1)
    ar = next(o for o in v["ops"] if o["kind"] == "comm")
    assert ar["name"] == "nccl:all_reduce" and ar["group"] is None and ar["p50_us"] == pytest.approx(2000, abs=1)


def test_an_operator_of_some_ranks_is_described_on_those_ranks() -> None:
    # kernel x runs on rank 1 only, 1..6 ms: its distribution is rank 1's (median 3.5 ms), not diluted by rank 0
    x = [0.0] * 6, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    v = var_stage.compute(context_from_tables(_cluster([[10.0] * 6, [10.0] * 6], extra={"x": list(x)})))
    assert v is not None
    op = next(o for o in v["ops"] if o["name"] == "x")
    assert op["ranks"] == 1 and op["p50_us"] == pytest.approx(3500, abs=1) and op["slowest_rank"] == 1
    assert op["spatial_sigma_us"] == 0.0 and op["temporal_sigma_us"] == pytest.approx(float(np.std(x[1])) * 1000, abs=1)
    # rank 1 is the slowest every step and x is all its variance
    assert op["parallel_share"] == pytest.approx(1.0, abs=1e-6)


def test_pipeline_stage_with_least_slack_is_hurt_most() -> None:
    # a chain 0-1-2-3 of send / receive links; step 130 ms everywhere. Slack per stage: the median of step - own
    # time (70, 30, 10, 5). The slowdown put on each stage in turn: p95 - p50 of the 20 pooled own times (numpy's
    # linear interpolation): sorted, p50 = (120 + 120) / 2 = 120 (positions 9, 10), p95 at position 18.05 =
    # 130 + 0.05 * (150 - 130) = 131: 11 ms, which only the stage with 5 ms of slack cannot absorb (+6 ms).
    # Each stage's own p95 - p50 beside it: the 5th value weighs 0.8
    links = [{"rank": a, "step": 0, "group_name": "pp", "name": "nccl:send", "src_rank": a, "dst_rank": b}
             for a, b in ((0, 1), (1, 2), (2, 3), (3, 2))]
    ev = [{"rank": r, "kind": "step", "name": "ProfilerStep#0", "start_ns": 0, "dur_ns": MS, **HOST} for r in range(4)]
    ctx = context_from_tables({"events": ev, "comm_matrix": links}, run_stages=False)
    own = np.array([[60, 60, 60, 60, 80], [100, 100, 100, 100, 120], [120, 120, 120, 120, 150],
                    [125, 125, 125, 125, 130]], dtype=float)
    pp = var._pipeline(ctx.df, {r: r for r in range(4)}, np.full((4, 5), 130.0), own)
    assert pp is not None
    got = {s["stage"]: (s["slack_us"], s["p95_excess_us"], s["step_increase_us"]) for s in pp["stages"]}
    assert got == {0: (70.0, 16.0, 0.0), 1: (30.0, 16.0, 0.0), 2: (10.0, 24.0, 1.0), 3: (5.0, 4.0, 6.0)}
    assert pp["slowdown_us"] == 11.0 and pp["most_sensitive_stage"] == 3


# -- the 8 -> 64 prediction, one seed (the five seeds, through two generated profiles: test_variability_cluster)
def test_prediction_from_8_ranks_matches_the_generated_64_rank_distribution(tmp_path: Path) -> None:
    data = report_json(analyze(write_cluster(tmp_path / "r8", draw(8, STEPS, 1))))
    pred = next(r for r in data["variability"]["prediction"]["rows"] if r["ranks"] == 64)
    truth = true_step_ms(draw(64, STEPS, 101)) * 1000  # the construction: the last rank's work plus the transfer
    assert pred["p50_us"] == pytest.approx(float(np.median(truth)), rel=0.05)
    assert pred["p95_us"] == pytest.approx(float(np.percentile(truth, 95)), rel=0.10)
    # at the profile's own scale the model reproduces the measured distribution
    one = data["variability"]["prediction"]["rows"][0]
    assert one["scale"] == 1 and one["p50_us"] == pytest.approx(one["measured_p50_us"], rel=0.02)
    # a GEMM that straggles 5 % of the time: the step's p95 is ~ 16 % above its median, all of it the GEMM
    (f,) = [f for f in data["findings"] if f["rule"] == "VAR001"]
    assert f["ops"] == ["gemm"] and f["evidence"]["variance_share"] > 0.9
    assert 0 < f["estimated_saving_us"] <= data["variability"]["step_time"]["p50_us"]


# -- alarms ------------------------------------------------------------------------------------------
def test_a_steady_cluster_gets_the_section_and_no_alarm() -> None:
    rng = np.random.default_rng(3)
    c = (100 + rng.normal(0, 0.3, (4, 12))).tolist()
    report = analyze_context(context_from_tables(_cluster(c)))
    data = report_json(report)
    assert data["variability"]["prediction"]["rows"]
    assert not [f for f in report.findings if f.rule == "VAR001"]
    assert "The step time is steady" in markdown.render(data)


def test_few_steps_are_said_not_guessed() -> None:
    c = [[10.0, 30.0, 10.0], [10.0, 10.0, 10.0]]
    report = analyze_context(context_from_tables(_cluster(c)), Config(select=["VAR001"]))
    data = report_json(report)
    v = data["variability"]
    assert v["steps"] == 3 and "fewer than 5" in v["note"]
    assert "prediction" not in v and "model" not in v and not report.findings


# -- rendering -------------------------------------------------------------------------------------
EVIL = "<script>alert('x')</script>|*_"


@pytest.fixture(scope="module")
def evil_report() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    c = (80 + rng.normal(0, 2, (4, 10)) * np.where(rng.random((4, 10)) < 0.1, 8, 1)).tolist()
    rows = _cluster(c, group=EVIL)
    for e in rows["events"]:
        if e["name"] == "k":
            e["name"] = EVIL
    return report_json(analyze_context(context_from_tables(rows)))


def test_section_in_every_format_escapes_profile_strings(evil_report: dict[str, Any]) -> None:
    validate_report(evil_report)
    assert evil_report["variability"]["ops"][0]["name"] == EVIL
    md = markdown.render(evil_report)
    sec = md[md.index("### Variability"):]
    assert "<script>" not in sec and "&lt;script&gt;" in sec and "P(>+10 %)" in sec
    assert len(sec[:sec.find("### ", 5) if "### " in sec[5:] else None]) < 5_000
    page = html.render(evil_report)
    assert 'id="variability"' in page and "<script>alert" not in page and "&lt;script&gt;" in page
    import io

    buf = io.StringIO()
    terminal.print_report(evil_report, file=buf, width=140, color=False)
    out = buf.getvalue()
    assert "Variability" in out and EVIL in out and "Assumption:" in out


def test_markdown_section_is_bounded_for_long_names(evil_report: dict[str, Any]) -> None:
    d = json.loads(json.dumps(evil_report))
    for o in d["variability"]["ops"]:
        o["name"] = "x" * 5000
    md = markdown.render(d)
    sec = md[md.index("### Variability"):md.index("### Confidence")]
    assert len(sec) < 5_000


def test_a_failing_variability_analysis_is_a_warning_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> None:
        raise ValueError("broken model")

    monkeypatch.setattr(var, "compute", boom)
    report = analyze_context(context_from_tables(_cluster([[10.0] * 6, [11.0] * 6])), Config(select=["CLU001"]))
    data = report_json(report)
    assert "variability" not in data
    assert [w for w in data["warnings"] if w["code"] == "variability_failed" and "broken model" in w["message"]]
