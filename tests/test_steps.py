"""Step windows (advisor/ingest/steps.py): one definition for every source, fair to a device that
lags behind the host.

The traces are written here: every step launches the same device work (5 kernels of 19.1 ms,
95.5 ms per step) while the host runs ahead, so each step's device time is 95.5 ms by
construction; none may absorb the backlog of the others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from advisor.analyze import analyze
from advisor.config import Config
from advisor.engine.context import load_profile
from advisor.ingest.steps import windows_sql
from tests.conftest import report_json

MS = 1000.0  # µs per ms (trace times are µs)
KERNEL_MS = 19.1
KERNELS = 5
STEP_MS = KERNEL_MS * KERNELS  # 95.5 ms of device work per step
STEPS = 8


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _lagging_trace(tmp_path: Path, host_step_ms: float, backlog_ms: float) -> Path:
    """Host markers of ``host_step_ms`` each; the device runs every step's kernels back to back
    on one stream, after ``backlog_ms`` of kernels queued before the profile (no launch in the
    trace, as warm-up work still running when profiling starts)."""
    ev: list[dict[str, Any]] = []
    dev_free = 0.0
    corr = 1
    if backlog_ms > 0:
        n = 4
        for i in range(n):
            ev.append(_x("kernel", "warmup_kernel", i * backlog_ms * MS / n, backlog_ms * MS / n, tid=7, pid=0,
                         correlation=90_000 + i, stream=7))
        dev_free = backlog_ms * MS
    for i in range(STEPS):
        step = 100 + i
        hs = i * host_step_ms * MS
        ev.append(_x("user_annotation", f"ProfilerStep#{step}", hs, host_step_ms * MS))
        for j in range(KERNELS):
            launch = hs + (j + 1) * 2 * MS
            ev.append(_x("cpu_op", "aten::conv2d", launch - 100, 200))
            ev.append(_x("cuda_runtime", "cudaLaunchKernel", launch, 10, correlation=corr))
            start = max(dev_free, launch + 5)
            ev.append(_x("kernel", "conv_kernel", start, KERNEL_MS * MS, tid=7, pid=0, correlation=corr, stream=7))
            dev_free = start + KERNEL_MS * MS
            corr += 1
    (tmp_path / "rank-0.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return tmp_path


@pytest.mark.parametrize(
    ("host_step_ms", "backlog_ms"),
    [
        (STEP_MS, 89.0),  # steady state: the host stays 89 ms ahead from the first step on
        (90.0, 0.0),  # the host is faster: the lag grows by 5.5 ms a step, 38.5 ms by the last
        (STEP_MS, 0.0),  # no lag at all
    ],
)
def test_every_step_gets_its_own_device_time(tmp_path: Path, host_step_ms: float, backlog_ms: float) -> None:
    ctx = load_profile(_lagging_trace(tmp_path, host_step_ms, backlog_ms))
    rows = ctx.con.execute("SELECT step, (end_ns - start_ns) / 1e6 FROM steps ORDER BY step").fetchall()
    assert [r[0] for r in rows] == list(range(100, 100 + STEPS))
    # every step but the last is the 95.5 ms period; the last, with no step after it, also
    # holds its host time before its first kernel (launched 2 ms into its marker)
    for step, ms in rows[:-1]:
        assert ms == pytest.approx(STEP_MS, abs=0.01), (step, ms)
    assert rows[-1][1] == pytest.approx(STEP_MS + 2.0, abs=0.01)
    # every step holds exactly the kernels it launched, and the host operators of its marker
    for name in ("conv_kernel", "aten::conv2d"):
        got = ctx.con.execute(
            "SELECT step, count(*) FROM events WHERE name = ? GROUP BY step ORDER BY step", [name]).fetchall()
        assert got == [(100 + i, KERNELS) for i in range(STEPS)], name


def test_a_lagging_device_raises_no_step_alarm(tmp_path: Path) -> None:
    report = analyze(_lagging_trace(tmp_path, STEP_MS, 89.0), Config())
    data = report_json(report)
    assert not [f for f in data["findings"] if f["rule"] == "CLU003"]
    got = [b["step_us"] for b in data["breakdown"]]
    assert got == pytest.approx([STEP_MS * MS] * (STEPS - 1) + [(STEP_MS + 2.0) * MS], abs=10)


def test_host_bound_steps_keep_the_host_window(tmp_path: Path) -> None:
    """Device work shorter than the host step, an idle device at each launch: the windows are the
    host markers."""
    ev: list[dict[str, Any]] = []
    for i in range(4):
        hs = i * 100 * MS
        ev.append(_x("user_annotation", f"ProfilerStep#{i + 1}", hs, 100 * MS))
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", hs + 10 * MS, 10, correlation=i + 1))
        ev.append(_x("kernel", "k", hs + 10 * MS + 5, 20 * MS, tid=7, pid=0, correlation=i + 1))
    (tmp_path / "rank-0.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    ctx = load_profile(tmp_path)
    rows = ctx.con.execute("SELECT step, start_ns, end_ns FROM steps ORDER BY step").fetchall()
    assert rows == [(i + 1, i * 100_000_000, (i + 1) * 100_000_000) for i in range(4)]


def _windows(marks: list[tuple[int, int, int]], src: list[tuple[Any, ...]] | None) -> list[tuple]:
    """Windows of ``marks`` (step, host start, host end) over ``src`` (device?, start, duration,
    correlation id[, stream]): host events on thread 1, device tasks on stream 7 unless given."""
    con = duckdb.connect()
    con.execute("CREATE TABLE m (rank INTEGER, step INTEGER, host_start_ns BIGINT, host_end_ns BIGINT)")
    con.executemany("INSERT INTO m VALUES (0, ?, ?, ?)", marks)
    con.execute("CREATE TABLE e (rank INTEGER, device BOOLEAN, tid VARCHAR, start_ns BIGINT, dur_ns BIGINT, corr BIGINT)")
    if src:
        rows = [(r[0], (r[4] if len(r) > 4 else "7") if r[0] else "1", *r[1:4]) for r in src]
        con.executemany("INSERT INTO e VALUES (0, ?, ?, ?, ?, ?)", rows)
    sql = windows_sql("m", "e" if src is not None else None)
    return [tuple(r) for r in con.execute(f"SELECT step, start_ns, end_ns FROM ({sql}) ORDER BY step").fetchall()]


def test_windows_follow_launch_links() -> None:
    """Two steps of 100 ns on the host, each launching 150 ns of device work (one stream). Step 1's
    task, launched at 10, waits for earlier work (0-60) and starts at 60: step 1 starts 50 late.
    Step 2's, launched at 110, waits behind step 1's and unlinked work (to 300): 190 late. The
    last step ends where its own work ends (450); later unlinked work (500-510) extends no step."""
    marks = [(1, 0, 100), (2, 100, 200)]
    src = [(True, 0, 60, None), (False, 10, 5, 1), (True, 60, 150, 1), (True, 210, 90, None),
           (False, 110, 5, 2), (True, 300, 150, 2), (True, 500, 10, None)]
    assert _windows(marks, src) == [(1, 50, 290), (2, 290, 450)]


def test_windows_do_not_move_for_a_device_idle_at_the_launch() -> None:
    """The first task starts 10 after its launch, but nothing ran before it on its stream (a
    launch latency, not a lag): the step starts at its marker."""
    src = [(False, 10, 5, 1), (True, 20, 100, 1)]
    assert _windows([(1, 0, 100)], src) == [(1, 0, 120)]
    # work on another stream does not hold it back either; on its own stream it does
    assert _windows([(1, 0, 100)], [(True, 0, 60, None, "20"), (False, 10, 5, 1), (True, 60, 100, 1)]) == [(1, 0, 160)]
    assert _windows([(1, 0, 100)], [(True, 0, 60, None), (False, 10, 5, 1), (True, 60, 100, 1)]) == [(1, 50, 160)]


def test_windows_of_a_new_cycle_start_after_work_queued_before_it() -> None:
    """A cycle's first step whose device is busy with work from before it until 80: its first
    task, launched at 10, waits until 80, so the step starts 70 after its marker."""
    src = [(True, 0, 80, None), (False, 10, 5, 1), (True, 80, 100, 1)]
    assert _windows([(1, 0, 100)], src) == [(1, 70, 180)]


def test_windows_of_step_spans_without_links_tile() -> None:
    """Without launch links (vendor step ids: the marks are device spans), consecutive steps tile."""
    assert _windows([(1, 0, 90), (2, 100, 190), (4, 300, 350)], None) == [(1, 0, 100), (2, 100, 190), (4, 300, 350)]


def _cut_db_copy(src: Path, dst: Path, keep_marker: bool) -> dict[int, tuple[int, int, int]]:
    """Copy a `.db` export, ending each rank's step on the host halfway through its marker (in
    PYTORCH_API and STEP_TIME alike), so that device work launched before the cut runs past it;
    ``keep_marker=False`` also deletes the ProfilerStep row, leaving STEP_TIME alone to give it.
    Returns rank -> (host start, cut, end of the device tasks launched before the cut, how long
    the first of them waited after its launch for the task before it on its stream), read with
    sqlite3: the tasks sharing a connection id with a CANN_API call that starts in the range."""
    import shutil
    import sqlite3

    shutil.copytree(src, dst)
    out = {}
    for db in dst.glob("*_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_*.db"):
        rank = int(db.stem.rsplit("_", 1)[1])
        con = sqlite3.connect(db)
        ((start, end),) = con.execute("SELECT startNs, endNs FROM STEP_TIME").fetchall()
        cut = (start + end) // 2
        marker = "name IN (SELECT id FROM STRING_IDS WHERE value LIKE 'ProfilerStep#%')"
        if keep_marker:
            assert con.execute(f"UPDATE PYTORCH_API SET endNs = ? WHERE {marker}", (cut,)).rowcount == 1
        else:
            assert con.execute(f"DELETE FROM PYTORCH_API WHERE {marker}").rowcount == 1
        con.execute("UPDATE STEP_TIME SET endNs = ?", (cut,))
        launched = """FROM TASK t JOIN CANN_API a ON a.connectionId = t.connectionId
            WHERE a.startNs >= ? AND a.startNs < ?"""
        (dev_end,) = con.execute(f"SELECT max(t.endNs) {launched}", (start, cut)).fetchone()
        # the first launch's wait for the task before its own on its stream to end
        (ls, ds, dev, stream) = con.execute(
            f"SELECT a.startNs, t.startNs, t.deviceId, t.streamId {launched} ORDER BY a.startNs, t.startNs LIMIT 1",
            (start, cut)).fetchone()
        prev = con.execute("SELECT endNs FROM TASK WHERE deviceId = ? AND streamId = ? AND startNs < ? "
                           "ORDER BY startNs DESC LIMIT 1", (dev, stream, ds)).fetchone()
        delay = max(min(ds, prev[0]) - ls, 0) if prev else 0
        con.commit()
        con.close()
        out[rank] = (start, cut, dev_end, delay)
    return out


@pytest.mark.slow
def test_db_step_time_gives_the_windows_the_step_events_give(tmp_path: Path) -> None:
    """A `.db` export without ProfilerStep rows in PYTORCH_API takes its steps from STEP_TIME, by
    the same definition as from the events: on the real export of tests/data/ascend_real with
    its host step cut short, both end each step where the device work launched in it ends."""
    src = Path(__file__).resolve().parent / "data" / "ascend_real" / "ascend_pt_resnet_ddp_l1_db"
    facts = _cut_db_copy(src, tmp_path / "events", keep_marker=True)
    assert _cut_db_copy(src, tmp_path / "step_time", keep_marker=False) == facts
    q = "SELECT rank, step, start_ns, end_ns, host_start_ns, host_end_ns FROM steps ORDER BY rank, step"
    by_events = load_profile(tmp_path / "events").con.execute(q).fetchall()
    by_step_time = load_profile(tmp_path / "step_time").con.execute(q).fetchall()
    assert by_step_time == by_events
    assert [r[:2] for r in by_events] == [(0, 50), (1, 50)]
    for rank, _step, start, end, host_start, host_end in by_events:
        s, cut, dev_end, delay = facts[rank]
        assert (start, host_start, host_end) == (s + delay, s, cut)
        assert dev_end > cut  # precondition: the device runs past the host's cut
        assert end == dev_end
