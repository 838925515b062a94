"""PyTorch profiler (Kineto) traces -> canonical tables.

Reads every Kineto variant: the old schema (categories ``Operator``, ``Runtime``, ``Kernel``,
``Memcpy``, ``Memset``), the current one (``cpu_op``, ``cuda_runtime``, ``kernel``,
``gpu_memcpy``, ``gpu_memset``, ``user_annotation``, ``gpu_user_annotation``,
``python_function``), CPU-only traces, ROCm (``hip*`` runtime names), traces with or without
``distributedInfo`` and ``baseTimeNanoseconds``.

Parsing is done by DuckDB's JSON reader with explicit column types: the whole file is one JSON
object whose ``traceEvents`` list is unnested in SQL; no Python object is made per event.

Time: Chrome-trace ``ts``/``dur`` are microseconds whatever ``displayTimeUnit`` says (that key
only sets the viewer's display unit). When ``baseTimeNanoseconds`` is present, ``ts`` is relative
to it (Kineto >= 2.1 writes relative timestamps to keep precision) and the base is added back.
"""

from __future__ import annotations

import io
import re

import duckdb
from pathlib import Path
from typing import Any

from advisor.ingest.jsonstream import EventsStream, LayoutError, header_value
from advisor.ingest.base import LoadContext, ParseError, Unit, is_gzip, one_line, read_head

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
SYNC_RE = r"(?i)synchronize$|^(cuda|hip)Memcpy$|^(cuda|hip)StreamQuery$"

STREAM_ABOVE_BYTES = 256 << 20  # estimated uncompressed size from which the streaming reader is used
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


def _header_from_stream(stream: EventsStream) -> tuple[Any, ...]:
    """Header keys around the streamed events list."""
    return _header(stream.head_bytes, stream.trailer)


def _header_from_head(path: Path) -> tuple[Any, ...] | None:
    """Kineto writes its header keys before ``traceEvents``: read them from the first bytes
    instead of parsing the whole file a second time. None when the events come first."""
    head = read_head(path, 1 << 20)
    cut = head.find(b'"traceEvents"')
    return None if cut < 0 else _header(head[:cut], {})


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


def load(unit: Unit, lctx: LoadContext) -> dict[str, Any]:
    """Load one Kineto file into the canonical tables as ``unit.rank``. Raises ParseError."""
    path = unit.files[0]
    rank = unit.rank
    cur = lctx.cursor()
    fid = lctx.file_id(path, rank, SOURCE)
    stage = f"kstage_{fid}"
    form = unit.info.get("form", "object")
    limit = _max_object_size(path)
    src = f"read_json($path, columns={COLUMNS}, format='auto', maximum_object_size={limit})"
    stream = None
    main_cur = cur
    if form == "array":  # the bare event-list form: one JSON value per event
        unnest = (f"SELECT json AS e FROM read_json($path, format='array', records=false, "
                  f"columns={{'json': '{EVENT_TYPE[:-2]}'}}, maximum_object_size={limit})")
    else:
        try:  # big files: stream the events list (see jsonstream); small ones: one whole-object read is quicker
            if _max_object_size(path) < STREAM_ABOVE_BYTES:
                raise LayoutError("small file")
            stream = EventsStream(path)
            # DuckDB registers one Python-object filesystem per database: stage in a private one
            cur = duckdb.connect(":memory:", config={"temp_directory": ""})
            rel = cur.read_json(io.BufferedReader(stream, buffer_size=1 << 22), format="array", records="false",
                                columns={"e": EVENT_TYPE[:-2]}, maximum_object_size=EVENT_MAX_BYTES)
            rel.create_view(f"kev_{fid}")
            unnest = f"SELECT e FROM kev_{fid}"
        except LayoutError:
            stream = None
            unnest = f"SELECT unnest(traceEvents) AS e FROM {src}"
    try:
        # one JSON parse of args per event: json_extract_string with a list of paths
        paths = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in ARG_PATHS) + "]"
        a = "a[{}]"
        cur.execute(
            f"""CREATE TEMP TABLE {stage} AS
            SELECT ph, cat, name, pid, tid, ts_ns, dur_ns,
                   {a.format(1)} AS corr, coalesce({a.format(2)}, {a.format(3)}) AS ext,
                   {a.format(4)} AS bytes, {a.format(5)} AS stream,
                   coalesce({a.format(6)}, {a.format(7)}) AS shapes, {a.format(8)} AS dtypes, {a.format(9)} AS flops,
                   {a.format(10)} AS stack, {a.format(11)} AS meta_name, {a.format(12)} AS in_nelems,
                   {a.format(13)} AS msg_dtype, coalesce({a.format(14)}, {a.format(15)}) AS pg_name,
                   {a.format(16)} AS group_size, {a.format(17)} AS grid, {a.format(18)} AS block,
                   {a.format(19)} AS blocks_per_sm, {a.format(20)} AS warps_per_sm, {a.format(21)} AS occupancy,
                   {a.format(22)} AS regs, {a.format(23)} AS smem
            FROM (
                SELECT e.ph AS ph, e.cat AS cat, e.name AS name, e.pid AS pid, e.tid AS tid,
                       {_US_TO_NS.format(x='e.ts')} AS ts_ns, {_US_TO_NS.format(x='e.dur')} AS dur_ns,
                       CASE WHEN e.args IS NULL THEN NULL ELSE json_extract_string(e.args, {paths}) END AS a
                FROM ({unnest})
            )""",
            {"path": str(path)} if stream is None else {},
        )
        if stream is not None:
            header = _header_from_stream(stream)
        else:
            header = _header_from_head(path) if form != "array" else None
        if stream is None and header is not None and header[2] is None and _looks_relative(cur, stage):
            header = None  # relative timestamps but no base in the head: read the header keys properly
        if header is None and form != "array":
            header = cur.execute(
                f"SELECT distributedInfo::VARCHAR, deviceProperties::VARCHAR, baseTimeNanoseconds, displayTimeUnit FROM {src}",
                {"path": str(path)},
            ).fetchall()[0]
    except Exception as exc:  # duckdb raises its own error types for bad JSON / gzip / IO
        cur.execute(f"DROP TABLE IF EXISTS {stage}")
        cur.close()
        if cur is not main_cur:
            main_cur.close()
        raise ParseError(path, "not a readable Kineto trace: " + _short_duckdb_error(exc)) from None
    finally:
        if stream is not None:
            stream.close()
    if cur is not main_cur:  # hand the staged rows to the main database (Arrow, no copy per event in Python)
        staged = cur.sql(f"SELECT * FROM {stage}").to_arrow_table()
        cur.close()
        cur = main_cur
        cur.register(stage, staged)
        try:
            return _from_stage(cur, stage, rank, fid, header, path, lctx)
        finally:
            cur.unregister(stage)
            cur.close()
            del staged
    try:
        return _from_stage(cur, stage, rank, fid, header, path, lctx)
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {stage}")
        cur.close()


def _short_duckdb_error(exc: Exception) -> str:
    msg = one_line(str(exc), 200)
    for prefix in ("Invalid Input Error: ", "IO Error: ", "Conversion Error: ", "Binder Error: "):
        msg = msg.replace(prefix, "")
    if "maximum_object_size" in msg:  # the user has no such option: say what it means
        msg = f"an event or object larger than the {EVENT_MAX_BYTES >> 20} MiB limit (corrupt or hostile file); refused"
    msg = re.sub(r'"?DUCKDB_INTERNAL_OBJECTSTORE://[0-9a-f]+"?', "the trace", msg)
    return msg


def _from_stage(cur: Any, stage: str, rank: int, fid: int, header: Any, path: Path, lctx: LoadContext) -> dict[str, Any]:
    dist_json, devprops_json, base_ns_text, _display_unit = header or (None, None, None, None)
    base_ns = 0
    if base_ns_text:
        try:
            base_ns = int(float(base_ns_text)) if "." in base_ns_text or "e" in base_ns_text.lower() else int(base_ns_text)
        except ValueError:
            lctx.warn("bad_value", f"baseTimeNanoseconds {base_ns_text[:40]!r} is not a number; ignored", path)
    # If timestamps are already absolute (µs since epoch ~ 1e15), a base would double count.
    if base_ns:
        first_ts = cur.execute(f"SELECT median(ts_ns) FROM {stage} WHERE ph = 'X'").fetchall()[0][0]
        if first_ts is not None and first_ts > 10**17:
            base_ns = 0
    bad = cur.execute(
        f"""SELECT count(*) FILTER (WHERE ph = 'X' AND (ts_ns IS NULL OR dur_ns IS NULL)),
                   count(*) FILTER (WHERE ph = 'X' AND dur_ns < 0)
            FROM {stage}"""
    ).fetchall()[0]
    if bad[0]:
        lctx.warn("bad_events", f"{bad[0]} events without a usable ts/dur were dropped", path)
    if bad[1]:
        lctx.warn("bad_events", f"{bad[1]} events with a negative duration were dropped", path)
    total = cur.execute(f"SELECT count(*) FROM {stage} WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns >= 0").fetchall()[0][0]
    if total == 0:
        raise ParseError(path, "the trace holds no timed events (traceEvents missing or empty)", code="empty_trace")
    if lctx.max_events is not None and total > lctx.max_events:
        raise ParseError(path, f"{total} events exceed --max-events {lctx.max_events}", code="too_big")
    lc = "lower(coalesce(cat, ''))"
    cur.execute(
        f"""INSERT INTO events
        SELECT $rank AS rank, NULL AS step,
          CASE
            WHEN {lc} = 'kernel' THEN CASE WHEN regexp_matches(name, $comm_kernel) THEN 'comm' ELSE 'kernel' END
            WHEN {lc} IN ('gpu_memcpy', 'memcpy') THEN 'memcpy'
            WHEN {lc} IN ('gpu_memset', 'memset') THEN 'memset'
            WHEN {lc} IN {RUNTIME_CATS} THEN CASE WHEN regexp_matches(name, $sync) THEN 'sync' ELSE 'runtime' END
            WHEN {lc} = 'cuda_sync' THEN 'sync'
            WHEN name LIKE 'ProfilerStep#%' AND {lc} NOT IN ('gpu_user_annotation') THEN 'step'
            WHEN name LIKE 'enumerate(DataLoader)%' THEN 'dataloader'
            WHEN {lc} = 'gpu_user_annotation' THEN 'annotation'
            WHEN regexp_matches(name, $comm_host) THEN 'comm'
            WHEN {lc} IN ('cpu_op', 'operator') THEN 'host_op'
            WHEN {lc} IN ('python_function', 'python') THEN 'python'
            WHEN {lc} IN ('user_annotation') THEN 'annotation'
            ELSE 'other'
          END AS kind,
          coalesce(name, '') AS name, cat, pid, tid,
          {lc} IN {DEVICE_CATS} AS device,
          TRY_CAST(stream AS BIGINT) AS stream,
          ts_ns + $base AS start_ns, dur_ns,
          TRY_CAST(corr AS BIGINT) AS corr, TRY_CAST(ext AS BIGINT) AS ext_id,
          coalesce(TRY_CAST(bytes AS BIGINT),
                   TRY_CAST(in_nelems AS BIGINT) * ({DTYPE_BYTES_SQL.format(d='msg_dtype')})) AS bytes,
          shapes, dtypes, TRY_CAST(flops AS DOUBLE) AS flops, stack, $fid AS file_id
        FROM {stage}
        WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns >= 0 AND {lc} NOT IN ('trace', 'ac2g', 'flow')""",
        {"rank": rank, "comm_kernel": COMM_KERNEL_RE, "sync": SYNC_RE, "comm_host": COMM_HOST_RE, "base": base_ns, "fid": fid},
    )
    cur.execute(
        f"""INSERT INTO tracks
        SELECT $rank, pid, tid, bool_or(device), max(process_name), max(thread_name) FROM (
            SELECT pid, tid, {lc} IN {DEVICE_CATS} AS device, NULL AS process_name, NULL AS thread_name
              FROM {stage} WHERE ph = 'X'
            UNION ALL
            SELECT pid, NULL, NULL, meta_name, NULL FROM {stage} WHERE ph = 'M' AND name = 'process_name'
            UNION ALL
            SELECT pid, tid, NULL, NULL, meta_name FROM {stage} WHERE ph = 'M' AND name = 'thread_name'
        ) GROUP BY pid, tid""",
        {"rank": rank},
    )
    # per-kernel launch geometry where the trace has it (current schema): the GPU analogue of Ascend's block dim
    cur.execute(
        f"""INSERT INTO kernels (rank, name, op_type, core_type, start_ns, dur_ns, block_dim, pmu)
        SELECT $rank, name, NULL, 'GPU', ts_ns + $base, dur_ns,
          TRY_CAST(list_aggregate(TRY_CAST(grid AS BIGINT[]), 'product') AS INTEGER),
          json_object('grid', TRY_CAST(grid AS JSON), 'block', TRY_CAST(block AS JSON), 'blocks_per_sm', TRY_CAST(blocks_per_sm AS DOUBLE),
                      'warps_per_sm', TRY_CAST(warps_per_sm AS DOUBLE), 'occupancy_pct', TRY_CAST(occupancy AS DOUBLE),
                      'registers_per_thread', TRY_CAST(regs AS BIGINT), 'shared_memory', TRY_CAST(smem AS BIGINT))
        FROM {stage}
        WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns >= 0 AND lower(coalesce(cat, '')) = 'kernel'
          AND grid IS NOT NULL AND NOT regexp_matches(name, $comm_kernel)""",
        {"rank": rank, "base": base_ns, "comm_kernel": COMM_KERNEL_RE},
    )
    cur.execute(
        f"""INSERT INTO comm_ops
        SELECT $rank, NULL, name,
          regexp_replace(lower(regexp_extract(name, '(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|send_?recv|send|recv|reduce|barrier|gather|scatter)', 1, 'i')), '_', '', 'g'),
          pg_name, ts_ns + $base, dur_ns, NULL, NULL, NULL, NULL,
          coalesce(TRY_CAST(bytes AS BIGINT), TRY_CAST(in_nelems AS BIGINT) * ({DTYPE_BYTES_SQL.format(d='msg_dtype')}))
        FROM {stage}
        WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns >= 0 AND lower(coalesce(cat, '')) = 'kernel'
          AND regexp_matches(name, $comm_kernel)""",
        {"rank": rank, "base": base_ns, "comm_kernel": COMM_KERNEL_RE},
    )
    info: dict[str, Any] = {"events": total}
    if devprops_json:
        import json

        try:
            props = json.loads(devprops_json)
            if isinstance(props, list) and props and isinstance(props[0], dict):
                info["device_name"] = str(props[0].get("name", ""))[:200] or None
                info["device_count"] = len(props)
        except ValueError:
            pass
    if dist_json:
        import json

        try:
            dist = json.loads(dist_json)
            if isinstance(dist, dict):
                info["distributed"] = dist
        except ValueError:
            pass
    cur.execute("UPDATE profile_files SET events = ? WHERE file_id = ?", [total, fid])
    return info
