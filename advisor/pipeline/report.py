"""Report assembly: the :class:`~advisor.model.Report` of an analysed context and its rules' findings.

:func:`finish_report` says what the profile lacks (missing ranks), applies the focus (``--rank`` /
``--step``) to the findings and builds the report: the breakdown rows, the profile's metadata, step
statistics, the critical path, savings, the hardware, variability and parallel-group sections, and
the documentation of each rule with a finding (the renderers read nothing else).
"""

from __future__ import annotations

import math
import time
from typing import Any

from advisor import __version__
from advisor.engine.context import AnalysisContext
from advisor.model import Report, Warning_, clean
from advisor.schema import NO_STEP
from advisor.text import spans

BREAKDOWN_FIELDS = (
    "rank",
    "step",
    "step_us",
    "compute_us",
    "comm_us",
    "overlapped_us",
    "compute_only_us",
    "comm_only_us",
    "host_only_us",
    "free_us",
    "overlap_ratio",
    "kernel_us",
    "memory_us",
    "dataloader_us",
    "host_busy_us",
)


def finish_report(ctx: AnalysisContext, findings: list[Any], outcomes: list[Any], t_start: float, *,
                  rank: int | None = None, step: int | None = None, full_critical_path: bool = False) -> Report:
    """The report of the rules' findings: missing ranks said, the focus (--rank / --step) applied."""
    findings = _missing_ranks(ctx, findings)
    if rank is not None or step is not None:
        findings = narrow_findings(findings, rank, step)
    return build_report(ctx, findings, outcomes, t_start, rank=rank, step=step, full_critical_path=full_critical_path)


def _combined(ctx: AnalysisContext, findings: list[Any], savings: dict[str, Any]) -> dict[str, Any]:
    """``savings.combined``: the top root findings' changes replayed together
    (:func:`advisor.engine.combined.headline`), from the replays made where the events are (the maps,
    or :func:`advisor.engine.runner.run_rules` on a context holding them)."""
    from advisor.engine import combined
    from advisor.engine.registry import discover

    cluster = {rid for rid, spec in discover().items() if spec.scope == "cluster"}
    return combined.headline(findings, savings.get("roots") or [], ctx.extras.get(combined.TABLE_KEY),
                             ctx.extras.get(combined.JOINED_KEY), ctx.breakdown, cluster)


def narrow_findings(findings: list[Any], rank: int | None, step: int | None) -> list[Any]:
    """The findings of a report narrowed by --rank / --step: those naming the chosen rank and step
    (or no rank / step in particular). With --rank, the chosen rank's own findings come first; the
    others, about more ranks than it (PAR001 "on 2 ranks", a group's wait) or none in particular,
    follow marked ``cluster-wide``: a user narrowing to a rank still learns that it is the
    straggler of its group, and sees which figures are not its own."""
    import dataclasses

    kept = [f for f in findings
            if (rank is None or not f.ranks or rank in f.ranks) and (step is None or not f.steps or step in f.steps)]
    if rank is None:
        return kept
    own = [f for f in kept if tuple(f.ranks) == (rank,)]
    wide = [dataclasses.replace(f, scope="cluster-wide") for f in kept if tuple(f.ranks) != (rank,)]
    return own + wide


def narrowed_scope(bd: Any, rank: int | None, step: int | None, ranks: list[int], steps: list[int],
                   matrix: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report's ``profile.narrowed_to`` (None: not narrowed): the rank and step asked for, how
    many the profile holds, the step time of the scope (the verdict's step basis: the rank's step,
    the rank's median step, or the step of its slowest rank) and the scope's ranks x steps cells."""
    if rank is None and step is None:
        return None
    out: dict[str, Any] = {"rank": rank, "step": step, "ranks_total": len(ranks), "steps_total": len(steps),
                           "step_us": None, "step_basis": None, "cells": []}
    if bd is not None and not bd.empty:
        sel = bd[bd["step"] != NO_STEP]
        if rank is not None:
            sel = sel[sel["rank"] == rank]
        if step is not None:
            sel = sel[sel["step"] == step]
        times = [float(x) for x in sel["step_us"] if not math.isnan(float(x))]
        if times:
            if rank is not None and step is not None:
                out["step_us"], out["step_basis"] = times[0], f"rank {rank}'s step {step}"
            elif rank is not None:
                out["step_us"], out["step_basis"] = float(sel["step_us"].median()), f"rank {rank}'s median step"
            else:
                out["step_us"], out["step_basis"] = max(times), f"the slowest rank's step {step}"
            out["step_us"] = round(out["step_us"], 3)
    m = matrix or {}
    cells = []
    for row in m.get("rows") or []:
        if row.get("label", "").startswith("rank ") and str(row.get("ranks")).isdigit():
            r = int(row["ranks"])
            if rank is not None and r != rank:
                continue
            for st, v in zip(m.get("steps") or [], row.get("cells") or [], strict=False):
                if v is not None and (step is None or st == step):
                    cells.append({"rank": r, "step": int(st), "slowdown": float(v)})
    out["cells"] = sorted(cells, key=lambda c: -c["slowdown"])[:MAX_SCOPE_CELLS]
    return out


#: ranks x steps cells of a narrowed scope the report names at most (the slowest)
MAX_SCOPE_CELLS = 5


# causes whose findings are about exposed communication time, part of which waits on the other members
_PEER_CAUSES = ("comm.slow_synchronization", "comm.collective_idle", "parallel.poor_overlap")


def _missing_ranks(ctx: AnalysisContext, findings: list[Any]) -> list[Any]:
    """Warn when the exported world size is larger than the ranks the profile holds, and say in the
    communication findings that their waits may be on peers the profile does not hold."""
    import dataclasses

    try:
        world = ctx.query("SELECT max(world_size) AS w FROM ranks")[0]["w"]
    except Exception:  # noqa: BLE001 -- a context without a ranks table (unit tests)
        return findings
    present = sorted(ctx.ranks)
    if not world or not present or int(world) <= len(present):
        return findings
    world = int(world)
    missing = world - len(present)
    ctx.warnings.append(Warning_(
        "missing_ranks",
        f"{missing} of {world} ranks missing (world size {world}, ranks present: {spans(present)}): slow-rank, "
        "wait and link analyses compare only the ranks present, and communication may wait on the others"))
    note = (f"The profile holds {len(present)} of {world} ranks: this communication time may be spent waiting "
            f"for peers not in the profile ({missing} ranks), whose own findings cannot be seen here.")
    out = []
    for f in findings:
        if f.cause.startswith(_PEER_CAUSES):
            f = dataclasses.replace(f, detail=(f.detail + " " + note).strip(),
                                    evidence={**f.evidence, "ranks_missing": missing, "world_size": world})
        out.append(f)
    return out


def build_report(ctx: AnalysisContext, findings: list[Any], outcomes: list[Any], t_start: float, *, rank: int | None = None, step: int | None = None,
                 full_critical_path: bool = False) -> Report:
    """Assemble the Report from a context that stages and rules have run on."""
    bd = ctx.breakdown
    rows: list[dict[str, Any]] = []
    sel = bd  # the breakdown of the focus (--rank / --step): its rows and the step times
    inferred = {(int(r["rank"]), int(r["step"])) for r in ctx.query("SELECT rank, step FROM steps WHERE inferred")}
    if bd is not None and not bd.empty:
        if rank is not None:
            sel = sel[sel["rank"] == rank]
        if step is not None:
            sel = sel[sel["step"] == step]
        for rec in sel.to_dict("records"):
            row = {k: rec.get(k) for k in BREAKDOWN_FIELDS if k in rec}
            row["rank"] = int(row["rank"])
            row["step"] = None if int(row["step"]) == NO_STEP else int(row["step"])
            for k, v in row.items():
                if k not in ("rank", "step") and v is not None:
                    row[k] = None if math.isnan(v) else round(float(v), 3)  # NaN -> None
            if (row["rank"], int(rec["step"])) in inferred:
                row["inferred"] = True
            rows.append(row)
    meta = ctx.query("SELECT rank, world_size, device_name, backend, has_device FROM ranks ORDER BY rank")
    world = next((m["world_size"] for m in meta if m["world_size"]), None)
    devices = sorted({m["device_name"] for m in meta if m["device_name"]})
    steps = [] if bd is None or bd.empty else sorted({int(s) for s in bd["step"] if int(s) != NO_STEP})
    profile = {
        "path": ctx.path,
        "sources": ctx.sources,
        "ranks": ctx.ranks,
        "world_size": world,
        "steps": steps,
        "devices": devices,
        "cpu_only": not ctx.has_device,
        "backends": sorted({m["backend"] for m in meta if m["backend"]}),
        "parse_seconds": round(float(ctx.extras.get("parse_seconds", 0.0)), 4),
        "analyze_seconds": round(time.perf_counter() - t_start, 4),
        "steps_inferred": bool(inferred),
        "focus": {"rank": ctx.focus_rank, "step": None if ctx.focus_step == NO_STEP else ctx.focus_step},
        # what --rank / --step narrowed (set below, with the ranks x steps picture)
        "narrowed_to": None,
    }
    step_stats = []
    if sel is not None and not sel.empty:
        for r, g in sel[sel["step"] != NO_STEP].groupby("rank"):
            s = g["step_us"]
            step_stats.append(
                {
                    "rank": int(r),
                    "steps": len(s),
                    "mean_us": round(float(s.mean()), 3),
                    "median_us": round(float(s.median()), 3),
                    "min_us": round(float(s.min()), 3),
                    "max_us": round(float(s.max()), 3),
                    "std_us": round(float(s.std(ddof=0)), 3),
                }
            )
    from advisor.engine.chain import median_steps, summary
    from advisor.stages.critical_path import summarise_segments

    cp = ctx.critical_path or {"rank": None, "step": None, "length_us": 0.0, "ops": []}
    if not full_critical_path and cp.get("segments"):
        cp = summarise_segments(cp)
    cp = {**cp, **trace_times(ctx, cp.get("rank"), cp.get("step"))}
    med = median_steps(bd, NO_STEP)
    savings = summary(findings, med)
    savings["combined"] = _combined(ctx, findings, savings)
    own = [f for f in findings if not f.scope]
    if rank is not None and own and len(own) < len(findings):
        # the verdict: the chosen rank's own root with the largest saving, not a cluster-wide one
        savings["verdict"] = summary(own, med)["verdict"]
    hardware = _hardware(ctx)
    variability = clean(_variability(ctx))  # before the warnings are taken: it may add one
    from advisor.stages import groups as groups_stage

    pg = groups_stage.of_context(ctx)
    ctx.warnings.extend(Warning_("group_kind_mismatch", m) for m in (pg or {}).get("mismatches", [])[:20])
    matrix = groups_stage.step_matrix(bd, pg, no_step=NO_STEP)
    profile["narrowed_to"] = narrowed_scope(bd, rank, step, list(ctx.ranks), steps, matrix)
    return Report(
        tool_version=__version__,
        profile=profile,
        breakdown=rows,
        critical_path=clean(cp),
        findings=findings,
        warnings=_dedupe(ctx.warnings),
        rules=outcomes,
        step_times=step_stats,
        savings=savings,
        comm_matrix=_links(ctx) or None,
        rule_docs=rule_docs({f.rule for f in findings}),
        hardware=hardware,
        variability=variability,
        parallel_groups=pg,
        step_matrix=matrix,
        window_phases=window_phases(ctx),
    )


def trace_times(ctx: AnalysisContext, rank: Any, step: Any) -> dict[str, Any]:
    """Where the focused rank's steps lie in the input trace's own time base (its ``ts``, µs):
    ``trace_start_us`` (the focused step window's start; segment ``start_us`` counts from it) and
    ``trace_steps`` (every step of the rank). Empty when the rank's files share no one time base
    (Kineto only records it)."""
    if rank is None:
        return {}
    try:
        bases = {r["value"] for r in ctx.query(
            "SELECT DISTINCT value FROM meta WHERE rank = $rank AND key = 'kineto.time_base_ns'", {"rank": rank})}
        if len(bases) != 1:
            return {}
        rows = [(r["step"], r["start_ns"], r["end_ns"]) for r in ctx.query(
            "SELECT step, start_ns, end_ns FROM steps WHERE rank = $rank ORDER BY step", {"rank": rank})]
    except Exception:  # noqa: BLE001 - a profile without these tables has no trace times
        return {}
    try:
        base = int(next(iter(bases)))
    except ValueError:
        return {}
    out: dict[str, Any] = {"trace_steps": [
        {"step": int(st), "start_us": (int(a) - base) / 1000.0, "end_us": (int(b) - base) / 1000.0}
        for st, a, b in rows if a is not None and b is not None and st != NO_STEP]}
    at = 0
    for i, s in enumerate(out["trace_steps"]):
        if s["step"] == step:
            out["trace_start_us"] = s["start_us"]
            at = i
    if len(out["trace_steps"]) > MAX_TRACE_STEPS:  # the steps around the focused one
        lo = max(0, min(at - MAX_TRACE_STEPS // 2, len(out["trace_steps"]) - MAX_TRACE_STEPS))
        out["trace_steps"] = out["trace_steps"][lo:lo + MAX_TRACE_STEPS]
    return out


#: steps of the focused rank the report gives trace times for at most
MAX_TRACE_STEPS = 1000


#: rows of the report's ``window_phases`` at most (the costliest first)
MAX_WINDOW_PHASES = 200


def _links(ctx: AnalysisContext) -> list[dict[str, Any]]:
    """The report's ``comm_matrix`` (:func:`advisor.stages.comm_links.links`): empty without matrix rows."""
    from advisor.stages.comm_links import links

    try:
        if not ctx.rows("comm_matrix"):
            return []
    except Exception:  # noqa: BLE001 -- no comm_matrix table (a context built from a few tables): no links
        return []
    return links(ctx.con)


def window_phases(ctx: AnalysisContext) -> list[dict[str, Any]]:
    """The report's ``window_phases``: one row per phase the window holds besides the steady state
    (:mod:`advisor.ingest.window`), the costliest first."""
    rows = ctx.query(
        f"""SELECT rank, kind, step, dur_ns, calls, names, excluded FROM window_phases
        ORDER BY dur_ns DESC NULLS LAST, rank, kind, step LIMIT {MAX_WINDOW_PHASES}""")
    return [{"rank": int(r["rank"]), "kind": str(r["kind"]),
             "step": None if r["step"] is None or int(r["step"]) == NO_STEP else int(r["step"]),
             "dur_us": round(float(r["dur_ns"] or 0) / 1000.0, 3),
             "calls": None if r["calls"] is None else int(r["calls"]),
             "names": r["names"], "excluded": bool(r["excluded"])} for r in rows]


def _hardware(ctx: AnalysisContext) -> dict[str, Any] | None:
    """The report's ``hardware`` field, when the profile has metric series (a failure is a warning)."""
    try:
        if not ctx.rows("hw_metrics"):
            return None
        from advisor.stages import hardware

        return clean(hardware.report(hardware.get(ctx), ctx.breakdown))  # type: ignore[no-any-return]
    except Exception as exc:  # noqa: BLE001 -- the rest of the report stands without it
        ctx.warnings.append(Warning_("hardware_failed", f"hardware metric summary failed: {type(exc).__name__}: {exc}"))
        return None


def _variability(ctx: AnalysisContext) -> dict[str, Any] | None:
    """The variability section; a failure there costs the section, not the report."""
    from advisor.stages import variability

    try:
        return variability.of(ctx)
    except Exception as exc:  # noqa: BLE001 -- reported as a warning, the rest of the report stands
        ctx.warnings.append(Warning_("variability_failed", f"variability analysis failed: {type(exc).__name__}: {exc}"))
        return None


def rule_docs(rule_ids: set[str]) -> dict[str, str]:
    """``advisor explain`` text of each rule, for the report (the renderers embed it; they do not
    read the rule registry); rules not installed here are left out."""
    if not rule_ids:
        return {}
    try:
        from advisor.engine.registry import discover
        from advisor.render.docs import rule_markdown

        specs = discover()
        return {rid: rule_markdown(specs[rid]) for rid in sorted(rule_ids) if rid in specs}
    except Exception:  # noqa: BLE001 -- a broken rule package must not stop the report; its rule table still shows it
        return {}


def _dedupe(warnings: list[Warning_]) -> list[Warning_]:
    seen = set()
    out = []
    for w in warnings:
        key = (w.code, w.message, w.path)
        if key not in seen:
            seen.add(key)
            out.append(w)
    return out
