"""A finding's fixes are ordered by what its evidence supports (``prefer_if`` in rules/causes.toml):
supported first, those the evidence speaks against last, none dropped."""

from __future__ import annotations

import pytest

from advisor.causes import CauseError, CauseRegistry, condition_holds, optimizations_for, order_by_evidence
from tests.conftest import ROOT, profile_group, report_json, shared_report


def _ids(opts) -> list[str]:
    return [o.id for o in opts]


def test_bucketed_shapes_lead_only_where_operators_met_new_shapes() -> None:
    """CPU001 on a GPU: its map lists static shapes, then compiling for dynamic shapes. A finding
    whose evidence counts operators meeting new shapes keeps that order; one that counts none (the
    compile is not from shapes) shows static shapes last; one without the figure keeps the map's order."""
    opts = optimizations_for("cpu.operator_compilation", "cuda", ())
    assert _ids(opts) == ["static_shapes", "dynamic_compile"]
    ctx = {"ranks": 1, "finding_ranks": 1}
    assert _ids(order_by_evidence("cpu.operator_compilation", opts, {"ops_with_new_shapes": 44}, ctx)) == [
        "static_shapes", "dynamic_compile"]
    assert _ids(order_by_evidence("cpu.operator_compilation", opts, {"ops_with_new_shapes": 0}, ctx)) == [
        "dynamic_compile", "static_shapes"]
    assert _ids(order_by_evidence("cpu.operator_compilation", opts, {}, ctx)) == ["static_shapes", "dynamic_compile"]


def test_conditions_read_evidence_and_context() -> None:
    assert condition_holds("ranks >= 4", {}, {"ranks": 2}) is False
    assert condition_holds("ranks >= 4", {}, {"ranks": 8}) is True
    assert condition_holds("evidence.flag == true", {"flag": True}, {}) is True
    assert condition_holds("evidence.flag == true", {"flag": "yes"}, {}) is None  # not a number or boolean
    assert condition_holds("evidence.missing > 0", {}, {}) is None


def test_a_malformed_condition_is_a_cause_map_error() -> None:
    bad = '[causes."cpu.x"]\nmeaning = "m"\noptimizations = [{ id = "a", title = "A", prefer_if = ["ranks >> 4"] }]\n'
    with pytest.raises(CauseError, match="prefer_if"):
        CauseRegistry.from_toml(bad)


@profile_group(ROOT / "sample_profiles" / "kineto_two_ranks")
def test_a_two_rank_job_is_not_told_first_to_search_hybrid_parallel_splits() -> None:
    """kineto_two_ranks is two ranks (0, 1): no hybrid DP x TP/PP split exists at 2 ranks, so PAR001's
    automatic hybrid-parallel search comes last, still listed."""
    data = report_json(shared_report(ROOT / "sample_profiles" / "kineto_two_ranks"))
    assert data["profile"]["ranks"] == [0, 1]
    (par,) = [f for f in data["findings"] if f["rule"] == "PAR001"]
    ids = [o["id"] for o in par["optimizations"]]
    assert ids[-1] == "auto_parallel_search" and ids[0] != "auto_parallel_search"
    assert sorted(ids) == sorted(o.id for o in optimizations_for("parallel.poor_overlap", None, None))
