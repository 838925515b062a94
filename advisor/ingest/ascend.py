"""Ascend exports (torch_npu ``*_ascend_pt``, MindSpore ``*_ascend_ms``, text or .db) -> canonical tables.

Discovery (:func:`claim`) groups files into rank exports by layout and content, never by one
fixed name (format doc §2.6, §22.1):

* a ``*_ascend_pt`` / ``*_ascend_ms`` folder, or the parent of an ``ASCEND_PROFILER_OUTPUT``
  folder, is one export (one rank); a folder holding many of them is a cluster -> one unit each;
* loose files are recognised by content: a JSON array timeline with Ascend process names, a
  CSV whose header has ``Accelerator Core``, an SQLite ``ascend_*_profiler*.db`` / ``analysis.db``,
  ``profiler_info*.json``, ``profiler_metadata.json``; the files of one folder form one export;
* the rank comes from ``profiler_info_{rank}.json`` (name, then content), the db file name,
  ``RANK_DEVICE_MAP``, or the rank's index in the world group of ``profiler_metadata.json``;
  otherwise ``rank_hint`` stays None and the orchestrator numbers exports by order.

Loading (:func:`load`) reads the text form (:mod:`advisor.ingest.ascend_text`) or, when only a
database is present, the db form (:mod:`advisor.ingest.ascend_db`). Partial exports are normal:
whatever exists is loaded, a missing optional file only produces a warning naming the analyses
that lack it, and a broken file is skipped with a warning while the rest loads.

Clusters: text-form exports load in batches of up to :data:`BATCH_MAX_UNITS` ranks /
:data:`BATCH_MAX_BYTES` of files. ``claim`` registers the batches; the first ``load`` call for a
unit of a batch loads all of its ranks with one set of SQL statements (:func:`load_batch`), the
other calls return their unit's result. An orchestrator may call :func:`load_batch` directly.

Both flavours are served by this module: ``SOURCES`` lists them. Until the orchestrator maps
every name in ``SOURCES`` to this module, units carry ``source = SOURCE`` and the flavour in
``unit.info['flavor']`` (see :data:`UNIT_SOURCE_FOR`).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

from advisor.ingest import ascend_text
from advisor.ingest.ascend_common import (
    SOURCE_MS,
    SOURCE_PT,
    info_meta,
    insert_groups,
    insert_meta,
    metadata_meta,
    rank_from_info,
    rank_from_metadata,
    read_small_json,
    short_error,
    warn_once,
)
from advisor.ingest.base import LoadContext, ParseError, Unit, read_head, update_rows
from advisor.ingest.steps import windows_sql

SOURCE = SOURCE_PT
SOURCES = (SOURCE_PT, SOURCE_MS)
#: The ``unit.source`` written for each flavour. The orchestrator currently looks modules up by
#: their single ``SOURCE``; once it maps every entry of ``SOURCES``, set the MindSpore entry to
#: ``SOURCE_MS`` so ``ranks.source`` says ``ascend_ms``.
UNIT_SOURCE_FOR = {SOURCE_PT: SOURCE_PT, SOURCE_MS: SOURCE_MS}

_EXPORT_DIR_RE = re.compile(r"_ascend_(pt|ms)$", re.IGNORECASE)
_PROF_DIR_RE = re.compile(r"^PROF_\d+_\d+_[0-9A-Za-z]+$")
_TS_IN_NAME = re.compile(r"_(\d{17})_ascend_(?:pt|ms)$", re.IGNORECASE)
_INFO_RE = re.compile(r"^profiler_info(?:_(\d+))?\.json$", re.IGNORECASE)
_DB_RE = re.compile(r"^ascend_(pytorch|mindspore)_profiler(?:_(\d+))?\.db$", re.IGNORECASE)
_MSPROF_DB_RE = re.compile(r"^msprof_\d+\.db$", re.IGNORECASE)
_DEVICE_INFO_RE = re.compile(r"^info\.json\.(\d+)$")
_MINDDATA_RE = re.compile(r"^minddata_pipeline_raw_(\d+)\.csv$", re.IGNORECASE)
_MSPROF_JSON_RE = re.compile(r"^msprof_[\d_]+\.json$", re.IGNORECASE)
_OP_SUMMARY_RE = re.compile(r"^op_summary_[\d_]+\.csv$", re.IGNORECASE)

#: File name -> role (inside an export; loose files are checked by content as well).
ROLE_BY_NAME = {
    "trace_view.json": "trace",
    "trace_view.json.gz": "trace",
    "kernel_details.csv": "kernels",
    "step_trace_time.csv": "step_trace",
    "communication.json": "comm",
    "communication_matrix.json": "matrix",
    "op_statistic.csv": "op_stat",
    "api_statistic.csv": "api_stat",
    "operator_details.csv": "operator_details",
    "memory_record.csv": "memory_record",
    "operator_memory.csv": "operator_memory",
    "npu_module_mem.csv": "module_mem",
    "data_preprocess.csv": "data_preprocess",
    "dataset.csv": "dataset",
    "analysis.db": "analysis_db",
    "communication_analyzer.db": "comm_db",
    "profiler_metadata.json": "metadata",
}
#: Roles that carry profile data (a group of files without any is not an export).
DATA_ROLES = {
    "trace",
    "kernels",
    "step_trace",
    "comm",
    "matrix",
    "op_stat",
    "api_stat",
    "memory_record",
    "module_mem",
    "db",
    "analysis_db",
    "comm_db",
}
#: What each input feeds, for "analyses lack their inputs" warnings.
NEEDS = {
    "trace": "host-side analyses (launch, dispatch, sync, dataloader, queue) and the critical path",
    "kernels": "per-kernel analyses (core type, AI CPU, block dim, PMU/roofline, formats)",
    "comm": "communication wait / synchronization / bandwidth / packet-size analyses",
    "matrix": "link-level analyses (slow link, per-link bandwidth)",
}

_ASCEND_MARKERS = (
    b'"Ascend Hardware"',
    b'"CANN"',
    b'"Overlap Analysis"',
    b'"HostToDevice',
    b'"async_npu"',
    b'"torch_to_npu"',
    b"AscendCL@",
    b'"Task Scheduler"',
    b'"MindSpore"',
    b'"mindspore_to_npu"',
    b'"Python GC"',
    b'"AI Core Freq"',
)
_STRING_TS = re.compile(rb'"ts"\s*:\s*"\d{10,}\.\d{3}"')
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _read_tail(path: Path, n: int = 65536) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read(n)
    except OSError:
        return b""


def _export_root(p: Path) -> tuple[Path, str | None, bool]:
    """(export root, flavour from the folder name or None, inside a recognised export layout)."""
    parents = list(p.parents)
    for anc in parents[:8]:
        m = _EXPORT_DIR_RE.search(anc.name)
        if m:
            return anc, SOURCE_MS if m.group(1).lower() == "ms" else SOURCE_PT, True
    for anc in parents[:3]:
        if anc.name == "ASCEND_PROFILER_OUTPUT":
            return anc.parent, None, True
    for anc in parents[:4]:
        if _PROF_DIR_RE.match(anc.name):
            return anc, None, True
    return p.parent, None, False


def _role(p: Path, root: Path, in_layout: bool) -> str | None:
    """The role of a file within its export, or None when it is not an input we read."""
    name = p.name
    low = name.lower()
    rel = p.relative_to(root).parts if p.is_relative_to(root) else (name,)
    under_prof = bool(_PROF_DIR_RE.match(root.name)) or any(_PROF_DIR_RE.match(x) for x in rel[:-1])
    if in_layout and _EXPORT_DIR_RE.search(root.name):
        # inside *_ascend_pt: the export root itself (info, metadata), ASCEND_PROFILER_OUTPUT,
        # and the device info of the raw CANN folder; FRAMEWORK/, logs/, PROF_* data are raw.
        if under_prof:
            return (
                "device_info"
                if _DEVICE_INFO_RE.match(name) and len(rel) >= 2 and rel[-2].startswith("device_")
                else None
            )
        if len(rel) > 1 and rel[0] != "ASCEND_PROFILER_OUTPUT":
            return None
    elif under_prof:
        # stand-alone msprof: mindstudio_profiler_output/ and analyze/ hold the exports
        if _DEVICE_INFO_RE.match(name) and len(rel) >= 2 and rel[-2].startswith("device_"):
            return "device_info"
        if _MSPROF_JSON_RE.match(name):
            return "trace"
        if _OP_SUMMARY_RE.match(name):
            return "kernels"
        if _MSPROF_DB_RE.match(name):
            return "db"
        if low in ("communication.json", "communication_matrix.json", "communication_analyzer.db"):
            return ROLE_BY_NAME[low]
        return None
    if low in ROLE_BY_NAME:
        return ROLE_BY_NAME[low]
    if _INFO_RE.match(name):
        return "info"
    if _DB_RE.match(name):
        return "db"
    if _MINDDATA_RE.match(name):
        return "minddata"
    return _role_by_content(p)


def _role_by_content(p: Path) -> str | None:
    """A renamed file: recognise the Ascend timeline, kernel table and communication files by their content."""
    low = p.name.lower()
    if not low.endswith((".json", ".json.gz", ".csv")):
        return None
    head = read_head(p, 65536)
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if low.endswith(".csv"):
        first = body.split(b"\n", 1)[0]
        if (b"Accelerator Core" in first or b"Task Type" in first) and b"Start Time(us)" in first:
            return "kernels"
        if b"Computing" in first and b"Communication(Not Overlapped)" in first and b"Free" in first:
            return "step_trace"
        return None
    if body.startswith(b"[") and (
        any(m in head for m in _ASCEND_MARKERS)
        or _STRING_TS.search(head[:8192])
        or any(m in _read_tail(p) for m in _ASCEND_MARKERS)
    ):
        return "trace"  # Ascend process names, or µs timestamps written as strings (Kineto writes numbers)
    if body.startswith(b"{") and b'"Communication Time Info"' in head:
        return "comm"
    if body.startswith(b"{") and b'"Transport Type"' in head and b'"Transit Size(MB)"' in head:
        return "matrix"
    return None


def _content_ok(p: Path, role: str, in_layout: bool) -> bool | None:
    """True: recognised; False: named like an Ascend file but its content says otherwise;
    None: cannot tell from the start of the file (kept only inside an export layout)."""
    if role in ("db", "analysis_db", "comm_db"):
        return read_head(p, 16) == _SQLITE_MAGIC
    if role in (
        "info",
        "metadata",
        "device_info",
        "minddata",
        "dataset",
        "data_preprocess",
        "operator_details",
        "operator_memory",
    ):
        return None
    head = read_head(p, 65536)
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if role == "trace":
        if not body.startswith(b"["):
            return False
        if any(m in head for m in _ASCEND_MARKERS) or _STRING_TS.search(head[:8192]):
            return True
        tail = _read_tail(p)
        return True if any(m in tail for m in _ASCEND_MARKERS) else (None if in_layout else False)
    if role in ("comm", "matrix"):
        if not body.startswith(b"{"):
            return False
        if role == "comm":
            return b"Communication Time Info" in head or None
        return b"Transport Type" in head or b"Transit Size(MB)" in head or None
    first_line = body.split(b"\n", 1)[0]
    # a CSV header that is not the expected one: inside an export the loader says which column is missing
    csv_like = None if (b"," in first_line or b"\t" in first_line or b";" in first_line) else False
    if role == "kernels":
        return (
            (b"Accelerator Core" in first_line or b"Task Type" in first_line) and b"Start Time(us)" in first_line
        ) or csv_like
    if role == "step_trace":
        return (b"Computing" in first_line and b"Free" in first_line) or csv_like
    if role in ("op_stat", "api_stat"):
        return b"Count" in first_line or None
    if role in ("memory_record", "module_mem"):
        return b"Timestamp(us)" in first_line or None
    return None


def _sqlite_problem(p: Path) -> str | None:
    """Why an SQLite file cannot be read (None when it opens and its schema lists)."""
    try:
        con = sqlite3.connect(f"file:{quote(str(p.resolve()))}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as exc:
        return f"not a readable SQLite database ({exc})"
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return None
    except sqlite3.Error as exc:
        return f"corrupt SQLite database ({exc})"
    finally:
        con.close()


def _db_rank(p: Path) -> int | None:
    """``RANK_DEVICE_MAP.rankId`` of a torch_npu / MindSpore db (None when absent or -1)."""
    try:
        con = sqlite3.connect(f"file:{quote(str(p.resolve()))}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return None
    try:
        row = con.execute("SELECT max(rankId) FROM RANK_DEVICE_MAP").fetchone()
        r = row[0] if row else None
        return int(r) if isinstance(r, int) and r >= 0 else None
    except sqlite3.Error:
        return None
    finally:
        con.close()


_RAW_PROF_HINT = (
    "raw CANN profile (PROF_*) without exported data: nothing to read; export it with "
    "`msprof --export=on --output=<this PROF_* folder>` (writes mindstudio_profiler_output/ and msprof_*.db), "
    "or record with torch_npu.profiler (a *_ascend_pt export, experimental_config export_type text or db)"
)


def claim(files: list[Path], warn: Any) -> list[Unit]:
    """Group the Ascend files among ``files`` into one unit per rank export."""
    groups: dict[Path, dict[str, Any]] = {}
    for p in files:
        name = p.name
        low = name.lower()
        if not (low.endswith((".json", ".csv", ".db", ".gz")) or _DEVICE_INFO_RE.match(name)):
            continue
        if "cluster_analysis_output" in p.parts:
            continue  # msprof-analyze's own cluster results: not an input (format doc §19)
        root, flavor, in_layout = _export_root(p)
        role = _role(p, root, in_layout)
        if role is None:
            continue
        try:
            empty = p.stat().st_size == 0
        except OSError:
            continue
        if empty:
            if in_layout or role in DATA_ROLES:
                warn("empty_file", "empty file; skipped", p)
            continue
        ok = _content_ok(p, role, in_layout)
        if ok is False:
            if in_layout:
                warn("bad_file", f"named like an Ascend {role} file but its content does not match; skipped", p)
            continue
        g = groups.setdefault(
            root, {"flavor": flavor, "in_layout": in_layout, "roles": defaultdict(list), "strong": False}
        )
        g["roles"][role].append(p)
        if ok:
            g["strong"] = True
    units: list[Unit] = []
    for root, g in sorted(groups.items(), key=lambda kv: str(kv[0])):
        roles: dict[str, list[Path]] = g["roles"]
        if not (g["in_layout"] or g["strong"]):
            continue
        if not any(r in DATA_ROLES for r in roles):
            if _PROF_DIR_RE.match(root.name) and roles.get("device_info"):
                warn("no_ascend_data", _RAW_PROF_HINT, root)
            elif g["in_layout"] and (roles.get("info") or roles.get("metadata")):
                warn(
                    "no_ascend_data",
                    "Ascend export without ASCEND_PROFILER_OUTPUT data (parsing unfinished or failed?); skipped; "
                    "export it with torch_npu.profiler.profiler.analyse(profiler_path='<the folder holding it>')",
                    root,
                )
            continue
        unit = _make_unit(root, g, warn)
        if unit is not None:
            units.append(unit)
    return _dedupe_ranks(units, warn)


def _make_unit(root: Path, g: dict[str, Any], warn: Any) -> Unit | None:
    roles: dict[str, list[Path]] = g["roles"]
    flavor = g["flavor"]
    info_doc = meta_doc = None
    if roles.get("info"):
        try:
            info_doc = read_small_json(min(roles["info"]))
        except ParseError as exc:
            warn(exc.code, exc.message, exc.path)
    if roles.get("metadata"):
        try:
            meta_doc = read_small_json(roles["metadata"][0])
        except ParseError as exc:
            warn(exc.code, exc.message, exc.path)
    if flavor is None:
        if (
            (isinstance(info_doc, dict) and ("ms_profiler_info" in info_doc or "ms_version" in info_doc))
            or any(_DB_RE.match(p.name) and "mindspore" in p.name.lower() for p in roles.get("db", []))
            or roles.get("dataset")
            or roles.get("minddata")
        ):
            flavor = SOURCE_MS
        else:
            flavor = SOURCE_PT
    text_core = bool(roles.get("trace") or roles.get("kernels"))
    form = "text" if text_core or not roles.get("db") else "db"
    if form == "text":  # the db form is not read, but a broken one is still worth a word
        for p in roles.get("db", []) + roles.get("analysis_db", []) + roles.get("comm_db", []):
            problem = _sqlite_problem(p)
            if problem:
                warn("bad_db", f"{problem}; not used (the text form of the export was read)", p)
    unit = Unit(UNIT_SOURCE_FOR[flavor], [], root)
    unit.info = {
        "flavor": flavor,
        "form": form,
        "roles": {k: sorted(v) for k, v in roles.items()},
        "info_doc": info_doc,
        "meta_doc": meta_doc,
    }
    # rank: profiler_info name, its content, db name, RANK_DEVICE_MAP, world group of metadata
    for p in sorted(roles.get("info", [])):
        m = _INFO_RE.match(p.name)
        if m and m.group(1) is not None:
            unit.rank_hint, unit.rank_source = int(m.group(1)), "profiler_info"
            inner = rank_from_info(info_doc)
            if inner is not None and inner != unit.rank_hint:
                warn(
                    "rank_mismatch",
                    f"{p.name} says rank {inner} inside; the file name's rank {unit.rank_hint} is used",
                    p,
                )
            break
    if unit.rank_hint is None and rank_from_info(info_doc) is not None:
        unit.rank_hint, unit.rank_source = rank_from_info(info_doc), "profiler_info"
    if unit.rank_hint is None:
        for p in roles.get("db", []):
            m = _DB_RE.match(p.name)
            if m and m.group(2) is not None:
                unit.rank_hint, unit.rank_source = int(m.group(2)), "file_name"
                break
    if unit.rank_hint is None:
        for p in roles.get("db", []):
            r = _db_rank(p)
            if r is not None:
                unit.rank_hint, unit.rank_source = r, "db"
                break
    mrank, world = rank_from_metadata(meta_doc)
    if unit.rank_hint is None and mrank is not None:
        unit.rank_hint, unit.rank_source = mrank, "metadata"
    unit.world_size = world
    # the files this unit reads (ranks.files); recognised files the reader does not use are only named in meta
    text_roles = {"trace", "kernels", "step_trace", "comm", "matrix", "op_stat", "api_stat", "memory_record", "module_mem", "minddata"}
    read = {"info", "metadata", "device_info"} | (text_roles if form == "text" else {"db", "analysis_db", "comm_db"})
    unit.files = sorted({p for r in read & set(roles) for p in roles[r]}, key=str)
    unit.info["unread"] = sorted({p.name for r in set(roles) - read for p in roles[r]})
    return unit


def _dedupe_ranks(units: list[Unit], warn: Any) -> list[Unit]:
    """Two exports claiming one rank: keep the newest (timestamp in the folder name), as msprof-analyze does."""
    by_rank: dict[tuple[str, int], list[Unit]] = defaultdict(list)
    for u in units:
        if u.rank_hint is not None:
            by_rank[(u.info.get("flavor", ""), u.rank_hint)].append(u)
    drop: set[int] = set()
    for (_flavor, rank), us in by_rank.items():
        if len(us) < 2:
            continue

        def key(u: Unit) -> tuple[str, float]:
            m = _TS_IN_NAME.search(u.root.name)
            try:
                mtime = max(p.stat().st_mtime for p in u.files) if u.files else 0.0
            except OSError:
                mtime = 0.0
            return (m.group(1) if m else "", mtime)

        us_sorted = sorted(us, key=key)
        for u in us_sorted[:-1]:
            drop.add(id(u))
            # still returned (its files stay claimed, not read as another format); load() skips it with this warning
            u.info["skip"] = (
                "duplicate_rank",
                f"rank {rank} is also exported by {us_sorted[-1].root}; this older export is skipped",
            )
    flavors = {u.info.get("flavor") for u in units}
    if len(flavors) > 1:
        warn("mixed_sources", "torch_npu and MindSpore exports in one folder; both are loaded (ranks may collide)")
    _register_batches([u for u in units if id(u) not in drop])
    return units


# -- batching ---------------------------------------------------------------------------------------

#: Text-form exports load in batches: every SQL statement then serves all ranks of the batch
#: (planning a statement costs milliseconds whatever its input). The caps bound the transient
#: staging memory: it grows with the batch, never with the cluster.
BATCH_MAX_UNITS = 32
BATCH_MAX_BYTES = 64 << 20


@dataclass
class _Batch:
    units: list[Unit]
    lock: threading.Lock = field(default_factory=threading.Lock)
    results: dict[int, Any] | None = None


_BATCHES: dict[int, _Batch] = {}
_BATCHES_LOCK = threading.Lock()


def _register_batches(units: list[Unit]) -> None:
    """Group text-form units (in claim order) into batches that :func:`load` fills on first use."""
    cur: list[Unit] = []
    size = 0

    def flush() -> None:
        if len(cur) > 1:
            b = _Batch(list(cur))
            with _BATCHES_LOCK:
                for u in cur:
                    _BATCHES[id(u)] = b
        cur.clear()

    for u in units:
        if u.info.get("form") != "text":
            continue
        try:
            nbytes = sum(p.stat().st_size for p in u.files)
        except OSError:
            nbytes = 0
        if cur and (len(cur) >= BATCH_MAX_UNITS or size + nbytes > BATCH_MAX_BYTES):
            flush()
            size = 0
        cur.append(u)
        size += nbytes
    flush()


# -- loading ----------------------------------------------------------------------------------------


def load(unit: Unit, lctx: LoadContext) -> dict[str, Any]:
    """Load one rank export into the canonical tables as ``unit.rank``. Raises ParseError when nothing could be read.

    When ``claim`` put the unit in a batch, the first call for any unit of the batch loads the
    whole batch (the orchestrator's other workers wait for it, then return at once).
    """
    if unit.info.get("skip"):
        code, message = unit.info["skip"]
        raise ParseError(unit.root, message, code=code)
    with _BATCHES_LOCK:
        b = _BATCHES.get(id(unit))
    if b is None or not any(u is unit for u in b.units):
        res = load_batch([unit], lctx)[0]
    else:
        with b.lock:
            if b.results is None:
                try:
                    b.results = {id(u): r for u, r in zip(b.units, load_batch(b.units, lctx), strict=True)}
                except Exception as exc:  # noqa: BLE001 - never re-run a half-loaded batch: every unit reports this failure
                    b.results = {id(u): exc for u in b.units}
            res = b.results[id(unit)]
        with _BATCHES_LOCK:
            _BATCHES.pop(id(unit), None)
    if isinstance(res, BaseException):
        raise res
    return res


@dataclass
class _State:
    unit: Unit
    fno: int
    info: dict[str, Any] = field(default_factory=dict)
    meta_rows: list[tuple[str, str]] = field(default_factory=list)
    loaded: set[str] = field(default_factory=set)
    fids: dict[Path, int] = field(default_factory=dict)
    events: int = 0

    @property
    def roles(self) -> dict[str, list[Path]]:
        return cast(dict[str, list[Path]], self.unit.info.get("roles", {}))

    def first(self, role: str) -> Path | None:
        paths = self.roles.get(role) or []
        return paths[0] if paths else None


_DUCKDB_ERROR_MODULES = ("duckdb", "_duckdb")


def _is_read_error(exc: BaseException) -> bool:
    return isinstance(
        exc, (ParseError, ascend_text.BatchError, sqlite3.Error, OSError, ValueError, UnicodeDecodeError)
    ) or (type(exc).__module__.split(".")[0] in _DUCKDB_ERROR_MODULES)


def run_jobs(cur: Any, lctx: LoadContext, jobs: list[ascend_text.Job], fn: Any, what: str) -> dict[int, Any]:
    """Run a batch loader in one transaction; on failure retry each job alone so one bad file costs only itself.

    Returns {fno: stats} for the files that loaded; each failure becomes a warning naming the file.
    """
    if not jobs:
        return {}
    try:
        cur.execute("BEGIN TRANSACTION")
        res = fn(cur, jobs)
        cur.execute("COMMIT")
    except Exception as exc:
        _rollback(cur)
        if not _is_read_error(exc):
            raise
        if len(jobs) > 1:
            out: dict[int, Any] = {}
            for j in jobs:
                out.update(run_jobs(cur, lctx, [j], fn, what))
            return out
        if isinstance(exc, ParseError):
            lctx.warn(exc.code, exc.message, exc.path)
        else:
            lctx.warn("bad_file", f"cannot read {what}: {short_error(exc)}", jobs[0].path)
        return {}
    out = {}
    for fno, r in res.items():
        if isinstance(r, ParseError):
            lctx.warn(r.code, r.message, r.path)
        else:
            out[fno] = r
    return out


_SEQ = iter(range(1 << 62))
_SEQ_LOCK = threading.Lock()


def load_batch(units: list[Unit], lctx: LoadContext) -> list[dict[str, Any] | ParseError]:
    """Load several rank exports; one result per unit: its ranks-table info, or the ParseError that skipped it."""
    cur = lctx.cursor()
    token = ascend_text.WARN.set(lctx.warn)  # file-level notes from the CSV readers
    try:
        return _load_batch(units, lctx, cur)
    finally:
        ascend_text.WARN.reset(token)
        with contextlib.suppress(Exception):
            cur.close()  # a cursor is a connection with its own temp catalog: do not keep many of them open


def _load_batch(units: list[Unit], lctx: LoadContext, cur: Any) -> list[dict[str, Any] | ParseError]:
    with _SEQ_LOCK:
        p = f"_ab{next(_SEQ)}"
    states = [_State(u, i) for i, u in enumerate(units)]
    for st in states:
        _configure(st, lctx, cur)
    text = [st for st in states if st.unit.info.get("form", "text") == "text"]
    for st in states:
        if st not in text:
            _load_db(st, lctx, cur)
    if text:
        _load_text(text, lctx, cur, p)
    out: list[dict[str, Any] | ParseError] = []
    for st in states:
        with contextlib.suppress(Exception):
            insert_meta(cur, st.unit.rank, st.meta_rows)
        if not st.loaded:
            out.append(ParseError(st.unit.root, "no file of this Ascend export could be read", code="bad_export"))
            continue
        failed = _failed_device_sources(st, lctx)
        if failed:
            # the side tables alone (step table, communication summary) would pass for a CPU-only profile
            out.append(ParseError(st.unit.root, f"no device data could be read: {failed}", code="bad_export"))
            if lctx.units_of_rank(st.unit.rank) <= 1:
                _drop_rank_rows(cur, st.unit.rank)
            continue
        _missing_inputs_warnings(st.unit, lctx, st.info)
        info = st.info
        if info.get("comm_in_trace") or info.get("has_comm") or (st.unit.world_size or 0) > 1:
            info["backend"] = "hccl"
        info["events"] = st.events
        out.append(
            {
                k: v
                for k, v in info.items()
                if k
                in ("events", "world_size", "backend", "device_name", "device_count", "flavor", "form", "distributed")
            }
        )
    return out


def _drop_rank_rows(cur: Any, rank: int) -> None:
    """Remove what the side files of a skipped rank left in the canonical tables (communication,
    vendor step figures): without its device data the rank is not analysed at all."""
    from advisor.schema import TABLES

    for name, table in TABLES.items():
        if name not in ("events", "profile_files", "ranks", "meta") and "rank" in table.column_names:
            with contextlib.suppress(Exception):
                cur.execute(f"DELETE FROM {name} WHERE rank = ?", [rank])


def _failed_device_sources(st: _State, lctx: LoadContext) -> str | None:
    """When an export has device sources (timeline, kernel table, profiler database) and none of
    them loaded: each file with its problem, for a one-line error; else None."""
    if st.info.get("form") == "db":
        paths = st.roles.get("db", [])[:1]
        ok = any(p.name in st.loaded for p in paths)
    else:
        paths = [p for role in ("trace", "kernels") if (p := st.first(role)) is not None]
        ok = bool({"trace", "kernels"} & st.loaded)
    if not paths or ok:
        return None
    problems = {w.path: w.message for w in list(getattr(lctx, "_warnings", [])) if w.path}
    return "; ".join(f"{p}: {problems.get(str(p), 'not read')}" for p in paths)


def _configure(st: _State, lctx: LoadContext, cur: Any) -> None:
    """profiler_info / profiler_metadata / device info -> meta rows, comm_groups, ranks info."""
    u = st.unit
    flavor = u.info.get("flavor", SOURCE_PT)
    st.info.update(flavor=flavor, form=u.info.get("form", "text"))
    st.meta_rows += [("ascend.flavor", flavor), ("ascend.form", st.info["form"])]
    if u.info.get("unread"):  # recognised but not used (e.g. operator_details.csv, or the text files of a db export)
        st.meta_rows.append(("ascend.unread_files", ";".join(u.info["unread"])[:2000]))
    if u.info.get("info_doc") is not None:
        rows, _ = info_meta(u.info["info_doc"])
        st.meta_rows.extend(rows)
    if u.info.get("meta_doc") is not None:
        rows, groups, minfo = metadata_meta(u.info["meta_doc"])
        st.meta_rows.extend(rows)
        st.info.update(minfo)
        try:
            insert_groups(cur, u.rank, groups)
        except Exception as exc:
            if not _is_read_error(exc):
                raise
            lctx.warn("bad_file", f"cannot use parallel_group_info: {short_error(exc)}", st.first("metadata"))
    for p in st.roles.get("device_info", [])[:4]:
        rows, dinfo = _device_info(p)
        st.meta_rows.extend(rows)
        for k, v in dinfo.items():
            st.info.setdefault(k, v)
    for p in st.roles.get("info", []) + st.roles.get("metadata", []) + st.roles.get("device_info", [])[:4]:
        lctx.file_id(p, u.rank, flavor)


def _load_db(st: _State, lctx: LoadContext, cur: Any) -> None:
    """The database form, one export at a time (rows are fetched from SQLite in Python anyway)."""

    def guarded(path: Path, what: str, fn: Any) -> Any:
        try:
            cur.execute("BEGIN TRANSACTION")
            out = fn()
            cur.execute("COMMIT")
            st.loaded.add(what)
            return out
        except Exception as exc:
            _rollback(cur)
            if not _is_read_error(exc):
                raise
            if isinstance(exc, ParseError):
                lctx.warn(exc.code, exc.message, exc.path)
            else:
                lctx.warn("bad_file", f"cannot read {what}: {short_error(exc)}", path)
        return None

    from advisor.ingest import ascend_db  # pyarrow: imported only for .db exports

    ascend_db.load(st.unit, lctx, cur, guarded, st.info, st.meta_rows)
    st.events = st.info.get("events", 0) or 0


def _load_text(states: list[_State], lctx: LoadContext, cur: Any, p: str) -> None:
    """All text-form exports of a batch: one pass per kind of file."""
    by_fno = {st.fno: st for st in states}

    def jobs(role: str, **flags: Any) -> list[ascend_text.Job]:
        out = []
        for st in states:
            path = st.first(role)
            if path is None:
                continue
            fid = lctx.file_id(path, st.unit.rank, st.info["flavor"])
            st.fids[path] = fid
            out.append(
                ascend_text.Job(
                    st.fno, path, st.unit.rank, fid, {k: (v(st) if callable(v) else v) for k, v in flags.items()}
                )
            )
        return out

    def done(role: str, results: dict[int, Any]) -> None:
        for fno, r in results.items():
            st = by_fno[fno]
            st.loaded.add(role)
            st.info[f"{role}_stats"] = r

    # 1. timelines: kernels / comm_ops only from exports without a better source
    res = run_jobs(
        cur,
        lctx,
        jobs("trace", kernels=lambda st: not st.roles.get("kernels"), comm_ops=lambda st: not st.roles.get("comm")),
        lambda c, js: ascend_text.load_traces(c, js, f"{p}t", lctx.max_events),
        "trace_view.json",
    )
    done("trace", res)
    for fno, r in res.items():
        st = by_fno[fno]
        st.events += r["events"]
        st.info["has_trace"] = True
        if r["comm_events"]:
            st.info["comm_in_trace"] = True
        if r.get("device_ids"):
            st.meta_rows.append(("device_id", ",".join(map(str, r["device_ids"]))))
        path = st.first("trace")
        if r["bad_events"]:
            lctx.warn("bad_events", f"{r['bad_events']} events without a usable ts/dur were dropped", path)
        if r["negative_events"]:
            lctx.warn("bad_events", f"{r['negative_events']} events with a negative duration were dropped", path)
    # 2. kernel tables: device events too when the timeline is missing or unreadable
    res = run_jobs(
        cur,
        lctx,
        jobs(
            "kernels",
            events=lambda st: not st.info.get("has_trace"),
            comm_ops=lambda st: not st.info.get("has_trace") and not st.roles.get("comm"),
        ),
        lambda c, js: ascend_text.load_kernel_details(c, js, f"{p}k"),
        "kernel_details.csv",
    )
    done("kernels", res)
    for fno, r in res.items():
        st = by_fno[fno]
        st.events += r["events"]
        st.info["has_kernels"] = True
        if r["hccl_rows"]:
            st.info["comm_in_trace"] = True
        if r["bad_rows"]:
            lctx.warn(
                "bad_rows", f"{r['bad_rows']} rows without a usable start/duration were dropped", st.first("kernels")
            )
        if r.get("device_ids") and not any(k == "device_id" for k, _ in st.meta_rows):
            st.meta_rows.append(("device_id", ",".join(map(str, r["device_ids"]))))
        if st.roles.get("trace") and not st.info.get("has_trace"):
            lctx.warn(
                "partial_export",
                "the timeline could not be read; device events were built from kernel_details.csv",
                st.first("kernels"),
            )
    failed_kd = [
        st.unit.rank
        for st in states
        if st.roles.get("kernels") and not st.info.get("has_kernels") and st.info.get("has_trace")
    ]
    if failed_kd:
        # the table could not be read: per-kernel rows from the timeline's device tasks (no core type, block dim)
        cur.execute(
            """INSERT INTO kernels (rank, step, name, core_type, start_ns, dur_ns)
            SELECT rank, NULL, name, NULL, start_ns, dur_ns FROM events
            WHERE rank IN (SELECT unnest($ranks)) AND device AND kind = 'kernel'""",
            {"ranks": failed_kd},
        )
    # 3. the other files
    for role, fn, what in (
        ("step_trace", lambda c, js: ascend_text.load_step_traces(c, js, f"{p}s"), "step_trace_time.csv"),
        ("comm", lambda c, js: ascend_text.load_communications(c, js, f"{p}c"), "communication.json"),
        ("matrix", lambda c, js: ascend_text.load_matrices(c, js, f"{p}m"), "communication_matrix.json"),
        ("op_stat", lambda c, js: ascend_text.load_op_statistics(c, js, f"{p}o", "op_statistic"), "op_statistic.csv"),
        (
            "api_stat",
            lambda c, js: ascend_text.load_op_statistics(c, js, f"{p}a", "api_statistic"),
            "api_statistic.csv",
        ),
        ("memory_record", lambda c, js: ascend_text.load_memory_records(c, js, f"{p}r"), "memory_record.csv"),
        ("module_mem", lambda c, js: ascend_text.load_module_mems(c, js, f"{p}n"), "npu_module_mem.csv"),
        ("minddata", lambda c, js: ascend_text.load_minddata(c, js, f"{p}d"), "minddata_pipeline_raw.csv"),
    ):
        res = run_jobs(cur, lctx, jobs(role), fn, what)
        done(role, res)
        for fno, r in res.items():
            st = by_fno[fno]
            if role == "comm":
                st.info["has_comm"] = True
            if role == "matrix" and r.get("unmapped"):
                warn_once(
                    lctx,
                    "group_local_ranks",
                    "communication_matrix.json: no profiler_metadata.json parallel_group_info for some groups; "
                    "their src/dst ranks stay group-local",
                    st.first("matrix"),
                )
    # 4. bookkeeping: events per file, steps from the vendor's step ids where no ProfilerStep exists
    updates = []
    for st in states:
        for role in ("trace", "kernels"):
            path = st.first(role)
            stats = st.info.get(f"{role}_stats")
            if path is not None and stats is not None and path in st.fids:
                updates.append((stats.get("events", 0), st.fids[path]))
    if updates:
        update_rows(cur, "profile_files", "events = v.value", "file_id", updates)
    no_marks = [st.unit.rank for st in states if st.loaded and not (st.info.get("trace_stats") or {}).get("steps")]
    if no_marks:
        _steps_from_vendor(cur, no_marks)


def _rollback(cur: Any) -> None:
    with contextlib.suppress(Exception):
        cur.execute("ROLLBACK")


def _steps_from_vendor(cur: Any, ranks: list[int]) -> None:
    """Step windows from kernel ``Step Id`` / communication ``stepN`` when no ProfilerStep marker exists.

    A step's range is then the span of the device tasks numbered with it; the windows follow the
    common definition (:func:`advisor.ingest.steps.windows_sql`): consecutive steps tile, each
    ending where its last task ends.
    """
    spans = """(SELECT rank, step, min(start_ns) AS host_start_ns, max(start_ns + dur_ns) AS host_end_ns FROM (
                SELECT rank, step, start_ns, dur_ns FROM kernels
                WHERE rank IN (SELECT unnest($ranks)) AND step IS NOT NULL AND start_ns IS NOT NULL
                UNION ALL
                SELECT rank, step, start_ns, dur_ns FROM comm_ops
                WHERE rank IN (SELECT unnest($ranks)) AND step IS NOT NULL AND start_ns IS NOT NULL
            ) WHERE rank NOT IN (SELECT DISTINCT rank FROM steps) GROUP BY rank, step)"""
    cur.execute(f"INSERT INTO steps {windows_sql(spans, None)}", {"ranks": ranks})


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


__all__ = ["SOURCE", "SOURCES", "UNIT_SOURCE_FOR", "claim", "load", "load_batch"]
