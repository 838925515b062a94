"""Real torch_npu exports (tests/data/ascend_real, see its README): the breakdown agrees with the
vendor's own step table in both export forms.

The vendor figures are read here with ``csv`` / ``sqlite3``, independently of the advisor.
"""

from __future__ import annotations

import csv
import functools
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import profile_group, report_json

DATA = Path(__file__).resolve().parents[1] / "data" / "ascend_real"
TEXT = DATA / "ascend_pt_resnet_ddp_l1_text"
DB = DATA / "ascend_pt_resnet_ddp_l1_db"
UINT32_MAX = 4294967295


@functools.cache
def _loaded(root: Path) -> Any:
    """``load_profile(root)`` once per test process: the tests below only read its tables."""
    from advisor.engine.context import load_profile

    return load_profile(root)


def _rank(export: Path) -> int:
    info = next(export.glob("profiler_info_*.json"))
    return int(json.loads(info.read_text())["rank_id"])


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


def vendor_steps(root: Path) -> dict[tuple[int, int], dict[str, float]]:
    """(rank, step) -> the vendor's Computing / Communication(Not Overlapped) / Overlapped / Stage, µs."""
    out: dict[tuple[int, int], dict[str, float]] = {}
    for export in sorted(root.glob("*_ascend_pt")):
        rank = _rank(export)
        out_dir = export / "ASCEND_PROFILER_OUTPUT"
        if (out_dir / "step_trace_time.csv").exists():
            with (out_dir / "step_trace_time.csv").open(newline="") as fh:
                rows = [
                    (r["Step"], r["Computing"], r["Communication(Not Overlapped)"], r["Overlapped"], r["Stage"])
                    for r in csv.DictReader(fh)
                ]
        else:
            con = _ro(out_dir / "analysis.db")
            rows = con.execute(
                "SELECT step, computing, communication_not_overlapped, overlapped, stage FROM StepTraceTime"
            ).fetchall()
            con.close()
        for step, computing, cno, ov, stage in rows:
            out[(rank, int(step))] = {
                "computing": float(computing),
                "cno": float(cno),
                "overlapped": float(ov),
                "stage": float(stage),
            }
    return out


def _assert_agrees(bd: list[dict[str, Any]], vendor: dict[tuple[int, int], dict[str, float]]) -> None:
    by_key = {(int(b["rank"]), int(b["step"])): b for b in bd}
    assert set(by_key) == set(vendor)  # both ranks read (a .db rank used to be dropped whole)
    for key, v in vendor.items():
        b = by_key[key]
        tol = 0.02 * v["stage"]
        assert abs(b["compute_only_us"] + b["overlapped_us"] - v["computing"]) <= tol, (key, b, v)
        assert abs(b["comm_only_us"] - v["cno"]) <= tol, (key, b, v)
        assert abs(b["overlapped_us"] - v["overlapped"]) <= tol, (key, b, v)


# the quick suite checks the text form; the marked run both
@pytest.mark.parametrize("form", [pytest.param("text", marks=profile_group(TEXT)),
                                  pytest.param("db", marks=[profile_group(DB), pytest.mark.slow])])
def test_breakdown_agrees_with_vendor_step_table(form: str) -> None:
    from advisor.stages import breakdown

    root = TEXT if form == "text" else DB
    vendor = vendor_steps(root)
    assert set(vendor) == {(0, 50), (1, 50)}
    ctx = _loaded(root)
    assert not [w for w in ctx.warnings if w.code in ("bad_file", "bad_db", "bad_export")]
    bd = breakdown.compute(ctx.con)
    _assert_agrees(bd.to_dict("records"), vendor)
    assert breakdown.vendor_check(ctx.con, bd) == []


@pytest.mark.slow
@pytest.mark.parametrize("form", ["text", "db"])
def test_report_agrees_with_vendor_step_table(form: str) -> None:
    from advisor.analyze import analyze

    root = TEXT if form == "text" else DB
    data = report_json(analyze(root))
    _assert_agrees(data["breakdown"], vendor_steps(root))
    codes = {w["code"] for w in data["warnings"]}
    assert not codes & {"vendor_mismatch", "vendor_steps_unmatched", "cpu_only", "bad_file", "bad_db"}


@profile_group(TEXT)
def test_text_hccl_stream_tasks_are_communication() -> None:
    """SDMA and Write Value run on the stream HCCL's tasks name: communication, not computation.
    Computation is then the AI Core / AI Vector kernels alone, which the vendor counts as Computing."""
    from advisor.stages import breakdown

    ctx = _loaded(TEXT)
    kinds = ctx.con.execute(
        "SELECT DISTINCT kind::VARCHAR FROM events WHERE device AND name IN ('SDMA', 'Write Value')"
    ).fetchall()
    assert kinds == [("comm",)]
    bd = breakdown.compute(ctx.con)
    vendor = vendor_steps(TEXT)
    for r in bd.itertuples():
        # kernels only (no memcpy): within 0.1 % of the vendor's Computing
        assert abs(r.kernel_us - vendor[(r.rank, r.step)]["computing"]) <= 0.001 * vendor[(r.rank, r.step)]["computing"]


@profile_group(DB)
def test_db_not_applicable_ids_read_as_null() -> None:
    """4294967295 in COMMUNICATION_TASK_INFO means 'not applicable': the row is kept, the id is NULL."""

    expected = {}
    for export in sorted(DB.glob("*_ascend_pt")):
        con = _ro(next((export / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler_*.db")))
        n, n_dst = con.execute(
            "SELECT count(*), sum(dstRank = ?) FROM COMMUNICATION_TASK_INFO h JOIN TASK t USING (globalTaskId)",
            [UINT32_MAX],
        ).fetchone()
        con.close()
        expected[_rank(export)] = (n, n_dst)
    assert all(n_dst > 0 for _, n_dst in expected.values())  # the data has them
    ctx = _loaded(DB)
    got = {
        r: (n, n_null)
        for r, n, n_null in ctx.con.execute(
            "SELECT rank, count(*), count(*) FILTER (WHERE dst_rank IS NULL) FROM comm_tasks GROUP BY rank"
        ).fetchall()
    }
    assert got == expected
    assert not [w for w in ctx.warnings if w.code in ("bad_file", "bad_db")]


def _corrupt(db: Path) -> None:
    raw = db.read_bytes()
    db.write_bytes(raw[:100] + b"\x00" * 4096 + raw[4196:])  # pages after the header overwritten


def test_every_device_source_failing_is_an_input_error(tmp_path: Path) -> None:
    root = tmp_path / "prof"
    shutil.copytree(DB, root)
    dbs = sorted(root.glob("*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_*.db"))
    for db in dbs:
        _corrupt(db)
    p = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "analyze", str(root), "--format", "json", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "Traceback" not in p.stderr
    assert last.startswith("advisor: ") and "ascend_pytorch_profiler_" in last and "SQLite" in last
    assert not (tmp_path / "r.json").exists()


def test_one_rank_without_device_data_is_skipped(tmp_path: Path) -> None:
    """The other rank is still analysed; the skipped rank leaves nothing behind (its analysis.db read fine)."""
    from advisor.engine.context import load_profile

    root = tmp_path / "prof"
    shutil.copytree(DB, root)
    bad = next(root.glob("rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_*.db"))
    _corrupt(bad)
    ctx = load_profile(root)
    assert ctx.ranks == [1]
    assert any(w.code == "bad_export" and str(bad) in w.message for w in ctx.warnings)
    for table in ("vendor_steps", "comm_ops", "comm_matrix"):
        assert ctx.con.execute(f"SELECT count(*) FROM {table} WHERE rank = 0").fetchone()[0] == 0


def test_vendor_check_names_both_figures_and_unmatched_steps() -> None:
    import duckdb

    from advisor.schema import create_all
    from advisor.stages import breakdown

    con = duckdb.connect()
    create_all(con)
    # rank 0 step 3: Computing 10 ms, Communication(Not Overlapped) 20 ms, Overlapped 5 ms, Stage 100 ms
    con.execute("INSERT INTO vendor_steps (rank, step, computing_ns, comm_not_overlapped_ns, overlapped_ns, free_ns, stage_ns) "
                "VALUES (0, 3, 10000000, 20000000, 5000000, 70000000, 100000000), "
                "(0, 9, 1, 1, 1, 1, 100000000)")
    df = pd.DataFrame([
        # compute 13 ms (3 % of Stage off), comm_only 21 ms (1 %), overlapped 5 ms
        {"rank": 0, "step": 3, "compute_only_us": 8000.0, "overlapped_us": 5000.0, "comm_only_us": 21000.0},
        {"rank": 0, "step": 4, "compute_only_us": 1.0, "overlapped_us": 0.0, "comm_only_us": 0.0},
    ])
    out = breakdown.vendor_check(con, df)
    mism = [m for c, m in out if c == "vendor_mismatch"]
    assert len(mism) == 1 and "13000.0" in mism[0] and "10000.0" in mism[0] and "Computing" in mism[0]
    unmatched = [m for c, m in out if c == "vendor_steps_unmatched"]
    assert len(unmatched) == 1 and "9" in unmatched[0] and "3, 4" in unmatched[0]
    # within 2 %: silent
    df.loc[0, "compute_only_us"] = 6500.0  # 11.5 ms: 1.5 % of Stage
    assert [c for c, _ in breakdown.vendor_check(con, df.iloc[:1])] == ["vendor_steps_unmatched"]


def _level0(src: Path, dst: Path) -> None:
    """A Level0 export of the same step: torch_npu drops the CANN layer and its flows at Level0
    (format doc §2.5); here every flow event goes too, so no device task has a launch link."""
    import gzip

    shutil.copytree(src, dst)
    tv = dst / "ASCEND_PROFILER_OUTPUT" / "trace_view.json.gz"
    events = json.loads(gzip.decompress(tv.read_bytes()))
    cann = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and e["args"].get("name") == "CANN"}
    kept = [e for e in events if e.get("pid") not in cann and e.get("ph") not in ("s", "f", "t")]
    tv.write_bytes(gzip.compress(json.dumps(kept).encode()))


def test_level0_critical_path_follows_the_device(tmp_path: Path) -> None:
    from advisor.analyze import analyze

    src = TEXT / "rank0_ascend_pt"
    _level0(src, tmp_path / "rank0_ascend_pt")
    data = report_json(analyze(tmp_path / "rank0_ascend_pt"))
    cp = data["critical_path"]
    assert "launch links" in cp["note"]
    assert any(w["code"] == "critical_path_no_links" for w in data["warnings"])
    v = vendor_steps(TEXT)[(0, 50)]
    # the communication the vendor finds overlapping nothing holds the device alone: a path that
    # follows the device passes through it; no host call waiting on the device owns that time
    assert cp["by_kind_us"]["communication"] >= 0.9 * v["cno"]
    host = [o for o in cp["ops"] if o["kind"] == "host"]
    assert max(o["total_us"] for o in host) < 0.1 * cp["length_us"]


PROF = "PROF_000001_20250109071234567_ABCDEFGHIJ"  # stand-alone msprof folder name (format doc §2.3)


def test_msprof_text_export_is_read(tmp_path: Path) -> None:
    """msprof's mindstudio_profiler_output/msprof_<ts>.json is the trace_view format without the
    framework events (format doc §18): built here from rank 0's timeline."""
    import gzip

    from advisor.engine.context import load_profile
    from advisor.stages import breakdown

    out = tmp_path / PROF / "mindstudio_profiler_output"
    out.mkdir(parents=True)
    (tmp_path / PROF / "device_0").mkdir()
    (tmp_path / PROF / "device_0" / "info.json.0").write_text('{"DeviceInfo": [{"id": 0}], "rank_id": -1}')
    events = json.loads(gzip.decompress((TEXT / "rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json.gz").read_bytes()))
    framework = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                 and e["args"].get("name") in ("Python", "Overlap Analysis")}
    (out / "msprof_20250109071300.json").write_text(json.dumps([e for e in events if e.get("pid") not in framework]))
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0] and ctx.has_device
    bd = breakdown.compute(ctx.con)
    assert len(bd) == 1  # no step marker: the whole trace, which holds the one recorded step
    v = vendor_steps(TEXT)[(0, 50)]
    b = bd.iloc[0]
    assert abs(b["compute_only_us"] + b["overlapped_us"] - v["computing"]) <= 0.02 * v["stage"]
    assert abs(b["comm_only_us"] - v["cno"]) <= 0.02 * v["stage"]


def test_msprof_db_is_read(tmp_path: Path) -> None:
    """PROF_*/msprof_<ts>.db is CANN's unified db (format doc §18); the torch_npu db is that db plus
    the framework's tables, so a copy of it stands in for one."""
    from advisor.engine.context import load_profile

    (tmp_path / PROF).mkdir()
    shutil.copy(DB / "rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db",
                tmp_path / PROF / "msprof_20250109071300.db")
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0] and ctx.has_device


def test_raw_msprof_folder_is_refused_with_what_to_export(tmp_path: Path) -> None:
    prof = tmp_path / PROF
    (prof / "device_0" / "data").mkdir(parents=True)
    (prof / "device_0" / "info.json.0").write_text('{"DeviceInfo": [{"id": 0}], "rank_id": -1}')
    (prof / "device_0" / "data" / "aicore.data.0.slice_0").write_bytes(b"\x5a\x00" * 64)
    p = subprocess.run([sys.executable, "-m", "advisor.cli", "analyze", str(tmp_path)],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and PROF in lines[0] and "msprof --export=on" in lines[0] and "_ascend_pt" in lines[0]


def test_db_computing_task_inside_a_collective_on_its_stream_is_communication(tmp_path: Path) -> None:
    """Two copies of a compute task moved onto the HCCL stream: the one inside a communication
    operator's window is a step of that collective, the one outside stays a kernel."""
    from advisor.engine.context import load_profile

    shutil.copytree(DB / "rank0_ascend_pt", tmp_path / "rank0_ascend_pt")
    path = next((tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler_*.db"))
    con = sqlite3.connect(path)
    (stream,) = con.execute(
        "SELECT DISTINCT t.streamId FROM TASK t JOIN COMMUNICATION_TASK_INFO h USING (globalTaskId)").fetchone()
    op_start, op_end = con.execute("SELECT startNs, endNs FROM COMMUNICATION_OP ORDER BY startNs LIMIT 1").fetchone()
    first_op = con.execute("SELECT min(startNs) FROM COMMUNICATION_OP").fetchone()[0]
    gid = con.execute("SELECT globalTaskId FROM COMPUTE_TASK_INFO LIMIT 1").fetchone()[0]
    top = con.execute("SELECT max(globalTaskId) FROM TASK").fetchone()[0]
    cols = [d[1] for d in con.execute("PRAGMA table_info(TASK)")]
    ccols = [d[1] for d in con.execute("PRAGMA table_info(COMPUTE_TASK_INFO)")]
    for new, start in ((top + 1, (op_start + op_end) // 2), (top + 2, first_op - 10_000_000)):
        sel = ", ".join({"globalTaskId": str(new), "streamId": str(stream), "startNs": str(start),
                         "endNs": str(start + 1000)}.get(c, c) for c in cols)
        con.execute(f"INSERT INTO TASK ({', '.join(cols)}) SELECT {sel} FROM TASK WHERE globalTaskId = ?", [gid])
        csel = ", ".join(str(new) if c == "globalTaskId" else c for c in ccols)
        con.execute(f"INSERT INTO COMPUTE_TASK_INFO ({', '.join(ccols)}) SELECT {csel} FROM COMPUTE_TASK_INFO "
                    "WHERE globalTaskId = ?", [gid])
    con.commit()
    con.close()
    ctx = load_profile(tmp_path / "rank0_ascend_pt")
    got = dict(ctx.con.execute(
        "SELECT start_ns, kind::VARCHAR FROM events WHERE device AND stream = ? AND start_ns IN (?, ?)",
        [stream, (op_start + op_end) // 2, first_op - 10_000_000]).fetchall())
    assert got == {(op_start + op_end) // 2: "comm", first_op - 10_000_000: "kernel"}


def _vendor_idle_ms(root: Path) -> dict[int, float]:
    """Per rank, the vendor's time inside its collectives that is neither transit nor wait (ms): Elapse −
    Transit − Wait summed over the collectives of communication.json / analysis.db CommAnalyzerTime."""
    out: dict[int, float] = {}
    for export in sorted(root.glob("*_ascend_pt")):
        rank = _rank(export)
        out_dir = export / "ASCEND_PROFILER_OUTPUT"
        if (out_dir / "communication.json").exists():
            data = json.loads((out_dir / "communication.json").read_text())
            ops = [v["Communication Time Info"] for step in data.values() for k, v in step["collective"].items()
                   if k != "Total Op Info"]
            out[rank] = sum(o["Elapse Time(ms)"] - o["Transit Time(ms)"] - o["Wait Time(ms)"] for o in ops)
        else:
            con = _ro(out_dir / "analysis.db")
            out[rank] = con.execute("SELECT sum(elapse_time - transit_time - wait_time) FROM CommAnalyzerTime "
                                    "WHERE type = 'collective'").fetchone()[0]
            con.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("form", ["text", "db"])
def test_all_reduce_idle_on_both_ranks_is_the_verdict(form: str) -> None:
    """The all-reduces sit idle on both ranks at once (the vendor's wait, a late peer, is small; so is the
    transit): COM001 names it as collectives idle, with the time idle on every member, and it is the
    verdict in both forms."""
    from advisor.analyze import analyze

    root = TEXT if form == "text" else DB
    idle = _vendor_idle_ms(root)
    assert set(idle) == {0, 1} and min(idle.values()) > 80  # checked by hand: 96.3 / 96.4 (text), 90.7 / 94.4 (db)
    data = report_json(analyze(root))
    f = next(x for x in data["findings"] if x["id"] == data["savings"]["verdict"])
    assert (f["rule"], f["cause"]) == ("COM001", "comm.collective_idle")
    # the rule's own figure is the time idle on every member; the saving is the replayed step (the
    # collectives waiting only for their transfer), which the idle time bounds
    assert f["evidence"]["saving_before_replay_us"] == pytest.approx(min(idle.values()) * 1000, rel=0.01)
    assert f["replay"]["estimated"] and f["replay"]["reproduced"]
    assert f["estimated_saving_us"] == f["replay"]["saving_us"]
    assert 0 < f["estimated_saving_us"] <= f["evidence"]["saving_before_replay_us"]
