"""CPU005 counts host calls stalled by a scheduler slice (preemption) and CLU003 names it.

The Kineto traces are written here: eight steps (``ProfilerStep#1``..``#8``) of the same operators on
one thread (six ``aten::addmm`` and one each of four others), each call at its own fixed time, 50 µs
apart. Planted stalls (own time beyond the usual
time of the same call): ``aten::relu`` +4000 µs in step 4, ``aten::mm`` +2000 µs and the shapeless
autograd node ``detach`` +3000 µs in step 6. In the ``distractors`` trace the same stalls plus what
must not count as one: ``aten::add_`` +4000 µs in step 1 (the first step of the profiling cycle:
warm-up), +3000 µs in step 3 with a 3000 µs ``Python GC`` event nested in it (the GC's time), the
loader's ``aten::stack`` +3000 µs inside the ``DataLoader.__next__`` of step 7, and a ``checkpoint``
range that sleeps 200 ms in step 5 only.

The figures below are computed from the planted numbers, not read from the advisor: stalled time
4000 + 2000 + 3000 = 9000 µs over 8 steps = 1125 µs per step; steps 4 and 6 are the contended ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from advisor.analyze import analyze
from advisor.config import Config
from tests.conftest import report_json

# (category, name, input dims or None, µs per call, calls per step)
OPS: list[tuple[str, str, list[list[int]] | None, float, int]] = [
    ("cpu_op", "aten::addmm", [[512], [128, 512], [512, 512]], 900.0, 6),
    ("cpu_op", "aten::mm", [[128, 512], [512, 512]], 900.0, 1),
    ("cpu_op", "aten::relu", [[128, 512]], 100.0, 1),
    ("cpu_op", "detach", None, 10.0, 1),
    ("cpu_op", "aten::add_", [[512, 512], [512, 512]], 200.0, 1),
]
GAP = 50.0
STALLS = {(4, "aten::relu"): 4000.0, (6, "aten::mm"): 2000.0, (6, "detach"): 3000.0}
STEPS = range(1, 9)
STALLED_US = sum(STALLS.values())  # 9000


def _x(cat: str, name: str, ts: float, dur: float, dims: list[list[int]] | None = None) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"Input Dims": dims} if dims is not None else {}}


def _trace(tmp_path: Path, distractors: bool) -> Path:
    ev: list[dict[str, Any]] = []
    t = 0.0
    for step in STEPS:
        start = t
        if distractors:  # the loader's collate, inside its fetch; 3 ms longer in step 7
            t += GAP
            stack = 50.0 + (3000.0 if step == 7 else 0.0)
            ev.append(_x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t,
                         stack + 20.0))
            ev.append(_x("cpu_op", "aten::stack", t + 10.0, stack, [[3, 4]]))
            t += stack + 20.0
        for cat, name, dims, us, calls in OPS:
            for _ in range(calls):
                t += GAP
                dur = us + STALLS.get((step, name), 0.0)
                if distractors and name == "aten::add_" and step in (1, 3):
                    dur += 4000.0 if step == 1 else 3000.0
                ev.append(_x(cat, name, t, dur, dims))
                if distractors and name == "aten::add_" and step == 3:
                    ev.append(_x("python_function", "Python GC", t + 100.0, 3000.0))
                t += dur
        if distractors and step == 5:
            t += GAP
            ev.append(_x("user_annotation", "checkpoint", t, 200_000.0))
            t += 200_000.0
        t += GAP
        ev.append(_x("user_annotation", f"ProfilerStep#{step}", start, t - start))
    (tmp_path / "rank-0.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return tmp_path


def _findings(tmp_path: Path, distractors: bool) -> dict[str, dict[str, Any]]:
    data = report_json(analyze(_trace(tmp_path, distractors), Config(select=["CPU005", "CLU003"])))
    return {f["rule"]: f for f in data["findings"]}


def _stalls(f: dict[str, Any]) -> dict[int, float]:
    return {int(s): float(v) for s, v in (p.split(":") for p in f["evidence"]["stalled_us_by_step"].split(";"))}


@pytest.mark.parametrize("distractors", [False, True])
def test_stalls_are_counted_by_step(tmp_path: Path, distractors: bool) -> None:
    f = _findings(tmp_path, distractors)["CPU005"]
    ev = f["evidence"]
    assert ev["stalled_calls"] == len(STALLS)
    assert ev["stalled_us_total"] == pytest.approx(STALLED_US, abs=1.0)
    # step 1 (first of the cycle) is not judged; the GC, loader and checkpoint steps stalled nothing
    assert _stalls(f) == pytest.approx({2: 0.0, 3: 0.0, 4: 4000.0, 5: 0.0, 6: 5000.0, 7: 0.0, 8: 0.0}, abs=1.0)
    assert f["steps"] == [4, 6]
    assert ev["contended_steps"] == "4, 6"
    assert ev["stalled_us_in_python_or_ranges"] == 0.0
    # the replay bounds each stalled call to its usual time: one thread, nothing overlaps, so each step
    # gives back its stalls; averaged over the 8 steps
    assert f["replay"]["estimated"] and f["replay"]["reproduced"]
    assert f["estimated_saving_us"] == pytest.approx(STALLED_US / len(STEPS), rel=0.01)
    assert f["cause"] == "cpu.resource_contention"
    if distractors:
        left = ev["calls_not_judged"]
        assert "1 in a warm-up step" in left
        assert "1 inside a data-loader fetch or a compile" in left


def test_step_fluctuation_is_explained_by_the_stalls(tmp_path: Path) -> None:
    got = _findings(tmp_path, False)
    clu = got["CLU003"]
    assert clu["steps"] == [4, 6]
    assert got["CPU005"]["id"] in clu["explained_by"]
    # the calm steps stalled nothing: all of the slow steps' stalls are beyond them, and they are the
    # slow steps' whole excess (each slow step is its calm step plus its stalls)
    assert clu["evidence"]["slow_steps_stalled_us"] == pytest.approx(STALLED_US, abs=1.0)
    assert clu["evidence"]["slow_steps_stalled_share"] == pytest.approx(1.0, abs=0.01)
    assert "the machine, not the job" in clu["detail"]


def test_a_checkpoint_step_is_not_explained_by_the_stalls(tmp_path: Path) -> None:
    got = _findings(tmp_path, True)
    # the 200 ms checkpoint dominates the slow steps: the stalls do not explain the fluctuation
    assert 5 in got["CLU003"]["steps"]
    assert got["CPU005"]["id"] not in (got["CLU003"].get("explained_by") or [])
