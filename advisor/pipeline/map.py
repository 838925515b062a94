"""The map: one shard's units -> a :class:`ShardResult` of values.

:func:`map_shard` (one top-level function with plain arguments: it may run in another process or on
a Dask worker) loads the shard into a fresh DuckDB, runs the stages (:mod:`advisor.stages.sequence`),
the rules of scope ``rank`` and the rank parts of the cluster rules, and returns values, never paths:
findings, outcomes, warnings, the breakdown and the *summary*, every canonical table but the four
per-event ones (:data:`BIG_TABLES`), plus the shared derived ``op_step_stats`` where it is
registered, as Arrow IPC bytes. Memory grows with the shard, not with the cluster.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.config import Config, build_thresholds
from advisor.engine.context import AnalysisContext, context_of
from advisor.engine.platform import Parts, platform_parts
from advisor.engine.runner import build_rank_part, choose, execute
from advisor.ingest import load_units, readers
from advisor.ingest.arrow import query_arrow, to_ipc
from advisor.ingest.base import InputError, Unit, one_line
from advisor.model import Warning_
from advisor.schema import OWN_TABLES_SQL, TABLES
from advisor.stages.replay import PART_KEY as REPLAY_PART_KEY
from advisor.stages.sequence import run_stages

#: The per-event tables: they stay inside a shard's map.
BIG_TABLES = ("events", "kernels", "comm_tasks", "tracks")

#: The tables the reduce holds: every canonical table but :data:`BIG_TABLES` (rank parts and
#: ``op_step_stats`` besides).
SUMMARY_TABLES = tuple(name for name in TABLES if name not in BIG_TABLES)

#: Shared derived tables the map carries into the summary when they are registered
#: (:data:`advisor.engine.derived.DERIVED`).
CARRIED_DERIVED = ("op_step_stats",)

#: rank -> the device index its device lanes name, made in the map from ``tracks``
RANK_DEVICE_TABLE = "rank_device_index"

#: the device's busy periods per rank, communication apart from the rest (merged, so a few rows a
#: gap): what tells a hardware sample's phase in the reduce (advisor.stages.hardware); made where the
#: profile has hardware series only
PHASE_TABLE = "device_phase_islands"
PHASE_SQL = f"""CREATE TABLE {PHASE_TABLE} AS
WITH e AS (SELECT rank, kind = 'comm' AS comm, start_ns AS s, start_ns + dur_ns AS e FROM events
           WHERE device AND kind IN ('kernel', 'comm', 'memcpy', 'memset') AND dur_ns > 0),
m AS (SELECT *, max(e) OVER (PARTITION BY rank, comm ORDER BY s, e
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM e),
g AS (SELECT *, sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
                  OVER (PARTITION BY rank, comm ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island FROM m)
SELECT rank, comm, min(s) AS start_ns, max(e) AS end_ns FROM g GROUP BY rank, comm, island"""


@dataclass
class ShardResult:
    """What the map of one shard hands back (plain values: it may come from another process)."""

    ranks: list[int]
    load_warnings: list[Warning_]
    stage_warnings: list[Warning_] = field(default_factory=list)
    done: dict[str, tuple[str, Any]] = field(default_factory=dict)  # rule id -> runner.Done
    breakdown: bytes = b""  # Arrow IPC
    focus: tuple[int | None, int | None] = (None, None)
    critical_path: dict[str, Any] | None = None
    cp_warnings: list[Warning_] = field(default_factory=list)
    tables: dict[str, bytes] = field(default_factory=dict)  # summary tables with rows, Arrow IPC
    counts: dict[str, int] = field(default_factory=dict)  # rows of the per-event tables
    spans: list[tuple[str, Any, Any]] = field(default_factory=list)  # ingest.file_spans
    worlds: dict[str, Any] = field(default_factory=dict)  # ingest.unit_worlds
    sources: list[str] = field(default_factory=list)
    platform: Parts = (None, [])
    file_ids: int = 0
    parse_seconds: float = 0.0
    stages_seconds: float = 0.0
    #: per rank, the rank rules' changes replayed alone and together (:func:`advisor.engine.combined.replay_combinations`)
    combined: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: the rank rules' changes replayed on every rank at once, joined by their collectives, where the shard
    #: holds every rank (:func:`advisor.engine.combined.replay_joined`)
    joined: dict[str, Any] | None = None
    #: the shard's own DuckDB holding its summary (``tables`` then empty), when the map ran in the
    #: process that reduces and was asked to keep it (:func:`map_shard` ``keep_db``); never pickled
    db: Any = None
    #: the breakdown as a pandas frame instead of ``breakdown`` bytes, beside ``db``; never pickled
    frame: Any = None


def map_shard(root: str, units: list[Unit], cfg: Config, *, rank: int | None = None, step: int | None = None,
              memory_limit: str | None = None, threads: int | None = None, max_events: int | None = None,
              debug: bool = False, phases: bool = False, keep_db: bool = False, part: float = 1.0) -> ShardResult:
    """The map: load one shard's units, run the stages beside the per-rank rules, then the cluster
    rules' rank parts, and return the shard's findings and summary (see the module docstring).

    ``rank`` / ``step``: the focus asked for (the shard's candidate for it is chosen here; the reduce
    picks among the shards'); ``phases``: hand the device's busy periods to the reduce (``--metrics``
    files are read there); ``keep_db``: the summary stays in the shard's DuckDB, handed back as
    ``db`` with every other table dropped (a map in the process that reduces it, the only shard);
    ``part``: the shard's share of the profile's bytes (its replays get that share of the budget's floor)."""
    res = _load(root, units, memory_limit=memory_limit, threads=threads, max_events=max_events)
    if isinstance(res, ShardResult):  # no file of the shard could be read
        return res
    ctx, res = res
    ctx.extras[REPLAY_PART_KEY] = part
    _stages_and_rules(ctx, res, cfg, rank=rank, step=step, debug=debug)
    _combinations(ctx, res)
    cluster_rules = _rank_parts(ctx, res, cfg)
    _summarise(ctx, res, cluster_rules, phases=phases, keep_db=keep_db)
    if keep_db:
        res.db = ctx.con
    else:
        ctx.con.close()
    return res


def _load(root: str, units: list[Unit], *, memory_limit: str | None, threads: int | None,
          max_events: int | None) -> tuple[AnalysisContext, ShardResult] | ShardResult:
    """The shard's units loaded into a fresh DuckDB: its context and the result so far (or, when
    no file of the shard could be read, the result holding the warnings that say why)."""
    t0 = time.perf_counter()
    warnings: list[Warning_] = []

    def warn(code: str, message: str, p: Path | str | None = None) -> None:
        warnings.append(Warning_(code, one_line(message, 500), None if p is None else str(p)))

    cluster: dict[str, Any] = {}
    from advisor.ingest.ascend import restrict_batches

    restrict_batches(units)  # Ascend text exports are read in batches: of this shard's ranks only
    cleanups = [r.prefetch(units) for r in readers() if hasattr(r, "prefetch")]
    try:
        profile = load_units(Path(root), units, warnings, warn, t0, progress=None, max_events=max_events,
                             workers=None, memory_limit=memory_limit, on_scan=None, cluster=cluster,
                             threads=threads)
    except InputError:
        return ShardResult(ranks=[], load_warnings=warnings)
    finally:
        for cleanup in cleanups:
            cleanup()
    ctx = context_of(profile)
    res = ShardResult(ranks=list(ctx.ranks), load_warnings=list(ctx.warnings), spans=cluster.get("spans", []),
                      worlds=cluster.get("worlds", {}), sources=list(profile.sources),
                      parse_seconds=profile.parse_seconds)
    ctx.warnings = []
    return ctx, res


def _stages_and_rules(ctx: AnalysisContext, res: ShardResult, cfg: Config, *, rank: int | None, step: int | None,
                      debug: bool) -> None:
    """The stages in a thread beside the per-rank rules (whose first queries use the cores the
    stages leave idle); their results and the rules' outcomes into ``res``."""
    def stages() -> None:
        t = time.perf_counter()
        run_stages(ctx, rank, step, warnings=res.stage_warnings, path_warnings=res.cp_warnings)
        res.stages_seconds = time.perf_counter() - t

    ctx.run_stages_beside(stages)
    _specs, chosen = choose(cfg, "rank")
    try:
        res.done = execute(ctx, cfg, chosen, debug)
    except BaseException:
        # the stages' thread may still be inside DuckDB: an exception that reaches the top of the
        # program while it is would end the interpreter under it (an abort, not the exception)
        with contextlib.suppress(BaseException):
            ctx.wait_stages()
        raise
    ctx.wait_stages()
    res.focus = (ctx.focus_rank, ctx.focus_step)
    res.critical_path = ctx.critical_path


def _combinations(ctx: AnalysisContext, res: ShardResult) -> None:
    """The rank rules' changes replayed together on each rank of the shard, where its events are (a
    failure is a warning: the report then keeps the summed total, said to be summed)."""
    from advisor.engine.combined import JOINED_KEY, of_done

    try:
        res.combined = of_done(ctx, res.done)
        res.joined = ctx.extras.get(JOINED_KEY)
    except Exception as exc:  # noqa: BLE001 -- the headline falls back to the summed total
        res.stage_warnings.append(Warning_("rule_error", f"replaying the findings' changes together failed: "
                                           f"{type(exc).__name__}: {exc}"))


def _rank_parts(ctx: AnalysisContext, res: ShardResult, cfg: Config) -> dict[str, Any]:
    """Build the rank parts of the chosen cluster rules (a failure is a warning: the cluster rule
    says it failed when it reads the tables); returns the chosen cluster rules."""
    _, cluster_rules = choose(cfg, "cluster")
    for rid, spec in cluster_rules.items():
        if spec.rank_part is not None:
            try:
                build_rank_part(spec, ctx, build_thresholds(rid, spec.thresholds, cfg.overrides.get(rid, {})))
            except Exception as exc:  # noqa: BLE001 -- said by the cluster rule in the reduce
                res.stage_warnings.append(Warning_("rule_error", f"{rid} ({spec.name}) failed on ranks "
                                                   f"{ctx.ranks[0]}-{ctx.ranks[-1]}: {type(exc).__name__}: {exc}"))
    return cluster_rules


def _summarise(ctx: AnalysisContext, res: ShardResult, cluster_rules: dict[str, Any], *, phases: bool,
               keep_db: bool = False) -> None:
    """The shard's summary into ``res``: the breakdown and the summary tables as Arrow IPC bytes
    (``keep_db``: left in the shard's DuckDB, every other table dropped, see :func:`keep_summary`),
    the per-event tables' row counts, the file ids used and the platform's parts."""
    from advisor.engine.derived import DERIVED

    # the row counts not known yet and the file ids used, in one statement
    uncounted = [name for name in ("hw_metrics", *BIG_TABLES) if name not in ctx._counts]
    cur = ctx.con.cursor()
    *counts, file_ids = cur.execute(
        "SELECT " + ", ".join([*(f"(SELECT count(*) FROM {name})" for name in uncounted),
                               "(SELECT coalesce(max(file_id) + 1, 0) FROM profile_files)"])).fetchone()
    for name, n in zip(uncounted, counts, strict=True):
        ctx._counts.setdefault(name, int(n))
    res.file_ids = int(file_ids)
    # the device each rank ran on (its device lanes' process id), for --metrics files in the reduce,
    # which holds no tracks (advisor.metrics.rank_devices)
    ctx.con.execute(
        f"""CREATE TABLE {RANK_DEVICE_TABLE} AS SELECT rank, min(TRY_CAST(pid AS INTEGER)) AS device FROM tracks
           WHERE device AND TRY_CAST(pid AS INTEGER) BETWEEN 0 AND 1023 GROUP BY rank HAVING count(DISTINCT pid) = 1"""
    )
    if phases or ctx.rows("hw_metrics"):  # hardware series: the reduce tells their samples' phases
        ctx.con.execute(PHASE_SQL)
    carried = [name for name in CARRIED_DERIVED if name in DERIVED]
    ctx.ensure_derived(carried)
    import pyarrow as pa

    if keep_db:  # the reduce runs in this process: the frame itself, not its Arrow bytes
        res.frame = ctx.breakdown
    else:
        res.breakdown = to_ipc(pa.Table.from_pandas(ctx.breakdown, preserve_index=False))
    names = [*SUMMARY_TABLES, *carried, RANK_DEVICE_TABLE, PHASE_TABLE,
             *(t for s in cluster_rules.values() if s.rank_part is not None for t in s.rank_part.tables)]
    have = {r[0] for r in cur.execute(f"SELECT table_name FROM duckdb_tables() WHERE {OWN_TABLES_SQL}").fetchall()}
    present = [name for name in dict.fromkeys(names) if name in have]  # not a rank part that failed
    kept: list[str] = []
    if keep_db:
        kept = [name for name in present if name in SUMMARY_TABLES]
        kept += _with_rows(cur, [name for name in present if name not in SUMMARY_TABLES])
    else:
        for name in present:
            table = query_arrow(cur, f"SELECT * FROM {name}")
            if table.num_rows:
                res.tables[name] = to_ipc(table)
    for name in BIG_TABLES:
        res.counts[name] = ctx.rows(name)
    res.counts["_vendor_kernels"] = ctx.vendor_kernels
    res.platform = platform_parts(ctx)
    if keep_db:
        keep_summary(cur, kept)
    cur.close()


def _with_rows(cur: Any, names: list[str]) -> list[str]:
    """Those of the tables ``names`` that hold a row, in their order (one statement)."""
    if not names:
        return []
    sql = " UNION ALL ".join(f"SELECT {i} AS i FROM (SELECT 1 FROM {name} LIMIT 1)" for i, name in enumerate(names))
    full = {int(r[0]) for r in cur.execute(sql).fetchall()}
    return [name for i, name in enumerate(names) if i in full]


def keep_summary(cur: Any, kept: list[str]) -> None:
    """Drop from the shard's DuckDB every table but ``kept`` (the canonical summary tables and the
    other summary tables with rows): what is left is what the reduce's own DuckDB would hold once
    the shard's summary is appended to it, so that the reduce reads the same tables either way."""
    keep = set(kept)
    drops = [f'DROP TABLE "{db}"."{schema}"."{name}"' for db, schema, name, temporary in cur.execute(
             "SELECT database_name, schema_name, table_name, temporary FROM duckdb_tables() "
             f"WHERE NOT internal AND {OWN_TABLES_SQL}").fetchall()
             if temporary or name not in keep]
    if drops:  # in one transaction: one commit
        try:
            cur.execute("BEGIN TRANSACTION; " + "; ".join(drops) + "; COMMIT")
        except Exception:
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK")
            raise
