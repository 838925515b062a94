"""Canonical-row fixtures for the parallel-group rules (CLU005 rank slow in one step, CLU006 slow pipeline stage).

Times in milliseconds (integer ns in the rows); every number the case files assert is worked out
next to the function. Helpers from :mod:`tests.rules.fixtures_cluster`.
"""

from __future__ import annotations

from typing import Any

from tests.rules.fixtures_cluster import _comm_op, _dev, _step_marker

STEP_MS = 45.0
BUCKETS_MB = (32, 24, 8)  # three DP buckets of different sizes: the groups {0, 1} and {2, 3} are data-parallel


def _pipeline(stage0_ms: float, stage1_ms: float, steps: int = 4) -> dict[str, list[dict[str, Any]]]:
    """4 ranks, two pipeline stages {0, 1} -> {2, 3} (pipeline groups pp0 = {0, 2}, pp1 = {1, 3}; data-parallel
    groups dpA = {0, 1}, dpB = {2, 3}), ``steps`` steps of 45 ms. Per step (ms from its start):

    stage 0: compute [0, a), send [a, a + 1), receive the gradient [a + 1, a + 1 + b) (waits for stage 1's
    compute), all-reduce of three buckets [41, 43);
    stage 1: receive [0, a + 1) (waits for stage 0), compute [a + 1, a + 1 + b), send [a + 1 + b, 41.5),
    all-reduce [41.5, 43);   with a = ``stage0_ms``, b = ``stage1_ms``, a + 1 + b = 41.

    Own time (step − not-overlapped communication): stage 0 = 45 − (1 + b + 2) = 42 − b;
    stage 1 = 45 − ((a + 1) + (41.5 − 41) + 1.5) = 42 − a.
    """
    assert stage0_ms + 1 + stage1_ms == 41.0
    a, b = stage0_ms, stage1_ms
    events: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    for i in range(steps):
        s0 = i * STEP_MS
        step = i + 1
        for r in range(4):
            events.append(_step_marker(r, step, s0, STEP_MS))
            dp = "dpA" if r < 2 else "dpB"
            pp = f"pp{r % 2}"
            if r < 2:
                spans = [("kernel", None, s0, a), ("comm", "send", s0 + a, 1.0), ("comm", "recv", s0 + a + 1, b)]
            else:
                spans = [("comm", "recv", s0, a + 1), ("kernel", None, s0 + a + 1, b), ("comm", "send", s0 + 41, 0.5)]
            for kind, op, start, dur in spans:
                events.append(_dev(r, kind, "MatMul" if kind == "kernel" else f"hcom_{op}", start, dur,
                                   stream=7 if kind == "kernel" else 9))
                if op:
                    ops.append(_comm_op(r, step, pp, start, dur, op_type=op, nbytes=4 << 20))
            t = 41.0 if r < 2 else 41.5
            per = (43.0 - t) / len(BUCKETS_MB)
            for k, mb in enumerate(BUCKETS_MB):
                events.append(_dev(r, "comm", "hcom_allReduce", s0 + t + k * per, per, stream=9))
                ops.append(_comm_op(r, step, dp, s0 + t + k * per, per, nbytes=mb << 20))
    return {"events": events, "comm_ops": ops}


def slow_stage0() -> dict[str, list[dict[str, Any]]]:
    """Stage 0 computes 30 ms, stage 1 10 ms: own time 42 − 10 = 32 ms on stage 0, 42 − 30 = 12 ms on
    stage 1, whose wait is (30 + 1) + 0.5 + 1.5 = 33 ms (stage 0's: 1 + 10 + 2 = 13 ms). Two stages: 32 > 1.2 × 12.
    Saving min(32 − 12, 33) = 20 ms of a 45 ms step (44 %: critical)."""
    return _pipeline(30.0, 10.0)


def balanced_stages() -> dict[str, list[dict[str, Any]]]:
    """Both stages compute 20 ms: own 22 ms each; quiet."""
    return _pipeline(20.0, 20.0)
