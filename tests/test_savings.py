"""One account of savings (advisor.engine.chain): the cap at the step, the chain of findings, the
total of the roots, and the verdict. Findings here are built by hand; every expected number is
worked out in the comments from the figures planted in them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from advisor.engine import chain
from advisor.model import Finding, Report, Severity
from tests.conftest import ROOT, TRACES, report_json, saving_problems

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _f(rule: str, cause: str, saving: float | None, ranks: tuple[int, ...] = (0,), steps: tuple[int, ...] = (1, 2, 3),
       fraction: float | None = None, severity: Severity = Severity.HIGH, **evidence: Any) -> Finding:
    return Finding(rule=rule, cause=cause, severity=severity, title=f"{rule} on {ranks}", evidence=dict(evidence),
                   ranks=ranks, steps=steps, estimated_saving_us=saving, saving_fraction=fraction)


def _by_rule(findings: list[Finding]) -> dict[str, Finding]:
    return {f.rule: f for f in findings}


# -- the cap --------------------------------------------------------------------------------------

def test_saving_above_the_step_is_capped_and_recorded() -> None:
    # 30 ms claimed on rank 0 whose median step is 20 ms: capped at 20 ms, the claim kept in evidence
    f = _f("CLU003", "cluster.step_fluctuation", 30_000.0, fraction=0.6, severity=Severity.CRITICAL)
    (got,) = chain.cap_savings([f], {0: 20_000.0})
    assert got.estimated_saving_us == 20_000.0
    assert got.evidence["saving_capped_from_us"] == 30_000.0
    assert "capped at the step" in got.saving_basis
    assert got.saving_fraction == 0.6 and got.severity is Severity.CRITICAL


def test_cap_is_the_median_step_of_the_ranks_named() -> None:
    med = {0: 10_000.0, 1: 20_000.0, 2: 40_000.0}
    two = _f("X", "cpu.operator_dispatch", 50_000.0, ranks=(0, 1))
    none = _f("Y", "cpu.operator_dispatch", 50_000.0, ranks=())
    a, b = chain.cap_savings([two, none], med)
    assert a.estimated_saving_us == 15_000.0  # median of 10 and 20 ms
    assert b.estimated_saving_us == 20_000.0  # no rank named: median of all three ranks' steps


def test_a_spike_amortised_over_the_steps_is_capped_at_the_mean_step() -> None:
    # seven 1.5 ms steps and one of 201.5 ms: removing the spike saves 25 ms per step on average,
    # more than the 1.5 ms median step but within the 26.5 ms mean step
    import pandas as pd

    bd = pd.DataFrame({"rank": [0] * 9, "step": [*range(8), -1],
                       "step_us": [1_500.0] * 7 + [201_500.0, 1e9]})
    caps = chain.cap_steps(bd, -1)
    assert caps == {0: pytest.approx(26_500.0)}
    (got,) = chain.cap_savings([_f("CLU003", "cluster.step_fluctuation", 25_000.0)], caps)
    assert got.estimated_saving_us == 25_000.0
    steady = pd.DataFrame({"rank": [1] * 3, "step": [0, 1, 2], "step_us": [20_000.0, 20_000.0, 2_000.0]})
    assert chain.cap_steps(steady, -1) == {1: 20_000.0}  # a fast step does not lower the median cap


def test_saving_within_the_step_and_profiles_without_steps_are_left_alone() -> None:
    f = _f("X", "cpu.operator_dispatch", 5_000.0, fraction=0.25, severity=Severity.CRITICAL)
    assert chain.cap_savings([f], {0: 20_000.0}) == [f]
    big = _f("X", "cpu.operator_dispatch", 5e9)
    assert chain.cap_savings([big], {}) == [big]  # no step times: nothing to cap against


def test_severity_follows_the_share_of_the_step() -> None:
    # a 3 % cost is medium (CAUSES.md: medium >= 3 %, high >= 10 %, critical >= 20 %), whatever the rule said
    f = _f("COM006", "comm.byte_alignment", 600.0, fraction=0.03, severity=Severity.CRITICAL)
    (got,) = chain.cap_savings([f], {0: 20_000.0})
    assert got.severity is Severity.MEDIUM
    no_share = _f("CPU006", "cpu.environment_configuration", None, severity=Severity.MEDIUM)
    assert chain.cap_savings([no_share], {0: 20_000.0})[0].severity is Severity.MEDIUM


def test_duplicate_ids_are_made_unique() -> None:
    a = _f("CMP003", "compute.affinity_api", 10.0)
    b = _f("CMP003", "compute.affinity_api", 20.0)
    x, y = chain.unique_ids([a, b])
    assert x.id == a.id and y.id == a.id + "-2"


# -- the chain ------------------------------------------------------------------------------------

def test_retransmission_slow_link_wait_chain() -> None:
    rdma = _f("COM004", "comm.rdma_retransmission", 8_000.0, ranks=(2,))
    link = _f("CLU002", "cluster.slow_link", 10_000.0, ranks=(2, 3))
    wait = _f("COM001", "comm.slow_synchronization", 12_000.0, ranks=(0, 1, 2, 3), slowest_ranks="2")
    gc = _f("CPU004", "cpu.garbage_collection", 1_000.0, ranks=(0,))
    got = _by_rule(chain.link([rdma, link, wait, gc]))
    # retransmission (8 ms) explains the slow link (10 ms: 8 >= half) and the wait (12 ms: 8 >= 6, on blamed rank 2);
    # the slow link explains the wait; GC on rank 0 explains nothing (rank 0 is not the one waited for, 1 < 6 ms)
    assert got["COM004"].root and got["CPU004"].root
    assert not got["CLU002"].root and got["CLU002"].explained_by == (rdma.id,)
    assert got["COM001"].explained_by == (link.id, rdma.id)  # largest saving first
    assert got["COM001"].root_id == rdma.id and got["CLU002"].root_id == rdma.id
    assert set(got["COM004"].explains) == {link.id, wait.id}
    assert got["COM001"].evidence["explained_by"] == f"{link.id}, {rdma.id}"
    s = chain.summary(list(got.values()), {r: 20_000.0 for r in range(4)})
    # roots only: rank 2 has the retransmission (8 ms), rank 0 the GC (1 ms); the larger per-rank sum is 8 ms
    assert s["total_saving_us"] == 8_000.0 and s["total_saving_rank"] == 2
    assert s["total_saving_fraction"] == 0.4
    assert s["verdict"] == rdma.id and set(s["roots"]) == {rdma.id, gc.id}


def test_a_slow_link_explains_its_group_only_as_the_group_s_one_slow_link() -> None:
    group = _f("CLU004", "cluster.slow_group", 10_000.0, ranks=(0, 4, 8, 12))
    one = _f("CLU002", "cluster.slow_link", 9_000.0, ranks=(4, 8))
    got = _by_rule(chain.link([group, one]))
    assert got["CLU004"].explained_by == (one.id,)
    # every link of the ring slow: no one of them is the group's cause
    ring = [_f("CLU002", "cluster.slow_link", 9_000.0, ranks=rs) for rs in ((0, 4), (4, 8), (8, 12), (0, 12))]
    linked = chain.link([group, *ring])
    assert next(f for f in linked if f.rule == "CLU004").root


def test_sync_explains_dispatch_gaps_on_its_rank_and_steps_only() -> None:
    sync = _f("CPU003", "cpu.host_device_sync", 3_000.0, steps=(1, 2, 3, 4))
    gaps = _f("CPU002", "cpu.operator_dispatch", 2_500.0, steps=(1, 2, 3, 4))
    other_rank = _f("CPU002", "cpu.operator_dispatch", 2_500.0, ranks=(1,), steps=(1, 2, 3, 4))
    got = chain.link([sync, gaps, other_rank])
    assert got[1].explained_by == (sync.id,) and got[2].root
    one_step = _f("CPU003", "cpu.host_device_sync", 3_000.0, steps=(1,))  # 1 of 4 steps: not the same time
    assert chain.link([one_step, gaps])[1].root
    small = _f("CPU003", "cpu.host_device_sync", 1_000.0, steps=(1, 2, 3, 4))  # 1 ms of 2.5: not most of it
    assert chain.link([small, gaps])[1].root
    zero = _f("CPU003", "cpu.host_device_sync", 0.0, steps=(1, 2, 3, 4))
    assert chain.link([zero, _f("CPU002", "cpu.operator_dispatch", None)])[1].root


def test_straggler_explains_the_others_wait_when_it_is_the_one_waited_for() -> None:
    wait = _f("COM001", "comm.slow_synchronization", 31_000.0, ranks=(0, 1), slowest_ranks="1")
    straggler = _f("CLU001", "cluster.slow_rank", 26_800.0, ranks=(1,))
    got = chain.link([wait, straggler])
    assert got[0].explained_by == (straggler.id,) and got[1].root
    wrong = _f("CLU001", "cluster.slow_rank", 26_800.0, ranks=(0,))
    assert chain.link([wait, wrong])[0].root


def test_slow_rank_and_step_fluctuation_links_need_annotate() -> None:
    fluct = _f("CLU003", "cluster.step_fluctuation", 5_000.0, steps=(3,))
    gc = _f("CPU004", "cpu.garbage_collection", 5_000.0, steps=(3,))
    assert chain.link([gc, fluct])[1].root  # declared, same time, but annotate did not find it specific
    linked = Finding(**{**{k: getattr(gc, k) for k in gc.__dataclass_fields__}, "explains": (fluct.id,)})
    assert chain.link([linked, fluct])[1].explained_by == (gc.id,)


def test_no_cycle_the_larger_saving_explains() -> None:
    causes = {"cpu.a": ["cpu.b"], "cpu.b": ["cpu.a"]}
    a = _f("A01", "cpu.a", 2_000.0)
    b = _f("B01", "cpu.b", 3_000.0)
    got = chain.link([a, b], causes)
    assert got[1].root and got[0].explained_by == (b.id,)


def test_root_without_saving_carries_the_largest_saving_it_explains() -> None:
    causes = {"cpu.a": ["cpu.b"]}
    root = _f("A01", "cpu.a", None, severity=Severity.LOW)
    b = _f("B01", "cpu.b", 5_000.0)
    got = chain.link([root, b], causes)
    s = chain.summary(got, {0: 20_000.0})
    assert s["verdict"] == root.id and s["total_saving_us"] == 5_000.0


def test_summary_of_a_filtered_list_counts_orphans_as_roots() -> None:
    wait = _f("COM001", "comm.slow_synchronization", 6_000.0, ranks=(0, 1), slowest_ranks="1")
    straggler = _f("CLU001", "cluster.slow_rank", 5_000.0, ranks=(1,))
    linked = chain.link([wait, straggler])
    s = chain.summary(linked[:1], {0: 20_000.0, 1: 20_000.0})  # the straggler filtered out (--rank 0)
    assert s["verdict"] == wait.id and s["total_saving_us"] == 6_000.0


def test_total_is_capped_at_the_step() -> None:
    a = _f("A01", "cpu.operator_dispatch", 15_000.0)
    b = _f("B01", "io.slow_data_processing", 12_000.0)
    s = chain.summary(chain.link([a, b]), {0: 20_000.0})
    assert s["total_saving_us"] == 20_000.0 and s["total_saving_capped_from_us"] == 27_000.0


def test_causes_toml_explains_known_causes_without_cycles() -> None:
    data = tomllib.loads((ROOT / "rules" / "causes.toml").read_text(encoding="utf-8"))["causes"]
    graph = {c: list(body.get("explains", [])) for c, body in data.items()}
    assert all(t in graph and t != c for c, ts in graph.items() for t in ts)
    state: dict[str, int] = {}

    def visit(c: str) -> None:
        state[c] = 1
        for t in graph[c]:
            assert state.get(t) != 1, f"cycle through {c} -> {t}"
            if t not in state:
                visit(t)
        state[c] = 2

    for c in graph:
        if c not in state:
            visit(c)


# -- the report -----------------------------------------------------------------------------------

def _report(findings: list[Finding]) -> Report:
    from advisor.engine.chain import summary

    med = {0: 20_000.0, 1: 20_000.0}
    s = summary(findings, med)
    return Report(tool_version="t", profile={"path": "p", "sources": ["kineto"], "ranks": [0, 1], "steps": [1, 2, 3]},
                  breakdown=[], critical_path={"rank": None, "step": None, "length_us": 0.0, "ops": []},
                  findings=findings, step_times=[{"rank": r, "steps": 3, "mean_us": v, "median_us": v, "min_us": v,
                                                  "max_us": v, "std_us": 0.0} for r, v in med.items()],
                  savings=s)


def test_verdict_is_the_root_and_renderers_point_to_it() -> None:
    from advisor.render import markdown, terminal, view
    from advisor.render.html import render as html

    wait = _f("COM001", "comm.slow_synchronization", 31_000.0 * 0.5, ranks=(0, 1), slowest_ranks="1")
    straggler = _f("CLU001", "cluster.slow_rank", 14_000.0, ranks=(1,))
    findings = chain.link([wait, straggler])  # the wait (15.5 ms) comes first by saving; it is not the root
    data = report_json(_report(findings))
    assert data["findings"][0]["root"] is False and data["findings"][0]["root_id"] == straggler.id
    assert data["findings"][0]["explained_by"] == [straggler.id]
    assert data["savings"]["verdict"] == straggler.id and data["total_saving_us"] == 14_000.0
    v = view.verdict(data)
    assert v["rule"] == "CLU001" and v["finding_id"] == straggler.id
    assert f"explained by `{straggler.id}`" in markdown.render(data)
    # the terminal names the explaining finding by its rule (unique here) and marks it as the verdict
    assert "explained by CLU001, the verdict" in " ".join(terminal.render_text(data).split())
    assert f"<code>{straggler.id}</code>" in html(data)


def test_saving_problems_flags_a_saving_above_the_step() -> None:
    data = report_json(_report([_f("X", "cpu.operator_dispatch", 1_000.0)]))
    assert saving_problems(data) == []
    data["findings"][0]["estimated_saving_us"] = 26_000.0  # the 260 ms on a 233 ms step, scaled
    assert saving_problems(data) and "26000.0" in saving_problems(data)[0]


# -- every profile the repository ships -----------------------------------------------------------

def _profiles() -> list[Path]:
    out = sorted(p for p in (ROOT / "sample_profiles").iterdir() if p.is_dir())
    return out + sorted(p for p in TRACES.iterdir() if p.is_dir() and any(p.glob("*.json*")))


@pytest.mark.slow
@pytest.mark.parametrize("path", _profiles(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_profile_claims_a_saving_above_its_step(path: Path) -> None:
    from advisor.analyze import analyze

    data = report_json(analyze(path))
    assert saving_problems(data) == []
    ids = {f["id"] for f in data["findings"]}
    assert len(ids) == len(data["findings"])
    for f in data["findings"]:
        assert f["root"] == (not f["explained_by"])
        assert set(f["explained_by"]) <= ids and (f["root_id"] is None or f["root_id"] in ids)
    if data["findings"]:
        assert data["savings"]["verdict"] in {f["id"] for f in data["findings"] if f["root"]}


def test_verdict_carries_the_chain_it_explains() -> None:
    """A root with no saving of its own that explains a critical finding: the verdict names the root,
    with the explained finding's severity and saving, and links to the root's details."""
    from advisor.render.view import verdict

    d = {
        "findings": [
            {"id": "CLU003-a", "rule": "CLU003", "cause": "cluster.step_fluctuation", "severity": "critical",
             "title": "steps fluctuate", "estimated_saving_us": 3000.0, "saving_fraction": 0.6,
             "root": False, "root_id": "CPU001-b", "explained_by": ["CPU001-b"]},
            {"id": "CPU001-b", "rule": "CPU001", "cause": "cpu.operator_compilation", "severity": "low",
             "title": "dynamic shapes", "estimated_saving_us": None, "saving_fraction": None,
             "root": True, "root_id": "CPU001-b", "explained_by": []},
            {"id": "IO001-c", "rule": "IO001", "cause": "io.slow_data_fetching", "severity": "high",
             "title": "data loading", "estimated_saving_us": 1000.0, "saving_fraction": 0.2,
             "root": True, "root_id": "IO001-c", "explained_by": []},
        ],
        "savings": {"verdict": "CPU001-b"},
    }
    v = verdict(d)
    assert (v["finding_id"], v["severity"], v["saving_us"], v["saving_fraction"]) == ("CPU001-b", "critical", 3000.0, 0.6)
    assert v["text"].startswith("CRITICAL: dynamic shapes — up to ") and v["text"].endswith("explains 1 more finding")
    # a root with its own saving keeps it, and its own severity when nothing it explains is worse
    d["savings"]["verdict"] = "IO001-c"
    v = verdict(d)
    assert (v["severity"], v["saving_us"], v["explains"]) == ("high", 1000.0, 0)
