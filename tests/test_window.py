"""What a profile window holds (advisor.ingest.window): one-time set-up, graph capture, stub steps.

No real export at hand shows a warm-up step, a graph capture or a cut-short step, so the traces
are written here in Kineto's documented format (Chrome trace ``"ph": "X"`` events; host operators
``cpu_op``, runtime calls ``cuda_runtime``, device work ``kernel`` on a stream, linked by
``args.correlation``; steps ``ProfilerStep#N``). Each builder states the facts it plants, and the
tests assert those (the planted numbers), never the advisor's output pasted back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.analyze import analyze
from advisor.engine.context import load_profile
from tests.conftest import report_json

MS = 1000  # Kineto times are µs
T0 = 1_000_000


class Trace:
    """A one-rank Kineto trace: a host thread (pid 1, tid 1) and a CUDA stream (pid 0, tid 7)."""

    def __init__(self) -> None:
        self.ev: list[dict[str, Any]] = []
        self.corr = 0

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}})

    def call(self, name: str, ts: float, dur: float) -> None:
        self.op(name, ts, dur, "cuda_runtime")

    def launch(self, ts: float, kernel_ts: float, kernel_dur: float, name: str = "cudaLaunchKernel") -> None:
        self.corr += 1
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5,
                        "args": {"correlation": self.corr}})
        self.ev.append({"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": kernel_ts,
                        "dur": kernel_dur, "args": {"correlation": self.corr, "device": 0, "stream": 7}})

    def step(self, n: int, ts: float, dur: float) -> None:
        self.op(f"ProfilerStep#{n}", ts, dur, "user_annotation")

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
               "traceEvents": self.ev, "distributedInfo": {"rank": 0, "world_size": 1}}
        (folder / "rank-0.pt.trace.json").write_text(json.dumps(doc))
        return folder


def steady_step(t: Trace, n: int, ts: float, *, step_ms: float = 100.0) -> None:
    """One step of ``step_ms``: 20 host operators, each launching a kernel that keeps the GPU busy
    for 80 % of the operator's slot, and a 10 µs cudaFree (the caching allocator at steady state)."""
    t.step(n, ts, step_ms * MS)
    slot = step_ms * MS / 20
    for k in range(20):
        a = ts + k * slot
        t.op("aten::linear", a + 10, slot - 20)
        t.launch(a + 20, a + 30, 0.8 * slot)
    t.call("cudaFree", ts + step_ms * MS - 15, 10)


def warmup_trace() -> Trace:
    """Six 100 ms steps (0-5); step 0 also holds the process's set-up before its work:
    a 600 ms cudaFree (the allocator's first call creates the context), 3 cuModuleLoadData of
    100 ms and a 80 ms cudnnCreate: 600 + 300 + 80 = 980 ms of one-time work, 0.98 s.
    Steady cudaFree calls take 10 µs."""
    t = Trace()
    ts = T0
    t.call("cudaFree", ts + 10, 600 * MS)
    for k in range(3):
        t.call("cuModuleLoadData", ts + 600 * MS + 20 + k * 100 * MS, 100 * MS - 10)
    t.call("cudnnCreate", ts + 900 * MS + 40, 80 * MS - 10)
    # step 0: the set-up, then a steady step's work (its marker holds both)
    steady_step(t, 0, ts + 980 * MS + 100)
    t.ev = [e if e["name"] != "ProfilerStep#0" else {**e, "ts": ts, "dur": 1080 * MS + 100} for e in t.ev]
    for n in range(1, 6):
        steady_step(t, n, ts + 1080 * MS + 100 + (n - 1) * 100 * MS)
    return t


def test_warm_up_step_is_left_out_with_its_cost(tmp_path: Path) -> None:
    prof = load_profile(warmup_trace().write(tmp_path / "warm"))
    steps = [r[0] for r in prof.con.execute("SELECT step FROM steps ORDER BY step").fetchall()]
    assert steps == [1, 2, 3, 4, 5]
    cost, calls, excluded = prof.con.execute(
        "SELECT dur_ns, calls, excluded FROM window_phases WHERE kind = 'one_time'").fetchone()
    # 600 + 3 x (100 - 0.01) + (80 - 0.01) ms of calls that do not overlap
    assert abs(cost - (600 + 3 * 99.99 + 79.99) * 1e6) < 1e3 and calls == 5 and excluded
    assert prof.con.execute("SELECT kind, step FROM window_phases WHERE step IS NOT NULL").fetchall() == [
        ("warmup_step", 0)]
    w = [w.message for w in prof.warnings if w.code == "one_time_phase"]
    assert len(w) == 1 and "0.98 s of one-time set-up" in w[0] and "step 0" in w[0] and "schedule(" in w[0]
    assert "cuModuleLoadData ×3 (module / kernel loading" in w[0] and "cudaFree ×1 (allocator set-up" in w[0]
    # no event of step 0 keeps a step
    assert prof.con.execute("SELECT count(*) FROM events WHERE step = 0").fetchone()[0] == 0


def test_warm_up_fires_no_step_statistic(tmp_path: Path) -> None:
    """Before: a 1080 ms step among 100 ms ones made a 'step fluctuation' (and host / allocator time
    divided over the steps). The steady steps are alike: no finding at medium or above."""
    doc = report_json(analyze(warmup_trace().write(tmp_path / "warm")))
    loud = [(f["rule"], f["severity"]) for f in doc["findings"] if f["severity"] in ("critical", "high", "medium")]
    assert loud == []
    assert sorted(b["step"] for b in doc["breakdown"]) == [1, 2, 3, 4, 5]
    assert all(abs(b["step_us"] - 100_000) < 100 for b in doc["breakdown"])
    assert any(w["code"] == "one_time_phase" for w in doc["warnings"])


def context_init_trace() -> Trace:
    """No step marker: the first CUDA call, cudaDeviceGetStreamPriorityRange, takes 30 s (context
    creation); then 2 s of host operators of irregular names, each launching a kernel."""
    t = Trace()
    t.call("cudaDeviceGetStreamPriorityRange", T0, 30_000 * MS)
    ts = T0 + 30_000 * MS + 100
    for k in range(200):
        a = ts + k * 10 * MS
        t.op(f"aten::op{(k * 7919) % 97}", a, 9 * MS)
        t.launch(a + 10, a + 20, 8 * MS)
    return t


def test_context_creation_starts_the_one_window_after_it(tmp_path: Path) -> None:
    prof = load_profile(context_init_trace().write(tmp_path / "ctx"))
    (step, start), = prof.con.execute("SELECT step, start_ns FROM steps").fetchall()
    base = prof.con.execute("SELECT min(start_ns) FROM events").fetchone()[0]
    assert step == -1 and start - base == 30_000 * 1_000_000  # starts where the 30 s call ends
    w = [w.message for w in prof.warnings if w.code == "one_time_phase"]
    assert len(w) == 1 and "30.00 s" in w[0] and "cudaDeviceGetStreamPriorityRange" in w[0]
    assert "context creation" in w[0]


def capture_trace() -> Trace:
    """No step marker: a graph capture phase. One kernel of the warm-up run, then
    cudaStreamBeginCapture, 300 launches 50 µs apart (captured: their kernels do not run),
    cudaStreamEndCapture and a 20 ms cudaGraphInstantiate; the GPU is idle all along: what an eager
    window would call host-bound."""
    t = Trace()
    t.launch(T0 - 200, T0 - 190, 100)  # the warm-up run before the capture: one kernel of 100 µs
    t.call("cudaStreamBeginCapture", T0, 20)
    for k in range(300):
        a = T0 + 100 + k * 50
        t.op(f"aten::op{k % 13}", a, 40)
        t.call("cudaLaunchKernel", a + 10, 10)
    end = T0 + 100 + 300 * 50
    t.call("cudaStreamEndCapture", end, 30)
    t.call("cudaGraphInstantiateWithFlags", end + 50, 20 * MS)
    return t


def test_graph_capture_window_is_said_and_not_judged(tmp_path: Path) -> None:
    doc = report_json(analyze(capture_trace().write(tmp_path / "capture")))
    w = [w["message"] for w in doc["warnings"] if w["code"] == "graph_capture"]
    assert len(w) == 1 and "graph capture phase" in w[0] and "no replay" in w[0]
    assert not [f["rule"] for f in doc["findings"] if f["cause"].startswith("cpu.")]


def test_replay_after_a_capture_is_what_is_judged(tmp_path: Path) -> None:
    """Five 10 ms steps; a capture phase in step 0 (cudaStreamBeginCapture ... cudaGraphInstantiate)
    then four steps replaying it (one cudaGraphLaunch, the GPU busy 80 % of the step)."""
    t = Trace()
    t.step(0, T0, 10 * MS)
    t.call("cudaStreamBeginCapture", T0 + 10, 20)
    for k in range(100):
        t.call("cudaLaunchKernel", T0 + 100 + k * 50, 10)
    t.call("cudaGraphInstantiate", T0 + 5200, 4 * MS)
    for n in range(1, 5):
        a = T0 + n * 10 * MS
        t.step(n, a, 10 * MS)
        t.op("aten::linear", a + 10, 60)
        t.launch(a + 20, a + 100, 8 * MS, name="cudaGraphLaunch")
    prof = load_profile(t.write(tmp_path / "replay"))
    assert [r[0] for r in prof.con.execute("SELECT step FROM steps ORDER BY step").fetchall()] == [1, 2, 3, 4]
    assert prof.con.execute("SELECT kind, step FROM window_phases WHERE step IS NOT NULL").fetchall() == [
        ("capture_step", 0)]
    w = [w.message for w in prof.warnings if w.code == "graph_capture"]
    assert len(w) == 1 and "only the replay after it is judged" in w[0]


def stub_trace(last_ms: float) -> Trace:
    """Eight 9.3 ms steps (0-7) of 20 operators each, then step 8, which the window cuts
    ``last_ms`` after it began (its marker holds only what ran by then)."""
    t = Trace()
    for n in range(8):
        steady_step(t, n, T0 + n * 9.3 * MS, step_ms=9.3)
    a = T0 + 8 * 9.3 * MS
    t.step(8, a, last_ms * MS)
    t.op("aten::linear", a + 10, max(last_ms * MS - 20, 1))
    return t


def test_stub_step_is_left_out_and_said(tmp_path: Path) -> None:
    prof = load_profile(stub_trace(0.049).write(tmp_path / "stub"))
    assert [r[0] for r in prof.con.execute("SELECT step FROM steps ORDER BY step").fetchall()] == list(range(8))
    w = [w.message for w in prof.warnings if w.code == "stub_step"]
    assert len(w) == 1 and "step 8" in w[0] and "49 µs" in w[0] and "9.3 ms" in w[0]
    doc = report_json(analyze(tmp_path / "stub"))
    assert (doc["critical_path"] or {}).get("step") != 8


def test_short_step_doing_the_same_work_is_no_stub(tmp_path: Path) -> None:
    """A last step a third as long but running every operator of the others (smaller inputs): kept."""
    t = Trace()
    for n in range(6):
        steady_step(t, n, T0 + n * 9.3 * MS, step_ms=9.3)
    steady_step(t, 6, T0 + 6 * 9.3 * MS, step_ms=3.1)
    prof = load_profile(t.write(tmp_path / "short"))
    assert prof.con.execute("SELECT count(*) FROM steps").fetchone()[0] == 7
    assert not [w for w in prof.warnings if w.code == "stub_step"]


def _loader_rows() -> list[dict[str, Any]]:
    """Twelve steps (0-11). Each starts with the batch (``enumerate(DataLoader)#...__next__``):
    20 µs when the queue holds one, 80 ms in steps 3, 7 and 11 (the queue ran dry), then
    launches one 20.1 ms kernel. A step's marker ends 20 ms after its batch came, so in the
    ordinary steps the kernel of the step before still runs at the launch (the device lags
    0.1 ms behind: their windows start after their batch), while in the slow steps the device
    is idle by then (their windows start at the marker)."""
    host = {"rank": 0, "device": False, "pid": "1", "tid": "1"}
    dev = {"rank": 0, "device": True, "pid": "0", "tid": "7", "stream": 7}
    ev: list[dict[str, Any]] = []
    t, prev_end = 1_000_000_000, 0
    for n in range(12):
        wait = 80_000_000 if n in (3, 7, 11) else 20_000
        ev.append({**host, "kind": "step", "name": f"ProfilerStep#{n}", "start_ns": t, "dur_ns": wait + 20_000_000})
        ev.append({**host, "kind": "dataloader", "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                   "start_ns": t, "dur_ns": wait})
        launch = t + wait + 10_000
        ev.append({**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": launch, "dur_ns": 5_000,
                   "corr": n + 1})
        k0 = max(launch + 5_000, prev_end)
        ev.append({**dev, "kind": "kernel", "name": "gemm_kernel", "start_ns": k0, "dur_ns": 20_100_000, "corr": n + 1})
        prev_end = k0 + 20_100_000
        t += wait + 20_000_000
    return ev


def test_slow_steps_explained_by_the_loader_that_every_step_calls() -> None:
    """The slow steps wait 80 ms for data where the others wait 20 µs: the step fluctuation says the
    loader takes longer there (never that the other steps do not call it), and IO001, judged over
    the window (3 x 80 ms of 12 steps; the median step waits nothing), explains it."""
    from advisor.analyze import analyze_context
    from advisor.config import Config
    from advisor.testing import context_from_tables

    ctx = context_from_tables({"events": _loader_rows()})
    doc = report_json(analyze_context(ctx, Config(select=["CLU003", "IO001"])))
    clu = [f for f in doc["findings"] if f["rule"] == "CLU003"]
    io = [f for f in doc["findings"] if f["rule"] == "IO001"]
    assert len(clu) == 1 and len(io) == 1
    text = clu[0]["title"] + " " + json.dumps(clu[0]["evidence"])
    assert "that the other steps do not" not in text and "in no other step" not in text
    # 80 ms in each slow step against 20 µs in each of the 9 others (not 20 µs / 9: the host work of
    # a step counts in it even where its window starts after it, behind the device's lag)
    assert "__next__ takes 80.0 ms in these steps vs 20 µs in the other steps" in text
    assert set(io[0]["steps"]) == {3, 7, 11} and io[0]["evidence"]["judged_on"] == "window"
    assert io[0]["id"] in (clu[0].get("explained_by") or [])


def test_one_time_phases_are_a_report_field_and_one_line_everywhere(tmp_path: Path) -> None:
    """The warm-up trace's set-up: 600 ms + 3 x 99.99 ms + 79.99 ms of calls = 979.96 ms, left out."""
    from advisor.render import html, markdown, terminal

    report = analyze(warmup_trace().write(tmp_path / "warm"))
    doc = report_json(report)
    one = [r for r in doc["window_phases"] if r["kind"] == "one_time"]
    assert len(one) == 1 and one[0]["rank"] == 0 and one[0]["excluded"] is True
    assert abs(one[0]["dur_us"] - (600_000 + 3 * 99_990 + 79_990)) < 1
    assert [r["step"] for r in doc["window_phases"] if r["kind"] == "warmup_step"] == [0]
    line = "of one-time set-up (cudaFree, cuModuleLoadData, cudnnCreate) on rank 0; left out of the per-step figures"
    for text in (terminal.render_text(report, width=400), markdown.render(report), html.render(report)):
        assert line in text and "schedule(wait=1, warmup=1" in text


def test_a_steady_window_has_no_window_line(tmp_path: Path) -> None:
    t = Trace()
    for n in range(4):
        steady_step(t, n, T0 + n * 100 * MS)
    report = analyze(t.write(tmp_path / "steady"))
    assert "window_phases" not in report_json(report)
    from advisor.render import markdown

    assert "of one-time set-up" not in markdown.render(report)
