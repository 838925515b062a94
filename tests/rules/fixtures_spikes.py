"""Planted Kineto traces for CLU003's periodic spikes: a CPU training loop that saves a checkpoint every N steps.

The traces are written in the torch 2.x Chrome-trace format (``cpu_op`` / ``user_annotation`` events, ``ts`` and
``dur`` in µs) by construction, so every planted number is known:

* 30 steps ``ProfilerStep#1`` .. ``#30``. Each step: ``aten::linear`` 8 ms (enclosing ``aten::addmm`` 7.6 ms),
  ``autograd::engine::evaluate_function: AddmmBackward0`` 10 ms (enclosing ``AddmmBackward0`` 9.5 ms and
  ``aten::mm`` 9 ms), ``Optimizer.step#SGD.step`` 1 ms, 0.1 ms apart, each scaled by a jitter factor in
  [0.97, 1.03] (``random.Random(7)``, one per step) -> a normal step is 19.4 ± 0.6 ms.
* ``periodic_checkpoint``: in steps 10, 20 and 30, after the optimizer, a ``save_checkpoint`` range of 900 ms
  holding 4 ``aten::copy_`` of 20 ms each (nested: only ``save_checkpoint`` is the outermost extra work).
* ``steady``: the same loop without checkpoints (a healthy control).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

STEPS = 30
CHECKPOINT_MS = 900.0
CHECKPOINT_EVERY = 10


def _x(cat: str, name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 100, "ts": round(ts, 3), "dur": round(dur, 3),
            "args": {}}


def _trace(out: Path, checkpoint_steps: set[int]) -> Path:
    rng = random.Random(7)
    ev: list[dict[str, Any]] = []
    t = 1_000_000.0  # µs
    for step in range(1, STEPS + 1):
        j = rng.uniform(0.97, 1.03)
        start = t
        t += 100
        ev.append(_x("cpu_op", "aten::linear", t, 8000 * j))
        ev.append(_x("cpu_op", "aten::addmm", t + 200 * j, 7600 * j))
        t += 8000 * j + 100
        ev.append(_x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", t, 10000 * j))
        ev.append(_x("cpu_op", "AddmmBackward0", t + 250 * j, 9500 * j))
        ev.append(_x("cpu_op", "aten::mm", t + 500 * j, 9000 * j))
        t += 10000 * j + 100
        ev.append(_x("user_annotation", "Optimizer.step#SGD.step", t, 1000 * j))
        t += 1000 * j + 100
        if step in checkpoint_steps:
            ev.append(_x("user_annotation", "save_checkpoint", t, CHECKPOINT_MS * 1000))
            for k in range(4):
                ev.append(_x("cpu_op", "aten::copy_", t + 1000 + k * 100_000, 20_000))
            t += CHECKPOINT_MS * 1000 + 100
        ev.append(_x("user_annotation", f"ProfilerStep#{step}", start, t - start))
        t += 50
    doc = {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms", "traceEvents": ev}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "worker0.pt.trace.json"
    path.write_text(json.dumps(doc))
    return out


def periodic_checkpoint(out: Path) -> Path:
    """``save_checkpoint`` (900 ms) in steps 10, 20 and 30 of 30."""
    return _trace(Path(out), set(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)))


def two_checkpoints(out: Path) -> Path:
    """``save_checkpoint`` (900 ms) in steps 10 and 20 only: too few spikes to call them periodic."""
    return _trace(Path(out), {10, 20})


def steady(out: Path) -> Path:
    """The same loop without checkpoints."""
    return _trace(Path(out), set())
