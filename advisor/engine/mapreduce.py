"""The analysis as a per-rank map and a cluster reduce.

The main process claims the profile's files and decides their ranks (file heads only), then
groups consecutive ranks into *shards* (:func:`plan_shards`) whose boundaries depend only on the
input sizes. The **map** (:func:`map_shard`, one top-level function with plain arguments) loads
one shard into a fresh DuckDB, finalises its steps, runs the stages (breakdown, critical path of
the shard's candidate for the focus) and the rules of scope ``rank``, and the rank parts of the
cluster rules; it returns values, never paths: findings, outcomes, warnings, the breakdown and
the *summary*, every canonical table but the four per-event ones (:data:`BIG_TABLES`), plus the
shared derived ``op_step_stats`` where it is registered, as Arrow IPC bytes. The **reduce**
(:func:`reduce_shards`) appends the summaries to a fresh DuckDB, which never holds an event, runs
the checks that compare ranks (runs, windows), picks the focus, runs the rules of scope
``cluster`` and merges every shard's findings into one account.

Shards run one after the other in the main process (each DuckDB dropped before the next), or
side by side in the main process and worker processes (spawn), or on a Dask cluster
(:func:`advisor.ingest.executors.open_executor`): the same
map on the same shards, so the three give the same report. Memory then grows with the largest
shard, not with the cluster.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.config import Config
from advisor.engine.context import AnalysisContext
from advisor.ingest.base import InputError, Unit
from advisor.model import Finding, RuleOutcome, Warning_
from advisor.schema import NO_STEP, TABLES

#: The per-event tables: they stay inside a shard's map.
BIG_TABLES = ("events", "kernels", "comm_tasks", "tracks")

#: The tables the reduce holds: every canonical table but :data:`BIG_TABLES` (rank parts and
#: ``op_step_stats`` besides).
SUMMARY_TABLES = tuple(name for name in TABLES if name not in BIG_TABLES)

#: Input bytes (uncompressed) of trace files per shard: consecutive ranks are grouped up to this
#: size (a rank larger than it is a shard of its own). Each shard pays a fixed cost (a DuckDB, ~30
#: rules' queries, the stages' set-up), which one rank of a few MB per shard would pay a thousand
#: times; a shard's memory, which the workers pay side by side, grows with this size.
SHARD_BYTES = 64 << 20

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


def _file_size(path: Path) -> int:
    """Bytes of ``path`` once read: a gzip file's uncompressed size (its trailer holds it modulo
    2**32), any other file's size."""
    size = path.stat().st_size
    if path.suffix == ".gz" and size >= 18:
        with path.open("rb") as fh:
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
        return max(size, isize)
    return size


def _size(unit: Unit) -> int:
    """Bytes of a unit's files once read (a directory's files, for an export directory)."""
    total = 0
    for f in unit.files:
        try:
            total += _file_size(f) if f.is_file() else sum(_file_size(p) for p in f.rglob("*") if p.is_file())
        except OSError:
            pass
    return total


def plan_shards(units: list[Unit], max_bytes: int = SHARD_BYTES) -> list[list[Unit]]:
    """The units grouped by rank into shards of consecutive ranks, ascending, each holding at most
    ``max_bytes`` of input files unless one rank alone is larger. Only the data decides: the same
    profile gives the same shards whatever runs them."""
    by_rank: dict[int, list[Unit]] = {}
    for u in sorted(units, key=lambda u: u.rank):
        by_rank.setdefault(u.rank, []).append(u)
    shards: list[list[Unit]] = []
    used = 0
    for _rank, us in sorted(by_rank.items()):
        size = sum(_size(u) for u in us)
        if shards and used + size <= max_bytes:
            shards[-1].extend(us)
            used += size
        else:
            shards.append(list(us))
            used = size
    return shards


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
    platform: tuple[str | None, list[tuple[str, int]]] = (None, [])
    file_ids: int = 0
    parse_seconds: float = 0.0
    stages_seconds: float = 0.0


def _ipc(table: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _arrow(cur: Any, sql: str) -> Any:
    """The rows of ``sql`` as a pyarrow Table."""
    rel = cur.sql(sql)
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


def _from_ipc(data: bytes) -> Any:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _platform_parts(ctx: AnalysisContext) -> tuple[str | None, list[tuple[str, int]]]:
    """The shard's platform (:func:`advisor.engine.rule.platform_of`) and its runtime-call counts
    by platform, from which the reduce tells the profile's."""
    from advisor.engine.rule import _RUNTIME_PLATFORM_SQL, platform_of

    platform = platform_of(ctx)
    counts: list[tuple[str, int]] = []
    if platform not in (None, "ascend", "cpu"):
        sql = _RUNTIME_PLATFORM_SQL.replace("ORDER BY n DESC LIMIT 1", "")
        counts = [(str(r["p"]), int(r["n"])) for r in ctx.query(sql)]
    return platform, counts


def _reduce_platform(parts: list[tuple[str | None, list[tuple[str, int]]]]) -> str | None:
    """:func:`advisor.engine.rule.platform_of` of the whole profile from its shards'."""
    known = [p for p, _ in parts]
    if not parts or None in known:
        return None
    if "ascend" in known:
        return "ascend"
    if all(p == "cpu" for p in known):
        return "cpu"
    totals: dict[str, int] = {}
    for _p, counts in parts:
        for name, n in counts:
            totals[name] = totals.get(name, 0) + n
    if not totals:
        return "gpu"
    return max(sorted(totals), key=lambda k: totals[k])


def map_shard(root: str, units: list[Unit], cfg: Config, *, rank: int | None = None, step: int | None = None,
              memory_limit: str | None = None, threads: int | None = None, max_events: int | None = None,
              debug: bool = False, phases: bool = False) -> ShardResult:
    """The map: load one shard's units, run the stages, the per-rank rules and the cluster rules'
    rank parts, and return the shard's findings and summary (see the module docstring)."""
    from advisor.analyze import _critical_path, choose_focus, context_of
    from advisor.config import build_thresholds
    from advisor.engine.runner import build_rank_part, choose, execute
    from advisor.ingest import _load_units, readers
    from advisor.ingest.base import one_line
    from advisor.stages import breakdown as breakdown_stage

    t0 = time.perf_counter()
    warnings: list[Warning_] = []

    def warn(code: str, message: str, p: Path | str | None = None) -> None:
        warnings.append(Warning_(code, one_line(message, 500), None if p is None else str(p)))

    cluster: dict[str, Any] = {}
    from advisor.ingest.ascend import restrict_batches

    restrict_batches(units)  # Ascend text exports are read in batches: of this shard's ranks only
    cleanups = [r.prefetch(units) for r in readers() if hasattr(r, "prefetch")]
    try:
        profile = _load_units(Path(root), units, warnings, warn, t0, progress=None, max_events=max_events,
                              workers=None, memory_limit=memory_limit, on_scan=None, cluster=cluster,
                              threads=threads)
    except InputError:  # no file of the shard could be read: its warnings say why
        return ShardResult(ranks=[], load_warnings=warnings)
    finally:
        for cleanup in cleanups:
            cleanup()
    ctx = context_of(profile)
    res = ShardResult(ranks=list(ctx.ranks), load_warnings=list(ctx.warnings), spans=cluster.get("spans", []),
                      worlds=cluster.get("worlds", {}), sources=list(profile.sources),
                      parse_seconds=profile.parse_seconds)
    ctx.warnings = []
    # the focus candidate: the one of the shard's ranks that the focus of the whole profile would
    # be if it is in this shard (choose_focus over all ranks picks, among the shards' candidates)
    focus_rank = rank if rank in ctx.ranks else None

    def stages() -> None:
        t = time.perf_counter()
        bd = breakdown_stage.compute(ctx.con)
        breakdown_stage.store(ctx.con, bd)
        ctx.breakdown = bd
        res.stage_warnings.extend(Warning_(c, m) for c, m in breakdown_stage.vendor_check(ctx.con, bd))
        if rank is not None and focus_rank is None:
            ctx.focus_rank, ctx.focus_step = None, None
            ctx.critical_path = None
        else:
            ctx.focus_rank, ctx.focus_step = choose_focus(ctx, focus_rank, step)
            ctx.critical_path = _critical_path(ctx, res.cp_warnings)
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
    _, cluster_rules = choose(cfg, "cluster")
    for rid, spec in cluster_rules.items():
        if spec.rank_part is not None:
            try:
                build_rank_part(spec, ctx, build_thresholds(rid, spec.thresholds, cfg.overrides.get(rid, {})))
            except Exception as exc:  # noqa: BLE001 -- the cluster rule says it failed when it reads the tables
                res.stage_warnings.append(Warning_("rule_error", f"{rid} ({spec.name}) failed on ranks "
                                                   f"{ctx.ranks[0]}-{ctx.ranks[-1]}: {type(exc).__name__}: {exc}"))
    from advisor.engine.derived import DERIVED

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

    res.breakdown = _ipc(pa.Table.from_pandas(ctx.breakdown, preserve_index=False))
    cur = ctx.con.cursor()
    names = [*SUMMARY_TABLES, *carried, RANK_DEVICE_TABLE, PHASE_TABLE,
             *(t for s in cluster_rules.values() if s.rank_part is not None for t in s.rank_part.tables)]
    have = {r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    for name in dict.fromkeys(names):
        if name not in have:  # a rank part that failed
            continue
        table = _arrow(cur, f"SELECT * FROM {name}")
        if table.num_rows:
            res.tables[name] = _ipc(table)
    for name in BIG_TABLES:
        res.counts[name] = ctx.rows(name)
    res.counts["_vendor_kernels"] = ctx.vendor_kernels
    res.file_ids = int(cur.execute("SELECT coalesce(max(file_id) + 1, 0) FROM profile_files").fetchone()[0])
    res.platform = _platform_parts(ctx)
    cur.close()
    ctx.con.close()
    return res


def pool_workers(workers: int | None, n_shards: int) -> int:
    """Processes running the maps: ``workers`` when given (at most one per shard), else one per
    core when there are at least two shards and two cores; 1 (in-process) otherwise."""
    if workers is not None:
        return max(1, min(int(workers), n_shards))
    cores = os.cpu_count() or 1
    if n_shards < 2 or cores < 2:
        return 1
    return min(cores, n_shards)


def run_maps(root: str, shards: list[list[Unit]], cfg: Config, *, workers: int, engine: str | None = None,
             rank: int | None, step: int | None, memory_limit: str | None, max_events: int | None,
             debug: bool, progress: Callable[[str, int, int], None] | None = None,
             phases: bool = False) -> Generator[ShardResult, None, None]:
    """The maps of ``shards``, in shard order (each result as soon as it and those before it are in);
    ``phases``: hand the device's busy periods to the reduce (``--metrics`` files are read there).

    ``workers`` processes run them on this machine: the main process and ``workers - 1`` spawned
    ones, each taking the next shard when it is free (the main process would otherwise only wait,
    and it has the map's modules imported already); on a Dask engine, the cluster's workers."""
    from advisor.ingest.executors import is_remote

    total = sum(len(s) for s in shards)
    done = 0
    if is_remote(engine):
        maps: Iterator[ShardResult] = _remote_maps(root, shards, cfg, engine, rank=rank, step=step,
                                                   memory_limit=memory_limit, max_events=max_events, debug=debug,
                                                   phases=phases)
    elif workers > 1:
        maps = _local_maps(root, shards, cfg, workers, rank=rank, step=step, memory_limit=memory_limit,
                           max_events=max_events, debug=debug, phases=phases)
    else:
        maps = (map_shard(root, shard, cfg, rank=rank, step=step, memory_limit=memory_limit, max_events=max_events,
                          debug=debug, phases=phases) for shard in shards)
    try:
        for shard, res in zip(shards, maps):
            yield res
            done += len(shard)
            if progress:
                progress("ingest", done, total)
    finally:
        close = getattr(maps, "close", None)
        if close is not None:
            close()


def _lost(shard: list[Unit], exc: BaseException) -> InputError:
    """The error of a map whose worker ended under it (killed for memory, crashed, or never started)."""
    from advisor.ingest.base import one_line
    from advisor.ingest.executors import lost_worker

    return lost_worker(f"{one_line(shard[0].label)}: the worker process reading ranks {shard[0].rank}-{shard[-1].rank}")


def _remote_maps(root: str, shards: list[list[Unit]], cfg: Config, engine: str | None, *,
                 memory_limit: str | None, **kw: Any) -> Generator[ShardResult, None, None]:
    """The maps on a Dask cluster, all submitted at once (the cluster decides how many run), in
    shard order; ``memory_limit`` is shared out among the maps the cluster runs at once."""
    from advisor.ingest.executors import InDirExecutor, lost_worker_errors, open_executor, portable, share_of

    with open_executor(engine, None) as ex:
        assert ex is not None
        kw["memory_limit"] = share_of(memory_limit, ex.slots if isinstance(ex, InDirExecutor) else 1)
        futures: list[Future[ShardResult] | None] = [
            ex.submit(map_shard, root, [portable(u) for u in shard], cfg, **kw) for shard in shards]
        try:
            for i, shard in enumerate(shards):
                fut = futures[i]
                assert fut is not None
                futures[i] = None  # the reduce keeps what it needs of a result: the bytes go with it
                try:
                    yield fut.result()
                except lost_worker_errors() as exc:  # killed (out of memory) or crashed: no exception to pass on
                    raise _lost(shard, exc) from exc
        finally:
            for f in futures:
                if f is not None:
                    f.cancel()


class _Shards:
    """The shards handed out one at a time, in order, to whoever is free, and their outcomes
    (a result, or the exception its map raised) until they are taken in order."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.next = 0
        self.stopped = False
        self.outcomes: dict[int, tuple[ShardResult | None, BaseException | None]] = {}

    def take(self, *, main: bool = False) -> int | None:
        """The next shard nobody has taken (None when none is left, or for a worker once stopped)."""
        with self.cond:
            if self.next >= self.n or (self.stopped and not main):
                return None
            self.next += 1
            return self.next - 1

    def put(self, i: int, res: ShardResult | None, exc: BaseException | None) -> None:
        with self.cond:
            self.outcomes[i] = (res, exc)
            self.cond.notify_all()

    def ready(self, i: int) -> tuple[ShardResult | None, BaseException | None] | None:
        with self.cond:
            return self.outcomes.pop(i, None)

    def wait(self, i: int) -> tuple[ShardResult | None, BaseException | None]:
        with self.cond:
            self.cond.wait_for(lambda: i in self.outcomes)
            return self.outcomes.pop(i)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True


def _local_maps(root: str, shards: list[list[Unit]], cfg: Config, workers: int, *, memory_limit: str | None,
                **kw: Any) -> Generator[ShardResult, None, None]:
    """The maps in the main process and ``workers - 1`` spawned processes side by side, in shard order.

    One thread of the main process feeds each spawned worker a shard at a time (so that no shard
    waits in a busy worker's queue while another process is free); the main process runs the next
    shard nobody has taken whenever the result it must hand on next is not in yet."""
    from advisor.ingest.executors import lost_worker_errors, open_executor, portable, share_of

    cores = os.cpu_count() or 1
    kw["threads"] = max(1, cores // workers)
    kw["memory_limit"] = share_of(memory_limit, workers)
    todo = _Shards(len(shards))
    with open_executor(None, workers - 1, pool_from=1) as ex:
        assert ex is not None

        def feed() -> None:
            while (i := todo.take()) is not None:
                try:
                    res = ex.submit(map_shard, root, [portable(u) for u in shards[i]], cfg, **kw).result()
                except BaseException as exc:  # noqa: BLE001 -- handed on in shard order
                    todo.put(i, None, exc)
                else:
                    todo.put(i, res, None)

        feeders = [threading.Thread(target=feed, name=f"advisor-map-feed-{n}", daemon=True)
                   for n in range(workers - 1)]
        for t in feeders:
            t.start()
        try:
            for i, shard in enumerate(shards):
                outcome = todo.ready(i)
                while outcome is None:
                    j = todo.take(main=True)
                    if j is None:
                        outcome = todo.wait(i)
                        break
                    try:
                        mine = map_shard(root, shards[j], cfg, **kw)
                    except Exception as exc:  # noqa: BLE001 -- raised in shard order, as in-process
                        todo.put(j, None, exc)
                    else:
                        todo.put(j, mine, None)
                    outcome = todo.ready(i)
                res, failed = outcome
                if failed is not None:
                    if isinstance(failed, lost_worker_errors()):  # killed (out of memory) or crashed
                        raise _lost(shard, failed) from failed
                    raise failed
                assert res is not None
                del outcome
                yield res
                del res
        finally:
            # no shard is queued in the pool (each feeder waits for its one): the feeders end with
            # the maps they run, then the pool's end waits for its processes to exit (a process
            # that ends with os._exit would otherwise leave them behind, unreaped)
            todo.stop()
            for t in feeders:
                t.join()


@dataclass
class Reduced:
    """The reduce's result: a context over the summaries, and the findings and outcomes of every rule."""

    ctx: AnalysisContext
    findings: list[Finding]
    outcomes: list[RuleOutcome]


def _adopt(cur: Any, name: str, data: bytes, first_file_id: int) -> None:
    """Append a shard's summary table to the reduce's (its file ids moved up by ``first_file_id``)."""
    table = _from_ipc(data)
    cur.register("_shard_rows", table)
    try:
        exists = cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0]
        if not exists:
            cur.execute(f"CREATE TABLE {name} AS SELECT * FROM _shard_rows LIMIT 0")
        cols = [c for c in table.column_names]
        select = ", ".join(f'"{c}" + {int(first_file_id)}' if c == "file_id" else f'"{c}"' for c in cols)
        names = ", ".join(f'"{c}"' for c in cols)
        cur.execute(f"INSERT INTO {name} ({names}) SELECT {select} FROM _shard_rows")
    finally:
        cur.unregister("_shard_rows")


def reduce_shards(root: str, units: list[Unit], results: Iterator[ShardResult], cfg: Config, warnings: list[Warning_], *,
                  rank: int | None, step: int | None, memory_limit: str | None, debug: bool,
                  t0: float) -> Reduced:
    """The reduce: the shards' summaries in a fresh DuckDB, the checks across ranks, the focus,
    the cluster rules, and every rule's findings merged (see the module docstring). Raises
    :class:`advisor.ingest.SeveralRuns` when the ranks' traces belong to several runs."""
    import pandas as pd

    from advisor.analyze import check_focus, choose_focus
    from advisor.engine.registry import LOAD_ERRORS
    from advisor.engine.runner import choose, collect, combine, execute, finish
    from advisor.ingest import _check_runs, check_run_spans, connect, nothing_usable
    from advisor.ingest.base import one_line
    from advisor.schema import create_all
    from advisor.stages import breakdown as breakdown_stage

    def warn(code: str, message: str, p: Path | str | None = None) -> None:
        warnings.append(Warning_(code, one_line(message, 500), None if p is None else str(p)))

    con = connect(memory_limit=memory_limit)
    create_all(con)
    cur = con.cursor()
    for name in BIG_TABLES:  # a cluster rule that reads one fails loudly (a rule error), not on no rows
        cur.execute(f"DROP TABLE {name}")
    next_id = 0
    stage_warnings: list[Warning_] = []
    dones: list[dict[str, Any]] = []
    frames: list[Any] = []
    candidates: list[ShardResult] = []
    counts: dict[str, int] = {}
    spans: list[tuple[str, Any, Any]] = []
    worlds: dict[str, Any] = {}
    sources: set[str] = set()
    platforms = []
    parse_seconds = stages_seconds = 0.0
    for res in results:
        warnings.extend(res.load_warnings)
        if not res.ranks:
            continue
        for name, data in res.tables.items():
            _adopt(cur, name, data, next_id)
        next_id += res.file_ids
        stage_warnings.extend(res.stage_warnings)
        dones.append(res.done)
        frames.append(_from_ipc(res.breakdown).to_pandas())
        if res.critical_path is not None:
            candidates.append(ShardResult(ranks=res.ranks, load_warnings=[], focus=res.focus,
                                          critical_path=res.critical_path, cp_warnings=res.cp_warnings))
        for k, v in res.counts.items():
            counts[k] = counts.get(k, 0) + v
        spans.extend(res.spans)
        worlds.update(res.worlds)
        sources.update(res.sources)
        platforms.append(res.platform)
        parse_seconds += res.parse_seconds
        stages_seconds += res.stages_seconds
    if not dones:
        raise nothing_usable(Path(root), warnings, "no trace could be read")
    if len(units) >= 2:
        check_run_spans(units, spans, worlds, warn)
    _check_runs(con, warn)
    from advisor.ingest import _OPTIONS
    from advisor.metrics import finish_load  # --metrics files beside the profile, over the carried tables

    opts = _OPTIONS.get() or {}
    finish_load(con, warn, opts.get("metrics") or (), opts.get("metrics_tz_offset"), root)
    ranks = [r[0] for r in cur.execute("SELECT DISTINCT rank FROM ranks ORDER BY rank").fetchall()]
    ctx = AnalysisContext(con=con, path=root, sources=sorted(sources), ranks=ranks, warnings=warnings)
    ctx.extras["parse_seconds"] = parse_seconds
    ctx.extras["stages_seconds"] = stages_seconds
    ctx.extras["platform"] = _reduce_platform(platforms)
    ctx._counts.update(counts)
    bd = pd.concat(frames, ignore_index=True) if frames else None
    if bd is not None:
        breakdown_stage.store(con, bd)
    ctx.breakdown = bd
    check_focus(ctx, rank, step)
    ctx.focus_rank, ctx.focus_step = choose_focus(ctx, rank, step)
    cp = next((c for c in candidates if c.focus == (ctx.focus_rank, ctx.focus_step)), None)
    empty = {"rank": ctx.focus_rank, "step": None if ctx.focus_step in (None, NO_STEP) else ctx.focus_step,
             "length_us": 0.0, "ops": []}
    ctx.critical_path = cp.critical_path if cp is not None else empty
    warnings.extend(stage_warnings)
    if cp is not None:
        warnings.extend(cp.cp_warnings)
    if not ctx.has_device:
        from advisor.analyze import CPU_ONLY

        warnings.append(Warning_("cpu_only", CPU_ONLY))
    specs, chosen = choose(cfg)
    cluster = {rid: s for rid, s in chosen.items() if s.scope == "cluster"}
    for spec in cluster.values():
        if spec.rank_part is not None:
            ctx._derived.add(f"rank_part:{spec.id}")
            for name, columns in spec.rank_part.tables.items():
                cur.execute(f"CREATE TABLE IF NOT EXISTS {name} ({columns})")
    from advisor.engine.derived import DERIVED

    for name in CARRIED_DERIVED:
        if name in DERIVED and cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?",
                                           [name]).fetchone()[0]:
            ctx._derived.add(name)
    done = combine([*dones, execute(ctx, cfg, cluster, debug)])
    for err in LOAD_ERRORS:
        warnings.append(Warning_("rule_error", f"rule not loaded: {err}"))
    findings, outcomes = collect(specs, chosen, done, warnings)
    findings = finish(findings, ctx.ranks, ctx.breakdown, warnings)
    cur.close()
    return Reduced(ctx, findings, outcomes)


def analyze_sharded(path: str | Path, cfg: Config, *, rank: int | None = None, step: int | None = None,
                    progress: Callable[[str, int, int], None] | None = None, max_events: int | None = None,
                    memory_limit: str | None = None, debug: bool = False, shard_bytes: int | None = None,
                    t0: float | None = None) -> Reduced:
    """Claim the files of ``path``, map its shards and reduce them (``--run``, ``--workers``,
    ``--follow-symlinks`` as :func:`advisor.ingest.options` set them)."""
    from advisor.ingest import _OPTIONS, SeveralRuns, claim_units
    from advisor.ingest.base import one_line
    from advisor.ingest.runs import describe as describe_runs

    t0 = time.perf_counter() if t0 is None else t0
    root = Path(path)
    opts = _OPTIONS.get() or {}
    run = opts.get("run")
    follow = bool(opts.get("follow_symlinks", False))
    only: set[Path] | None = None
    chosen_note: Warning_ | None = None
    while True:
        warnings: list[Warning_] = []

        def warn(code: str, message: str, p: Path | str | None = None, _w: list[Warning_] = warnings) -> None:
            _w.append(Warning_(code, one_line(message, 500), None if p is None else str(p)))

        units = claim_units(root, warnings, warn, follow_symlinks=follow, only=only)
        shards = plan_shards(units, SHARD_BYTES if shard_bytes is None else shard_bytes)
        # in-process unless the caller asks (the CLI asks for the default: see pool_workers): a pool
        # starts its workers with spawn, which imports the caller's __main__ again
        workers = pool_workers(opts.get("processes", 1), len(shards))
        if progress:
            progress("ingest", 0, len(units))
        maps = run_maps(str(root), shards, cfg, workers=workers, engine=opts.get("engine"), rank=rank, step=step,
                        memory_limit=memory_limit, max_events=max_events, debug=debug, progress=progress,
                        phases=bool(opts.get("metrics")))
        try:
            out = reduce_shards(str(root), units, maps, cfg, warnings, rank=rank, step=step,
                                memory_limit=memory_limit, debug=debug, t0=t0)
        except SeveralRuns as exc:
            if only is not None:
                raise
            runs = exc.runs
        else:
            if only is None and run is not None and run != 1:
                raise InputError(f"{one_line(root)}: --run {run}: the profile holds one run only")
            if chosen_note is not None:
                out.ctx.warnings.insert(0, chosen_note)
            return out
        finally:
            maps.close()
        if run is None:
            raise InputError(describe_runs(root, runs))
        if not 1 <= run <= len(runs):
            raise InputError(f"{one_line(root)}: --run {run}: the directory holds {len(runs)} runs (1 to {len(runs)})")
        picked = runs[run - 1]
        only = {f for s in picked for f in s.unit.files}
        chosen_note = Warning_("run_chosen", one_line(
            f"run {run} of the {len(runs)} runs in the directory analysed (--run {run}): "
            + ", ".join(sorted({s.label for s in picked}))[:300], 500), str(root))
