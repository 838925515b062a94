"""Partial Ascend exports are said to be partial (issue 31).

Inputs are the real torch_npu text export of ``tests/data/ascend_real`` (see its README), cut
here the way real exports come cut: without the timeline, with a kernel table that is an excerpt,
at profiler level 0 (format doc §2.5: no CANN layer, no HCCL trace, no communication files).
The vendor's figures are read with ``csv``, independently of the advisor.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest

from tests.ascend.test_real import TEXT, vendor_steps

OUT = "ASCEND_PROFILER_OUTPUT"


def _copy(dst: Path) -> Path:
    shutil.copytree(TEXT, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _without_timeline(dst: Path, *, excerpt_rows: int | None = None, step_table: bool = True) -> Path:
    """The export without trace_view.json; optionally its kernel table cut to its first rows (an
    excerpt, as shared in bug reports) and without step_trace_time.csv."""
    root = _copy(dst)
    for out in root.glob(f"*/{OUT}"):
        (out / "trace_view.json.gz").unlink()
        if excerpt_rows is not None:
            kd = out / "kernel_details.csv"
            kd.write_text("".join(kd.read_text().splitlines(keepends=True)[: 1 + excerpt_rows]))
        if not step_table:
            (out / "step_trace_time.csv").unlink()
    return root


def _breakdown(root: Path):
    from advisor.engine.context import load_profile
    from advisor.stages import breakdown

    ctx = load_profile(root)
    return ctx, breakdown.compute(ctx.con)


def test_no_timeline_and_an_excerpt_kernel_table_take_the_vendor_step_table(tmp_path: Path) -> None:
    """20 kernel rows of ~190 and no timeline: the breakdown is step_trace_time.csv's, exactly."""
    root = _without_timeline(tmp_path / "prof", excerpt_rows=20)
    ctx, bd = _breakdown(root)
    vendor = vendor_steps(TEXT)
    assert {(int(r.rank), int(r.step)) for r in bd.itertuples()} == set(vendor)
    for r in bd.itertuples():
        with (TEXT / f"rank{r.rank}_ascend_pt" / OUT / "step_trace_time.csv").open(newline="") as fh:
            (row,) = list(csv.DictReader(fh))
        computing, cno, ov, free = (float(row[k]) for k in ("Computing", "Communication(Not Overlapped)",
                                                             "Overlapped", "Free"))
        assert r.overlapped_us == pytest.approx(ov, abs=0.01)
        assert r.compute_only_us + r.overlapped_us == pytest.approx(computing, abs=0.01)
        assert r.comm_only_us == pytest.approx(cno, abs=0.01)
        assert r.free_us == pytest.approx(free, abs=0.01)
        assert r.host_only_us == 0.0
        # no Bubble: Stage is the span (CANN quantises it to about 0.25 µs, format doc addendum)
        assert r.step_us == pytest.approx(float(row["Stage"]), abs=0.5)
    (w,) = [w for w in ctx.warnings if w.code == "partial_export"]
    assert "ranks 0-1" in w.message and "step_trace_time.csv" in w.message and "trace_view.json" in w.message
    assert ctx.has_device  # the vendor's device table: not a CPU-only profile


def test_nothing_covering_the_step_gives_no_breakdown_and_names_the_missing_files(tmp_path: Path) -> None:
    """No timeline, no step table, and a kernel table without the all-reduce rows communication.json
    lists: no breakdown is invented from the 20 rows left."""
    root = _without_timeline(tmp_path / "prof", excerpt_rows=20, step_table=False)
    ctx, bd = _breakdown(root)
    assert bd.empty
    (w,) = [w for w in ctx.warnings if w.code == "partial_export"]
    for name in ("trace_view.json", "step_trace_time.csv", "kernel_details.csv", "excerpt"):
        assert name in w.message
    # the real tables hold 4 all-reduce operators per rank (communication.json and 4 HCCL rows)
    assert "lacks 4 of the 4" in w.message


def test_a_whole_kernel_table_without_timeline_is_still_the_breakdown(tmp_path: Path) -> None:
    """Every all-reduce of communication.json has its HCCL row: the kernel table covers the step and
    its breakdown agrees with the vendor's table (here removed, compared with the original)."""
    root = _without_timeline(tmp_path / "prof", step_table=False)
    ctx, bd = _breakdown(root)
    assert not [w for w in ctx.warnings if w.code == "partial_export"]
    vendor = vendor_steps(TEXT)
    for r in bd.itertuples():
        v = vendor[(r.rank, r.step)]
        assert abs(r.compute_only_us + r.overlapped_us - v["computing"]) <= 0.02 * v["stage"]
        assert abs(r.comm_only_us - v["cno"]) <= 0.02 * v["stage"]


def _level0(dst: Path, rank: int) -> Path:
    """The export as profiler level 0 writes it (format doc §2.5; torch_npu's Level0 =
    ACL_PROF_TASK_TIME_L0 | ACL_PROF_ACL_API, without ACL_PROF_HCCL_TRACE): no CANN or HCCL
    process, no event named after the CANN layers, no communication.json / matrix. The device's
    HCCL stream (Notify Wait, SDMA, Write Value tasks) stays in Ascend Hardware."""
    root = dst
    shutil.copytree(TEXT / f"rank{rank}_ascend_pt", root / f"rank{rank}_ascend_pt")
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    drop_names = ("CANN", "AscendCL", "Runtime", "GE", "Node", "Model", "Hccl", "acl_to_npu", "Communication@")
    for out in root.glob(f"*/{OUT}"):
        tv = out / "trace_view.json.gz"
        events = json.loads(gzip.decompress(tv.read_bytes()))
        gone = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                and e["args"].get("name") in ("CANN", "HCCL")}
        kept = [e for e in events if e.get("pid") not in gone and not str(e.get("name", "")).startswith(drop_names)]
        tv.write_bytes(gzip.compress(json.dumps(kept).encode()))
        (out / "communication.json").unlink()
        (out / "communication_matrix.json").unlink()
    return root


def test_level0_hccl_stream_tasks_are_communication(tmp_path: Path) -> None:
    """Without HCCL lanes, the stream running HCCL's notify tasks is HCCL's: its SDMA and Write Value
    tasks are communication, and the breakdown agrees with step_trace_time.csv."""
    from advisor.stages import breakdown

    root = _level0(tmp_path / "prof", 1)
    ctx, bd = _breakdown(root)
    kinds = ctx.con.execute(
        "SELECT DISTINCT kind::VARCHAR FROM events WHERE device AND name IN ('SDMA', 'Write Value')").fetchall()
    assert kinds == [("comm",)]
    vendor = vendor_steps(TEXT)
    assert [(int(r.rank), int(r.step)) for r in bd.itertuples()] == [(1, 50)]
    for r in bd.itertuples():
        v = vendor[(r.rank, r.step)]
        # SDMA + Write Value were 3.5-4 % of the Stage counted as computing
        assert abs(r.compute_only_us + r.overlapped_us - v["computing"]) <= 0.01 * v["stage"]
        assert abs(r.comm_only_us - v["cno"]) <= 0.01 * v["stage"]
    assert breakdown.vendor_check(ctx.con, bd) == []


def test_a_breakdown_off_the_vendor_table_makes_the_verdict_uncertain() -> None:
    from advisor.render import view

    finding = {"id": "F1", "rule": "CPU007", "cause": "cpu.host_bound", "severity": "critical",
               "title": "Rank 1's device waits on the host", "estimated_saving_us": 40_000.0}
    d = {"findings": [finding], "savings": {"verdict": "F1"}, "warnings": []}
    assert "uncertain" not in view.verdict(d)["text"]
    d["warnings"] = [
        {"code": "vendor_mismatch", "message": "rank 0 step 50: compute_only + overlapped 13721.7 µs here, "
         "Computing 8873.8 µs in the export's step_trace_time.csv (3.5% of its Stage 136581.0 µs apart)"},
        {"code": "vendor_mismatch", "message": "rank 0 step 50: comm_only 97934.0 µs here, ..."},
    ]
    text = view.verdict(d)["text"]
    assert text.startswith("CRITICAL: Rank 1's device waits on the host")
    assert "uncertain" in text and "1 rank " in text


@pytest.mark.slow
def test_pipeline_stage_from_vendor_tables_alone(tmp_path: Path) -> None:
    """Generated pipeline job (tests/ascend/gen_cluster.py, two stages of 8 ranks) whose stage 0
    computes 58 % as long as stage 1 and waits the difference in send / receive; only the vendor
    tables are kept (step_trace_time.csv, communication*.json, metadata: no timeline, no kernel table).
    Stage 1 is named as the slow stage with its ranks, stage 0's ranks as the ones waiting."""
    from advisor.analyze import analyze
    from tests.ascend.gen_cluster import SCENARIOS, generate

    facts = generate(dataclasses.replace(SCENARIOS["layout_dp4_tp2_pp2"], slow_stage=1,
                                         slow_stage_factor=1 / 0.58, steps=2), tmp_path / "pp")
    for d in facts.rank_dirs.values():
        for name in ("trace_view.json", "kernel_details.csv"):
            (d / OUT / name).unlink()
    report = analyze(facts.root)
    (f,) = [f for f in report.findings if f.rule == "CLU006"]
    assert list(f.ranks) == facts.slow_stage_ranks == list(range(8, 16))
    assert f.evidence["stalled_ranks"] == "0-7"
    # the vendor's Computing per rank: stage 0 at 58 % of stage 1 (read from the generated csv)
    comp = {}
    for r, d in facts.rank_dirs.items():
        with (d / OUT / "step_trace_time.csv").open(newline="") as fh:
            comp[r] = sum(float(x["Computing"]) for x in csv.DictReader(fh))
    assert comp[0] / comp[8] == pytest.approx(0.58, abs=0.05)
    assert not any(w.code == "cpu_only" for w in report.warnings)
