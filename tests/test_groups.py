"""Parallel groups (advisor.stages.groups), cross-step / cross-group / cross-stage rules (CLU004-CLU006)
and the ranks x steps picture (step_matrix), on generated torch_npu clusters with a known layout.

The layouts (tests/ascend/gen_cluster.py): 16 ranks on two nodes of 8, Megatron's rank order
(tensor-parallel fastest, then data-parallel, then the pipeline stage). ``layout_dp4_tp2_pp2``:
two pipeline stages of 8 ranks (one per node), send / receive of one activation size per
micro-batch between them, tensor-parallel all-gathers inside a node in every layer, data-parallel
all-reduces of three bucket sizes. ``layout_dp8_tp2``: no pipeline, data-parallel groups across the
two nodes. What the generator planted (its ``Facts``) is the truth the tests compare with.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from advisor.analyze import analyze
from advisor.ingest import load
from advisor.model import Report
from advisor.render import html as html_render
from advisor.render import json as json_render
from advisor.render import markdown as md_render
from advisor.stages import groups
from tests.ascend.gen_cluster import SCENARIOS, Cluster, Facts, generate
from tests.conftest import TRACES, profile_group, report_json, resolve_fixture, shared_report, validate_report

KIND_OF_EXPORT = {"dp": "dp", "tp": "tp", "pp": "pp", "default_group": "world"}


def _gen(tmp_path: Path, name: str, **changes: Any) -> Facts:
    scn = dataclasses.replace(SCENARIOS[name], **changes)
    return generate(scn, tmp_path / name)


def _by_rule(report: Report, rule: str) -> list[Any]:
    return [f for f in report.findings if f.rule == rule]


@pytest.mark.parametrize("name", ["layout_dp4_tp2_pp2", pytest.param("layout_dp8_tp2", marks=pytest.mark.slow), pytest.param("baseline8", marks=pytest.mark.slow),
                                  pytest.param("mindspore4", marks=pytest.mark.slow),
                                  pytest.param("faults8", marks=pytest.mark.slow),
                                  pytest.param("cluster64", marks=pytest.mark.slow)])
def test_layout_groups_are_labelled_from_their_traffic(name: str, tmp_path: Path) -> None:
    """Every group gets the kind the generator built it as; the labels come from the traffic alone
    (the same with the export's group names removed), and agree with the names where there are some.
    In baseline8 / mindspore4 every DP bucket has the same size and the DP groups stay inside one node:
    the size rule cannot tell them from TP, their place in the step (after the backward pass, none in
    the forward part) does."""
    facts = _gen(tmp_path, name, steps=2)  # two steps: the per-step rules need no more, the load is shorter
    prof = load(facts.root)
    pg = groups.reconstruct(prof.con)
    assert pg is not None
    got = {g["name"]: g for g in pg["groups"]}
    assert set(got) == set(facts.groups)
    for h, members in facts.groups.items():
        want = KIND_OF_EXPORT[facts.group_kind[h]]
        assert got[h]["kind"] == want, (h, got[h])
        assert got[h]["members"] == sorted(members)
        assert got[h]["exported_kind"] == want and got[h]["agrees"] is True
    assert pg["mismatches"] == []
    scn = facts.scenario
    per_stage = scn.world // scn.pp
    if scn.pp > 1:
        assert pg["stages"] == [list(range(s * per_stage, (s + 1) * per_stage)) for s in range(scn.pp)]
        assert pg["layout"]["pp"] == {"groups": per_stage, "sizes": [scn.pp]}
    else:
        assert pg["stages"] == [] and "pp" not in pg["layout"]
    assert pg["layout"]["tp"] == {"groups": scn.world // scn.tp, "sizes": [scn.tp]}
    assert pg["layout"]["dp"] == {"groups": scn.tp * scn.pp, "sizes": [scn.world // (scn.tp * scn.pp)]}
    # the evidence is the paper's: one size per step between pipeline stages, many in the DP buckets
    for g in pg["groups"]:
        if g["kind"] == "pp":
            assert g["evidence"]["sizes_per_step"] == 1 and g["evidence"]["p2p_share"] == 1.0
        if g["kind"] == "dp" and scn.bucket_scales:
            assert g["evidence"]["sizes_per_step"] == len(set(scn.bucket_scales))
        if g["kind"] == "tp":
            assert g["evidence"]["inter_node"] is False
    # the same labels without the export's names
    prof.con.execute("DELETE FROM comm_groups")
    bare = groups.reconstruct(prof.con)
    assert bare is not None
    assert {g["name"]: g["kind"] for g in bare["groups"]} == {g["name"]: g["kind"] for g in pg["groups"]}
    assert all(g["exported_kind"] is None and g["agrees"] is None for g in bare["groups"])


@pytest.mark.slow
def test_layout_from_the_database_export_is_labelled_the_same(tmp_path: Path) -> None:
    """The same pipeline layout written as torch_npu's .db export (COMMUNICATION_OP, analysis.db)."""
    facts = generate(dataclasses.replace(SCENARIOS["layout_dp4_tp2_pp2"], steps=2), tmp_path / "db", form="db")
    pg = groups.reconstruct(load(facts.root).con)
    assert pg is not None
    assert {g["name"]: g["kind"] for g in pg["groups"]} == {h: KIND_OF_EXPORT[k] for h, k in facts.group_kind.items()}
    assert pg["stages"] == [list(range(8)), list(range(8, 16))] and pg["mismatches"] == []


@pytest.mark.slow
def test_a_group_named_against_its_traffic_is_reported(tmp_path: Path) -> None:
    """DP groups exported as 'tp': each one is a mismatch (the report also warns group_kind_mismatch)."""
    facts = _gen(tmp_path, "layout_dp4_tp2_pp2")
    prof = load(facts.root)
    prof.con.execute("UPDATE comm_groups SET pg_name = 'tp' WHERE pg_name = 'dp'")
    pg = groups.reconstruct(prof.con)
    assert pg is not None
    bad = [g for g in pg["groups"] if g["agrees"] is False]
    n_dp = sum(1 for k in facts.group_kind.values() if k == "dp")
    assert len(bad) == len(pg["mismatches"]) == n_dp
    assert all(g["kind"] == "dp" and g["exported_kind"] == "tp" for g in bad)


def test_kineto_group_named_tensor_parallel_but_moving_dp_buckets_is_a_mismatch() -> None:
    """Canonical rows as a Kineto trace gives them: NCCL all-reduces of group "3" on ranks 0-3, three
    bucket sizes per step, and pg_config naming group "3" TENSOR_MODEL_PARALLEL_GROUP. Many sizes per
    step: data parallel, against the export's tensor parallel."""
    from advisor.testing import context_from_tables

    ops, gr = [], []
    for r in range(4):
        gr.append({"rank": r, "group_name": "3", "comm_name": "TENSOR_MODEL_PARALLEL_GROUP",
                   "pg_name": "TENSOR_MODEL_PARALLEL_GROUP", "group_rank": r, "global_ranks": "[0, 1, 2, 3]"})
        for step in (1, 2):
            for k, mb in enumerate((25, 25, 7)):
                ops.append({"rank": r, "step": step, "name": "ncclDevKernel_AllReduce", "op_type": "allreduce",
                            "group_name": "3", "start_ns": step * 10**9 + k * 10**6, "dur_ns": 10**5, "bytes": mb << 20})
    ctx = context_from_tables({"comm_ops": ops, "comm_groups": gr}, run_stages=False)
    pg = groups.reconstruct(ctx.con)
    assert pg is not None
    [g] = pg["groups"]
    assert (g["kind"], g["exported_kind"], g["agrees"], g["evidence"]["sizes_per_step"]) == ("dp", "tp", False, 2)
    assert len(pg["mismatches"]) == 1


def test_tensor_parallel_from_placement_and_timing_without_transports() -> None:
    """Kineto-like rows (no transports, no host names) of 8 ranks on hosts of 4 devices: group t (ranks 0, 1)
    all-gathers one 8 MiB activation 4 times per 100 ms step, in the first 40 ms; group d (ranks 0, 4)
    all-reduces one 64 MiB bucket at 80 ms. With ``device_count`` 4 the ranks are placed 0-3 / 4-7: t stays
    on one node and runs in the forward part -> tp; d crosses nodes -> dp (one size: the size rule alone
    would not say)."""
    from advisor.testing import context_from_tables

    ms = 1_000_000
    ranks = [{"rank": r, "source": "kineto", "device_count": 4, "has_device": True} for r in range(8)]
    steps, ops = [], []
    for r in range(8):
        for s in (1, 2):
            steps.append({"rank": r, "step": s, "start_ns": s * 100 * ms, "end_ns": (s + 1) * 100 * ms})
    for s in (1, 2):
        for r in (0, 1):
            for k in range(4):
                ops.append({"rank": r, "step": s, "name": "nccl:all_gather", "op_type": "allgather", "group_name": "t",
                            "start_ns": s * 100 * ms + (5 + 8 * k) * ms, "dur_ns": ms, "bytes": 8 << 20})
        for r in (0, 4):
            ops.append({"rank": r, "step": s, "name": "nccl:all_reduce", "op_type": "allreduce", "group_name": "d",
                        "start_ns": s * 100 * ms + 80 * ms, "dur_ns": 5 * ms, "bytes": 64 << 20})
    ctx = context_from_tables({"ranks": ranks, "steps": steps, "comm_ops": ops}, run_stages=False)
    pg = groups.reconstruct(ctx.con)
    assert pg is not None and pg["nodes_from"] == "device count (rank // devices per host)"
    got = {g["name"]: (g["kind"], g["evidence"]["inter_node"], g["evidence"]["early_share"]) for g in pg["groups"]}
    assert got == {"t": ("tp", False, 1.0), "d": ("dp", True, 0.0)}


def _trace(rank: int, host: str | None, host_after_events: bool) -> dict[str, Any]:
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 500},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1100, "dur": 100}]
    head: dict[str, Any] = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 3}}
    if host is not None:
        head["host_name"] = host
    # a trace rewritten with its keys reordered: the events first, the header keys after them
    return {"traceEvents": ev, **head} if host_after_events else {**head, "traceEvents": ev}


def test_kineto_host_names_place_the_ranks_on_nodes(tmp_path: Path) -> None:
    """A Kineto trace's top-level ``host_name`` (before the events, or after them in a reordered trace) is kept in
    ``meta`` and places its rank on that node; a trace without one (rank 2) is not placed by a guess."""
    for rank, host, after in ((0, "node-a", False), (1, "node-b", True), (2, None, False)):
        (tmp_path / f"rank-{rank}.pt.trace.json").write_text(json.dumps(_trace(rank, host, after)))
    con = load(tmp_path).con
    assert con.execute("SELECT rank, value FROM meta WHERE key = 'host_name' ORDER BY rank").fetchall() == [
        (0, "node-a"), (1, "node-b")]
    assert groups._nodes(con) == ({0: "node-a", 1: "node-b"}, "host names")


def test_kineto_host_names_of_the_samples() -> None:
    """tests/data/kineto/gloo_slow_rank: both traces say ``"host_name": "vm"`` (one machine, two processes)."""
    con = load(TRACES / "gloo_slow_rank").con
    assert groups._nodes(con) == ({0: "vm", 1: "vm"}, "host names")


def test_exported_kind_reads_common_group_names() -> None:
    assert groups.exported_kind("TENSOR_MODEL_PARALLEL_GROUP") == "tp"
    assert groups.exported_kind("DATA_PARALLEL_GROUP") == "dp"
    assert groups.exported_kind("pp") == "pp"
    assert groups.exported_kind("default_pg") == "world"
    assert groups.exported_kind("expert_parallel") == "ep"
    assert groups.exported_kind("1234567") is None and groups.exported_kind(None) is None


def test_kineto_point_to_point_pairs_make_a_pipeline() -> None:
    """tests/data/kineto/gloo_pipeline_bubble: two ranks, one stage each, exchanging 1 MiB activations
    (gloo send / recv, one size per step; its README): no group is named, the pair rule labels the pair
    a pipeline and the stages are the two ranks."""
    con = load(TRACES / "gloo_pipeline_bubble").con
    # the header's distributedInfo.pg_config: [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}]
    assert con.execute("SELECT rank, group_name, pg_name, group_rank, global_ranks FROM comm_groups ORDER BY rank"
                       ).fetchall() == [(0, "0", "default_pg", 0, "[0, 1]"), (1, "0", "default_pg", 1, "[0, 1]")]
    pg = groups.reconstruct(con)
    assert pg is not None and pg["source"] == "pairs"
    assert [(g["kind"], g["members"], g["evidence"]["sizes_per_step"]) for g in pg["groups"]] == [("pp", [0, 1], 1)]
    assert pg["stages"] == [[0], [1]]


def test_pair_rule_and_transitive_closure() -> None:
    """LLMPrism Alg. 2 on point-to-point pairs: (0,1) and (1,2) exchange many sizes -> one DP group
    {0,1,2} by transitivity; (0,4), (4,8) one size per step -> pipeline."""
    rows = []
    for step in range(3):
        for a, b in ((0, 1), (1, 2)):
            rows.append({"a": a, "b": b, "step": step, "sizes": 3, "bytes": 100, "n": 3})
        for a, b in ((0, 4), (4, 8)):
            rows.append({"a": a, "b": b, "step": step, "sizes": 1, "bytes": 10, "n": 2})
    rows.append({"a": 4, "b": 8, "step": 3, "sizes": 2, "bytes": 10, "n": 2})  # a noisy step: the mode wins
    out = groups._pair_groups(rows)
    kinds = {(g["kind"], tuple(g["members"])) for g in out}
    assert ("dp", (0, 1, 2)) in kinds
    assert ("pp", (0, 4, 8)) in kinds


@pytest.mark.slow
def test_planted_slow_dp_group_is_found_among_its_kind(tmp_path: Path) -> None:
    """One DP group's links run at a quarter of the speed: CLU004 names that group (kind dp), no other."""
    facts = _gen(tmp_path, "layout_dp4_tp2_pp2", slow_group=1)
    report = analyze(facts.root)
    report_json(report)
    slow = facts.slow_group
    assert slow is not None
    found = _by_rule(report, "CLU004")
    assert [f.evidence["group_name"] for f in found] == [slow]
    f = found[0]
    assert f.evidence["group_kind"] == "dp"
    assert list(f.ranks) == sorted(facts.groups[slow])
    assert f.evidence["groups_compared"] == facts.scenario.tp * facts.scenario.pp
    # by hand from the generator: the ring all-reduce moves 2(n-1) chunks per bucket; at a quarter of the
    # bandwidth its transit is 4x, so the group's collective time is well above 1.2x the others'
    assert f.evidence["group_us_median"] > 2.0 * f.evidence["baseline_us_median"]
    step_us = report.breakdown[0]["step_us"]
    assert f.estimated_saving_us is not None and 0 < f.estimated_saving_us < step_us


@pytest.mark.slow
def test_planted_slow_stage_is_found_and_the_stalled_stage_not_blamed(tmp_path: Path) -> None:
    facts = _gen(tmp_path, "layout_dp4_tp2_pp2", slow_stage=0)
    report = analyze(facts.root)
    d = report_json(report)
    found = _by_rule(report, "CLU006")
    assert len(found) == 1
    f = found[0]
    assert list(f.ranks) == facts.slow_stage_ranks == list(range(8))
    stalled = set(range(8, 16))
    assert f.evidence["stalled_ranks"] == "8-15"
    # no cluster finding blames a rank of the stalled stage
    for g in report.findings:
        if g.cause in ("cluster.slow_rank", "cluster.slow_stage", "cluster.slow_rank_step"):
            assert not set(g.ranks) & stalled, g.title
    # the excess own time is the extra compute the generator planted: per step, the kernel time of a
    # stage-0 rank minus a stage-1 rank's (both run the same kernels; stage 0 at 1.8x), from the model
    cl = Cluster(facts.scenario)
    cl.simulate()
    extra = [(sum(k.dur for k in cl.ranks[0].kernels if k.step == s) - sum(k.dur for k in cl.ranks[8].kernels
                                                                          if k.step == s)) / 1000.0
             for s in facts.steps]
    excess = f.evidence["stage_own_us"] - f.evidence["others_own_us"]
    assert excess == pytest.approx(sorted(extra)[len(extra) // 2], rel=0.05)
    assert f.estimated_saving_us is not None and 0 < f.estimated_saving_us <= f.evidence["others_wait_us"]
    step_us = min(x["step_us"] for x in d["breakdown"])
    assert f.estimated_saving_us < step_us
    # it is the root of the chain: the pipeline bubble and the straggler ranks are its symptoms
    by_id = {x.id: x for x in report.findings}
    assert f.root
    explained = {by_id[i].rule for i in f.explains}
    assert "PAR002" in explained and "CLU001" in explained


@pytest.mark.slow
def test_a_mildly_slow_stage_explains_part_of_the_bubble(tmp_path: Path) -> None:
    """Stage 0 computes 1.3x longer; with two stages and two GPipe micro-batches the schedule's own bubble,
    (p - 1) / (m + p - 1) = 1/3 of the pipeline, is well above the stage's excess: the slow stage explains
    only a part of the bubble, which stays a root and counts what is left."""
    facts = _gen(tmp_path, "layout_dp4_tp2_pp2", slow_stage=0, slow_stage_factor=1.3)
    report = analyze(facts.root)
    report_json(report)
    (stage,) = _by_rule(report, "CLU006")
    assert list(stage.ranks) == facts.slow_stage_ranks
    (bubble,) = _by_rule(report, "PAR002")
    assert stage.estimated_saving_us and bubble.estimated_saving_us
    assert bubble.estimated_saving_us > 2 * stage.estimated_saving_us  # the schedule's bubble dominates
    assert bubble.root and bubble.id not in stage.explains
    assert bubble.evidence["explained_in_part_by"] == stage.id
    assert bubble.evidence["unexplained_saving_us"] == pytest.approx(
        bubble.estimated_saving_us - stage.estimated_saving_us, abs=1e-3)
    assert stage.evidence["explains_in_part"] == bubble.id


@pytest.mark.slow
def test_planted_rank_slow_in_one_step(tmp_path: Path) -> None:
    facts = _gen(tmp_path, "layout_dp8_tp2", slow_rank_step=(5, 2), steps=5)
    report = analyze(facts.root)
    report_json(report)
    found = _by_rule(report, "CLU005")
    assert [(f.ranks, f.steps) for f in found] == [((5,), (2,))]
    f = found[0]
    # the rank's own time in that step is its usual own time plus its extra compute (2x kernels), by the model
    cl = Cluster(facts.scenario)
    cl.simulate()
    extra = (sum(k.dur for k in cl.ranks[5].kernels if k.step == 2)
             - sum(k.dur for k in cl.ranks[5].kernels if k.step == 3)) / 1000.0
    assert f.evidence["own_us"] - f.evidence["rank_median_own_us"] == pytest.approx(extra, rel=0.05)
    assert f.estimated_saving_us is not None and f.estimated_saving_us <= f.evidence["peers_wait_us"]
    assert not _by_rule(report, "CLU001")  # one step of five is not a straggler


@pytest.mark.slow
def test_healthy_layout_raises_no_cluster_alarm(tmp_path: Path) -> None:
    facts = _gen(tmp_path, "layout_dp4_tp2_pp2", steps=4)
    report = analyze(facts.root)
    d = report_json(report)
    for rule in ("CLU001", "CLU004", "CLU005", "CLU006"):
        assert not _by_rule(report, rule), rule
    assert d["parallel_groups"]["layout"]["pp"]["groups"] == 8
    sm = d["step_matrix"]
    assert len(sm["rows"]) == 16 and sm["steps"] == facts.steps
    assert [r["stage"] for r in sm["rows"]] == [0] * 8 + [1] * 8


QUIET = ["sample:kineto_two_ranks", "sample:kineto_gloo_slow_rank"]
QUIET_SLOW = ["sample:kineto_cpu_healthy", "sample:ascend_pt_timeline", "sample:ascend_pt_kernels",
              "sample:kineto_resnet50_num_workers_0", "sample:kineto_cpu_slow_dataloader",
              "tests/data/kineto_real/kineto_b200_vllm_tp8_rank0", "tests/data/kineto_real/kineto_mi300_hf_bert_small",
              "tests/data/kineto_real/kineto_mi300_sglang_prefilldecode"]


@pytest.mark.parametrize("spec", [*(pytest.param(s, marks=profile_group(resolve_fixture(s))) for s in QUIET),
                                  *(pytest.param(s, marks=pytest.mark.slow) for s in QUIET_SLOW)])
def test_sample_profiles_raise_no_new_cluster_finding(spec: str) -> None:
    """The shipped samples and the real traces: no rank slow in one step, no slow stage, no slow group
    (the gloo sample's slow rank is slow in every step: CLU001's, not CLU005's); the report validates."""
    report = shared_report(resolve_fixture(spec))
    report_json(report)
    for rule in ("CLU004", "CLU005", "CLU006"):
        assert not _by_rule(report, rule), (rule, [f.title for f in _by_rule(report, rule)])


def _big_breakdown(n_ranks: int, steps: int, slow: tuple[int, int]) -> pd.DataFrame:
    rows = []
    for r in range(n_ranks):
        for s in range(steps):
            own = 1000.0 * (3.0 if (r, s) == slow else 1.0)
            rows.append({"rank": r, "step": s, "step_us": 3000.0, "comm_only_us": 3000.0 - own})
    return pd.DataFrame(rows)


def _layout_pg(world: int, tp: int, pp: int) -> dict[str, Any]:
    per_stage = world // pp
    gs = []
    for st in range(pp):
        for j in range(tp):
            gs.append({"name": f"dp{st}_{j}", "kind": "dp", "members": list(range(st * per_stage + j, (st + 1) * per_stage, tp))})
    for k in range(world // tp):
        gs.append({"name": f"tp{k}", "kind": "tp", "members": list(range(k * tp, (k + 1) * tp))})
    for off in range(per_stage):
        gs.append({"name": f"pp{off}", "kind": "pp", "members": list(range(off, world, per_stage))})
    return {"groups": gs, "stages": [list(range(s * per_stage, (s + 1) * per_stage)) for s in range(pp)]}


def test_step_matrix_of_1024_ranks_is_aggregated_by_group() -> None:
    """1,024 ranks (tp 8, pp 4 -> 32 DP groups of 32, 128 TP groups, 256 PP groups): rows by DP group
    (the most groups that fit 64 rows); the row holding the planted slow cell shows 3x there."""
    bd = _big_breakdown(1024, 6, slow=(517, 4))
    sm = groups.step_matrix(bd, _layout_pg(1024, 8, 4))
    assert sm is not None
    assert sm["aggregated_by"] == "dp" and len(sm["rows"]) == 32 and sm["ranks"] == 1024
    hit = [r for r in sm["rows"] if r["cells"][4] == 3.0]
    assert len(hit) == 1 and hit[0]["ranks"].startswith("517")  # DP group of rank 517: 517, 525, ... (stride tp)
    assert sm["worst"][0] == {"rank": 517, "step": 4, "slowdown": 3.0}
    assert all(v == 1.0 for r in sm["rows"] if r is not hit[0] for v in r["cells"])
    # without groups: runs of consecutive ranks, still at most 64 rows
    plain = groups.step_matrix(bd, None)
    assert plain is not None and plain["aggregated_by"] == "ranks" and len(plain["rows"]) <= 64


@pytest.mark.slow
def test_big_step_matrix_renders_small_html_and_markdown(tmp_path: Path) -> None:
    facts = _gen(tmp_path, "layout_dp4_tp2_pp2", slow_stage=1)
    d = report_json(analyze(facts.root))
    pg = _layout_pg(1024, 8, 4)
    pg.update(layout={"dp": {"groups": 32, "sizes": [32]}}, mismatches=[])
    for g in pg["groups"]:
        g.update(exported_name=None, exported_kind=None, agrees=None, basis="b", size=len(g["members"]))
    d["parallel_groups"] = pg
    d["step_matrix"] = groups.step_matrix(_big_breakdown(1024, 200, slow=(3, 7)), pg)
    validate_report(d)
    md = md_render.render(d)
    assert len(md) < md_render.MD_LIMIT
    assert "rows by dp group" in md
    page = html_render.render(d)
    assert page.count("<rect") < 32 * 120 + 2000  # at most 120 steps drawn per row
    assert "First 120 of 200 steps" in page


@pytest.mark.slow
def test_profile_strings_in_groups_are_escaped(tmp_path: Path) -> None:
    facts = _gen(tmp_path, "layout_dp8_tp2")
    d = report_json(analyze(facts.root))
    evil = '<img src=x onerror=alert(1)>'
    d["parallel_groups"]["groups"][0]["name"] = evil
    d["parallel_groups"]["groups"][0]["exported_name"] = evil
    d["step_matrix"]["rows"][0]["label"] = evil
    page = html_render.render(d)
    assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    md = md_render.render(d)
    assert "<img" not in md


@pytest.mark.slow
def test_report_fields_round_trip(tmp_path: Path) -> None:
    facts = _gen(tmp_path, "layout_dp8_tp2")
    report = analyze(facts.root)
    d = json.loads(json_render.render(report))
    validate_report(d)
    assert d["parallel_groups"]["source"] == "names"
    assert d["step_matrix"]["metric"] == "own_us"
    text = md_render.render(d)
    assert "Parallel groups (inferred from the traffic): 2 dp groups of 8, 8 tp groups of 2" in text


@pytest.mark.slow
def test_slow_stage_among_four_by_k_sigma(tmp_path: Path) -> None:
    """Four pipeline stages of 4 ranks, stage 2 computing 1.8x: the stages' own times are compared by
    LLMPrism's k-sigma on a clean baseline; only stage 2 is named."""
    facts = _gen(tmp_path, "layout_dp4_tp2_pp2", pp=4, slow_stage=2)
    report = analyze(facts.root)
    report_json(report)
    assert report.parallel_groups is not None
    assert report.parallel_groups["stages"] == [list(range(s * 4, s * 4 + 4)) for s in range(4)]
    [f] = _by_rule(report, "CLU006")
    assert list(f.ranks) == facts.slow_stage_ranks == [8, 9, 10, 11]
    assert f.evidence["method"].startswith("k-sigma") and f.evidence["stages"] == 4
    assert f.evidence["stalled_ranks"] == "0-7, 12-15"
