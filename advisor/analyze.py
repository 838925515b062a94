"""The one orchestrator: a profile's run, top to bottom. Nothing below imports this module.

    options   checked before any I/O (:func:`advisor.options.check_options`)
    plan      claim the files, give them ranks, cut shards by input size    (:mod:`advisor.pipeline.plan`)
    map       each shard -> a ShardResult, wherever it runs                 (:mod:`advisor.pipeline.map`,
                                                                             :mod:`advisor.pipeline.schedule`)
    reduce    the summaries in one DuckDB, checks across ranks              (:func:`advisor.pipeline.reduce.gather`)
    metrics   ``--metrics`` files read over the summary tables              (:mod:`advisor.metrics`)
              focus, cluster rules, findings merged                         (:func:`advisor.pipeline.reduce.reduce`)
    report    the Report                                                     (:mod:`advisor.pipeline.report`)

The gate (:mod:`advisor.gate`) and the renderers (:mod:`advisor.render`) take the finished report;
the CLI (:mod:`advisor.cli`) sits above them all.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

from advisor.config import Config
from advisor.engine.context import AnalysisContext, load_profile
from advisor.engine.runner import run_rules
from advisor.ingest import SeveralRuns, check_one_run, claim_units, pick_run
from advisor.ingest.base import one_line
from advisor.metrics import finish_load
from advisor.model import Report, Warning_
from advisor.options import AnalyzeOptions, LoadOptions, check_options
from advisor.pipeline.plan import plan_shards
from advisor.pipeline.reduce import Reduced, gather, reduce
from advisor.pipeline.report import finish_report
from advisor.pipeline.schedule import pool_workers, run_maps
from advisor.stages.sequence import CPU_ONLY, check_focus, run_stages

#: What the stages and rules import (numpy, pandas: ~0.3 s), loaded beside the profile's first scan.
_ANALYSIS_MODULES = ("numpy", "pandas", "advisor.engine.derived", "advisor.stages.breakdown", "advisor.stages.critical_path")


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
    options: LoadOptions | None = None,
) -> Report:
    """Everything ``advisor analyze`` does before the gate and the renderers.

    ``options``: how the profile is read (default: in this process; ``max_events`` and
    ``memory_limit`` are shorthands for its fields when it is not given). ``rank`` / ``step``: the
    focus (must exist). ``keep``: the context is appended there, so that it outlives the report
    (the one-shot CLI never frees it: tearing down its in-memory database costs time before the
    report is written). ``full_critical_path``: every critical-path segment, none merged."""
    cfg = cfg or Config()
    t_start = time.perf_counter()
    opts = options or LoadOptions(max_events=max_events, memory_limit=memory_limit)
    opts = dataclasses.replace(opts, memory_limit=check_options(cfg, opts.memory_limit))  # before any I/O
    warm_imports()
    root = Path(path)
    warnings: list[Warning_] = []
    only: set[Path] | None = None  # the files of the run chosen (--run), once the profile holds several
    chosen_note: Warning_ | None = None
    while True:
        warnings = []
        warn = _warner(warnings)
        units = claim_units(root, warnings, warn, follow_symlinks=opts.follow_symlinks, only=only)
        shards = plan_shards(units)
        if progress:
            progress("ingest", 0, len(units))
        maps = run_maps(str(root), shards, cfg, workers=pool_workers(opts.workers, len(shards)), engine=opts.engine,
                        rank=rank, step=step, memory_limit=opts.memory_limit, max_events=opts.max_events, debug=debug,
                        progress=progress, phases=bool(opts.metrics))
        try:
            summary = gather(str(root), units, maps, warnings, warn, memory_limit=opts.memory_limit)
        except SeveralRuns as exc:
            if only is not None:
                raise
            only, chosen_note = pick_run(root, exc.runs, opts.run)
            continue
        finally:
            maps.close()
        break
    finish_load(summary.con, warn, opts.metrics, opts.metrics_tz_offset, str(root))
    out: Reduced = reduce(str(root), summary, cfg, warnings, rank=rank, step=step, debug=debug)
    if only is None:
        check_one_run(root, opts.run)
    if chosen_note is not None:
        out.ctx.warnings.insert(0, chosen_note)
    if keep is not None:
        keep.append(out.ctx)
    if progress:
        progress("rules", 1, 1)
    report = finish_report(out.ctx, out.findings, out.outcomes, t_start, rank=rank, step=step,
                           full_critical_path=full_critical_path)
    return with_config(report, cfg)


def with_config(report: Report, cfg: Config) -> Report:
    """The report naming its rule configuration (config file, thresholds changed), with the config's warnings first."""
    notes = [Warning_(code, message, path) for code, message, path in cfg.notes]
    return dataclasses.replace(report, config=cfg.summary(), warnings=[*notes, *report.warnings])


def run_options(opts: AnalyzeOptions, *, progress: Callable[[str, int, int], None] | None = None,
                keep: list[AnalysisContext] | None = None) -> Report:
    """:func:`analyze` with the options of one ``advisor analyze`` run (checked by :meth:`AnalyzeOptions.build`)."""
    return analyze(opts.profile, opts.cfg, rank=opts.rank, step=opts.step, progress=progress, debug=opts.debug,
                   keep=keep, full_critical_path=opts.full_critical_path, options=opts.load)


def _warner(warnings: list[Warning_]) -> Callable[..., None]:
    """``warn(code, message, path=None)`` adding one line to ``warnings``."""
    def warn(code: str, message: str, p: Path | str | None = None) -> None:
        warnings.append(Warning_(code, one_line(message, 500), None if p is None else str(p)))

    return warn


def _import_analysis_modules() -> None:
    import importlib

    for name in _ANALYSIS_MODULES:
        importlib.import_module(name)
    from advisor.engine.registry import discover

    discover()  # the rule modules (and their entry points) too


def warm_imports() -> threading.Thread:
    """Import the analysis modules and discover the rules in a background thread while the
    profile loads (DuckDB releases the GIL while it parses, so the import costs less wall time there)."""
    t = threading.Thread(target=_import_analysis_modules, name="advisor-imports", daemon=True)
    t.start()
    return t


# -- a context built in one piece (one DuckDB for the whole profile): for tests and tools ----------------


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
    """Load the whole profile in this process and run the stages (:func:`advisor.stages.sequence.run_stages`).

    ``beside_rules``: the stages run in a thread while the caller goes on to the rules (which
    wait for them only where they read a result)."""
    # the imports start with the first bulk scan: before it they would hold up, through the GIL,
    # the copy of the event lists
    ctx = load_profile(path, progress=progress, max_events=max_events, memory_limit=memory_limit,
                       on_scan=warm_imports)
    check_focus(ctx, rank, step)
    if progress:
        progress("breakdown", 0, 1)

    def stages() -> None:
        t0 = time.perf_counter()
        run_stages(ctx, rank, step, warnings=ctx.warnings, path_warnings=ctx.warnings,
                   progress=None if beside_rules else progress)
        ctx.extras["stages_seconds"] = time.perf_counter() - t0
        if not ctx.has_device:
            ctx.warnings.append(Warning_("cpu_only", CPU_ONLY))

    if beside_rules:
        ctx.run_stages_beside(stages)
    else:
        stages()
    return ctx


def analyze_context(ctx: AnalysisContext, cfg: Config | None = None, t_start: float | None = None, *,
                    rank: int | None = None, step: int | None = None, debug: bool = False,
                    full_critical_path: bool = False) -> Report:
    """Run the rules on an already built context (tests build contexts from canonical rows)."""
    cfg = cfg or Config()
    t_start = time.perf_counter() if t_start is None else t_start
    findings, outcomes = run_rules(ctx, cfg, debug=debug)
    return finish_report(ctx, findings, outcomes, t_start, rank=rank, step=step, full_critical_path=full_critical_path)


__all__ = ["analyze", "analyze_context", "build_context", "run_options", "warm_imports"]
