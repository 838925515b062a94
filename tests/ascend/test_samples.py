"""Ascend ingest on the real torch_npu samples: every expected number is computed here from the raw
file with the standard library (json, csv, decimal), never copied from the reader's output."""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from advisor.engine.context import load_profile
from tests.conftest import profile_group

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_profiles"
ASCEND_DATA = REPO / "tests" / "data" / "ascend"  # the uncompressed timeline (provenance: its README.md)
TIMELINE = ASCEND_DATA / "ascend_pt_timeline"
KERNELS = SAMPLES / "ascend_pt_kernels"
TRACE = TIMELINE / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
KD = KERNELS / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"


def ns(us_text: str | float) -> int:
    """Independent µs -> ns: decimal arithmetic on the text, no float64.

    Values with more than three decimals (CANN's unrounded ``dur`` doubles) round to the nearest
    ns, halves away from zero.
    """
    return int((Decimal(str(us_text).strip()) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


# -- raw-file views ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw() -> dict:
    ev = json.loads(TRACE.read_text())
    pname = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    xs = [e for e in ev if e["ph"] == "X"]
    return {"events": ev, "pname": pname, "xs": xs}


@pytest.fixture(scope="module")
def timeline():
    return load_profile(TIMELINE)


@pytest.fixture(scope="module")
def kernels():
    return load_profile(KERNELS)


def expected_kind(e: dict, pname: dict) -> str | None:
    """The kind each raw event must get (the brief's mapping), decided from the raw fields only."""
    p = pname.get(e["pid"])
    if p == "Python":
        if e["name"].startswith("ProfilerStep#"):
            return "step"
        if e.get("cat") in ("enqueue", "dequeue"):
            return "queue"
        if "dataloader" in e["name"].lower():
            return "dataloader"
        return "host_op"
    if p == "CANN":
        # host waits: aclrtSynchronize* and the blocking aclrtMemcpy (as cudaMemcpy in the Kineto reader)
        blocking = "synchronize" in e["name"].lower() or e["name"] == "AscendCL@aclrtMemcpy"
        return "sync" if blocking else "runtime"
    if p == "Ascend Hardware":
        return "memcpy" if e["name"].upper().startswith("MEMCPY") else "kernel"
    return None  # Overlap Analysis: not an event


# -- timeline sample ------------------------------------------------------------------------------


def test_timeline_kinds_and_counts(raw, timeline):
    want = Counter(k for e in raw["xs"] if (k := expected_kind(e, raw["pname"])) is not None)
    got = dict(timeline.con.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall())
    assert got == dict(want)
    dev = dict(timeline.con.execute("SELECT device, count(*) FROM events GROUP BY device").fetchall())
    n_hw = sum(1 for e in raw["xs"] if raw["pname"][e["pid"]] == "Ascend Hardware")
    assert dev[True] == n_hw
    assert timeline.sources == ["ascend_pt"]


def test_timeline_times_are_exact_ns(raw, timeline):
    want = Counter(
        (e["name"], ns(e["ts"]), ns(e["dur"])) for e in raw["xs"] if raw["pname"][e["pid"]] != "Overlap Analysis"
    )
    got = Counter(timeline.con.execute("SELECT name, start_ns, dur_ns FROM events").fetchall())
    assert got == want
    # float64 would lose the last digits of '1704161511422904.204'
    first = min(raw["xs"], key=lambda e: Decimal(e["ts"]))
    assert timeline.con.execute("SELECT min(start_ns) FROM events").fetchone()[0] == ns(first["ts"])


def _enclosing(xs: list[dict], pid, tid, ts: Decimal) -> dict | None:
    """Innermost X slice on (pid, tid) containing ts (plain scan, independent of the reader)."""
    best = None
    for e in xs:
        if e["pid"] == pid and e["tid"] == tid:
            s = Decimal(e["ts"])
            if s <= ts <= s + Decimal(str(e["dur"])) and (best is None or s >= Decimal(best["ts"])):
                best = e
    return best


def test_timeline_host_to_device_links_share_corr(raw, timeline):
    by_cat: dict[tuple[str, str], dict[str, dict]] = {}
    for e in raw["events"]:
        if e["ph"] in ("s", "f"):
            by_cat.setdefault((e["cat"], str(e["id"])), {})[e["ph"]] = e
    h2d = [v for (cat, _), v in by_cat.items() if cat == "HostToDevice" and "s" in v and "f" in v]
    assert len(h2d) == 274  # the format doc's count; recomputed below from the file itself
    assert len(h2d) == sum(1 for e in raw["events"] if e["ph"] == "s" and e.get("cat") == "HostToDevice")
    rows = timeline.con.execute("SELECT pid, tid, start_ns, dur_ns, corr, ext_id, device FROM events").fetchall()
    index = {(r[0], r[1], r[2], r[3]): r for r in rows}
    pairs = 0
    for v in h2d:
        api = _enclosing(raw["xs"], v["s"]["pid"], v["s"]["tid"], Decimal(v["s"]["ts"]))
        task = next(
            e for e in raw["xs"] if e["pid"] == v["f"]["pid"] and e["tid"] == v["f"]["tid"] and e["ts"] == v["f"]["ts"]
        )
        assert api is not None and raw["pname"][api["pid"]] == "CANN"
        a = index[(str(api["pid"]), str(api["tid"]), ns(api["ts"]), ns(api["dur"]))]
        t = index[(str(task["pid"]), str(task["tid"]), ns(task["ts"]), ns(task["dur"]))]
        assert a[4] is not None and a[4] == t[4], (api["name"], task["name"])
        pairs += 1
    assert pairs == len(h2d)
    # every device task launched through a HostToDevice flow has a corr; the two MEMCPY_ASYNC tasks have none
    n_linked_tasks = len({(v["f"]["pid"], v["f"]["tid"], v["f"]["ts"]) for v in h2d})
    assert (
        timeline.con.execute("SELECT count(*) FROM events WHERE device AND corr IS NOT NULL").fetchone()[0]
        == n_linked_tasks
    )


def test_timeline_torch_op_to_kernel_ext_id(raw, timeline):
    flows: dict[str, dict] = {}
    for e in raw["events"]:
        if e.get("cat") == "async_npu":
            flows.setdefault(str(e["id"]), {})[e["ph"]] = e
    con = timeline.con
    checked = 0
    for v in flows.values():
        op = min(
            (
                e
                for e in raw["xs"]
                if e["pid"] == v["s"]["pid"] and e["tid"] == v["s"]["tid"] and e["ts"] == v["s"]["ts"]
            ),
            key=lambda e: e["dur"],
        )
        k_ext = con.execute(
            "SELECT ext_id FROM events WHERE device AND start_ns = ? AND tid = ?",
            [ns(v["f"]["ts"]), str(v["f"]["tid"])],
        ).fetchone()[0]
        o_ext = con.execute(
            "SELECT ext_id FROM events WHERE NOT device AND name = ? AND start_ns = ? AND tid = ?",
            [op["name"], ns(op["ts"]), str(op["tid"])],
        ).fetchall()
        assert k_ext is not None and (k_ext,) in o_ext
        checked += 1
    assert checked == len(flows) > 0


def test_timeline_overlap_lanes_become_vendor_overlap(raw, timeline):
    lanes = Counter()
    sums = Counter()
    for e in raw["xs"]:
        if raw["pname"][e["pid"]] == "Overlap Analysis":
            lanes[e["name"]] += 1
            sums[e["name"]] += ns(e["dur"])
    names = {
        "Computing": "computing",
        "Communication": "communication",
        "Communication(Not Overlapped)": "comm_not_overlapped",
        "Free": "free",
    }
    got = {
        r[0]: (r[1], r[2])
        for r in timeline.con.execute("SELECT lane, count(*), sum(dur_ns) FROM vendor_overlap GROUP BY lane").fetchall()
    }
    assert got == {names[k]: (lanes[k], sums[k]) for k in lanes}
    assert (
        timeline.con.execute(
            "SELECT count(*) FROM events WHERE cat = 'Overlap Analysis' OR name IN ('Computing', 'Free')"
        ).fetchone()[0]
        == 0
    )


def test_timeline_steps_tracks_and_kernels(raw, timeline):
    step = next(e for e in raw["xs"] if e["name"].startswith("ProfilerStep#"))
    s = timeline.con.execute("SELECT step, host_start_ns, host_end_ns FROM steps").fetchall()
    assert s == [(int(step["name"].split("#")[1]), ns(step["ts"]), ns(step["ts"]) + ns(step["dur"]))]
    threads = {(e["pid"], e["tid"]) for e in raw["events"] if e["ph"] == "M" and e["name"] == "thread_name"}
    threads |= {(e["pid"], e["tid"]) for e in raw["xs"]}
    assert timeline.con.execute("SELECT count(*) FROM tracks").fetchone()[0] == len(threads)
    # no kernel_details.csv: kernels come from the device lane; its Task Type gives AI_CPU, 'Other' is unknown
    want = Counter(
        e["args"]["Task Type"]
        for e in raw["xs"]
        if raw["pname"][e["pid"]] == "Ascend Hardware" and not e["name"].startswith("MEMCPY")
    )
    got = dict(timeline.con.execute("SELECT coalesce(core_type, 'Other'), count(*) FROM kernels GROUP BY 1").fetchall())
    assert got == {k.upper() if k != "Other" else k: v for k, v in want.items()}
    codes = {w.code for w in timeline.warnings}
    assert "missing_input" in codes  # kernel_details.csv is absent: said, not fatal


def test_timeline_breakdown_agrees_with_vendor_overlap_lanes(raw, timeline):
    """The compute / comm / overlapped / free split from the device lanes vs Ascend's Overlap Analysis.

    Compared over the lanes' own window (first to last device task; the step window is wider).
    Definitional differences, both small here:
    * the breakdown counts memcpy as device work (compute_only); CANN's Computing lane does not
      (the two MEMCPY_ASYNC tasks, 2.19 µs, are in its Free lane);
    * CANN's Free is "no device work"; the breakdown splits that time into host_only (a host
      thread busy) and free, so vendor Free ~ host_only_us + free_us.
    Tolerance: 1 % of the window.
    """
    from advisor.stages import breakdown

    lanes: dict[str, list[tuple[int, int]]] = {}
    for e in raw["xs"]:
        if raw["pname"][e["pid"]] == "Overlap Analysis":
            lanes.setdefault(e["name"], []).append((ns(e["ts"]), ns(e["dur"])))
    lo = min(s for v in lanes.values() for s, _ in v)
    hi = max(s + d for v in lanes.values() for s, d in v)
    vendor = {k: sum(d for _, d in v) / 1000.0 for k, v in lanes.items()}
    cur = timeline.con.cursor()
    cur.execute(
        "CREATE OR REPLACE TABLE lane_window AS SELECT rank, step, ?::BIGINT AS start_ns, ?::BIGINT AS end_ns FROM steps",
        [lo, hi],
    )
    bd = breakdown.compute(timeline.con, windows="lane_window")
    row = bd.iloc[0]
    window_us = (hi - lo) / 1000.0
    tol = 0.01 * window_us
    assert abs(row["step_us"] - window_us) < 1e-6
    assert abs(row["compute_us"] - vendor["Computing"]) <= tol
    assert abs(row["comm_us"] - vendor.get("Communication", 0.0)) <= tol
    comm_not_overlapped = vendor.get("Communication(Not Overlapped)", 0.0)
    assert abs(row["comm_only_us"] - comm_not_overlapped) <= tol
    assert abs(row["overlapped_us"] - (vendor.get("Communication", 0.0) - comm_not_overlapped)) <= tol
    assert abs((row["free_us"] + row["host_only_us"]) - vendor["Free"]) <= tol
    # and the device-only split computed directly from the events agrees as well
    busy = timeline.con.execute(
        """WITH iv AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM events WHERE device AND kind = 'kernel'),
        o AS (SELECT s, e, max(e) OVER (ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pe FROM iv),
        g AS (SELECT s, e, sum(CASE WHEN pe IS NULL OR s > pe THEN 1 ELSE 0 END) OVER (ORDER BY s) AS grp FROM o)
        SELECT sum(e2 - s2) FROM (SELECT min(s) s2, max(e) e2 FROM g GROUP BY grp)"""
    ).fetchone()[0]
    assert abs(busy / 1000.0 - vendor["Computing"]) <= tol


# -- kernel_details sample -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kd_rows() -> list[dict]:
    with KD.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_kernels_rows_core_types_block_dim(kd_rows, kernels):
    con = kernels.con
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == len(kd_rows)
    want = Counter(r["Accelerator Core"] for r in kd_rows)
    assert dict(con.execute("SELECT core_type, count(*) FROM kernels GROUP BY 1").fetchall()) == dict(want)
    want_block = Counter((r["Name"], int(r["Block Dim"])) for r in kd_rows)
    assert Counter(con.execute("SELECT name, block_dim FROM kernels").fetchall()) == want_block
    n_mix_na = sum(1 for r in kd_rows if r["Mix Block Dim"] == "N/A")
    assert con.execute("SELECT count(*) FROM kernels WHERE mix_block_dim IS NULL").fetchone()[0] == n_mix_na


def test_kernels_units_shapes_dtypes_formats(kd_rows, kernels):
    con = kernels.con

    def shape(v: str) -> str | None:
        return None if v == "N/A" else v[1:-1] if v.startswith('"') and v.endswith('"') else v

    def na(v: str) -> str | None:
        return None if v in ("N/A", "") else v

    want = Counter(
        (
            r["Name"],
            ns(r["Start Time(us)"]),
            ns(r["Duration(us)"]),
            ns(r["Wait Time(us)"]) if r["Wait Time(us)"] != "N/A" else None,
            shape(r["Input Shapes"]),
            na(r["Input Data Types"]),
            na(r["Input Formats"]),
            shape(r["Output Shapes"]),
            na(r["Output Data Types"]),
            na(r["Output Formats"]),
            int(r["Step Id"]),
        )
        for r in kd_rows
    )
    got = Counter(
        con.execute(
            """SELECT name, start_ns, dur_ns, wait_ns, input_shapes, input_dtypes, input_formats, output_shapes,
                  output_dtypes, output_formats, step FROM kernels"""
        ).fetchall()
    )
    assert got == want
    # a shape with a comma survives CSV quoting: raw text """4,1025""" -> "4,1025" -> 4,1025
    assert any(r["Input Shapes"] == '"4,1025"' for r in kd_rows)
    assert con.execute("SELECT count(*) FROM kernels WHERE input_shapes = '4,1025'").fetchone()[0] == sum(
        1 for r in kd_rows if r["Input Shapes"] == '"4,1025"'
    )


def test_kernels_pmu_json(kd_rows, kernels):
    base = {
        "Step Id",
        "Model ID",
        "Task ID",
        "Stream ID",
        "Name",
        "Type",
        "Accelerator Core",
        "Start Time(us)",
        "Duration(us)",
        "Wait Time(us)",
        "Block Dim",
        "Mix Block Dim",
        "Input Shapes",
        "Input Data Types",
        "Input Formats",
        "Output Shapes",
        "Output Data Types",
        "Output Formats",
        "Context ID",
    }
    pmu_cols = [c for c in kd_rows[0] if c not in base]
    assert len(pmu_cols) == 14
    con = kernels.con
    for r in kd_rows[:60]:
        (pmu,) = con.execute(
            "SELECT pmu FROM kernels WHERE name = ? AND start_ns = ?", [r["Name"], ns(r["Start Time(us)"])]
        ).fetchone()
        vals = {c: r[c] for c in pmu_cols}
        if all(v == "N/A" for v in vals.values()):
            assert pmu is None  # N/A -> NULL (HCCL, AI_CPU rows)
        else:
            got = json.loads(pmu)
            assert {k: float(v) for k, v in vals.items() if v != "N/A"} == {
                k: v for k, v in got.items() if v is not None
            }


def test_kernels_sample_builds_device_events_and_steps(kd_rows, kernels):
    con = kernels.con
    n_hccl = sum(1 for r in kd_rows if r["Accelerator Core"] == "HCCL")
    assert dict(con.execute("SELECT kind, count(*) FROM events GROUP BY 1").fetchall()) == {
        "comm": n_hccl,
        "kernel": len(kd_rows) - n_hccl,
    }
    assert con.execute("SELECT bool_and(device) FROM events").fetchone()[0]
    # no ProfilerStep marker: the step window comes from the vendor's Step Id
    starts = [ns(r["Start Time(us)"]) for r in kd_rows]
    ends = [ns(r["Start Time(us)"]) + ns(r["Duration(us)"]) for r in kd_rows]
    assert con.execute("SELECT step, start_ns, end_ns FROM steps").fetchall() == [(1, min(starts), max(ends))]
    # HCCL rows double as communication operators when communication.json is absent
    assert con.execute("SELECT count(*) FROM comm_ops").fetchone()[0] == n_hccl
    assert con.execute("SELECT count(DISTINCT op_type) FROM comm_ops").fetchone()[0] == len(
        {r["Type"].removeprefix("hcom_").rstrip("_").lower() for r in kd_rows if r["Accelerator Core"] == "HCCL"}
    )


def test_kernels_sample_breakdown_exists(kernels):
    from advisor.stages import breakdown

    bd = breakdown.compute(kernels.con)
    assert len(bd) == 1 and bd.iloc[0]["compute_us"] > 0 and bd.iloc[0]["comm_us"] > 0


# -- copies in sample_profiles -------------------------------------------------------------------


def test_sample_profile_copies_are_identical_with_provenance():
    shared_readme = (ASCEND_DATA / "README.md").read_text()
    t = REPO / "sample_profiles" / "ascend_pt_timeline"
    k = REPO / "sample_profiles" / "ascend_pt_kernels"
    assert gzip.decompress((t / "ASCEND_PROFILER_OUTPUT" / "trace_view.json.gz").read_bytes()) == TRACE.read_bytes()
    assert (k / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").read_bytes() == KD.read_bytes()
    for d, needle in ((t, "timeline_advice/trace_view.json"), (k, "compute_advice/kernel_details.csv")):
        readme = (d / "README.md").read_text()
        assert needle in readme and needle in shared_readme and "Provenance:" in readme
        assert all(f.stat().st_size < 500_000 for f in d.rglob("*") if f.is_file())


def test_sample_profile_gz_copy_loads_the_same(timeline):
    ctx = load_profile(REPO / "sample_profiles" / "ascend_pt_timeline")
    q = "SELECT kind, count(*), sum(dur_ns), count(corr) FROM events GROUP BY kind ORDER BY kind"
    assert ctx.con.execute(q).fetchall() == timeline.con.execute(q).fetchall()


@pytest.mark.parametrize("sample", [pytest.param(s, marks=profile_group(SAMPLES / s))
                                    for s in ("ascend_pt_timeline", "ascend_pt_kernels")])
def test_analyze_report_is_schema_valid(sample):
    from tests.conftest import report_json, shared_report

    data = report_json(shared_report(SAMPLES / sample))
    assert data["profile"]["sources"] == ["ascend_pt"]
    assert data["breakdown"] and data["breakdown"][0]["rank"] == 0
