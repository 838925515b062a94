"""Long kernels that use fewer cores than the device has (low Block Dim; on GPUs, fewer blocks than SMs).

## Why it matters
A kernel split into fewer blocks than the device has cores leaves the other cores idle for its
whole duration: a vector operator with Block Dim 8 on a 48-vector-core Ascend 910B uses a sixth of
the chip. Tiling decides the split, so odd shapes or small batch dimensions can cause it
(Hermes lists low block dim among the reasons for underutilised operators; msprof-analyze has a
block-dim check). On a GPU the analogue is a grid of fewer blocks than SMs (``blocks per SM``
below 1 in the Kineto kernel arguments).

## How it is detected
From ``kernels`` (Ascend) and the Kineto kernel events with a launch grid (``events.block_dim``):
kernels of at least ``min_duration_us`` whose ``block_dim`` is below the core count of the
engine they ran on - AI Cores for ``AI_CORE`` / ``MIX_AIC`` tasks, AI Vector cores for
``AI_VECTOR_CORE`` / ``MIX_AIV`` tasks, SMs (CUs) for GPU kernels (``block_dim`` = grid size, or
``blocks per SM`` x SMs where a ``pmu`` object carries it). Core counts come from ``cores`` /
``vector_cores`` when set, else the exporter's ``meta`` (``ai_core_num`` / ``aiv_num``), else
``rules/compute/devices.toml``; an unknown device is reported in a warning, not guessed.

Kernels built to occupy few cores are not checked: communication kernels (kind ``comm``, HCCL /
communication tasks), and kernels whose name matches ``by_design_re``: expert-parallel
communication such as DeepEP's (which runs on ~20 SMs by design so the rest compute beside it),
custom all-reduce kernels (vLLM's ``cross_device_reduce``, one-shot / two-shot, NVSHMEM,
MSCCL++) and persistent kernels (a grid sized to the resident blocks, looping over the work).

The saving is per step, ``duration x (1 - block_dim / cores)`` summed over those kernels: the time
they would lose if their work were spread evenly over all cores (an upper bound). Where the what-if
replay of the steps with each such kernel at ``block_dim / cores`` of its time reproduces every
step, the saving is the replayed one instead: only the kernels on the step's critical path shorten it.

## What to do
Change the tiling so the work splits across all cores (tune the operator with the vendor's
auto-tuning tools, pad or reshape the dimension that is split, batch small operators), or fuse
the operator into a larger one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding
from rules.compute._common import device_label, meta_numbers, rank_devices


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CMP006."""

    min_duration_us: float = knob(20.0, "only kernels lasting at least this long (µs) are checked",
                                  "msprof-analyze advisor operator checks (_MIN_TASK_DURATION = 20 µs)")
    cores: int = knob(0, "override the AI Core / SM count; 0 = exporter meta or rules/compute/devices.toml")
    vector_cores: int = knob(0, "override the AI Vector core count; 0 = exporter meta or rules/compute/devices.toml")
    top_n: int = knob(10, "operators listed per finding")
    by_design_re: str = knob(r"(?i)deep_?ep|cross_device_reduce|custom_?a(ll_?)?r(educe)?|one_?shot|two_?shot|nvshmem"
                             r"|mscclpp|persistent",
                             "kernel names built to use few cores (expert-parallel / custom communication, persistent "
                             "kernels): not checked",
                             "DeepEP README: its kernels use ~20 SMs by design; persistent kernels size the grid to the "
                             "resident blocks")


# the kernels of a rank: Ascend's kernels rows, and Kineto kernels with their launch grid (events.block_dim)
KERNELS = """(
    SELECT rank, step, name, op_type, core_type, start_ns, dur_ns, block_dim, pmu, input_shapes FROM kernels
    UNION ALL
    SELECT rank, step, name, NULL, 'GPU', start_ns, dur_ns, block_dim, NULL, NULL FROM events
    WHERE device AND kind = 'kernel' AND block_dim IS NOT NULL
)"""

SQL = f"""
SELECT rank, step, name, coalesce(op_type, name) AS op_type, upper(coalesce(core_type, '')) AS core_type, start_ns, dur_ns,
       coalesce(block_dim, TRY_CAST(json_extract_string(pmu, '$."blocks per SM"') AS DOUBLE) * $sm) AS blocks,
       input_shapes
FROM {KERNELS}
WHERE dur_ns >= $min_duration_us * 1000 AND rank = $rank AND NOT regexp_matches(name, $by_design_re)
  AND upper(coalesce(core_type, '')) NOT IN ('HCCL', 'COMMUNICATION', 'AI_CPU', 'AICPU', 'DSA_SQE', 'SDMA_SQE',
                                              'WRITE_BACK', 'INVALID')
"""

STEPS_SQL = f"SELECT greatest(count(DISTINCT step) FILTER (WHERE step >= 0), 1) AS n FROM {KERNELS} WHERE rank = $rank"

VECTOR_KINDS = ("AI_VECTOR_CORE", "MIX_AIV")
ASSUMPTION = "if each of these kernels spread its work evenly over all cores (its time x block_dim / cores)"


def counterfactual(low: list[dict[str, Any]]) -> tuple[Change, ...]:
    """Each low kernel execution (by name and start) scaled to block_dim / cores of its time, one change per
    factor."""
    by_factor: dict[float, list[tuple[str, int]]] = {}
    for r in low:
        by_factor.setdefault(float(r["blocks"]) / float(r["cores"]), []).append((str(r["name"]), int(r["start_ns"])))
    return tuple(Change("scale", Select(device=True, at=tuple(at)), value=f) for f, at in sorted(by_factor.items()))


def _counts(ctx: RuleContext[Thresholds], rank: int, dev: Any, cube_meta: Callable[[int], float | None],
            vec_meta: Callable[[int], float | None]) -> tuple[int | None, int | None]:
    cube = ctx.t.cores or cube_meta(rank)
    vec = ctx.t.vector_cores or vec_meta(rank)
    if cube is None and dev is not None:
        cube = dev.cores
    if vec is None and dev is not None:
        vec = dev.vector_cores
    return (int(cube) if cube else None), (int(vec) if vec else None)


@rule("CMP006", "compute.low-block-dim", cause="compute.low_block_dim", requires=("kernel_detail", "device"),
      thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank with long kernels that leave cores idle."""
    cube_meta = meta_numbers(ctx, ("ai_core_num", "aicore_num", "sm_count", "multiProcessorCount"))
    vec_meta = meta_numbers(ctx, ("aiv_num", "vector_core_num"))
    with_kernels = {r["rank"] for r in ctx.query(f"SELECT DISTINCT rank FROM {KERNELS}")}
    for rank, (name, dev) in rank_devices(ctx).items():
        cube, vec = _counts(ctx, rank, dev, cube_meta, vec_meta)
        if cube is None:
            if rank in with_kernels:
                ctx.warn(f"rank {rank}: core count of device {device_label(name)} unknown (not in rules/compute/devices.toml, no "
                         "ai_core_num in the export); set CMP006.cores / CMP006.vector_cores")
            continue
        rows = ctx.query(SQL, {"rank": rank, "sm": cube})
        low: list[dict[str, Any]] = []
        for r in rows:
            if r["blocks"] is None:
                continue
            n_cores = (vec or cube) if r["core_type"] in VECTOR_KINDS else cube
            if float(r["blocks"]) < n_cores:
                low.append({**r, "cores": n_cores,
                            "saving_ns": float(r["dur_ns"]) * (1.0 - float(r["blocks"]) / n_cores)})
        if not low:
            continue
        n_steps = int(ctx.query(STEPS_SQL, {"rank": rank})[0]["n"])
        groups: dict[tuple[str, str, float], dict[str, Any]] = {}
        for r in low:
            key = (r["name"], r["core_type"], float(r["blocks"]))
            g = groups.setdefault(key, {"op": r["name"], "op_type": r["op_type"], "core_type": r["core_type"],
                                        "block_dim": float(r["blocks"]), "cores": r["cores"], "count": 0,
                                        "time_ns": 0.0, "saving_ns": 0.0, "shapes": r["input_shapes"]})
            g["count"] += 1
            g["time_ns"] += float(r["dur_ns"])
            g["saving_ns"] += r["saving_ns"]
        top = sorted(groups.values(), key=lambda g: -g["saving_ns"])
        saving_us = sum(g["saving_ns"] for g in top) / 1e3 / n_steps
        time_us = sum(g["time_ns"] for g in top) / 1e3 / n_steps
        head = top[0]
        yield ctx.finding(
            title=(f"Rank {rank}: {sum(g['count'] for g in top)} long kernel(s) use fewer cores than the device has "
                   f"({time_us:.0f} µs per step); top {head['op']} with {head['block_dim']:g} of {head['cores']} cores"),
            evidence={
                "device": name,
                "cores": cube,
                "vector_cores": vec,
                "kernels": sum(g["count"] for g in top),
                "operators": len(top),
                "low_block_dim_us_per_step": round(time_us, 2),
                "top_block_dim": head["block_dim"],
                "top_core_count": head["cores"],
                "min_duration_us": ctx.t.min_duration_us,
                "steps": n_steps,
            },
            saving_us=saving_us,
            step_us=ctx.step_us(rank),
            saving_basis="per step, sum of duration x (1 - block_dim / cores): the idle-core share of each long kernel",
            replay=ctx.what_if(rank, counterfactual(low), ASSUMPTION),
            ranks=[rank],
            ops=[g["op"] for g in top[: ctx.t.top_n]],
            top=[{**{k: g[k] for k in ("op", "op_type", "core_type", "block_dim", "cores", "count", "shapes")},
                  "time_us": round(g["time_ns"] / 1e3, 2), "saving_us": round(g["saving_ns"] / 1e3, 2)}
                 for g in top[: ctx.t.top_n]],
        )
