"""The named steps of the critical-path walk (advisor.stages.critical_path), each on a window built
by hand: which thread is the main one, which edge a device task or a host call takes back, and the
walk as a whole (its segments cover the window). Times are whole ns; the expected values are read
off the event lists below."""

from __future__ import annotations

from typing import Any

from advisor.kinds import EdgeKind, SegmentKind
from advisor.stages import critical_path as cp
from advisor.testing import context_from_tables

STEP = {"kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 1000, "pid": "1", "tid": "1"}


def _host(kind: str, name: str, start: int, dur: int, tid: str = "1", corr: int | None = None) -> dict[str, Any]:
    return {"kind": kind, "name": name, "start_ns": start, "dur_ns": dur, "pid": "1", "tid": tid, "corr": corr}


def _kernel(name: str, start: int, dur: int, corr: int | None, stream: int = 7) -> dict[str, Any]:
    return {"kind": "kernel", "name": name, "start_ns": start, "dur_ns": dur, "pid": "0", "tid": "7",
            "device": True, "stream": stream, "corr": corr}


def _steps(events: list[dict[str, Any]]) -> tuple[Any, cp.Window, cp.Threads, cp.Streams, cp.Syncs, cp.PathAccount]:
    ctx = context_from_tables({"events": [{"rank": 0, **e} for e in [STEP, *events]]}, run_stages=False)
    cur = ctx.con.cursor()
    w = cp.read_window(cur, 0, 0, 1000)
    assert w is not None
    th = cp.host_threads(w)
    st = cp.device_streams(w)
    sy = cp.Syncs(cur, 0, w, st)
    return ctx, w, th, st, sy, cp.PathAccount(w, th.owner)


def _index(w: cp.Window, name: str) -> int:
    return w.name.index(name)


def test_the_thread_launching_the_device_work_is_the_main_one() -> None:
    """The step marker is on thread 1, but thread 2 makes the launch of the window's kernel:
    thread 2 is the main thread and the only one the path may run on (it drives the device);
    neither thread 1's framework operator nor thread 3's sleep makes them so."""
    _ctx, _w, th, _st, _sy, _path = _steps([
        _host("host_op", "aten::mm", 10, 100, tid="1"),
        _host("runtime", "cudaLaunchKernel", 200, 50, tid="2", corr=5),
        _host("other", "sleep", 0, 1000, tid="3"),
        _kernel("gemm", 300, 100, corr=5),
    ])
    assert th.main_tid == "2"
    assert th.workers == {"2"}
    assert set(th.by_thread) == {"1", "2", "3"}


def test_outermost_operator_owns_a_nested_call() -> None:
    _ctx, w, th, _st, _sy, _path = _steps([
        _host("host_op", "aten::conv2d", 100, 300),
        _host("runtime", "cudaLaunchKernel", 150, 20, corr=1),
        _kernel("conv", 200, 100, corr=1),
    ])
    assert th.owner[_index(w, "cudaLaunchKernel")] == _index(w, "aten::conv2d")
    assert th.owner[_index(w, "aten::conv2d")] == _index(w, "aten::conv2d")


def test_a_kernel_waiting_for_its_launch_goes_back_to_the_host() -> None:
    """The kernel starts at 500; its launch ended at 400 and nothing ran before it on its stream:
    the launch is its last input (100 ns of launch latency), the walk moves to the host at 400."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", 300, 100, corr=9),
        _kernel("k", 500, 200, corr=9),
    ])
    t, mode, edge = cp.device_step(w, th, st, sy, path, _index(w, "k"), 700)
    assert (t, mode, edge) == (400, ("host", "1"), EdgeKind.LAUNCH)
    assert path.segments == [(500, 700, "k", SegmentKind.COMPUTE.value),
                             (400, 500, "idle (launch latency)", SegmentKind.IDLE.value)]


def test_a_kernel_queued_behind_another_follows_stream_order() -> None:
    """Kernel b was launched at 150 but its stream was busy with a until 600: a is its last input."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", 100, 20, corr=1),
        _host("runtime", "cudaLaunchKernel", 130, 20, corr=2),
        _kernel("a", 200, 400, corr=1),
        _kernel("b", 600, 100, corr=2),
    ])
    t, mode, edge = cp.device_step(w, th, st, sy, path, _index(w, "b"), 700)
    assert (t, mode, edge) == (600, ("dev", _index(w, "a")), EdgeKind.STREAM_ORDER)


def test_a_sync_call_hands_the_walk_to_the_work_it_waited_for() -> None:
    """cudaDeviceSynchronize waits from 400 to 900; the kernel ending inside it, at 850, released it."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", 100, 50, corr=1),
        _kernel("k", 300, 550, corr=1),
        _host("sync", "cudaDeviceSynchronize", 400, 500),
    ])
    t, mode, edge = cp.host_step(w, th, st, sy, path, "1", 900)
    assert (t, mode, edge) == (850, ("dev", _index(w, "k")), EdgeKind.SYNC_WAIT)
    assert path.segments == [(850, 900, "cudaDeviceSynchronize", SegmentKind.HOST.value)]


def test_the_walk_covers_the_window() -> None:
    """From the end of the window back to its start: idle after the sync, the sync's wait, the
    kernel, its launch latency, the launch, idle before it: 1000 ns in all."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", 100, 50, corr=1),
        _kernel("k", 300, 550, corr=1),
        _host("sync", "cudaDeviceSynchronize", 400, 500),
    ])
    edges = cp.walk(w, th, st, sy, path)
    assert edges == {EdgeKind.SYNC_WAIT: 1, EdgeKind.LAUNCH: 1, EdgeKind.HOST_ORDER: 1}
    assert sorted(path.segments) == [
        (0, 100, "idle (host)", "idle"),
        (100, 150, "cudaLaunchKernel", "host"),
        (150, 300, "idle (launch latency)", "idle"),
        (300, 850, "k", "compute"),
        (850, 900, "cudaDeviceSynchronize", "host"),
        (900, 1000, "idle (after last operator)", "idle"),
    ]
    assert sum(b - a for a, b, _n, _k in path.segments) == 1000
