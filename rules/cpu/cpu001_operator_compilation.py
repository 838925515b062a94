"""Operators are compiled on the host during training: JIT / graph recompiles, dynamic input shapes.

## Why it matters
Hermes (§4.2.2, Table 2) lists operator compilation first among CPU causes: when an operator's
input shape changes, Ascend's JIT compiles it again (in the paper's case 762 compilations took
57.9 ms of a step), and ``torch.compile`` re-traces and recompiles a frame for every new shape
its guards reject. The host spends the time compiling instead of launching work, so the device
waits.

## How it is detected
* **Compile events** (host side, any source): AscendCL/CANN compile APIs
  (``AscendCL@aclopCompileAndExecute``, ``AscendCL@opCompile``, any ``*Compile*`` runtime
  event) and torch.compile's compile-time regions (``entire_frame_compile``,
  ``entire_backward_compile``, ``... (dynamo_timed)``). Names containing ``Compiled`` or
  ``compile_id=`` (the *execution* of already compiled code, ``Torch-Compiled Region``,
  ``CompiledFunction``, and Dynamo's metadata annotations) do not count. Nested compile events
  are counted once (only the outermost on a thread). The time per step is averaged over the
  steady steps (all recorded steps but the first when there are three or more: the first often
  holds one-off warm-up compiles). ``Torch-Compiled Region: F/N`` and ``compile_id=F/N`` with
  N > 0 are counted as recompiles of frame F.
* **Dynamic shapes** (``record_shapes=True`` / Ascend ``Input Shapes``): for each host operator
  the steps in which it first meets an input shape. In a static model every shape has been
  seen by the end of the first recorded step; the rule counts the later steps that bring new
  shapes.

It fires when the compile time is at least ``min_compile_share`` of the step (saving = that
time per step, an upper bound: a static model compiles nothing after warm-up; where the what-if
replay of the steps without the compile events reproduces every step, the replayed saving instead,
which counts only the compile time the step waited for), or, without
compile events, when at least ``min_new_shape_step_share`` of the later steps bring new input
shapes. The latter gets severity *low* and no saving: eager PyTorch on a CPU or GPU does not
compile per shape, so the cost appears only under Ascend JIT compilation or torch.compile, and
the trace cannot tell how much it would be.

## What to do
Make shapes static (pad to a few bucket sizes), disable JIT compilation on Ascend
(``torch_npu.npu.set_compile_mode(jit_compile=False)``), and with torch.compile mark dynamic
dimensions (``dynamic=True`` / ``torch._dynamo.mark_dynamic``) instead of recompiling per shape.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding, Severity
from rules.cpu._common import fmt_ms, outermost, steady_steps, step_table


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU001."""

    min_compile_share: float = knob(
        0.01, "mean compile time per steady step, as a share of the step, that fires the rule",
        "first principles: below 1 % of the step a compile is not worth a finding; severity then follows CAUSES.md")
    min_new_shape_step_share: float = knob(
        0.5, "share of the later steps that bring operator input shapes not seen before (dynamic shapes)",
        "first principles: a static model sees all its shapes in its first step; a ragged last batch adds one step at most")
    min_steps: int = knob(3, "steps needed to judge dynamic shapes (the first is the baseline)",
                          "first principles: one baseline step plus at least two to compare")


COMPILE_RE = r"(?i)compile"
NOT_COMPILE_RE = r"(?i)compiled|compile_id="
RECOMPILE_RE = r"(?:Torch-Compiled Region: |compile_id=)(\d+)/(\d+)"

#: the counterfactual (advisor.stages.replay): the compile events the rule counts take no time (a static
#: model compiles nothing after warm-up)
COUNTERFACTUAL = (Change("remove", Select(name_re=COMPILE_RE, not_name_re=NOT_COMPILE_RE, not_kinds=("step", "python"),
                                          device=False)),)
ASSUMPTION = "if no operator were compiled during the step"

COMPILE_SQL = f"""
WITH c AS (
    SELECT rank, step, pid, tid, name, start_ns, dur_ns FROM events
    WHERE NOT device AND step IS NOT NULL AND kind NOT IN ('step', 'python')
      AND name IN (SELECT name FROM event_names WHERE regexp_matches(name, $compile_re)
                                                  AND NOT regexp_matches(name, $not_compile_re))
),
{outermost("top", "c")}
SELECT rank, step, count(*) AS n, sum(dur_ns) / 1000.0 AS compile_us,
       string_agg(DISTINCT name, ' | ') AS names
FROM top GROUP BY rank, step
"""

RECOMPILE_SQL = """
SELECT rank, count(DISTINCT regexp_extract(name, $recompile_re, 1) || '/' || regexp_extract(name, $recompile_re, 2)) AS recompiles,
       count(DISTINCT regexp_extract(name, $recompile_re, 1)) AS frames
FROM events
WHERE NOT device
  AND name IN (SELECT name FROM event_names WHERE regexp_matches(name, $recompile_re)
                                              AND TRY_CAST(regexp_extract(name, $recompile_re, 2) AS INTEGER) > 0)
GROUP BY rank
"""

SHAPES_SQL = """
WITH s AS (
    SELECT rank, name, shapes, min(step) AS first_step
    FROM events
    WHERE kind = 'host_op' AND NOT device AND step IS NOT NULL AND step >= 0
      AND shapes IS NOT NULL AND shapes NOT IN ('', '[]', '[[]]')
    GROUP BY rank, name, shapes
),
first AS (SELECT rank, min(step) AS s0, count(DISTINCT step) AS n_steps FROM steps WHERE step >= 0 GROUP BY rank)
SELECT s.rank, s.name, count(*) AS distinct_shapes,
       count(DISTINCT s.first_step) FILTER (WHERE s.first_step > f.s0) AS later_steps_with_new,
       list(DISTINCT s.first_step) FILTER (WHERE s.first_step > f.s0) AS new_steps,
       any_value(f.n_steps) AS n_steps
FROM s JOIN first f USING (rank)
GROUP BY s.rank, s.name
"""


def compile_rows(ctx: RuleContext[Any]) -> list[dict[str, Any]]:
    """:data:`COMPILE_SQL`'s rows (rank, step, n, compile_us, names), once per analysis (CPU001 and CLU003
    read them; not to be changed)."""
    return ctx.once("cpu001_compile_rows", lambda: ctx.query(
        COMPILE_SQL, {"compile_re": COMPILE_RE, "not_compile_re": NOT_COMPILE_RE}))


@rule("CPU001", "cpu.operator-compilation", cause="cpu.operator_compilation",
      requires=("events", "steps", "breakdown"), thresholds=Thresholds, derived=("event_names",))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank: compile time per step, recompiles and dynamic-shape operators."""
    comp = compile_rows(ctx)
    recompiles = {int(r["rank"]): r for r in ctx.query(RECOMPILE_SQL, {"recompile_re": RECOMPILE_RE})}
    shapes = ctx.query(SHAPES_SQL)
    bd = step_table(ctx)
    has_shapes = bool(shapes)
    # rows per rank as plain lists: one pass over each table (a DataFrame per rank cost ~1 ms a
    # rank, 1,024 ranks 0.6 s)
    bd_of: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for r, st_, us in zip(bd["rank"].tolist(), bd["step"].tolist(), bd["step_us"].tolist(), strict=True):
        bd_of[int(r)].append((int(st_), float(us)))
    comp_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in comp:
        comp_of[int(row["rank"])].append(row)
    shapes_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in shapes:
        shapes_of[int(row["rank"])].append(row)
    first_rank = min(bd_of) if bd_of else None
    for rank in sorted(set(bd_of) | set(comp_of)):
        steps_r = bd_of.get(rank)
        if steps_r is None:
            continue
        steady = set(steady_steps([s_ for s_, _us in steps_r]))
        st = [us for s_, us in steps_r if s_ in steady]
        step_us = sum(st) / len(st) if st else float("nan")
        c_all = comp_of.get(rank, [])
        c = [row for row in c_all if row["step"] in steady]
        compile_us = sum(float(row["compile_us"]) for row in c) / max(len(st), 1)
        n_compiles = sum(int(row["n"]) for row in c)
        sh = shapes_of.get(rank, [])
        n_steps = max(int(row["n_steps"]) for row in sh) if sh else len(steps_r)
        later = max(n_steps - 1, 0)
        dyn = [row for row in sh if row["later_steps_with_new"] > 0]
        steps_new = sorted({int(x) for row in dyn for x in row["new_steps"]})
        new_share = len(steps_new) / later if later else 0.0
        rc = recompiles.get(rank)
        evidence = {
            "compile_us_per_step": round(compile_us, 1),
            "compile_share": round(compile_us / step_us, 4) if step_us else None,
            "min_compile_share": ctx.t.min_compile_share,
            "compile_events_per_step": round(n_compiles / max(len(st), 1), 2),
            "compile_events_total": sum(int(row["n"]) for row in c_all),
            "steady_steps": len(st),
            "recompiles": int(rc["recompiles"]) if rc else 0,
            "ops_with_new_shapes": len(dyn),
            "steps_with_new_shapes": len(steps_new),
            "later_steps": later,
            "new_shape_step_share": round(new_share, 4),
            "min_new_shape_step_share": ctx.t.min_new_shape_step_share,
            "step_us_mean": round(step_us, 1),
        }
        dyn_ok = has_shapes and n_steps >= ctx.t.min_steps and new_share >= ctx.t.min_new_shape_step_share
        if step_us and compile_us / step_us >= ctx.t.min_compile_share:
            names = sorted({n for row in c for n in row["names"].split(" | ")})
            extra = f"; {len(dyn)} operators see new input shapes in {len(steps_new)} of {later} later steps" if dyn_ok else ""
            rec = f", {evidence['recompiles']} recompiles" if evidence["recompiles"] else ""
            top = _top(dyn)
            yield ctx.finding(
                title=f"Rank {rank} compiles operators during training: {fmt_ms(compile_us)} per step "
                f"({compile_us / step_us:.0%} of {fmt_ms(step_us)}), {evidence['compile_events_per_step']:g} compile events per step{rec}{extra}",
                evidence=evidence, saving_us=compile_us, step_us=step_us,
                saving_basis="mean host compile time per steady step (outermost compile events); a static model compiles nothing after warm-up",
                ranks=[rank], steps=sorted({int(row["step"]) for row in c}), ops=names[:5] + [t["op"] for t in top[:5]], top=top,
                replay=ctx.what_if(rank, COUNTERFACTUAL, ASSUMPTION, steps=sorted(steady)),
            )
        elif dyn_ok:
            if c_all:
                ctx.warn(f"rank {rank}: compile events only in the first recorded step "
                         f"({fmt_ms(sum(float(row['compile_us']) for row in c_all))}); "
                         "treated as warm-up")
            top = _top(dyn)
            yield ctx.finding(
                title=f"Rank {rank} has dynamic shapes: {len(dyn)} operators meet new input shapes in {len(steps_new)} of "
                f"{later} steps after the first (up to {max(int(row['distinct_shapes']) for row in dyn)} shapes per operator); "
                "no compile events recorded, so the recompile cost is not measured",
                evidence=evidence, severity=Severity.LOW,
                saving_basis="not measurable: no compile events in this trace (eager mode compiles nothing per shape; "
                "Ascend JIT or torch.compile would)",
                ranks=[rank], steps=steps_new, ops=[t["op"] for t in top[:5]], top=top,
            )
        elif not has_shapes and not c_all and rank == first_rank:
            ctx.warn("no input shapes recorded (profile with record_shapes=True) and no compile events: "
                     "dynamic shapes cannot be judged")


def _top(dyn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operators that meet new input shapes most often (at most 10)."""
    # ties broken by name: the list (and the finding id built from it) must not change between runs
    rows = sorted(dyn, key=lambda r: (-int(r["later_steps_with_new"]), -int(r["distinct_shapes"]), r["name"]))
    return [{"op": r["name"], "distinct_shapes": int(r["distinct_shapes"]), "later_steps_with_new_shapes": int(r["later_steps_with_new"])}
            for r in rows[:10]]
