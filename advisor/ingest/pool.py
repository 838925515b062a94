"""The per-rank map of the load on a local process pool.

Each rank's units (its files, claimed and given their rank in the main process) are read in a
worker process into a fresh DuckDB connection with the canonical tables, which the worker writes
as Parquet files (``<dir>/rank-<N>/<table>.parquet``, empty tables left out). The main process
appends them to its own tables in rank order (:func:`adopt`), renumbering file ids past those of
the ranks before, and goes on as after an in-process load: what compares files or ranks with
each other (dropping duplicate files, splitting runs, finalising steps) stays there.

DuckDB is not safe to fork once its threads run: workers are started with ``spawn``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.ingest.base import InputError, LoadContext, Unit, one_line
from advisor.ingest.executors import is_remote, lost_worker_errors, open_executor
from advisor.model import Warning_

#: Below this many bytes of trace files in all, starting worker processes (each imports the
#: readers and DuckDB) costs more than reading the ranks side by side saves: loaded in-process.
POOL_ABOVE_BYTES = 256 << 20

#: Whether a load without ``processes`` may use a pool (see :func:`pool_size`). Off: the main
#: process still receives every rank's rows, so the pool saves no memory, and the in-process
#: load already parses on every core. ``advisor analyze`` does not load a cluster whole: it maps
#: shards of ranks and reduces their summaries (:mod:`advisor.engine.mapreduce`).
POOL_BY_DEFAULT = False


@dataclass
class RankResult:
    """What a worker hands back besides its Parquet files."""

    rank: int
    infos: list[tuple[int, dict[str, Any] | None]]  # (index of the unit in the rank's list, its info or None)
    warnings: list[Warning_]
    stepped: set[int] = field(default_factory=set)
    clashes: list[tuple[Any, ...]] = field(default_factory=list)
    file_ids: int = 0  # file ids used: 0 .. file_ids - 1
    tables: list[str] = field(default_factory=list)  # tables written (those with rows)


def pool_size(workers: int | None, units: list[Unit]) -> int:
    """How many worker processes read the ranks: ``workers`` when given (1: none, the load runs
    in-process), else, with :data:`POOL_BY_DEFAULT`, one per core (at most one per rank) when
    there are several ranks, more than one core and at least :data:`POOL_ABOVE_BYTES` of files;
    1 otherwise."""
    ranks = len({u.rank for u in units})
    if workers is not None:
        return max(1, min(int(workers), ranks))
    cores = os.cpu_count() or 1
    if not POOL_BY_DEFAULT or ranks < 2 or cores < 2 or _total_bytes(units) < POOL_ABOVE_BYTES:
        return 1
    return min(cores, ranks)


def _total_bytes(units: list[Unit]) -> int:
    total = 0
    for u in units:
        for f in u.files:
            try:
                total += f.stat().st_size
            except OSError:
                pass
    return total


def share_of(memory_limit: str | None, n_workers: int) -> str | None:
    """Each worker's DuckDB memory limit: an ``n_workers``-th of ``memory_limit`` (a number and
    a unit, as :func:`advisor.config.parse_memory_limit` returns it), so that the workers, which
    run while the main process holds no rows yet, stay within it together."""
    if memory_limit is None:
        return None
    m = re.fullmatch(r"([0-9.]+)(.*)", memory_limit)
    if m is None:
        return memory_limit
    return f"{float(m.group(1)) / n_workers:.6g}{m.group(2)}"


def by_rank(units: list[Unit]) -> dict[int, list[Unit]]:
    """The units of each rank, ranks ascending, units in claim order."""
    out: dict[int, list[Unit]] = {}
    for u in sorted(units, key=lambda u: u.rank):
        out.setdefault(u.rank, []).append(u)
    return out


def _portable(unit: Unit) -> Unit:
    """The unit as a worker gets it: its reader's notes that only make sense in this process
    (background copies of the event lists) are left out."""
    info = {k: v for k, v in unit.info.items() if not isinstance(v, Future)}
    return Unit(unit.source, list(unit.files), unit.root, unit.rank_hint, unit.rank_source, unit.world_size,
                unit.backend, unit.run_key, info, unit.rank)


def load_rank(rank: int, units: list[Unit], out_dir: str, memory_limit: str | None, threads: int | None,
              max_events: int | None) -> RankResult:
    """Worker: read one rank's units and write its canonical tables under ``out_dir``."""
    from advisor.ingest import _adopt_events_parts, connect, read_units
    from advisor.schema import TABLES, create_all

    warnings: list[Warning_] = []
    con = connect(memory_limit=memory_limit, threads=threads)
    create_all(con)
    lctx = LoadContext(con, warnings, max_events=max_events)
    lctx.units_per_rank[rank] = len(units)
    infos: list[tuple[int, dict[str, Any] | None]] = []
    index = {id(u): i for i, u in enumerate(units)}
    for unit, info in read_units(units, lctx, workers=1):
        infos.append((index[id(unit)], info))
    _adopt_events_parts(con, lctx.events_parts)
    target = Path(out_dir) / f"rank-{rank}"
    target.mkdir(parents=True, exist_ok=True)
    written = []
    cur = con.cursor()
    for name in TABLES:
        if cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {name} LIMIT 1)").fetchall()[0][0]:
            path = str(target / f"{name}.parquet").replace("'", "''")
            cur.execute(f"COPY (SELECT * FROM {name}) TO '{path}' (FORMAT parquet)")
            written.append(name)
    cur.close()
    con.close()
    return RankResult(rank, infos, warnings, set(lctx.stepped), list(lctx.clashes), lctx._next_file_id, written)


def run_pool(units: list[Unit], n_workers: int, out_dir: str, *, memory_limit: str | None,
             max_events: int | None, progress: Callable[[int], None] | None = None,
             on_start: Callable[[], object] | None = None,
             engine: str | None = None) -> Iterator[tuple[list[Unit], RankResult]]:
    """Read the ranks of ``units`` in ``n_workers`` processes (on the Dask cluster at ``engine``
    when it names one: see :mod:`advisor.ingest.executors`); yields each rank's units and
    result in rank order (once all are done); ``progress`` is called with the number of units of
    each rank as it is read. An exception in a worker is raised here."""
    groups = by_rank(units)
    cores = os.cpu_count() or 1
    remote = is_remote(engine)  # a Dask worker's DuckDB takes its machine's defaults, or the limit as given
    threads = None if remote else max(1, cores // n_workers)
    results: dict[int, RankResult] = {}
    with open_executor(engine, n_workers) as pool:
        assert pool is not None, "run_pool is for more than one worker process or a Dask engine"
        limit = memory_limit if remote else share_of(memory_limit, n_workers)
        futures = {pool.submit(load_rank, rank, [_portable(u) for u in us], out_dir, limit, threads,
                               max_events): rank for rank, us in groups.items()}
        if on_start is not None:
            on_start()
        try:
            for fut in as_completed(futures):
                rank = futures[fut]
                try:
                    results[rank] = fut.result()
                except lost_worker_errors() as exc:  # killed (out of memory) or crashed: no exception to pass on
                    raise InputError(f"{one_line(groups[rank][0].label)}: the worker process reading rank {rank} "
                                     "ended abruptly (out of memory? --workers 1 reads in-process)") from exc
                if progress is not None:
                    progress(len(groups[rank]))
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    for rank, us in groups.items():
        yield us, results[rank]


def adopt(cur: Any, out_dir: str, result: RankResult, first_file_id: int) -> None:
    """Append a worker's tables to the main process's, its file ids moved up by ``first_file_id``."""
    from advisor.schema import TABLES

    for name in result.tables:
        path = str(Path(out_dir) / f"rank-{result.rank}" / f"{name}.parquet")
        cols = TABLES[name].column_names
        select = ", ".join(f'"{c}" + {int(first_file_id)}' if c == "file_id" else f'"{c}"' for c in cols)
        names = ", ".join(f'"{c}"' for c in cols)
        cur.execute(f"INSERT INTO {name} ({names}) SELECT {select} FROM read_parquet(?)", [path])
