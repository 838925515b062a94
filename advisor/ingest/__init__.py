"""Load a profile (a directory or one file, one rank or a whole cluster) into canonical tables.

Each source module (``kineto``, ``ascend``) offers ``claim(files, warn) -> [Unit]`` and
``load(unit, LoadContext) -> info``. Readers are asked in order; a file claimed by one is not
offered to the next. Ranks are decided after claiming (see :func:`assign_ranks`), then units
load in parallel, each into the same canonical tables. A unit that fails is skipped with a
warning; the rest is analysed.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb

from advisor.ingest.base import (
    FAR_TIMES_SQL,
    FAR_TIMES_WARNING,
    LINK_OUTSIDE,
    InputError,
    LoadContext,
    ParseError,
    Unit,
    checkpoint,
    insert_rows,
    one_line,
    overlapping_files,
    release_memory,
    too_small_to_compress,
    walk_files,
)
from advisor.ingest.runs import Span, split_runs, strays, when
from advisor.ingest.runs import describe as describe_runs
from advisor.ingest.steps import finalize
from advisor.kinds import Source
from advisor.model import Profile, Warning_
from advisor.schema import create_all

READER_MODULES = ("advisor.ingest.ascend", "advisor.ingest.kineto")


def readers() -> list[Any]:
    """Source modules in claim order (Ascend first: its exports also contain .json files)."""
    out = []
    for name in READER_MODULES:
        try:
            out.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return out


def connect(memory_limit: str | None = None, threads: int | None = None) -> Connection:
    """An in-memory DuckDB database of its own, for one analysis, that never writes beside the
    profile (no spill files): a :class:`Connection`.

    Creating a DuckDB instance costs ~18 ms of CPU (it loads its extensions), a connection to one
    ~0.01 ms: the databases of a process share one instance per ``threads`` setting, each attached
    to it under a name of its own. With a ``memory_limit`` the database gets an instance of its
    own: the limit is one analysis's (one map's: :func:`advisor.pipeline.executors.share_of`
    shares a run's limit out among the maps that run at once), and sharing an instance would make
    the analyses running side by side in one process (a Dask worker's threads) share it too.
    Without one, every instance may take DuckDB's default (80% of the RAM): sharing one bounds
    the process's analyses together by that, not each by it."""
    _sweep()
    key = (memory_limit or None, int(threads) if threads else None)
    inst = _Instance(*key) if memory_limit else _shared_instance(key)
    name = f"{DB}_{next(_NUMBERS)}"
    raw = inst.base.cursor()
    raw.execute(f"ATTACH ':memory:' AS {name} (COMPRESS)")
    raw.execute(f"USE {name}")
    db = _Database(inst, name)
    with _INSTANCES_LOCK:
        _ATTACHED.append(db)
    return Connection(raw, db)


def _shared_instance(key: tuple[str | None, int | None]) -> _Instance:
    """This process's instance of these settings (made on first use)."""
    with _INSTANCES_LOCK:
        inst = _INSTANCES.get(key)
        if inst is None:
            inst = _INSTANCES[key] = _Instance(*key, shared=True)
        return inst


class _Instance:
    """A DuckDB instance with the settings of :func:`connect`. A ``shared`` one keeps an empty
    copy of the canonical tables (database ``advisor_tables``): copying its schema into a new
    database takes ~1 ms, creating the tables statement by statement ~10 ms."""

    def __init__(self, memory_limit: str | None, threads: int | None, *, shared: bool = False) -> None:
        self.base = _instance(memory_limit, threads)
        self.shared = shared
        self._template: str | None = None
        self._lock = threading.Lock()

    def template(self) -> str | None:
        """The database holding the empty canonical tables (made on first use); None for a private instance."""
        if not self.shared:
            return None
        with self._lock:
            if self._template is None:
                cur = self.base.cursor()
                try:
                    cur.execute(f"ATTACH ':memory:' AS {TEMPLATE_DB}")
                    cur.execute(f"USE {TEMPLATE_DB}")
                    create_all(cur)
                finally:
                    cur.close()
                self._template = TEMPLATE_DB
            return self._template


def _instance(memory_limit: str | None, threads: int | None) -> Any:
    """A new DuckDB instance with the settings of :func:`connect`."""
    con = duckdb.connect(":memory:", config={"temp_directory": ""})
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute("SET preserve_insertion_order = false")
    # bit-packing is the costliest method to analyse at a checkpoint and to decode in every scan
    # of the integer columns (start_ns, dur_ns, corr ...); without it they are stored plain or
    # run-length encoded (its measured effect: benchmarks/README.md)
    con.execute("SET disabled_compression_methods = 'bitpacking'")
    return con


DB = "advisor"  # the databases' names: advisor_1, advisor_2 ...
TEMPLATE_DB = "advisor_tables"  # a shared instance's empty canonical tables (never written once made)
COMPRESS_EVERY_ROWS = 4_000_000  # events appended from readers' parts between two compressions (~1 GB uncompressed)


class _Database:
    """A database attached to an instance, and who uses it: its :class:`Connection` and the DuckDB
    connections it handed out (weakly held: once all are gone, :func:`_sweep` detaches it)."""

    def __init__(self, instance: _Instance, name: str) -> None:
        self.instance = instance
        self.name = name
        self.users: weakref.WeakSet[Any] = weakref.WeakSet()
        self.closed = False


_INSTANCES: dict[tuple[str | None, int | None], _Instance] = {}  # the shared instances, by (memory limit, threads)
_INSTANCES_LOCK = threading.Lock()
_ATTACHED: list[_Database] = []  # the databases not detached yet
_NUMBERS = itertools.count(1)


def _sweep() -> None:
    """Detach the databases nobody uses any more (their connection closed, or it and every cursor
    it handed out garbage-collected). Done here, at the next :func:`connect` or ``close``, not when
    the last of them goes: that may be inside a DuckDB call of the same thread (a collection run
    while it converts rows), where a statement on the instance is best not run."""
    with _INSTANCES_LOCK:
        done = [db for db in _ATTACHED if db.closed or not db.users]
        if not done:
            return
        _ATTACHED[:] = [db for db in _ATTACHED if not (db.closed or not db.users)]
    for db in done:
        cur = db.instance.base.cursor()
        try:
            cur.execute(f"DETACH DATABASE IF EXISTS {db.name}")
        finally:
            cur.close()


def _forget_instances() -> None:
    """In a forked child: the parent's instances are not usable (their threads are not there)."""
    global _INSTANCES_LOCK
    _INSTANCES_LOCK = threading.Lock()  # another thread of the parent may have held it
    _INSTANCES.clear()
    _ATTACHED.clear()


os.register_at_fork(after_in_child=_forget_instances)


class Connection:
    """The DuckDB connection of an analysis: every cursor works in the analysis's own compressed
    in-memory database (:attr:`db`, checkpointed once the profile is loaded, the canonical tables
    then take a fraction of their loaded size). Anything else is the DuckDB connection's own.
    The database is detached (its tables freed) once the connection is closed, or once it and
    every cursor it handed out are garbage-collected (at the next :func:`connect`)."""

    def __init__(self, raw: Any, db: _Database) -> None:
        self._raw = raw
        self._db = db
        db.users.add(self)
        db.users.add(raw)

    @property
    def db(self) -> str:
        """The name of the analysis's database in its DuckDB instance."""
        return self._db.name

    def cursor(self) -> Any:
        cur = self._raw.cursor()
        cur.execute(f"USE {self._db.name}")
        self._db.users.add(cur)
        return cur

    def create_tables(self) -> None:
        """Create every canonical table (empty) in the database (:func:`advisor.schema.create_all`)."""
        template = self._db.instance.template()
        if template is None:
            create_all(self._raw)
        else:
            self._raw.execute(f"COPY FROM DATABASE {template} TO {self._db.name} (SCHEMA)")

    def compress(self) -> None:
        """Compress the loaded tables (after bulk loading; later changes stay uncompressed), unless
        they are small (:func:`advisor.ingest.base.too_small_to_compress`)."""
        if too_small_to_compress(self._raw):
            return
        checkpoint(self._raw, self._db.name)
        release_memory()

    def close(self) -> None:
        """Close the connection and detach its database (cursors it handed out no longer see it)."""
        self._raw.close()
        self._db.closed = True
        _sweep()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def assign_ranks(units: list[Unit], warn: Callable[..., None]) -> None:
    """Decide each unit's global rank.

    Order of trust: the export's own rank (``distributedInfo`` / ``profiler_info``), a rank in
    the file name, then order of appearance. Files of one process (same run key, e.g. the
    worker name that ``tensorboard_trace_handler`` puts in every cycle's file) share a rank.
    """
    by_key: dict[str, int] = {}
    used = {u.rank_hint for u in units if u.rank_hint is not None}
    for u in units:
        if u.rank_hint is not None:
            u.rank = u.rank_hint
            if u.run_key:
                by_key.setdefault(u.run_key, u.rank)
    next_rank = 0
    guessed = []
    for u in units:
        if u.rank_hint is not None:
            continue
        if u.run_key and u.run_key in by_key:
            u.rank = by_key[u.run_key]
            u.rank_source = "run_key"
            continue
        while next_rank in used:
            next_rank += 1
        u.rank = next_rank
        used.add(next_rank)
        if u.run_key:
            by_key[u.run_key] = u.rank
        guessed.append(u)
    multi = len({u.rank for u in units}) > 1 or len(guessed) > 1
    for u in guessed:
        if multi or len(units) > 1:
            warn("rank_guessed", f"no rank recorded in the trace or its name; taken as rank {u.rank} by order", u.root)


NAMED_FILES = 5  # files named in the error when every one is bad; the rest are counted
NOT_A_PROBLEM = ("rank_guessed", "rank_mismatch")  # warnings about a file that are not why it was skipped


def nothing_usable(root: Path, warnings: list[Warning_], headline: str) -> InputError:
    """The one-line error when no file of ``root`` gave a trace: a lone bad file as
    ``PATH: problem``; several by name (relative to ``root``) with their problems, the first
    :data:`NAMED_FILES` of them, the others counted."""
    problems: dict[str, str] = {}
    for w in warnings:  # a file's last word: why it was skipped (not how its rank was guessed before)
        if w.path and w.code not in NOT_A_PROBLEM and not (w.path == str(root) and root.is_dir()):
            problems[w.path] = w.message
    if not problems:
        return InputError(f"{one_line(root)}: {headline}")
    if len(problems) == 1:
        path, message = next(iter(problems.items()))
        return InputError(f"{one_line(path)}: {message}")

    def name(path: str) -> str:
        try:
            return one_line(Path(path).relative_to(root), 120) if root.is_dir() else one_line(path, 120)
        except ValueError:
            return one_line(path, 120)

    def problem(path: str, message: str) -> str:  # the path is already said
        return one_line(message.replace(f' in file "{path}"', "").replace(path, "the file"), 80)

    ordered = sorted(problems.items())
    named = [f"{name(p)} ({problem(p, m)})" for p, m in ordered[:NAMED_FILES]]
    more = len(problems) - len(named)
    listed = "; ".join(named) + (f"; and {more} more" if more else "")
    return InputError(f"{one_line(root)}: {headline}; {len(problems)} files skipped: {listed}")


def load(
    path: str | Path,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    max_events: int | None = None,
    workers: int | None = None,
    memory_limit: str | None = None,
    on_scan: Callable[[], object] | None = None,
    run: int | None = None,
    follow_symlinks: bool = False,
    _only: set[Path] | None = None,
) -> Profile:
    """Read everything recognisable under ``path`` into a fresh DuckDB connection, in this process: the
    :class:`Profile` (the analysis reads a profile shard by shard instead: :mod:`advisor.pipeline`).

    ``on_scan`` is called once, when the first bulk scan is about to start (see
    :meth:`LoadContext.scan_starting`), and at the latest before files are read one by one.
    ``run``: which run (1-based) to analyse when the directory holds several (see
    :func:`advisor.ingest.runs.split_runs`); ``follow_symlinks``: follow symbolic links that
    point outside the directory; ``workers``: threads reading units one by one.
    ``_only``: read these files of the directory only (the files of the run chosen).
    """
    t0 = time.perf_counter()
    root = Path(path)
    warnings: list[Warning_] = []

    def warn(code: str, message: str, p: Path | str | None = None) -> None:
        warnings.append(Warning_(code, one_line(message, 500), None if p is None else str(p)))

    units = claim_units(root, warnings, warn, follow_symlinks=follow_symlinks, only=_only)
    # readers may start slow file work (Kineto: copying event lists) while the database is set up
    cleanups = [r.prefetch(units) for r in readers() if hasattr(r, "prefetch")]
    try:
        ctx = load_units(root, units, warnings, warn, t0, progress=progress, max_events=max_events,
                         workers=workers, memory_limit=memory_limit, on_scan=on_scan)
    except SeveralRuns as exc:
        runs = exc.runs
    else:
        if _only is None:
            check_one_run(root, run)
        return ctx
    finally:
        for cleanup in cleanups:
            cleanup()
    only, note = pick_run(root, runs, run)
    ctx = load(root, progress=progress, max_events=max_events, workers=workers, memory_limit=memory_limit,
               on_scan=on_scan, follow_symlinks=follow_symlinks, _only=only)
    ctx.warnings.insert(0, note)
    return ctx


def check_one_run(root: Path, run: int | None) -> None:
    """``--run N`` of a profile found to hold one run: only ``--run 1`` names it."""
    if run is not None and run != 1:
        raise InputError(f"{one_line(root)}: --run {run}: the profile holds one run only")


def pick_run(root: Path, runs: list[list[Span]], run: int | None) -> tuple[set[Path], Warning_]:
    """The files of run ``run`` (1-based) of the ``runs`` a directory holds, and the warning that says
    which was analysed; without ``run`` (or with one out of range) the :class:`InputError` listing them."""
    if run is None:
        raise InputError(describe_runs(root, runs))
    if not 1 <= run <= len(runs):
        raise InputError(f"{one_line(root)}: --run {run}: the directory holds {len(runs)} runs (1 to {len(runs)})")
    picked = runs[run - 1]
    note = Warning_("run_chosen", one_line(
        f"run {run} of the {len(runs)} runs in the directory analysed (--run {run}): "
        + ", ".join(sorted({s.label for s in picked}))[:300], 500), str(root))
    return {f for s in picked for f in s.unit.files}, note


def claim_units(root: Path, warnings: list[Warning_], warn: Callable[..., None], *, follow_symlinks: bool = False,
                only: set[Path] | None = None) -> list[Unit]:
    """The units of ``root`` (only the files in ``only``, when given), claimed by the readers
    from the files' heads, of one source family, with their ranks decided: what the load reads.
    ``warn`` adds to ``warnings``."""
    _only = only
    if not os.path.lexists(root):
        raise InputError(f"{one_line(root)}: no such file or directory")
    if root.is_dir():
        files = [f for f in walk_files(root, warn, follow_links=follow_symlinks) if _only is None or f in _only]
    elif root.is_file():
        files = [root]
    else:
        raise InputError(f"{one_line(root)}: not a regular file or directory")
    links = sum(1 for w in warnings if w.code == LINK_OUTSIDE)
    if not files:
        said = (f": {links} symbolic link{'s' * (links != 1)} pointing outside it skipped (not followed by default: "
                "--follow-symlinks follows them)") if links else ""
        raise InputError(f"{one_line(root)}: empty directory: no trace files found" + said)
    if links:
        warn(LINK_OUTSIDE, f"{links} symbolic link{'s' * (links != 1)} pointing outside the directory skipped (not "
             "followed by default: --follow-symlinks follows them)", root)

    units: list[Unit] = []
    remaining = list(files)
    for reader in readers():
        claimed = reader.claim(remaining, warn)
        taken = {f for u in claimed for f in u.files}
        units.extend(claimed)
        remaining = [f for f in remaining if f not in taken]
    if not units:
        raise nothing_usable(root, warnings,
                             "no recognisable trace (Kineto *.json[.gz] or Ascend *_ascend_pt / *_ascend_ms export)")
    units = _one_source(root, units, warn)
    assign_ranks(units, warn)
    return units


class SeveralRuns(Exception):
    """Raised by the load when the traces belong to several runs (:func:`split_runs`)."""

    def __init__(self, runs: list[list[Span]]) -> None:
        super().__init__(f"{len(runs)} runs")
        self.runs = runs


SOURCE_FAMILY = {s.value: s.family for s in Source}


def _one_source(root: Path, units: list[Unit], warn: Callable[..., None]) -> list[Unit]:
    """Kineto traces and Ascend exports in one directory come from different runs, or are two
    exports of one (a torch_npu run writes its own timeline inside its export): merged, their
    ranks would be mixed up or counted twice. The kind with more rank traces is analysed,
    Ascend on a tie (its export holds more), and each trace of the other is named in a warning."""
    families: dict[str, list[Unit]] = defaultdict(list)
    for u in units:
        families[SOURCE_FAMILY.get(u.source, u.source)].append(u)
    if len(families) < 2:
        return units
    ordered = sorted(families.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    used, n_used = ordered[0][0], len(ordered[0][1])
    for family, skipped in ordered[1:]:
        for u in skipped:
            warn("source_unused", f"{family} trace not analysed: the directory also holds {used} traces ({n_used} "
                 f"rank{'s' * (n_used != 1)}), which are, and one kind is analysed at a time; analyse it on its own by "
                 "its path", u.label)
    return ordered[0][1]


def load_units(root: Path, units: list[Unit], warnings: list[Warning_], warn: Callable[..., None], t0: float, *,
               progress: Callable[[str, int, int], None] | None, max_events: int | None, workers: int | None,
               memory_limit: str | None, on_scan: Callable[[], object] | None,
               cluster: dict[str, Any] | None = None, threads: int | None = None) -> Profile:
    """The rest of :func:`load`, once the units are claimed and their ranks assigned: the units
    are read (``workers`` threads for those read one by one), then what compares files and ranks runs here.

    ``cluster``: the units are a shard of the profile's ranks (see :mod:`advisor.pipeline.map`):
    the checks that compare them with the other ranks are left to the caller, which gets in this
    dict what they need (``spans``: :func:`file_spans`; ``worlds``: :func:`unit_worlds`).
    ``threads``: DuckDB's threads from the start (a map beside other maps: its share of the cores)."""
    con = connect(memory_limit=memory_limit, threads=threads)
    con.create_tables()
    lctx = LoadContext(con, warnings, max_events=max_events, on_scan=on_scan)
    for u in units:
        lctx.units_per_rank[u.rank] = lctx.units_per_rank.get(u.rank, 0) + 1
    infos: dict[int, list[tuple[Unit, dict[str, Any] | None]]] = defaultdict(list)
    if progress:
        progress("ingest", 0, len(units))
    for done, (unit, info) in enumerate(read_units(units, lctx, workers), start=1):
        if info is not None:
            infos[unit.rank].append((unit, info))
        if progress:
            progress("ingest", done, len(units))
    lctx.done_reading()
    read = {rank: [(u, info) for u, info in items if info is not None] for rank, items in infos.items()}
    read = {rank: items for rank, items in read.items() if items}
    if not read:
        raise nothing_usable(root, warnings, "no trace could be read")

    _adopt_events_parts(con, lctx.events_parts)
    _drop_far_times(con, warn)
    # the files' spans are read once, for the duplicate files and the check of runs, when the latter is made
    spans = _file_rows(con) if cluster is not None or len(units) >= 2 else None
    kept = _drop_duplicate_files(con, warn, lctx.clashes, spans)
    if cluster is None:
        _check_runs_of_files(root, con, units, read, lctx.clashes, warn, kept)
    else:
        cluster["spans"], cluster["worlds"] = file_spans(con, lctx.clashes, kept), unit_worlds(read)
    dup_tracks, devices = _tracks_and_devices(con)
    _merge_tracks(con, dup_tracks)
    _check_late_ranks(read, warn)
    _write_ranks(con, read, devices)
    finalize(con, warn, assigned=lctx.stepped)
    if cluster is None and len(lctx.units_per_rank) > 1:  # one rank: its steps are one run
        check_runs(con, warn)
    con.compress()
    # what _write_ranks wrote: one row per rank read, the source of its first unit
    ranks = sorted(read)
    sources = sorted({items[0][0].source for items in read.values()})
    return Profile(con=con, path=str(root), sources=sources, ranks=ranks, warnings=warnings,
                   parse_seconds=time.perf_counter() - t0)


def read_units(units: list[Unit], lctx: LoadContext,
               workers: int | None = None) -> Iterator[tuple[Unit, dict[str, Any] | None]]:
    """Read ``units`` into ``lctx``'s tables; yields each unit with its ranks-table info, or
    None when it was skipped with a warning. Readers that can load many units in one scan do so
    first; what they leave goes one by one, in ``workers`` threads."""
    modules = {src: r for r in readers() for src in getattr(r, "SOURCES", (r.SOURCE,))}
    pending = list(units)
    for reader in readers():
        load_many = getattr(reader, "load_many", None)
        mine = [u for u in pending if modules.get(u.source) is reader]
        if load_many is None or len(mine) < 2:
            continue
        handled = load_many(mine, lctx)
        for i, info in handled.items():
            yield mine[i], info
        taken = {id(mine[i]) for i in handled}
        pending = [u for u in pending if id(u) not in taken]

    def run(unit: Unit) -> tuple[Unit, dict[str, Any] | None]:
        reader = modules.get(unit.source)
        if reader is None:
            lctx.warn("bad_file", f"no reader for source {unit.source!r}; skipped", unit.label)
            return unit, None
        try:
            return unit, reader.load(unit, lctx)
        except ParseError as exc:
            lctx.warn(exc.code, exc.message, exc.path)
        except (OSError, UnicodeDecodeError, ValueError, duckdb.Error) as exc:
            lctx.warn("bad_file", f"cannot read: {type(exc).__name__}: {exc}", unit.label)
        return unit, None

    lctx.scan_starting()  # if no batched scan did
    n_workers = workers or min(4, max(1, os.cpu_count() or 1), max(1, len(pending)))
    if n_workers > 1:
        with ThreadPoolExecutor(max_workers=n_workers) as pool:
            yield from pool.map(run, pending)
    else:
        for unit in pending:
            yield run(unit)


def _adopt_events_parts(con: Any, parts: list[str]) -> None:
    """Make the readers' finished tables of events rows part of ``events``. When no reader wrote
    to ``events`` itself (Kineto only), the first part becomes ``events`` without copying a row
    (a directory of small traces read in one scan: the only one), and the others are appended
    to it: copying the first one too, and compressing it again, cost ~0.1 s and ~50 MB of peak
    memory on 256 ranks x 2.4 MB read in four scans."""
    cur = con.cursor()
    if parts and not cur.execute("SELECT count(*) FROM (SELECT 1 FROM events LIMIT 1)").fetchall()[0][0]:
        cur.execute("DROP TABLE events")
        cur.execute(f"ALTER TABLE {parts[0]} RENAME TO events")
        parts = parts[1:]
    pending = 0
    for part in parts:
        pending += cur.execute(f"SELECT count(*) FROM {part}").fetchall()[0][0]
        cur.execute(f"INSERT INTO events SELECT * FROM {part}")
        cur.execute(f"DROP TABLE {part}")
        if pending >= COMPRESS_EVERY_ROWS:  # big inputs: compress as they are appended (bounded memory)
            checkpoint(cur, con.db)
            release_memory()
            pending = 0


def _drop_far_times(con: Any, warn: Callable[..., None]) -> None:
    """Drop events whose times no BIGINT sum can take (see :data:`FAR_TIMES_SQL`), per file with
    a warning; the Kineto reader drops its own before building steps, the others' go here."""
    cur = con.cursor()
    dropped: dict[str | None, int] = {}
    tables = ("events", "kernels", "comm_ops")
    rows = cur.execute(" UNION ALL ".join(
        f"""SELECT '{table}' AS t, p.path, count(*) FROM {table} e LEFT JOIN profile_files p USING (file_id)
        WHERE {FAR_TIMES_SQL} GROUP BY ALL""" for table in tables)).fetchall()
    for table in tables:  # a kernel row mirrors its event: the larger count is said
        mine = [r[1:] for r in rows if r[0] == table]
        if mine:
            cur.execute(f"DELETE FROM {table} WHERE {FAR_TIMES_SQL}")
            for path, n in mine:
                dropped[path] = max(dropped.get(path, 0), int(n))
    for path, n in sorted(dropped.items(), key=lambda kv: str(kv[0])):
        warn("bad_events", FAR_TIMES_WARNING.format(n=n), path)


def _check_runs_of_files(root: Path, con: Any, units: list[Unit], infos: dict[int, list[tuple[Unit, dict[str, Any]]]],
                         clashes: list[tuple[Any, ...]], warn: Callable[..., None],
                         rows: list[tuple[Any, ...]] | None = None) -> None:
    """Raise :class:`SeveralRuns` when the loaded rank traces belong to several runs (see
    :func:`advisor.ingest.runs.split_runs`); else name in a warning each trace that overlaps
    no other rank's trace (:func:`advisor.ingest.runs.strays`). ``clashes``: the spans of the
    files dropped for overlapping another of their rank (they are no longer in the tables);
    ``rows``: the loaded files' :func:`_file_rows`, when read already."""
    if len(units) < 2:
        return
    check_run_spans(units, file_spans(con, clashes, rows), unit_worlds(infos), warn)


def _file_rows(con: Any) -> list[tuple[Any, ...]]:
    """(file_id, rank, path, first start, last end, events) of each loaded file with events, by file id."""
    rows: list[tuple[Any, ...]] = con.cursor().execute(
        """SELECT file_id, p.rank, p.path, a, b, n FROM profile_files p
        JOIN (SELECT file_id, min(start_ns) AS a, max(start_ns + dur_ns) AS b, count(*) AS n FROM events GROUP BY file_id)
        USING (file_id) ORDER BY file_id"""
    ).fetchall()
    return rows


def file_spans(con: Any, clashes: list[tuple[Any, ...]],
               rows: list[tuple[Any, ...]] | None = None) -> list[tuple[str, int, int]]:
    """(path, first start, last end) of each loaded trace file, and of the files dropped for
    overlapping another of their rank (``clashes``). ``rows``: the files' :func:`_file_rows`,
    when read already."""
    if rows is None:
        rows = _file_rows(con)
    return [(str(r[2]), r[3], r[4]) for r in rows] + [(str(c[2]), c[3], c[4]) for c in clashes]


def unit_worlds(infos: dict[int, list[tuple[Unit, dict[str, Any]]]]) -> dict[str, Any]:
    """The world size each read unit gives (by the path of its first file)."""
    return {str(u.files[0]): u.world_size or info.get("world_size") for items in infos.values() for u, info in items}


def check_run_spans(units: list[Unit], rows: list[tuple[str, Any, Any]], worlds: dict[str, Any],
                    warn: Callable[..., None]) -> None:
    """:func:`_check_runs_of_files` on the spans of the files (:func:`file_spans`) and the world
    sizes of the units (:func:`unit_worlds`)."""
    unit_of = {str(f): u for u in units for f in u.files}
    ranges: dict[int, tuple[Unit, int, int]] = {}
    for path, a, b in rows:
        u = unit_of.get(str(path))
        if u is None or a is None or b is None:
            continue
        old = ranges.get(id(u))
        ranges[id(u)] = (u, a, b) if old is None else (u, min(old[1], a), max(old[2], b))
    spans = [Span(str(u.label), u.rank, worlds.get(str(u.files[0]), u.world_size), a, b, u)
             for u, a, b in ranges.values()]
    runs = split_runs(spans)
    if len(runs) > 1:
        raise SeveralRuns(runs)
    for s in strays(runs[0]) if runs else []:
        warn("other_run", f"rank {s.rank}'s trace, from {when(s.start)}, overlaps no other rank's trace in time: it may "
             "come from another run (its steps are merged with the rank's other traces)", s.label)


def _drop_duplicate_files(con: Any, warn: Callable[..., None], clashes: list[tuple[Any, ...]] | None = None,
                          files: list[tuple[Any, ...]] | None = None) -> list[tuple[Any, ...]] | None:
    """Drop files that overlap another file of the same rank (see :func:`overlapping_files`).
    ``files``: every loaded file's :func:`_file_rows` (read here, for the ranks of several files,
    when None); returns those kept (None when not given)."""
    if files is None:
        rows = con.cursor().execute(
            """SELECT p.file_id, p.rank, p.path, min(e.start_ns) AS a, max(e.start_ns + e.dur_ns) AS b, count(*) AS n
            FROM profile_files p JOIN events e USING (file_id)
            WHERE p.rank IN (SELECT rank FROM profile_files GROUP BY rank HAVING count(*) > 1)
            GROUP BY ALL ORDER BY p.rank, n DESC, p.file_id"""
        ).fetchall()
    else:  # a rank with one file that has events overlaps nothing
        per_rank: dict[Any, int] = defaultdict(int)
        for r in files:
            per_rank[r[1]] += 1
        rows = sorted((r for r in files if per_rank[r[1]] > 1), key=lambda r: (r[1], -r[5], r[0]))
    dropped = [d[0] for d in overlapping_files(rows, warn, clashes)]
    gone = set(dropped)
    kept = None if files is None else [r for r in files if r[0] not in gone]
    if dropped:
        cur = con.cursor()
        ids = ", ".join(map(str, dropped))
        for table in ("events", "kernels", "comm_ops", "profile_files"):
            cur.execute(f"DELETE FROM {table} WHERE file_id IN ({ids})")
    return kept


DEVICE_WORK_SQL = "device AND kind IN ('kernel','comm','memcpy','memset')"  # what makes a rank's ``has_device``


def _tracks_and_devices(con: Any) -> tuple[bool, tuple[set[Any], set[Any]]]:
    """In one statement: whether ``tracks`` lists a (rank, pid, tid) twice (see :func:`_merge_tracks`),
    and the ranks with device work in ``events`` and those in ``vendor_steps`` (see :func:`_write_ranks`)."""
    dup, dev, vendor = con.cursor().execute(
        f"""SELECT (SELECT count(*) > count(DISTINCT (rank, pid, tid)) FROM tracks),
                  (SELECT list(DISTINCT rank) FROM events WHERE {DEVICE_WORK_SQL}),
                  (SELECT list(DISTINCT rank) FROM vendor_steps)"""
    ).fetchall()[0]
    return bool(dup), (set(dev or ()), set(vendor or ()))


def _merge_tracks(con: Any, dup: bool | None = None) -> None:
    """One row per (rank, pid, tid): files of one rank loaded one by one each listed their tracks.
    ``dup``: whether some are listed twice, when known."""
    cur = con.cursor()
    if dup is None:
        dup = cur.execute("SELECT count(*) > count(DISTINCT (rank, pid, tid)) FROM tracks").fetchall()[0][0]
    if dup:
        cur.execute(
            """CREATE OR REPLACE TEMP TABLE _tracks AS
            SELECT rank, pid, tid, bool_or(device) AS device, max(process_name) AS process_name, max(thread_name) AS thread_name
            FROM tracks GROUP BY rank, pid, tid"""
        )
        cur.execute("DELETE FROM tracks")
        cur.execute("INSERT INTO tracks SELECT * FROM _tracks")
        cur.execute("DROP TABLE _tracks")


def check_runs(con: Any, warn: Callable[..., None]) -> None:
    """Ranks of one job run at the same time; ranks whose steps never overlap may come from different runs."""
    rows = con.cursor().execute("SELECT rank, min(start_ns), max(end_ns) FROM steps GROUP BY rank ORDER BY rank").fetchall()
    if len(rows) < 2:
        return
    latest_start = max(r[1] for r in rows)
    earliest_end = min(r[2] for r in rows)
    if latest_start > earliest_end:
        warn(
            "different_runs",
            "the ranks' profiled windows do not overlap in time: they may come from different runs; "
            "cross-rank comparisons (slow rank, collective wait) may be meaningless",
        )


def _check_late_ranks(infos: dict[int, list[tuple[Unit, dict[str, Any]]]], warn: Callable[..., None]) -> None:
    """A rank that the trace itself names (a reader's ``named_rank``) only where the ranks were
    already decided (Kineto: a ``distributedInfo`` after the events of a gzip file, read with
    them) is checked against the one taken from the file name or order: a difference is said,
    not silently kept."""
    for rank, items in infos.items():
        for unit, info in items:
            named = info.get("named_rank")
            if unit.rank_source in ("order", "file_name") and named is not None and named != rank:
                how = "its file name" if unit.rank_source == "file_name" else "the order of the files"
                warn("rank_mismatch", f"analysed as rank {rank} (from {how}), but the distributedInfo after its "
                     f"events names rank {named}: rank-to-rank comparisons may be mislabelled", unit.root)


def _write_ranks(con: Any, infos: dict[int, list[tuple[Unit, dict[str, Any]]]],
                 devices: tuple[set[Any], set[Any]] | None = None) -> None:
    """The ``ranks`` rows of the ranks read. ``has_device``: the rank ran device work, or an
    exporter's device step table (no timeline) names it; ``devices``: the ranks of each, when
    read already (:func:`_tracks_and_devices`)."""
    rows = []
    hosts = []  # (rank, 'host_name', the host its trace names): meta, beside the exports' other metadata
    for rank, items in sorted(infos.items()):
        units = [u for u, _ in items]
        merged: dict[str, Any] = {}
        for _, info in items:
            for k, v in info.items():
                if v is not None and k not in merged:
                    merged[k] = v
        if merged.get("host_name"):
            hosts.append((rank, "host_name", str(merged["host_name"])))
        world = next((u.world_size for u in units if u.world_size), None) or merged.get("world_size")
        backend = next((u.backend for u in units if u.backend), None) or merged.get("backend")
        rows.append(
            (
                rank,
                units[0].source,
                world,
                backend,
                merged.get("device_name"),
                merged.get("device_count"),
                None if devices is None else _has_device(rank, *devices),
                units[0].rank_source,
                ";".join(str(f) for u in units for f in u.files),
            )
        )
    insert_rows(con, "ranks", rows)
    if hosts:
        insert_rows(con, "meta", hosts)
    if devices is None:
        con.execute(
            f"""UPDATE ranks SET has_device = coalesce((SELECT bool_or({DEVICE_WORK_SQL})
                                                       FROM events e WHERE e.rank = ranks.rank), false)
               OR rank IN (SELECT rank FROM vendor_steps)"""
        )


def _has_device(rank: int, device_ranks: set[Any], vendor_ranks: set[Any]) -> bool | None:
    """SQL's ``coalesce(<rank has device work>, false) OR rank IN (<vendor_steps ranks>)``: NULL
    (None) when neither holds and a vendor rank is NULL."""
    if rank in device_ranks or rank in vendor_ranks:
        return True
    return None if None in vendor_ranks else False


__all__ = ["InputError", "ParseError", "Profile", "load"]
