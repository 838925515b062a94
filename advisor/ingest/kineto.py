"""PyTorch profiler (Kineto) traces -> canonical tables.

Reads every Kineto variant: the old schema (categories ``Operator``, ``Runtime``, ``Kernel``,
``Memcpy``, ``Memset``), the current one (``cpu_op``, ``cuda_runtime``, ``kernel``,
``gpu_memcpy``, ``gpu_memset``, ``user_annotation``, ``gpu_user_annotation``,
``python_function``), CPU-only traces, ROCm (``hip*`` runtime names), traces with or without
``distributedInfo`` and ``baseTimeNanoseconds``.

Parsing is done by DuckDB's JSON reader with explicit column types; no Python object is made per
event. Each file's ``traceEvents`` list is first copied to a temporary file as a top-level array
(:class:`advisor.ingest.jsonstream.SpilledEvents`: a kernel copy, or gzip on the way): DuckDB
reads an array in parallel and in bounded buffers, while a whole top-level object costs ~10x its
size on one thread. Files DuckDB cannot read that way fall back to the whole-object reader.

* small files (the usual one-per-rank cluster export) are read together, one ``read_json`` scan
  per ~1 GiB of them (:func:`load_many`); the others one by one (:func:`load`);
* a scan writes one table with the ``events`` columns plus the one field another table needs
  (:func:`_fill_part`); steps are built from it and assigned in place, ``tracks`` / ``comm_ops``
  filled from it, and the table becomes (part of) ``events``: no staged copy. A kernel's launch
  grid is its ``events.block_dim``: no second table repeats the kernel rows (their long names).

Time: Chrome-trace ``ts``/``dur`` are microseconds whatever ``displayTimeUnit`` says (that key
only sets the viewer's display unit). When ``baseTimeNanoseconds`` is present, ``ts`` is relative
to it (Kineto >= 2.1 writes relative timestamps to keep precision) and the base is added back.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import duckdb

from advisor.ingest.base import (
    DUCKDB_ERRORS,
    FAR_TIMES_SQL,
    FAR_TIMES_WARNING,
    MAX_TRACE_FILES,
    NAME_MAX,
    TEXT_MAX,
    InputError,
    LoadContext,
    ParseError,
    Unit,
    bounded_sql,
    checkpoint,
    cut_sql,
    duckdb_name,
    duckdb_path,
    insert_rows,
    is_gzip,
    one_line,
    overlapping_files,
    read_head,
    release_memory,
    too_small_to_compress,
    update_rows,
)
from advisor.ingest.jsonstream import (
    ENCODING_ERROR,
    TRAILER_MAX,
    LayoutError,
    SpilledEvents,
    find_close,
    gzip_limit,
    header_value,
    sanitise_json,
)
from advisor.ingest.kineto_counters import COUNTER_SQL, insert_counters
from advisor.ingest.steps import build_steps, drop_window_lookup, step_of, window_lookup
from advisor.kinds import Source
from advisor.schema import DTYPE_BYTES_SQL

SOURCE = Source.KINETO.value

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
    "'baseTimeNanoseconds': 'VARCHAR', 'displayTimeUnit': 'VARCHAR', 'host_name': 'VARCHAR'}"
)

# args fields read (one JSON parse of args per event): name used in SQL -> JSON path; both
# spellings of the old and new schema where they differ
_ARGS = {
    "corr": '$.correlation', "ext": '$."External id"', "ext_lower": '$."external id"', "bytes": '$.bytes',
    "stream": '$.stream', "dims": '$."Input Dims"', "dims_lower": '$."Input dims"', "types": '$."Input type"',
    "flops": '$.flops', "stack": '$."Call stack"', "meta_name": '$.name', "nelems": '$."In msg nelems"',
    "dtype": '$.dtype', "pg_name": '$."Process Group Name"', "pg_desc": '$."Process Group Description"',
    "grid": '$.grid', "wait_stream": '$.wait_on_stream', "wait_corr": '$.wait_on_cuda_event_record_corr_id',
    # the peer of a point-to-point operation (:func:`_p2p_links`): record_param_comms' collective
    # name, global peer ("Src Rank" of a recv, "Dst Rank" of a send), group-local peer ("Rank") and
    # the group's global ranks; gloo's c10d::send / c10d::recv_ give the group-local peer as their
    # third concrete input
    "coll": '$."Collective name"', "p2p_src": '$."Src Rank"', "p2p_dst": '$."Dst Rank"', "p2p_peer": '$.Rank',
    "pg_ranks": '$."Process Group Ranks"', "rank_start": '$."Global rank start"',
    "rank_stride": '$."Global rank stride"', "concrete": '$."Concrete Inputs"',
}
ARG_PATHS = tuple(_ARGS.values())
_ARG_INDEX = {k: i + 1 for i, k in enumerate(_ARGS)}  # 1-based, as SQL lists are
# the same fields read as a STRUCT by the JSON reader itself (no second parse of ``args``: ~0.3 s
# less per GB). Struct fields are matched case-sensitively but cannot differ only by case, so a
# file whose events spell a key in lower case (``"external id"``, ``"Input dims"``: the old
# schema) is read with the JSON path above (:data:`LOWER_CASE_KEYS`, looked for in its first MiB of events)
# The numeric fields are typed as numbers there: a JSON number goes straight into the column (as
# text it was formatted by the reader and parsed again by a TRY_CAST; 32 ranks x 10 MB: scan
# -0.06 s). A value the type does not take (a string that is no number, an integer beyond BIGINT,
# a grid that is not a list of integers) fails the scan, and the JSON path reads the files with
# TRY_CAST: that value is NULL, as before. The one difference: a JSON true / false reads as 1 / 0
# (the JSON path: NULL); no exporter writes one.
_ARG_KEYS = {k: p[2:].strip('"') for k, p in _ARGS.items()}
_STRUCT_TYPES = {"corr": "BIGINT", "ext": "BIGINT", "bytes": "BIGINT", "stream": "BIGINT", "flops": "DOUBLE",
                 "nelems": "BIGINT", "grid": "BIGINT[]",
                 "wait_stream": "BIGINT", "wait_corr": "BIGINT"}
ARGS_STRUCT = "STRUCT(" + ", ".join(f'"{key}" {_STRUCT_TYPES.get(k, "VARCHAR")}' for k, key in _ARG_KEYS.items()
                                    if not k.endswith("_lower")) + ")"
LOWER_CASE_KEYS = tuple(b'"' + _ARG_KEYS[k].encode() + b'"' for k in _ARGS if k.endswith("_lower"))

# device-side activity of other accelerators Kineto records: MTIA's command-processor events are its kernels
OTHER_DEVICE_KERNEL_CATS = ("mtia_ccp_events",)
DEVICE_CATS = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync",
               *OTHER_DEVICE_KERNEL_CATS)
# host-side runtime / driver API categories of Kineto (CUDA, ROCm, Intel XPU, PrivateUse1 backends, MTIA);
# "privateuse1_driver" is not among them: some backends (AWS Neuron) log device execution under it
RUNTIME_CATS = ("cuda_runtime", "runtime", "cuda_driver", "hip_runtime", "xpu_runtime", "xpu_driver",
                "privateuse1_runtime", "mtia_runtime")
COMM_KERNEL_RE = r"(?i)nccl|rccl|hccl|msccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv"
COMM_HOST_RE = r"^(nccl|gloo|mpi|ucc|hccl|c10d):|^c10d::|^record_param_comms$|^c10d_functional::"
# categories whose ProfilerStep#N-named events are not host step markers (checked before the marker test)
_NOT_MARK_CATS = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "cuda_sync", "gpu_user_annotation",
                  *OTHER_DEVICE_KERNEL_CATS) + RUNTIME_CATS
# runtime calls that block the host on the device: synchronize calls, stream queries and the
# blocking (non-Async) copies of CUDA / ROCm (``hipMemcpyWithStream`` is ROCm's blocking copy on a stream)
SYNC_RE = (r"(?i)synchronize$|^(cuda|hip)StreamQuery$"
           r"|^(cuda|hip)Memcpy(WithStream|2D|3D|DtoH|HtoD|DtoD|ToSymbol|FromSymbol|Peer)?$|^cuMemcpy(DtoH|HtoD)(_v2)?$")

# SQL: the event kind (schema.KINDS) from ``lcat`` (lower-case category) and ``name``. A device
# kernel is 'kernel' here; the communication ones (COMM_KERNEL_RE) become 'comm' after the scan,
# their names tested once each (:func:`_comm_kernels`): kernel names are long, a regular
# expression on every kernel event cost more than the rest of its row
_KIND_SQL = f"""CASE
    WHEN lcat IN {("kernel", *OTHER_DEVICE_KERNEL_CATS)} THEN 'kernel'
    WHEN lcat IN ('gpu_memcpy', 'memcpy') THEN 'memcpy'
    WHEN lcat IN ('gpu_memset', 'memset') THEN 'memset'
    WHEN lcat IN {RUNTIME_CATS} THEN CASE WHEN regexp_matches(name, '{SYNC_RE.replace("'", "''")}') THEN 'sync' ELSE 'runtime' END
    WHEN lcat = 'cuda_sync' THEN 'sync'
    WHEN name LIKE 'ProfilerStep#%' AND lcat NOT IN ('gpu_user_annotation') THEN 'step'
    WHEN name LIKE 'enumerate(DataLoader)%' THEN 'dataloader'
    WHEN lcat = 'gpu_user_annotation' THEN 'annotation'
    WHEN regexp_matches(name, '{COMM_HOST_RE.replace("'", "''")}') THEN 'comm'
    WHEN lcat IN ('cpu_op', 'operator') THEN 'host_op'
    WHEN lcat IN ('python_function', 'python') THEN 'python'
    WHEN lcat IN ('user_annotation') THEN 'annotation'
    ELSE 'other'
END"""

STREAM_ABOVE_BYTES = 256 << 20  # estimated uncompressed size from which a file is read on its own, not batched
EVENT_MAX_BYTES = 64 << 20  # one event larger than this is refused (bounds memory on hostile input)

# SQL expression: text (JSON number or string) in µs -> integer ns. Exact for decimal text.
_US_TO_NS = "TRY_CAST(round(TRY_CAST({x} AS DECIMAL(38,6)) * 1000) AS BIGINT)"


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
    """Claim the Kineto trace files among ``files`` (one unit per file; ranks are decided later).
    Raises InputError when more than :data:`MAX_TRACE_FILES` are named like traces (before any is read)."""
    named = [p for p in files if _NAME_RE.search(p.name)]
    if len(named) > MAX_TRACE_FILES:
        import os

        folder = os.path.commonpath([str(p.parent) for p in named])
        raise InputError(f"{one_line(folder)}: {len(named):,} trace files (*.json, *.json.gz), more than the "
                         f"{MAX_TRACE_FILES:,} advisor reads at once (4,096 ranks x 4 files); analyse a folder "
                         "holding fewer ranks")
    units = []
    for p in named:
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
        whole = len(head) < HEAD_BYTES
        n_begin_end = _untimed(head, form, whole=whole, path=p)
        if n_begin_end is not None:  # no rank for it: the real traces keep theirs
            ctx_warn("empty_trace", _no_events_reason(n_begin_end) + "; skipped, given no rank", p)
            continue
        unit = Unit(SOURCE, [p], p, run_key=worker_key(p), info={"form": form})
        # a head that is the whole file holds whatever the file's end holds: no second read
        trailing = form == "object" and (not whole or b'"distributedInfo"' in head)
        dist = _distributed_info(head) or (_trailing_distributed_info(p) if trailing else None)
        if dist:
            rank = _named_rank(dist)
            if rank is not None:
                unit.rank_hint, unit.rank_source = rank, "distributedInfo"
            unit.world_size, unit.backend = _world_and_backend(dist)
        if unit.rank_hint is None:
            for rx in _RANK_IN_NAME:
                mm = rx.search(p.name)
                if mm:
                    unit.rank_hint, unit.rank_source = int(mm.group(1)), "file_name"
                    break
        units.append(unit)
    return units


HEAD_BYTES = 65536  # what read_head() reads by default: a shorter head is the whole file


_TIMED_RE = re.compile(rb'"ph"\s*:\s*"X"')
_BEGIN_END_RE = re.compile(rb'"ph"\s*:\s*"[BE]"')


def _untimed_beyond_head(path: Path | None, chunk: int = 1 << 20) -> int | None:
    """For a file larger than its head: None as soon as a complete event's ``"ph": "X"`` shows
    (real traces have one within their first kilobytes), else, having read the whole file
    (decompressed), the number of its begin / end events. Text inside a string that looks like
    the phase only keeps a file, never drops one."""
    if path is None:
        return None
    tail = b""
    n_begin_end = 0
    read = 0
    try:
        with path.open("rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            fh: Any = gzip.GzipFile(fileobj=raw) if gz else raw
            limit = gzip_limit(path.stat().st_size) if gz else None
            raw.seek(0)
            while block := fh.read(chunk):
                read += len(block)
                if limit is not None and read > limit:
                    return None  # a gzip bomb: the load refuses it
                text = tail + block
                if _TIMED_RE.search(text):
                    return None
                cut = max(len(text) - 32, 0)  # a phase split between two blocks is matched with the next one
                n_begin_end += sum(1 for m in _BEGIN_END_RE.finditer(text) if m.start() < cut)
                tail = text[cut:]
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return None  # the scan reports an unreadable file
    return n_begin_end + len(_BEGIN_END_RE.findall(tail))


def _untimed(head: bytes, form: str, whole: bool, path: Path | None = None) -> int | None:
    """When the trace holds no complete ('X') event, the number of its begin / end ('B' / 'E')
    events (0: none at all), else None. Known from the first bytes when the event list is empty
    (``"traceEvents": []``) or missing, or when they are the whole file; a larger file whose head
    shows no complete event is read on (decompressed) until one shows."""
    import json

    if form == "object":
        key = head.find(b'"traceEvents"')
        if key >= 0:
            m = re.compile(rb'"traceEvents"\s*:\s*\[\s*(\]?)').match(head, key)
            if m and m.group(1):
                return 0
        elif whole:
            return 0
    if not whole:
        return None if _TIMED_RE.search(head) else _untimed_beyond_head(path)
    try:
        doc = json.loads(head)
    except (ValueError, RecursionError):  # not valid JSON, not UTF-8, nested too deep: the scan reports it
        return None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return 0 if isinstance(doc, dict) and events is None else None
    phases = [e.get("ph") for e in events if isinstance(e, dict)]
    if "X" in phases:
        return None
    return sum(1 for ph in phases if ph in ("B", "E"))


HEADER_KEYS = ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "displayTimeUnit", "host_name")


def _header(head: bytes, trailer: dict[str, Any]) -> tuple[Any, ...]:
    """(distributedInfo JSON, deviceProperties JSON, baseTimeNanoseconds text, displayTimeUnit, host_name)
    from the bytes before the events, else from the keys written after them."""
    import json

    vals = []
    for key in HEADER_KEYS:
        v = header_value(head, key)
        vals.append(trailer.get(key) if v is None else v)
    dist, props, base, unit, host = vals
    return (
        None if dist is None else json.dumps(dist),
        None if props is None else json.dumps(props),
        None if base is None else str(base),
        unit,
        host if isinstance(host, str) else None,
    )


def _header_from_head(path: Path) -> tuple[Any, ...] | None:
    """Kineto writes its header keys before ``traceEvents``: read them from the first bytes
    instead of parsing the whole file a second time. None when the events come first."""
    head = read_head(path, 1 << 20)
    cut = head.find(b'"traceEvents"')
    return None if cut < 0 else _header(head[:cut], {})


def _header_from_whole(cur: Any, path: Path) -> tuple[Any, ...]:
    """The header keys wherever they are in the file (a second full parse: only when needed)."""
    return cast(tuple[Any, ...], cur.execute(
        f"SELECT distributedInfo::VARCHAR, deviceProperties::VARCHAR, baseTimeNanoseconds, displayTimeUnit, host_name "
        f"FROM read_json($path, columns={COLUMNS}, format='auto', maximum_object_size={_max_object_size(path)})",
        {"path": duckdb_path(path)},
    ).fetchall()[0])


def _named_rank(dist: dict[str, Any]) -> int | None:
    """The ``rank`` of a distributedInfo object when it is a plausible rank, else None."""
    rank = dist.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 24 else None


def _world_and_backend(dist: dict[str, Any]) -> tuple[int | None, str | None]:
    """``world_size`` (a positive integer) and ``backend`` (text) of a distributedInfo object, else None."""
    ws, backend = dist.get("world_size"), dist.get("backend")
    return (ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None,
            backend[:40] if isinstance(backend, str) else None)


def _trailing_distributed_info(path: Path) -> dict[str, Any] | None:
    """The ``distributedInfo`` object written after the events (a trace rewritten with its keys
    reordered), from the last 64 KiB of a plain file; None for a gzip file (its end is only
    reached by decompressing it all) or when there is none."""
    if is_gzip(path):
        return None
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TRAILER_MAX))
            tail = fh.read()
    except OSError:
        return None
    if b'"distributedInfo"' not in tail:
        return None
    try:
        _pos, trailer = find_close(tail)
    except LayoutError:
        return None
    obj = trailer.get("distributedInfo")
    return obj if isinstance(obj, dict) else None


def _distributed_info(head: bytes) -> dict[str, Any] | None:
    """The ``distributedInfo`` object from the start of a trace (Kineto writes it before the events)."""
    obj = header_value(head, "distributedInfo")
    return obj if isinstance(obj, dict) else None


def _gzip_isize(path: Path) -> int | None:
    """The uncompressed size mod 2**32 that a gzip file's trailer holds; None for other files."""
    if not is_gzip(path):
        return None
    try:
        with path.open("rb") as fh:
            fh.seek(-4, 2)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0


def _max_object_size(path: Path) -> int:
    """DuckDB's ``maximum_object_size`` for reading the file whole: its uncompressed size with
    a margin (a gzip file: at least 20x its compressed size, as the trailer's size wraps at 4 GiB,
    and at most the gzip bomb limit)."""
    size = path.stat().st_size
    isize = _gzip_isize(path)
    if isize is not None:
        size = min(max(isize, size * 20), gzip_limit(size))
    return int(min(max(size * 1.05 + (1 << 20), 1 << 24), (1 << 32) - 2))


def _estimated_size(path: Path) -> int:
    """The file's uncompressed size as far as it is known cheaply, to plan the batched scans: a
    plain file's size; a gzip file's trailer size, unless that is below the compressed size (it
    wrapped at 4 GiB: counted as 4 GiB, which no batch takes). Unlike :func:`_max_object_size`,
    no floor: 256 traces of 2 MB are one batch, not four of 64 at 16 MiB each."""
    size = path.stat().st_size
    isize = _gzip_isize(path)
    if isize is None:
        return size
    return isize if isize >= size else max(size * 20, 1 << 32)


_GLOB_CHARS = re.compile(r"[*?\[\]{}]")  # DuckDB would expand these in a file name
BATCH_BYTES = 1 << 30  # estimated uncompressed bytes read by one batched scan


def _paths_sql() -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in ARG_PATHS) + "]"


def _arg_of(key: str, struct: bool = False) -> str:
    """SQL: the args field ``key`` (see ARG_PATHS) from ``a``: as text from the list extracted from
    the JSON text, or (``struct``) from the STRUCT the reader made (numeric fields typed, see
    :data:`ARGS_STRUCT`), which has no lower-case spellings (an untyped NULL: it takes the type of
    the field it is coalesced with)."""
    if not struct:
        return f"a[{_ARG_INDEX[key]}]"
    return "NULL" if key.endswith("_lower") else f'a."{_ARG_KEYS[key]}"'


def _event_type(struct: bool, numeric: bool = False) -> str:
    """The type of one event: ``args`` as JSON text, or (``struct``) as :data:`ARGS_STRUCT`;
    ``ts`` / ``dur`` as text, or (``numeric``) as DOUBLE (see :func:`_to_ns`)."""
    t = EVENT_TYPE[:-2].replace("args JSON", f"args {ARGS_STRUCT}") if struct else EVENT_TYPE[:-2]
    return t.replace("ts VARCHAR, dur VARCHAR", "ts DOUBLE, dur DOUBLE") if numeric else t


def _events_sql(unnest: str, struct: bool = False, numeric: bool = False) -> str:
    """SELECT turning raw events into rows with the ``events`` columns (times in ns relative to
    the file's base, no rank or step yet) plus the fields other tables need: ``x_extra``, the
    process / thread name of a metadata row (``kind = 'meta'``), and ``x_group``, a kernel's
    process group. ``ph`` X and M; B and E as metadata rows with a NULL ``device``, only counted
    (a warning names how many were not read). One JSON parse of ``args`` per
    event. ``unnest`` yields ``fid`` and ``e`` (the event struct; ``struct``: its ``args`` typed
    :data:`ARGS_STRUCT`, else JSON; ``numeric``: ``ts`` / ``dur`` DOUBLE, else text)."""
    def _arg(key: str) -> str:
        return _arg_of(key, struct)

    def sync_id(key: str) -> str:  # a cuda_sync record's stream / correlation; Kineto writes -1 for unknown
        x = f"TRY_CAST({_arg(key)} AS BIGINT)"
        return f"CASE WHEN lcat = 'cuda_sync' AND {x} >= 0 THEN {x} END"

    dtype = DTYPE_BYTES_SQL.format(d=_arg("dtype"))
    return f"""SELECT fid, CASE WHEN ph IN ('M', 'B', 'E', 'C') THEN 'meta' ELSE {_KIND_SQL} END AS kind,
           {bounded_sql("coalesce(name, '')")} AS name, {bounded_sql("cat")} AS cat, {bounded_sql("pid")} AS pid,
           {bounded_sql("tid")} AS tid,
           CASE WHEN ph IN ('B', 'E') THEN NULL ELSE lcat IN {DEVICE_CATS} END AS device,
           TRY_CAST({_arg("stream")} AS BIGINT) AS stream, ts_ns, dur_ns,
           TRY_CAST({_arg("corr")} AS BIGINT) AS corr,
           TRY_CAST(coalesce({_arg("ext")}, {_arg("ext_lower")}) AS BIGINT) AS ext_id,
           coalesce(TRY_CAST({_arg("bytes")} AS BIGINT), TRY_CAST({_arg("nelems")} AS BIGINT) * ({dtype})) AS bytes,
           {bounded_sql(f'coalesce({_arg("dims")}, {_arg("dims_lower")})', TEXT_MAX)} AS shapes,
           {bounded_sql(_arg("types"), TEXT_MAX)} AS dtypes,
           TRY_CAST({_arg("flops")} AS DOUBLE) AS flops, {bounded_sql(_arg("stack"), TEXT_MAX)} AS stack,
           CASE WHEN ph = 'M' THEN {bounded_sql(_arg("meta_name"))} WHEN ph = 'C' THEN {COUNTER_SQL} END AS x_extra,
           CASE WHEN lcat = 'kernel' THEN TRY_CAST(list_aggregate(TRY_CAST({_arg("grid")} AS BIGINT[]), 'product') AS INTEGER)
           END AS block_dim,
           {sync_id("wait_stream")} AS wait_stream, {sync_id("wait_corr")} AS wait_corr,
           CASE WHEN lcat = 'kernel' THEN {bounded_sql(f'coalesce({_arg("pg_name")}, {_arg("pg_desc")})')} END AS x_group,
           {_p2p_sql(_arg)} AS x_p2p
    FROM (
        SELECT fid, e.ph AS ph, e.cat AS cat, lower(coalesce(e.cat, '')) AS lcat, e.name AS name, e.pid AS pid,
               e.tid AS tid, {_to_ns('e.ts', numeric)} AS ts_ns, {_to_ns('e.dur', numeric)} AS dur_ns,
               {"e.args" if struct else f"CASE WHEN e.args IS NULL THEN NULL ELSE json_extract_string(e.args, {_paths_sql()}) END"} AS a,
               {"NULL" if struct else "CASE WHEN e.ph = 'C' THEN CAST(e.args AS VARCHAR) END"} AS c_args
        FROM ({unnest})
        WHERE e.ph IN ('X', 'M', 'B', 'E', 'C')
    )"""


# host operators that name the peer of a point-to-point transfer: record_param_comms (any backend
# that records its parameters: NCCL, XCCL ...) and the c10d dispatcher ops (gloo records only these)
P2P_C10D_OPS = ("c10d::send", "c10d::recv_", "c10d::recv")
_P2P_TYPE = ("STRUCT(via VARCHAR, op VARCHAR, peer_global BIGINT, peer_local BIGINT, pg VARCHAR, pg_ranks VARCHAR, "
             "rank_start BIGINT, rank_stride BIGINT)")


def _p2p_sql(arg: Callable[[str], str]) -> str:
    """SQL: for a host operator of a point-to-point transfer, what the trace says of its peer
    (:data:`_P2P_TYPE`: ``via`` 'param' for record_param_comms, 'c10d' for a c10d op; ``op``
    send / recv; ``peer_global`` the global peer where torch wrote it; ``peer_local`` the group-local peer;
    the group's name, ranks, start and stride); NULL for every other event. ``arg``: :func:`_arg_of`."""
    coll = f"lower({arg('coll')})"

    def num(key: str) -> str:
        return f"TRY_CAST({arg(key)} AS BIGINT)"

    return f"""CASE WHEN lcat NOT IN ('cpu_op', 'operator') THEN NULL
        WHEN name = 'record_param_comms' AND {coll} IN ('send', 'recv') THEN CAST(ROW('param', {coll},
            CASE {coll} WHEN 'send' THEN {num("p2p_dst")} ELSE {num("p2p_src")} END, {num("p2p_peer")},
            {arg("pg_name")}, {arg("pg_ranks")}, {num("rank_start")}, {num("rank_stride")}) AS {_P2P_TYPE})
        WHEN name IN ({", ".join(_sql_str(k) for k in P2P_C10D_OPS)}) THEN CAST(ROW('c10d',
            CASE WHEN name = 'c10d::send' THEN 'send' ELSE 'recv' END, NULL,
            CASE WHEN json_valid({arg("concrete")}) THEN TRY_CAST(json_extract_string({arg("concrete")}, '$[2]') AS BIGINT)
            END, NULL, NULL, NULL, NULL) AS {_P2P_TYPE})
        END"""


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _to_ns(x: str, numeric: bool = False) -> str:
    """SQL: µs -> integer ns, from ``x``: a DOUBLE (``numeric``) or the text of a JSON number or
    string. DuckDB's JSON reader parses every JSON number to a double first (the text of
    ``1682725897235145.123`` read as VARCHAR is ``1682725897235145.0``), so the double is all
    there is to convert. A DOUBLE is split into whole µs and fraction (both exact in a double)
    and each scaled as an integer: ``round(x * 1000)`` alone would round absolute times
    (~1.7e18 ns, beyond 2^53) to multiples of 256 ns. Text: short text (at most 15 characters:
    ~15 significant digits, all a double holds exactly, so ``round(x * 1000)`` is exact) goes
    through DOUBLE, longer integers through HUGEINT, longer decimals through DECIMAL. Beyond
    ~285 years (no BIGINT of ns), NaN or not a number: NULL. One difference between the two: the
    numeric scan reads a JSON ``true`` / ``false`` as 1 / 0 (no exporter writes one; the text
    path drops such an event with a warning)."""
    if numeric:
        return (f"CASE WHEN abs({x}) < 9e15 THEN CAST(floor({x}) AS BIGINT) * 1000 "
                f"+ CAST(round(({x} - floor({x})) * 1000) AS BIGINT) END")
    return (
        f"CASE WHEN length({x}) <= 15 THEN TRY_CAST(round(TRY_CAST({x} AS DOUBLE) * 1000) AS BIGINT) "
        f"WHEN contains({x}, '.') OR contains({x}, 'e') OR contains({x}, 'E') THEN {_US_TO_NS.format(x=x)} "
        f"ELSE TRY_CAST(TRY_CAST({x} AS HUGEINT) * 1000 AS BIGINT) END"
    )


def _array_scan(kf: str, struct: bool = False, numeric: bool = False) -> str:
    """SQL yielding ``fid``, ``e`` for the top-level event arrays listed in ``$paths`` (file
    names mapped to file ids by the table ``kf``; ``struct``, ``numeric``: see :func:`_event_type`)."""
    etype = _event_type(struct, numeric).replace("'", "''")
    return (f"SELECT f.fid AS fid, t.json AS e FROM read_json($paths, format='array', records=false, "
            f"columns={{'json': '{etype}'}}, maximum_object_size={EVENT_MAX_BYTES}, filename=true) t "
            f"JOIN {kf} f ON f.fname = t.filename")


class _File:
    """One trace file being loaded: its unit, id, rank, header keys and what DuckDB reads
    (``src_path``: the trace or a copy of its events; ``src``: that path as DuckDB is given it,
    ``fname``: as DuckDB names it, see :func:`advisor.ingest.base.duckdb_path`)."""

    def __init__(self, unit: Unit, fid: int, header: Any, src: Path, reread_header: bool = False,
                 struct: bool = False) -> None:
        self.unit, self.fid, self.header = unit, fid, header
        self.read_from(src)
        self.struct = struct  # args may be read as a STRUCT (:data:`ARGS_STRUCT`): no lower-case key seen
        self.reread_header = reread_header  # header read from the head only: base time may follow the events
        self.path = unit.files[0]
        self.rank = unit.rank

    def read_from(self, src: Path) -> None:
        """Read ``src`` for this file. Raises ParseError for a name DuckDB cannot take literally."""
        self.src_path, self.src, self.fname = src, duckdb_path(src), duckdb_name(src)


def _fid(unit: Unit, lctx: LoadContext) -> int:
    return _fids([unit], lctx)[0]


def _fids(units: list[Unit], lctx: LoadContext) -> list[int]:
    """The units' file ids, registering those without one (one statement for all)."""
    new = [u for u in units if u.info.get("fid") is None]
    if new:
        for u, fid in zip(new, lctx.file_ids([(u.files[0], u.rank, SOURCE) for u in new]), strict=True):
            u.info["fid"] = fid  # a unit read again on its own keeps its id
    return [u.info["fid"] for u in units]


def _batches(units: list[Unit]) -> list[list[tuple[int, Unit, int]]]:
    """The batched scans :func:`load_many` makes: lists of (index in units, unit, estimated
    size), ~:data:`BATCH_BYTES` each; a batch of one unit is read on its own instead."""
    batches: list[list[tuple[int, Unit, int]]] = []
    total = BATCH_BYTES
    for i, u in enumerate(units):
        path = u.files[0]
        if u.info.get("form", "object") == "array" and _GLOB_CHARS.search(str(path)):
            continue  # read by its own name, which DuckDB would expand
        size = _estimated_size(path)
        if size >= STREAM_ABOVE_BYTES:
            continue
        if total + size > BATCH_BYTES:
            batches.append([])
            total = 0
        batches[-1].append((i, u, size))
        total += size
    return [b for b in batches if len(b) >= 2]


def load_many(units: list[Unit], lctx: LoadContext) -> dict[int, dict[str, Any] | None]:
    """Load many small Kineto files with one ``read_json`` scan per batch (DuckDB parses them in
    parallel); per-file statements cost more than the parse on clusters of small ranks.

    Returns ``{index in units: info, or None when the file was rejected with a warning}``; the
    units left out (large, odd names, laid out unexpectedly, or in a batch whose scan failed)
    are loaded one by one with :func:`load`, which reports their problems precisely.
    """
    done: dict[int, dict[str, Any] | None] = {}
    for batch in _batches(units):
        done.update(_load_batch(batch, lctx))
    return done


_SPILL = "spill"  # Unit.info key: the Future of the unit's SpilledEvents, started by prefetch()


def prefetch(units: list[Unit]) -> Callable[[], None]:
    """Start copying the event lists of the files of :func:`load_many`'s first scan (see
    :func:`_spill`; the next scans' copies are made when their turn comes, so that no more than
    ~1 GiB is copied at a time) in background threads: the copies (kernel work, outside the
    GIL) overlap the loader's set-up (database, tables, file ids). Returns a function to call
    when the load is over: it waits for the copies and deletes those no scan took."""
    batches = _batches([u for u in units if u.source == SOURCE])
    mine = [u for _i, u, _s in batches[0] if u.info.get("form", "object") != "array"] if batches else []
    if len(mine) < 2:
        return lambda: None
    import os
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1))
    for u in mine:
        u.info[_SPILL] = pool.submit(_spill_one, u)
    pool.shutdown(wait=False)

    def cleanup() -> None:
        for u in mine:
            fut = u.info.pop(_SPILL, None)
            sp = fut.result() if fut is not None else None
            if sp is not None:
                sp.close()

    return cleanup


def _spill_one(u: Unit) -> SpilledEvents | None:
    """The unit's event list copied to a temporary file; None where the layout is not recognised
    or the copy failed: that file is read on its own by :func:`load`, which reports precisely.
    A plain file in the bare event-list form is read as it is (None); a gzip one is copied
    decompressed, under the gzip bomb limit."""
    array = u.info.get("form", "object") == "array"
    if array and not is_gzip(u.files[0]):
        return None
    try:
        return SpilledEvents(u.files[0], probe=LOWER_CASE_KEYS, array=array)
    except (LayoutError, OSError, EOFError, ValueError, zlib.error):
        return None


def _spill(units: list[Unit]) -> list[SpilledEvents | None]:
    """Each object-form file's event list copied to a temporary file (a few files at a time: the
    copy is kernel work or gzip, both outside the GIL), or taken from :func:`prefetch`."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        futures = [u.info.pop(_SPILL, None) or pool.submit(_spill_one, u) for u in units]
        return [f.result() for f in futures]


def _load_batch(batch: list[tuple[int, Unit, int]], lctx: LoadContext) -> dict[int, dict[str, Any] | None]:
    """Read the files of ``batch`` with one ``read_json`` scan (see :func:`_fill_part`). The copies
    of the event lists are deleted in a background thread as soon as their scan has read them:
    unlinking a copy frees its pages, ~1 ms of kernel time per 10 MB (32 ranks x 10 MB: ~38 ms),
    which the loader's own thread no longer waits for."""
    from concurrent.futures import ThreadPoolExecutor

    deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="advisor-unlink")
    spills = _spill([u for _i, u, _s in batch])
    lctx.scan_starting()
    try:
        entries = [(i, u, sp) for (i, u, _s), sp in zip(batch, spills, strict=True)
                   if sp is not None or (u.info.get("form") == "array" and not is_gzip(u.files[0]))]
        if len(entries) < 2:
            return {}
        fids = _fids([u for _i, u, _sp in entries], lctx)
        files = [_File(u, fid, None if sp is None else _header(sp.head_bytes, sp.trailer),
                       u.files[0] if sp is None else sp.path,
                       struct=sp is not None and not sp.found and u.info.get("form") != "array")
                 for (_i, u, sp), fid in zip(entries, fids, strict=True)]
        results: dict[int, dict[str, Any] | ParseError] = {}
        spill_of = {f.fid: sp for f, (_i, _u, sp) in zip(files, entries, strict=True)}
        cur = lctx.cursor()
        try:
            # one scan per way of reading args (files in the old schema's spelling by the JSON path)
            for group in ([f for f in files if f.struct], [f for f in files if not f.struct]):
                if group:
                    def scanned(group: list[_File] = group) -> None:
                        deleter.submit(_close_all, [spill_of[f.fid] for f in group])
                    try:
                        results.update(_fill_part(cur, f"kpart_{group[0].fid}", group, None, lctx, scanned))
                    except _SCAN_ERRORS:  # one bad or big file fails the scan: the group's
                        pass  # files are read on their own
        finally:
            cur.close()
    finally:
        deleter.shutdown(wait=True)
        _close_all(spills)  # those no scan took (deleting a copy twice does nothing)
    out: dict[int, dict[str, Any] | None] = {}
    for (i, _u, _sp), f in zip(entries, files, strict=True):
        if f.fid not in results:
            continue  # its scan failed: load() reads it again and reports precisely
        res = results[f.fid]
        if isinstance(res, ParseError):
            lctx.warn(res.code, res.message, res.path)
            out[i] = None
        else:
            out[i] = res
    return out


def _close_all(spills: list[SpilledEvents | None]) -> None:
    """Delete the copies (one already deleted is left as it is)."""
    for sp in spills:
        if sp is not None:
            sp.close()


def load(unit: Unit, lctx: LoadContext) -> dict[str, Any]:
    """Load one Kineto file into the canonical tables as ``unit.rank``. Raises ParseError."""
    path = unit.files[0]
    fid = _fid(unit, lctx)
    cur = lctx.cursor()
    spill = None
    f: _File | None = None
    try:
        unnest = None
        if unit.info.get("form", "object") == "array":  # the bare event-list form: read as it is
            if is_gzip(path):  # decompressed to a copy first: DuckDB's own gunzip knows no bomb limit
                try:
                    spill = SpilledEvents(path, array=True)
                except ValueError as exc:  # a gzip bomb
                    raise ParseError(path, str(exc), code="too_big") from None
                except (OSError, EOFError, zlib.error) as exc:
                    raise ParseError(path, f"not a readable gzip file: {one_line(exc, 120)}") from None
            f = _File(unit, fid, None, path if spill is None else spill.path)
        else:
            try:
                fut = unit.info.pop(_SPILL, None)  # copied by prefetch() (a failed copy is made again: its error)
                spill = (fut.result() if fut is not None else None) or SpilledEvents(path, probe=LOWER_CASE_KEYS)
                f = _File(unit, fid, _header(spill.head_bytes, spill.trailer), spill.path, struct=not spill.found)
            except ValueError as exc:  # a gzip bomb
                raise ParseError(path, str(exc), code="too_big") from None
            except (LayoutError, OSError, EOFError, zlib.error):
                # not laid out as expected, truncated, or no room for the copy: DuckDB's
                # whole-object reader either manages (with more memory) or reports the precise error
                limit = _max_object_size(path)
                unnest = (f"SELECT {int(fid)} AS fid, unnest(traceEvents) AS e FROM read_json($paths, "
                          f"columns={COLUMNS}, format='auto', maximum_object_size={limit})")
                header = _header_from_head(path)
                f = _File(unit, fid, header, path, reread_header=header is not None)
                if header is None:
                    f.header = _header_from_whole(cur, path)
        try:
            res = _fill_part(cur, f"kpart_{fid}", [f], unnest, lctx)[fid]
        except DUCKDB_ERRORS as exc:
            if not (isinstance(exc, UnicodeDecodeError) or ENCODING_ERROR.search(str(exc))):
                raise
            res = _fill_sanitised(cur, f, unnest, lctx, exc)
    except DUCKDB_ERRORS as exc:  # duckdb raises its own error types for bad JSON / gzip / IO
        msg = "invalid data (not UTF-8)" if isinstance(exc, UnicodeDecodeError) else str(exc)
        if f is not None:  # name the user's file as they gave it, not the copy DuckDB read
            msg = msg.replace(f.src, str(path)).replace(f.fname, str(path))
            if f.src_path != path:  # a copy's byte offsets mean nothing to the user
                msg = re.sub(r",? at byte \d+", "", msg)
        raise ParseError(path, "not a readable Kineto trace: " + _short_duckdb_error(msg)) from None
    finally:
        if spill is not None:
            spill.close()
        cur.close()
    if isinstance(res, ParseError):
        raise res
    return res


def _fill_sanitised(cur: Any, f: _File, unnest: str | None, lctx: LoadContext,
                    error: BaseException) -> dict[str, Any] | ParseError:
    """Read ``f`` again from a copy whose strings DuckDB refused (bytes that are not UTF-8, lone
    surrogate escapes) are replaced by U+FFFD (see :func:`sanitise_json`): one bad operator
    name costs that name, not the trace. The replacements are counted in a warning. Raises
    ``error`` (DuckDB's) when there was nothing to replace."""
    import os
    import tempfile

    fd, name = tempfile.mkstemp(prefix="advisor-clean-", suffix=".json")
    src = f.src_path
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                replaced = sanitise_json(src, out)
        except (OSError, EOFError, zlib.error):  # no room for the copy, a truncated gzip: DuckDB's error stands
            replaced = 0
        except ValueError as exc:  # a gzip bomb
            raise ParseError(f.path, str(exc), code="too_big") from None
        if not replaced:  # the error was another one, reported as it is
            raise error
        f.read_from(Path(name))
        res = _fill_part(cur, f"kpart_{f.fid}", [f], unnest, lctx)[f.fid]
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass
    lctx.warn("bad_strings", f"{replaced} invalid UTF-8 sequences or lone surrogate escapes in its strings (operator "
              "names ...) were replaced by U+FFFD; the rest of the trace is read", f.path)
    return res


def _short_duckdb_error(exc: Exception | str) -> str:
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
        base = int(float(text)) if "." in text or "e" in text.lower() else int(text)
    except (ValueError, OverflowError):  # not a number, or inf
        lctx.warn("bad_value", f"baseTimeNanoseconds {text[:40]!r} is not a number; ignored", f.path)
        return 0
    if not 0 <= base < BASE_MAX_NS:
        lctx.warn("bad_value", f"baseTimeNanoseconds {text[:40]!r} is not a time since the epoch in ns; ignored", f.path)
        return 0
    return base


BASE_MAX_NS = 1 << 62  # ~year 2116 in ns since the epoch; a larger base overflows the ns columns


def _fill_part(cur: Any, part: str, files: list[_File], unnest: str | None, lctx: LoadContext,
               scanned: Callable[[], object] | None = None) -> dict[int, dict[str, Any] | ParseError]:
    """Read ``files`` with one scan into the table ``part``, which becomes (part of) ``events``.

    ``unnest`` yields ``fid`` and ``e`` per event; None reads ``f.src`` of every file as a
    top-level event array (DuckDB reads an array in parallel in bounded buffers; a whole object
    costs ~10x its size on one thread, hence the spilled copies). The scan writes the ``events``
    columns plus the one extra field the other tables need; then per file the base time is
    settled and bad rows counted, tracks filled, metadata and untimed rows deleted, steps built
    and assigned in place (an UPDATE of one column), comm_ops filled from the part,
    the extra column dropped and the part handed to the loader. No row is copied twice.
    ``scanned`` is called once the scan has read the files (their copies may go).
    Raises duckdb.Error when the scan fails (the part is dropped then), EventCapReached when a
    batch reaches ``--max-events`` (see below).
    """
    from advisor.schema import TABLES

    kf = f"{part}_f"
    bases = {f.fid: _base_ns((f.header or (None, None, None, None))[2], f, lctx) for f in files}
    cur.execute(f"CREATE OR REPLACE TEMP TABLE {kf} (fname VARCHAR, fid INTEGER, rank INTEGER, base_ns BIGINT, path VARCHAR)")
    insert_rows(cur, kf, [(f.fname, f.fid, f.rank, bases[f.fid], str(f.path)) for f in files])
    try:
        # typed as the schema says: the part may become ``events`` itself (renamed, not copied)
        cols = ", ".join(f"CAST({_PART_COLUMNS.get(c.name, c.name)} AS {c.sql_type}) AS {c.name}" for c in TABLES["events"].columns)
        # args as a STRUCT when every file allows it, ts / dur as numbers: a file that does not
        # fit (an args that is not an object, a ts that is not a number ...) fails that scan, and
        # the most tolerant one (args as JSON, times as text) then reads it or reports the error
        tolerant = (False, False)
        tries = [(all(f.struct for f in files), True), tolerant] if unnest is None else [tolerant]
        # --max-events N: the scan stops at N + 1 events a file (a batch: at N + 1 times its
        # files, a sign that one holds more; its files are then read one by one)
        cap = None if lctx.max_events is None else (max(lctx.max_events, 0) + 1) * len(files)
        for struct, numeric in tries:
            try:
                events = _events_sql(unnest or _array_scan(kf, struct, numeric), struct, numeric)
                if cap is not None:
                    events = f"SELECT * FROM ({events}) LIMIT {cap}"
                cur.execute(
                    f"CREATE TABLE {part} AS SELECT {cols}, x_extra, x_group, x_p2p "
                    f"FROM ({events}) JOIN {kf} f USING (fid)",
                    {"paths": [f.src for f in files]},
                )
                break
            except DUCKDB_ERRORS:
                cur.execute(f"DROP TABLE IF EXISTS {part}")
                if (struct, numeric) == tolerant:
                    raise
        if cap is not None and len(files) > 1 and cur.execute(f"SELECT count(*) FROM {part}").fetchone()[0] >= cap:
            cur.execute(f"DROP TABLE {part}")
            raise EventCapReached(part)
        if scanned is not None:
            scanned()
        release_memory()  # the JSON reader's buffers
        _compress(cur)
        try:
            return _finish_part(cur, part, kf, files, bases, lctx)
        except DUCKDB_ERRORS:
            cur.execute(f"DROP TABLE IF EXISTS {part}")  # the files are read again on their own, under this name
            raise
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {kf}")


class EventCapReached(Exception):
    """A batched scan read ``--max-events`` + 1 events per file: some file holds more; each is
    read on its own, which stops at its own limit."""



# a batched scan that fails or passes the event cap: its files are read one by one
_SCAN_ERRORS: tuple[type[BaseException], ...] = (*DUCKDB_ERRORS, EventCapReached)

def _compress(cur: Any) -> None:
    """Compress the freshly scanned part before it is worked on: the statements that follow
    (deletes, the step UPDATE, comm_ops) read it compressed and only what they change
    is rewritten at the next checkpoint; compressing after them cost the same time at a higher
    peak (32 ranks x 10 MB: 610 -> 490 MB; 500 MB: 830 -> 680 MB). Best effort: DuckDB refuses a
    checkpoint while another file's load writes (the final one then compresses). Not done while
    the database is small (:func:`advisor.ingest.base.too_small_to_compress`)."""
    if too_small_to_compress(cur):
        return
    try:
        checkpoint(cur)
    except duckdb.Error:
        return
    release_memory()


# events columns of a part that are not taken as they are from _events_sql (the rest are)
#: meta key (per rank) of the ns a Kineto file's ``ts`` counts from
TIME_BASE_KEY = "kineto.time_base_ns"

_PART_COLUMNS = {"rank": "f.rank", "step": "NULL::INTEGER", "start_ns": "ts_ns + f.base_ns", "file_id": "fid"}


def _finish_part(cur: Any, part: str, kf: str, files: list[_File], bases: dict[int, int],
                 lctx: LoadContext) -> dict[int, dict[str, Any] | ParseError]:
    stats = {
        r[0]: r[1:]
        for r in cur.execute(
            f"""SELECT file_id, median(start_ns) FILTER (WHERE kind <> 'meta'),
                   count(*) FILTER (WHERE kind <> 'meta' AND (start_ns IS NULL OR dur_ns IS NULL)),
                   count(*) FILTER (WHERE kind <> 'meta' AND dur_ns < 0),
                   count(*) FILTER (WHERE kind <> 'meta' AND dur_ns >= 0 AND {FAR_TIMES_SQL}),
                   count(*) FILTER (WHERE kind <> 'meta' AND start_ns IS NOT NULL AND dur_ns >= 0 AND NOT {FAR_TIMES_SQL}),
                   count(*) FILTER (WHERE kind = 'meta' AND device IS NULL),
                   count(*), count(DISTINCT name) FILTER (WHERE {cut_sql("name")})
            FROM {part} GROUP BY file_id"""
        ).fetchall()
    }
    results: dict[int, dict[str, Any] | ParseError] = {}
    ok, gone, shift = [], [], []
    for f in files:
        med, n_null, n_neg, n_far, total, n_begin_end, n_read, n_cut = stats.get(f.fid, (None, 0, 0, 0, 0, 0, 0, 0))
        base = bases[f.fid]
        if f.reread_header and f.header is not None and f.header[2] is None and med is not None and med < 10**17:
            # relative timestamps but no base before the events: it may follow them
            f.header = _header_from_whole(cur, f.path)
            base = _base_ns(f.header[2], f, lctx)
            if base:
                shift.append((base, f.fid))
        elif base and med is not None and med - base > 10**17:
            shift.append((-base, f.fid))  # timestamps already absolute (µs since the epoch): a base would count twice
        dist_json, devprops_json = (f.header or (None, None))[:2]
        if n_cut:
            lctx.warn("long_names", f"{n_cut} names longer than {NAME_MAX} characters were cut to their first {NAME_MAX} "
                      "(marked '…[cut: <length> chars, #<hash>]')", f.path)
        if n_null:
            lctx.warn("bad_events", f"{n_null} events without a usable ts/dur were dropped", f.path)
        if n_neg:
            lctx.warn("bad_events", f"{n_neg} events with a negative duration were dropped", f.path)
        if n_far:
            lctx.warn("bad_events", FAR_TIMES_WARNING.format(n=n_far), f.path)
        if n_begin_end and total:
            lctx.warn("bad_events", f"{n_begin_end} begin / end ('B' / 'E') events were not read: advisor reads "
                      "complete ('X') events, the only duration events Kineto writes; the time they cover is "
                      "missing from the analysis", f.path)
        if not total:
            results[f.fid] = ParseError(f.path, _no_events_reason(n_begin_end), code="empty_trace")
            gone.append(f.fid)
        elif lctx.max_events is not None and n_read > lctx.max_events:
            results[f.fid] = ParseError(f.path, f"more than {lctx.max_events} events (--max-events {lctx.max_events}): "
                                        "refused", code="too_big")
            gone.append(f.fid)
        else:
            results[f.fid] = _info(devprops_json, dist_json, total, f.header[4] if f.header else None)
            ok.append((total, f.fid))
    if shift:
        update_rows(cur, part, "start_ns = start_ns + v.value", "file_id", shift)
    # the time base each kept file's ``ts`` is relative to (start_ns = ts x 1000 + base): what the
    # report needs to give times in the input trace's own ``ts`` units
    moved = {fid: v for v, fid in shift}
    kept = {fid for _, fid in ok}
    insert_rows(cur, "meta", [(f.rank, TIME_BASE_KEY, str(bases[f.fid] + moved.get(f.fid, 0)))
                              for f in files if f.fid in kept])
    gone_sql = ", ".join(map(str, gone)) or "NULL"
    if not ok:
        cur.execute(f"DROP TABLE {part}")
        return results
    if gone:
        cur.execute(f"DELETE FROM {kf} WHERE fid IN ({gone_sql})")
    # tracks before the metadata and untimed rows go
    cur.execute(
        f"""INSERT INTO tracks
        SELECT rank, pid, tid, bool_or(device), max(process_name), max(thread_name) FROM (
            SELECT rank, pid, tid, device, NULL AS process_name, NULL AS thread_name FROM {part} WHERE kind <> 'meta'
            UNION ALL
            SELECT rank, pid, NULL, NULL, x_extra, NULL FROM {part} WHERE kind = 'meta' AND name = 'process_name' AND device IS NOT NULL
            UNION ALL
            SELECT rank, pid, tid, NULL, NULL, x_extra FROM {part} WHERE kind = 'meta' AND name = 'thread_name' AND device IS NOT NULL
        ) WHERE rank IN (SELECT rank FROM {kf}) GROUP BY rank, pid, tid"""
    )
    # whether the part may hold device events (its tracks say, a superset: rows of dropped files)
    # and point-to-point records: without them their passes are skipped
    has_device, has_p2p = cur.execute(
        f"""SELECT coalesce((SELECT bool_or(device) FROM tracks WHERE rank IN (SELECT rank FROM {kf})), false),
                  EXISTS (SELECT 1 FROM {part} WHERE x_p2p IS NOT NULL)"""
    ).fetchall()[0]
    insert_counters(cur, part, [(f.fid, f.rank, f.path) for f in files if f.fid not in gone])  # counter events ('C')
    cur.execute(
        f"""DELETE FROM {part} WHERE kind = 'meta' OR start_ns IS NULL OR dur_ns IS NULL OR dur_ns < 0 OR {FAR_TIMES_SQL}
            OR lower(coalesce(cat, '')) IN ('trace', 'ac2g', 'flow') OR file_id IN ({gone_sql})"""
    )
    has_comm = _comm_kernels(cur, part)
    marks = (f"(SELECT rank, kind = 'step' AS is_mark, kind, device, tid, name, start_ns, dur_ns, corr, file_id AS fid "
             f"FROM {part})")
    stepped = _steps_from_part(cur, marks, kf, files, lctx, {fid: n for n, fid in ok}, has_device,
                               on_drop=lambda ids: cur.execute(f"DELETE FROM {part} WHERE file_id IN ({ids})"))
    # comm_ops first, their steps by the window join (the part is still unchanged), then the
    # part's own steps by one UPDATE
    ranks_sql = ", ".join(map(str, sorted(stepped))) or "NULL"
    lookup, hlookup = f"{part}_sw", f"{part}_sh"
    # the step windows: for comm_ops, point-to-point transfers and device events; the host
    # windows: for host events (built only where they are read)
    win = window_lookup(cur, lookup, ranks_sql) if has_comm or has_p2p or (stepped and has_device) else None
    hwin = window_lookup(cur, hlookup, ranks_sql, host=True) if stepped else None
    try:
        step = f"CASE WHEN t.rank IN ({ranks_sql}) THEN {step_of('t.start_ns')} END"
        if has_comm and win is not None:
            _comm_ops(cur, part, win.join, step)
        if has_p2p and win is not None:
            _p2p_links(cur, part, win.join, step, files, lctx)
        _pg_groups(cur, files)
        cur.execute(f"ALTER TABLE {part} DROP COLUMN x_extra")
        cur.execute(f"ALTER TABLE {part} DROP COLUMN x_group")
        cur.execute(f"ALTER TABLE {part} DROP COLUMN x_p2p")
        release_memory()  # before the UPDATE, the peak of the load
        # device events by the step windows, host events by the host windows
        if win is not None and stepped and has_device:
            cur.execute(f"UPDATE {part} t SET step = s.step FROM {lookup} s WHERE t.rank IN ({ranks_sql}) AND t.device "
                        f"AND {win.match}")
        if hwin is not None:
            cur.execute(f"UPDATE {part} t SET step = s.step FROM {hlookup} s WHERE t.rank IN ({ranks_sql}) "
                        f"AND NOT t.device AND {hwin.match}")
    finally:
        if win is not None:
            drop_window_lookup(cur, lookup)
        if hwin is not None:
            drop_window_lookup(cur, hlookup)
    update_rows(cur, "profile_files", "events = v.value", "file_id", ok)
    lctx.mark_stepped(stepped)
    lctx.add_events_part(part)
    return results


def _comm_ops(cur: Any, part: str, join: str, step: str) -> None:
    """The communication kernels of the part -> ``comm_ops``, their steps by the window ``join``
    (``step``: the SQL of an event's step)."""
    a2a = _all_to_all_launches(cur, part)
    cur.execute(
            f"""INSERT INTO comm_ops
            SELECT t.rank, {step}, t.name,
              CASE WHEN a.corr IS NOT NULL THEN 'alltoall' ELSE
              regexp_replace(lower(regexp_extract(t.name, '(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|send_?recv|send|recv|reduce|barrier|gather|scatter)', 1, 'i')), '_', '', 'g')
              END,
              t.x_group, t.start_ns, t.dur_ns, NULL, NULL, NULL, NULL, t.bytes, t.file_id
            FROM {part} t {join} LEFT JOIN {a2a} a ON a.rank = t.rank AND a.corr = t.corr
            WHERE t.kind = 'comm' AND lower(coalesce(t.cat, '')) = 'kernel'"""
    )
    cur.execute(f"DROP TABLE IF EXISTS {a2a}")


# a backend's annotation of one point-to-point transfer, e.g. ``gloo:send``, ``nccl:send 0->1``
_P2P_ANNOTATION_RE = r"^(\w+):(send|recv)\b"
# SQL: bytes of such an annotation, from its first input (dims x dtype; "c10::BFloat16" -> "bfloat16")
_ANNOTATION_BYTES = ("CASE WHEN json_valid(shapes) AND json_valid(dtypes) THEN "
                     "CAST(list_aggregate(TRY_CAST(json_extract(shapes, '$[0]') AS BIGINT[]), 'product') AS BIGINT) * ("
                     + DTYPE_BYTES_SQL.format(d="regexp_replace(json_extract_string(dtypes, '$[0]'), '^c10::', '')")
                     + ") END")


def _p2p_links(cur: Any, part: str, join: str, step: str, files: list[_File], lctx: LoadContext) -> None:
    """Point-to-point transfers of the part -> ``comm_matrix``, one row per transfer.

    The peer is read where the trace writes it: record_param_comms' ``Dst Rank`` / ``Src Rank``
    (global), else its ``Rank`` (the peer within the process group) mapped to a global rank by the
    group's ranks (``Process Group Ranks``, ``Global rank start`` / ``stride``, or the group in
    ``distributedInfo.pg_config``); gloo's ``c10d::send`` / ``c10d::recv_`` (which gloo records
    without record_param_comms) give the group-local peer only, mapped when every group of
    ``pg_config`` that holds the rank maps it to the same global rank. A c10d op that holds a
    record_param_comms transfer is the same transfer and is not counted again. Bytes: the
    record's ``In msg nelems`` x ``dtype``, else the backend's annotation inside the op
    (``gloo:send``: its input's dims x dtype), which also names the backend. A peer that cannot
    be mapped is not guessed: the transfer is left out, with a warning.

    Rows: ``rank`` the trace's rank, ``name`` send / recv, ``src_rank`` -> ``dst_rank`` the
    direction of the data, ``transport`` ``kineto:<backend>`` (see advisor.stages.comm_links),
    ``transit_ns`` NULL: the op's duration includes waiting for the peer.
    """
    rows = cur.execute(
        f"""WITH p AS (
            SELECT row_number() OVER () AS pid, t.rank, t.file_id, t.tid, t.start_ns, t.start_ns + t.dur_ns AS end_ns,
                   t.bytes, t.x_p2p AS x, {step} AS step
            FROM {part} t {join} WHERE t.x_p2p IS NOT NULL
        ),
        a AS (
            SELECT rank, tid, start_ns, lower(regexp_extract(name, {_sql_str(_P2P_ANNOTATION_RE)}, 1)) AS backend,
                   {_ANNOTATION_BYTES} AS bytes
            FROM {part} WHERE kind = 'comm' AND NOT device AND regexp_matches(name, {_sql_str(_P2P_ANNOTATION_RE)})
              AND rank IN (SELECT DISTINCT rank FROM p)
        ),
        j AS (
            SELECT p.pid, arg_min(a.bytes, a.start_ns) AS bytes, arg_min(a.backend, a.start_ns) AS backend
            FROM p JOIN a ON a.rank = p.rank AND a.tid IS NOT DISTINCT FROM p.tid
                         AND a.start_ns >= p.start_ns AND a.start_ns <= p.end_ns
            GROUP BY p.pid
        )
        SELECT p.rank, p.file_id, p.step, p.x.op, p.x.peer_global, p.x.peer_local, p.x.pg, p.x.pg_ranks, p.x.rank_start,
               p.x.rank_stride, coalesce(p.bytes, j.bytes), j.backend
        FROM p LEFT JOIN j USING (pid)
        WHERE p.x.via = 'param' OR NOT EXISTS (
            SELECT 1 FROM p q WHERE q.x.via = 'param' AND q.rank = p.rank AND q.tid IS NOT DISTINCT FROM p.tid
              AND q.start_ns >= p.start_ns AND q.start_ns <= p.end_ns)
        ORDER BY p.rank, p.start_ns"""
    ).fetchall()
    if not rows:
        return
    by_fid = {f.fid: f for f in files}
    out: list[tuple[Any, ...]] = []
    no_peer: dict[int, int] = {}  # file id -> transfers without a peer rank
    unmapped: dict[int, int] = {}  # file id -> transfers whose group-local peer has no global rank
    for rank, fid, step_no, op, glob, local, pg, pg_ranks, start, stride, nbytes, backend in rows:
        dist = _dist_of(by_fid.get(fid))
        if glob is not None and glob >= 0:
            peer: int | None = int(glob)
        elif local is None or local < 0:
            no_peer[fid] = no_peer.get(fid, 0) + 1
            continue
        else:
            peer = _global_peer(rank, local, pg, pg_ranks, start, stride, dist)
        if peer is None:
            unmapped[fid] = unmapped.get(fid, 0) + 1
            continue
        src, dst = (rank, peer) if op == "send" else (peer, rank)
        out.append((rank, step_no, pg, op, src, dst, f"kineto:{backend or _backend_of(dist, pg)}", nbytes, None, None))
    for fid, n in no_peer.items():
        lctx.warn("p2p_peer", f"{n} point-to-point transfer(s) record no peer rank (no 'Src Rank' / 'Dst Rank' / "
                  "'Rank' argument, or a c10d::send / recv_ without its concrete inputs: record_shapes off); left out "
                  "of the communication matrix", by_fid[fid].path if fid in by_fid else None)
    for fid, n in unmapped.items():
        lctx.warn("p2p_peer", f"{n} point-to-point transfer(s) name their peer only as a rank within a process group "
                  "whose global ranks the trace does not give (no 'Process Group Ranks', or distributedInfo.pg_config "
                  "missing or ambiguous); left out of the communication matrix",
                  by_fid[fid].path if fid in by_fid else None)
    if out:
        insert_rows(cur, "comm_matrix", out)


def _pg_groups(cur: Any, files: list[_File]) -> None:
    """``distributedInfo.pg_config`` -> ``comm_groups``: each process group a file's rank belongs to, its
    ``pg_name`` being the group id comm_ops carries and its ``pg_desc`` (``default_pg``, Megatron's
    ``TENSOR_MODEL_PARALLEL_GROUP`` ...) the name the parallel-group analysis checks its labels against."""
    import json

    rows = []
    for f in files:
        if f.rank is None:
            continue
        for c in _pg_configs(_dist_of(f)):
            members = _rank_list(c.get("ranks"))
            if not members or f.rank not in members or c.get("pg_name") is None:
                continue
            desc = None if c.get("pg_desc") is None else str(c["pg_desc"])[:200]
            rows.append((f.rank, str(c["pg_name"])[:200], desc, desc, members.index(f.rank), json.dumps(members)))
    if rows:
        cur.executemany("INSERT INTO comm_groups VALUES (?, ?, ?, ?, ?, ?)", rows)


def _dist_of(f: _File | None) -> dict[str, Any]:
    """The ``distributedInfo`` object of a file ({} when it has none or it is not an object)."""
    import json

    text = (f.header or (None,))[0] if f is not None else None
    try:
        dist = json.loads(text) if text else {}
    except ValueError:
        return {}
    return dist if isinstance(dist, dict) else {}


def _rank_list(value: Any) -> list[int] | None:
    """A process group's global ranks from a JSON list or torch's text of one (``"[0, 1, 2]"``;
    a list torch truncated, ``"[0, 1, ...]"``, gives the ranks before the ellipsis)."""
    if isinstance(value, list):
        items: list[Any] = value
    elif isinstance(value, str):
        items = re.findall(r"-?\d+|\.\.\.", value)
        if "..." in items:
            items = items[:items.index("...")]
    else:
        return None
    try:
        ranks = [int(x) for x in items]
    except (TypeError, ValueError):
        return None
    return ranks if all(r >= 0 for r in ranks) else None


def _pg_configs(dist: dict[str, Any]) -> list[dict[str, Any]]:
    cfg = dist.get("pg_config")
    return [c for c in cfg if isinstance(c, dict)] if isinstance(cfg, list) else []


def _global_peer(rank: int, local: int, pg: str | None, pg_ranks: str | None, start: int | None,
                 stride: int | None, dist: dict[str, Any]) -> int | None:
    """The global rank of the group-local peer ``local``, or None when the trace does not say."""
    ranks = _rank_list(pg_ranks)
    if ranks and local < len(ranks):
        return ranks[local]
    if start is not None and start >= 0 and stride is not None and stride > 0:
        return start + local * stride
    groups = _pg_configs(dist)
    if pg is not None:  # the group is named: its entry in pg_config
        groups = [c for c in groups if str(c.get("pg_name")) == pg]
    candidates = set()
    for c in groups:
        members = _rank_list(c.get("ranks"))
        if members is None or local >= len(members) or rank not in members:
            continue
        candidates.add(members[local])
    return candidates.pop() if len(candidates) == 1 else None


def _backend_of(dist: dict[str, Any], pg: str | None) -> str:
    """The backend of a transfer whose trace has no backend annotation: the group's in pg_config
    (``cuda:nccl`` -> nccl), else distributedInfo's, else 'unknown'."""
    for c in _pg_configs(dist):
        if pg is not None and str(c.get("pg_name")) == pg:
            configs = {part.split(":")[-1] for part in str(c.get("backend_config", "")).split(",") if part}
            if len(configs) == 1:
                return configs.pop().lower()
    backend = dist.get("backend")
    return backend.lower() if isinstance(backend, str) and backend else "unknown"


def _all_to_all_launches(cur: Any, part: str) -> str:
    """A temporary table (rank, corr) of the launches made inside a host all-to-all call
    (``nccl:all_to_all``, ``c10d::alltoall_base`` ...): NCCL runs an all-to-all as ``SendRecv``
    kernels, which are a collective of the whole group, not point-to-point transfers.

    A launch is inside such a call when the latest call of its thread that started at or before
    it (ASOF) reaches past it, each call's end being the latest end of the calls of its thread
    started up to it (nested calls: an inner one may end before a launch the outer one holds).
    Linear in the events, where a range join of launches and calls costs their product on a
    thread; only the launches of threads that made such a call are sorted for the join."""
    name = f"{part}_a2a"
    cur.execute(
        f"""CREATE OR REPLACE TEMP TABLE {name} AS
        WITH h AS (SELECT rank, tid, start_ns, max(start_ns + dur_ns) OVER (PARTITION BY rank, tid ORDER BY start_ns) AS end_ns
                   FROM {part}
                   WHERE NOT device AND kind IN ('comm', 'host_op') AND name ILIKE '%all%to%all%'
                     AND regexp_matches(name, '(?i)all_?to_?all'))
        SELECT DISTINCT r.rank, r.corr
        FROM (SELECT rank, tid, start_ns, corr FROM {part} r WHERE NOT device AND kind = 'runtime' AND corr IS NOT NULL
              AND EXISTS (SELECT 1 FROM h WHERE h.rank = r.rank AND h.tid IS NOT DISTINCT FROM r.tid)) r
        ASOF JOIN h ON r.rank = h.rank AND r.tid IS NOT DISTINCT FROM h.tid AND r.start_ns >= h.start_ns
        WHERE r.start_ns < h.end_ns"""
    )
    return name


def _comm_kernels(cur: Any, part: str) -> bool:
    """Device kernels of a communication library (COMM_KERNEL_RE: NCCL, RCCL, HCCL, all-reduce
    ...) become kind 'comm'; each distinct kernel name is tested once. Whether there were any
    (the part's only kind 'comm' rows of category kernel)."""
    # the distinct names are fetched first: a filter on them in the same query is pushed down onto
    # every kernel event
    names = [r[0] for r in cur.execute(f"SELECT DISTINCT name FROM {part} WHERE kind = 'kernel'").fetchall()]
    comm = [r[0] for r in cur.execute(
        f"SELECT n FROM (SELECT unnest($names) AS n) WHERE regexp_matches(n, {_sql_str(COMM_KERNEL_RE)})",
        {"names": names}).fetchall()] if names else []
    if comm:
        cur.execute(f"UPDATE {part} SET kind = 'comm' WHERE kind = 'kernel' AND name IN (SELECT unnest($n))", {"n": comm})
    return bool(comm)


def _steps_from_part(cur: Any, ev: str, kf: str, files: list[_File], lctx: LoadContext, counts: dict[int, int],
                     device: bool, on_drop: Any) -> set[int]:
    """Build the step windows of the ranks whose every file is in this part (others: later).

    ``ev``: the events with ``fid``, ``rank``, ``is_mark``, ``kind``, ``device``, ``tid``, ``name``, ``start_ns``,
    ``dur_ns``, ``corr``. Files of one rank whose time ranges overlap cannot both be its
    timeline: the one with fewer events is dropped here (the same rule as for files loaded one
    by one); ``on_drop(sql_ids)`` removes its rows. ``counts``: the events of each file kept (by id);
    ``device``: False when the part holds no device event.
    """
    ranks = {f.rank for f in files}
    whole = {r for r in ranks if lctx.units_of_rank(r) == sum(1 for f in files if f.rank == r)}
    if not whole:
        return set()
    multi = [r for r in whole if sum(1 for f in files if f.rank == r) > 1]
    if multi:
        spans = sorted(((*r, counts.get(r[0], 0)) for r in cur.execute(
            f"""SELECT f.fid, f.rank, f.path, min(t.start_ns), max(t.start_ns + t.dur_ns)
            FROM {ev} t JOIN {kf} f USING (fid) WHERE f.rank IN ({", ".join(map(str, multi))})
            GROUP BY ALL"""
        ).fetchall()), key=lambda r: (r[1], -r[5], r[0]))
        dropped = [d[0] for d in overlapping_files(spans, lctx.warn, lctx.clashes)]
        if dropped:
            ids = ", ".join(map(str, dropped))
            cur.execute(f"DELETE FROM {kf} WHERE fid IN ({ids})")
            cur.execute(f"DELETE FROM profile_files WHERE file_id IN ({ids})")
            on_drop(ids)
    # the narrow columns the step windows need, read from the part by each statement (each
    # reads the few columns and rows it filters on; a copy of them all cost more than the reads)
    src = (f"(SELECT rank, is_mark, device, tid, CASE WHEN is_mark THEN name END AS name, start_ns, dur_ns, corr "
           f"FROM {ev} WHERE rank IN ({', '.join(map(str, sorted(whole)))}))")
    with lctx.steps_lock:
        build_steps(cur, src, lctx.warn, detail=ev, device=device)
    return whole


def _no_events_reason(n_begin_end: int) -> str:
    """Why a trace gave no timed event: empty, or written with the Chrome format's begin / end
    pairs (``n_begin_end`` of them), which Kineto never writes and advisor does not read."""
    if n_begin_end:
        return ("the trace holds no complete ('X') events, only begin / end ('B' / 'E') pairs: not a PyTorch "
                "profiler (Kineto) export; advisor reads complete events only")
    return "the trace holds no timed events (traceEvents missing or empty)"


def _info(devprops_json: str | None, dist_json: str | None, total: int, host: str | None = None) -> dict[str, Any]:
    import json

    info: dict[str, Any] = {"events": total, "host_name": host[:200] if host else None}
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
                # the world size, backend and rank when claim() did not see them (distributedInfo
                # after the events of a gzip file, whose end claim() does not read): the loader
                # takes the first two and checks the rank against the one it assigned
                info["world_size"], info["backend"] = _world_and_backend(dist)
                info["named_rank"] = _named_rank(dist)
        except ValueError:
            pass
    return info
