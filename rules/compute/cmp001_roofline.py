"""Roofline per operator: which operators are memory-bound, compute-bound or underutilised, and what each class costs.

## Why it matters
Computation causes are 31.9 % of Hermes' 135 production cases. The roofline model (Hermes
§4.2.2, appendix B) tells the three situations apart, and each has different fixes: an operator
near the memory roof needs less traffic (fusion, quantisation), one near the compute roof needs
less work or a healthy clock, and one under both thresholds (the usual case: 61 % of the
bottleneck operators of the paper's PanGu case) is slow for a more specific reason (AI CPU
execution, poor hardware affinity, format conversion, too few cores) that the other CMP rules
look for.

## How it is detected
Per operator (rank, name, input shapes and dtypes), summed over its executions:

* achieved FLOP/s = FLOPs / device time, achieved bandwidth = bytes / device time,
  arithmetic intensity AI = FLOPs / bytes;
* ridge point AI_necessary = P_peak / B_peak, with the peak FLOP/s of the operator's dtype and the
  memory bandwidth of the rank's device (``rules/compute/devices.toml``, matched on
  ``ranks.device_name``; ``peak_tflops`` / ``peak_gbps`` override it);
* Hermes eq. (3): **memory-bound** when AI <= ridge and bandwidth >= U_threshold x B_peak,
  **compute-bound** when AI > ridge and FLOP/s >= U_threshold x P_peak, else **underutilised**.

Inputs by source. Ascend ``kernels``: FLOPs from ``flops`` or the PMU ``*_cube_fops`` /
``*_vector_fops`` counters, bytes from ``mem_bytes`` or the input + output tensor sizes
(shapes x dtypes); when neither count exists, the PMU pipe ratios stand in for the
utilisations (``aic_mac_ratio`` for the arithmetic side, ``aic_mte2_ratio`` / ``aiv_mte2_ratio``
for the memory side). Kineto: FLOPs that ``with_flops=True`` wrote on host operators, device time
of the kernels launched inside each such operator (the innermost one with FLOPs open on the
thread at the kernel's runtime launch, same correlation id), bytes of the operator's input tensors
(``record_shapes``), a lower bound of its traffic. Communication, AI CPU and DMA tasks are left
out. An operator whose class cannot be decided (no FLOPs and no ratio) is counted in a warning.

One finding per rank and class whose operators take at least ``min_share`` of the rank's
operator time, with the top operators (intensity, achieved vs peak, time share). The saving is
per step: for underutilised operators the time above what each would take at the threshold
(``max(FLOPs / P, bytes / B) / U_threshold``); for bound operators the time above the roof
itself. Both are upper bounds of what tuning the operators can give back. Where the what-if
replay of the steps with each operator at that time (its tasks scaled by it; Kineto: the kernels
launched inside the operator) reproduces every step, the saving is the replayed one instead: only
the operators on the step's critical path shorten it.

## What to do
Underutilised: read the other CMP findings on the same operators (AI CPU, affinity APIs,
format conversion, block dim); use fused / affinity operators. Memory-bound: fuse operators,
quantise, use memory-saving techniques. Compute-bound: check the clock (CMP005), lower the
precision where safe, isolate slow nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding
from rules.compute._common import (
    KERNEL_OPS,
    Device,
    device_label,
    dtype_class,
    kernel_tie_note,
    rank_devices,
    tensor_bytes,
)


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CMP001."""

    utilization_threshold: float = knob(
        0.8,
        "U_threshold of Hermes eq. (3): achieved FLOP/s (bandwidth) must reach this share of the peak to count as "
        "compute- (memory-) bound",
        "Hermes appendix B defines U_threshold but publishes no value; 0.8 = within 20 % of the roof, where tuning "
        "the operator itself has little left to give (first principles)",
    )
    min_share: float = knob(
        0.01,
        "report a class only when its operators take at least this share of the rank's operator time",
        "keeps classes that cannot matter out of the report",
    )
    peak_tflops: float = knob(0.0, "override the device's peak TFLOP/s (all dtypes); 0 = use rules/compute/devices.toml")
    peak_gbps: float = knob(0.0, "override the device's memory bandwidth in GB/s; 0 = use rules/compute/devices.toml")
    top_n: int = knob(10, "operators listed per finding")


# Device kernels that are not communication / AI CPU / DMA work.
COMPUTE_CORES = "('AI_CORE', 'AI_VECTOR_CORE', 'MIX_AIC', 'MIX_AIV', 'CUDA', 'HIP', 'KERNEL', 'FFTS_PLUS')"

KERNELS_SQL = f"""
SELECT rank, name AS op, any_value(op_type) AS op_type, input_shapes AS shapes, input_dtypes AS dtypes,
       output_shapes, output_dtypes,
       count(*) AS n, sum(dur_ns) AS dur_ns, count(DISTINCT step) FILTER (WHERE step >= 0) AS steps,
       sum(coalesce(flops, fops)) AS flops, bool_and(coalesce(flops, fops) IS NOT NULL) AS flops_known,
       sum(mem_bytes) AS mem_bytes, bool_and(mem_bytes IS NOT NULL) AS bytes_known,
       sum(mac_ratio * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE mac_ratio IS NOT NULL), 0) AS mac_ratio,
       sum(mte2_ratio * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE mte2_ratio IS NOT NULL), 0) AS mte2_ratio
FROM (
    SELECT *,
        CASE WHEN coalesce(json_extract_string(pmu, '$.aic_cube_fops'), json_extract_string(pmu, '$.aic_vector_fops'),
                           json_extract_string(pmu, '$.aiv_cube_fops'), json_extract_string(pmu, '$.aiv_vector_fops'))
                  IS NULL THEN NULL
             ELSE coalesce(TRY_CAST(json_extract_string(pmu, '$.aic_cube_fops') AS DOUBLE), 0)
                + coalesce(TRY_CAST(json_extract_string(pmu, '$.aic_vector_fops') AS DOUBLE), 0)
                + coalesce(TRY_CAST(json_extract_string(pmu, '$.aiv_cube_fops') AS DOUBLE), 0)
                + coalesce(TRY_CAST(json_extract_string(pmu, '$.aiv_vector_fops') AS DOUBLE), 0) END AS fops,
        coalesce(TRY_CAST(json_extract_string(pmu, '$.aic_mac_ratio') AS DOUBLE),
                 TRY_CAST(json_extract_string(pmu, '$.mac_ratio') AS DOUBLE)) AS mac_ratio,
        greatest(TRY_CAST(json_extract_string(pmu, '$.aic_mte2_ratio') AS DOUBLE),
                 TRY_CAST(json_extract_string(pmu, '$.aiv_mte2_ratio') AS DOUBLE)) AS mte2_ratio
    FROM kernels
    WHERE dur_ns > 0 AND upper(coalesce(core_type, 'KERNEL')) IN {COMPUTE_CORES}
)
GROUP BY rank, name, input_shapes, input_dtypes, output_shapes, output_dtypes
"""

KINETO_SQL = f"""
WITH inst AS (  -- one row per operator execution with FLOPs: the device time of the kernels launched inside it
    SELECT rank, fop_oid, any_value(fop_name) AS op, any_value(fop_shapes) AS shapes,
           any_value(fop_dtypes) AS dtypes, any_value(fop_flops) AS flops, sum(dur_ns) AS dur_ns, min(step) AS step
    FROM {KERNEL_OPS} WHERE fop_oid IS NOT NULL GROUP BY rank, fop_oid
)
SELECT rank, op, NULL AS op_type, shapes, dtypes, NULL AS output_shapes, NULL AS output_dtypes,
       count(*) AS n, sum(dur_ns) AS dur_ns, count(DISTINCT step) FILTER (WHERE step >= 0) AS steps,
       sum(flops) AS flops, true AS flops_known, NULL AS mem_bytes, false AS bytes_known,
       NULL AS mac_ratio, NULL AS mte2_ratio
FROM inst GROUP BY rank, op, shapes, dtypes
"""

STEPS_SQL = """
SELECT rank, count(DISTINCT step) FILTER (WHERE step >= 0) AS n FROM {table} GROUP BY rank
"""

CAUSE_OF = {"memory": "compute.memory_bound", "compute": "compute.compute_bound", "under": "compute.underutilization"}
LABEL = {"memory": "memory-bound", "compute": "compute-bound", "under": "underutilised"}


def _classify(row: dict[str, Any], p_peak: float, b_peak: float, thr: float) -> dict[str, Any]:
    """Hermes eq. (3) for one operator; returns class, utilisations, intensity and saving (ns)."""
    dur = float(row["dur_ns"])
    sec = dur * 1e-9
    flops = float(row["flops"]) if row["flops_known"] and row["flops"] is not None else None
    nbytes = row.get("bytes")
    ridge = p_peak / b_peak
    u_a = flops / sec / p_peak if flops is not None else None
    u_m = nbytes / sec / b_peak if nbytes is not None else None
    basis = "counts"
    if u_a is None and row.get("mac_ratio") is not None:
        u_a, basis = float(row["mac_ratio"]), "pmu_ratio"
    if u_m is None and row.get("mte2_ratio") is not None:
        u_m, basis = float(row["mte2_ratio"]), "pmu_ratio"
    ai = flops / nbytes if flops is not None and nbytes else None
    cls: str | None
    if ai is not None:
        if ai <= ridge and (u_m or 0) >= thr:
            cls = "memory"
        elif ai > ridge and (u_a or 0) >= thr:
            cls = "compute"
        else:
            cls = "under"
    elif u_a is not None and u_a >= thr:
        cls = "compute"
    elif u_m is not None and u_m >= thr:
        cls = "memory"
    elif u_a is not None and u_m is not None:
        cls = "under"
    else:
        cls = None  # one side unknown and the known side below the threshold: cannot tell
    best = max(u for u in (u_a, u_m, 0.0) if u is not None)
    if cls == "under":
        saving = max(0.0, dur - dur * best / thr)  # time above the operator at the threshold
    elif cls is not None:
        saving = max(0.0, dur - dur * min(best, 1.0))  # time above the roof itself
    else:
        saving = 0.0
    return {"cls": cls, "u_arith": u_a, "u_mem": u_m, "ai": ai, "ridge": ridge, "basis": basis, "saving_ns": saving}


ASSUMPTION = {
    "under": "if each operator ran at the utilisation threshold of its bound resource",
    "memory": "if each operator ran at the memory roof",
    "compute": "if each operator ran at the compute roof",
}


def counterfactual(members: list[dict[str, Any]], source: str) -> tuple[Change, ...]:
    """Each operator's device time scaled to what the rule says it would take (its time less its saving),
    one factor per operator name (over its shapes, by time). Ascend: the tasks of that name; Kineto: the
    kernels launched inside the operators of that name."""
    dur: dict[str, float] = {}
    target: dict[str, float] = {}
    for m in members:
        dur[m["op"]] = dur.get(m["op"], 0.0) + float(m["dur_ns"])
        target[m["op"]] = target.get(m["op"], 0.0) + float(m["dur_ns"]) - float(m["saving_ns"])
    factor = {op: max(target[op], 0.0) / d for op, d in sorted(dur.items()) if d > 0 and target[op] < d}
    if source == "kernels":
        return (Change("scale", Select(device=True, names=tuple(factor)), scales=tuple(factor.items())),) if factor else ()
    return tuple(Change("scale", Select(kinds=("host_op",), names=(op,), device=False, launched=True), value=f)
                 for op, f in factor.items())


def _peaks(t: Thresholds, dev: Device | None, dcls: str | None) -> tuple[float | None, float | None, str | None]:
    p, key = (t.peak_tflops, "override") if t.peak_tflops > 0 else (dev.peak_for(dcls) if dev else (None, None))
    b = t.peak_gbps if t.peak_gbps > 0 else (dev.peak_gbps if dev else None)
    return (p * 1e12 if p else None), (b * 1e9 if b else None), key


@rule("CMP001", "compute.roofline", cause="compute.underutilization",
      causes=("compute.memory_bound", "compute.compute_bound"), requires=("device",), thresholds=Thresholds,
      derived=(KERNEL_OPS,))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank and roofline class, with the top operators of that class."""
    t = ctx.t
    rows = ctx.query(KERNELS_SQL) if ctx.rows("kernels") else []
    usable = [r for r in rows if r["flops_known"] or r["mac_ratio"] is not None or r["mte2_ratio"] is not None]
    source, table = "kernels", "kernels"
    if not usable:
        # operators carry FLOPs only with Kineto's with_flops; without any, no kernel can be attributed one
        has_flops = ctx.scalar("SELECT count(*) FROM events WHERE kind = 'host_op' AND NOT device AND flops > 0")
        rows = ctx.query(KINETO_SQL) if has_flops else []
        usable, source, table = rows, "kineto_flops", "events"
        if has_flops and (note := kernel_tie_note(ctx)):
            ctx.warn(note)
    if not usable:
        ctx.warn("no FLOP counts or PMU utilisation on any device operator: record Kineto traces with "
                 "with_flops=True and record_shapes=True, Ascend with aic_metrics (PipeUtilization or "
                 "ArithmeticUtilization) to get a roofline")
        return
    steps = {int(r["rank"]): max(1, int(r["n"] or 0)) for r in ctx.query(STEPS_SQL.format(table=table))}
    devices = rank_devices(ctx)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in usable:
        by_rank.setdefault(int(r["rank"]), []).append(r)
    for rank, ops in sorted(by_rank.items()):
        name, dev = devices.get(rank, (None, None))
        if dev is None and not (t.peak_tflops > 0 and t.peak_gbps > 0):
            ctx.warn(f"rank {rank}: device {device_label(name)} is not in rules/compute/devices.toml; no roofline without its "
                     "peaks (set CMP001.peak_tflops and CMP001.peak_gbps)")
            continue
        total_ns = float(sum(float(o["dur_ns"]) for o in ops))
        classified: dict[str, list[dict[str, Any]]] = {"memory": [], "compute": [], "under": []}
        undecided_ns = 0.0
        for o in ops:
            dcls = dtype_class(o["dtypes"])
            p_peak, b_peak, pkey = _peaks(t, dev, dcls)
            if not p_peak or not b_peak:
                undecided_ns += float(o["dur_ns"])
                continue
            if o["bytes_known"] and o["mem_bytes"] is not None:
                nbytes: float | None = float(o["mem_bytes"])
            else:
                per_exec = tensor_bytes(o["shapes"], o["dtypes"])
                out_b = tensor_bytes(o["output_shapes"], o["output_dtypes"]) if o["output_shapes"] else None
                nbytes = None if per_exec is None else (per_exec + (out_b or 0.0)) * float(o["n"])
            res = _classify({**o, "bytes": nbytes}, p_peak, b_peak, t.utilization_threshold)
            if res["cls"] is None:
                undecided_ns += float(o["dur_ns"])
                continue
            classified[res["cls"]].append({**o, **res, "bytes": nbytes, "p_peak": p_peak, "b_peak": b_peak,
                                           "dtype": dcls, "peak_key": pkey})
        if undecided_ns:
            ctx.warn(f"rank {rank}: {undecided_ns / 1e3:.1f} µs of operator time ({undecided_ns / total_ns:.0%}) "
                     "has FLOPs or bytes but not both and stays below the threshold on the known side, so its class "
                     "is undecided")
        n_steps = steps.get(rank, 1)
        step_us = ctx.step_us(rank)
        for cls, members in classified.items():
            cls_ns = sum(float(m["dur_ns"]) for m in members)
            if not members or cls_ns < t.min_share * total_ns:
                continue
            members.sort(key=lambda m: (-m["saving_ns"], -float(m["dur_ns"])))
            saving_us = sum(m["saving_ns"] for m in members) / 1e3 / n_steps
            top = [_top_row(m, total_ns) for m in members[: t.top_n]]
            head = top[0]
            by_key: dict[str, float] = {}
            for m in members:
                by_key[m["peak_key"] or "?"] = by_key.get(m["peak_key"] or "?", 0.0) + float(m["dur_ns"])
            main_key = max(by_key, key=lambda k: by_key[k])
            main = next(m for m in members if (m["peak_key"] or "?") == main_key)  # dtype with most time
            yield ctx.finding(
                cause=CAUSE_OF[cls],
                title=(f"Rank {rank}: {len(members)} {LABEL[cls]} operators take {cls_ns / total_ns:.0%} of operator time "
                       f"({cls_ns / 1e3 / n_steps:.0f} µs per step); top {head['op']} at "
                       f"{_pct(head.get('u_arith'))} of peak FLOP/s, {_pct(head.get('u_mem'))} of peak bandwidth"),
                evidence={
                    "device": name,
                    "device_entry": dev.id if dev else "override",
                    "peak_dtype": main["peak_key"],
                    "peak_tflops": round(main["p_peak"] / 1e12, 2),
                    "peak_gbps": round(main["b_peak"] / 1e9, 1),
                    "ridge_flop_per_byte": round(main["ridge"], 1),
                    "utilization_threshold": t.utilization_threshold,
                    "min_share": t.min_share,
                    "operators": len(members),
                    "time_share": round(cls_ns / total_ns, 4),
                    "time_us_per_step": round(cls_ns / 1e3 / n_steps, 1),
                    "steps": n_steps,
                    "data": source,
                    "top_op": head["op"],
                    "top_u_arith": head["u_arith"],
                    "top_u_mem": head["u_mem"],
                },
                saving_us=saving_us,
                step_us=step_us,
                saving_basis=("per step, the time above what each operator would take at the utilisation threshold "
                              "(max(FLOPs/P_peak, bytes/B_peak) / U_threshold)" if cls == "under" else
                              "per step, the time above the roof (operator at 100 % of the bound resource)")
                + ("; bytes are the input tensors only (a lower bound of traffic)" if source == "kineto_flops" else ""),
                ranks=[rank],
                steps=[],
                ops=[m["op"] for m in members[: t.top_n]],
                top=top,
                replay=ctx.what_if(rank, counterfactual(members, source), ASSUMPTION[cls]),
            )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _top_row(m: dict[str, Any], total_ns: float) -> dict[str, Any]:
    sec = float(m["dur_ns"]) * 1e-9
    flops = float(m["flops"]) if m["flops_known"] and m["flops"] is not None else None
    return {
        "op": m["op"],
        "op_type": m.get("op_type"),
        "shapes": m["shapes"],
        "dtype": m["dtype"],
        "count": int(m["n"]),
        "time_us": round(float(m["dur_ns"]) / 1e3, 2),
        "time_share": round(float(m["dur_ns"]) / total_ns, 4),
        "intensity_flop_per_byte": None if m["ai"] is None else round(m["ai"], 2),
        "ridge_flop_per_byte": round(m["ridge"], 1),
        "achieved_tflops": None if flops is None else round(flops / sec / 1e12, 3),
        "achieved_gbps": None if m["bytes"] is None else round(m["bytes"] / sec / 1e9, 1),
        "u_arith": None if m["u_arith"] is None else round(m["u_arith"], 4),
        "u_mem": None if m["u_mem"] is None else round(m["u_mem"], 4),
        "basis": m["basis"],
        "saving_us": round(m["saving_ns"] / 1e3, 2),
    }
