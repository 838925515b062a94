"""Ascend ingest as readers declared as data, and the one loop that runs them.

A reader (:class:`AscendReader`) says which files it reads (``patterns``: regular expressions
over the file name, which give those files their ``role`` in an export), which form of export it
serves (``form``: ``text``, ``db`` or ``any``), which readers must have run before it (``needs``)
and which canonical tables it fills (``yields``); ``read(ctx, files)`` loads the files of its role
from every export of a batch. :data:`READERS` lists them. :func:`read_exports` orders them by
``needs`` (list order otherwise) and runs each one that has files; a reader without a role
derives rows from what the others loaded and runs whenever an export of its form is loaded.
Adding a file kind means adding one reader to :data:`READERS`: discovery
(:func:`advisor.ingest.ascend.claim`) recognises its files by its patterns.

The text form is read in batches (:class:`BatchReader`: one set of SQL statements for the files
of many ranks, see :mod:`advisor.ingest.ascend_text`); the database form and the small metadata
files one export at a time (:class:`ExportReader`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from advisor.ingest import ascend_text
from advisor.ingest.ascend_common import (
    SOURCE_PT,
    info_meta,
    insert_groups,
    insert_meta,
    metadata_meta,
    read_small_json,
    short_error,
    warn_once,
)
from advisor.ingest.base import NAME_MAX, LoadContext, ParseError, Unit, update_rows
from advisor.ingest.steps import windows_sql
from advisor.text import spans

#: What each input feeds, for "analyses lack their inputs" warnings.
NEEDS = {
    "trace": "host-side analyses (launch, dispatch, sync, dataloader, queue) and the critical path",
    "kernels": "per-kernel analyses (core type, AI CPU, block dim, PMU/roofline, formats)",
    "comm": "communication wait / synchronization / bandwidth / packet-size analyses",
    "matrix": "link-level analyses (slow link, per-link bandwidth)",
}


# -- the contract ------------------------------------------------------------------------------------


@runtime_checkable
class AscendReader(Protocol):
    """One kind of Ascend file (or one derivation over loaded tables), declared as data."""

    @property
    def name(self) -> str:
        """Unique name; other readers' ``needs`` refer to it."""
        ...

    @property
    def role(self) -> str | None:
        """The role its files have in an export (None: reads no file, derives rows)."""
        ...

    @property
    def patterns(self) -> tuple[str, ...]:
        """Regular expressions matching its file names (whole name, case-insensitive)."""
        ...

    @property
    def form(self) -> str:
        """The export form it serves: ``text``, ``db`` or ``any``."""
        ...

    @property
    def needs(self) -> tuple[str, ...]:
        """Readers that must run before it."""
        ...

    @property
    def yields(self) -> tuple[str, ...]:
        """Canonical tables it fills."""
        ...

    @property
    def max_files(self) -> int | None:
        """How many files of its role it reads per export (None: all)."""
        ...

    @property
    def data(self) -> bool:
        """True when its files carry profile data (a folder holding only other files is not an export)."""
        ...

    def read(self, ctx: ReadContext, files: list[tuple[Export, Path]]) -> None:
        """Load ``files`` (export, path) into the canonical tables; problems become warnings."""
        ...


@dataclass
class Export:
    """One rank export being loaded: its unit and what the readers learned about it."""

    unit: Unit
    fno: int
    info: dict[str, Any] = field(default_factory=dict)
    meta_rows: list[tuple[str, str]] = field(default_factory=list)
    loaded: set[str] = field(default_factory=set)  # roles whose files loaded
    fids: dict[Path, int] = field(default_factory=dict)
    events: int = 0

    @property
    def form(self) -> str:
        return cast(str, self.unit.info.get("form", "text"))

    @property
    def roles(self) -> dict[str, list[Path]]:
        return cast(dict[str, list[Path]], self.unit.info.get("roles", {}))

    def first(self, role: str) -> Path | None:
        paths = self.roles.get(role) or []
        return paths[0] if paths else None


@dataclass
class ReadContext:
    """What a reader works with: the batch's cursor and exports, file ids and warnings."""

    cur: Any
    lctx: LoadContext
    exports: list[Export]
    #: the last problem said about each file (for the one-line error of an export that loaded nothing)
    problems: dict[str, str] = field(default_factory=dict)

    def warn(self, code: str, message: str, path: Path | str | None = None) -> None:
        """Record an input problem."""
        if path is not None:
            self.problems[str(path)] = message
        self.lctx.warn(code, message, path)

    def file_id(self, st: Export, path: Path) -> int:
        """Register ``path`` as a file of ``st``'s rank; its id."""
        return self.file_ids([(st, path)])[0]

    def file_ids(self, files: list[tuple[Export, Path]]) -> list[int]:
        """Register each ``(st, path)`` as a file of ``st``'s rank (one statement); their ids, in order."""
        if not files:
            return []
        fids = self.lctx.file_ids([(path, st.unit.rank, st.info["flavor"]) for st, path in files])
        for (st, path), fid in zip(files, fids, strict=True):
            st.fids[path] = fid
        return fids

    def of_form(self, form: str) -> list[Export]:
        """The exports a reader of ``form`` serves."""
        return [st for st in self.exports if form == "any" or st.form == form]


# -- reader kinds ------------------------------------------------------------------------------------

#: per-file switch of a batch loader: (flag name, predicate on the export)
Flag = tuple[str, Callable[[Export], bool]]


@dataclass(frozen=True)
class BatchReader:
    """Text-form files loaded for all exports of a batch at once by ``load(cur, jobs) -> {fno: stats}``.

    A batch that fails is retried file by file, so a bad file only costs its own rank that file.
    ``after(ctx, export, stats)`` records what one file's load says about its export; ``then(ctx)``
    runs once after the batch.
    """

    name: str
    role: str
    patterns: tuple[str, ...]
    yields: tuple[str, ...]
    load: Callable[[Any, list[ascend_text.Job]], dict[int, Any]]
    needs: tuple[str, ...] = ()
    flags: tuple[Flag, ...] = ()
    after: Callable[[ReadContext, Export, dict[str, Any]], None] | None = None
    then: Callable[[ReadContext], None] | None = None
    form: str = "text"
    max_files: int | None = 1
    data: bool = True
    label: str = ""  # the kind of file in messages ("cannot read <label>: ..."), default: the name

    def read(self, ctx: ReadContext, files: list[tuple[Export, Path]]) -> None:
        by_fno = {st.fno: st for st, _ in files}
        jobs = [
            ascend_text.Job(
                st.fno,
                path,
                st.unit.rank,
                fid,
                {k: pred(st) for k, pred in self.flags},
                ctx.lctx.max_events,
            )
            for (st, path), fid in zip(files, ctx.file_ids(files), strict=True)
        ]
        for fno, r in run_jobs(ctx, jobs, self.load, self.label or self.name).items():
            st = by_fno[fno]
            st.loaded.add(self.role)
            st.info[f"{self.role}_stats"] = r
            if self.after is not None:
                self.after(ctx, st, r)
        if self.then is not None:
            self.then(ctx)


@dataclass(frozen=True)
class ExportReader:
    """Files read one export at a time by ``read_export(ctx, export, paths)``."""

    name: str
    role: str
    patterns: tuple[str, ...]
    yields: tuple[str, ...]
    read_export: Callable[[ReadContext, Export, list[Path]], None]
    needs: tuple[str, ...] = ()
    form: str = "any"
    max_files: int | None = None
    data: bool = False

    def read(self, ctx: ReadContext, files: list[tuple[Export, Path]]) -> None:
        by_export: dict[int, tuple[Export, list[Path]]] = {}
        for st, path in files:
            by_export.setdefault(st.fno, (st, []))[1].append(path)
        for st, paths in by_export.values():
            self.read_export(ctx, st, paths)


@dataclass(frozen=True)
class DerivedReader:
    """No file: rows derived from what the other readers loaded, by ``derive(ctx)``."""

    name: str
    yields: tuple[str, ...]
    derive: Callable[[ReadContext], None]
    needs: tuple[str, ...] = ()
    form: str = "any"
    role: str | None = None
    patterns: tuple[str, ...] = ()
    max_files: int | None = None
    data: bool = False

    def read(self, ctx: ReadContext, files: list[tuple[Export, Path]]) -> None:
        self.derive(ctx)


# -- running loaders ---------------------------------------------------------------------------------

_DUCKDB_ERROR_MODULES = ("duckdb", "_duckdb")


def is_read_error(exc: BaseException) -> bool:
    """An error the input caused (reported as a warning), not a bug (raised)."""
    return isinstance(
        exc, (ParseError, ascend_text.BatchError, sqlite3.Error, OSError, ValueError, UnicodeDecodeError)
    ) or (type(exc).__module__.split(".")[0] in _DUCKDB_ERROR_MODULES)


def _rollback(cur: Any) -> None:
    with contextlib.suppress(Exception):
        cur.execute("ROLLBACK")


def run_jobs(ctx: ReadContext, jobs: list[ascend_text.Job], fn: Any, what: str) -> dict[int, Any]:
    """Run a batch loader in one transaction; on failure retry each job alone so one bad file costs only itself.

    Returns {fno: stats} for the files that loaded; each failure becomes a warning naming the file.
    """
    if not jobs:
        return {}
    cur = ctx.cur
    try:
        cur.execute("BEGIN TRANSACTION")
        res = fn(cur, jobs)
        cur.execute("COMMIT")
    except Exception as exc:
        _rollback(cur)
        if not is_read_error(exc):
            raise
        if len(jobs) > 1:
            out: dict[int, Any] = {}
            for j in jobs:
                out.update(run_jobs(ctx, [j], fn, what))
            return out
        if isinstance(exc, ParseError):
            ctx.warn(exc.code, exc.message, exc.path)
        else:
            ctx.warn("bad_file", f"cannot read {what}: {short_error(exc)}", jobs[0].path)
        return {}
    out = {}
    for fno, r in res.items():
        if isinstance(r, ParseError):
            ctx.warn(r.code, r.message, r.path)
        else:
            out[fno] = r
    return out


def guarded(ctx: ReadContext, st: Export, role: str, path: Path, fn: Callable[[], Any]) -> Any:
    """Run one export's loader in a transaction; on failure a warning naming the file, and None."""
    cur = ctx.cur
    try:
        cur.execute("BEGIN TRANSACTION")
        out = fn()
        cur.execute("COMMIT")
        st.loaded.add(role)
        return out
    except Exception as exc:
        _rollback(cur)
        if not is_read_error(exc):
            raise
        if isinstance(exc, ParseError):
            ctx.warn(exc.code, exc.message, exc.path)
        else:
            ctx.warn("bad_file", f"cannot read {path.name}: {short_error(exc)}", path)
    return None


# -- the readers: small metadata files (both forms) --------------------------------------------------


def _read_info(ctx: ReadContext, st: Export, paths: list[Path]) -> None:
    """profiler_info -> meta rows (the document was parsed by claim, which took the rank from it)."""
    if st.unit.info.get("info_doc") is not None:
        rows, _ = info_meta(st.unit.info["info_doc"])
        st.meta_rows.extend(rows)
    ctx.file_ids([(st, p) for p in paths])


def _read_metadata(ctx: ReadContext, st: Export, paths: list[Path]) -> None:
    """profiler_metadata -> meta rows, comm_groups (parallel_group_info), the world size."""
    if st.unit.info.get("meta_doc") is not None:
        rows, groups, minfo = metadata_meta(st.unit.info["meta_doc"])
        st.meta_rows.extend(rows)
        st.info.update(minfo)
        try:
            insert_groups(ctx.cur, st.unit.rank, groups)
        except Exception as exc:
            if not is_read_error(exc):
                raise
            ctx.warn("bad_file", f"cannot use parallel_group_info: {short_error(exc)}", st.first("metadata"))
    ctx.file_ids([(st, p) for p in paths])


def _read_device_info(ctx: ReadContext, st: Export, paths: list[Path]) -> None:
    """``PROF_*/device_N/info.json.N`` -> meta rows, the chip name."""
    for p in paths:
        rows, dinfo = _device_info(p)
        st.meta_rows.extend(rows)
        for k, v in dinfo.items():
            st.info.setdefault(k, v)
    ctx.file_ids([(st, p) for p in paths])


def _device_info(p: Path) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """AI Core count and chip name from ``PROF_*/device_N/info.json.N`` (CANN; keys [U], read tolerantly)."""
    rows: list[tuple[str, str]] = []
    info: dict[str, Any] = {}
    try:
        doc = read_small_json(p)
    except ParseError:
        return rows, info
    dev = None
    if isinstance(doc, dict):
        lst = doc.get("DeviceInfo")
        dev = lst[0] if isinstance(lst, list) and lst and isinstance(lst[0], dict) else None
        if doc.get("rank_id") is not None:
            rows.append(("device_info.rank_id", str(doc["rank_id"])))
        for k in ("platform_version", "chip_name", "hostname"):
            if isinstance(doc.get(k), str):
                rows.append((f"device_info.{k}", doc[k][:200]))
    if isinstance(dev, dict):
        for k in (
            "ai_core_num",
            "aiv_num",
            "aic_frequency",
            "aiv_frequency",
            "ai_cpu_num",
            "hwts_frequency",
            "chip_name",
        ):
            if dev.get(k) is not None:
                rows.append((f"device.{k}", str(dev[k])[:100]))
        if isinstance(dev.get("chip_name"), str):
            info["device_name"] = dev["chip_name"][:100]
    if "device_name" not in info:
        for _k, v in rows:
            if re.match(r"^Ascend\w+", v):
                info["device_name"] = v
                break
    return rows, info


# -- the readers: database form (format doc §17) -----------------------------------------------------


def _read_analysis_db(ctx: ReadContext, st: Export, paths: list[Path]) -> None:
    """analysis.db / communication_analyzer.db -> comm_ops, comm_bandwidth, comm_matrix, vendor_steps."""
    from advisor.ingest import ascend_db  # pyarrow: imported only for .db exports

    for p in paths:
        ctx.file_id(st, p)
        stats = guarded(ctx, st, "analysis_db", p, partial(ascend_db.load_analysis_db, ctx.cur, p, st.unit.rank))
        for note in (stats or {}).pop("notes", ()):
            ctx.warn("bad_db", note, p)
        st.info["analysis_db_stats"] = stats
        if stats is not None:
            st.info["data_loaded"] = True
            st.info["has_comm"] = stats.get("comm_ops", 0) > 0


def _read_profiler_db(ctx: ReadContext, st: Export, paths: list[Path]) -> None:
    """ascend_pytorch_profiler*.db / ascend_mindspore_profiler*.db / msprof_*.db -> events, kernels, ..."""
    from advisor.ingest import ascend_db

    analysis = st.info.get("analysis_db_stats")
    for p in paths:
        fid = ctx.file_id(st, p)
        stats = guarded(
            ctx,
            st,
            "db",
            p,
            partial(
                ascend_db.load_profiler_db,
                ctx.cur,
                p,
                st.unit.rank,
                fid,
                st.meta_rows,
                st.info,
                comm_ops_from_db=not (analysis and analysis.get("comm_ops")),
                max_events=ctx.lctx.max_events,
            ),
        )
        for note in (stats or {}).pop("notes", ()):
            ctx.warn("bad_db", note, p)
        if (n_long := (stats or {}).pop("long_names", 0)):
            ctx.warn("long_names", f"{n_long} strings longer than {NAME_MAX} characters were cut to their first "
                     f"{NAME_MAX} where used as names (marked '…[cut: <length> chars, #<hash>]')", p)
        if stats is not None:
            st.info["data_loaded"] = True
            st.info["events"] = stats["events"]
            ctx.cur.execute("UPDATE profile_files SET events = ? WHERE file_id = ?", [stats["events"], fid])
    st.events = st.info.get("events", 0) or 0


# -- the readers: text form (format doc §5-§13, §20) -------------------------------------------------


def _after_trace(ctx: ReadContext, st: Export, r: dict[str, Any]) -> None:
    st.events += r["events"]
    st.info["has_trace"] = True
    if r["comm_events"]:
        st.info["comm_in_trace"] = True
    if r.get("device_ids"):
        st.meta_rows.append(("device_id", ",".join(map(str, r["device_ids"]))))
    path = st.first("trace")
    if r["bad_events"]:
        ctx.warn("bad_events", f"{r['bad_events']} events without a usable ts/dur were dropped", path)
    if r["negative_events"]:
        ctx.warn("bad_events", f"{r['negative_events']} events with a negative duration were dropped", path)
    if r.get("long_names"):
        ctx.warn("long_names", f"{r['long_names']} names longer than {NAME_MAX} characters were cut to their first "
                 f"{NAME_MAX} (marked '…[cut: <length> chars, #<hash>]')", path)


def _after_kernels(ctx: ReadContext, st: Export, r: dict[str, Any]) -> None:
    st.events += r["events"]
    st.info["has_kernels"] = True
    if r["hccl_rows"]:
        st.info["comm_in_trace"] = True
    if r["bad_rows"]:
        ctx.warn("bad_rows", f"{r['bad_rows']} rows without a usable start/duration were dropped", st.first("kernels"))
    if r.get("device_ids") and not any(k == "device_id" for k, _ in st.meta_rows):
        st.meta_rows.append(("device_id", ",".join(map(str, r["device_ids"]))))
    if st.roles.get("trace") and not st.info.get("has_trace"):
        ctx.warn(
            "partial_export",
            "the timeline could not be read; device events were built from kernel_details.csv",
            st.first("kernels"),
        )


def _kernels_from_timeline(ctx: ReadContext) -> None:
    """Where the kernel table could not be read: per-kernel rows from the timeline's device tasks
    (no core type, block dim)."""
    failed = [
        st.unit.rank
        for st in ctx.of_form("text")
        if st.roles.get("kernels") and not st.info.get("has_kernels") and st.info.get("has_trace")
    ]
    if failed:
        ctx.cur.execute(
            """INSERT INTO kernels (rank, step, name, core_type, start_ns, dur_ns)
            SELECT rank, NULL, name, NULL, start_ns, dur_ns FROM events
            WHERE rank IN (SELECT unnest($ranks)) AND device AND kind = 'kernel'""",
            {"ranks": failed},
        )


def _after_comm(ctx: ReadContext, st: Export, r: dict[str, Any]) -> None:
    st.info["has_comm"] = True


def _after_matrix(ctx: ReadContext, st: Export, r: dict[str, Any]) -> None:
    if r.get("unmapped"):
        warn_once(
            ctx.lctx,
            "group_local_ranks",
            "communication_matrix.json: no profiler_metadata.json parallel_group_info for some groups; "
            "their src/dst ranks stay group-local",
            st.first("matrix"),
        )


def _file_events(ctx: ReadContext) -> None:
    """profile_files.events of the timelines and kernel tables."""
    updates = []
    for st in ctx.of_form("text"):
        for role in ("trace", "kernels"):
            path = st.first(role)
            stats = st.info.get(f"{role}_stats")
            if path is not None and stats is not None and path in st.fids:
                updates.append((stats.get("events", 0), st.fids[path]))
    if updates:
        update_rows(ctx.cur, "profile_files", "events = v.value", "file_id", updates)


def _steps_from_vendor(ctx: ReadContext) -> None:
    """Step windows from kernel ``Step Id`` / communication ``stepN`` where no ProfilerStep marker exists.

    A step's range is then the span of the device tasks numbered with it; the windows follow the
    common definition (:func:`advisor.ingest.steps.windows_sql`): consecutive steps tile, each
    ending where its last task ends.
    """
    ranks = [
        st.unit.rank for st in ctx.of_form("text") if st.loaded and not (st.info.get("trace_stats") or {}).get("steps")
    ]
    if not ranks:
        return
    spans = """(SELECT rank, step, min(start_ns) AS host_start_ns, max(start_ns + dur_ns) AS host_end_ns FROM (
                SELECT rank, step, start_ns, dur_ns FROM kernels
                WHERE rank IN (SELECT unnest($ranks)) AND step IS NOT NULL AND start_ns IS NOT NULL
                UNION ALL
                SELECT rank, step, start_ns, dur_ns FROM comm_ops
                WHERE rank IN (SELECT unnest($ranks)) AND step IS NOT NULL AND start_ns IS NOT NULL
            ) WHERE rank NOT IN (SELECT DISTINCT rank FROM steps) GROUP BY rank, step)"""
    ctx.cur.execute(f"INSERT INTO steps {windows_sql(spans, None)}", {"ranks": ranks})


#: meta key naming what a rank's step breakdown rests on where its timeline is missing:
#: ``vendor`` (the export's own step table) or ``none`` (nothing covers the step); see
#: :func:`advisor.stages.vendor_basis.apply`.
BASIS_KEY = "ascend.breakdown_basis"


def _breakdown_basis(ctx: ReadContext) -> None:
    """Where a text export's timeline is missing, say what its step breakdown rests on.

    Without ``trace_view.json`` the device activity is what ``kernel_details.csv`` lists. The
    export's own step table (``step_trace_time.csv``, computed by CANN from the full device
    timeline) is then the breakdown. Without one, the kernel table is used only when it is
    whole: each communication operator ``communication.json`` lists in a step is also an
    ``HCCL`` row of the kernel table (format doc §6.3), so an operator missing there shows
    the table to be an excerpt, and no breakdown is given for that rank. One warning per
    case names its ranks.
    """
    vendor: list[Export] = []
    none: dict[str, list[Export]] = {}
    for st in ctx.of_form("text"):
        if not st.loaded or st.info.get("has_trace"):
            continue
        rank = st.unit.rank
        if ctx.cur.execute("SELECT count(*) FROM vendor_steps WHERE rank = ?", [rank]).fetchone()[0]:
            st.meta_rows.append((BASIS_KEY, "vendor"))
            vendor.append(st)
            continue
        missing = _comm_ops_missing_from_kernels(ctx.cur, rank) if st.info.get("has_kernels") else None
        if st.info.get("has_kernels") and not missing:
            continue
        st.meta_rows.append((BASIS_KEY, "none"))
        if not st.info.get("has_kernels") or missing is None:
            why = "no readable trace_view.json, kernel_details.csv or step_trace_time.csv"
        else:
            why = (
                f"no readable trace_view.json or step_trace_time.csv, and kernel_details.csv lacks {missing[0]} of "
                f"the {missing[1]} communication operators communication.json lists (it is an excerpt)"
            )
        none.setdefault(why, []).append(st)
    if vendor:
        ctx.warn(
            "partial_export",
            f"{_ranks_of(vendor)}: no readable trace_view.json: the step breakdown is the export's own "
            "step_trace_time.csv (Computing, Communication(Not Overlapped), Overlapped, Free); "
            "host-side time is not known and counts as idle",
            _where(vendor),
        )
    for why, sts in none.items():
        ctx.warn(
            "partial_export",
            f"{_ranks_of(sts)}: {why}: nothing covers the step, so no step breakdown is given; "
            "export trace_view.json or step_trace_time.csv (torch_npu text export, profiler level 0 or above)",
            _where(sts),
        )


def _where(sts: list[Export]) -> str:
    """The folder the exports share (their own folder when there is one)."""
    return os.path.commonpath([str(st.unit.root) for st in sts])


def _ranks_of(sts: list[Export]) -> str:
    ranks = sorted({st.unit.rank for st in sts})
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {spans(ranks)}"


def _comm_ops_missing_from_kernels(cur: Any, rank: int) -> tuple[int, int] | None:
    """(operators of communication.json without their HCCL row in kernel_details.csv, operators),
    over the steps the kernel table numbers; None when there is nothing to compare.

    A row matches by name (the operator key before ``@``) or by start time within 1 µs (the two
    files write one start, to different precisions)."""
    n, total = cur.execute(
        """WITH ops AS (
               SELECT name, start_ns FROM comm_ops
               WHERE rank = $r AND step IN (SELECT DISTINCT step FROM kernels WHERE rank = $r AND step IS NOT NULL)
           ),
           hccl AS (SELECT name, start_ns FROM kernels WHERE rank = $r AND core_type = 'HCCL')
           SELECT count(*) FILTER (WHERE NOT EXISTS (
                      SELECT 1 FROM hccl h WHERE h.name = o.name OR abs(h.start_ns - o.start_ns) <= 1000)),
                  count(*)
           FROM ops o""",
        {"r": rank},
    ).fetchone()
    return (int(n), int(total)) if total and n else None


def _name(*names: str) -> tuple[str, ...]:
    """Patterns matching these exact file names."""
    return tuple(re.escape(n) for n in names)


#: Every Ascend reader. Order: the list order unless ``needs`` says otherwise.
READERS: list[AscendReader] = [
    ExportReader("profiler_info", "info", (r"profiler_info(?:_\d+)?\.json",), ("meta",), _read_info),
    ExportReader(
        "profiler_metadata", "metadata", _name("profiler_metadata.json"), ("meta", "comm_groups"), _read_metadata
    ),
    ExportReader(
        # found under PROF_*/device_N/ only (claim checks the folder)
        "device_info",
        "device_info",
        (r"info\.json\.\d+",),
        ("meta",),
        _read_device_info,
        max_files=4,
    ),
    ExportReader(
        "analysis_db",
        "analysis_db",
        _name("analysis.db", "communication_analyzer.db"),
        ("comm_ops", "comm_bandwidth", "comm_matrix", "vendor_steps"),
        _read_analysis_db,
        needs=("profiler_metadata",),
        form="db",
        max_files=1,
        data=True,
    ),
    ExportReader(
        "profiler_db",
        "db",
        (r"ascend_(?:pytorch|mindspore)_profiler(?:_\d+)?\.db",),  # msprof_*.db: under PROF_* only (claim)
        (
            "events",
            "kernels",
            "comm_ops",
            "comm_tasks",
            "tracks",
            "memory",
            "hw_metrics",
            "steps",
            "meta",
            "comm_groups",
        ),
        _read_profiler_db,
        needs=("profiler_metadata", "analysis_db"),
        form="db",
        max_files=1,
        data=True,
    ),
    BatchReader(
        "trace_view",
        "trace",
        # also msprof_*.json under PROF_*/, and a renamed timeline recognised by its content (claim)
        _name("trace_view.json", "trace_view.json.gz"),
        ("events", "tracks", "vendor_overlap", "comm_tasks", "hw_metrics", "kernels", "comm_ops"),
        ascend_text.load_traces,
        label="trace_view.json",
        # meta rows: the export's own description (profiler_info) first, then what the timeline says
        needs=("profiler_info", "profiler_metadata", "device_info"),
        # kernels / comm_ops only for exports without a better source
        flags=(("kernels", lambda st: not st.roles.get("kernels")), ("comm_ops", lambda st: not st.roles.get("comm"))),
        after=_after_trace,
    ),
    BatchReader(
        "kernel_details",
        "kernels",
        _name("kernel_details.csv"),  # also op_summary_*.csv under PROF_*/, or by its header (claim)
        ("kernels", "events", "comm_ops"),
        ascend_text.load_kernel_details,
        label="kernel_details.csv",
        needs=("trace_view",),
        # device events too when the timeline is missing or unreadable
        flags=(
            ("events", lambda st: not st.info.get("has_trace")),
            ("comm_ops", lambda st: not st.info.get("has_trace") and not st.roles.get("comm")),
        ),
        after=_after_kernels,
        then=_kernels_from_timeline,
    ),
    BatchReader(
        "step_trace_time",
        "step_trace",
        _name("step_trace_time.csv"),
        ("vendor_steps",),
        ascend_text.load_step_traces,
        label="step_trace_time.csv",
    ),
    BatchReader(
        "communication",
        "comm",
        _name("communication.json"),
        ("comm_ops", "comm_bandwidth"),
        ascend_text.load_communications,
        label="communication.json",
        after=_after_comm,
    ),
    BatchReader(
        "communication_matrix",
        "matrix",
        _name("communication_matrix.json"),
        ("comm_matrix",),
        ascend_text.load_matrices,
        label="communication_matrix.json",
        needs=("profiler_metadata",),  # group-local link ranks become global through comm_groups
        after=_after_matrix,
    ),
    BatchReader(
        "op_statistic",
        "op_stat",
        _name("op_statistic.csv"),
        ("vendor_op_stats",),
        partial(ascend_text.load_op_statistics, source="op_statistic"),
        label="op_statistic.csv",
    ),
    BatchReader(
        "api_statistic",
        "api_stat",
        _name("api_statistic.csv"),
        ("vendor_op_stats",),
        partial(ascend_text.load_op_statistics, source="api_statistic"),
        label="api_statistic.csv",
    ),
    BatchReader(
        "memory_record",
        "memory_record",
        _name("memory_record.csv"),
        ("memory",),
        ascend_text.load_memory_records,
        label="memory_record.csv",
    ),
    BatchReader(
        "npu_module_mem",
        "module_mem",
        _name("npu_module_mem.csv"),
        ("memory",),
        ascend_text.load_module_mems,
        label="npu_module_mem.csv",
    ),
    BatchReader(
        "minddata_pipeline",
        "minddata",
        (r"minddata_pipeline_raw_\d+\.csv",),
        ("queues",),
        ascend_text.load_minddata,
        label="minddata_pipeline_raw.csv",
        data=False,  # MindSpore's dataset queue alone is not a profile
    ),
    DerivedReader("file_events", ("profile_files",), _file_events, needs=("trace_view", "kernel_details"), form="text"),
    DerivedReader(
        "breakdown_basis",
        ("meta",),
        _breakdown_basis,
        needs=("trace_view", "kernel_details", "communication", "step_trace_time"),
        form="text",
    ),
    DerivedReader(
        "vendor_step_windows",
        ("steps",),
        _steps_from_vendor,
        needs=("trace_view", "kernel_details", "communication"),
        form="text",
    ),
]

#: Files recognised inside an export that no reader uses: named in meta (``ascend.unread_files``).
UNREAD_BY_NAME = {
    "operator_details.csv": "operator_details",
    "operator_memory.csv": "operator_memory",
    "data_preprocess.csv": "data_preprocess",
    "dataset.csv": "dataset",
}


def role_of_name(name: str, readers: list[AscendReader] | None = None) -> str | None:
    """The role a file name has by the readers' patterns (or a recognised unread file), else None."""
    for r in READERS if readers is None else readers:
        if r.role is not None and any(re.fullmatch(p, name, re.IGNORECASE) for p in r.patterns):
            return r.role
    return UNREAD_BY_NAME.get(name.lower())


class ReaderDeclarationError(RuntimeError):
    """The readers' declarations contradict each other (a bug in the code, not in the input)."""


def ordered(readers: list[AscendReader]) -> list[AscendReader]:
    """The readers in run order: list order, each after the readers it needs
    (:class:`ReaderDeclarationError` on a need that no reader provides, or on a cycle)."""
    names = {r.name for r in readers}
    for r in readers:
        unknown = set(r.needs) - names
        if unknown:
            raise ReaderDeclarationError(f"Ascend reader {r.name!r} needs unknown reader(s) {sorted(unknown)}")
    done: set[str] = set()
    out: list[AscendReader] = []
    todo = list(readers)
    while todo:
        nxt = next((r for r in todo if set(r.needs) <= done), None)
        if nxt is None:
            raise ReaderDeclarationError(f"Ascend readers' needs form a cycle: {sorted(r.name for r in todo)}")
        out.append(nxt)
        done.add(nxt.name)
        todo.remove(nxt)
    return out


# -- the loop ----------------------------------------------------------------------------------------


def read_exports(
    units: list[Unit], lctx: LoadContext, cur: Any, readers: list[AscendReader] | None = None
) -> list[dict[str, Any] | ParseError]:
    """Load rank exports with the readers (default :data:`READERS`); one result per unit: its
    ranks-table info, or the ParseError that skipped it."""
    exports = [Export(u, i) for i, u in enumerate(units)]
    ctx = ReadContext(cur, lctx, exports)
    for st in exports:
        _start(st)
    token = ascend_text.WARN.set(ctx.warn)  # file-level notes from the CSV readers
    try:
        for reader in ordered(READERS if readers is None else readers):
            serves = ctx.of_form(reader.form)
            if reader.role is None:
                if serves:
                    reader.read(ctx, [])
                continue
            files = [(st, p) for st in serves for p in (st.roles.get(reader.role) or [])[: reader.max_files]]
            if files:
                reader.read(ctx, files)
    finally:
        ascend_text.WARN.reset(token)
    return [_result(ctx, st) for st in exports]


def _start(st: Export) -> None:
    """The export's flavour and form, and the files recognised but not read, as meta rows."""
    u = st.unit
    flavor = u.info.get("flavor", SOURCE_PT)
    st.info.update(flavor=flavor, form=u.info.get("form", "text"))
    st.meta_rows += [("ascend.flavor", flavor), ("ascend.form", st.info["form"])]
    if u.info.get("unread"):  # recognised but not used (e.g. operator_details.csv, or the text files of a db export)
        st.meta_rows.append(("ascend.unread_files", ";".join(u.info["unread"])[:2000]))


def _result(ctx: ReadContext, st: Export) -> dict[str, Any] | ParseError:
    cur, lctx = ctx.cur, ctx.lctx
    with contextlib.suppress(Exception):
        insert_meta(cur, st.unit.rank, st.meta_rows)
    if not st.loaded:
        return ParseError(st.unit.root, "no file of this Ascend export could be read", code="bad_export")
    failed = _failed_device_sources(ctx, st)
    if failed:
        # the side tables alone (step table, communication summary) would pass for a CPU-only profile
        if lctx.units_of_rank(st.unit.rank) <= 1:
            _drop_rank_rows(cur, st.unit.rank)
        return ParseError(st.unit.root, f"no device data could be read: {failed}", code="bad_export")
    _missing_inputs_warnings(st.unit, lctx, st.info)
    info = st.info
    if info.get("comm_in_trace") or info.get("has_comm") or (st.unit.world_size or 0) > 1:
        info["backend"] = "hccl"
    info["events"] = st.events
    keep = ("events", "world_size", "backend", "device_name", "device_count", "flavor", "form", "distributed")
    return {k: v for k, v in info.items() if k in keep}


def _drop_rank_rows(cur: Any, rank: int) -> None:
    """Remove what the side files of a skipped rank left in the canonical tables (communication,
    vendor step figures): without its device data the rank is not analysed at all."""
    from advisor.schema import TABLES

    for name, table in TABLES.items():
        if name not in ("events", "profile_files", "ranks", "meta") and "rank" in table.column_names:
            with contextlib.suppress(Exception):
                cur.execute(f"DELETE FROM {name} WHERE rank = ?", [rank])


def _failed_device_sources(ctx: ReadContext, st: Export) -> str | None:
    """When an export has device sources (timeline, kernel table, profiler database) and none of
    them loaded: each file with its problem, for a one-line error; else None."""
    if st.info.get("form") == "db":
        paths = st.roles.get("db", [])[:1]
        ok = "db" in st.loaded
    else:
        paths = [p for role in ("trace", "kernels") if (p := st.first(role)) is not None]
        ok = bool({"trace", "kernels"} & st.loaded)
    if not paths or ok:
        return None
    return "; ".join(f"{p}: {ctx.problems.get(str(p), 'not read')}" for p in paths)


def _missing_inputs_warnings(unit: Unit, lctx: LoadContext, info: dict[str, Any]) -> None:
    """Say once per profile which analyses lack their inputs in this kind of export."""
    roles = unit.info.get("roles", {})
    if unit.info.get("form") == "db":
        return
    where = unit.root
    if not info.get("has_trace"):
        warn_once(lctx, "missing_input", f"no readable trace_view.json: {NEEDS['trace']} lack their input", where)
    if not info.get("has_kernels") and not roles.get("kernels"):
        warn_once(
            lctx,
            "missing_input",
            f"no kernel_details.csv: {NEEDS['kernels']} use the timeline's task types only",
            where,
        )
    multi = (unit.world_size or 0) > 1 or info.get("comm_in_trace")
    if multi and not info.get("has_comm"):
        warn_once(lctx, "missing_input", f"no communication.json: {NEEDS['comm']} lack their input", where)
    if multi and "matrix_stats" not in info:
        warn_once(lctx, "missing_input", f"no communication_matrix.json: {NEEDS['matrix']} lack their input", where)
