"""Time spent converting tensor formats and dtypes (TransData, Cast, layout copies).

## Why it matters
Ascend's cube unit works on private formats (FRACTAL_NZ, NC1HWC0 ...; Hermes appendix F), so a
tensor kept in ND is converted by ``TransData`` around every matrix operator, and mixed precision
adds ``Cast`` operators. In the paper's PanGu-α case TransData and Cast were among the ten most
expensive operators (appendix C); keeping tensors in the private format removed them. On GPUs the
analogue is dtype casts (``aten::_to_copy``) and layout copies (``contiguous`` /
channels-last conversions) that launch their own kernels.

## How it is detected
Share of the rank's operator time taken by conversion operators:

* Ascend ``kernels``: operator types ``TransData``, ``TransDataRNN``, ``Cast``, ``NPUFormatCast``
  (any core type); in addition, consecutive tasks on a stream where the producer's output format
  differs from the consumer's input format are counted as format boundaries (evidence only);
* Kineto: device kernels launched from inside ``aten::_to_copy`` / ``aten::to`` (dtype casts) or
  ``aten::contiguous`` / ``aten::clone`` with a memory format (layout copies): the kernel's
  runtime launch (same correlation id) ran while the operator was open on its thread; the
  innermost such operator names the conversion.

The rule fires when the share reaches ``min_share``. The saving is the per-step conversion
time, an upper bound (some casts, e.g. of fp32 master weights, are needed); where the what-if
replay of the steps without those conversion tasks (Kineto: the kernels launched inside the
conversion operators) reproduces every step, the replayed saving instead: only the conversions on
the step's critical path shorten it.

## What to do
Keep tensors in the private format (on torch_npu do not disable the NZ format where it is
allowed; let the graph compiler choose the formats), cast once instead of back and forth, keep
activations in one dtype, and on GPUs pick one memory format (channels_last end to end).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding
from rules.compute._common import KERNEL_OPS, kernel_tie_note


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CMP004."""

    min_share: float = knob(
        0.05,
        "fire when conversion operators take at least this share of the rank's operator time",
        "Hermes appendix C (TransData and Cast among the top-10 operators of PanGu-α); 5 % = the share at which "
        "the medium severity line (3 % of the step) becomes reachable on a compute-dominated step",
    )
    top_n: int = knob(10, "operators listed per finding")


CONVERSION_TYPES = "('TRANSDATA', 'TRANSDATARNN', 'CAST', 'NPUFORMATCAST', 'FORMATTRANSFER')"

ASCEND_SQL = f"""
WITH conv_types AS (  -- each distinct operator type tested once
    SELECT DISTINCT coalesce(op_type, name) AS op_type FROM kernel_names
    WHERE upper(coalesce(op_type, name)) IN {CONVERSION_TYPES}
),
k AS NOT MATERIALIZED (
    SELECT rank, step, name, coalesce(op_type, name) AS op_type, core_type, start_ns, dur_ns,
           input_formats, output_formats, input_dtypes, output_dtypes
    FROM kernels
    WHERE dur_ns > 0 AND upper(coalesce(core_type, '')) NOT IN ('HCCL', 'COMMUNICATION')
),
conv AS (
    SELECT rank, op_type, name, count(*) AS n, sum(dur_ns) AS dur_ns,
           any_value(input_formats || ' -> ' || output_formats) AS formats,
           any_value(input_dtypes || ' -> ' || output_dtypes) AS dtypes
    FROM k WHERE op_type IN (SELECT op_type FROM conv_types)
    GROUP BY rank, op_type, name
),
seq AS (  -- format boundaries between consecutive tasks (of the ranks that convert at all)
    SELECT rank, split_part(replace(output_formats, 'FORMAT_', ''), ';', 1) AS out_fmt,
           lead(split_part(replace(input_formats, 'FORMAT_', ''), ';', 1)) OVER (PARTITION BY rank ORDER BY start_ns)
               AS next_in_fmt
    FROM k WHERE rank IN (SELECT rank FROM conv)
),
tot AS (
    SELECT rank, sum(dur_ns) AS total_ns, greatest(count(DISTINCT step) FILTER (WHERE step >= 0), 1) AS n_steps
    FROM k GROUP BY rank
),
bnd AS (
    SELECT rank, count(*) FILTER (WHERE out_fmt <> '' AND next_in_fmt <> '' AND upper(out_fmt) NOT IN ('NULL', 'N/A')
                                  AND upper(next_in_fmt) NOT IN ('NULL', 'N/A') AND out_fmt <> next_in_fmt)
           AS boundaries
    FROM seq GROUP BY rank
)
SELECT c.*, t.total_ns, t.n_steps, b.boundaries
FROM conv c JOIN tot t USING (rank) LEFT JOIN bnd b USING (rank)
ORDER BY c.rank, c.dur_ns DESC
"""

KINETO_SQL = f"""
WITH launched AS (  -- every kernel once, with the innermost conversion operator it was launched in (if any)
    SELECT rank, corr, step, dur_ns,
           CASE WHEN conv_name IN ('aten::_to_copy', 'aten::to') THEN 'dtype cast'
                WHEN conv_name IS NOT NULL THEN 'layout copy' END AS conv,
           conv_name AS conv_op, conv_shapes
    FROM {KERNEL_OPS}
),
all_k AS (
    SELECT rank, sum(dur_ns) AS total_ns, greatest(count(DISTINCT step) FILTER (WHERE step >= 0), 1) AS n_steps
    FROM events WHERE device AND kind = 'kernel' GROUP BY rank
)
SELECT l.rank, l.conv AS op_type, l.conv_op || ' ' || coalesce(l.conv_shapes, '') AS name, count(*) AS n,
       sum(l.dur_ns) AS dur_ns, NULL AS formats, NULL AS dtypes, a.total_ns, a.n_steps, NULL AS boundaries
FROM launched l JOIN all_k a USING (rank)
WHERE l.conv IS NOT NULL
GROUP BY ALL ORDER BY l.rank, dur_ns DESC
"""


#: the Kineto operators whose launched kernels are conversions (clone / contiguous only where the trace
#: records shapes, as the rule counts them: their rows are then "layout copy")
DTYPE_CAST_OPS = ("aten::_to_copy", "aten::to")
LAYOUT_COPY_OPS = ("aten::contiguous", "aten::clone")
ASSUMPTION = "if the conversions took no time (tensors kept in the format and dtype their consumers read)"


def counterfactual(ops: list[dict[str, Any]], source: str) -> tuple[Change, ...]:
    """The conversions the rule counted removed: Ascend, its conversion tasks by name; Kineto, the kernels
    launched inside the conversion operators."""
    if source == "kernels":
        return (Change("remove", Select(device=True, names=tuple(sorted({str(o["name"]) for o in ops})))),)
    names = DTYPE_CAST_OPS + (LAYOUT_COPY_OPS if any(o["op_type"] == "layout copy" for o in ops) else ())
    return (Change("remove", Select(kinds=("host_op",), names=names, device=False, launched=True)),)


@rule("CMP004", "compute.format-conversion", cause="compute.format_conversion", requires=("device",),
      thresholds=Thresholds, derived=("kernel_names", KERNEL_OPS))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose conversion operators reach the share threshold."""
    if ctx.vendor_kernels:
        rows, source = ctx.query(ASCEND_SQL), "kernels"
    else:
        rows, source = ctx.query(KINETO_SQL), "kineto"
        if note := kernel_tie_note(ctx):
            ctx.warn(note)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_rank.setdefault(int(r["rank"]), []).append(r)
    for rank, ops in by_rank.items():
        total_ns = float(ops[0]["total_ns"] or 0)
        conv_ns = float(sum(float(o["dur_ns"]) for o in ops))
        if not total_ns or conv_ns < ctx.t.min_share * total_ns:
            continue
        n_steps = int(ops[0]["n_steps"])
        by_type: dict[str, float] = {}
        for o in ops:
            by_type[o["op_type"]] = by_type.get(o["op_type"], 0.0) + float(o["dur_ns"])
        per_step_us = conv_ns / 1e3 / n_steps
        kinds = ", ".join(f"{k} {v / conv_ns:.0%}" for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]))
        yield ctx.finding(
            title=(f"Rank {rank}: format/dtype conversions take {conv_ns / total_ns:.0%} of operator time "
                   f"({per_step_us:.0f} µs per step; {kinds})"),
            evidence={
                "conversion_share": round(conv_ns / total_ns, 4),
                "min_share": ctx.t.min_share,
                "conversion_us_per_step": round(per_step_us, 2),
                "conversion_tasks": sum(int(o["n"]) for o in ops),
                **{f"{k.lower().replace(' ', '_')}_us_per_step": round(v / 1e3 / n_steps, 2) for k, v in by_type.items()},
                "format_boundaries": None if ops[0]["boundaries"] is None else int(ops[0]["boundaries"]),
                "steps": n_steps,
                "data": source,
            },
            saving_us=per_step_us,
            step_us=ctx.step_us(rank),
            saving_basis="per step, the device time of all conversion operators (upper bound: some casts are needed)",
            replay=ctx.what_if(rank, counterfactual(ops, source), ASSUMPTION),
            ranks=[rank],
            ops=[o["name"] for o in ops[: ctx.t.top_n]],
            top=[
                {"op": o["name"], "op_type": o["op_type"], "count": int(o["n"]),
                 "time_us": round(float(o["dur_ns"]) / 1e3, 2), "time_share": round(float(o["dur_ns"]) / total_ns, 4),
                 "formats": o["formats"], "dtypes": o["dtypes"]}
                for o in ops[: ctx.t.top_n]
            ],
        )
