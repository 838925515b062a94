"""The named steps of the Ascend timeline loader (``advisor.ingest.ascend_text``), each on a small
timeline written here: a torch op launches (async_npu flow) a task through one CANN call
(HostToDevice flow, id 5) on NPU 3, with its Overlap Analysis slice and two unusable slices."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from advisor.ingest import ascend_text as at
from advisor.ingest.base import ParseError
from advisor.schema import create_all

EXT_BASE = 1 << 62


def _m(pid: int, name: str, value: str, tid: int = 0) -> dict:
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": {"name" if name != "process_labels" else "labels": value}}


TRACE = [
    _m(1, "process_name", "Python"),
    _m(2, "process_name", "CANN"),
    _m(3, "process_name", "Ascend Hardware"),
    _m(3, "process_labels", "NPU 3"),
    _m(3, "thread_name", "Stream 7", tid=7),
    _m(4, "process_name", "Overlap Analysis"),
    {"ph": "X", "pid": 1, "tid": 1, "ts": "100", "dur": 50, "name": "aten::add", "cat": "cpu_op"},
    {"ph": "X", "pid": 2, "tid": 1, "ts": "110", "dur": 10, "name": "launch"},
    {"ph": "X", "pid": 3, "tid": 7, "ts": "200", "dur": 30, "name": "Add", "args": {"Task Type": "AI_CORE"}},
    {"ph": "X", "pid": 4, "tid": 1, "ts": "200", "dur": 30, "name": "Computing"},
    {"ph": "X", "pid": 1, "tid": 1, "ts": "300", "dur": -1, "name": "negative"},
    {"ph": "X", "pid": 1, "tid": 1, "dur": 5, "name": "no ts"},
    {"ph": "s", "pid": 2, "tid": 1, "ts": "112", "id": "5", "cat": "HostToDevice", "name": "h2d"},
    {"ph": "f", "pid": 3, "tid": 7, "ts": "200", "id": "5", "cat": "HostToDevice", "name": "h2d", "bp": "e"},
    {"ph": "s", "pid": 1, "tid": 1, "ts": "120", "id": "9", "cat": "async_npu", "name": "npu"},
    {"ph": "f", "pid": 3, "tid": 7, "ts": "200", "id": "9", "cat": "async_npu", "name": "npu", "bp": "e"},
]


@pytest.fixture
def staged(tmp_path: Path):
    """(cursor, stages, jobs, stats) with the trace's rows staged, nothing derived yet."""
    path = tmp_path / "trace_view.json"
    path.write_text(json.dumps(TRACE), encoding="utf-8")
    con = duckdb.connect()
    create_all(con)
    cur = con.cursor()
    t = at.TraceStages(*at._TRACE_STAGES)
    jobs = [at.Job(0, path, rank=0, fid=0, flags={"kernels": True})]
    at._stage_trace_rows(cur, jobs, t)
    yield cur, t, jobs, {0: {}}
    con.close()


def test_check_trace_counts(staged) -> None:
    cur, t, jobs, stats = staged
    at._check_trace_counts(cur, t, jobs, None, stats)
    assert stats == {0: {"bad_events": 1, "negative_events": 1, "long_names": 0}}
    with pytest.raises(ParseError, match=r"more than 5 events \(--max-events 5\): refused"):
        at._check_trace_counts(cur, t, jobs, 5, stats)


def test_stage_slices(staged) -> None:
    cur, t, _, _ = staged
    at._stage_slices(cur, t)
    got = cur.execute(f"SELECT name, layer, kind FROM {t.slices} ORDER BY ts_ns, name").fetchall()
    assert got == [("aten::add", "host", "host_op"), ("launch", "cann", "runtime"),
                   ("Add", "hw", "kernel"), ("Computing", "overlap", "other")]


def test_link_flows(staged) -> None:
    cur, t, _, stats = staged
    at._stage_slices(cur, t)
    at._link_flows(cur, t, stats)
    rid = dict(cur.execute(f"SELECT name, rid FROM {t.slices}").fetchall())
    corr = dict(cur.execute(f"SELECT rid, corr FROM {t.corr}").fetchall())
    ext = dict(cur.execute(f"SELECT rid, ext FROM {t.ext}").fetchall())
    assert corr == {rid["launch"]: 5, rid["Add"]: 5}  # the CANN call and the task it queued share flow id 5
    op = EXT_BASE + rid["aten::add"]  # the torch op's own id, lent to the task and to the call that launched it
    assert ext == {rid["aten::add"]: op, rid["Add"]: op, rid["launch"]: op}
    assert stats[0] == {"h2d_links": 1, "npu_links": 1}


def test_insert_trace_events(staged) -> None:
    cur, t, _, stats = staged
    at._stage_slices(cur, t)
    at._link_flows(cur, t, stats)
    at._insert_trace_events(cur, t, stats)
    got = cur.execute("SELECT name, kind, device, stream, start_ns, dur_ns, corr FROM events ORDER BY start_ns").fetchall()
    assert got == [("aten::add", "host_op", False, None, 100_000, 50_000, None),
                   ("launch", "runtime", False, None, 110_000, 10_000, 5),
                   ("Add", "kernel", True, 7, 200_000, 30_000, 5)]
    assert {k: stats[0][k] for k in ("events", "steps", "comm_events", "device_events", "overlap")} == {
        "events": 3, "steps": 0, "comm_events": 0, "device_events": 1, "overlap": 1}


def test_insert_trace_tracks(staged) -> None:
    cur, t, _, _ = staged
    at._stage_slices(cur, t)
    at._insert_trace_tracks(cur, t)
    assert cur.execute("SELECT lane, start_ns, dur_ns FROM vendor_overlap").fetchall() == [("computing", 200_000, 30_000)]
    dev = dict(cur.execute("SELECT pid || '/' || tid, device FROM tracks").fetchall())
    assert dev == {"1/1": False, "2/1": False, "3/7": True, "4/1": True}


def test_plane_tasks_fallbacks_and_device_ids(staged) -> None:
    cur, t, _, stats = staged
    at._stage_slices(cur, t)
    at._insert_plane_tasks(cur, t)
    at._insert_trace_fallbacks(cur, t)
    at._device_ids(cur, t, stats)
    assert cur.execute("SELECT count(*) FROM comm_tasks").fetchone()[0] == 0  # no HCCL lane
    # the export has no kernel_details.csv (flag kernels): the device lane's task is its kernel
    assert cur.execute("SELECT name, core_type, start_ns, dur_ns FROM kernels").fetchall() == [
        ("Add", "AI_CORE", 200_000, 30_000)]
    assert stats[0]["device_ids"] == [3]
