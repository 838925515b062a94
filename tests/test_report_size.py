"""The JSON report stays small: critical-path segments are merged below 0.1 % of the step.

A trace of a few MB whose steps hold thousands of tiny operators gave a report of several MB, most
of it critical-path segments. Merged, the segments still tile the step (their durations add up
to its wall time) and each kind keeps its exact time; ``--full-critical-path`` keeps them all.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from advisor.stages.critical_path import summarise_segments
from tests.conftest import validate_report
from tests.render_helpers import run_cli

OPS_PER_STEP = 10_000
OP_US, PITCH_US = 2.0, 4.0  # each operator: 2 µs, one every 4 µs (1 µs of nothing on each side)
STEP_US = OPS_PER_STEP * PITCH_US  # 40 000 µs: the step marker spans exactly its operators' pitches


def write_many_ops_trace(directory: Path, steps: int = 3) -> Path:
    """A CPU Kineto trace (~4 MB) of ``steps`` back-to-back steps of :data:`OPS_PER_STEP` tiny operators each."""
    directory.mkdir(parents=True, exist_ok=True)
    ev: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    t = 1000.0
    for step in range(1, steps + 1):
        t0 = t
        for i in range(OPS_PER_STEP):
            ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": t + 1.0,
                       "dur": OP_US, "args": {"External id": step * OPS_PER_STEP + i}})
            t += PITCH_US
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t0,
                   "dur": t - t0, "args": {}})
    path = directory / "many.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev, "deviceProperties": []}))
    return path


def _by_kind(segs: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for s in segs:
        for k, v in (s.get("by_kind_us") or {s["kind"]: s["dur_us"]}).items():
            out[k] += v
    return dict(out)


def _tiles(segs: list[dict[str, Any]], length: float) -> None:
    pos = 0.0
    for s in segs:
        assert s["dur_us"] > 0
        assert s["start_us"] == pytest.approx(pos, abs=1e-3)
        pos = s["start_us"] + s["dur_us"]
    assert pos == pytest.approx(length, abs=1e-3)


def test_summarise_segments_keeps_totals() -> None:
    """By hand: a 1000 µs step of 800 alternating 1 µs host / idle pieces, then 'a' 50 + 'a' 50 (one
    operator, contiguous) and 'b' 100. At the default resolution (0.1 % of 1000 µs = 1 µs) no piece
    is shorter, so only the two 'a' merge; at 1 % (10 µs) the 800 pieces become 80 runs of 10 µs,
    each 5 µs host and 5 µs idle."""
    segs: list[dict[str, Any]] = []
    t = 0.0
    for i in range(800):
        segs.append({"start_us": t, "dur_us": 1.0, "name": "idle" if i % 2 else f"op{i % 6}",
                     "kind": "idle" if i % 2 else "host"})
        t += 1.0
    segs += [{"start_us": 800.0, "dur_us": 50.0, "name": "a", "kind": "compute"},
             {"start_us": 850.0, "dur_us": 50.0, "name": "a", "kind": "compute"},
             {"start_us": 900.0, "dur_us": 100.0, "name": "b", "kind": "compute"}]
    cp = {"rank": 0, "step": 1, "length_us": 1000.0, "ops": [{"name": "b", "kind": "compute", "total_us": 100.0}],
          "segments": segs}

    fine = summarise_segments(cp)  # 0.1 %: 1 µs
    assert fine["segments_total"] == 803 and len(fine["segments"]) == 802
    assert fine["segments"][-2] == {"start_us": 800.0, "dur_us": 100.0, "name": "a", "kind": "compute", "merged": 2}
    assert fine["ops"] == cp["ops"]

    coarse = summarise_segments(cp, resolution=0.01)
    assert coarse["segments_resolution_us"] == 10.0
    runs = coarse["segments"][:-2]
    assert len(runs) == 80
    assert all(r["merged"] == 10 and r["by_kind_us"] == {"host": 5.0, "idle": 5.0} for r in runs)
    assert runs[0]["top"][0] == {"name": "idle", "kind": "idle", "us": 5.0}
    for out in (fine, coarse):
        _tiles(out["segments"], 1000.0)
        assert _by_kind(out["segments"]) == {"host": 400.0, "idle": 400.0, "compute": 200.0}
    assert segs[0] == {"start_us": 0.0, "dur_us": 1.0, "name": "op0", "kind": "host"}  # input untouched


@pytest.mark.slow
def test_few_mb_trace_gives_a_small_report(tmp_path: Path) -> None:
    """A 4 MB trace: the report stays under 2 MB, its segments tile the step, and each kind has
    the time the trace gives (per step: 10 000 operators x 2 µs host, the rest idle)."""
    trace = write_many_ops_trace(tmp_path / "many")
    assert trace.stat().st_size > 3_000_000
    out = tmp_path / "r.json"
    res = run_cli(trace.parent, "--format", "json", "--out", out)
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size < 2_000_000
    data = json.loads(out.read_text())
    validate_report(data)
    cp = data["critical_path"]
    assert cp["length_us"] == pytest.approx(STEP_US)
    assert cp["segments_total"] > 15_000 and len(cp["segments"]) <= 3_000
    _tiles(cp["segments"], STEP_US)
    kinds = _by_kind(cp["segments"])
    assert kinds["host"] == pytest.approx(OPS_PER_STEP * OP_US, abs=1e-3)
    assert sum(kinds.values()) == pytest.approx(STEP_US, abs=1e-3)
    assert kinds == pytest.approx(cp["by_kind_us"], abs=1e-3)


@pytest.mark.slow
def test_full_critical_path_option_keeps_every_segment(tmp_path: Path) -> None:
    trace = write_many_ops_trace(tmp_path / "many", steps=2)
    merged, full = tmp_path / "m.json", tmp_path / "f.json"
    assert run_cli(trace.parent, "--format", "json", "--out", merged).returncode == 0
    res = run_cli(trace.parent, "--format", "json", "--out", full, "--full-critical-path")
    assert res.returncode == 0, res.stderr
    m, f = json.loads(merged.read_text()), json.loads(full.read_text())
    validate_report(f)
    assert "segments_total" not in f["critical_path"]
    assert len(f["critical_path"]["segments"]) == m["critical_path"]["segments_total"] > 15_000
    assert f["critical_path"]["ops"] == m["critical_path"]["ops"]
    assert _by_kind(f["critical_path"]["segments"]) == pytest.approx(_by_kind(m["critical_path"]["segments"]), abs=1e-3)
    assert full.stat().st_size > 2 * merged.stat().st_size


REAL = Path(__file__).parent / "data" / "kineto_real"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kineto_b200_vllm_tp8_rank0", "kineto_mi300_sglang_prefilldecode",
                                  "kineto_mi300_hf_bert_small"])
def test_real_traces_give_small_reports(tmp_path: Path, name: str) -> None:
    """Issue #20: the B200 trace (0.8 MB gzip, 14 MB of JSON) gave a 6.4 MB JSON report, 4.4 MB of
    it critical-path segments (``--full-critical-path`` still does). Every report of these real
    traces of a few MB stays within 2 MB, in each format, and the merged segments still tile the path."""
    paths = {ext: tmp_path / f"r.{ext}" for ext in ("json", "html", "md")}
    args: list[Any] = []
    for p in paths.values():
        args += ["--out", p]
    res = run_cli(REAL / name, *args)
    assert res.returncode == 0, res.stderr
    for p in paths.values():
        assert p.stat().st_size <= 2_000_000, (p.name, p.stat().st_size)
    data = json.loads(paths["json"].read_text())
    validate_report(data)
    cp = data["critical_path"]
    if cp.get("segments"):
        _tiles(cp["segments"], cp["length_us"])
        assert _by_kind(cp["segments"]) == pytest.approx(cp["by_kind_us"], abs=1e-3)
