"""Breakdown and critical-path invariants on every Kineto sample.

For every real Kineto sample (``sample_profiles/kineto_*`` and the CPU traces in
``tests/data/kineto/``), for every (rank, step):

* the five breakdown classes (compute-only, overlapped, comm-only, host-only, free) add up to
  the step within 0.1 %, and the step equals its window in ``steps``;
* the critical path's length equals the step's wall time within 1 %, the time credited to the
  operators on it adds up to that length, and its segments tile the window without overlap;
* every critical-path operator kind is in the contract's enum.
"""

from __future__ import annotations

import json
import math
from functools import cache, lru_cache
from pathlib import Path

import pytest

from advisor.engine.context import load_profile
from advisor.stages import breakdown as breakdown_stage
from advisor.stages import critical_path as cp_stage
from tests.conftest import SAMPLES, SCHEMA_PATH, TRACES, profile_params, report_json, sample_dirs, shared_report

CLASSES = ("compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")


def _kineto_samples() -> list[Path]:
    out = sample_dirs("kineto_*")
    out += sorted(p for p in TRACES.iterdir() if p.is_dir() and any(p.glob("*.json*")))
    return out


SAMPLE_DIRS = _kineto_samples()
IDS = [p.name for p in SAMPLE_DIRS]


@cache
def _ctx(path: Path):
    return load_profile(path)


@lru_cache(maxsize=1)
def _cp_kinds() -> frozenset[str]:
    schema = json.loads(SCHEMA_PATH.read_text())
    return frozenset(schema["properties"]["critical_path"]["properties"]["ops"]["items"]["properties"]["kind"]["enum"])


def _windows(ctx) -> list[tuple[int, int, int, int]]:
    return ctx.con.cursor().execute("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY rank, step").fetchall()


def test_samples_found():
    assert any(p.parent == TRACES for p in SAMPLE_DIRS), "tests/data/kineto has no trace directories"
    if SAMPLES.is_dir():
        assert {"kineto_resnet50_num_workers_0", "kineto_two_ranks"} <= set(IDS)


@pytest.mark.parametrize("path", profile_params(SAMPLE_DIRS))
def test_five_classes_sum_to_step(path: Path):
    ctx = _ctx(path)
    bd = breakdown_stage.compute(ctx.con)
    windows = {(r, s): (e - b) / 1000.0 for r, s, b, e in _windows(ctx)}
    assert len(bd) == len(windows) > 0
    for row in bd.to_dict("records"):
        key = (row["rank"], row["step"])
        step_us = row["step_us"]
        assert step_us > 0, key
        # the step is its window, all of it
        assert step_us == pytest.approx(windows[key], rel=1e-3), key
        parts = [row[c] for c in CLASSES]
        assert all(p >= 0 for p in parts), (key, parts)
        assert sum(parts) == pytest.approx(step_us, rel=1e-3), (key, dict(zip(CLASSES, parts)))
        # the derived columns are consistent with the classes
        assert row["compute_us"] == pytest.approx(row["compute_only_us"] + row["overlapped_us"], abs=1e-6)
        assert row["comm_us"] == pytest.approx(row["comm_only_us"] + row["overlapped_us"], abs=1e-6)
        for extra in ("kernel_us", "memory_us", "dataloader_us", "host_busy_us"):
            assert -1e-6 <= row[extra] <= step_us * (1 + 1e-3), (key, extra, row[extra])
        if ctx.has_device:
            # device compute = kernels ∪ memcpy/memset, so each is at most the union
            assert row["kernel_us"] <= row["compute_us"] + 1e-6, key
            assert row["memory_us"] <= row["compute_us"] + 1e-6, key
        ratio = row["overlap_ratio"]
        if row["comm_us"] > 0:
            assert 0 <= ratio <= 1 + 1e-9, key
        else:
            assert ratio is None or math.isnan(ratio), key


@pytest.mark.parametrize("path", profile_params(SAMPLE_DIRS))
def test_critical_path_length_is_step_wall_time(path: Path):
    ctx = _ctx(path)
    kinds = _cp_kinds()
    for rank, step, start, end in _windows(ctx):
        wall_us = (end - start) / 1000.0
        cp = cp_stage.compute(ctx.con, rank, step, start, end, top_n=10**9)
        key = (rank, step)
        assert cp["length_us"] == pytest.approx(wall_us, rel=1e-2), key
        assert cp["ops"], key
        # every instant of the window is credited exactly once (the path is the whole step)
        assert cp["path_us"] == pytest.approx(wall_us, rel=1e-2), key
        assert cp["ops_total"] == len(cp["ops"]), key
        assert sum(o["total_us"] for o in cp["ops"]) == pytest.approx(wall_us, rel=1e-2), key
        segs = cp["segments"]
        assert segs, key
        pos = 0.0
        for s in segs:
            assert s["dur_us"] > 0, (key, s)
            assert s["start_us"] >= pos - 1e-3, (key, "segments overlap", s)
            pos = s["start_us"] + s["dur_us"]
        assert pos <= wall_us + 1e-3, key
        assert sum(s["dur_us"] for s in segs) == pytest.approx(wall_us, rel=1e-2), key
        bad = {o["kind"] for o in cp["ops"]} - kinds
        assert not bad, (key, f"critical-path kinds outside the contract enum: {sorted(bad)}")
        assert {s["kind"] for s in segs} <= kinds, key
        assert all(o["total_us"] > 0 and o["count"] >= 1 for o in cp["ops"]), key


@pytest.mark.parametrize("path", profile_params(SAMPLE_DIRS))
def test_report_breakdown_and_critical_path(path: Path):
    """The same invariants hold in the schema-valid JSON report of ``advisor analyze``."""
    data = report_json(shared_report(path))
    assert data["breakdown"], "empty breakdown"
    for row in data["breakdown"]:
        assert sum(row[c] for c in CLASSES) == pytest.approx(row["step_us"], rel=1e-3), row
    cp = data["critical_path"]
    focus = [r for r in data["breakdown"] if r["rank"] == cp["rank"] and r["step"] == cp["step"]]
    assert len(focus) == 1, (cp["rank"], cp["step"])
    assert cp["length_us"] == pytest.approx(focus[0]["step_us"], rel=1e-2)
    assert {o["kind"] for o in cp["ops"]} <= _cp_kinds()


@pytest.mark.parametrize("seed", range(6))
def test_packed_sort_matches_the_general_sort(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's packed-key sort (rank, time, flag and change in one int64) gives the sums of
    the general lexsort path, on random bounds with many equal times, nested and overlapping
    events of every class, windows with equal starts and bounds on several ranks."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n, ranks = 3000, 4
    s = rng.integers(0, 400, n).astype(np.int64) * 5  # coarse grid: many equal times
    ev = {"rank": rng.integers(0, ranks, n).astype(np.int32), "s": s, "e": s + rng.integers(1, 60, n) * 5,
          "pair": rng.integers(0, len(breakdown_stage._PAIRS), n).astype(np.int32)}
    ws = np.sort(rng.integers(0, 400, 40)).astype(np.int64) * 5
    win = {"rank": np.repeat(np.arange(ranks, dtype=np.int32), 10), "step": np.tile(np.arange(10, dtype=np.int32), ranks),
           "start_ns": ws, "end_ns": ws + rng.integers(0, 200, 40) * 5}
    rk = {"rank": np.arange(ranks, dtype=np.int32), "dev": np.array([True, False, True, True])}
    calls: list[int] = []
    real = np.lexsort
    monkeypatch.setattr(np, "lexsort", lambda keys: calls.append(len(keys[0])) or real(keys))
    packed = breakdown_stage._sweep(win, rk, {k: v.copy() for k, v in ev.items()})
    assert max(calls) == 40  # the windows' order only: the bounds by the packed key
    monkeypatch.setattr(breakdown_stage, "_CHANGE_BITS", 64)  # never fits: the bounds by a lexsort
    general = breakdown_stage._sweep(win, rk, {k: v.copy() for k, v in ev.items()})
    assert max(calls) > 2 * n
    assert packed.keys() == general.keys()
    for k in packed:
        np.testing.assert_array_equal(packed[k], general[k], err_msg=k)


@pytest.mark.parametrize("paired", [True, False])
def test_active_classes_equal_one_counter_per_class(paired: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The classes active after each bound, from two counters per int64 running sum (or one
    sum per class): the same as counting each class on its own, also where a counter dips below
    zero (ends met before starts, as the general sort may order bounds at one time)."""
    import numpy as np

    if not paired:
        monkeypatch.setattr(breakdown_stage, "_PAIRED_MAX", 0)
    rng = np.random.default_rng(7)
    bits = rng.integers(1, 64, 5000).astype(np.uint8)
    change = np.concatenate([bits, bits | 64])
    change = change[rng.permutation(len(change))]  # ends before their starts too
    change = np.concatenate([np.zeros(3, np.uint8), change])  # window bounds change nothing
    want = np.zeros(len(change), np.uint8)
    for j in range(6):
        delta = np.where(change & 64, -1, 1) * ((change & 63) >> j & 1)
        want |= (np.cumsum(delta) > 0).astype(np.uint8) << j
    assert np.array_equal(breakdown_stage._active_classes(change), want)


def _cp_of(events: list[dict]) -> dict:
    from advisor.testing import context_from_tables

    ctx = context_from_tables({"events": events})
    win = ctx.con.execute("SELECT start_ns, end_ns FROM steps WHERE rank = 0 AND step = 1").fetchone()
    return cp_stage.compute(ctx.con, 0, 1, int(win[0]), int(win[1]), top_n=50)


def _stream_wait_events(comm_on_other_stream: bool) -> list[dict]:
    """One step of one rank (marker 0-100 µs, the window to the end of its device work at 900 µs):
    three launches on the host thread; an all-reduce
    (20-600 µs) and two compute kernels on another stream, the second of which (605-900 µs)
    started long after its launch (55 µs) and its stream predecessor (100 µs): 5 µs after the
    all-reduce ended, as a stream waiting on the collective's completion event does."""
    us = 1000
    host = {"rank": 0, "device": False, "pid": "1", "tid": "1"}
    dev = {"rank": 0, "device": True, "pid": "0"}
    comm_kind = "comm" if comm_on_other_stream else "kernel"
    return [
        {**host, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100 * us},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 10 * us, "dur_ns": 5 * us, "corr": 1},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 30 * us, "dur_ns": 5 * us, "corr": 2},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 50 * us, "dur_ns": 5 * us, "corr": 3},
        {**dev, "kind": comm_kind, "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "tid": "20", "stream": 20,
         "start_ns": 20 * us, "dur_ns": 580 * us, "corr": 1},
        {**dev, "kind": "kernel", "name": "k1", "tid": "7", "stream": 7, "start_ns": 40 * us, "dur_ns": 60 * us, "corr": 2},
        {**dev, "kind": "kernel", "name": "k2", "tid": "7", "stream": 7, "start_ns": 605 * us, "dur_ns": 295 * us, "corr": 3},
    ]


def test_critical_path_follows_communication_completion_across_streams() -> None:
    """A kernel that waited on its stream for a collective of another stream: the collective's
    completion is the last arriving input (Hermes §4.2.1: a dependency across components where one
    operator's end meets the next one's start), so the path runs k2 <- all-reduce <- its launch,
    not k2 <- 505 µs of 'device waiting' <- k1."""
    cp = _cp_of(_stream_wait_events(True))
    ops = {o["name"]: o for o in cp["ops"]}
    assert ops["k2"]["total_us"] == pytest.approx(295.0)
    assert ops["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["total_us"] == pytest.approx(580.0)
    assert ops["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["kind"] == "communication"
    assert ops["idle (waiting for communication)"]["total_us"] == pytest.approx(5.0)  # 600 -> 605 µs
    assert "idle (device waiting)" not in ops
    assert "k1" not in ops
    assert cp["path_us"] == pytest.approx(900.0)


def test_critical_path_does_not_jump_to_a_compute_kernel_of_another_stream() -> None:
    """A compute kernel's cross-stream edge is communication completion only: with the same times
    but a compute kernel in the collective's place, k2's wait stays on its own stream (505 µs of
    waiting after k1)."""
    ops = {o["name"]: o for o in _cp_of(_stream_wait_events(False))["ops"]}
    assert ops["idle (device waiting)"]["total_us"] == pytest.approx(505.0)  # 100 -> 605 µs
    assert ops["k1"]["total_us"] == pytest.approx(60.0)


def test_critical_path_of_a_collective_follows_the_computation_it_waited_for() -> None:
    """The data-parallel case: an all-reduce (605-900 µs) waited on its stream long after its launch
    (55 µs) and its stream predecessor (100 µs) until a compute kernel of another stream ended
    (600 µs): its gradients (the NCCL stream's cudaStreamWaitEvent on the compute stream, HCCL's
    notify wait). The path runs all-reduce <- 5 µs 'waiting for computation' <- the backward kernel."""
    events = _stream_wait_events(True)
    for e in events:  # swap the roles: the long task on stream 20 computes, the late one on stream 7 reduces
        if e.get("stream") == 20:
            e.update(kind="kernel", name="sgemm_backward")
        elif e.get("name") == "k2":
            e.update(kind="comm", name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
        elif e.get("name") == "k1":
            e.update(kind="comm", name="ncclDevKernel_AllGather_RING_LL")
    cp = _cp_of(events)
    ops = {o["name"]: o for o in cp["ops"]}
    assert ops["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["total_us"] == pytest.approx(295.0)
    assert ops["idle (waiting for computation)"]["total_us"] == pytest.approx(5.0)  # 600 -> 605 µs
    assert ops["sgemm_backward"]["total_us"] == pytest.approx(580.0)
    assert ops["sgemm_backward"]["kind"] == "compute"
    assert "idle (device waiting)" not in ops and "ncclDevKernel_AllGather_RING_LL" not in ops
    assert cp["path_us"] == pytest.approx(900.0)


def _recorded_wait_events(wait: dict | None) -> list[dict]:
    """One step (marker 0-100 µs, window to 900 µs): kernel A on stream 7 (40-600 µs), then on the
    host cudaEventRecord (corr 4), cudaStreamWaitEvent (corr 5) and the launch of B on stream 20
    (corr 6, at 60 µs), which ran 605-900 µs; a collective on stream 30 (20-602 µs) ended inside
    B's wait too. ``wait``: the cuda_sync record of the cudaStreamWaitEvent (None: not recorded)."""
    us = 1000
    host = {"rank": 0, "device": False, "pid": "1", "tid": "1"}
    dev = {"rank": 0, "device": True, "pid": "0"}
    events = [
        {**host, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100 * us},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 10 * us, "dur_ns": 5 * us, "corr": 1},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 30 * us, "dur_ns": 5 * us, "corr": 2},
        {**host, "kind": "runtime", "name": "cudaEventRecord", "start_ns": 40 * us, "dur_ns": 2 * us, "corr": 4},
        {**host, "kind": "runtime", "name": "cudaStreamWaitEvent", "start_ns": 50 * us, "dur_ns": 2 * us, "corr": 5},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 60 * us, "dur_ns": 5 * us, "corr": 6},
        {**dev, "kind": "comm", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "tid": "30", "stream": 30,
         "start_ns": 20 * us, "dur_ns": 582 * us, "corr": 1},
        {**dev, "kind": "kernel", "name": "A", "tid": "7", "stream": 7, "start_ns": 40 * us, "dur_ns": 560 * us, "corr": 2},
        {**dev, "kind": "kernel", "name": "B", "tid": "20", "stream": 20, "start_ns": 605 * us, "dur_ns": 295 * us, "corr": 6},
    ]
    if wait is not None:
        events.append({**dev, "kind": "sync", "name": "Stream Wait Event", "tid": "20", "stream": 20,
                       "start_ns": 50 * us, "dur_ns": 1 * us, "corr": 5, **wait})
    return events


def test_critical_path_follows_a_recorded_event_wait_between_compute_streams() -> None:
    """With the wait recorded (Kineto's enable_cuda_sync_events: stream 20 waits on the event
    recorded on stream 7 by the call with correlation 4), B depends on A, the last task launched
    on stream 7 before that record: B <- 5 µs 'waiting for computation' <- A. The collective that
    ended later inside the wait (602 µs) is not on the path: the inferred edge would have taken it."""
    cp = _cp_of(_recorded_wait_events({"wait_stream": 7, "wait_corr": 4}))
    ops = {o["name"]: o for o in cp["ops"]}
    assert ops["B"]["total_us"] == pytest.approx(295.0)
    assert ops["idle (waiting for computation)"]["total_us"] == pytest.approx(5.0)  # 600 -> 605 µs
    assert ops["A"]["total_us"] == pytest.approx(560.0)
    assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL" not in ops
    assert "idle (waiting for communication)" not in ops
    assert cp["path_us"] == pytest.approx(900.0)


def test_critical_path_infers_the_wait_only_where_it_is_not_recorded() -> None:
    """The same timeline without the record, or with a record whose event Kineto could not find
    (wait_on_cuda_event_record_corr_id -1, read as NULL): the inferred communication-completion
    edge, to the collective ending last in the wait (602 -> 605 µs)."""
    for wait in (None, {"wait_stream": None, "wait_corr": None}):
        ops = {o["name"]: o for o in _cp_of(_recorded_wait_events(wait))["ops"]}
        assert ops["idle (waiting for communication)"]["total_us"] == pytest.approx(3.0)
        assert "A" not in ops


def test_critical_path_takes_no_inferred_edge_past_a_recorded_wait_that_did_not_bind() -> None:
    """A recorded wait whose producer ended before B was launched (the event was recorded on
    stream 7 before A's launch: its producer is nothing in the window) does not hold B back, and
    with the window's waits recorded the collective ending in B's wait is not guessed as its cause:
    B waited on its launch (65 µs) only."""
    cp = _cp_of(_recorded_wait_events({"wait_stream": 7, "wait_corr": 2}))  # record before A's launch
    ops = {o["name"]: o for o in cp["ops"]}
    assert "idle (waiting for communication)" not in ops and "idle (waiting for computation)" not in ops
    assert ops["idle (launch latency)"]["total_us"] == pytest.approx(540.0)  # 65 -> 605 µs
    assert cp["path_us"] == pytest.approx(900.0)


@pytest.mark.parametrize("call, record", [
    ("cudaStreamSynchronize", {"name": "Stream Sync", "stream": 7}),
    ("cudaEventSynchronize", {"name": "Event Sync", "stream": -1, "wait_stream": 7, "wait_corr": 4}),
], ids=["stream_sync", "event_sync"])
def test_critical_path_of_a_recorded_host_sync_ends_at_what_it_names(call: str, record: dict) -> None:
    """A host sync (100-900 µs) recorded as a cuda_sync 'Stream Sync' on stream 7, or as an 'Event
    Sync' on the event recorded on stream 7 by the call with correlation 4 (after A's launch), was
    released by A (ending 600 µs), not by the collective of stream 30 that ended later inside it
    (850 µs); then kernel C (launched at 900 µs) ran 905-950 µs on stream 7. The path runs C <- its
    launch <- the sync's wait back to A; unrecorded, the wait would end at the collective."""
    us = 1000
    host = {"rank": 0, "device": False, "pid": "1", "tid": "1"}
    events = [e for e in _recorded_wait_events(None) if e["name"] != "B"]
    for e in events:
        if e.get("stream") == 30:
            e["dur_ns"] = 830 * us  # 20 -> 850 µs
        elif e["kind"] == "step":
            e["dur_ns"] = 910 * us  # the step holds the sync and the last launch
    events += [
        {**host, "kind": "sync", "name": call, "start_ns": 100 * us, "dur_ns": 800 * us, "corr": 9},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 900 * us, "dur_ns": 2 * us, "corr": 10},
        {"rank": 0, "device": True, "pid": "0", "tid": "7", "kind": "kernel", "name": "C", "stream": 7,
         "start_ns": 905 * us, "dur_ns": 45 * us, "corr": 10},
    ]
    record = {"rank": 0, "device": True, "pid": "0", "tid": str(record["stream"]), "kind": "sync",
              "start_ns": 100 * us, "dur_ns": 800 * us, "corr": 9, **record}
    cp = _cp_of([*events, record])
    ops = {o["name"]: o for o in cp["ops"]}
    assert ops["C"]["total_us"] == pytest.approx(45.0)
    assert ops[call]["total_us"] == pytest.approx(300.0)  # 600 -> 900 µs
    assert ops["A"]["total_us"] == pytest.approx(560.0)
    assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL" not in ops
    assert cp["path_us"] == pytest.approx(950.0)
    unrecorded = {o["name"]: o for o in _cp_of(events)["ops"]}
    assert unrecorded[call]["total_us"] == pytest.approx(50.0)  # 850 -> 900 µs
    assert "A" not in unrecorded


def test_critical_path_keeps_the_streams_of_two_devices_apart() -> None:
    """One process driving two GPUs (Kineto: pid = device, tid = stream; both have a stream 7):
    X ran on GPU 0's stream 7 (40-600 µs), Y on GPU 1's (605-900 µs, launched at 60 µs). They share
    no stream, so Y waited on its launch only: 540 µs of launch latency, and X is not on the path
    (taken as one stream, X would be Y's predecessor there)."""
    us = 1000
    host = {"rank": 0, "device": False, "pid": "1", "tid": "1"}
    events = [
        {**host, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100 * us},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 30 * us, "dur_ns": 5 * us, "corr": 2},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 60 * us, "dur_ns": 5 * us, "corr": 6},
        {"rank": 0, "device": True, "pid": "0", "tid": "7", "stream": 7, "kind": "kernel", "name": "X",
         "start_ns": 40 * us, "dur_ns": 560 * us, "corr": 2},
        {"rank": 0, "device": True, "pid": "1", "tid": "7", "stream": 7, "kind": "kernel", "name": "Y",
         "start_ns": 605 * us, "dur_ns": 295 * us, "corr": 6},
    ]
    cp = _cp_of(events)
    ops = {o["name"]: o for o in cp["ops"]}
    assert ops["Y"]["total_us"] == pytest.approx(295.0)
    assert ops["idle (launch latency)"]["total_us"] == pytest.approx(540.0)  # 65 -> 605 µs
    assert "X" not in ops and "idle (device waiting)" not in ops
    assert cp["path_us"] == pytest.approx(900.0)
