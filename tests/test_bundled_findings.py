"""Checks the what-if issue (#30) asks of every bundled Kineto trace, read apart from the advisor.

* A sync that did not block saves nothing: a finding of ``cpu.host_device_sync`` never replays a saving
  larger than the time the host spent blocked in the device's runtime sync calls (synchronize, stream
  query, blocking copy), per step on its worst rank; where nothing blocked, no such finding states any
  saving. (A rule's own figure may count more than the syncs: CPU007 the device's idle time during all
  host work, when syncs are its main part.) A call blocked from its start until the last device task (kernel, copy,
  memset) that ended inside it; a call in which no device task ended did not block (CPU-only traces have
  none: every such finding there saves nothing).
* The profiler's own activity is never a finding: no finding names a ``ProfilerStep#N`` marker, a
  ``[memory]`` or profiler-harness event, or a host call that occurs only outside every step window (the
  harness's closing ``cudaDeviceSynchronize``).

The traces are read here with ``json``; the sweep over every trace is slow, two traces run quickly.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from advisor.analyze import analyze
from advisor.config import Config
from tests.conftest import ROOT, SAMPLES, TRACES, profile_group, report_json, shared_report

QUICK = (TRACES / "cpu_host_sync", SAMPLES / "kineto_two_ranks")


def _profiles() -> list[Path]:
    out = [p for p in sorted(SAMPLES.glob("kineto_*")) if p.is_dir()]
    out += [p for p in sorted(TRACES.iterdir()) if p.is_dir()]
    out += [p for p in sorted((ROOT / "tests" / "data" / "kineto_real").iterdir()) if p.is_dir()]
    out += sorted(p for p in (ROOT / "tests" / "data" / "twins").glob("*/*") if p.is_dir())
    return out


def _params() -> list[Any]:
    return [pytest.param(p, id=str(p.relative_to(ROOT)), marks=[profile_group(p)] + ([] if p in QUICK else
                                                                                      [pytest.mark.slow]))
            for p in _profiles()]


RUNTIME_CATS = ("cuda_runtime", "hip_runtime", "cuda_driver", "runtime", "xpu_runtime", "privateuse1_runtime")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
#: the runtime calls that can block the host on the device
SYNC_CALL = re.compile(r"(?i)synchroni[sz]e$|streamquery$|^(cuda|hip|cu)memcpy(?!.*async)")
PROFILER_NAME = re.compile(r"^ProfilerStep#|^\[memory\]|^PyTorch Profiler|^\[pytorch profiler\]", re.IGNORECASE)


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")))


def _events(p: Path) -> list[dict[str, Any]]:
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    evs = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return [e for e in evs if e.get("ph") == "X" and "ts" in e and "dur" in e]


@functools.cache
def raw(d: Path) -> tuple[float, frozenset[str], frozenset[str], bool]:
    """From the trace files: the largest mean (over a file's steps; a file without step markers is one
    window) of the time blocked in sync calls per step (µs); the host names that occur only outside every
    step window; the names of any event; whether the trace has step markers."""
    worst = 0.0
    inside: set[str] = set()
    outside: set[str] = set()
    names: set[str] = set()
    marked = False
    for p in _files(d):
        ev = _events(p)
        steps = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev
                       if str(e.get("name", "")).startswith("ProfilerStep#")
                       and str(e.get("cat", "")).lower() != "gpu_user_annotation")
        marked = marked or bool(steps)
        if not steps:  # no step marker: the whole trace is one window
            steps = [(min(float(e["ts"]) for e in ev), max(float(e["ts"]) + float(e["dur"]) for e in ev))] if ev else []
        dev_end = sorted(float(e["ts"]) + float(e["dur"]) for e in ev if str(e.get("cat", "")).lower() in DEVICE_CATS)
        starts = [a for a, _ in steps]
        blocked: dict[int, float] = defaultdict(float)
        for e in ev:
            name, cat = str(e.get("name", "")), str(e.get("cat", "")).lower()
            names.add(name)
            if cat in DEVICE_CATS or cat == "gpu_user_annotation":
                continue
            s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            k = bisect.bisect_right(starts, s) - 1
            in_step = k >= 0 and s < steps[k][1]
            (inside if in_step else outside).add(name)
            if in_step and cat in RUNTIME_CATS and SYNC_CALL.search(name):
                q = bisect.bisect_right(dev_end, t) - 1
                if q >= 0 and dev_end[q] > s:
                    blocked[k] += dev_end[q] - s
        if steps:
            worst = max(worst, sum(blocked.values()) / len(steps))
    return worst, frozenset(outside - inside), frozenset(names), marked


def _named(f: dict[str, Any]) -> list[str]:
    out = [str(x) for x in f.get("ops") or []]
    for t in f.get("top") or []:
        if isinstance(t, dict):
            out += [str(t[k]) for k in ("op", "name", "kernel", "operator", "event") if isinstance(t.get(k), str)]
    return [n for n in out if n]


@pytest.mark.parametrize("path", _params())
def test_a_sync_saves_no_more_than_the_host_was_blocked(path: Path) -> None:
    worst_us, _, _, _ = raw(path)
    doc = report_json(shared_report(path))
    for f in doc["findings"]:
        if f["cause"] != "cpu.host_device_sync":
            continue
        replayed = (f.get("replay") or {}).get("saving_us") or 0.0
        assert replayed <= worst_us * 1.01 + 1.0, (f["rule"], replayed, worst_us)
        if worst_us == 0.0:
            assert not f.get("estimated_saving_us"), (f["rule"], f.get("estimated_saving_us"))


@pytest.mark.parametrize("path", _params())
def test_the_profilers_own_events_are_never_a_finding(path: Path) -> None:
    _, harness_only, _, marked = raw(path)
    doc = report_json(shared_report(path))
    for f in doc["findings"]:
        for n in _named(f):
            assert not PROFILER_NAME.search(n), (f["rule"], n)
            if marked:
                assert n not in harness_only, (f["rule"], n)


T0 = 1_000_000


def _x(cat: str, name: str, ts: float, dur: float, *, pid: int = 1, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_a_sync_of_microseconds_beside_a_busy_device_saves_nothing(tmp_path: Path) -> None:
    """Five 10 ms steps: the host launches a 9 ms kernel (+100 µs to +9100), polls with 40
    ``cudaStreamSynchronize`` calls of 3 µs from +1000 every 100 µs (the kernel runs through all of them:
    none blocked), then an ``aten::item`` from +8000 whose synchronize (+8005 to +9105) waits for the
    kernel's end: 1095 µs blocked per step, the polls nothing. Then a launch at +9200 of a 500 µs kernel
    (+9250). No host-device-sync finding predicts more than the 1095 µs; without the item's wait the launch
    comes 1095 µs earlier (+8105) and its kernel starts when the long one ends (+9100): 150 µs per step, the
    polls adding nothing."""
    ev: list[dict[str, Any]] = []
    for n in range(5):
        ts = T0 + n * 10_000
        ev.append(_x("user_annotation", f"ProfilerStep#{n}", ts, 10_000))
        ev.append(_x("cpu_op", "aten::mm", ts + 50, 30))
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", ts + 60, 10, correlation=2 * n + 1))
        ev.append(_x("kernel", "gemm_kernel", ts + 100, 9000, pid=0, tid=7, correlation=2 * n + 1, device=0, stream=7))
        for k in range(40):
            ev.append(_x("cuda_runtime", "cudaStreamSynchronize", ts + 1000 + k * 100, 3))
        ev.append(_x("cpu_op", "aten::item", ts + 8000, 1110))
        ev.append(_x("cuda_runtime", "cudaStreamSynchronize", ts + 8005, 1100))
        ev.append(_x("cpu_op", "aten::add", ts + 9190, 30))
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", ts + 9200, 10, correlation=2 * n + 2))
        ev.append(_x("kernel", "add_kernel", ts + 9250, 500, pid=0, tid=7, correlation=2 * n + 2, device=0, stream=7))
    (tmp_path / "t").mkdir()
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": ev,
           "distributedInfo": {"rank": 0, "world_size": 1}}
    (tmp_path / "t" / "rank-0.pt.trace.json").write_text(json.dumps(doc))
    assert raw(tmp_path / "t")[0] == pytest.approx(1095.0)
    rep = report_json(analyze(tmp_path / "t", Config()))
    found = [f for f in rep["findings"] if f["cause"] == "cpu.host_device_sync"]
    assert [f["replay"]["saving_us"] for f in found if (f.get("replay") or {}).get("estimated")] == [
        pytest.approx(150.0)]
    for f in found:
        assert (f.get("replay") or {}).get("saving_us", 0.0) <= 1095.0 + 1.0, f
        assert (f.get("estimated_saving_us") or 0.0) <= 1095.0 + 1.0, f
