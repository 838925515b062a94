"""PyTorch profiler (Kineto) traces -> canonical tables.

Reads every Kineto variant: the old schema (categories ``Operator``, ``Runtime``, ``Kernel``,
``Memcpy``, ``Memset``), the current one (``cpu_op``, ``cuda_runtime``, ``kernel``,
``gpu_memcpy``, ``gpu_memset``, ``user_annotation``, ``gpu_user_annotation``,
``python_function``), CPU-only traces, ROCm (``hip*`` runtime names), traces with or without
``distributedInfo`` and ``baseTimeNanoseconds``.

Parsing is done by DuckDB's JSON reader with explicit column types; no Python object is made per
event. How a file is read depends on its size:

* small files (the usual one-per-rank cluster export) are read together, one ``read_json`` scan
  per ~1 GiB of them (:func:`load_many`): DuckDB parses them in parallel, and the per-file
  statement chain no longer costs more than the parse;
* a big file (estimated above ``STREAM_ABOVE_BYTES``) has its ``traceEvents`` list copied to a
  temporary file read by path (:class:`advisor.ingest.jsonstream.SpilledEvents`): DuckDB holds a
  whole top-level object in memory (~9x the file) but reads a top-level array in bounded buffers;
* the parsed rows are staged (one typed row per event, args fields extracted once), compressed
  when the input is big, and turned into ``events`` / ``tracks`` / ``kernels`` / ``comm_ops``
  with one statement each; steps are assigned on the way (:func:`advisor.ingest.steps.window_lookup`).

Time: Chrome-trace ``ts``/``dur`` are microseconds whatever ``displayTimeUnit`` says (that key
only sets the viewer's display unit). When ``baseTimeNanoseconds`` is present, ``ts`` is relative
to it (Kineto >= 2.1 writes relative timestamps to keep precision) and the base is added back.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any

import duckdb

from advisor.ingest.base import LoadContext, ParseError, Unit, is_gzip, one_line, overlapping_files, read_head
from advisor.ingest.jsonstream import LayoutError, SpilledEvents, header_value
from advisor.ingest.steps import build_steps, drop_window_lookup, step_of, window_lookup

SOURCE = "kineto"

_NAME_RE = re.compile(r"\.(json|json\.gz)$", re.IGNORECASE)
_RANK_IN_NAME = [
    re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])worker[_\-.]?(\d+)", re.IGNORECASE),
]
# tensorboard_trace_handler names files "<worker>.<time_ms>.pt.trace.json[.gz]"
_WORKER_RE = re.compile(r"^(.*?)(?:\.\d{10,})?\.pt\.trace\.json(?:\.gz)?$", re.IGNORECASE)

EVENT_TYPE = (
    "STRUCT(ph VARCHAR, cat VARCHAR, name VARCHAR, pid VARCHAR, tid VARCHAR, "
    "ts VARCHAR, dur VARCHAR, id VARCHAR, args JSON)[]"
)
COLUMNS = (
    "{'traceEvents': '" + EVENT_TYPE + "', 'distributedInfo': 'JSON', 'deviceProperties': 'JSON', "
    "'baseTimeNanoseconds': 'VARCHAR', 'displayTimeUnit': 'VARCHAR'}"
)

# args fields read, in this order (1-based in SQL); both spellings of the old and new schema
ARG_PATHS = (
    '$.correlation', '$."External id"', '$."external id"', '$.bytes', '$.stream',
    '$."Input Dims"', '$."Input dims"', '$."Input type"', '$.flops', '$."Call stack"', '$.name',
    '$."In msg nelems"', '$.dtype', '$."Process Group Name"', '$."Process Group Description"', '$."Group size"',
    '$.grid', '$.block', '$."blocks per SM"', '$."warps per SM"', '$."est. achieved occupancy %"',
    '$."registers per thread"', '$."shared memory"',
)

DEVICE_CATS = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync")
RUNTIME_CATS = ("cuda_runtime", "runtime", "cuda_driver", "hip_runtime", "xpu_runtime", "privateuse1_runtime", "mtia_runtime")
COMM_KERNEL_RE = r"(?i)nccl|rccl|hccl|msccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv"
COMM_HOST_RE = r"^(nccl|gloo|mpi|ucc|hccl|c10d):|^c10d::|^record_param_comms$|^c10d_functional::"
# categories whose ProfilerStep#N-named events are not host step markers (checked before the marker test)
_NOT_MARK_CATS = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "cuda_sync", "gpu_user_annotation") + RUNTIME_CATS
SYNC_RE = r"(?i)synchronize$|^(cuda|hip)Memcpy$|^(cuda|hip)StreamQuery$"

STREAM_ABOVE_BYTES = 256 << 20  # estimated uncompressed size from which the streaming reader is used
COMPRESS_STAGE_ABOVE_BYTES = 128 << 20  # staged rows of bigger inputs are compressed before use (memory)
STAGE_PART_BYTES = 96 << 20  # files of a big batch are staged this much at a time (bounds the peak)
EVENT_MAX_BYTES = 64 << 20  # one event larger than this is refused (bounds memory on hostile input)

# SQL expression: text (JSON number or string) in µs -> integer ns. Exact for decimal text.
_US_TO_NS = "TRY_CAST(round(TRY_CAST({x} AS DECIMAL(38,6)) * 1000) AS BIGINT)"

DTYPE_BYTES_SQL = """CASE lower(coalesce({d}, ''))
    WHEN 'float' THEN 4 WHEN 'float32' THEN 4 WHEN 'int' THEN 4 WHEN 'int32' THEN 4
    WHEN 'half' THEN 2 WHEN 'bfloat16' THEN 2 WHEN 'float16' THEN 2 WHEN 'short' THEN 2
    WHEN 'double' THEN 8 WHEN 'long' THEN 8 WHEN 'int64' THEN 8 WHEN 'float64' THEN 8
    WHEN 'byte' THEN 1 WHEN 'char' THEN 1 WHEN 'bool' THEN 1 WHEN 'uint8' THEN 1 WHEN 'int8' THEN 1
    ELSE NULL END"""


def trace_form(head: bytes) -> str | None:
    """'object' for a Chrome trace object (Kineto writes ``{"schemaVersion"..``), 'array' for the
    bare event-list form of the Chrome trace format, None when the bytes are neither."""
    s = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if s.startswith(b"{"):
        keys = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')
        return "object" if any(k in head for k in keys) else None
    if s.startswith(b"[") and b'"ph"' in head:
        return "array"
    return None


def worker_key(path: Path) -> str:
    """Files of one process from tensorboard_trace_handler share this key."""
    m = _WORKER_RE.match(path.name)
    return str(path.parent / (m.group(1) if m else _NAME_RE.sub("", path.name)))


def claim(files: list[Path], ctx_warn: Any) -> list[Unit]:
    """Claim the Kineto trace files among ``files`` (one unit per file; ranks are decided later)."""
    units = []
    for p in files:
        if not _NAME_RE.search(p.name):
            continue
        head = read_head(p)
        if not head:
            if p.name.endswith(".gz") and not is_gzip(p):
                ctx_warn("bad_gzip", "named .gz but is not gzip data; skipped", p)
            elif p.stat().st_size == 0:
                ctx_warn("empty_file", "empty file; skipped", p)
            else:
                ctx_warn("unreadable", "cannot read the start of the file (truncated gzip?); skipped", p)
            continue
        form = trace_form(head)
        if form is None:
            ctx_warn("not_a_trace", "not a Chrome/Kineto trace (no traceEvents object or event list); skipped", p)
            continue
        unit = Unit(SOURCE, [p], p, run_key=worker_key(p), info={"form": form})
        dist = _distributed_info(head)
        if dist:
            rank = dist.get("rank")
            if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 24:
                unit.rank_hint, unit.rank_source = rank, "distributedInfo"
            ws = dist.get("world_size")
            unit.world_size = ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None
            backend = dist.get("backend")
            unit.backend = str(backend)[:40] if isinstance(backend, str) else None
        if unit.rank_hint is None:
            for rx in _RANK_IN_NAME:
                mm = rx.search(p.name)
                if mm:
                    unit.rank_hint, unit.rank_source = int(mm.group(1)), "file_name"
                    break
        units.append(unit)
    return units


HEADER_KEYS = ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "displayTimeUnit")


def _header(head: bytes, trailer: dict[str, Any]) -> tuple[Any, ...]:
    """(distributedInfo JSON, deviceProperties JSON, baseTimeNanoseconds text, displayTimeUnit)
    from the bytes before the events, else from the keys written after them."""
    import json

    vals = []
    for key in HEADER_KEYS:
        v = header_value(head, key)
        vals.append(trailer.get(key) if v is None else v)
    dist, props, base, unit = vals
    return (
        None if dist is None else json.dumps(dist),
        None if props is None else json.dumps(props),
        None if base is None else str(base),
        unit,
    )


def _header_from_head(path: Path) -> tuple[Any, ...] | None:
    """Kineto writes its header keys before ``traceEvents``: read them from the first bytes
    instead of parsing the whole file a second time. None when the events come first."""
    head = read_head(path, 1 << 20)
    cut = head.find(b'"traceEvents"')
    return None if cut < 0 else _header(head[:cut], {})


def _header_from_whole(cur: Any, path: Path) -> tuple[Any, ...]:
    """The header keys wherever they are in the file (a second full parse: only when needed)."""
    return cur.execute(
        f"SELECT distributedInfo::VARCHAR, deviceProperties::VARCHAR, baseTimeNanoseconds, displayTimeUnit "
        f"FROM read_json($path, columns={COLUMNS}, format='auto', maximum_object_size={_max_object_size(path)})",
        {"path": str(path)},
    ).fetchall()[0]


def _looks_relative(cur: Any, stage: str) -> bool:
    """Timestamps far below the Unix-epoch range (~1.7e18 ns) are relative to a base time."""
    med = cur.execute(f"SELECT median(ts_ns) FROM {stage} WHERE ph = 'X'").fetchall()[0][0]
    return med is not None and med < 10**17


def _distributed_info(head: bytes) -> dict[str, Any] | None:
    """The ``distributedInfo`` object from the start of a trace (Kineto writes it before the events)."""
    obj = header_value(head, "distributedInfo")
    return obj if isinstance(obj, dict) else None

def _max_object_size(path: Path) -> int:
    size = path.stat().st_size
    if is_gzip(path):
        # the gzip trailer holds the uncompressed size mod 2**32; 20x covers most traces either way
        try:
            with path.open("rb") as fh:
                fh.seek(-4, 2)
                isize = int.from_bytes(fh.read(4), "little")
        except OSError:
            isize = 0
        size = max(isize, size * 20)
    return int(min(max(size * 1.05 + (1 << 20), 1 << 24), (1 << 32) - 2))


_GLOB_CHARS = re.compile(r"[*?\[\]{}]")  # DuckDB would expand these in a file name
BATCH_BYTES = 1 << 30  # estimated uncompressed bytes read by one batched scan


def _paths_sql() -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in ARG_PATHS) + "]"


def _stage_sql(unnest: str, fid: str) -> str:
    """SELECT turning raw events into staged rows: ``ph`` X and M only, times in ns, the args
    fields used later typed once (one JSON parse of ``args`` per event), kernel launch geometry
    folded into one JSON column. ``unnest`` yields ``e`` (the event struct) and ``fid`` from ``fid``."""
    a = "a[{}]"
    dtype = DTYPE_BYTES_SQL.format(d=a.format(13))
    geo = (
        f"json_object('grid', TRY_CAST({a.format(17)} AS JSON), 'block', TRY_CAST({a.format(18)} AS JSON), "
        f"'blocks_per_sm', TRY_CAST({a.format(19)} AS DOUBLE), 'warps_per_sm', TRY_CAST({a.format(20)} AS DOUBLE), "
        f"'occupancy_pct', TRY_CAST({a.format(21)} AS DOUBLE), 'registers_per_thread', TRY_CAST({a.format(22)} AS BIGINT), "
        f"'shared_memory', TRY_CAST({a.format(23)} AS BIGINT))"
    )
    return f"""SELECT fid, ph, cat, name, pid, tid, ts_ns, dur_ns,
           TRY_CAST({a.format(1)} AS BIGINT) AS corr,
           TRY_CAST(coalesce({a.format(2)}, {a.format(3)}) AS BIGINT) AS ext,
           coalesce(TRY_CAST({a.format(4)} AS BIGINT), TRY_CAST({a.format(12)} AS BIGINT) * ({dtype})) AS bytes,
           TRY_CAST({a.format(5)} AS BIGINT) AS stream,
           coalesce({a.format(6)}, {a.format(7)}) AS shapes, {a.format(8)} AS dtypes,
           TRY_CAST({a.format(9)} AS DOUBLE) AS flops, {a.format(10)} AS stack,
           CASE WHEN ph = 'M' THEN {a.format(11)} END AS meta_name,
           coalesce({a.format(14)}, {a.format(15)}) AS pg_name,
           CASE WHEN {a.format(17)} IS NOT NULL THEN {geo} END AS kgeo,
           CASE WHEN {a.format(17)} IS NOT NULL
                THEN TRY_CAST(list_aggregate(TRY_CAST({a.format(17)} AS BIGINT[]), 'product') AS INTEGER) END AS block_dim,
           coalesce(lower(cat) = 'kernel' AND regexp_matches(name, {_sql_str(COMM_KERNEL_RE)}), false) AS comm_kernel
    FROM (
        SELECT {fid} AS fid, e.ph AS ph, e.cat AS cat, e.name AS name, e.pid AS pid, e.tid AS tid,
               {_to_ns('e.ts')} AS ts_ns, {_to_ns('e.dur')} AS dur_ns,
               CASE WHEN e.args IS NULL THEN NULL ELSE json_extract_string(e.args, {_paths_sql()}) END AS a
        FROM ({unnest})
        WHERE e.ph IN ('X', 'M')
    )"""


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _to_ns(x: str) -> str:
    """SQL: text (JSON number or string) in µs -> integer ns. Exact for decimal text; integers
    (the usual case) skip the slower DECIMAL parse."""
    return (
        f"CASE WHEN contains({x}, '.') OR contains({x}, 'e') OR contains({x}, 'E') THEN {_US_TO_NS.format(x=x)} "
        f"ELSE TRY_CAST(TRY_CAST({x} AS HUGEINT) * 1000 AS BIGINT) END"
    )


class _File:
    """One trace file in a stage: its id, rank, path and header keys."""

    def __init__(self, unit: Unit, fid: int, header: Any, reread_header: bool = False) -> None:
        self.unit, self.fid, self.header = unit, fid, header
        self.reread_header = reread_header  # header read from the head only: base time may follow the events
        self.path = unit.files[0]
        self.rank = unit.rank


def load_many(units: list[Unit], lctx: LoadContext) -> dict[int, dict[str, Any] | None]:
    """Load many small Kineto files with one ``read_json`` scan per batch (DuckDB parses them in
    parallel); per-file statements cost more than the parse on clusters of small ranks.

    Returns ``{index in units: info, or None when the file was rejected with a warning}``; the
    units left out (large, array-form, odd names, or in a batch whose scan failed) are loaded
    one by one with :func:`load`, which reports their problems precisely.
    """
    cands = []
    for i, u in enumerate(units):
        path = u.files[0]
        if u.info.get("form", "object") != "object" or _GLOB_CHARS.search(str(path)):
            continue
        size = _max_object_size(path)
        if size >= STREAM_ABOVE_BYTES:
            continue
        header = _header_from_head(path)
        if header is None:
            continue
        cands.append((i, u, size, header))
    batches: list[list[tuple[int, Unit, int, Any]]] = []
    total = BATCH_BYTES
    for c in cands:
        if total + c[2] > BATCH_BYTES:
            batches.append([])
            total = 0
        batches[-1].append(c)
        total += c[2]
    done: dict[int, dict[str, Any] | None] = {}
    for batch in batches:
        if len(batch) < 2:
            continue
        done.update(_load_batch(batch, lctx))
    return done


def _load_batch(batch: list[tuple[int, Unit, int, Any]], lctx: LoadContext) -> dict[int, dict[str, Any] | None]:
    cur = lctx.cursor()
    files = []
    for _i, u, _size, header in batch:
        fid = lctx.file_id(u.files[0], u.rank, SOURCE)
        u.info["fid"] = fid
        files.append(_File(u, fid, header, reread_header=True))
    prefix = f"kstage_{files[0].fid}"
    stage = _attach_stage_db(cur, prefix)
    limit = max(c[2] for c in batch)
    cur.execute(f"CREATE TEMP TABLE {prefix}_f (fname VARCHAR, fid INTEGER)")
    cur.executemany(f"INSERT INTO {prefix}_f VALUES (?, ?)", [(str(f.path), f.fid) for f in files])
    unnest = (f"SELECT f.fid AS fid, t.e AS e FROM (SELECT filename, unnest(traceEvents) AS e FROM read_json($paths, "
              f"columns={COLUMNS}, format='auto', maximum_object_size={limit}, filename=true)) t "
              f"JOIN {prefix}_f f ON f.fname = t.filename")
    total = sum(c[2] for c in batch)
    # a big batch is staged a part at a time, each part compressed before the next is read
    parts: list[list[str]] = [[]]
    part_bytes = 0
    for (_i, _u, size, _h), f in zip(batch, files, strict=True):
        if parts[-1] and total >= COMPRESS_STAGE_ABOVE_BYTES and part_bytes + size > STAGE_PART_BYTES:
            parts.append([])
            part_bytes = 0
        parts[-1].append(str(f.path))
        part_bytes += size
    try:
        for n, paths in enumerate(parts):
            verb = f"CREATE TABLE {stage} AS" if n == 0 else f"INSERT INTO {stage}"
            cur.execute(f"{verb} {_stage_sql(unnest, 'fid')}", {"paths": paths})
            if len(parts) > 1:
                _compress_stage(cur, prefix, total)
    except duckdb.Error:  # one bad file fails the scan: every file of the batch is read on its own instead
        _detach_stage_db(cur, prefix)
        cur.execute(f"DROP TABLE {prefix}_f")
        cur.close()
        return {}
    cur.execute(f"DROP TABLE {prefix}_f")
    try:
        if len(parts) == 1:
            _compress_stage(cur, prefix, total)
        results = _from_stage(cur, stage, prefix, files, lctx, compressed=total >= COMPRESS_STAGE_ABOVE_BYTES)
    finally:
        _detach_stage_db(cur, prefix)
        cur.close()
    out: dict[int, dict[str, Any] | None] = {}
    for (i, _u, _s, _h), f in zip(batch, files, strict=True):
        res = results[f.fid]
        if isinstance(res, ParseError):
            lctx.warn(res.code, res.message, res.path)
            out[i] = None
        else:
            out[i] = res
    return out


def load(unit: Unit, lctx: LoadContext) -> dict[str, Any]:
    """Load one Kineto file into the canonical tables as ``unit.rank``. Raises ParseError."""
    path = unit.files[0]
    cur = lctx.cursor()
    fid = unit.info.get("fid")
    if fid is None:
        fid = lctx.file_id(path, unit.rank, SOURCE)
    prefix = f"kstage_{fid}"
    stage = _attach_stage_db(cur, prefix)
    form = unit.info.get("form", "object")
    limit = _max_object_size(path)
    src = f"read_json($path, columns={COLUMNS}, format='auto', maximum_object_size={limit})"
    spill = None
    if form == "array":  # the bare event-list form: one JSON value per event
        unnest = (f"SELECT json AS e FROM read_json($path, format='array', records=false, "
                  f"columns={{'json': '{EVENT_TYPE[:-2]}'}}, maximum_object_size={limit})")
    else:
        unnest = f"SELECT unnest(traceEvents) AS e FROM {src}"
        if limit >= STREAM_ABOVE_BYTES:  # big files: the events list alone, as a file DuckDB reads in bounded memory
            try:
                spill = SpilledEvents(path)
                unnest = (f"SELECT json AS e FROM read_json($events, format='array', records=false, "
                          f"columns={{'json': '{EVENT_TYPE[:-2]}'}}, maximum_object_size={EVENT_MAX_BYTES})")
            except ValueError as exc:  # a gzip bomb
                _detach_stage_db(cur, prefix)
                cur.close()
                raise ParseError(path, str(exc)) from None
            except (LayoutError, OSError, EOFError, zlib.error):
                # not laid out as expected, truncated, or no room for the copy: the whole-object
                # reader either manages (with more memory) or reports the precise error
                spill = None
    try:
        params = {"path": str(path)} if spill is None else {"events": str(spill.path)}
        cur.execute(f"CREATE TABLE {stage} AS {_stage_sql(unnest, str(int(fid)))}",
                    {k: v for k, v in params.items() if "$" + k in unnest})
        if spill is not None:
            header = _header(spill.head_bytes, spill.trailer)
        else:
            header = _header_from_head(path) if form != "array" else None
        if spill is None and header is not None and header[2] is None and _looks_relative(cur, stage):
            header = None  # relative timestamps but no base in the head: read the header keys properly
        if header is None and form != "array":
            header = _header_from_whole(cur, path)
    except Exception as exc:  # duckdb raises its own error types for bad JSON / gzip / IO
        _detach_stage_db(cur, prefix)
        cur.close()
        raise ParseError(path, "not a readable Kineto trace: " + _short_duckdb_error(exc)) from None
    finally:
        if spill is not None:
            spill.close()
    try:
        _compress_stage(cur, prefix, limit)
        res = _from_stage(cur, stage, prefix, [_File(unit, fid, header)], lctx, compressed=limit >= COMPRESS_STAGE_ABOVE_BYTES)[fid]
    finally:
        _detach_stage_db(cur, prefix)
        cur.close()
    if isinstance(res, ParseError):
        raise res
    return res


def _short_duckdb_error(exc: Exception) -> str:
    msg = one_line(str(exc), 200)
    for prefix in ("Invalid Input Error: ", "IO Error: ", "Conversion Error: ", "Binder Error: "):
        msg = msg.replace(prefix, "")
    if "maximum_object_size" in msg:  # the user has no such option: say what it means
        msg = f"an event or object larger than the {EVENT_MAX_BYTES >> 20} MiB limit (corrupt or hostile file); refused"
    msg = re.sub(r'"?DUCKDB_INTERNAL_OBJECTSTORE://[0-9a-f]+"?', "the trace", msg)
    return msg


def _base_ns(text: str | None, f: _File, lctx: LoadContext) -> int:
    if not text:
        return 0
    try:
        return int(float(text)) if "." in text or "e" in text.lower() else int(text)
    except ValueError:
        lctx.warn("bad_value", f"baseTimeNanoseconds {text[:40]!r} is not a number; ignored", f.path)
        return 0


def _attach_stage_db(cur: Any, prefix: str) -> str:
    """A private in-memory database for the staged rows, compressed once they are written
    (:func:`_compress_stage`): the stage then costs a fraction of its size while the canonical
    tables are filled from it. Returns the stage table's qualified name."""
    cur.execute(f"ATTACH ':memory:' AS {prefix}_db (COMPRESS)")
    return f"{prefix}_db.main.stage"


def _compress_stage(cur: Any, prefix: str, size: int) -> None:
    """Compress a big stage (~0.5 s per GB of trace, saves ~0.4 GB per GB at the peak)."""
    if size >= COMPRESS_STAGE_ABOVE_BYTES:
        cur.execute(f"CHECKPOINT {prefix}_db")


def _detach_stage_db(cur: Any, prefix: str) -> None:
    cur.execute(f"DETACH DATABASE IF EXISTS {prefix}_db")


def _from_stage(cur: Any, stage: str, prefix: str, files: list[_File], lctx: LoadContext,
                compressed: bool = False) -> dict[int, dict[str, Any] | ParseError]:
    """Staged rows of ``files`` -> events, tracks, kernels, comm_ops (one statement each for all files).

    Steps are assigned as the events are inserted for the ranks whose every file is in this
    stage (their step windows are built from the staged rows first); the others get theirs in
    :func:`advisor.ingest.steps.finalize`.
    """
    stats = {
        r[0]: r[1:]
        for r in cur.execute(
            f"""SELECT fid, median(ts_ns) FILTER (WHERE ph = 'X'),
                   count(*) FILTER (WHERE ph = 'X' AND (ts_ns IS NULL OR dur_ns IS NULL)),
                   count(*) FILTER (WHERE ph = 'X' AND dur_ns < 0),
                   count(*) FILTER (WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns >= 0)
            FROM {stage} GROUP BY fid"""
        ).fetchall()
    }
    results: dict[int, dict[str, Any] | ParseError] = {}
    rows = []
    for f in files:
        med, n_null, n_neg, total = stats.get(f.fid, (None, 0, 0, 0))
        if f.reread_header and f.header is not None and f.header[2] is None and med is not None and med < 10**17:
            # relative timestamps but no base before the events: it may follow them (as load() does)
            f.header = _header_from_whole(cur, f.path)
        dist_json, devprops_json, base_text, _unit = f.header or (None, None, None, None)
        base = _base_ns(base_text, f, lctx)
        if base and med is not None and med > 10**17:
            base = 0  # timestamps already absolute (µs since the epoch): a base would count twice
        if n_null:
            lctx.warn("bad_events", f"{n_null} events without a usable ts/dur were dropped", f.path)
        if n_neg:
            lctx.warn("bad_events", f"{n_neg} events with a negative duration were dropped", f.path)
        if not total:
            results[f.fid] = ParseError(f.path, "the trace holds no timed events (traceEvents missing or empty)", code="empty_trace")
        elif lctx.max_events is not None and total > lctx.max_events:
            results[f.fid] = ParseError(f.path, f"{total} events exceed --max-events {lctx.max_events}", code="too_big")
        else:
            results[f.fid] = _info(devprops_json, dist_json, total)
            rows.append((f.fid, f.rank, base, str(f.path), total))
    if not rows:
        return results
    kf = f"{prefix}_files"
    cur.execute(f"CREATE OR REPLACE TEMP TABLE {kf} (fid INTEGER, rank INTEGER, base_ns BIGINT, path VARCHAR, n BIGINT)")
    cur.executemany(f"INSERT INTO {kf} VALUES (?, ?, ?, ?, ?)", rows)
    lc = "lower(coalesce(st.cat, ''))"
    ev = f"{prefix}_ev"  # the staged rows that become events, with rank and absolute time
    cur.execute(
        f"""CREATE OR REPLACE TEMP VIEW {ev} AS
        SELECT st.*, f.rank AS rank, st.ts_ns + f.base_ns AS start_ns, {lc} AS lcat, {lc} IN {DEVICE_CATS} AS device
        FROM {stage} st JOIN {kf} f USING (fid)
        WHERE st.ph = 'X' AND st.ts_ns IS NOT NULL AND st.dur_ns >= 0 AND {lc} NOT IN ('trace', 'ac2g', 'flow')"""
    )
    try:
        stepped = _steps_from_stage(cur, ev, kf, files, lctx)
        ranks_sql = ", ".join(map(str, sorted(stepped))) or "NULL"
        join = window_lookup(cur, f"{prefix}_sw", ranks_sql)
        cur.execute(
            f"""INSERT INTO events
            SELECT t.rank, CASE WHEN t.rank IN ({ranks_sql}) THEN {step_of('t.start_ns')} END AS step,
              CASE
                WHEN lcat = 'kernel' THEN CASE WHEN comm_kernel THEN 'comm' ELSE 'kernel' END
                WHEN lcat IN ('gpu_memcpy', 'memcpy') THEN 'memcpy'
                WHEN lcat IN ('gpu_memset', 'memset') THEN 'memset'
                WHEN lcat IN {RUNTIME_CATS} THEN CASE WHEN regexp_matches(name, $sync) THEN 'sync' ELSE 'runtime' END
                WHEN lcat = 'cuda_sync' THEN 'sync'
                WHEN name LIKE 'ProfilerStep#%' AND lcat NOT IN ('gpu_user_annotation') THEN 'step'
                WHEN name LIKE 'enumerate(DataLoader)%' THEN 'dataloader'
                WHEN lcat = 'gpu_user_annotation' THEN 'annotation'
                WHEN regexp_matches(name, $comm_host) THEN 'comm'
                WHEN lcat IN ('cpu_op', 'operator') THEN 'host_op'
                WHEN lcat IN ('python_function', 'python') THEN 'python'
                WHEN lcat IN ('user_annotation') THEN 'annotation'
                ELSE 'other'
              END AS kind,
              coalesce(name, '') AS name, cat, pid, tid, device, stream, t.start_ns, dur_ns,
              corr, ext AS ext_id, bytes, shapes, dtypes, flops, stack, fid AS file_id
            FROM {ev} t {join}""",
            {"sync": SYNC_RE, "comm_host": COMM_HOST_RE},
        )
        if compressed:  # a big input: compress the new events before the other tables are filled (best effort)
            try:
                cur.execute("CHECKPOINT")
            except duckdb.Error:
                pass  # another thread is writing: the compression after loading does it
        cur.execute(
            f"""INSERT INTO tracks
            SELECT f.rank, pid, tid, bool_or(device), max(process_name), max(thread_name) FROM (
                SELECT fid, pid, tid, lower(coalesce(cat, '')) IN {DEVICE_CATS} AS device, NULL AS process_name, NULL AS thread_name
                  FROM {stage} WHERE ph = 'X'
                UNION ALL
                SELECT fid, pid, NULL, NULL, meta_name, NULL FROM {stage} WHERE ph = 'M' AND name = 'process_name'
                UNION ALL
                SELECT fid, pid, tid, NULL, NULL, meta_name FROM {stage} WHERE ph = 'M' AND name = 'thread_name'
            ) JOIN {kf} f USING (fid) GROUP BY f.rank, pid, tid"""
        )
        # per-kernel launch geometry where the trace has it (current schema): the GPU analogue of Ascend's block dim
        cur.execute(
            f"""INSERT INTO kernels (rank, step, name, op_type, core_type, start_ns, dur_ns, block_dim, pmu)
            SELECT t.rank, CASE WHEN t.rank IN ({ranks_sql}) THEN {step_of('t.start_ns')} END, name, NULL, 'GPU', t.start_ns, dur_ns, block_dim, kgeo
            FROM {ev} t {join} WHERE lcat = 'kernel' AND kgeo IS NOT NULL AND NOT comm_kernel"""
        )
        cur.execute(
            f"""INSERT INTO comm_ops
            SELECT t.rank, CASE WHEN t.rank IN ({ranks_sql}) THEN {step_of('t.start_ns')} END, name,
              regexp_replace(lower(regexp_extract(name, '(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|send_?recv|send|recv|reduce|barrier|gather|scatter)', 1, 'i')), '_', '', 'g'),
              pg_name, t.start_ns, dur_ns, NULL, NULL, NULL, NULL, bytes
            FROM {ev} t {join} WHERE comm_kernel"""
        )
        cur.executemany("UPDATE profile_files SET events = ? WHERE file_id = ?", [[r[4], r[0]] for r in rows])
        lctx.mark_stepped(stepped)
    finally:
        drop_window_lookup(cur, f"{prefix}_sw")
        cur.execute(f"DROP VIEW IF EXISTS {ev}")
        cur.execute(f"DROP TABLE IF EXISTS {kf}")
    return results


def _steps_from_stage(cur: Any, ev: str, kf: str, files: list[_File], lctx: LoadContext) -> set[int]:
    """Build the step windows of the ranks whose every file is in this stage (others: later).

    Files of one rank whose time ranges overlap cannot both be its timeline: the one with fewer
    events is dropped here (the same rule as for files loaded one by one).
    """
    ranks = {f.rank for f in files}
    whole = {r for r in ranks if lctx.units_of_rank(r) == sum(1 for f in files if f.rank == r)}
    if not whole:
        return set()
    multi = [r for r in whole if sum(1 for f in files if f.rank == r) > 1]
    if multi:
        spans = cur.execute(
            f"""SELECT f.fid, f.rank, f.path, min(t.start_ns), max(t.start_ns + t.dur_ns), f.n
            FROM {ev} t JOIN {kf} f USING (fid) WHERE f.rank IN ({", ".join(map(str, multi))})
            GROUP BY ALL ORDER BY f.rank, f.n DESC, f.fid"""
        ).fetchall()
        dropped = [d[0] for d in overlapping_files(spans, lctx.warn)]
        if dropped:
            ids = ", ".join(map(str, dropped))
            cur.execute(f"DELETE FROM {kf} WHERE fid IN ({ids})")
            cur.execute(f"DELETE FROM profile_files WHERE file_id IN ({ids})")
    src = f"{kf}_marks"  # the narrow columns the step windows need, read several times
    cur.execute(
        f"""CREATE OR REPLACE TEMP TABLE {src} AS
        SELECT rank, is_mark, device, CASE WHEN is_mark THEN name END AS name, start_ns, dur_ns, corr FROM (
            SELECT *, name LIKE 'ProfilerStep#%' AND lcat NOT IN {_NOT_MARK_CATS} AS is_mark FROM {ev}
            WHERE rank IN ({', '.join(map(str, sorted(whole)))}))"""
    )
    try:
        with lctx.steps_lock:
            build_steps(cur, src, lctx.warn)
    finally:
        cur.execute(f"DROP TABLE {src}")
    return whole


def _info(devprops_json: str | None, dist_json: str | None, total: int) -> dict[str, Any]:
    import json

    info: dict[str, Any] = {"events": total}
    if devprops_json:
        try:
            props = json.loads(devprops_json)
            if isinstance(props, list) and props and isinstance(props[0], dict):
                info["device_name"] = str(props[0].get("name", ""))[:200] or None
                info["device_count"] = len(props)
        except ValueError:
            pass
    if dist_json:
        try:
            dist = json.loads(dist_json)
            if isinstance(dist, dict):
                info["distributed"] = dist
        except ValueError:
            pass
    return info
