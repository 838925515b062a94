"""Operators that run on the slow AI CPU instead of the AI Core.

## Why it matters
On Ascend an operator falls back to the AI CPU when the AI Core has no kernel for its dtype or
attributes (for example int64 or double inputs). AI CPU tasks run one to two orders of magnitude
slower than the AI Core version and serialise the stream around them. Hermes (§4.2.2, §4.3)
lists AICPU operators among the common reasons for underutilised computation.

## How it is detected
From ``kernels`` (Ascend ``kernel_details``): tasks whose ``Accelerator Core`` is ``AI_CPU``.
The rule fires for a rank when at least one such operator takes ``min_duration_us`` or more in a
single execution (msprof-analyze's AI CPU check uses the same 20 µs floor). The finding lists
the operators by total time with their input/output dtypes, and flags those with ``DOUBLE``
inputs (no AI Core kernel exists for most double-precision operators). Sources without AI CPU
tasks (Kineto GPU traces) have nothing to detect; CPU-only traces are skipped (no ``kernels``).

The saving is the per-step time of the AI CPU operators above the floor: an upper bound, since
the AI Core replacement still takes some time. It is not replayed, and the finding says why: what
the AI Core version would take is not in the trace.

## What to do
Cast the inputs to a dtype the AI Core supports (for example int16 -> int32 for ``Mul``, double
-> float32), or replace the operator with an equivalent that has an AI Core kernel; move index
bookkeeping off the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CMP002."""

    min_duration_us: float = knob(
        20.0,
        "an AI CPU operator counts when one of its executions lasts at least this long (µs)",
        "msprof-analyze advisor AicpuChecker (_MIN_TASK_DURATION = 20 µs)",
    )
    top_n: int = knob(10, "operators listed per finding")


SQL = """
WITH ai AS (
    SELECT rank, step, name, coalesce(op_type, name) AS op_type, dur_ns, input_dtypes, output_dtypes
    FROM kernels WHERE upper(replace(coalesce(core_type, ''), '_', '')) = 'AICPU' AND dur_ns > 0
),
ops AS (
    SELECT rank, op_type, name, count(*) AS n, sum(dur_ns) AS dur_ns, max(dur_ns) AS max_ns,
           any_value(input_dtypes) AS input_dtypes, any_value(output_dtypes) AS output_dtypes,
           bool_or(upper(coalesce(input_dtypes, '')) LIKE '%DOUBLE%') AS has_double
    FROM ai GROUP BY rank, op_type, name
    HAVING max(dur_ns) >= $min_duration_us * 1000
),
steps AS (
    SELECT rank, greatest(count(DISTINCT step) FILTER (WHERE step >= 0), 1) AS n_steps,
           sum(dur_ns) FILTER (WHERE upper(coalesce(core_type, '')) NOT IN ('HCCL', 'COMMUNICATION')) AS kernel_ns
    FROM kernels GROUP BY rank
)
SELECT o.*, s.n_steps, s.kernel_ns FROM ops o JOIN steps s USING (rank)
ORDER BY o.rank, o.dur_ns DESC
"""


#: why the finding is not replayed
NOT_REPLAYED = ("what each operator would take on the AI Core is not known (no AI Core execution of it is recorded), "
                "so there is no time to replay it at; removing it would only restate the upper bound")


@rule("CMP002", "compute.aicpu-operator", cause="compute.aicpu_operator", requires=("kernels",), thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank with AI CPU operators above the duration floor."""
    rows = ctx.query(SQL)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_rank.setdefault(int(r["rank"]), []).append(r)
    for rank, ops in by_rank.items():
        n_steps = int(ops[0]["n_steps"])
        total_ns = float(sum(float(o["dur_ns"]) for o in ops))
        kernel_ns = float(ops[0]["kernel_ns"] or 0) or None
        doubles = [o["name"] for o in ops if o["has_double"]]
        per_step_us = total_ns / 1e3 / n_steps
        top = [
            {
                "op": o["name"],
                "op_type": o["op_type"],
                "count": int(o["n"]),
                "time_us": round(float(o["dur_ns"]) / 1e3, 2),
                "max_us": round(float(o["max_ns"]) / 1e3, 2),
                "input_dtypes": o["input_dtypes"],
                "output_dtypes": o["output_dtypes"],
                "double_input": bool(o["has_double"]),
            }
            for o in ops[: ctx.t.top_n]
        ]
        yield ctx.finding(
            title=(f"Rank {rank}: {sum(int(o['n']) for o in ops)} AI CPU task(s) of {len(ops)} operator(s) take "
                   f"{per_step_us:.0f} µs per step (longest {max(float(o['max_ns']) for o in ops) / 1e3:.0f} µs); "
                   f"top {ops[0]['op_type']} ({ops[0]['name']})"),
            evidence={
                "aicpu_tasks": sum(int(o["n"]) for o in ops),
                "aicpu_operators": len(ops),
                "aicpu_us_per_step": round(per_step_us, 2),
                "aicpu_share_of_kernel_time": None if not kernel_ns else round(total_ns / kernel_ns, 4),
                "longest_us": round(max(float(o["max_ns"]) for o in ops) / 1e3, 2),
                "min_duration_us": ctx.t.min_duration_us,
                "double_input_operators": len(doubles),
                "steps": n_steps,
            },
            saving_us=per_step_us,
            step_us=ctx.step_us(rank),
            saving_basis="per step, the whole time of the AI CPU operators above the floor (upper bound: the AI Core "
            "version of an operator is not free)",
            replay={"estimated": False, "reason": NOT_REPLAYED},
            ranks=[rank],
            ops=[o["name"] for o in ops[: ctx.t.top_n]],
            detail=("Operators with DOUBLE inputs have no AI Core kernel: " + ", ".join(doubles[:10])) if doubles else "",
            top=top,
        )
