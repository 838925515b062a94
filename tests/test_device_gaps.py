"""Traces whose device timeline advisor cannot read: an accelerator's own unmodelled event category
(MTIA ``mtia_ccp_events``), a CUPTI range-profiler capture (``cuda_profiler_range`` events, no
kernels), and kernel launches with no device activity recorded.

No real export of these kinds is at hand, so the traces are written here in Kineto's documented
format (Chrome trace ``"ph": "X"`` events; host operators ``cpu_op``, runtime calls
``cuda_runtime`` / ``mtia_runtime``, device events on pid 0 linked by ``args.correlation``; steps
``ProfilerStep#N``; Kineto names the range profiler's activity type ``cuda_profiler_range``).
Each builder states the facts it plants; the tests assert those facts, never the advisor's
output pasted back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.analyze import analyze
from tests.conftest import report_json

MS = 1000  # Kineto times are µs
T0 = 1_000_000
STEPS = 5


def _x(cat: str, name: str, ts: float, dur: float, *, pid: int = 1, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _write(folder: Path, ev: list[dict[str, Any]], device: str = "NVIDIA A100-SXM4-80GB") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": device}], "traceEvents": ev,
           "distributedInfo": {"rank": 0, "world_size": 1}}
    (folder / "rank-0.pt.trace.json").write_text(json.dumps(doc))
    return folder


def host_heavy(runtime: str, launch: str, device_cat: str | None, *, sync: str | None = None) -> list[dict[str, Any]]:
    """Five 20 ms steps; each holds 40 host operators of 0.45 ms, each launching one device task
    (``device_cat`` events of 20 µs when given, none otherwise) and, with ``sync``, a 0.3 ms
    synchronize call after each operator: the device (where recorded) is busy 0.8 ms of 20 ms."""
    ev: list[dict[str, Any]] = []
    corr = 0
    for n in range(STEPS):
        ts = T0 + n * 20 * MS
        ev.append(_x("user_annotation", f"ProfilerStep#{n}", ts, 20 * MS))
        for k in range(40):
            a = ts + k * 500
            corr += 1
            ev.append(_x("cpu_op", "aten::add", a + 5, 450))
            ev.append(_x(runtime, launch, a + 10, 400, correlation=corr))
            if device_cat:
                ev.append(_x(device_cat, "add_kernel", a + 420, 20, pid=0, tid=7, correlation=corr, device=0, stream=7))
            if sync:
                ev.append(_x(runtime, sync, a + 460, 30))
    return ev


def _warnings(doc: dict[str, Any], code: str) -> list[str]:
    return [w["message"] for w in doc["warnings"] if w["code"] == code]


def _fired(doc: dict[str, Any]) -> set[str]:
    return {f["rule"] for f in doc["findings"]}


def test_launches_without_device_activity_are_said_and_not_judged(tmp_path: Path) -> None:
    """200 cudaLaunchKernel calls and 200 cudaDeviceSynchronize calls, no device event."""
    ev = host_heavy("cuda_runtime", "cudaLaunchKernel", None, sync="cudaDeviceSynchronize")
    doc = report_json(analyze(_write(tmp_path / "nodev", ev)))
    w = _warnings(doc, "device_not_recorded")
    assert len(w) == 1 and "launched device work (200 launch calls)" in w[0] and "no device activity" in w[0]
    assert not {"CPU003", "CPU007"} & _fired(doc)
    assert any("CPU003" in m and "not judged" in m for m in _warnings(doc, "rule_undecided"))
    assert [r["kind"] for r in doc["window_phases"]] == ["device_not_recorded"]
    from advisor.render.view import confidence

    assert any("not a CPU-only run" in n for n in confidence(doc)["notes"])


def test_range_profiler_capture_is_said_and_not_judged(tmp_path: Path) -> None:
    """Launches slowed by kernel replay (0.4 ms each), 5 cuda_profiler_range events, no kernel event."""
    ev = host_heavy("cuda_runtime", "cudaLaunchKernel", None, sync="cudaStreamSynchronize")
    ev += [_x("cuda_profiler_range", f"range_{n}", T0 + n * 20 * MS, 19 * MS, pid=0, tid=0) for n in range(STEPS)]
    doc = report_json(analyze(_write(tmp_path / "range", ev)))
    w = _warnings(doc, "range_profiler")
    assert len(w) == 1 and "5 cuda_profiler_range events" in w[0] and "replays each kernel" in w[0]
    assert not _warnings(doc, "device_not_recorded")
    assert not {"CPU003", "CPU007"} & _fired(doc)


def test_unmodelled_accelerator_events_raise_no_host_bound_verdict(tmp_path: Path) -> None:
    """MTIA command-processor events (200 of 20 µs, device busy 4 % of every step) under a busy host."""
    ev = host_heavy("mtia_runtime", "mtiaLaunchKernel", "mtia_ccp_events")
    doc = report_json(analyze(_write(tmp_path / "mtia", ev, device="MTIA")))
    w = _warnings(doc, "device_unmodelled")
    assert len(w) == 1 and "mtia_ccp_events, 200 events" in w[0]
    assert "CPU007" not in _fired(doc)
    assert any("CPU007" in m and "not judged" in m for m in _warnings(doc, "rule_undecided"))


def test_a_recorded_cuda_timeline_is_still_judged(tmp_path: Path) -> None:
    """The same host-heavy loop with its CUDA kernels recorded: the device idles 96 % of every step
    while the host launches, which is what CPU007 is for; no device-gap warning."""
    ev = host_heavy("cuda_runtime", "cudaLaunchKernel", "kernel")
    doc = report_json(analyze(_write(tmp_path / "cuda", ev)))
    assert not any(_warnings(doc, k) for k in ("device_unmodelled", "range_profiler", "device_not_recorded"))
    assert "CPU007" in _fired(doc)
