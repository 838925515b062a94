"""The named steps of the critical-path walk (advisor.stages.critical_path), each on a window built
by hand: which thread is the main one, which edge a device task or a host call takes back, and the
walk as a whole (its segments cover the window). Times are whole ns; the expected values are read
off the event lists below."""

from __future__ import annotations

from typing import Any

import pytest

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
    st = cp.device_streams(w, cur, 0)
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


def test_a_kernel_started_while_its_launcher_blocks_in_a_copy_names_the_host_wait() -> None:
    """The kernel was launched at 150 and started at 500; from 200 the launching thread was blocked
    in cudaMemcpy (a blocking copy): 200-500 is the host waiting in it, only 150-200 launch latency."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", 100, 50, corr=1),
        _host("runtime", "cudaMemcpy", 200, 500, corr=2),
        _kernel("k", 500, 100, corr=1),
    ])
    t, mode, edge = cp.device_step(w, th, st, sy, path, _index(w, "k"), 600)
    assert (t, mode, edge) == (150, ("host", "1"), EdgeKind.LAUNCH)
    assert sorted(path.segments) == [(150, 200, "idle (launch latency)", SegmentKind.IDLE.value),
                                     (200, 500, "host waits in cudaMemcpy (blocking copy)", SegmentKind.IDLE.value),
                                     (500, 600, "k", SegmentKind.COMPUTE.value)]


def test_a_kernel_started_while_its_launcher_syncs_names_the_sync() -> None:
    """As above with cudaStreamSynchronize (a sync call) from 300: 300-500 is the host waiting in it."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", 100, 50, corr=1),
        _host("sync", "cudaStreamSynchronize", 300, 400),
        _kernel("k", 500, 100, corr=1),
    ])
    cp.device_step(w, th, st, sy, path, _index(w, "k"), 600)
    assert (300, 500, "host waits in cudaStreamSynchronize (sync)", SegmentKind.IDLE.value) in path.segments
    assert (150, 300, "idle (launch latency)", SegmentKind.IDLE.value) in path.segments


@pytest.mark.slow
def test_sglang_blocking_copy_is_a_host_wait_on_the_path() -> None:
    """sglang on an MI300: the host blocks in hipMemcpyWithStream from 4909913692370.049 µs
    (493,208 µs long); resolve_future_token_ids_kernel, launched before it, starts only at
    4909914185565.495 µs. That wait, 493,195.446 µs, is the host waiting in the copy, not launch
    latency (which is what remains of the kernel's launch gap: under 0.1 ms)."""
    from advisor.analyze import analyze
    from tests.conftest import ROOT, report_json

    data = report_json(analyze(ROOT / "tests" / "data" / "kineto_real" / "kineto_mi300_sglang_prefilldecode"))
    ops = {o["name"]: o for o in data["critical_path"]["ops"]}
    wait = ops["host waits in hipMemcpyWithStream (blocking copy)"]
    assert wait["kind"] == "idle"
    assert wait["total_us"] == pytest.approx(4909914185565.495 - 4909913692370.049, abs=0.01)
    assert ops.get("idle (launch latency)", {"total_us": 0.0})["total_us"] < 100.0
    assert data["findings"][0]["rule"] == "CPU007"  # the verdict is unchanged: a sync


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


def test_a_kernel_launched_before_the_window_is_queued_work_not_launch_latency() -> None:
    """The kernel's launch ran at -100..-50, before the window (0..1000) began; the kernel starts at
    200 with nothing before it on its stream in the window. Its wait from 0 to 200 lies on work
    queued before the window: neither launch latency nor aten::mm (50..450, which launched nothing)
    held it back, and the walk ends at the window's start: 200 ns queued, 300 of kernel, 500 after."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", -100, 50, corr=1),
        _host("host_op", "aten::mm", 50, 400),
        _kernel("k", 200, 300, corr=1),
    ])
    assert st.launched_before == {1}
    t, mode, edge = cp.device_step(w, th, st, sy, path, _index(w, "k"), 500)
    assert (t, mode, edge) == (0, None, EdgeKind.LAUNCH_BEFORE_WINDOW)
    walked = cp.PathAccount(w, th.owner)
    assert cp.walk(w, th, st, sy, walked) == {EdgeKind.LAUNCH_BEFORE_WINDOW: 1}
    assert sorted(walked.segments) == [
        (0, 200, "idle (device work queued before the window)", "idle"),
        (200, 500, "k", "compute"),
        (500, 1000, "idle (after last operator)", "idle"),
    ]
    assert not any("launch latency" in s[2] for s in walked.segments)


def test_a_launch_ending_inside_the_window_still_gives_launch_latency() -> None:
    """The launch call began before the window (-50) but ended inside it (50): the launch time is
    in the window, so 50..200 before the kernel is launch latency and 0..50 the launch call."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", -50, 100, corr=1),
        _kernel("k", 200, 300, corr=1),
    ])
    assert st.launched_before == set()
    cp.walk(w, th, st, sy, path)
    assert sorted(path.segments) == [
        (0, 50, "cudaLaunchKernel", "host"),
        (50, 200, "idle (launch latency)", "idle"),
        (200, 500, "k", "compute"),
        (500, 1000, "idle (after last operator)", "idle"),
    ]


def test_a_window_whose_device_work_was_all_launched_in_it_has_no_queued_time() -> None:
    """Two kernels launched inside the window (100 and 600): no launch before the window, so no
    queued-before-the-window segment; the device is idle at the start only because the host had
    not launched yet (idle (host) from 0 to the first launch)."""
    _ctx, w, th, st, sy, path = _steps([
        _host("runtime", "cudaLaunchKernel", 100, 50, corr=1),
        _kernel("a", 200, 100, corr=1),
        _host("runtime", "cudaLaunchKernel", 600, 50, corr=2),
        _kernel("b", 700, 200, corr=2),
    ])
    assert st.launched_before == set()
    cp.walk(w, th, st, sy, path)
    names = [s[2] for s in sorted(path.segments)]
    assert min(path.segments)[:3] == (0, 100, "idle (host)")
    assert cp.QUEUED_BEFORE not in names
