"""The main job: load a profile, run the stages and the rules, build the Report."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor import __version__
from advisor.config import Config, ConfigError, check, parse_memory_limit
from advisor.engine.context import AnalysisContext
from advisor.engine.runner import run_rules
from advisor.ingest import load
from advisor.model import Profile, Report, Warning_, clean
from advisor.options import AnalyzeOptions
from advisor.schema import NO_STEP
from advisor.text import spans

# what the stages and rules import (numpy, pandas: ~0.3 s), loaded beside the ingest
_ANALYSIS_MODULES = ("numpy", "pandas", "advisor.engine.derived", "advisor.stages.breakdown", "advisor.stages.critical_path")


def _import_analysis_modules() -> None:
    import importlib

    for name in _ANALYSIS_MODULES:
        importlib.import_module(name)
    from advisor.engine.registry import discover

    discover()  # the rule modules (and their entry points) too


def warm_imports() -> threading.Thread:
    """Import the analysis modules and discover the rules in a background thread while the
    profile loads (started by the loader with its first bulk scan: DuckDB releases the GIL while
    it parses, so the import costs less wall time there)."""
    t = threading.Thread(target=_import_analysis_modules, name="advisor-imports", daemon=True)
    t.start()
    return t

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


class FocusError(ConfigError):
    """``--rank`` / ``--step`` name a rank or step the profile does not have (a usage error)."""


def check_options(cfg: Config, memory_limit: str | None = None) -> str | None:
    """What can be checked before a profile is read: the rules and thresholds ``cfg`` names
    (:func:`advisor.config.check`) and the memory limit. Returns the memory limit as DuckDB takes it."""
    if cfg.select or cfg.skip or cfg.overrides:
        from advisor.engine.registry import discover

        check(cfg, discover())
    return None if memory_limit is None else parse_memory_limit(memory_limit)


def check_focus(ctx: AnalysisContext, rank: int | None, step: int | None) -> None:
    """``--rank`` / ``--step`` exist in the loaded profile (the step on the focused rank), else
    :class:`FocusError` listing what does."""
    where = ctx.path
    if rank is not None and rank not in ctx.ranks:
        noun = "rank" if len(ctx.ranks) == 1 else "ranks"
        raise FocusError(f"--rank {rank}: {where} has {noun} {spans(ctx.ranks)}" if ctx.ranks else
                         f"--rank {rank}: {where} has no ranks")
    if step is None:
        return
    rows = ctx.con.cursor().execute("SELECT DISTINCT rank, step FROM steps").fetchall()
    have = sorted({int(s) for r, s in rows if (rank is None or r == rank) and s != NO_STEP})
    if step in have:
        return
    what = f"--rank {rank} --step {step}" if rank is not None else f"--step {step}"
    owner = f"rank {rank} of {where}" if rank is not None else where
    if have:
        raise FocusError(f"{what}: {owner} has step{'s' if len(have) > 1 else ''} {spans(have)}")
    marked = "no step windows" if not rows else "no step markers (ProfilerStep#N): the whole trace is one window"
    raise FocusError(f"{what}: {owner} has {marked}")


def choose_focus(ctx: AnalysisContext, rank: int | None, step: int | None) -> tuple[int | None, int | None]:
    """The (rank, step) whose critical path is reported.

    Default: the rank with the longest median step (the one the others wait for), and on it
    the step whose time is the median (representative, not a warm-up or a spike). With a step
    and no rank: the rank whose time at that step is the longest.
    """
    bd = ctx.breakdown
    if bd is None or bd.empty:
        return rank, step
    if rank is None and step is not None and (bd["step"] == step).any():
        at = bd[bd["step"] == step]
        rank = int(at.loc[at["step_us"].idxmax(), "rank"])
    if rank is None:
        med = bd.groupby("rank")["step_us"].median()
        rank = int(med.idxmax())
    rows = bd[bd["rank"] == rank].sort_values("step_us")
    if rows.empty:
        return rank, step
    if step is None:
        step = int(rows.iloc[(len(rows) - 1) // 2]["step"])
    return rank, step


def context_of(profile: Profile) -> AnalysisContext:
    """The rules' context over a loaded profile (its tables, ranks and warnings so far)."""
    ctx = AnalysisContext(con=profile.con, path=profile.path, sources=profile.sources, ranks=profile.ranks,
                          warnings=profile.warnings)
    ctx.extras["parse_seconds"] = profile.parse_seconds
    return ctx


def build_context(
    path: str | Path,
    *,
    rank: int | None = None,
    step: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    max_events: int | None = None,
    memory_limit: str | None = None,
    beside_rules: bool = False,
) -> AnalysisContext:
    """Load and run the inter-operator stages (breakdown, critical path).

    ``beside_rules``: the stages run in a thread while the caller goes on to the rules (which
    wait for them only where they read a result): the rules' first queries use the cores the
    stages leave idle. The context waits for the thread wherever a stage result is read.
    """
    # the imports start with the first bulk scan: before it they would hold up, through the GIL,
    # the copy of the event lists (32 ranks x 10 MB: the scan started at 0.40 s instead of 0.16 s;
    # -0.09 s over 10 alternating runs)
    ctx = context_of(load(path, progress=progress, max_events=max_events, memory_limit=memory_limit,
                          on_scan=warm_imports))
    check_focus(ctx, rank, step)
    if progress:
        progress("breakdown", 0, 1)

    def stages() -> None:
        _run_stages(ctx, rank, step, None if beside_rules else progress)

    if beside_rules:
        ctx.run_stages_beside(stages)
    else:
        stages()
    return ctx


def _run_stages(ctx: AnalysisContext, rank: int | None, step: int | None,
                progress: Callable[[str, int, int], None] | None) -> None:
    """Breakdown, focus (rank, step) and its critical path, and the warnings they give."""
    t0 = time.perf_counter()
    from advisor.stages import breakdown as breakdown_stage

    bd = breakdown_stage.compute(ctx.con)
    breakdown_stage.store(ctx.con, bd)
    ctx.breakdown = bd
    ctx.warnings.extend(Warning_(code, msg) for code, msg in breakdown_stage.vendor_check(ctx.con, bd))
    ctx.focus_rank, ctx.focus_step = choose_focus(ctx, rank, step)
    if progress:
        progress("critical path", 0, 1)
    ctx.critical_path = _critical_path(ctx)
    ctx.extras["stages_seconds"] = time.perf_counter() - t0
    if not ctx.has_device:
        ctx.warnings.append(Warning_("cpu_only", CPU_ONLY))


CPU_ONLY = ("CPU-only trace (no device events): device idle, communication overlap and roofline analyses "
            "do not apply; the breakdown treats host operators as compute (see README)")


def _critical_path(ctx: AnalysisContext, warnings: list[Warning_] | None = None) -> dict[str, Any]:
    """The critical path of the focus (rank, step); its warning goes to ``warnings`` (default: the context's)."""
    rank, step = ctx.focus_rank, ctx.focus_step
    empty = {"rank": rank, "step": None if step in (None, NO_STEP) else step, "length_us": 0.0, "ops": []}
    if rank is None or step is None:
        return empty
    win = ctx.con.cursor().execute("SELECT start_ns, end_ns FROM steps WHERE rank = ? AND step = ?", [rank, step]).fetchone()
    if not win:
        return empty
    from advisor.stages import critical_path as cp_stage

    cp = cp_stage.compute(ctx.con, rank, step, int(win[0]), int(win[1]))
    if cp.get("note"):
        (ctx.warnings if warnings is None else warnings).append(
            Warning_("critical_path_no_links", f"critical path (rank {rank}): {cp['note']}"))
    if cp["step"] == NO_STEP:
        cp["step"] = None
    return cp


def analyze(
    path: str | Path,
    cfg: Config | None = None,
    *,
    rank: int | None = None,
    step: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    max_events: int | None = None,
    memory_limit: str | None = None,
    debug: bool = False,
    keep: list[AnalysisContext] | None = None,
    full_critical_path: bool = False,
) -> Report:
    """Everything ``advisor analyze`` does before rendering.

    ``keep``: the context is appended there, so that it outlives the report. The one-shot CLI
    passes a list it never frees (see :func:`advisor.cli.run`): tearing down the context's
    in-memory database took ~22 ms (32 ranks x 10 MB) before the report was written, for a process
    that ends without tearing anything down. By default it is freed with its last reference.

    ``full_critical_path``: every critical-path segment in the report, none merged (see
    :func:`advisor.stages.critical_path.summarise_segments`)."""
    cfg = cfg or Config()
    t_start = time.perf_counter()
    memory_limit = check_options(cfg, memory_limit)  # a bad option fails before the profile is read
    from advisor.engine.mapreduce import analyze_sharded

    warm_imports()
    out = analyze_sharded(path, cfg, rank=rank, step=step, progress=progress, max_events=max_events,
                          memory_limit=memory_limit, debug=debug, t0=t_start)
    if keep is not None:
        keep.append(out.ctx)
    if progress:
        progress("rules", 1, 1)
    return finish_report(out.ctx, out.findings, out.outcomes, t_start, rank=rank, step=step,
                         full_critical_path=full_critical_path)


def run_options(opts: AnalyzeOptions, *, progress: Callable[[str, int, int], None] | None = None,
                keep: list[AnalysisContext] | None = None) -> Report:
    """:func:`analyze` with the options of one ``advisor analyze`` run (checked by
    :meth:`AnalyzeOptions.build`); the profile's loader gets ``--run`` / ``--follow-symlinks``."""
    from advisor.ingest import options as ingest_options

    with ingest_options(**opts.ingest):  # the profile's loading only, not the baseline's
        return analyze(opts.profile, opts.cfg, rank=opts.rank, step=opts.step, progress=progress,
                       max_events=opts.max_events, memory_limit=opts.memory_limit, debug=opts.debug, keep=keep,
                       full_critical_path=opts.full_critical_path)


def analyze_context(ctx: AnalysisContext, cfg: Config | None = None, t_start: float | None = None, *,
                    rank: int | None = None, step: int | None = None, debug: bool = False,
                    full_critical_path: bool = False) -> Report:
    """Run the rules on an already built context (tests build contexts from canonical rows)."""
    cfg = cfg or Config()
    t_start = time.perf_counter() if t_start is None else t_start
    findings, outcomes = run_rules(ctx, cfg, debug=debug)
    return finish_report(ctx, findings, outcomes, t_start, rank=rank, step=step, full_critical_path=full_critical_path)


def finish_report(ctx: AnalysisContext, findings: list[Any], outcomes: list[Any], t_start: float, *,
                  rank: int | None = None, step: int | None = None, full_critical_path: bool = False) -> Report:
    """The report of the rules' findings: missing ranks said, the focus (--rank / --step) applied."""
    findings = _missing_ranks(ctx, findings)
    if rank is not None or step is not None:
        findings = [
            f
            for f in findings
            if (rank is None or not f.ranks or rank in f.ranks) and (step is None or not f.steps or step in f.steps)
        ]
    return build_report(ctx, findings, outcomes, t_start, rank=rank, step=step, full_critical_path=full_critical_path)


# causes whose findings are about exposed communication time, part of which waits on the other members
_PEER_CAUSES = ("comm.slow_synchronization", "parallel.poor_overlap")


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
    inferred = {(int(r), int(s)) for r, s in ctx.con.cursor().execute(
        "SELECT rank, step FROM steps WHERE inferred").fetchall()}
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
    from advisor.stages.comm_links import links
    from advisor.stages.critical_path import summarise_segments

    cp = ctx.critical_path or {"rank": None, "step": None, "length_us": 0.0, "ops": []}
    if not full_critical_path and cp.get("segments"):
        cp = summarise_segments(cp)
    savings = summary(findings, median_steps(bd, NO_STEP))
    hardware = _hardware(ctx)
    variability = clean(_variability(ctx))  # before the warnings are taken: it may add one
    from advisor.stages import groups as groups_stage

    pg = groups_stage.of_context(ctx)
    ctx.warnings.extend(Warning_("group_kind_mismatch", m) for m in (pg or {}).get("mismatches", [])[:20])
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
        comm_matrix=links(ctx.con) or None,
        rule_docs=rule_docs({f.rule for f in findings}),
        hardware=hardware,
        variability=variability,
        parallel_groups=pg,
        step_matrix=groups_stage.step_matrix(bd, pg, no_step=NO_STEP),
    )


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
