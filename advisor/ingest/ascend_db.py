"""Ascend database exports -> canonical tables (format doc §17).

``ascend_pytorch_profiler[_{rank}].db`` (CANN's unified db plus torch_npu's tables),
``ascend_mindspore_profiler[_{rank}].db``, ``analysis.db`` (torch_npu's communication and step
analysis) and MindSpore's raw ``communication_analyzer.db``.

DuckDB's sqlite extension cannot be downloaded here, so SQLite is read with Python's
``sqlite3``: each query's rows are fetched in chunks, turned into Arrow columns (typed, so ns
timestamps never pass through float64) and inserted with one SQL statement per chunk. String
ids and enums are resolved by joins in DuckDB. No Python code runs per row.

The database is untrusted: it is opened through :mod:`advisor.sqlite_safe` (read-only and
immutable, nothing written beside it; an authorizer lets each statement read only the real tables
it names; the work of each statement is bounded; identifiers from the file are quoted).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from advisor.ingest.ascend_common import (
    HCCL_DTYPE_BYTES_SQL,
    MB_TO_BYTES,
    MS_TO_NS,
    OP_TYPE_SQL,
    STEP_KEY_SQL,
    SYNC_RE,
    US_TO_NS,
    insert_groups,
    metadata_meta,
    sql_str,
)
from advisor.ingest.ascend_counters import insert_db_series
from advisor.ingest.base import CUT_MARK, NAME_MAX, TEXT_MAX, ParseError, bounded_sql
from advisor.ingest.steps import windows_sql
from advisor.schema import EVENTS_INSERT
from advisor.sqlite_safe import SafeSqlite, SqliteRefused, quote_ident

CHUNK_ROWS = 250_000
_EXT_BASE = 1 << 62
_I64 = pa.int64()
_STR = pa.string()
_F64 = pa.float64()


class Db:
    """A read-only SQLite source with schema lookups, opened by :class:`advisor.sqlite_safe.SafeSqlite`:
    every statement names the tables it reads and is bounded; only real tables are seen (a view or
    virtual table looked up as one is noted in :attr:`notes` and read as absent)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.safe = SafeSqlite(path)
        except SqliteRefused as exc:
            raise ParseError(path, str(exc), code="bad_db") from None
        except sqlite3.Error as exc:
            raise ParseError(path, f"not a readable SQLite database: {exc}", code="bad_db") from None
        self._cols: dict[str, list[str]] = {}

    @property
    def notes(self) -> list[str]:
        """One line per table looked up that is a view or virtual table (skipped)."""
        return self.safe.notes

    def close(self) -> None:
        """Close the connection."""
        self.safe.close()

    def has(self, table: str) -> bool:
        """True when the real table exists."""
        return self.safe.has(table)

    def cols(self, table: str) -> list[str]:
        """Column names of a table (PRAGMA table_info), [] when absent."""
        if table not in self._cols:
            try:
                self._cols[table] = self.safe.columns(table)
            except sqlite3.Error:
                self._cols[table] = []
        return self._cols[table]

    def pick(self, table: str, *names: str, default: str = "NULL") -> str:
        """The first existing column of ``names`` (quoted), else ``default``."""
        have = {c.lower(): c for c in self.cols(table)}
        for n in names:
            if n.lower() in have:
                return quote_ident(have[n.lower()])
        return default

    def query(self, sql: str, reads: tuple[str, ...], functions: tuple[str, ...] = ()) -> list[Any]:
        """All rows of ``sql``, which reads the tables ``reads`` and calls ``functions`` only."""
        return self.safe.query(sql, reads, functions)

    def chunks(
        self, sql: str, schema: list[tuple[str, pa.DataType]], reads: tuple[str, ...], functions: tuple[str, ...] = ()
    ) -> Iterator[pa.Table]:
        """Run ``sql`` (reading only ``reads``) and yield Arrow tables of at most CHUNK_ROWS rows, typed by ``schema``.

        Integer columns are read through ``CAST(.. AS INTEGER)`` in the SQL by the callers, so
        SQLite's type affinity (TEXT timestamps in PYTORCH_API) cannot leak mixed types here.
        """
        names = [n for n, _ in schema]
        for rows in self.safe.chunks(sql, reads, CHUNK_ROWS, functions):
            cols = list(zip(*rows, strict=True))
            arrays = []
            for (_, typ), values in zip(schema, cols, strict=True):
                try:
                    arrays.append(pa.array(values, type=typ))
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                    arrays.append(pa.array([_coerce(v, typ) for v in values], type=typ))
            yield pa.Table.from_arrays(arrays, names=names)


def _ci(db: Db, table: str, alias: str, *names: str, cast: str = "INTEGER") -> str:
    """SQL ``CAST(alias.col AS cast)`` for the first existing column of ``names``, else NULL."""
    c = db.pick(table, *names)
    return "NULL" if c == "NULL" else f"CAST({alias + '.' if alias else ''}{c} AS {cast})"


def _int32(col: str) -> str:
    """SQL: an id column as INTEGER, NULL where the export writes a sentinel (UINT32 max, "not applicable")
    or any value outside INTEGER's range, so one such value never fails the whole statement."""
    return f"CASE WHEN {col} BETWEEN -2147483648 AND 2147483647 AND {col} <> 4294967295 THEN {col}::INTEGER END"


def _coerce(v: Any, typ: pa.DataType) -> Any:
    """Slow path for a column whose values do not fit its type (corrupt or odd databases)."""
    if v is None:
        return None
    try:
        if typ == _I64:
            x = int(v)
            return x if -(1 << 63) <= x < (1 << 63) else None
        if typ == _F64:
            return float(v)
        return str(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _settle(cur: Any) -> None:
    """Finish a result still open on ``cur``: DuckDB refuses ``register`` while one is pending."""
    complete = getattr(cur, "complete", None)
    if complete is not None:
        complete()


def _insert_chunks(
    cur: Any,
    db: Db,
    sql: str,
    schema: list[tuple[str, pa.DataType]],
    insert_sql: str,
    params: dict[str, Any],
    view: str,
    *,
    reads: tuple[str, ...],
    functions: tuple[str, ...] = (),
) -> int:
    """Stream ``sql`` (which reads the SQLite tables ``reads``) and run ``insert_sql`` (which reads
    ``view``) once per chunk."""
    n = 0
    for tbl in db.chunks(sql, schema, reads, functions):
        _settle(cur)
        cur.register(view, tbl)
        try:
            cur.execute(insert_sql, params)
        finally:
            with contextlib.suppress(Exception):  # an aborted transaction must not mask the real error
                cur.unregister(view)
        n += tbl.num_rows
    return n


def _load_lookup(cur: Any, db: Db, table: str, name: str, key_cols: tuple[str, str] = ("id", "value")) -> None:
    """Copy an (id, text) lookup table (STRING_IDS, ENUM_*) into a DuckDB temp table ``name``
    (id BIGINT, value VARCHAR): made from its first chunk of rows, or empty."""
    k, v = (db.pick(table, key_cols[0]), db.pick(table, key_cols[1], "name")) if db.has(table) else ("NULL", "NULL")
    chunks = (
        db.chunks(f"SELECT CAST({k} AS INTEGER), CAST({v} AS TEXT) FROM {quote_ident(table)}", [("id", _I64), ("value", _STR)], (table,))
        if k != "NULL" and v != "NULL"
        else iter(())
    )
    first = next(chunks, None)
    if first is None:
        cur.execute(f"CREATE OR REPLACE TEMP TABLE {name} (id BIGINT, value VARCHAR)")
        return
    _settle(cur)
    cur.register("_chunk", first)
    try:
        cur.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT id, {bounded_sql('value', TEXT_MAX)} AS value FROM _chunk")
    finally:
        with contextlib.suppress(Exception):  # an aborted transaction must not mask the real error
            cur.unregister("_chunk")
    for tbl in chunks:
        _settle(cur)
        cur.register("_chunk", tbl)
        try:
            cur.execute(f"INSERT INTO {name} SELECT id, {bounded_sql('value', TEXT_MAX)} FROM _chunk")
        finally:
            with contextlib.suppress(Exception):
                cur.unregister("_chunk")


def _name_sql(x: str) -> str:
    """SQL: a string of a lookup (already bounded to TEXT_MAX, see :func:`_load_lookup`) bounded
    to NAME_MAX as a name; one cut at load keeps its mark (the full text's length and hash)."""
    n = len(CUT_MARK)
    return (f"CASE WHEN strlen({x}) <= {NAME_MAX} OR substr({x}, {NAME_MAX + 1}, {n}) = '{CUT_MARK}' THEN {x} "
            f"WHEN substr({x}, {TEXT_MAX + 1}, {n}) = '{CUT_MARK}' THEN left({x}, {NAME_MAX}) || substr({x}, {TEXT_MAX + 1}) "
            f"ELSE {bounded_sql(x)} END")


# lookups of STRING_IDS that are not names (input shapes, types, formats): bounded to TEXT_MAX only
_TEXT_ALIASES = frozenset({"si", "sd", "sf", "s2", "s3", "s4"})


class _Strings:
    """SQL for STRING_IDS lookups. When the ids are unique, not negative and dense enough, the
    strings form one list indexed by id: one element access per value instead of a hash join per
    column (each join costs a statement about a millisecond, whatever its rows). Otherwise each
    value is a LEFT JOIN, as the ids dictate. Both give the string of the id, NULL for an unknown id.

    ``val(alias, col)`` is the string of ``col`` (``alias`` names its join in the join form);
    ``joins()`` is what the statement's FROM clause needs after its own joins, and starts afresh."""

    def __init__(self, cur: Any, sid: str, p: str) -> None:
        self.sid, self.table = sid, f"{p}_string_list"
        n, distinct, lo, hi = cur.execute(f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {sid}").fetchone()
        self.dense = n == distinct and (n == 0 or (lo >= 0 and hi < 2 * n + 1024))
        self.hi = -1 if hi is None else int(hi)
        self._joins: list[str] = []
        if self.dense:
            cur.execute(
                f"""CREATE OR REPLACE TEMP TABLE {self.table} AS
                SELECT coalesce((SELECT list(s.value ORDER BY r.range) FROM range(0, {self.hi + 1}) r
                                 LEFT JOIN {sid} s ON s.id = r.range), []::VARCHAR[]) AS l"""
            )

    def val(self, alias: str, col: str) -> str:
        if self.dense:
            v = f"(CASE WHEN {col} BETWEEN 0 AND {self.hi} THEN _sl.l[{col} + 1] END)"
        else:
            self._joins.append(f"LEFT JOIN {self.sid} {alias} ON {alias}.id = {col}")
            v = f"{alias}.value"
        return v if alias in _TEXT_ALIASES else _name_sql(v)

    def joins(self) -> str:
        out = f"CROSS JOIN {self.table} _sl" if self.dense else " ".join(self._joins)
        self._joins = []
        return out


def load_profiler_db(
    cur: Any,
    path: Path,
    rank: int,
    fid: int,
    meta_rows: list[tuple[str, str]],
    info: dict[str, Any],
    *,
    comm_ops_from_db: bool,
    max_events: int | None,
) -> dict[str, Any]:
    """``ascend_pytorch_profiler*.db`` / ``ascend_mindspore_profiler*.db`` / ``msprof_*.db``."""
    db = Db(path)
    p = "stage_db"  # the staged rows of one database, named for what they hold (below)
    sid, api_t, dtype_t, link_t, trans_t = f"{p}_string_ids", f"{p}_api_types", f"{p}_hccl_data_types", f"{p}_hccl_link_types", f"{p}_hccl_transports"
    temps = [
        f"{p}_cann_calls",
        sid,
        api_t,
        dtype_t,
        link_t,
        trans_t,
        f"{p}_connection_ids",
        f"{p}_torch_op_of_connection",
        f"{p}_device_tasks",
        f"{p}_task_pmu",
        f"{p}_comm_op_rows",
        f"{p}_comm_task_rows",
        f"{p}_torch_ops",
        f"{p}_comm_windows",
        f"{p}_string_list",
    ]
    try:
        if not (db.has("TASK") or db.has("PYTORCH_API") or db.has("CANN_API")):
            raise ParseError(
                path,
                "; ".join(["no TASK, PYTORCH_API or CANN_API table: not an Ascend profiler database", *db.notes]),
                code="bad_db",
            )
        if max_events is not None:
            n_rows = sum(
                db.query(f"SELECT count(*) FROM (SELECT 1 FROM {quote_ident(t)} LIMIT {max(max_events, 0) + 1})", (t,), ("count",))[0][0]
                for t in ("TASK", "PYTORCH_API", "CANN_API", "COMMUNICATION_OP")
                if db.has(t)
            )
            if n_rows > max_events:
                raise ParseError(path, f"more than {max_events} events (--max-events {max_events}): refused", code="too_big")
        _load_lookup(cur, db, "STRING_IDS", sid)
        _load_lookup(cur, db, "ENUM_API_TYPE", api_t, ("id", "name"))
        _load_lookup(cur, db, "ENUM_HCCL_DATA_TYPE", dtype_t, ("id", "name"))
        _load_lookup(cur, db, "ENUM_HCCL_LINK_TYPE", link_t, ("id", "name"))
        _load_lookup(cur, db, "ENUM_HCCL_TRANSPORT_TYPE", trans_t, ("id", "name"))
        _meta(cur, db, rank, sid, meta_rows, info)
        strs = _Strings(cur, sid, p)
        # links first (torch op -> CANN connection ids), so every row is inserted once, complete:
        # no UPDATE on the shared canonical tables (their cost would grow with the cluster)
        has_cann = (
            db.has("CANN_API")
            and db.query("SELECT count(*) FROM (SELECT 1 FROM CANN_API LIMIT 1)", ("CANN_API",), ("count",))[0][0] > 0
        )
        _pytorch_stage(cur, db, p)
        # strings a name may take that are longer than NAME_MAX (each cut where it is used as a name)
        stats = {"events": 0, "long_names": cur.execute(
            f"SELECT count(*) FROM {sid} WHERE strlen(value) > {NAME_MAX} AND length(value) > {NAME_MAX}").fetchone()[0]}
        stats["events"] += _device_tasks(cur, db, rank, fid, p, sid, strs, has_cann=has_cann)
        stats["events"] += _comm(cur, db, rank, fid, p, sid, strs, dtype_t, link_t, trans_t, comm_ops_from_db)
        stats["events"] += _cann_api(cur, db, rank, fid, p, strs, api_t)
        n_host, has_step_events = _pytorch_insert(cur, db, rank, fid, p, strs, api_t, has_cann=has_cann)
        stats["events"] += n_host
        stats["events"] += _gc_mstx(cur, db, rank, fid, sid)
        _memory_freq(cur, db, rank, sid)
        if not has_step_events:
            _steps_from_step_time(cur, db, rank, p)
        # tracks from the staged rows (reading the shared events table back would cost more with every rank)
        cur.execute(
            f"""INSERT INTO tracks
            SELECT $rank, pid, tid, bool_or(dev), max(pname), max(tid) FROM (
                SELECT DISTINCT 'NPU ' || coalesce(dev::VARCHAR, '?') AS pid, 'Stream ' || coalesce(stream::VARCHAR, '?') AS tid,
                       true AS dev, 'Ascend Hardware' AS pname FROM {p}_device_tasks
                UNION ALL SELECT DISTINCT 'HCCL', 'Group ' || coalesce({strs.val("sg", "o.grp")}, '?') || ' Communication', true, 'HCCL'
                FROM {p}_comm_op_rows o {strs.joins()}
                UNION ALL SELECT DISTINCT (gtid >> 32)::VARCHAR, (gtid & 4294967295)::VARCHAR, false, 'CANN' FROM {p}_cann_calls
                UNION ALL SELECT DISTINCT (gtid >> 32)::VARCHAR, (gtid & 4294967295)::VARCHAR, false, 'Python' FROM {p}_torch_ops
            ) GROUP BY pid, tid""",
            {"rank": rank},
        )
        stats["notes"] = db.notes
        return stats
    except SqliteRefused as exc:
        raise ParseError(path, str(exc), code="bad_db") from None
    finally:
        for t in temps:
            with contextlib.suppress(Exception):  # cleanup after an error must not mask it
                cur.execute(f"DROP TABLE IF EXISTS {t}")
        db.close()


def _s(sid: str, col: str) -> str:
    """SQL: resolve a STRING_IDS id column (scalar subquery keeps rows whose id is unknown)."""
    return f"(SELECT value FROM {sid} WHERE id = {col})"


def _meta(cur: Any, db: Db, rank: int, sid: str, meta_rows: list[tuple[str, str]], info: dict[str, Any]) -> None:
    if db.has("META_DATA"):
        doc: dict[str, Any] = {}
        for name, value in db.query(
            f"SELECT CAST({db.pick('META_DATA', 'name')} AS TEXT), CAST({db.pick('META_DATA', 'value')} AS TEXT) FROM META_DATA LIMIT 10000",
            ("META_DATA",),
        ):
            if name is None:
                continue
            try:
                doc[name] = json.loads(value) if value else value
            except ValueError:
                doc[name] = value
        rows, groups, minfo = metadata_meta(doc)
        have = {k for k, _ in meta_rows}
        meta_rows.extend(r for r in rows if r[0] not in have)
        info.update({k: v for k, v in minfo.items() if k not in info})
        if not cur.execute("SELECT count(*) FROM comm_groups WHERE rank = ?", [rank]).fetchall()[0][0]:
            insert_groups(cur, rank, groups)  # profiler_metadata.json, when present, was loaded already
    if db.has("HOST_INFO"):
        for uid, name in db.query(
            f"SELECT CAST({db.pick('HOST_INFO', 'hostUid')} AS TEXT), CAST({db.pick('HOST_INFO', 'hostName')} AS TEXT) FROM HOST_INFO LIMIT 4",
            ("HOST_INFO",),
        ):
            meta_rows.append(("host.uid", str(uid)))
            meta_rows.append(("host.name", str(name)))
    if db.has("RANK_DEVICE_MAP"):
        devs = [
            r[0]
            for r in db.query(
                f"SELECT DISTINCT CAST({db.pick('RANK_DEVICE_MAP', 'deviceId')} AS INTEGER) FROM RANK_DEVICE_MAP LIMIT 8",
                ("RANK_DEVICE_MAP",),
            )
        ]
        if devs:
            meta_rows.append(("device_id", ",".join(str(d) for d in devs if d is not None)))


def _device_tasks(cur: Any, db: Db, rank: int, fid: int, p: str, sid: str, strs: _Strings, *, has_cann: bool) -> int:
    """TASK (+ COMPUTE_TASK_INFO, TASK_PMU_INFO) -> events (device) and kernels."""
    ktask, pmu = f"{p}_device_tasks", f"{p}_task_pmu"
    if not db.has("TASK"):
        cur.execute(f"CREATE OR REPLACE TEMP TABLE {ktask} (start BIGINT, end_ BIGINT, dev BIGINT, stream BIGINT)")
        return 0
    has_cti = db.has("COMPUTE_TASK_INFO")
    cti = "COMPUTE_TASK_INFO"
    comm_filter = ""
    if db.has("COMMUNICATION_TASK_INFO"):
        comm_filter = (
            "LEFT JOIN COMMUNICATION_TASK_INFO h ON h.globalTaskId = t.globalTaskId WHERE h.globalTaskId IS NULL"
        )
    if has_cti:
        c = partial(_ci, db, cti, "c")
        cti_cols = (
            f"{c('name')}, {c('opType')}, {c('taskType')}, {c('blockDim', 'blockNum')}, {c('mixBlockDim', 'mixBlockNum')}, "
            f"{c('inputShapes')}, {c('inputDataTypes')}, {c('inputFormats')}, {c('outputShapes')}, {c('outputDataTypes')}, "
            f"{c('outputFormats')}, CASE WHEN c.globalTaskId IS NOT NULL THEN 1 ELSE 0 END"
        )
        join = f"LEFT JOIN {cti} c ON c.globalTaskId = t.globalTaskId"
    else:
        cti_cols = ", ".join(["NULL"] * 11) + ", 0"
        join = ""
    t = partial(_ci, db, "TASK", "t")
    sql = f"""SELECT {t("startNs")}, {t("endNs")}, {t("deviceId")}, {t("streamId")}, {t("taskId")}, {t("connectionId")},
                     {t("globalTaskId")}, {t("taskType")}, {cti_cols}
              FROM TASK t {join} {comm_filter}"""
    schema = [
        (n, _I64)
        for n in (
            "start",
            "end_",
            "dev",
            "stream",
            "task",
            "conn",
            "gtid",
            "ttype",
            "name",
            "optype",
            "core",
            "block",
            "mix",
            "ish",
            "idt",
            "ifm",
            "osh",
            "odt",
            "ofm",
            "is_compute",
        )
    ]
    cur.execute(f"DROP TABLE IF EXISTS {ktask}")
    cur.execute(f"CREATE TEMP TABLE {ktask} ({', '.join(f'{n} BIGINT' for n, _ in schema)})")
    reads = ("TASK",) + ((cti,) if has_cti else ()) + (("COMMUNICATION_TASK_INFO",) if comm_filter else ())
    _insert_chunks(cur, db, sql, schema, f"INSERT INTO {ktask} SELECT * FROM _chunk", {}, "_chunk", reads=reads)
    # PMU: one JSON object per task (names resolved; time metrics as exported, ns in the db [U])
    cur.execute(f"DROP TABLE IF EXISTS {pmu}")
    cur.execute(f"CREATE TEMP TABLE {pmu} (gtid BIGINT, pmu VARCHAR)")
    if db.has("TASK_PMU_INFO"):
        tmp = f"{pmu}_long"
        cur.execute(f"CREATE TEMP TABLE {tmp} (gtid BIGINT, name BIGINT, value DOUBLE)")
        _insert_chunks(
            cur,
            db,
            f"SELECT CAST({db.pick('TASK_PMU_INFO', 'globalTaskId')} AS INTEGER), CAST({db.pick('TASK_PMU_INFO', 'name')} AS INTEGER), "
            f"CAST({db.pick('TASK_PMU_INFO', 'value')} AS REAL) FROM TASK_PMU_INFO",
            [("gtid", _I64), ("name", _I64), ("value", _F64)],
            f"INSERT INTO {tmp} SELECT * FROM _chunk",
            {},
            "_chunk",
            reads=("TASK_PMU_INFO",),
        )
        cur.execute(
            f"""INSERT INTO {pmu}
            SELECT l.gtid, to_json(map(list(coalesce(s.value, l.name::VARCHAR)), list(l.value)))::VARCHAR
            FROM {tmp} l LEFT JOIN {sid} s ON s.id = l.name GROUP BY l.gtid"""
        )
        cur.execute(f"DROP TABLE {tmp}")
    sn, st, sc = strs.val("sn", "k.name"), strs.val("st", "k.ttype"), strs.val("sc", "k.core")
    si, sd = strs.val("si", "k.ish"), strs.val("sd", "k.idt")
    kind = f"""CASE WHEN k.is_compute = 1 THEN
                   CASE WHEN upper(coalesce({sc}, '')) LIKE '%MEMCPY%' THEN 'memcpy' ELSE 'kernel' END
               WHEN upper(coalesce({st}, '')) LIKE '%MEMCPY%' THEN 'memcpy'
               WHEN upper(coalesce({st}, '')) LIKE '%MEMSET%' THEN 'memset'
               WHEN upper(coalesce({st}, '')) LIKE 'KERNEL%' OR upper(coalesce({st}, '')) LIKE 'FFTS%' THEN 'kernel'
               ELSE 'other' END"""
    # a computing-looking task on a stream HCCL uses is a step of a collective ...
    comm_streams: list[int] = []
    if db.has("COMMUNICATION_TASK_INFO"):
        comm_streams = [
            int(r[0])
            for r in db.query(
                f"""SELECT DISTINCT CAST(t.{db.pick("TASK", "deviceId")} AS INTEGER) * 4294967296
                                    + CAST(t.{db.pick("TASK", "streamId")} AS INTEGER)
                    FROM TASK t JOIN COMMUNICATION_TASK_INFO h ON h.globalTaskId = t.globalTaskId""",
                ("TASK", "COMMUNICATION_TASK_INFO"),
            )
            if isinstance(r[0], int)
        ]
    # ... while a communication operator runs (a stream shared with computation keeps its kernels:
    # it runs one task at a time, so none of them falls inside a collective)
    cw = f"{p}_comm_windows"
    cur.execute(f"CREATE OR REPLACE TEMP TABLE {cw} (s BIGINT, e BIGINT)")
    if comm_streams and db.has("COMMUNICATION_OP"):
        o = partial(_ci, db, "COMMUNICATION_OP", "")
        _insert_chunks(cur, db, f"SELECT {o('startNs')}, {o('endNs')} FROM COMMUNICATION_OP",
                       [("s", _I64), ("e", _I64)], f"INSERT INTO {cw} SELECT * FROM _chunk WHERE s IS NOT NULL", {}, "_chunk",
                       reads=("COMMUNICATION_OP",))
    kind = f"""CASE WHEN list_contains($cs, k.dev * 4294967296 + k.stream) AND ({kind}) IN ('kernel', 'memcpy', 'memset')
                    AND EXISTS (SELECT 1 FROM {cw} w WHERE k.start >= w.s AND k.start < w.e)
               THEN 'comm' ELSE {kind} END"""
    # corr: the CANN connection id the task shares with the launch API; without CANN_API rows
    # (Level0) the launching torch op's id instead. ext_id: the torch op's id (format doc §17.1).
    corr = "NULLIF(k.conn, 4294967295)" if has_cann else "x.ext"
    cur.execute(
        f"""INSERT INTO {EVENTS_INSERT}
        SELECT $rank, NULL, {kind}, coalesce({sn}, {st}, 'task'), coalesce({sc}, {st}, 'Ascend Hardware'),
               'NPU ' || coalesce(k.dev::VARCHAR, '?'), 'Stream ' || coalesce(k.stream::VARCHAR, '?'), true, k.stream,
               k.start, greatest(k.end_ - k.start, 0), {corr}, x.ext, NULL,
               {si}, {sd}, NULL, NULL, $fid
        FROM {ktask} k LEFT JOIN {p}_torch_op_of_connection x ON x.conn = k.conn {strs.joins()}
        WHERE k.start IS NOT NULL AND k.end_ IS NOT NULL""",
        {"rank": rank, "fid": fid, "cs": comm_streams},
    )
    n: int = cur.execute(f"SELECT count(*) FROM {ktask} WHERE start IS NOT NULL AND end_ IS NOT NULL").fetchall()[0][0]
    # wait before each task on its stream: the kernel_details 'Wait Time(us)' definition (gap since the previous task)
    cur.execute(
        f"""INSERT INTO kernels
        WITH w AS (SELECT *, greatest(start - lag(end_) OVER (PARTITION BY dev, stream ORDER BY start), 0) AS wait
                   FROM {ktask} WHERE start IS NOT NULL AND end_ IS NOT NULL)
        SELECT $rank, NULL, {strs.val("sn", "k.name")}, {strs.val("so", "k.optype")}, upper({strs.val("sc", "k.core")}),
               k.start, greatest(k.end_ - k.start, 0), k.wait, {_int32("k.block")}, {_int32("k.mix")},
               {strs.val("si", "k.ish")}, {strs.val("sd", "k.idt")}, {strs.val("sf", "k.ifm")}, {strs.val("s2", "k.osh")},
               {strs.val("s3", "k.odt")}, {strs.val("s4", "k.ofm")}, NULL, NULL, pm.pmu, NULL
        FROM w k LEFT JOIN {pmu} pm ON pm.gtid = k.gtid {strs.joins()}
        WHERE k.is_compute = 1""",
        {"rank": rank},
    )
    return n


def _comm(
    cur: Any,
    db: Db,
    rank: int,
    fid: int,
    p: str,
    sid: str,
    strs: _Strings,
    dtype_t: str,
    link_t: str,
    trans_t: str,
    comm_ops_from_db: bool,
) -> int:
    """COMMUNICATION_OP -> comm events (+ comm_ops when analysis.db lacks them); COMMUNICATION_TASK_INFO -> comm_tasks."""
    ops, ct = f"{p}_comm_op_rows", f"{p}_comm_task_rows"
    n = 0
    cur.execute(f"DROP TABLE IF EXISTS {ops}")
    cur.execute(
        f"CREATE TEMP TABLE {ops} (op_id BIGINT, name BIGINT, op_type BIGINT, grp BIGINT, start BIGINT, end_ BIGINT, "
        f"conn BIGINT, dtype BIGINT, cnt BIGINT)"
    )
    if db.has("COMMUNICATION_OP"):
        o = partial(_ci, db, "COMMUNICATION_OP", "")
        _insert_chunks(
            cur,
            db,
            f"SELECT {o('opId')}, {o('opName')}, {o('opType')}, {o('groupName')}, {o('startNs')}, {o('endNs')}, "
            f"{o('connectionId')}, {o('dataType')}, {o('count')} FROM COMMUNICATION_OP",
            [(x, _I64) for x in ("op_id", "name", "op_type", "grp", "start", "end_", "conn", "dtype", "cnt")],
            f"INSERT INTO {ops} SELECT * FROM _chunk",
            {},
            "_chunk",
            reads=("COMMUNICATION_OP",),
        )
        bytes_sql = f"o.cnt * ({HCCL_DTYPE_BYTES_SQL.format(d='dt.value')})"
        cur.execute(
            f"""INSERT INTO {EVENTS_INSERT}
            SELECT $rank, NULL, 'comm', coalesce({strs.val("sn", "o.name")}, 'hcom'), 'HCCL', 'HCCL',
                   'Group ' || coalesce({strs.val("sg", "o.grp")}, '?') || ' Communication', true, NULL,
                   o.start, greatest(o.end_ - o.start, 0), NULLIF(o.conn, 4294967295), NULL, {bytes_sql}, NULL, dt.value, NULL, NULL, $fid
            FROM {ops} o LEFT JOIN {dtype_t} dt ON dt.id = o.dtype {strs.joins()}
            WHERE o.start IS NOT NULL AND o.end_ IS NOT NULL""",
            {"rank": rank, "fid": fid},
        )
        n = cur.execute(f"SELECT count(*) FROM {ops} WHERE start IS NOT NULL AND end_ IS NOT NULL").fetchall()[0][0]
        # kernel_details.csv lists every HCCL operator as a task with core type HCCL (format doc §6.3): same here
        cur.execute(
            f"""INSERT INTO kernels (rank, step, name, op_type, core_type, start_ns, dur_ns, block_dim)
            SELECT $rank, NULL, {strs.val("sn", "o.name")}, {strs.val("st", "o.op_type")}, 'HCCL', o.start,
                   greatest(o.end_ - o.start, 0), 0
            FROM {ops} o {strs.joins()}
            WHERE o.start IS NOT NULL AND o.end_ IS NOT NULL""",
            {"rank": rank},
        )
    cur.execute(f"DROP TABLE IF EXISTS {ct}")
    cur.execute(
        f"CREATE TEMP TABLE {ct} (start BIGINT, end_ BIGINT, name BIGINT, ttype BIGINT, op_id BIGINT, grp BIGINT, "
        f"plane BIGINT, src BIGINT, dst BIGINT, transport BIGINT, link BIGINT, size BIGINT)"
    )
    if db.has("COMMUNICATION_TASK_INFO") and db.has("TASK"):
        h = partial(_ci, db, "COMMUNICATION_TASK_INFO", "h")
        _insert_chunks(
            cur,
            db,
            f"""SELECT CAST(t.startNs AS INTEGER), CAST(t.endNs AS INTEGER), {h("name")}, {h("taskType")}, {h("opId")},
                       {h("groupName")}, {h("planeId")}, {h("srcRank")}, {h("dstRank")}, {h("transportType")},
                       {h("linkType")}, {h("size")}
                FROM COMMUNICATION_TASK_INFO h JOIN TASK t ON t.globalTaskId = h.globalTaskId""",
            [
                (x, _I64)
                for x in (
                    "start",
                    "end_",
                    "name",
                    "ttype",
                    "op_id",
                    "grp",
                    "plane",
                    "src",
                    "dst",
                    "transport",
                    "link",
                    "size",
                )
            ],
            f"INSERT INTO {ct} SELECT * FROM _chunk",
            {},
            "_chunk",
            reads=("COMMUNICATION_TASK_INFO", "TASK"),
        )
        cur.execute(
            f"""INSERT INTO comm_tasks
            SELECT $rank, NULL, {strs.val("so", "o.name")}, {strs.val("sg", "h.grp")}, {_int32("h.plane")},
                   coalesce({strs.val("sn", "h.name")}, ''), {strs.val("stt", "h.ttype")}, h.start,
                   greatest(h.end_ - h.start, 0), {_int32("h.src")}, {_int32("h.dst")}, tr.value, lk.value, coalesce(h.size, 0)
            FROM {ct} h LEFT JOIN {ops} o ON o.op_id = h.op_id
            LEFT JOIN {trans_t} tr ON tr.id = h.transport LEFT JOIN {link_t} lk ON lk.id = h.link {strs.joins()}
            WHERE h.start IS NOT NULL""",
            {"rank": rank},
        )
    if comm_ops_from_db and n:
        # the analysis.db figures are missing: derive them from the tasks (format doc addendum)
        cur.execute(
            f"""INSERT INTO comm_ops
            WITH t AS (SELECT op_id, name, start, end_ - start AS dur, coalesce(size, 0) AS b, coalesce(plane, 0) AS plane FROM {ct}),
            m AS (SELECT op_id, min(plane) AS plane FROM t GROUP BY op_id),
            fx AS (SELECT t.op_id, min(t.start) FILTER (WHERE t.b > 0) AS fx FROM t JOIN m USING (op_id, plane) GROUP BY t.op_id),
            agg AS (SELECT t.op_id, sum(t.dur) FILTER (WHERE t.b > 0) AS transit,
                           sum(t.dur) FILTER (WHERE sn.value ILIKE '%wait%') AS wait,
                           sum(t.dur) FILTER (WHERE sn.value ILIKE '%wait%' AND (f.fx IS NULL OR t.start < f.fx)) AS sync
                    FROM t JOIN m USING (op_id, plane) LEFT JOIN fx f USING (op_id) LEFT JOIN {sid} sn ON sn.id = t.name
                    GROUP BY t.op_id),
            bytes AS (SELECT op_id, sum(b) AS b FROM t GROUP BY op_id)
            SELECT $rank, NULL, sn.value, {OP_TYPE_SQL.format(n="coalesce(st.value, sn.value, '')")}, sg.value,
                   o.start, greatest(o.end_ - o.start, 0), a.transit, a.wait, a.sync,
                   CASE WHEN a.op_id IS NOT NULL THEN greatest(o.end_ - o.start - coalesce(a.transit, 0) - coalesce(a.wait, 0), 0) END,
                   coalesce(NULLIF(b.b, 0), o.cnt * ({HCCL_DTYPE_BYTES_SQL.format(d="dt.value")})), NULL
            FROM {ops} o LEFT JOIN agg a ON a.op_id = o.op_id LEFT JOIN bytes b ON b.op_id = o.op_id
            LEFT JOIN {sid} sn ON sn.id = o.name LEFT JOIN {sid} st ON st.id = o.op_type LEFT JOIN {sid} sg ON sg.id = o.grp
            LEFT JOIN {dtype_t} dt ON dt.id = o.dtype
            WHERE o.start IS NOT NULL AND o.end_ IS NOT NULL""",
            {"rank": rank},
        )
    return n


def _cann_api(cur: Any, db: Db, rank: int, fid: int, p: str, strs: _Strings, api_t: str) -> int:
    """CANN_API -> runtime / sync events (corr = connectionId, shared with the TASK it queued)."""
    cann = f"{p}_cann_calls"
    cur.execute(f"CREATE OR REPLACE TEMP TABLE {cann} (start BIGINT, end_ BIGINT, type BIGINT, gtid BIGINT, conn BIGINT, name BIGINT)")
    if not db.has("CANN_API"):
        return 0
    a = partial(_ci, db, "CANN_API", "")
    _insert_chunks(
        cur,
        db,
        f"SELECT {a('startNs')}, {a('endNs')}, {a('type')}, {a('globalTid')}, {a('connectionId')}, {a('name')} FROM CANN_API",
        [("start", _I64), ("end_", _I64), ("type", _I64), ("gtid", _I64), ("conn", _I64), ("name", _I64)],
        f"INSERT INTO {cann} SELECT * FROM _chunk",
        {},
        "_chunk",
        reads=("CANN_API",),
    )
    sn = strs.val("sn", "c.name")
    cur.execute(
        f"""INSERT INTO {EVENTS_INSERT}
        SELECT $rank, NULL, CASE WHEN regexp_matches(coalesce({sn}, ''), {sql_str(SYNC_RE)}) THEN 'sync' ELSE 'runtime' END,
               coalesce(ap.value || '@', '') || coalesce({sn}, ''), 'CANN', (c.gtid >> 32)::VARCHAR, (c.gtid & 4294967295)::VARCHAR,
               false, NULL, c.start, greatest(c.end_ - c.start, 0), NULLIF(c.conn, 4294967295), x.ext, NULL, NULL, NULL, NULL, NULL, $fid
        FROM {cann} c LEFT JOIN {p}_torch_op_of_connection x ON x.conn = c.conn LEFT JOIN {api_t} ap ON ap.id = c.type {strs.joins()}
        WHERE c.start IS NOT NULL AND c.end_ IS NOT NULL""",
        {"rank": rank, "fid": fid},
    )
    return cast(int, cur.execute(
        f"SELECT count(*) FROM {cann} WHERE start IS NOT NULL AND end_ IS NOT NULL").fetchall()[0][0])


def _pytorch_stage(cur: Any, db: Db, p: str) -> None:
    """PYTORCH_API + CONNECTION_IDS -> temp tables ``{p}_torch_ops`` and ``{p}_torch_op_of_connection(conn, ext)`` (CANN connection id -> torch op id)."""
    conn, host, cext = f"{p}_connection_ids", f"{p}_torch_ops", f"{p}_torch_op_of_connection"
    cur.execute(f"DROP TABLE IF EXISTS {conn}")
    cur.execute(f"CREATE TEMP TABLE {conn} (id BIGINT, conn BIGINT)")
    cur.execute(f"DROP TABLE IF EXISTS {host}")
    cur.execute(
        f"CREATE TEMP TABLE {host} (rid BIGINT, start BIGINT, end_ BIGINT, gtid BIGINT, conn BIGINT, name BIGINT, "
        f"idt BIGINT, ish BIGINT, type BIGINT, stack VARCHAR)"
    )
    if db.has("PYTORCH_API"):
        if db.has("CONNECTION_IDS"):
            _insert_chunks(
                cur,
                db,
                f"SELECT CAST({db.pick('CONNECTION_IDS', 'id')} AS INTEGER), CAST({db.pick('CONNECTION_IDS', 'connectionId')} AS INTEGER) FROM CONNECTION_IDS",
                [("id", _I64), ("conn", _I64)],
                f"INSERT INTO {conn} SELECT * FROM _chunk",
                {},
                "_chunk",
                reads=("CONNECTION_IDS",),
            )
        a = partial(_ci, db, "PYTORCH_API", "p")
        stack_sql = "NULL"
        reads: tuple[str, ...] = ("PYTORCH_API",)
        if db.has("PYTORCH_CALLCHAINS") and db.has("STRING_IDS") and db.pick("PYTORCH_API", "callchainId") != "NULL":
            stack_sql = (
                f"(SELECT group_concat(s.value, char(10)) FROM (SELECT c.stack AS sid_, c.stackDepth FROM PYTORCH_CALLCHAINS c "
                f"WHERE c.id = p.{db.pick('PYTORCH_API', 'callchainId')} ORDER BY c.stackDepth) cc JOIN STRING_IDS s ON s.id = cc.sid_)"
            )
            reads += ("PYTORCH_CALLCHAINS", "STRING_IDS")
        _insert_chunks(
            cur,
            db,
            f"""SELECT p.rowid, {a("startNs")}, {a("endNs")}, {a("globalTid")}, {a("connectionId")}, {a("name")}, {a("inputDtypes")},
                       {a("inputShapes")}, {a("type")}, {stack_sql} FROM PYTORCH_API p""",
            [
                ("rid", _I64),
                ("start", _I64),
                ("end_", _I64),
                ("gtid", _I64),
                ("conn", _I64),
                ("name", _I64),
                ("idt", _I64),
                ("ish", _I64),
                ("type", _I64),
                ("stack", _STR),
            ],
            f"INSERT INTO {host} SELECT * FROM _chunk",
            {},
            "_chunk",
            reads=reads,
            functions=("group_concat", "char"),
        )
    # every torch op gets an id; the CANN calls and tasks of its connection ids share it
    cur.execute(
        f"""CREATE OR REPLACE TEMP TABLE {cext} AS
        SELECT c.conn, min({_EXT_BASE} + h.rid) AS ext FROM {host} h JOIN {conn} c ON c.id = h.conn GROUP BY c.conn"""
    )


def _pytorch_insert(
    cur: Any, db: Db, rank: int, fid: int, p: str, strs: _Strings, api_t: str, *, has_cann: bool
) -> tuple[int, bool]:
    """The staged PYTORCH_API rows -> host events (ext_id = own id; corr too when there is no CANN layer)."""
    conn, host = f"{p}_connection_ids", f"{p}_torch_ops"
    typ = "lower(coalesce(ap.value, CASE h.type WHEN 50001 THEN 'op' WHEN 50002 THEN 'queue' WHEN 50003 THEN 'trace' WHEN 50004 THEN 'mstx' END, 'op'))"
    sn = strs.val("sn", "h.name")
    kind = f"""CASE WHEN {typ} = 'queue' THEN 'queue' WHEN {typ} = 'trace' THEN 'python' WHEN {typ} = 'mstx' THEN 'annotation'
                    WHEN {sn} LIKE 'ProfilerStep#%' THEN 'step'
                    WHEN lower({sn}) LIKE '%dataloader%' THEN 'dataloader' ELSE 'host_op' END"""
    corr = "NULL" if has_cann else f"CASE WHEN h.conn IN (SELECT id FROM {conn}) THEN {_EXT_BASE} + h.rid END"
    cur.execute(
        f"""INSERT INTO {EVENTS_INSERT}
        SELECT $rank, NULL, {kind}, coalesce({sn}, ''), CASE WHEN {typ} = 'op' THEN 'cpu_op' ELSE {typ} END,
               (h.gtid >> 32)::VARCHAR, (h.gtid & 4294967295)::VARCHAR, false, NULL, h.start, greatest(h.end_ - h.start, 0),
               {corr}, {_EXT_BASE} + h.rid, NULL, {strs.val("si", "h.ish")}, {strs.val("sd", "h.idt")}, NULL, {bounded_sql("h.stack", TEXT_MAX)}, $fid
        FROM {host} h LEFT JOIN {api_t} ap ON ap.id = h.type {strs.joins()}
        WHERE h.start IS NOT NULL AND h.end_ IS NOT NULL""",
        {"rank": rank, "fid": fid},
    )
    sn = strs.val("sn", "h.name")
    n, steps = cur.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {sn} LIKE 'ProfilerStep#%') FROM {host} h {strs.joins()} "
        "WHERE h.start IS NOT NULL AND h.end_ IS NOT NULL"
    ).fetchone()
    return n, steps > 0


def _gc_mstx(cur: Any, db: Db, rank: int, fid: int, sid: str) -> int:
    n = 0
    if db.has("GC_RECORD"):
        g = partial(_ci, db, "GC_RECORD", "")
        n += _insert_chunks(
            cur,
            db,
            f"SELECT {g('startNs')}, {g('endNs')}, {g('globalTid')} FROM GC_RECORD",
            [("start", _I64), ("end_", _I64), ("gtid", _I64)],
            f"""INSERT INTO {EVENTS_INSERT} SELECT $rank, NULL, 'python', 'GC', 'GC', (gtid >> 32)::VARCHAR, (gtid & 4294967295)::VARCHAR,
                   false, NULL, start, greatest(end_ - start, 0), NULL, NULL, NULL, NULL, NULL, NULL, NULL, $fid
               FROM _chunk WHERE start IS NOT NULL AND end_ IS NOT NULL""",
            {"rank": rank, "fid": fid},
            "_chunk",
            reads=("GC_RECORD",),
        )
    if db.has("MSTX_EVENTS"):
        m = partial(_ci, db, "MSTX_EVENTS", "")
        n += _insert_chunks(
            cur,
            db,
            f"SELECT {m('startNs')}, {m('endNs')}, {m('message')}, {m('globalTid')}, {m('eventType')} FROM MSTX_EVENTS",
            [("start", _I64), ("end_", _I64), ("msg", _I64), ("gtid", _I64), ("etype", _I64)],
            f"""INSERT INTO {EVENTS_INSERT} SELECT $rank, NULL, 'annotation', coalesce({_name_sql('s.value')}, 'mstx'), 'mstx',
                   (c.gtid >> 32)::VARCHAR, (c.gtid & 4294967295)::VARCHAR, false, NULL, c.start, greatest(c.end_ - c.start, 0),
                   NULL, NULL, NULL, NULL, NULL, NULL, NULL, $fid
               FROM _chunk c LEFT JOIN {sid} s ON s.id = c.msg WHERE c.start IS NOT NULL AND c.end_ IS NOT NULL""",
            {"rank": rank, "fid": fid},
            "_chunk",
            reads=("MSTX_EVENTS",),
        )
    return n


def _memory_freq(cur: Any, db: Db, rank: int, sid: str) -> None:
    if db.has("MEMORY_RECORD"):
        m = partial(_ci, db, "MEMORY_RECORD", "")
        _insert_chunks(
            cur,
            db,
            f"SELECT {m('timestamp', 'timestampNs')}, {m('totalAllocated')}, {m('totalReserved')}, {m('component')}, {m('deviceId')} FROM MEMORY_RECORD",
            [("ts", _I64), ("alloc", _I64), ("res", _I64), ("comp", _I64), ("dev", _I64)],
            f"""INSERT INTO memory SELECT $rank, c.ts, c.alloc, c.res, coalesce(s.value, '?') || coalesce(' NPU:' || c.dev, '')
               FROM _chunk c LEFT JOIN {sid} s ON s.id = c.comp WHERE c.ts IS NOT NULL""",
            {"rank": rank},
            "_chunk",
            reads=("MEMORY_RECORD",),
        )
    # hardware series: AI Core frequency, HBM / LLC bandwidth, NPU memory ...
    insert_db_series(cur, db.safe, rank)


def _steps_from_step_time(cur: Any, db: Db, rank: int, p: str) -> None:
    """STEP_TIME holds each ProfilerStep's host range (format doc §17.2); the windows follow the
    common definition (:func:`advisor.ingest.steps.windows_sql`) over this rank's events."""
    if not db.has("STEP_TIME"):
        return
    s = partial(_ci, db, "STEP_TIME", "")
    rows = db.query(f"SELECT {s('id')}, {s('startNs')}, {s('endNs')} FROM STEP_TIME", ("STEP_TIME",))
    rows = [r for r in rows if None not in r]
    if not rows:
        return
    _settle(cur)
    cur.register("stage_step_time", pa.table({"step": [r[0] for r in rows], "s": [r[1] for r in rows], "e": [r[2] for r in rows]}))
    try:
        marks = f"(SELECT {int(rank)} AS rank, step, s AS host_start_ns, e AS host_end_ns FROM stage_step_time)"
        src = f"(SELECT rank, device, tid, start_ns, dur_ns, corr FROM events WHERE rank = {int(rank)})"
        cur.execute(f"INSERT INTO steps {windows_sql(marks, src)}")
    finally:
        cur.unregister("stage_step_time")


# -- analysis.db / communication_analyzer.db (format doc §17.3) --------------------------------------


def load_analysis_db(cur: Any, path: Path, rank: int) -> dict[str, Any]:
    """CommAnalyzerTime / Bandwidth / Matrix and StepTraceTime (JSON units: ms, MB, GB/s, µs)."""
    db = Db(path)
    stats: dict[str, Any] = {"comm_ops": 0}
    try:
        if not any(
            db.has(t) for t in ("CommAnalyzerTime", "CommAnalyzerBandwidth", "CommAnalyzerMatrix", "StepTraceTime")
        ):
            raise ParseError(path, "; ".join(["no CommAnalyzer* or StepTraceTime table", *db.notes]), code="bad_db")
        # bandwidth first: operator bytes are summed from it before the operators are inserted (no UPDATE)
        bstage, op_bytes = "stage_analysis_bandwidth", "stage_analysis_op_bytes"
        cols = ("op", "grp", "transport", "size", "time", "bw", "lpr", "pkg", "cnt", "tot", "step")
        cur.execute(f"DROP TABLE IF EXISTS {bstage}")
        cur.execute(f"CREATE TEMP TABLE {bstage} ({', '.join(f'{x} VARCHAR' for x in cols)})")
        try:
            if db.has("CommAnalyzerBandwidth"):
                b = partial(_ci, db, "CommAnalyzerBandwidth", "", cast="TEXT")
                _insert_chunks(
                    cur,
                    db,
                    f"""SELECT {b("hccl_op_name")}, {b("group_name")}, {b("transport_type")}, {b("transit_size")}, {b("transit_time")},
                               {b("bandwidth")}, {b("large_packet_ratio")}, {b("package_size")}, {b("count")}, {b("total_duration")},
                               {b("step")} FROM CommAnalyzerBandwidth""",
                    [(x, _STR) for x in cols],
                    f"INSERT INTO {bstage} SELECT * FROM _chunk",
                    {},
                    "_chunk",
                    reads=("CommAnalyzerBandwidth",),
                )
                # per-transport totals repeat on every packet-size row: one row per (op, transport), sizes gathered
                cur.execute(
                    f"""INSERT INTO comm_bandwidth
                    SELECT $rank, {STEP_KEY_SQL.format(k="step")},
                           op, grp, transport, {MB_TO_BYTES.format(x="any_value(size)")}, {MS_TO_NS.format(x="any_value(time)")},
                           TRY_CAST(any_value(bw) AS DOUBLE), TRY_CAST(any_value(lpr) AS DOUBLE),
                           CASE WHEN count(pkg) > 0 THEN to_json(map(list(pkg ORDER BY TRY_CAST(pkg AS DOUBLE)) FILTER (WHERE pkg IS NOT NULL),
                                list([TRY_CAST(cnt AS DOUBLE), TRY_CAST(tot AS DOUBLE)] ORDER BY TRY_CAST(pkg AS DOUBLE)) FILTER (WHERE pkg IS NOT NULL)))::VARCHAR END
                    FROM {bstage} WHERE op IS NOT NULL AND NOT starts_with(lower(op), 'total')
                    GROUP BY op, grp, transport, step""",
                    {"rank": rank},
                )
            if db.has("CommAnalyzerTime"):
                c = partial(_ci, db, "CommAnalyzerTime", "", cast="TEXT")
                f = partial(_ci, db, "CommAnalyzerTime", "", cast="REAL")
                cur.execute(
                    f"""CREATE OR REPLACE TEMP TABLE {op_bytes} AS
                    SELECT op, grp, step,
                        coalesce(sum(s) FILTER (WHERE upper(transport) = 'RDMA'), 0)
                        + greatest(coalesce(sum(s) FILTER (WHERE upper(transport) = 'SDMA'), 0),
                                   coalesce(sum(s) FILTER (WHERE upper(transport) IN ('HCCS', 'PCIE', 'SIO')), 0)) AS b
                    FROM (SELECT DISTINCT op, grp, step, transport, {MB_TO_BYTES.format(x="size")} AS s FROM {bstage}) GROUP BY ALL"""
                )
                stats["comm_ops"] = _insert_chunks(
                    cur,
                    db,
                    f"""SELECT {c("hccl_op_name")}, {c("group_name")}, {f("start_timestamp")}, {f("elapse_time")}, {f("transit_time")},
                               {f("wait_time")}, {f("synchronization_time")}, {f("idle_time")}, {c("step")} FROM CommAnalyzerTime""",
                    [
                        ("op", _STR),
                        ("grp", _STR),
                        ("start", _F64),
                        ("elapse", _F64),
                        ("transit", _F64),
                        ("wait", _F64),
                        ("sync", _F64),
                        ("idle", _F64),
                        ("step", _STR),
                    ],
                    f"""INSERT INTO comm_ops
                    SELECT $rank, {STEP_KEY_SQL.format(k="t.step")}, t.op, {OP_TYPE_SQL.format(n="t.op")}, t.grp,
                           {US_TO_NS.format(x="CAST(t.start AS VARCHAR)")},
                           {MS_TO_NS.format(x="t.elapse")}, {MS_TO_NS.format(x="t.transit")}, {MS_TO_NS.format(x="t.wait")},
                           {MS_TO_NS.format(x="t.sync")}, {MS_TO_NS.format(x="t.idle")}, x.b, NULL
                    FROM _chunk t LEFT JOIN {op_bytes} x ON x.op = t.op AND x.grp IS NOT DISTINCT FROM t.grp
                                                        AND x.step IS NOT DISTINCT FROM t.step
                    WHERE t.op IS NOT NULL AND NOT starts_with(lower(t.op), 'total')""",
                    {"rank": rank},
                    "_chunk",
                    reads=("CommAnalyzerTime",),
                )
        finally:
            cur.execute(f"DROP TABLE IF EXISTS {bstage}")
            cur.execute(f"DROP TABLE IF EXISTS {op_bytes}")
        if db.has("CommAnalyzerMatrix"):
            from advisor.ingest.ascend_text import insert_matrix_stage

            m = partial(_ci, db, "CommAnalyzerMatrix", "", cast="TEXT")
            stage = "stage_analysis_matrix"
            mcols = ("op", "grp", "src", "dst", "transport", "size", "time", "bw", "step")
            cur.execute(f"DROP TABLE IF EXISTS {stage}_raw")
            cur.execute(f"CREATE TEMP TABLE {stage}_raw ({', '.join(f'{x} VARCHAR' for x in mcols)})")
            _insert_chunks(
                cur,
                db,
                f"""SELECT {m("hccl_op_name")}, {m("group_name")}, {m("src_rank")}, {m("dst_rank")}, {m("transport_type")},
                           {m("transit_size")}, {m("transit_time")}, {m("bandwidth")}, {m("step")} FROM CommAnalyzerMatrix""",
                [(x, _STR) for x in mcols],
                f"INSERT INTO {stage}_raw SELECT * FROM _chunk",
                {},
                "_chunk",
                reads=("CommAnalyzerMatrix",),
            )
            cur.execute(
                f"""CREATE TEMP TABLE {stage} AS
                SELECT 0 AS fno, {int(rank)} AS rank, {STEP_KEY_SQL.format(k="step")} AS step, op || coalesce('@' || grp, '') AS name, grp,
                       TRY_CAST(src AS INTEGER) AS src, TRY_CAST(dst AS INTEGER) AS dst, transport,
                       {MB_TO_BYTES.format(x="size")} AS bytes, {MS_TO_NS.format(x="time")} AS transit_ns,
                       TRY_CAST(bw AS DOUBLE) AS bw
                FROM {stage}_raw"""
            )
            cur.execute(f"DROP TABLE IF EXISTS {stage}_raw")
            try:
                stats["matrix"] = insert_matrix_stage(cur, stage).get(0)
            finally:
                cur.execute(f"DROP TABLE IF EXISTS {stage}")
        if db.has("StepTraceTime"):
            s = partial(_ci, db, "StepTraceTime", "", cast="TEXT")
            scols = ("step", "computing", "cno", "ov", "comm", "free", "stage", "bubble", "cnoer", "prep")
            _insert_chunks(
                cur,
                db,
                f"""SELECT {s("step")}, {s("computing")}, {s("communication_not_overlapped")}, {s("overlapped")}, {s("communication")},
                           {s("free")}, {s("stage")}, {s("bubble")}, {s("communication_not_overlapped_and_exclude_receive")},
                           {s("preparing")} FROM StepTraceTime""",
                [(x, _STR) for x in scols],
                f"""INSERT INTO vendor_steps
                SELECT $rank, coalesce(TRY_CAST(TRY_CAST(step AS DOUBLE) AS INTEGER), {STEP_KEY_SQL.format(k="step")}, -1),
                       {", ".join(US_TO_NS.format(x=x) for x in scols[1:])}
                FROM _chunk""",
                {"rank": rank},
                "_chunk",
                reads=("StepTraceTime",),
            )
        stats["notes"] = db.notes
        return stats
    except SqliteRefused as exc:
        raise ParseError(path, str(exc), code="bad_db") from None
    finally:
        db.close()
