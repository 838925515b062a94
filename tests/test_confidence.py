"""The report's confidence: reduced only by rules that apply but lack data (or failed, or input
warnings); rules that cannot apply to the profile (one rank, a CPU-only trace, no communication,
an Ascend-export table on a Kineto trace) are listed as not applicable and reduce nothing."""

from __future__ import annotations

from advisor.config import Config
from advisor.engine.registry import discover
from advisor.engine.runner import run_rules
from advisor.render.markdown import render as markdown
from advisor.render.view import confidence
from advisor.testing import context_from_tables
from tests.conftest import ROOT, profile_group, report_json, shared_report

HEALTHY = ROOT / "sample_profiles" / "kineto_cpu_healthy"


@profile_group(HEALTHY)
def test_the_healthy_sample_has_full_confidence_and_lists_what_does_not_apply() -> None:
    """The healthy sample is one rank (rank 0) of a CPU-only Kineto trace: every rule needing
    several ranks or a device cannot apply, and none is skipped for want of data."""
    d = report_json(shared_report(HEALTHY))
    assert d["profile"]["ranks"] == [0] and d["profile"]["cpu_only"] is True
    specs = discover()
    by_rule = {r["rule"]: r for r in d["rules"]}
    cannot = {rid for rid, s in specs.items() if {"multi_rank", "device"} & set(s.requires) and rid in by_rule}
    assert cannot and all(by_rule[rid]["applicable"] is False for rid in cannot)
    assert all(r["applicable"] for r in d["rules"] if r["status"] == "ran")
    conf = confidence(d)
    assert conf["level"] == "full"
    assert conf["skipped"] == []
    assert {r["rule"] for r in conf["not_applicable"]} >= cannot
    assert "not applicable" in conf["summary"]
    assert "rule(s) not applicable to this profile" in markdown(d)


def test_a_rule_that_applies_but_lacks_data_reduces_confidence() -> None:
    """One rank with one step: the step-fluctuation rule (CLU003, two steps needed) applies to a
    single-rank job but has too little data; the slow-rank rule (CLU001) cannot apply to one rank."""
    ctx = context_from_tables({"events": [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "host_op", "name": "aten::mm", "start_ns": 10, "dur_ns": 50},
    ]})
    _, outcomes = run_rules(ctx, Config(select=["CLU001", "CLU003"]))
    got = {o.rule: (o.status, o.applicable) for o in outcomes if o.status != "not_selected"}
    assert got == {"CLU001": ("skipped", False), "CLU003": ("skipped", True)}
    rules = [{"rule": o.rule, "status": o.status, "reason": o.reason, "applicable": o.applicable} for o in outcomes]
    conf = confidence({"rules": rules, "warnings": [], "profile": {}, "breakdown": [{}]})
    assert conf["level"] == "reduced"
    assert [r["rule"] for r in conf["skipped"]] == ["CLU003"]
    assert [r["rule"] for r in conf["not_applicable"]] == ["CLU001"]
    # a report written before the field existed: every skipped rule counts, as it did
    old = confidence({"rules": [{"rule": "CLU001", "status": "skipped", "reason": "single rank"}], "warnings": [],
                      "profile": {}, "breakdown": [{}]})
    assert old["level"] == "reduced"
