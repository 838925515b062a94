"""What ``advisor analyze`` was asked to do: one value, built and checked before any profile is read.

:meth:`AnalyzeOptions.build` takes the command line's parameters as click parsed them and makes
every check that needs no profile (config file, ``--set``/``--rule``/``--skip`` against the rules
installed, ``--memory-limit``, ``--budget``, ``--baseline``/``--max-regression``, the ``--out``
paths and their formats). A bad option is a :class:`~advisor.config.ConfigError` or
:class:`UsageFailure` naming it; the analysis then reads only checked values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from advisor.config import Config, check, parse_memory_limit

FORMATS = ("terminal", "json", "html", "md")

#: Report formats by file extension (``--out``).
EXTENSION_FORMATS = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json"}
#: a file name ending that names a format before its last extension does
NAME_FORMATS = {".overlay.json": "overlay"}


def format_of(path: Path) -> str | None:
    """The format a ``--out`` path's name asks for (``x.overlay.json``: the Chrome-trace overlay)."""
    name = path.name.lower()
    for end, f in NAME_FORMATS.items():
        if name.endswith(end):
            return f
    return EXTENSION_FORMATS.get(path.suffix.lower())


class UsageFailure(Exception):
    """A usage error detected after click parsing (exit 2)."""


def out_formats(outs: tuple[Path, ...], fmt: str, fmt_given: bool) -> list[tuple[Path, str]]:
    """Each ``--out`` path with the format it gets: the one its extension names, else ``--format``.

    A ``--format`` that contradicts an extension, an extension that names no format without a
    ``--format``, and one path given twice are usage errors."""
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for path in outs:
        by_ext = format_of(path)
        if by_ext is not None and fmt_given and fmt != by_ext:
            raise UsageFailure(f"--out {path}: the extension {path.suffix} means --format {by_ext}, not --format {fmt}")
        if by_ext is None and not fmt_given:
            raise UsageFailure(f"--out {path}: no format for the extension {path.suffix or '(none)'}; "
                               f"use .html, .md, .json or .overlay.json, or give --format")
        try:
            key = path.resolve()
        except (OSError, RuntimeError):
            key = path.absolute()
        if key in seen:
            raise UsageFailure(f"--out {path}: given twice")
        seen.add(key)
        out.append((path, by_ext or fmt))
    return out


def check_out_dirs(targets: list[tuple[Path, str]], profile: Path) -> None:
    """Each ``--out`` goes to an existing directory, and not inside the profile directory."""
    for out, _f in targets:
        out_dir = out.parent if str(out.parent) else Path(".")
        if not out_dir.is_dir():
            raise UsageFailure(f"--out {out}: directory {out_dir} does not exist")
        try:
            if out.resolve().is_relative_to(profile.resolve()) and profile.is_dir():
                raise UsageFailure(f"--out {out}: refusing to write inside the profile directory")
        except OSError:
            pass


def build_config(config_path: Path | None, sets: tuple[str, ...] | list[str] = (),
                 select: tuple[str, ...] | list[str] = (), skip: tuple[str, ...] | list[str] = (),
                 all_rules: bool = False, profile: Path | None = None) -> Config:
    """The rule configuration: ``advisor.toml`` (``--config``, else ./advisor.toml if present), then
    the command line's ``--set``, ``--rule``, ``--skip`` and ``--all`` on top.

    A profile is untrusted, and so is a config shipped inside it: ./advisor.toml is not picked up
    when the working directory is inside ``profile``'s directory (a warning says so), and a pick-up
    from the working directory is itself a warning naming what the file changes."""
    notes: list[tuple[str, str, str]] = []
    implicit = False
    local = Path("advisor.toml")
    if config_path is None and local.is_file():
        where = _profile_dir(profile)
        if where is not None and _inside(Path.cwd(), where):
            message = (f"not read: the working directory is inside the profile directory {where}, and a "
                       "profile's own config is never picked up (pass --config to use it)")
            notes.append(("config_in_profile", message, str(local.absolute())))
        else:
            config_path, implicit = local, True
    cfg = Config.load(config_path)
    cfg.implicit = implicit
    if implicit:
        notes.append(("config_implicit", "picked up from the working directory (pass --config to name it); it sets "
                      + cfg.changes(), cfg.file or str(local)))
    elif config_path is not None and (where := _profile_dir(profile)) is not None and _inside(config_path, where):
        notes.append(("config_in_profile", f"--config is inside the profile directory {where}: the thresholds that "
                      "came with the profile are applied; it sets " + cfg.changes(), cfg.file or str(config_path)))
    cfg.notes = notes
    for s in sets:
        cfg.add_set(s)
    cfg.select += [r.upper() for r in select]
    cfg.skip += [r.upper() for r in skip]
    cfg.all_rules = cfg.all_rules or all_rules
    return cfg


def _profile_dir(profile: Path | None) -> Path | None:
    """The directory a profile's files come from: the profile itself, or a trace file's directory."""
    if profile is None:
        return None
    try:
        return profile.resolve() if profile.is_dir() else profile.resolve().parent
    except OSError:
        return None


def _inside(path: Path, directory: Path) -> bool:
    try:
        return path.resolve().is_relative_to(directory)
    except OSError:
        return False


@dataclass(frozen=True)
class LoadOptions:
    """How a profile is read, passed explicitly from the caller to the run (:func:`advisor.analyze.analyze`).

    ``run``: which run (1-based) of a directory holding several; ``follow_symlinks``: follow links
    pointing outside the directory; ``workers``: processes running the maps (1: in-process; None:
    one per core when there are two shards or more, see :func:`advisor.pipeline.schedule.pool_workers`);
    ``engine``: where the maps run (None: this machine; ``local``; a Dask scheduler's address, see
    :mod:`advisor.pipeline.executors`); ``max_events``: refuse files with more events;
    ``memory_limit``: DuckDB's, as it takes it (:func:`check_options`); ``metrics`` /
    ``metrics_tz_offset``: monitoring exports read beside the profile once its tables exist
    (:mod:`advisor.metrics`)."""

    run: int | None = None
    follow_symlinks: bool = False
    workers: int | None = 1
    engine: str | None = None
    max_events: int | None = None
    memory_limit: str | None = None
    metrics: tuple[Path, ...] = ()
    metrics_tz_offset: str | None = None


def check_options(cfg: Config, memory_limit: str | None = None) -> str | None:
    """What can be checked before a profile is read: the rules and thresholds ``cfg`` names
    (:func:`advisor.config.check`) and the memory limit. Returns the memory limit as DuckDB takes it."""
    if cfg.select or cfg.skip or cfg.overrides:
        from advisor.engine.registry import discover

        check(cfg, discover())
    return None if memory_limit is None else parse_memory_limit(memory_limit)


@dataclass(frozen=True)
class AnalyzeOptions:
    """Everything one ``advisor analyze`` run was asked for, checked.

    ``targets``: each ``--out`` path with its format (empty: the report goes to stdout in ``fmt``).
    ``memory_limit``: as DuckDB takes it. ``budgets``: budget name -> limit (see :mod:`advisor.gate`).
    ``run`` / ``follow_symlinks`` / ``workers``: how the profile's directory is read (see
    :class:`LoadOptions`; ``workers`` None: decided from the shards).
    ``metrics`` / ``metrics_tz_offset``: monitoring exports read beside the profile (:mod:`advisor.metrics`).
    ``engine``: where the ranks are read: None (this process, or ``workers`` processes), ``local`` (a process
    pool, one worker per core unless ``workers``) or a Dask scheduler's address (see :mod:`advisor.pipeline.executors`).
    """

    profile: Path
    cfg: Config = field(default_factory=Config)
    fmt: str = "terminal"
    targets: tuple[tuple[Path, str], ...] = ()
    rank: int | None = None
    step: int | None = None
    fail_on: str | None = None
    baseline: Path | None = None
    max_regression: float = 10.0
    budgets: Mapping[str, float] = field(default_factory=dict)
    max_events: int | None = None
    memory_limit: str | None = None
    run: int | None = None
    follow_symlinks: bool = False
    workers: int | None = None
    engine: str | None = None
    verbose: bool = False
    debug: bool = False
    md_full: bool = False
    full_critical_path: bool = False
    metrics: tuple[Path, ...] = ()
    metrics_tz_offset: str | None = None

    @classmethod
    def build(cls, profile: Path, *, fmt: str = "terminal", fmt_given: bool = True, outs: tuple[Path, ...] = (),
              rank: int | None = None, step: int | None = None, sets: tuple[str, ...] = (),
              select: tuple[str, ...] = (), skip: tuple[str, ...] = (), all_rules: bool = False,
              config_path: Path | None = None, fail_on: str | None = None, baseline: Path | None = None,
              max_regression: float = 10.0, budgets: tuple[str, ...] = (), max_events: int | None = None,
              memory_limit: str | None = None, run: int | None = None, follow_symlinks: bool = False,
              workers: int | None = None, verbose: bool = False, debug: bool = False, md_full: bool = False,
              full_critical_path: bool = False, metrics: tuple[Path, ...] = (),
              metrics_tz_offset: str | None = None, engine: str | None = None) -> AnalyzeOptions:
        """Check the command line's parameters (in the order their errors are reported) and
        return them as one value; nothing of the profile is read."""
        from advisor.gate import check_args, parse_budgets

        cfg = build_config(config_path, sets, select, skip, all_rules, profile=profile)
        budget_map = parse_budgets(budgets)
        check_args(baseline, max_regression)
        targets = out_formats(outs, fmt, fmt_given)
        check_out_dirs(targets, profile)
        limit = check_options(cfg, memory_limit)
        if metrics_tz_offset is not None:
            from advisor.metrics.common import parse_tz_offset

            try:
                parse_tz_offset(metrics_tz_offset)
            except ValueError as exc:
                raise UsageFailure(f"--metrics-tz-offset: {exc}") from None
        engine = _check_engine(engine, workers)
        return cls(profile=profile, cfg=cfg, fmt=fmt, targets=tuple(targets), rank=rank, step=step, fail_on=fail_on,
                   baseline=baseline, max_regression=max_regression, budgets=budget_map, max_events=max_events,
                   memory_limit=limit, run=run, follow_symlinks=follow_symlinks, workers=workers, verbose=verbose, debug=debug,
                   md_full=md_full, full_critical_path=full_critical_path, metrics=tuple(metrics),
                   metrics_tz_offset=metrics_tz_offset, engine=engine)

    @property
    def load(self) -> LoadOptions:
        """How the profile is read (not the baseline's: that one is read with the defaults)."""
        workers = self.workers
        if workers is None and self.engine == "local":
            workers = os.cpu_count() or 1
        return LoadOptions(run=self.run, follow_symlinks=self.follow_symlinks, workers=workers, engine=self.engine,
                           max_events=self.max_events, memory_limit=self.memory_limit, metrics=self.metrics,
                           metrics_tz_offset=self.metrics_tz_offset)


def _check_engine(engine: str | None, workers: int | None) -> str | None:
    """``--engine`` checked (see :func:`advisor.pipeline.executors.check_engine`); ``--workers`` sizes
    the local pool only."""
    from advisor.pipeline.executors import EngineError, check_engine, is_remote

    try:
        checked = check_engine(engine)
    except EngineError as exc:
        raise UsageFailure(str(exc)) from None
    if is_remote(checked) and workers is not None:
        raise UsageFailure(f"--workers {workers}: sizes the local process pool; on the Dask cluster at {checked} "
                           "its workers decide how many ranks are read at once")
    return checked
