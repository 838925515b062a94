"""Findings that explain each other across the variability and cluster rules (advisor.engine.explain,
advisor.engine.chain): VAR001 with CLU003 / CLU005, and the partial links (a slow pipeline stage and
the bubble, a rank slow in some steps and an operator's variability).

Generated contexts are 8 ranks x 12 steps of tests/test_variability.py's ``_cluster``: each rank runs
kernel ``k`` (100 ms, 160 ms in the planted cells), then an AllReduce that ends 2 ms after the last
rank arrives. Every expected figure is worked out in the comments from those planted times.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from advisor import variability
from advisor.analyze import analyze_context
from advisor.engine import chain
from advisor.engine.explain import annotate
from advisor.model import Finding, Severity
from advisor.testing import context_from_tables
from tests.conftest import report_json
from tests.test_variability import _cluster

RANKS, STEPS, BASE_MS, SLOW_MS = 8, 12, 100.0, 160.0


def _report(slow: list[tuple[int, int]]) -> dict[str, Any]:
    c = [[BASE_MS] * STEPS for _ in range(RANKS)]
    for r, s in slow:
        c[r][s] = SLOW_MS
    return report_json(analyze_context(context_from_tables(_cluster(c))))


def _one(data: dict[str, Any], rule: str) -> dict[str, Any]:
    (f,) = [f for f in data["findings"] if f["rule"] == rule]
    return f


def _f(rule: str, cause: str, saving: float | None, ranks: tuple[int, ...] = (0,), steps: tuple[int, ...] = (1, 2, 3),
       top: tuple[dict[str, Any], ...] = (), **evidence: Any) -> Finding:
    return Finding(rule=rule, cause=cause, severity=Severity.HIGH, title=f"{rule} on {ranks}", evidence=dict(evidence),
                   ranks=ranks, steps=steps, estimated_saving_us=saving, top=top)


# -- the operator's spikes ---------------------------------------------------------------------------------
def test_spikes_are_the_steps_whose_excess_the_operator_carries_on_the_rank_waited_for() -> None:
    # cluster step per step: median 100; steps 2 (150) and 4 (130) are more than 10 % above it, the others not.
    # Step 2 waits for rank 1 (own 150): the operator there is 60 against its median 10: 50 >= half of 50.
    # Step 4 waits for rank 0 (own 130): the operator there is 20, 10 above its median: less than half of 30.
    cells = {"ranks": [0, 1], "steps": [0, 1, 2, 3, 4],
             "cluster": np.array([100.0, 100.0, 150.0, 100.0, 130.0]),
             "own": np.array([[100.0, 99.0, 100.0, 100.0, 130.0], [98.0, 100.0, 150.0, 100.0, 100.0]]),
             "op": np.array([[10.0, 10.0, 10.0, 10.0, 20.0], [10.0, 10.0, 60.0, 10.0, 10.0]])}
    assert variability.spikes(cells, 0.10) == [{"step": 2, "rank": 1, "step_us": 150.0, "step_excess_us": 50.0,
                                                "op_us": 60.0, "op_excess_us": 50.0}]
    assert variability.spikes({}, 0.10) == []


# -- generated clusters --------------------------------------------------------------------------------------
def test_a_rank_slow_in_two_steps_explains_the_variability_it_causes() -> None:
    """Rank 5 runs k at 160 ms in steps 3 and 8: VAR001 (k explains the variance) has those two spikes,
    each rank 5's; CLU005 (rank 5 slow in 3 and 8) explains it, and both explain CLU003 (steps 3 and 8
    slow on every rank). One account: the root is CLU005, 2 x 60 ms over 12 steps = 10 ms."""
    d = _report([(5, 3), (5, 8)])
    var, rank_step, fluct = _one(d, "VAR001"), _one(d, "CLU005"), _one(d, "CLU003")
    assert var["evidence"]["op_spike_steps"] == "3, 8"
    assert [(x["rank"], x["step"], x["op_excess_us"], x["step_excess_us"]) for x in var["top"]] == [
        (5, 3, 60_000.0, 60_000.0), (5, 8, 60_000.0, 60_000.0)]
    assert rank_step["ranks"] == [5] and rank_step["steps"] == [3, 8] and fluct["steps"] == [3, 8]
    assert var["explained_by"] == [rank_step["id"]] and not var["root"]
    assert set(fluct["explained_by"]) == {rank_step["id"], var["id"]}
    assert rank_step["root"] and d["savings"]["roots"] == [rank_step["id"]]
    assert rank_step["estimated_saving_us"] == pytest.approx(10_000.0)
    assert d["savings"]["total_saving_us"] == pytest.approx(10_000.0)


def test_an_operator_that_also_varies_elsewhere_is_explained_by_the_rank_in_part() -> None:
    """k is slow on rank 5 in step 3 only, and on every rank in steps 6 and 9: CLU005 flags rank 5 in step 3
    (in 6 and 9 its peers are as slow), a third of k's spikes. Its saving, 60 ms over 12 steps = 5 ms, is
    under half of VAR001's, so it explains a part: VAR001 stays a root and counts its saving less 5 ms, and
    rank 5's total is VAR001's saving. VAR001 explains CLU003 (steps 3, 6, 9 all spikes)."""
    d = _report([(5, 3), *((r, s) for r in range(RANKS) for s in (6, 9))])
    var, rank_step, fluct = _one(d, "VAR001"), _one(d, "CLU005"), _one(d, "CLU003")
    assert var["evidence"]["op_spike_steps"] == "3, 6, 9"
    assert rank_step["ranks"] == [5] and rank_step["steps"] == [3]
    assert rank_step["estimated_saving_us"] == pytest.approx(5_000.0)
    assert var["root"] and var["evidence"]["explained_in_part_by"] == rank_step["id"]
    assert rank_step["evidence"]["explains_in_part"] == var["id"]
    assert var["evidence"]["unexplained_saving_us"] == pytest.approx(var["estimated_saving_us"] - 5_000.0)
    assert fluct["explained_by"] == [var["id"]]
    assert d["savings"]["total_saving_us"] == pytest.approx(var["estimated_saving_us"])


# -- annotate's tests on findings built by hand ----------------------------------------------------------------
SPIKES = ({"step": 3, "rank": 5}, {"step": 8, "rank": 5})


def _var(saving: float = 10_000.0) -> Finding:
    return _f("VAR001", "cluster.operator_variability", saving, ranks=tuple(range(8)), steps=(), top=SPIKES,
              op_spike_steps="3, 8")


def test_a_fluctuation_whose_slow_steps_are_not_the_spikes_is_not_explained() -> None:
    other = _f("CLU003", "cluster.step_fluctuation", 10_000.0, ranks=(0, 1), steps=(4, 8, 10))  # 1 of 3 a spike
    half = _f("CLU003", "cluster.step_fluctuation", 10_000.0, ranks=(0, 1), steps=(3, 4))  # 1 of 2
    got = chain.link(annotate([_var(), other, half]))
    assert got[1].root and not got[1].explained_by
    assert got[2].explained_by == (got[0].id,)
    # spikes beyond the 20 in top count by their steps: 4, 8 and 10 listed -> 3 of 3
    more = dataclasses.replace(_var(), evidence={"op_spike_steps": "3, 4, 8, 10"})
    assert chain.link(annotate([more, other]))[1].explained_by == (more.id,)


def test_a_rank_slow_in_some_steps_explains_only_where_the_spikes_are_its_own() -> None:
    elsewhere = _f("CLU005", "cluster.slow_rank_step", 10_000.0, ranks=(2,), steps=(3, 8))
    got = chain.link(annotate([_var(), elsewhere]))
    assert got[0].root and got[1].root and not got[0].explains and not got[1].explains
    assert "explained_in_part_by" not in got[0].evidence
    # merged over ranks 5 and 6, slow in steps 3, 8, 9: the spike is on one of them in 3 and 8, two of three
    merged = _f("CLU005", "cluster.slow_rank_step", 10_000.0, ranks=(5, 6), steps=(3, 8, 9))
    assert chain.link(annotate([_var(), merged]))[0].explained_by == (merged.id,)
    thin = _f("CLU005", "cluster.slow_rank_step", 10_000.0, ranks=(5, 6), steps=(3, 9, 10))  # one of three
    assert chain.link(annotate([_var(), thin]))[0].root
    # without annotate's placement the variability (every rank, no step) is linked to nothing
    here = _f("CLU005", "cluster.slow_rank_step", 10_000.0, ranks=(5,), steps=(3, 8))
    assert chain.link([_var(), here])[0].root


# -- a slow pipeline stage and the bubble ------------------------------------------------------------------------
def test_a_slow_stage_explains_the_bubble_on_the_other_stages() -> None:
    # stage ranks 0-1 slow by 10 ms; a 15 ms bubble on the stalled ranks 2-3: most of it, a full link
    stage = _f("CLU006", "cluster.slow_stage", 10_000.0, ranks=(0, 1), stalled_ranks="2-3")
    bubble = _f("PAR002", "parallel.pipeline_bubble", 15_000.0, ranks=(2, 3))
    got = chain.link([stage, bubble])
    assert got[1].explained_by == (stage.id,) and got[0].root


def test_a_bubble_more_than_twice_the_stage_is_explained_in_part() -> None:
    # 10 ms of a 30 ms bubble: the schedule's 20 ms beyond the stage is not the stage's
    stage = _f("CLU006", "cluster.slow_stage", 10_000.0, ranks=(0, 1), stalled_ranks="2-3")
    bubble = _f("PAR002", "parallel.pipeline_bubble", 30_000.0, ranks=(0, 1, 2, 3))
    got = chain.link([stage, bubble])
    assert got[0].root and got[1].root and not got[0].explains
    assert got[1].evidence["explained_in_part_by"] == stage.id
    assert got[1].evidence["unexplained_saving_us"] == 20_000.0
    assert got[0].evidence["explains_in_part"] == bubble.id
    # rank 0 counts the stage's 10 ms and the bubble's other 20 ms: 30 ms, not 40
    s = chain.summary(got, {r: 100_000.0 for r in range(4)})
    assert s["total_saving_us"] == 30_000.0 and set(s["roots"]) == {stage.id, bubble.id}
    # linking twice gives the same evidence; nothing to remove explains nothing
    assert chain.link(got)[1].evidence == got[1].evidence
    zero = _f("CLU006", "cluster.slow_stage", 0.0, ranks=(0, 1))
    assert "explained_in_part_by" not in chain.link([zero, bubble])[1].evidence
    # other cause pairs keep the all-or-nothing rule
    small = _f("CPU003", "cpu.host_device_sync", 1_000.0, steps=(1, 2, 3))
    gaps = _f("CPU002", "cpu.operator_dispatch", 2_500.0, steps=(1, 2, 3))
    assert "explained_in_part_by" not in chain.link([small, gaps])[1].evidence
