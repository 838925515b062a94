"""Ascend text exports (``ASCEND_PROFILER_OUTPUT/*.json|*.csv``) -> canonical tables.

Every file is parsed by DuckDB (``read_json`` / ``read_csv`` / ``read_text`` + ``json_each``) into
a temporary stage table and mapped to the canonical tables in SQL; no Python object is made per
event or per CSV row.

Each loader takes a list of :class:`Job` (the same kind of file from several rank exports) and
runs every statement once for all of them: a statement costs milliseconds to plan whatever its
input, so a cluster is loaded in a few dozen statements rather than a few dozen per rank. Rows
carry the job's ``fno``; joins and windows are partitioned by it. A loader raises when the batch
cannot be read; the caller then retries each job alone, so one bad file only costs its own rank
that file (see :func:`advisor.ingest.ascend_readers.run_jobs`).

References: ``tests/data/ascend/ascend-formats.md`` (format doc), sections given per function.
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import re
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from advisor.ingest.ascend_common import (
    HCCL_DTYPE_BYTES_SQL,
    MB_TO_BYTES,
    MIB_TO_BYTES,
    MS_TO_NS,
    OP_TYPE_SQL,
    STEP_KEY_SQL,
    SYNC_RE,
    US_TO_NS,
    short_error,
    sql_ident,
    sql_str,
)
from advisor.ingest.ascend_counters import insert_text_series
from advisor.ingest.base import (
    NAME_MAX,
    TEXT_MAX,
    ParseError,
    bounded_sql,
    cut_sql,
    duckdb_name,
    duckdb_path,
    insert_rows,
    is_gzip,
    read_head,
)
from advisor.ingest.jsonstream import gunzip_guarded
from advisor.schema import EVENTS_INSERT


@dataclass
class Job:
    """One file to load: its number in the batch, path, rank, profile_files id, per-file switches
    and the event cap (``--max-events``)."""

    fno: int
    path: Path
    rank: int
    fid: int
    flags: dict[str, bool] = field(default_factory=dict)
    max_events: int | None = None


class BatchError(Exception):
    """Some file of a multi-file batch is bad: retry the jobs one by one."""


def _drop(cur: Any, *names: str) -> None:
    """Drop temp tables; never raises (it runs in ``finally`` after an error, maybe in an aborted transaction)."""
    for n in names:
        with contextlib.suppress(Exception):  # the original error is the one to report
            cur.execute(f"DROP TABLE IF EXISTS {n}")


def _files_table(cur: Any, name: str, jobs: list[Job], flags: tuple[str, ...] = ()) -> None:
    """Temp table (fno, filename, rank, fid, <flags>) that every staged row joins to."""
    extra = "".join(f", {f} BOOLEAN" for f in flags)
    cur.execute(f"CREATE TEMP TABLE {name} (fno INTEGER, filename VARCHAR, rank INTEGER, fid INTEGER{extra})")
    insert_rows(cur, name, [(j.fno, duckdb_name(j.path), j.rank, j.fid, *(bool(j.flags.get(f)) for f in flags)) for j in jobs])


def _fail_or_raise(jobs: list[Job], path: Path, message: str, code: str) -> None:
    """A per-file problem: in a batch retry one by one (each file then gets its own ParseError)."""
    if len(jobs) > 1:
        raise BatchError(message)
    raise ParseError(path, message, code=code)


# -- trace_view.json (format doc §5) -------------------------------------------------------------

_TRACE_COLUMNS = (
    "{'ph': 'VARCHAR', 'name': 'VARCHAR', 'cat': 'VARCHAR', 'pid': 'VARCHAR', 'tid': 'VARCHAR', "
    "'ts': 'VARCHAR', 'dur': 'VARCHAR', 'id': 'VARCHAR', 'args': 'JSON'}"
)
# One JSON parse per event: every argument we use, in this order (a[1] .. a[n] below).
_ARG_PATHS = (
    ("meta", "$.name"),
    ("labels", "$.labels"),
    ("task_type", '$."Task Type"'),
    ("stream_id", '$."Stream Id"'),
    ("phys_stream_id", '$."Physic Stream Id"'),
    ("size_b", '$."size(Byte)"'),
    ("transport", '$."transport type"'),
    ("link_type", '$."link type"'),
    ("src_rank", '$."src rank"'),
    ("dst_rank", '$."dst rank"'),
    ("hccl_task_type", '$."task type"'),
    ("data_type", "$.data_type"),
    ("elem_count", "$.count"),
    ("shapes", '$."Input Dims"'),
    ("dtypes", '$."Input type"'),
    ("stack", '$."Call stack"'),
    ("flops", "$.flops"),
    ("mhz", "$.MHz"),
    ("lc_stream_id", '$."stream id"'),
    ("plane_id", '$."plane id"'),
)
# extracted arguments bounded as they are read (the rest are short by nature, or only tested)
_ARG_LIMITS = {"meta": NAME_MAX, "labels": NAME_MAX, "shapes": TEXT_MAX, "dtypes": TEXT_MAX, "stack": TEXT_MAX}

_HOST_PROCS = ("Python", "MindSpore", "CPU OP")
_HOST_CATS = ("cpu_op", "enqueue", "dequeue", "python_function", "user_annotation", "operator")
# HCCL task names as CANN writes them on device lanes (format doc §5.6); 'Memcpy' alone is HCCL's,
# the runtime copy is 'MEMCPY_ASYNC'.
_HW_COMM_RE = (
    r"^(hcom_|Hccl|HCCL|hccl)|^(Notify_Wait|Notify_Record|Notify Wait|Notify Record|Memcpy|Reduce_Inline|"
    r"Inline_Reduce|RDMASend|RDMA_Send|Write_With_Notify|Wait_Notify|Record_Notify)$"
)

_LANE_SQL = f"""CASE
    WHEN l.pname IN {_HOST_PROCS} THEN 'host'
    WHEN l.pname = 'Python GC' THEN 'gc'
    WHEN l.pname = 'CANN' THEN 'cann'
    WHEN l.pname IN ('Ascend Hardware', 'Task Scheduler') THEN 'hw'
    WHEN l.pname IN ('HCCL', 'Communication') THEN 'hccl'
    WHEN l.pname = 'Overlap Analysis' THEN 'overlap'
    WHEN l.pname = 'AI Core Freq' THEN 'freq'
    WHEN l.pname IN ('Scope Layer', 'python', 'python3') THEN 'annot'
    WHEN l.pname IS NULL AND lower(coalesce(t.cat, '')) IN {_HOST_CATS} THEN 'host'
    WHEN l.pname IS NULL AND t.task_type IS NOT NULL THEN 'hw'
    ELSE 'other' END"""

_KIND_SQL = f"""CASE layer
    WHEN 'host' THEN CASE
        WHEN name LIKE 'ProfilerStep#%' THEN 'step'
        WHEN lower(coalesce(cat, '')) IN ('enqueue', 'dequeue') OR name LIKE 'Enqueue%' OR name LIKE 'Dequeue@%' THEN 'queue'
        WHEN lower(name) LIKE '%dataloader%' THEN 'dataloader'
        WHEN lower(coalesce(cat, '')) IN ('python_function', 'python') THEN 'python'
        WHEN lower(coalesce(cat, '')) = 'user_annotation' THEN 'annotation'
        ELSE 'host_op' END
    WHEN 'gc' THEN 'python'
    WHEN 'cann' THEN CASE WHEN regexp_matches(name, {sql_str(SYNC_RE)}) THEN 'sync' ELSE 'runtime' END
    WHEN 'hw' THEN CASE
        WHEN name LIKE 'ProfilerStep#%' THEN 'annotation'
        WHEN upper(coalesce(task_type, '')) IN ('HCCL', 'HCCL_AI_CPU', 'COMMUNICATION') OR regexp_matches(name, {sql_str(_HW_COMM_RE)}) THEN 'comm'
        WHEN upper(name) LIKE 'MEMCPY%' OR upper(coalesce(task_type, '')) LIKE '%MEMCPY%'
             OR upper(coalesce(task_type, '')) IN ('SDMA_SQE', 'PCIE_DMA_SQE') THEN 'memcpy'
        WHEN upper(name) LIKE 'MEMSET%' THEN 'memset'
        WHEN regexp_matches(upper(coalesce(task_type, '')), 'EVENT|NOTIFY|WAIT|RECORD|BARRIER') THEN 'other'
        ELSE 'kernel' END
    WHEN 'hccl' THEN 'comm'
    WHEN 'annot' THEN 'annotation'
    ELSE 'other' END"""

_GROUP_OF_LANE = "NULLIF(regexp_extract({t}, 'Group\\s+(\\S+)\\s+Communication', 1), '')"
_PLANE_OF_LANE = "TRY_CAST(regexp_extract({t}, 'Plane\\s*(\\d+)', 1) AS INTEGER)"

# synthetic ids for host-op -> device links: above every CANN flow id we keep numeric
_EXT_BASE = 1 << 62


#: The trace's stages, named for what they hold: the files, their raw rows, process and thread
#: names, X slices with their lane, flow points, slices where flows end / start, the flow links
#: (HostToDevice, async_npu), the correlation and torch-op ids given to slices, HCCL plane tasks.
_TRACE_STAGES = (
    "stage_trace_files",
    "stage_trace_rows",
    "stage_trace_processes",
    "stage_trace_threads",
    "stage_trace_slices",
    "stage_trace_flows",
    "stage_flow_end_candidates",
    "stage_flow_starts_bound",
    "stage_flow_ends_bound",
    "stage_host_to_device_links",
    "stage_async_npu_links",
    "stage_corr_of_slice",
    "stage_ext_id_of_slice",
    "stage_hccl_plane_tasks",
)


def load_traces(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any]]:
    """Load ``trace_view.json`` files (or MindSpore / msprof timelines of the same format).

    Fills events, tracks, vendor_overlap, comm_tasks, hw_metrics; kernels (flag ``kernels``) and
    comm_ops (flag ``comm_ops``) only for files whose export has no better source
    (kernel_details.csv, communication.json). Returns per-file statistics keyed by ``fno``.
    """
    names = list(_TRACE_STAGES)
    try:
        _stage_trace_rows(cur, jobs, TraceStages(*names))
        return _traces_from_stage(cur, jobs, names, jobs[0].max_events)
    finally:
        _drop(cur, *names)


def _stage_trace_rows(cur: Any, jobs: list[Job], t: TraceStages) -> None:
    """The files table and every trace event of the batch, one row each, its arguments extracted."""
    files, tv = t.files, t.rows
    paths = "[" + ", ".join(sql_str(q) for _, q in _ARG_PATHS) + "]"
    # names (and process / thread names, the 'meta' argument) bounded to NAME_MAX characters,
    # shapes, types and stacks to TEXT_MAX, as the Kineto reader does (base.bounded_sql)
    extracted = ", ".join(
        f"{bounded_sql(f'r.a[{i + 1}]', _ARG_LIMITS[n]) if n in _ARG_LIMITS else f'r.a[{i + 1}]'} AS {n}"
        for i, (n, _) in enumerate(_ARG_PATHS)
    )
    biggest = max(j.path.stat().st_size for j in jobs)
    max_obj = int(min(max(biggest + (1 << 20), 1 << 24), (1 << 32) - 2))
    _files_table(cur, files, jobs, ("kernels", "comm_ops"))
    for j in jobs:  # DuckDB's own gunzip knows no bomb limit: a gzip timeline is measured first
        try:
            if is_gzip(j.path):
                gunzip_guarded(j.path)
        except ValueError as exc:
            _fail_or_raise(jobs, j.path, str(exc), "too_big")
        except (OSError, EOFError, zlib.error) as exc:
            _fail_or_raise(jobs, j.path, f"not a readable gzip file: {short_error(exc)}", "bad_file")
    # --max-events N: the scan stops at N + 1 events a file (a batch: at N + 1 times its files,
    # a sign that one holds more; its files are then read one by one)
    max_events = jobs[0].max_events
    cap = None if max_events is None else (max(max_events, 0) + 1) * len(jobs)
    limit = "" if cap is None else f" LIMIT {cap}"
    try:
        cur.execute(
            f"""CREATE TEMP TABLE {tv} AS
            SELECT f.fno, f.rank, f.fid, f.kernels AS kfb, f.comm_ops AS cfb, r.ph, {bounded_sql("r.name")} AS name, {bounded_sql("r.cat")} AS cat, r.pid, r.tid,
                   {US_TO_NS.format(x="r.ts")} AS ts_ns, {US_TO_NS.format(x="r.dur")} AS dur_ns, r.id, {extracted},
                   CASE WHEN r.ph = 'C' THEN r.args END AS cargs
            FROM (SELECT *, json_extract_string(args, {paths}) AS a
                  FROM (SELECT * FROM read_json($paths, columns={_TRACE_COLUMNS}, format='array',
                                                maximum_object_size={max_obj}, filename=true){limit})) r
            JOIN {files} f ON f.filename = r.filename""",
            {"paths": [duckdb_path(j.path) for j in jobs]},
        )
    except Exception as exc:  # noqa: BLE001 - duckdb or binding error alike: a batch retries file by file
        _fail_or_raise(
            jobs,
            jobs[0].path,
            "not a readable Ascend timeline (JSON array of trace events): " + short_error(exc),
            "bad_file",
        )
    if cap is not None and len(jobs) > 1 and cur.execute(f"SELECT count(*) FROM {tv}").fetchone()[0] >= cap:
        raise BatchError(f"a file holds more than {max_events} events (--max-events {max_events})")


class TraceStages(NamedTuple):
    """The temp tables of one trace batch, in the order of :data:`_TRACE_STAGES`."""

    files: str
    rows: str
    processes: str
    threads: str
    slices: str
    flows: str
    flow_end_candidates: str
    flow_starts_bound: str
    flow_ends_bound: str
    host_to_device: str
    async_npu: str
    corr: str
    ext: str
    plane_tasks: str


def _traces_from_stage(
    cur: Any, jobs: list[Job], names: list[str], max_events: int | None
) -> dict[int, dict[str, Any]]:
    """The staged rows of a trace batch -> canonical tables, step by step; per-file statistics."""
    t = TraceStages(*names)
    stats: dict[int, dict[str, Any]] = {j.fno: {} for j in jobs}
    _check_trace_counts(cur, t, jobs, max_events, stats)
    _stage_slices(cur, t)
    _link_flows(cur, t, stats)
    _insert_trace_events(cur, t, stats)
    _insert_trace_tracks(cur, t)
    _insert_plane_tasks(cur, t)
    _insert_trace_fallbacks(cur, t)
    _device_ids(cur, t, stats)
    return stats


def _check_trace_counts(
    cur: Any, t: TraceStages, jobs: list[Job], max_events: int | None, stats: dict[int, dict[str, Any]]
) -> None:
    """Per file: refuse one without trace events or over ``max_events``; count unusable slices."""
    tv = t.rows
    counts = {
        r[0]: r[1:]
        for r in cur.execute(
            f"""SELECT fno, count(*) FILTER (WHERE ph = 'X' AND (ts_ns IS NULL OR dur_ns IS NULL)),
                       count(*) FILTER (WHERE ph = 'X' AND dur_ns < 0), count(*) FILTER (WHERE ph = 'X'),
                       count(*) FILTER (WHERE ph = 'M'), count(*),
                       count(DISTINCT name) FILTER (WHERE {cut_sql("name")})
                           + count(DISTINCT meta) FILTER (WHERE ph = 'M' AND {cut_sql("meta")})
                FROM {tv} GROUP BY fno"""
        ).fetchall()
    }
    for j in jobs:
        bad, neg, n_x, n_m, n_read, n_cut = counts.get(j.fno, (0, 0, 0, 0, 0, 0))
        if max_events is not None and n_read > max_events:  # every event read counts, as for Kineto
            _fail_or_raise(jobs, j.path, f"more than {max_events} events (--max-events {max_events}): refused", "too_big")
        if n_x == 0 and n_m == 0:
            _fail_or_raise(jobs, j.path, "no trace events (ph 'X' or 'M') in the array", "no_events")
        stats[j.fno].update(bad_events=bad, negative_events=neg, long_names=n_cut)


def _stage_slices(cur: Any, t: TraceStages) -> None:
    """Process and thread names, and the X slices with their lane, layer and kind."""
    tv, lanes, thr, xe = t.rows, t.processes, t.threads, t.slices
    cur.execute(
        f"""CREATE TEMP TABLE {lanes} AS
        SELECT fno, pid, max(meta) FILTER (WHERE name = 'process_name') AS pname,
               max(labels) FILTER (WHERE name = 'process_labels') AS plabels
        FROM {tv} WHERE ph = 'M' GROUP BY fno, pid"""
    )
    cur.execute(
        f"CREATE TEMP TABLE {thr} AS SELECT fno, pid, tid, max(meta) AS tname FROM {tv} WHERE ph = 'M' AND name = 'thread_name' GROUP BY ALL"
    )
    # X events with their lane. HCCL lanes split into operator lanes ('Group <g> Communication')
    # and task lanes ('Plane N'), format doc addendum; a file without operator lanes keeps all as ops.
    cur.execute(
        f"""CREATE TEMP TABLE {xe} AS
        WITH b AS (
            SELECT t.rowid AS rid, t.*, l.pname, l.plabels, h.tname, {_LANE_SQL} AS layer
            FROM {tv} t LEFT JOIN {lanes} l USING (fno, pid) LEFT JOIN {thr} h USING (fno, pid, tid)
            WHERE t.ph = 'X' AND t.ts_ns IS NOT NULL AND t.dur_ns >= 0
        ),
        c AS (SELECT *, coalesce(tname ILIKE '%communication%', false) AS op_lane,
                     fno IN (SELECT fno FROM b WHERE layer = 'hccl' AND tname ILIKE '%communication%') AS has_op_lanes
              FROM b)
        SELECT *, {_KIND_SQL} AS kind, (layer = 'hccl' AND has_op_lanes AND NOT op_lane) AS is_task FROM c"""
    )
    _comm_streams(cur, xe)


def _link_flows(cur: Any, t: TraceStages, stats: dict[int, dict[str, Any]]) -> None:
    """Flow events -> the correlation id and torch-op id of each slice (stages ``corr``, ``ext``)."""
    tv, xe, fl, xi, sb, fb = t.rows, t.slices, t.flows, t.flow_end_candidates, t.flow_starts_bound, t.flow_ends_bound
    h2d, npu, cmap, emap, files = t.host_to_device, t.async_npu, t.corr, t.ext, t.files
    # -- flows: bind 'f' to the event starting at its ts on its thread, 's' to the innermost
    # event enclosing its ts (format doc §5.9); pair them by (cat, id) within a file.
    cur.execute(
        f"""CREATE TEMP TABLE {fl} AS SELECT fno, ph, lower(cat) AS cat, id, pid, tid, ts_ns FROM {tv}
        WHERE ph IN ('s', 'f', 't') AND id IS NOT NULL AND ts_ns IS NOT NULL
          AND lower(coalesce(cat, '')) IN ('hosttodevice', 'acl_to_npu', 'async_npu')"""
    )
    cur.execute(
        f"""CREATE TEMP TABLE {xi} AS
        SELECT fno, pid, tid, ts_ns, arg_min(rid, dur_ns) AS rid, min(dur_ns) AS dur_ns
        FROM {xe} WHERE layer NOT IN ('overlap', 'freq')
          AND (fno, pid, tid) IN (SELECT DISTINCT fno, pid, tid FROM {fl} WHERE ph IN ('f', 't'))
        GROUP BY fno, pid, tid, ts_ns"""
    )
    cur.execute(
        f"""CREATE TEMP TABLE {fb} AS
        SELECT DISTINCT f.fno, f.cat, f.id, x.rid FROM {fl} f JOIN {xi} x USING (fno, pid, tid, ts_ns) WHERE f.ph IN ('f', 't')"""
    )
    _bind_starts(cur, xe, fl, sb)
    cur.execute(
        f"""CREATE TEMP TABLE {h2d} AS
        SELECT s.fno, s.rid AS srid, f.rid AS frid, coalesce(TRY_CAST(s.id AS BIGINT), (hash(s.id) >> 3)::BIGINT) AS flow_id
        FROM {sb} s JOIN {fb} f USING (fno, cat, id) WHERE s.cat IN ('hosttodevice', 'acl_to_npu')"""
    )
    cur.execute(
        f"""CREATE TEMP TABLE {npu} AS
        SELECT DISTINCT s.fno, s.rid AS srid, f.rid AS frid, {_EXT_BASE} + s.rid AS ext
        FROM {sb} s JOIN {fb} f USING (fno, cat, id) WHERE s.cat = 'async_npu'"""
    )
    # corr: one id per launching CANN call, shared by every task it launched (like a CUDA runtime
    # launch and its kernel). Without a HostToDevice link (Level0 drops the CANN layer) the torch
    # op that launched the task lends its own id instead.
    cur.execute(
        f"""CREATE TEMP TABLE {cmap} AS
        WITH g AS (SELECT srid, frid, min(flow_id) OVER (PARTITION BY srid) AS c FROM {h2d}),
        direct AS (SELECT srid AS rid, c FROM g UNION ALL SELECT frid, c FROM g),
        fb_k AS (SELECT frid AS rid, min(ext) AS c FROM {npu} WHERE frid NOT IN (SELECT rid FROM direct) GROUP BY frid),
        fb_o AS (SELECT n.srid AS rid, n.ext AS c FROM {npu} n JOIN fb_k k ON k.rid = n.frid)
        SELECT rid, min(c) AS corr FROM (SELECT * FROM direct UNION ALL SELECT * FROM fb_k UNION ALL SELECT * FROM fb_o)
        GROUP BY rid"""
    )
    # ext_id: the torch op, the tasks it launched and the CANN calls that launched them
    cur.execute(
        f"""CREATE TEMP TABLE {emap} AS
        WITH k AS (SELECT frid AS rid, min(ext) AS ext FROM {npu} GROUP BY frid),
        o AS (SELECT DISTINCT srid AS rid, ext FROM {npu}),
        a AS (SELECT h.srid AS rid, min(k.ext) AS ext FROM {h2d} h JOIN k ON k.rid = h.frid GROUP BY h.srid)
        SELECT rid, min(ext) AS ext FROM (SELECT * FROM k UNION ALL SELECT * FROM o UNION ALL SELECT * FROM a) GROUP BY rid"""
    )
    for fno, n_h2d, n_npu in cur.execute(
        f"""SELECT f.fno, (SELECT count(*) FROM {h2d} h WHERE h.fno = f.fno), (SELECT count(*) FROM {npu} n WHERE n.fno = f.fno)
            FROM {files} f"""
    ).fetchall():
        stats[fno].update(h2d_links=n_h2d, npu_links=n_npu)


def _insert_trace_events(cur: Any, t: TraceStages, stats: dict[int, dict[str, Any]]) -> None:
    """The slices (not Overlap Analysis, frequency or HCCL plane tasks) -> events; counts per file."""
    xe, cmap, emap = t.slices, t.corr, t.ext
    stream = "TRY_CAST(coalesce(x.stream_id, x.phys_stream_id, x.lc_stream_id, regexp_extract(x.tname, 'Stream\\s+(\\d+)', 1)) AS BIGINT)"
    cur.execute(
        f"""INSERT INTO {EVENTS_INSERT}
        SELECT x.rank, NULL, x.kind, coalesce(x.name, ''), coalesce(x.cat, x.pname), x.pid, x.tid,
               x.layer IN ('hw', 'hccl') OR (x.layer = 'other' AND x.plabels LIKE 'NPU%') AS device,
               CASE WHEN x.layer = 'hw' THEN {stream} END AS stream,
               x.ts_ns, x.dur_ns, c.corr, e.ext,
               CASE WHEN x.layer = 'hccl' THEN TRY_CAST(x.elem_count AS BIGINT) * ({HCCL_DTYPE_BYTES_SQL.format(d="x.data_type")})
                    WHEN x.layer = 'hw' AND x.kind = 'comm' THEN TRY_CAST(x.size_b AS BIGINT) END AS bytes,
               replace(x.shapes, chr(13), ''), replace(x.dtypes, chr(13), ''),
               TRY_CAST(x.flops AS DOUBLE),
               regexp_replace(x.stack, ';\\r?\\n?', chr(10), 'g'),
               x.fid
        FROM {xe} x LEFT JOIN {cmap} c ON c.rid = x.rid LEFT JOIN {emap} e ON e.rid = x.rid
        WHERE x.layer NOT IN ('overlap', 'freq') AND NOT x.is_task"""
    )
    for fno, n_ev, n_step, n_comm, n_dev, n_ov in cur.execute(
        f"""SELECT fno, count(*) FILTER (WHERE layer NOT IN ('overlap', 'freq') AND NOT is_task),
                   count(*) FILTER (WHERE kind = 'step'), count(*) FILTER (WHERE kind = 'comm' AND layer NOT IN ('overlap', 'freq')),
                   count(*) FILTER (WHERE layer IN ('hw', 'hccl')), count(*) FILTER (WHERE layer = 'overlap')
            FROM {xe} GROUP BY fno"""
    ).fetchall():
        stats[fno].update(events=n_ev, steps=n_step, comm_events=n_comm, device_events=n_dev, overlap=n_ov)
    for st in stats.values():
        for k in ("events", "steps", "comm_events", "device_events", "overlap"):
            st.setdefault(k, 0)


def _insert_trace_tracks(cur: Any, t: TraceStages) -> None:
    """Every lane -> tracks; the Overlap Analysis lanes -> vendor_overlap; counter lanes -> hw_metrics."""
    xe, thr, files, lanes, tv = t.slices, t.threads, t.files, t.processes, t.rows
    cur.execute(
        f"""INSERT INTO tracks
        SELECT rank, pid, tid, bool_or(dev), max(pname), max(tname) FROM (
            SELECT x.fno, x.rank, x.pid, x.tid, x.layer IN ('hw', 'hccl', 'overlap') OR coalesce(x.plabels, '') LIKE 'NPU%' AS dev,
                   x.pname, x.tname
            FROM {xe} x
            UNION ALL
            SELECT h.fno, f.rank, h.pid, h.tid,
                   l.pname IN ('Ascend Hardware', 'Task Scheduler', 'HCCL', 'Communication', 'Overlap Analysis')
                   OR coalesce(l.plabels, '') LIKE 'NPU%', l.pname, h.tname
            FROM {thr} h JOIN {files} f USING (fno) LEFT JOIN {lanes} l USING (fno, pid)
        ) GROUP BY fno, rank, pid, tid"""
    )
    # -- Overlap Analysis lanes (the vendor's own split, kept for cross-checks; not events)
    cur.execute(
        f"""INSERT INTO vendor_overlap
        SELECT rank, CASE coalesce(NULLIF(name, ''), tname)
                 WHEN 'Computing' THEN 'computing' WHEN 'Communication' THEN 'communication'
                 WHEN 'Communication(Not Overlapped)' THEN 'comm_not_overlapped' WHEN 'Free' THEN 'free'
                 ELSE lower(coalesce(NULLIF(name, ''), tname)) END,
               ts_ns, dur_ns
        FROM {xe} WHERE layer = 'overlap'"""
    )
    # -- hardware series: AI Core frequency, HBM / LLC bandwidth, NPU memory ... (counter lanes)
    insert_text_series(cur, tv, lanes)


def _insert_plane_tasks(cur: Any, t: TraceStages) -> None:
    """HCCL plane tasks -> comm_tasks, each matched to its operator (lane by tid order, then time)."""
    xe, ht = t.slices, t.plane_tasks
    cur.execute(
        f"""CREATE TEMP TABLE {ht} AS
        WITH opl AS (
            SELECT DISTINCT fno, pid, tid, TRY_CAST(tid AS BIGINT) AS t, {_GROUP_OF_LANE.format(t="tname")} AS grp
            FROM {xe} WHERE layer = 'hccl' AND op_lane AND TRY_CAST(tid AS BIGINT) IS NOT NULL
        ),
        ops AS (SELECT rid AS op_rid, fno, pid, tid, ts_ns, dur_ns, name FROM {xe} WHERE layer = 'hccl' AND op_lane),
        tasks AS (SELECT rank, cfb, fno, pid, tid, ts_ns, dur_ns, name, tname, task_type, hccl_task_type, plane_id,
                         src_rank, dst_rank, transport, link_type, size_b, TRY_CAST(tid AS BIGINT) AS t
                  FROM {xe} WHERE is_task),
        tl AS (SELECT tk.*, o.tid AS op_tid, o.grp FROM tasks tk ASOF LEFT JOIN opl o ON tk.fno = o.fno AND tk.pid = o.pid AND tk.t >= o.t)
        SELECT tl.*, CASE WHEN tl.ts_ns <= op.ts_ns + op.dur_ns THEN op.name END AS op_name,
               CASE WHEN tl.ts_ns <= op.ts_ns + op.dur_ns THEN op.op_rid END AS op_rid
        FROM tl ASOF LEFT JOIN ops op ON tl.fno = op.fno AND tl.pid = op.pid AND tl.op_tid = op.tid AND tl.ts_ns >= op.ts_ns"""
    )
    cur.execute(
        f"""INSERT INTO comm_tasks
        SELECT rank, NULL, op_name, grp, coalesce(TRY_CAST(plane_id AS INTEGER), {_PLANE_OF_LANE.format(t="tname")}),
               coalesce(name, ''), coalesce(hccl_task_type, task_type), ts_ns, dur_ns,
               TRY_CAST(src_rank AS INTEGER), TRY_CAST(dst_rank AS INTEGER), transport, link_type,
               coalesce(TRY_CAST(size_b AS BIGINT), 0)
        FROM {ht}"""
    )


def _insert_trace_fallbacks(cur: Any, t: TraceStages) -> None:
    """For files whose export lacks better sources: comm_ops from the HCCL operator lanes (times from
    their master-plane tasks, definitions of the format doc addendum), kernels from the device lane."""
    xe, ht = t.slices, t.plane_tasks
    cur.execute(
        f"""INSERT INTO comm_ops
        WITH t AS (
            SELECT op_rid, name, ts_ns, dur_ns, coalesce(TRY_CAST(size_b AS BIGINT), 0) AS b,
                   coalesce(TRY_CAST(plane_id AS INTEGER), {_PLANE_OF_LANE.format(t="tname")}, 0) AS plane
            FROM {ht} WHERE op_rid IS NOT NULL AND cfb
        ),
        m AS (SELECT op_rid, min(plane) AS plane FROM t GROUP BY op_rid),
        first_x AS (SELECT t.op_rid, min(t.ts_ns) FILTER (WHERE t.b > 0) AS fx FROM t JOIN m USING (op_rid, plane) GROUP BY t.op_rid),
        agg AS (
            SELECT t.op_rid,
                   sum(t.dur_ns) FILTER (WHERE t.b > 0) AS transit,
                   sum(t.dur_ns) FILTER (WHERE t.name ILIKE '%wait%') AS wait,
                   sum(t.dur_ns) FILTER (WHERE t.name ILIKE '%wait%' AND (f.fx IS NULL OR t.ts_ns < f.fx)) AS sync
            FROM t JOIN m USING (op_rid, plane) LEFT JOIN first_x f USING (op_rid) GROUP BY t.op_rid
        ),
        bytes AS (SELECT op_rid, sum(b) AS b FROM t GROUP BY op_rid)
        SELECT x.rank, NULL, x.name, {OP_TYPE_SQL.format(n="x.name")}, {_GROUP_OF_LANE.format(t="x.tname")},
               x.ts_ns, x.dur_ns, a.transit, a.wait, a.sync,
               CASE WHEN a.op_rid IS NOT NULL THEN greatest(x.dur_ns - coalesce(a.transit, 0) - coalesce(a.wait, 0), 0) END,
               coalesce(NULLIF(b.b, 0), TRY_CAST(x.elem_count AS BIGINT) * ({HCCL_DTYPE_BYTES_SQL.format(d="x.data_type")})), NULL
        FROM {xe} x LEFT JOIN agg a ON a.op_rid = x.rid LEFT JOIN bytes b ON b.op_rid = x.rid
        WHERE x.cfb AND x.layer = 'hccl' AND NOT x.is_task"""
    )
    cur.execute(
        f"""INSERT INTO kernels (rank, step, name, core_type, start_ns, dur_ns)
        SELECT rank, NULL, name, NULLIF(upper(task_type), 'OTHER'), ts_ns, dur_ns
        FROM {xe} WHERE kfb AND layer = 'hw' AND kind = 'kernel'"""
    )


def _device_ids(cur: Any, t: TraceStages, stats: dict[int, dict[str, Any]]) -> None:
    """The NPU numbers of each file's process labels ('NPU 3') -> ``stats[fno]['device_ids']``."""
    lanes = t.processes
    for fno, labels in cur.execute(
        f"SELECT fno, list(DISTINCT plabels) FROM {lanes} WHERE plabels LIKE 'NPU %' GROUP BY fno"
    ).fetchall():
        stats[fno]["device_ids"] = sorted(
            {int(m.group(1)) for lab in labels if (m := re.match(r"NPU\s+(\d+)", lab or ""))}
        )


_HW_STREAM_SQL = "TRY_CAST(coalesce(stream_id, phys_stream_id, lc_stream_id, regexp_extract(tname, 'Stream\\s+(\\d+)', 1)) AS BIGINT)"


def _comm_streams(cur: Any, xe: str) -> None:
    """Device tasks of a collective are communication, whatever their task type.

    HCCL runs a collective's tasks on the streams its task lanes name (``stream id``; a task
    typed HCCL marks its stream too). A computing-looking task there (``SDMA``, ``Write Value``,
    an AI Vector reduce) that runs while a communication operator of the same export runs is a
    step of that collective, not computation. A stream shared with computation keeps its kernels:
    a stream runs one task at a time, so none of them falls inside a collective. Synchronisation
    tasks (event record / wait) keep their kind.

    Without communication lanes (profiler level 0 records no HCCL trace, format doc §2.5) a
    stream is HCCL's when it runs HCCL's notify tasks (``Notify Wait`` / ``Notify Record``); the
    tasks there that no compute core runs (``SDMA``, ``Write Value``, ``Reduce Inline`` ...: task
    types of HCCL's own, not ``AI_CORE`` / ``AI_VECTOR_CORE`` / ``MIX_*`` / ``AI_CPU``) are steps
    of a collective too.
    """
    cur.execute(
        f"""UPDATE {xe} SET kind = 'comm'
        WHERE rid IN (
            WITH streams AS (
                SELECT DISTINCT fno, {_HW_STREAM_SQL} AS s FROM {xe}
                WHERE layer = 'hw' AND kind = 'comm' AND regexp_matches(name, '^Notify[ _](Wait|Record)$')
                  AND {_HW_STREAM_SQL} IS NOT NULL
            )
            SELECT rid FROM {xe}
            WHERE layer = 'hw' AND kind IN ('kernel', 'memcpy', 'memset') AND (fno, {_HW_STREAM_SQL}) IN (FROM streams)
              AND NOT regexp_matches(upper(coalesce(task_type, '')), '^(AI_CORE|AI_VECTOR_CORE|AI_CPU|MIX_AI[CV]|AIC|AIV)$')
              AND fno NOT IN (SELECT DISTINCT fno FROM {xe} WHERE layer = 'hccl' AND NOT is_task)
        )"""
    )
    cur.execute(
        f"""UPDATE {xe} SET kind = 'comm'
        WHERE rid IN (
            WITH streams AS (
                SELECT DISTINCT fno, TRY_CAST(lc_stream_id AS BIGINT) AS s FROM {xe}
                WHERE layer = 'hccl' AND TRY_CAST(lc_stream_id AS BIGINT) IS NOT NULL
                UNION
                SELECT DISTINCT fno, {_HW_STREAM_SQL} FROM {xe}
                WHERE layer = 'hw' AND upper(coalesce(task_type, '')) IN ('HCCL', 'HCCL_AI_CPU', 'COMMUNICATION')
                  AND {_HW_STREAM_SQL} IS NOT NULL
            ),
            cand AS (
                SELECT rid, fno, ts_ns FROM {xe}
                WHERE layer = 'hw' AND kind IN ('kernel', 'memcpy', 'memset') AND (fno, {_HW_STREAM_SQL}) IN (FROM streams)
            ),
            ops AS (SELECT fno, ts_ns AS s, ts_ns + dur_ns AS e FROM {xe} WHERE layer = 'hccl' AND NOT is_task)
            SELECT DISTINCT c.rid FROM cand c JOIN ops o ON o.fno = c.fno AND c.ts_ns >= o.s AND c.ts_ns < o.e
        )"""
    )


def _bind_starts(cur: Any, xe: str, fl: str, sb: str) -> None:
    """Bind each flow start to the innermost slice enclosing it on its thread.

    Host slices on one thread are properly nested, so at time t exactly one slice is active
    per nesting level 0..D(t)-1, where D(t) = #starts <= t - #ends < t; the innermost one is
    the latest slice of level D(t)-1 starting at or before t. Two ASOF joins, no range join.
    Keys are doubled so that a slice ending exactly at t still counts as enclosing t.
    """
    nest, dk, lv = "stage_nesting_slices", "stage_nesting_depth", "stage_nesting_levels"
    try:
        cur.execute(
            f"""CREATE TEMP TABLE {nest} AS
            SELECT fno, rid, pid, tid, ts_ns, dur_ns FROM {xe}
            WHERE layer NOT IN ('overlap', 'freq') AND dur_ns > 0
              AND (fno, pid, tid) IN (SELECT DISTINCT fno, pid, tid FROM {fl} WHERE ph = 's')"""
        )
        cur.execute(
            f"""CREATE TEMP TABLE {dk} AS
            WITH pts AS (SELECT fno, pid, tid, 2 * ts_ns AS k, 1 AS d FROM {nest}
                         UNION ALL SELECT fno, pid, tid, 2 * (ts_ns + dur_ns) + 1, -1 FROM {nest}),
            g AS (SELECT fno, pid, tid, k, sum(d) AS d FROM pts GROUP BY ALL)
            SELECT fno, pid, tid, k, sum(d) OVER (PARTITION BY fno, pid, tid ORDER BY k ROWS UNBOUNDED PRECEDING) AS depth FROM g"""
        )
        cur.execute(
            f"""CREATE TEMP TABLE {lv} AS
            SELECT n.fno, n.rid, n.pid, n.tid, n.ts_ns, n.dur_ns,
                   coalesce(b.depth, 0) + row_number() OVER (PARTITION BY n.fno, n.pid, n.tid, n.ts_ns ORDER BY n.dur_ns DESC, n.rid) - 1 AS level
            FROM (SELECT *, 2 * ts_ns - 1 AS k FROM {nest}) n
            ASOF LEFT JOIN {dk} b ON n.fno = b.fno AND n.pid = b.pid AND n.tid = b.tid AND n.k >= b.k"""
        )
        cur.execute(
            f"""CREATE TEMP TABLE {sb} AS
            WITH s AS (
                SELECT f.fno, f.cat, f.id, f.pid, f.tid, f.ts_ns, coalesce(d.depth, 0) - 1 AS level
                FROM (SELECT *, 2 * ts_ns AS k FROM {fl} WHERE ph = 's') f
                ASOF LEFT JOIN {dk} d ON f.fno = d.fno AND f.pid = d.pid AND f.tid = d.tid AND f.k >= d.k
            )
            SELECT DISTINCT s.fno, s.cat, s.id, x.rid FROM (SELECT * FROM s WHERE level >= 0) s
            ASOF JOIN {lv} x ON s.fno = x.fno AND s.pid = x.pid AND s.tid = x.tid AND s.level = x.level AND s.ts_ns >= x.ts_ns
            WHERE s.ts_ns <= x.ts_ns + x.dur_ns"""
        )
    finally:
        _drop(cur, nest, dk, lv)


# -- CSV helpers (format doc §3.3, §22.6) ----------------------------------------------------------

_CSV_OPTS = (
    "all_varchar=true, header=true, quote='\"', escape='\"', null_padding=true, strict_mode=false, parallel=false, "
    "ignore_errors=true, auto_detect=true, nullstr=['N/A', ''], filename=true"
)


def _norm(h: str) -> str:
    return re.sub(r"\s+", " ", h.replace("\ufeff", "").strip().strip('"').strip()).lower()


def _header(path: Path) -> tuple[str, bytes]:
    """(delimiter, header line) sniffed from the first line: ',' unless only tabs or ';' separate it."""
    line = read_head(path, 65536).split(b"\n", 1)[0].rstrip(b"\r")
    outside = re.sub(rb'"[^"]*"', b"", line)
    delim = ","
    if outside.count(b",") == 0:
        if outside.count(b"\t") > 0:
            delim = "\t"
        elif outside.count(b";") > 0:
            delim = ";"
    return delim, line


#: Columns a CSV of an export may have: the widest export has under a hundred (kernel_details.csv
#: with every PMU metric). A wider header is not an export's, and each column costs a term in the
#: statements that read it (the FLOPs sum is one expression over every ``*_fops`` column).
MAX_CSV_COLUMNS = 512
_HEADER_MAX_BYTES = 65536


def _width_problem(path: Path, delim: str) -> str | None:
    """Why the header of ``path`` is too wide to read (None when it is not)."""
    head = read_head(path, _HEADER_MAX_BYTES)
    if b"\n" not in head and len(head) >= _HEADER_MAX_BYTES:
        return f"its header line is longer than {_HEADER_MAX_BYTES // 1024} KiB: not an export's CSV; skipped"
    line = head.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    n = max((len(r) for r in csv.reader([line], delimiter=delim)), default=0)
    if n > MAX_CSV_COLUMNS:
        return f"{n} columns in its header, more than the {MAX_CSV_COLUMNS} read: not an export's CSV; skipped"
    return None


def csv_groups(
    cur: Any,
    jobs: list[Job],
    stage: str,
    fn: Callable[[dict[str, str], list[Job]], None],
    flags: tuple[str, ...] = (),
) -> None:
    """Read CSVs into the temp table ``stage``, one distinct (delimiter, header) at a time, and run
    ``fn({normalised header: column}, jobs)`` while it holds that group's rows.

    Every cell is VARCHAR; 'N/A' and '' are NULL. The table carries ``fno``, ``rank``, ``fid`` and
    the flags. Tolerates CRLF, rows with missing or extra cells, quoted cells, a tab or ';'
    delimiter.
    """
    groups: dict[tuple[str, bytes], list[Job]] = defaultdict(list)
    for j in jobs:
        try:
            if j.path.stat().st_size == 0:
                _fail_or_raise(jobs, j.path, "empty file; skipped", "empty_file")
            key = _header(j.path)
            if problem := _width_problem(j.path, key[0]):
                _fail_or_raise(jobs, j.path, problem, "too_wide")
        except OSError as exc:
            _fail_or_raise(jobs, j.path, f"cannot read: {exc.strerror or exc}", "unreadable")
        groups[key].append(j)
    files = f"{stage}_files"
    for (delim, _line), gjobs in groups.items():
        _drop(cur, stage, files)
        _files_table(cur, files, gjobs, flags)
        try:
            cur.execute(
                f"""CREATE TEMP TABLE {stage} AS
                SELECT f.fno, f.rank, f.fid{"".join(f", f.{x}" for x in flags)}, r.* EXCLUDE (filename)
                FROM read_csv($paths, delim={sql_str(delim)}, {_CSV_OPTS}) r JOIN {files} f ON f.filename = r.filename""",
                {"paths": [duckdb_path(j.path) for j in gjobs]},
            )
        except Exception as exc:  # noqa: BLE001 - duckdb or binding error alike: a batch retries file by file
            _drop(cur, files)
            _fail_or_raise(jobs, gjobs[0].path, "not a readable CSV file: " + short_error(exc), "bad_csv")
        _drop(cur, files)
        try:
            _check_rows(cur, stage, gjobs, delim)
            skip = {"fno", "rank", "fid", *flags}
            cols: dict[str, str] = {}
            for (c,) in cur.execute(f"SELECT column_name FROM (DESCRIBE {stage})").fetchall():
                if c not in skip:
                    cols.setdefault(_norm(c), c)
            fn(cols, gjobs)
        finally:
            _drop(cur, stage)


_ROW_CHECK_MAX_BYTES = 64 << 20


def _check_rows(cur: Any, table: str, jobs: list[Job], delim: str) -> None:
    """Header-only files fail; rows with missing or extra cells are named in a warning.

    The cell count of every row is checked with Python's csv module (quotes and embedded
    newlines handled), for files up to 64 MiB; DuckDB itself pads or skips such rows silently.
    """
    import csv

    counts = dict(cur.execute(f"SELECT fno, count(*) FROM {table} GROUP BY fno").fetchall())
    for j in jobs:
        if counts.get(j.fno, 0) == 0:
            _fail_or_raise(jobs, j.path, "no data rows (header only)", "empty_file")
        try:
            if j.path.stat().st_size > _ROW_CHECK_MAX_BYTES:
                continue
            with j.path.open(encoding="utf-8", errors="replace", newline="") as fh:
                # NULs dropped: Python 3.10's csv.reader raises on them ("line contains NUL"), 3.11+ reads them
                rows = csv.reader((line.replace("\0", "") for line in fh), delimiter=delim)
                width = len(next(rows, []))
                bad = sum(1 for r in rows if r and len(r) != width)
        except (OSError, csv.Error):
            continue
        warn = WARN.get()
        if bad and warn is not None:
            warn("ragged_rows", f"{bad} rows have missing or extra cells; the cells that could be placed were read", j.path)


#: set by the Ascend loader to its LoadContext.warn for the duration of a load (per thread)
WARN: contextvars.ContextVar[Any] = contextvars.ContextVar("ascend_text_warn", default=None)


def col(cols: dict[str, str], *names: str) -> str | None:
    """The actual column for the first of ``names`` (normalised) that exists."""
    for n in names:
        c = cols.get(_norm(n))
        if c is not None:
            return c
    return None


def clean(c: str | None) -> str:
    """SQL for a text cell ('N/A' and '' are already NULL: read with ``nullstr``)."""
    if c is None:
        return "NULL"
    return f"NULLIF(trim({sql_ident(c)}), '')"


def unquote(c: str | None) -> str:
    """Like :func:`clean` and strip one pair of surrounding double quotes (shapes: '"4,1025"')."""
    if c is None:
        return "NULL"
    return f"regexp_replace(trim({sql_ident(c)}), '^\"(.*)\"$', '\\1')"


def num(c: str | None, sql_type: str = "DOUBLE") -> str:
    """SQL for a numeric cell (blanks tolerated, non-numeric -> NULL)."""
    if c is None:
        return "NULL"
    return f"TRY_CAST({sql_ident(c)} AS {sql_type})"


def us_ns(c: str | None) -> str:
    """SQL: µs decimal text cell -> integer ns (exact)."""
    if c is None:
        return "NULL"
    return US_TO_NS.format(x=sql_ident(c))


def require(cols: dict[str, str], jobs: list[Job], **needed: tuple[str, ...]) -> dict[str, str]:
    """Resolve columns; a file lacking one is a ParseError naming the missing ones."""
    out: dict[str, str] = {}
    missing = []
    for key, names in needed.items():
        c = col(cols, *names)
        if c is None:
            missing.append(names[0])
        else:
            out[key] = c
    if missing:
        _fail_or_raise(jobs, jobs[0].path, f"missing column(s) {', '.join(missing)}", "bad_csv")
    return out


def _per_fno(cur: Any, sql: str) -> dict[int, tuple[Any, ...]]:
    return {r[0]: tuple(r[1:]) for r in cur.execute(sql).fetchall()}


# -- kernel_details.csv (format doc §6) -----------------------------------------------------------

_KD_BASE = {
    "step": ("Step Id", "Step ID"),
    "device": ("Device_id", "Device id"),
    "model": ("Model ID", "Model Id"),
    "task_id": ("Task ID", "Task Id"),
    "stream": ("Stream ID", "Stream Id"),
    "name": ("Name", "Op Name"),
    "type": ("Type", "OP Type", "Op Type"),
    "core": ("Accelerator Core", "Task Type"),
    "start": ("Start Time(us)", "Task Start Time(us)"),
    "dur": ("Duration(us)", "Task Duration(us)"),
    "wait": ("Wait Time(us)", "Task Wait Time(us)"),
    "block": ("Block Dim", "Block Num"),
    "mix_block": ("Mix Block Dim", "Mix Block Num"),
    "in_shapes": ("Input Shapes",),
    "in_dtypes": ("Input Data Types",),
    "in_formats": ("Input Formats",),
    "out_shapes": ("Output Shapes",),
    "out_dtypes": ("Output Data Types",),
    "out_formats": ("Output Formats",),
    "context": ("Context ID", "Context Id"),
    "hf32": ("HF32 Eligible",),
    "op_state": ("OP State", "Op State"),
    "model_name": ("Model Name",),
    "task_state": ("Task State",),
    "mix_block_num": ("Mix Block Num",),
}
_AUTO_COL = re.compile(r"^column\d+$")


def load_kernel_details(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any]]:
    """Load ``kernel_details.csv`` files (also msprof ``op_summary_*.csv``) into ``kernels``.

    Unknown columns are PMU metrics (format doc §6.1: do not hard-code the set) and go into the
    ``pmu`` JSON object. Flag ``events`` (no timeline in that export): the rows also become device
    events so a breakdown exists. Flag ``comm_ops`` (no timeline, no communication.json): the
    HCCL rows become communication operators (times only).
    """
    stats: dict[int, dict[str, Any]] = {}
    csv_groups(
        cur,
        jobs,
        "stage_kernel_details_csv",
        lambda cols, gjobs: stats.update(_kernel_group(cur, "stage_kernel_details_csv", cols, gjobs)),
        ("events", "comm_ops"),
    )
    return stats


def _kernel_group(cur: Any, stage: str, cols: dict[str, str], jobs: list[Job]) -> dict[int, dict[str, Any]]:
    typed = "stage_kernel_rows"  # the cells typed
    req = require(cols, jobs, name=_KD_BASE["name"], start=_KD_BASE["start"], dur=_KD_BASE["dur"])
    c = {k: col(cols, *v) for k, v in _KD_BASE.items()}
    c.update(req)
    base_actual = {v for v in c.values() if v is not None}
    pmu_cols = [a for n, a in cols.items() if a not in base_actual and not _AUTO_COL.match(a) and n]
    pmu_vals = [f"{num(a)} AS {sql_ident('pmu:' + a)}" for a in pmu_cols]
    try:
        # one typed stage: every cell expression is bound once per batch (binding cost dominates small files)
        cur.execute(
            f"""CREATE TEMP TABLE {typed} AS
            SELECT fno, rank, fid, events AS ev, comm_ops AS crow,
                   {num(c["step"], "INTEGER")} AS step, {clean(c["name"])} AS name, {clean(c["type"])} AS op_type,
                   upper({clean(c["core"])}) AS core, {us_ns(c["start"])} AS start_ns, {us_ns(c["dur"])} AS dur_ns,
                   {us_ns(c["wait"])} AS wait_ns, {num(c["block"], "INTEGER")} AS block, {num(c["mix_block"], "INTEGER")} AS mix_block,
                   {unquote(c["in_shapes"])} AS in_shapes, {clean(c["in_dtypes"])} AS in_dtypes, {clean(c["in_formats"])} AS in_formats,
                   {unquote(c["out_shapes"])} AS out_shapes, {clean(c["out_dtypes"])} AS out_dtypes,
                   {clean(c["out_formats"])} AS out_formats, {num(c["stream"], "BIGINT")} AS stream,
                   {num(c["device"], "INTEGER")} AS device{"".join(", " + v for v in pmu_vals)}
            FROM {stage}"""
        )
        if pmu_cols:
            refs = [sql_ident("pmu:" + a) for a in pmu_cols]
            pairs = ", ".join(f"{sql_str(a.strip())}, {r}" for a, r in zip(pmu_cols, refs, strict=True))
            pmu = f"CASE WHEN coalesce({', '.join(refs)}) IS NOT NULL THEN json_object({pairs})::VARCHAR END"
            fops = [r for a, r in zip(pmu_cols, refs, strict=True) if a.strip().lower().endswith("_fops")]
            flops = (
                (
                    f"CASE WHEN coalesce({', '.join(fops)}) IS NOT NULL THEN "
                    + " + ".join(f"coalesce({r}, 0)" for r in fops)
                    + " END"
                )
                if fops
                else "NULL"
            )
        else:
            pmu, flops = "NULL", "NULL"
        ok = "start_ns IS NOT NULL AND dur_ns >= 0"
        cur.execute(
            f"""INSERT INTO kernels
            SELECT rank, step, name, op_type, core, start_ns, dur_ns, wait_ns, block, mix_block, in_shapes, in_dtypes,
                   in_formats, out_shapes, out_dtypes, out_formats, {flops}, NULL, {pmu}, NULL
            FROM {typed} WHERE {ok}"""
        )
        cur.execute(
            f"""INSERT INTO comm_ops (rank, step, name, op_type, group_name, start_ns, dur_ns)
            SELECT rank, step, name, {OP_TYPE_SQL.format(n="name")},
                   NULLIF(regexp_extract(name, '^hcom_[A-Za-z]+__(\\d+)_', 1), ''), start_ns, dur_ns
            FROM {typed} WHERE crow AND core = 'HCCL' AND {ok}"""
        )
        cur.execute(
            f"""INSERT INTO {EVENTS_INSERT}
            SELECT rank, NULL,
                   CASE WHEN core = 'HCCL' OR starts_with(name, 'hcom_') THEN 'comm'
                        WHEN core LIKE '%MEMCPY%' OR upper(name) LIKE 'MEMCPY%' THEN 'memcpy'
                        WHEN core = 'INVALID' THEN 'other'
                        ELSE 'kernel' END,
                   coalesce(name, ''), coalesce(core, 'kernel_details'), 'kernel_details',
                   CASE WHEN stream IS NOT NULL THEN 'Stream ' || stream ELSE coalesce(core, 'device') END,
                   true, stream, start_ns, dur_ns, NULL, NULL, NULL, in_shapes, in_dtypes, NULL, NULL, fid
            FROM {typed} WHERE ev AND {ok}"""
        )
        per = _per_fno(
            cur,
            f"""SELECT fno, count(*) FILTER (WHERE NOT ({ok}) OR start_ns IS NULL OR dur_ns IS NULL),
                       count(*) FILTER (WHERE {ok}), count(*) FILTER (WHERE core = 'HCCL'), count(step),
                       list(DISTINCT device) FILTER (WHERE device IS NOT NULL), bool_or(ev)
                FROM {typed} GROUP BY fno""",
        )
    finally:
        _drop(cur, typed)
    out = {}
    for j in jobs:
        bad, good, n_hccl, n_steps, devices, ev = per.get(j.fno, (0, 0, 0, 0, [], False))
        out[j.fno] = {
            "rows": good,
            "bad_rows": bad,
            "events": good if ev else 0,
            "device_ids": sorted(devices or [])[:8],
            "has_steps": n_steps > 0,
            "pmu_columns": len(pmu_cols),
            "hccl_rows": n_hccl,
        }
    return out


# -- step_trace_time.csv, op_statistic.csv, memory files (format doc §7, §11-§13) ------------------


def _simple_csv(cur: Any, jobs: list[Job], stage: str, insert: Any) -> dict[int, dict[str, Any]]:
    """Read CSV groups into ``stage`` and run ``insert(stage, cols, jobs)`` for each; per-file row counts."""
    out: dict[int, dict[str, Any]] = {}

    def one(cols: dict[str, str], gjobs: list[Job]) -> None:
        insert(stage, cols, gjobs)
        per = _per_fno(cur, f"SELECT fno, count(*) FROM {stage} GROUP BY fno")
        out.update({j.fno: {"rows": per.get(j.fno, (0,))[0]} for j in gjobs})

    csv_groups(cur, jobs, stage, one)
    return out


def load_step_traces(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any]]:
    """``step_trace_time.csv`` -> ``vendor_steps`` (µs -> ns; empty Step -> NO_STEP)."""

    def insert(stage: str, cols: dict[str, str], gjobs: list[Job]) -> None:
        req = require(cols, gjobs, computing=("Computing",), free=("Free",))
        f = {
            k: col(cols, n)
            for k, n in (
                ("cno", "Communication(Not Overlapped)"),
                ("ov", "Overlapped"),
                ("comm", "Communication"),
                ("stage", "Stage"),
                ("bubble", "Bubble"),
                ("cnoer", "Communication(Not Overlapped and Exclude Receive)"),
                ("prep", "Preparing"),
            )
        }
        cur.execute(
            f"""INSERT INTO vendor_steps
            SELECT rank, coalesce({num(col(cols, "Step"), "INTEGER")}, -1), {us_ns(req["computing"])}, {us_ns(f["cno"])},
                   {us_ns(f["ov"])}, {us_ns(f["comm"])}, {us_ns(req["free"])}, {us_ns(f["stage"])},
                   {us_ns(f["bubble"])}, {us_ns(f["cnoer"])}, {us_ns(f["prep"])}
            FROM {stage} WHERE {num(req["computing"])} IS NOT NULL OR {num(req["free"])} IS NOT NULL"""
        )

    return _simple_csv(cur, jobs, "stage_step_trace_csv", insert)


def load_op_statistics(cur: Any, jobs: list[Job], source: str) -> dict[int, dict[str, Any]]:
    """``op_statistic.csv`` (or ``api_statistic.csv``) -> ``vendor_op_stats``."""

    def insert(stage: str, cols: dict[str, str], gjobs: list[Job]) -> None:
        req = require(cols, gjobs, op=("OP Type", "Op Type", "API Name", "Name", "Type"), count=("Count",))
        core = col(cols, "Core Type", "Level", "Accelerator Core")
        total = col(cols, "Total Time(us)", "Time(us)")
        mn, avg, mx = (
            col(cols, "Min Time(us)", "Min(us)"),
            col(cols, "Avg Time(us)", "Avg(us)"),
            col(cols, "Max Time(us)", "Max(us)"),
        )
        cur.execute(
            f"""INSERT INTO vendor_op_stats
            SELECT rank, {sql_str(source)}, {clean(req["op"])}, {clean(core)}, {num(req["count"], "BIGINT")},
                   {us_ns(total)}, {us_ns(mn)}, {us_ns(avg)}, {us_ns(mx)}, {num(col(cols, "Ratio(%)"))} / 100.0
            FROM {stage} WHERE {clean(req["op"])} IS NOT NULL"""
        )

    return _simple_csv(cur, jobs, f"stage_{source}_csv", insert)


def load_memory_records(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any]]:
    """``memory_record.csv`` -> ``memory`` (MiB -> bytes; APP rows hold raw KB, format doc §13.1)."""

    def insert(stage: str, cols: dict[str, str], gjobs: list[Job]) -> None:
        req = require(cols, gjobs, comp=("Component",), ts=("Timestamp(us)",))
        comp = clean(req["comp"])

        def to_bytes(c: str | None) -> str:
            if c is None:
                return "NULL"
            kb = f"TRY_CAST(round({num(c)} * 1024) AS BIGINT)"
            return f"CASE WHEN {comp} = 'APP' THEN {kb} ELSE {MIB_TO_BYTES.format(x=num(c))} END"

        cur.execute(
            f"""INSERT INTO memory
            SELECT rank, {us_ns(req["ts"])}, {to_bytes(col(cols, "Total Allocated(MB)"))}, {to_bytes(col(cols, "Total Reserved(MB)"))},
                   {comp} || coalesce(' ' || {clean(col(cols, "Device Type", "Device"))}, '')
            FROM {stage} WHERE {us_ns(req["ts"])} IS NOT NULL"""
        )

    return _simple_csv(cur, jobs, "stage_memory_record_csv", insert)


def load_module_mems(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any]]:
    """``npu_module_mem.csv`` -> ``memory`` rows with component ``module:<name>`` (reserved only)."""

    def insert(stage: str, cols: dict[str, str], gjobs: list[Job]) -> None:
        req = require(cols, gjobs, comp=("Component",), ts=("Timestamp(us)",))
        res, res_kb = col(cols, "Total Reserved(MB)"), col(cols, "Total Reserved(KB)")
        reserved = (
            MIB_TO_BYTES.format(x=num(res))
            if res
            else (f"TRY_CAST(round({num(res_kb)} * 1024) AS BIGINT)" if res_kb else "NULL")
        )
        cur.execute(
            f"""INSERT INTO memory
            SELECT rank, {us_ns(req["ts"])}, NULL, {reserved}, 'module:' || coalesce({clean(req["comp"])}, '?')
            FROM {stage} WHERE {us_ns(req["ts"])} IS NOT NULL"""
        )

    return _simple_csv(cur, jobs, "stage_module_mem_csv", insert)


def load_minddata(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any]]:
    """MindSpore ``minddata_pipeline_raw_{id}.csv`` -> ``queues`` (format doc §20; column meanings [U]).

    Each dataset-pipeline op lists its output-queue size samples (``output_queue_size``, a list
    sampled every ``sample_interval`` ms). The root op (no parent: the device-queue op that feeds
    the NPU) is Hermes' *host* queue; its children, the last pipeline stage, are the *data* queue.
    The file has no absolute clock: ``ts_ns`` counts from the first sample.
    """

    def insert(stage: str, cols: dict[str, str], gjobs: list[Job]) -> None:
        req = require(cols, gjobs, op=("op_id",), sizes=("output_queue_size",))
        parent, interval = col(cols, "parent_id"), col(cols, "sample_interval")
        cur.execute(
            f"""INSERT INTO queues
            WITH ops AS (
                SELECT rank, fno, {num(req['op'], 'BIGINT')} AS op_id, {num(parent, 'BIGINT')} AS parent_id,
                       coalesce({num(interval)}, 1.0) AS interval_ms,
                       TRY_CAST(replace(replace({clean(req['sizes'])}, '(', '['), ')', ']') AS BIGINT[]) AS sizes
                FROM {stage}
            ),
            roots AS (SELECT fno, op_id FROM ops WHERE parent_id IS NULL OR parent_id < 0),
            q AS (
                SELECT o.*, CASE WHEN o.op_id IN (SELECT op_id FROM roots r WHERE r.fno = o.fno) THEN 'host'
                                 WHEN o.parent_id IN (SELECT op_id FROM roots r WHERE r.fno = o.fno) THEN 'data' END AS queue
                FROM ops o
            )
            SELECT q.rank, q.queue, TRY_CAST(round((u.i - 1) * q.interval_ms * 1e6) AS BIGINT), u.size, NULL
            FROM q, unnest(q.sizes) WITH ORDINALITY AS u(size, i)
            WHERE q.queue IS NOT NULL"""
        )

    return _simple_csv(cur, jobs, "stage_minddata_csv", insert)


# -- communication.json / communication_matrix.json (format doc §8, §9) --------------------------

_TIME_INFO = '"Communication Time Info"'
_BW_INFO = '"Communication Bandwidth Info"'
_B_BYTES = MB_TO_BYTES.format(x="b.value->>'$.\"Transit Size(MB)\"'")
_B_TIME = MS_TO_NS.format(x="b.value->>'$.\"Transit Time(ms)\"'")
_L_BYTES = MB_TO_BYTES.format(x="l.value->>'$.\"Transit Size(MB)\"'")
_L_TIME = MS_TO_NS.format(x="l.value->>'$.\"Transit Time(ms)\"'")
_OP_NAME = "CASE WHEN strpos(op_key, '@') > 0 THEN regexp_extract(op_key, '^(.*)@[^@]*$', 1) ELSE op_key END"
_OP_GROUP = "CASE WHEN strpos(op_key, '@') > 0 THEN regexp_extract(op_key, '@([^@]*)$', 1) END"


def _stage_ops(cur: Any, jobs: list[Job], stage: str) -> dict[int, ParseError]:
    """Flatten communication JSON files into ``stage(fno, rank, step_key, kind, op_key, v)``.

    Step-split files (torch_npu / MindSpore): {stepN: {p2p|collective: {op@group: ...}}}; CANN's
    own flat file: {op@group: ...}. Keys starting with 'Total' are aggregates and skipped. A file
    that is not a JSON object is reported in the returned {fno: ParseError}; the others load.
    """
    files, doc = f"{stage}_files", f"{stage}_doc"
    _files_table(cur, files, jobs)
    try:
        try:
            cur.execute(
                f"""CREATE TEMP TABLE {doc} AS
                SELECT f.fno, f.rank, CASE WHEN json_valid(r.content) THEN r.content::JSON END AS j
                FROM read_text($paths) r JOIN {files} f ON f.filename = r.filename""",
                {"paths": [duckdb_path(j.path) for j in jobs]},
            )
        except Exception as exc:  # noqa: BLE001 - duckdb or binding error alike: a batch retries file by file
            _fail_or_raise(jobs, jobs[0].path, "cannot read: " + short_error(exc), "unreadable")
        errors: dict[int, ParseError] = {}
        kinds = dict(cur.execute(f"SELECT fno, coalesce(json_type(j), 'INVALID') FROM {doc}").fetchall())
        by_fno = {j.fno: j for j in jobs}
        for fno, t in kinds.items():
            if t != "OBJECT":
                errors[fno] = ParseError(
                    by_fno[fno].path, "not valid JSON" if t == "INVALID" else "not a JSON object", "bad_json"
                )
        cur.execute(
            f"""CREATE TEMP TABLE {stage} AS
            WITH d AS (SELECT fno, rank, j, len(list_filter(json_keys(j), lambda k: regexp_matches(k, '(?i)^step\\d*$'))) > 0 AS nested
                       FROM {doc} WHERE json_type(j) = 'OBJECT'),
            st AS (SELECT d.fno, d.rank, s.key AS step_key, s.value AS v FROM d, json_each(d.j) s
                   WHERE d.nested AND json_type(s.value) = 'OBJECT'),
            ty AS (SELECT st.fno, st.rank, st.step_key, t.key AS kind, t.value AS v FROM st, json_each(st.v) t WHERE json_type(t.value) = 'OBJECT'),
            nested AS (SELECT ty.fno, ty.rank, ty.step_key, ty.kind, o.key AS op_key, o.value AS v FROM ty, json_each(ty.v) o),
            flat AS (SELECT d.fno, d.rank, NULL::VARCHAR AS step_key, NULL::VARCHAR AS kind, o.key AS op_key, o.value AS v
                     FROM d, json_each(d.j) o WHERE NOT d.nested)
            SELECT * FROM (SELECT * FROM nested UNION ALL SELECT * FROM flat)
            WHERE NOT starts_with(lower(op_key), 'total') AND json_type(v) = 'OBJECT'"""
        )
        return errors
    finally:
        _drop(cur, files, doc)


def load_communications(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any] | ParseError]:
    """``communication.json`` -> ``comm_ops`` and ``comm_bandwidth`` (ms/MB/GB/s -> ns/bytes).

    Operator bytes: the transports CANN lists are HCCS, PCIE, SIO (intra-node links), RDMA and
    SDMA, where SDMA is the intra-node aggregate; an operator moves RDMA + max(SDMA, HCCS + PCIE + SIO).
    """
    ops, bw = "stage_comm_ops", "stage_comm_transports"
    try:
        errors = _stage_ops(cur, jobs, ops)
        ti: Callable[[str], str] = lambda k: f"v->>'$.{_TIME_INFO}.\"{k}\"'"
        cur.execute(
            f"""CREATE TEMP TABLE {bw} AS
            SELECT o.fno, o.rank, o.step_key, o.op_key, b.key AS transport, {_B_BYTES} AS bytes, {_B_TIME} AS transit_ns,
                   TRY_CAST(b.value->>'$."Bandwidth(GB/s)"' AS DOUBLE) AS gbps,
                   TRY_CAST(b.value->>'$."Large Packet Ratio"' AS DOUBLE) AS lpr,
                   CASE WHEN json_type(b.value->'$."Size Distribution"') = 'OBJECT'
                        THEN NULLIF(b.value->'$."Size Distribution"', '{{}}') END AS sizes
            FROM {ops} o, json_each(o.v->'$.{_BW_INFO}') b WHERE json_type(b.value) = 'OBJECT'"""
        )
        cur.execute(
            f"""INSERT INTO comm_ops
            WITH tot AS (
                SELECT fno, step_key, op_key,
                       coalesce(sum(bytes) FILTER (WHERE upper(transport) = 'RDMA'), 0)
                       + greatest(coalesce(sum(bytes) FILTER (WHERE upper(transport) = 'SDMA'), 0),
                                  coalesce(sum(bytes) FILTER (WHERE upper(transport) IN ('HCCS', 'PCIE', 'SIO')), 0)) AS bytes
                FROM {bw} GROUP BY ALL)
            SELECT o.rank, {STEP_KEY_SQL.format(k="o.step_key")}, {_OP_NAME.replace("op_key", "o.op_key")},
                   {OP_TYPE_SQL.format(n="o.op_key")}, {_OP_GROUP.replace("op_key", "o.op_key")},
                   {US_TO_NS.format(x=ti("Start Timestamp(us)"))},
                   {MS_TO_NS.format(x=ti("Elapse Time(ms)"))}, {MS_TO_NS.format(x=ti("Transit Time(ms)"))},
                   {MS_TO_NS.format(x=ti("Wait Time(ms)"))}, {MS_TO_NS.format(x=ti("Synchronization Time(ms)"))},
                   {MS_TO_NS.format(x=ti("Idle Time(ms)"))}, tot.bytes, NULL
            FROM {ops} o LEFT JOIN tot ON tot.fno = o.fno AND tot.op_key = o.op_key AND tot.step_key IS NOT DISTINCT FROM o.step_key"""
        )
        cur.execute(
            f"""INSERT INTO comm_bandwidth
            SELECT rank, {STEP_KEY_SQL.format(k="step_key")}, {_OP_NAME}, {_OP_GROUP}, transport, bytes, transit_ns, gbps, lpr, sizes
            FROM {bw}"""
        )
        per = _per_fno(cur, f"SELECT fno, count(*) FROM {ops} GROUP BY fno")
        return {j.fno: errors.get(j.fno) or {"ops": per.get(j.fno, (0,))[0]} for j in jobs}
    finally:
        _drop(cur, ops, bw)


def load_matrices(cur: Any, jobs: list[Job]) -> dict[int, dict[str, Any] | ParseError]:
    """``communication_matrix.json`` -> ``comm_matrix``.

    Link keys are group-local ranks; they are mapped to global ranks through the rank's
    ``comm_groups`` (profiler_metadata ``parallel_group_info``, sorted global ranks) and, for the
    rank's own index, through its ``i-i`` LOCAL link. Unmapped ranks stay group-local.
    """
    ops, stage = "stage_matrix_ops", "stage_matrix_links"
    try:
        errors = _stage_ops(cur, jobs, ops)
        cur.execute(
            f"""CREATE TEMP TABLE {stage} AS
            SELECT o.fno, o.rank, {STEP_KEY_SQL.format(k="o.step_key")} AS step, o.op_key AS name,
                   {_OP_GROUP.replace("op_key", "o.op_key")} AS grp,
                   TRY_CAST(regexp_extract(l.key, '^\\s*(\\d+)\\s*-', 1) AS INTEGER) AS src,
                   TRY_CAST(regexp_extract(l.key, '-\\s*(\\d+)\\s*$', 1) AS INTEGER) AS dst,
                   l.value->>'$."Transport Type"' AS transport, {_L_BYTES} AS bytes, {_L_TIME} AS transit_ns,
                   TRY_CAST(l.value->>'$."Bandwidth(GB/s)"' AS DOUBLE) AS bw
            FROM {ops} o, json_each(o.v) l
            WHERE json_type(l.value) = 'OBJECT'"""
        )
        per = insert_matrix_stage(cur, stage)
        return {
            j.fno: errors.get(j.fno) or dict(zip(("links", "unmapped"), per.get(j.fno, (0, 0)), strict=True))
            for j in jobs
        }
    finally:
        _drop(cur, ops, stage)


def insert_matrix_stage(cur: Any, stage: str) -> dict[int, tuple[Any, ...]]:
    """Insert a staged matrix (fno, rank, step, name, grp, src, dst, transport, bytes, transit_ns, bw) into ``comm_matrix``.

    Group-local link ranks become global through the rank's ``comm_groups`` (the i-th of the
    group's sorted global ranks, format doc §9), else through the rank's own ``i-i`` LOCAL link.
    Returns {fno: (links, links of groups without a mapping)}.
    """
    cur.execute(
        f"""INSERT INTO comm_matrix
        WITH g AS (
            SELECT rank, group_name, i - 1 AS local, r AS global
            FROM (SELECT rank, group_name, list_sort(CAST(global_ranks AS INTEGER[])) AS rl FROM comm_groups
                  WHERE rank IN (SELECT DISTINCT rank FROM {stage})),
                 unnest(rl) WITH ORDINALITY AS u(r, i)
        ),
        self AS (SELECT DISTINCT rank, grp, src AS local FROM {stage} WHERE src = dst AND src IS NOT NULL),
        m AS (
            SELECT rank, group_name AS grp, local, min(global) AS global FROM g GROUP BY ALL
            UNION ALL
            SELECT s.rank, s.grp, s.local, s.rank FROM self s
            WHERE NOT EXISTS (SELECT 1 FROM g WHERE g.rank = s.rank AND g.group_name = s.grp)
        )
        SELECT x.rank, x.step, x.grp, x.name, coalesce(ms.global, x.src), coalesce(md.global, x.dst),
               x.transport, x.bytes, x.transit_ns, x.bw
        FROM {stage} x
        LEFT JOIN m ms ON ms.rank = x.rank AND ms.grp = x.grp AND ms.local = x.src
        LEFT JOIN m md ON md.rank = x.rank AND md.grp = x.grp AND md.local = x.dst"""
    )
    return _per_fno(
        cur,
        f"""SELECT x.fno, count(*), count(*) FILTER (WHERE NOT EXISTS (
                SELECT 1 FROM comm_groups c WHERE c.rank = x.rank AND c.group_name = x.grp))
            FROM {stage} x GROUP BY x.fno""",
    )
