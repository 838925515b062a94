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

Loading (:func:`load`) runs the readers declared in :data:`advisor.ingest.ascend_readers.READERS`
(each names its files, role, needs and the tables it yields) over the text form
(:mod:`advisor.ingest.ascend_text`) or, when only a database is present, the db form
(:mod:`advisor.ingest.ascend_db`); a file's role in an export comes from the readers' patterns.
Partial exports are normal: whatever exists is loaded, a missing optional file only produces a
warning naming the analyses that lack it, and a broken file is skipped with a warning while the
rest loads.

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
from typing import Any

from advisor.ingest import ascend_readers
from advisor.ingest.ascend_common import (
    SOURCE_MS,
    SOURCE_PT,
    rank_from_info,
    rank_from_metadata,
    read_small_json,
)
from advisor.ingest.base import LoadContext, ParseError, Unit, read_head
from advisor.sqlite_safe import SafeSqlite, SqliteRefused, quote_ident

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
_MSPROF_JSON_RE = re.compile(r"^msprof_[\d_]+\.json$", re.IGNORECASE)
_OP_SUMMARY_RE = re.compile(r"^op_summary_[\d_]+\.csv$", re.IGNORECASE)


def _data_roles() -> set[str]:
    """Roles that carry profile data (a group of files without any is not an export)."""
    return {r.role for r in ascend_readers.READERS if r.data and r.role is not None}


def _roles_of_form(form: str) -> set[str]:
    """The roles the readers of ``form`` (``text`` / ``db`` / ``any``) read."""
    return {r.role for r in ascend_readers.READERS if r.form == form and r.role is not None}


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
            return ascend_readers.role_of_name(name)
        return None
    role = ascend_readers.role_of_name(name)
    if role == "device_info":
        return None  # a device's info.json.N counts only inside a raw CANN folder (above)
    return role or _role_by_content(p)


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
    if role in ("db", "analysis_db"):
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
        SafeSqlite(p).close()
        return None
    except SqliteRefused as exc:
        return f"unsafe SQLite database ({exc})"
    except sqlite3.Error as exc:
        return f"not a readable SQLite database ({exc})"


def _db_rank(p: Path) -> int | None:
    """``RANK_DEVICE_MAP.rankId`` of a torch_npu / MindSpore db (None when absent or -1)."""
    try:
        db = SafeSqlite(p)
    except (sqlite3.Error, SqliteRefused):
        return None
    try:
        table = db.table("RANK_DEVICE_MAP")
        col = next((c for c in db.columns(table) if c.lower() == "rankid"), None) if table else None
        if table is None or col is None:
            return None
        row = db.query(f"SELECT max({quote_ident(col)}) FROM {quote_ident(table)}", [table], ["max"])
    except (sqlite3.Error, SqliteRefused):
        return None
    finally:
        db.close()
    r = row[0][0] if row else None
    return int(r) if isinstance(r, int) and r >= 0 else None


_RAW_PROF_HINT = (
    "raw CANN profile (PROF_*) without exported data: nothing to read; export it with "
    "`msprof --export=on --output=<this PROF_* folder>` (writes mindstudio_profiler_output/ and msprof_*.db), "
    "or record with torch_npu.profiler (a *_ascend_pt export, experimental_config export_type text or db)"
)


def claim(files: list[Path], warn: Any) -> list[Unit]:
    """Group the Ascend files among ``files`` into one unit per rank export."""
    groups: dict[Path, dict[str, Any]] = {}
    cluster_out: dict[Path, list[Path]] = {}
    data_roles = _data_roles()
    for p in files:
        name = p.name
        low = name.lower()
        if not (
            low.endswith((".json", ".csv", ".db", ".gz"))
            or _DEVICE_INFO_RE.match(name)
            or ascend_readers.role_of_name(name)
        ):
            continue
        if _CLUSTER_OUT in p.parts:
            # msprof-analyze's own cluster results (format doc §19): claimed, never read
            cluster_out.setdefault(Path(*p.parts[: p.parts.index(_CLUSTER_OUT) + 1]), []).append(p)
            continue
        root, flavor, in_layout = _export_root(p)
        role = _role(p, root, in_layout)
        if role is None:
            continue
        try:
            empty = p.stat().st_size == 0
        except OSError:
            continue
        if empty:
            if in_layout or role in data_roles:
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
        if not any(r in data_roles for r in roles):
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
    units = _dedupe_ranks(units, warn)
    return units + [u for d, fs in sorted(cluster_out.items()) if (u := _cluster_summary_unit(d, fs, units))]


_CLUSTER_OUT = "cluster_analysis_output"
_CLUSTER_FILES = re.compile(
    r"^(cluster_step_trace_time\.csv|cluster_communication(_matrix)?\.json|communication_group\.json|"
    r"cluster_analysis\.db)$",
    re.IGNORECASE,
)


def _cluster_summary_unit(folder: Path, files: list[Path], units: list[Unit]) -> Unit | None:
    """msprof-analyze's ``cluster_analysis_output/`` (format doc §19): summaries of the rank exports
    it was made from, not a profile. Its files are claimed (no other reader takes them for a trace)
    by a unit that loading skips with one line saying what the folder is and what to analyse."""
    known = sorted(p.name for p in files if _CLUSTER_FILES.match(p.name))
    if not known:
        return None
    unit = Unit(SOURCE_PT, sorted(files), folder)
    unit.info = {"flavor": SOURCE_PT, "form": "summary", "roles": {}}
    what = f"msprof-analyze cluster output ({folder.name}/: {', '.join(known)})"
    if units:
        # beside the rank exports it summarises: counted with one of them, which are analysed
        unit.rank_hint, unit.rank_source = units[0].rank_hint, units[0].rank_source
        unit.info["skip"] = (
            "cluster_summary",
            f"{what} not read: the rank exports beside it are, and the cluster views are computed from them",
        )
    else:
        unit.info["skip"] = (
            "cluster_summary",
            (f"{what} holds per-rank summaries, not a profile: analyse the folder holding the rank exports it was "
             "made from (the *_ascend_pt / *_ascend_ms / PROF_* folders `msprof-analyze cluster -d` was given, "
             f"usually {folder.parent})"),
        )
        unit.info["skip_path"] = folder / known[0]  # named in the one-line error (the folder may be the input)
    return unit


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
        for p in roles.get("db", []) + roles.get("analysis_db", []):
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
    read = _roles_of_form("any") | _roles_of_form(form)
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


def restrict_batches(units: list[Unit]) -> None:
    """Batch ``units`` among themselves only: a shard of a cluster (advisor.pipeline) loads
    its units into a DuckDB of its own, so a batch that spans shards would fill another shard's."""
    with _BATCHES_LOCK:
        for u in units:
            _BATCHES.pop(id(u), None)
    _register_batches([u for u in units if not u.info.get("skip")])


# -- loading ----------------------------------------------------------------------------------------


def load(unit: Unit, lctx: LoadContext) -> dict[str, Any]:
    """Load one rank export into the canonical tables as ``unit.rank``. Raises ParseError when nothing could be read.

    When ``claim`` put the unit in a batch, the first call for any unit of the batch loads the
    whole batch (the orchestrator's other workers wait for it, then return at once).
    """
    if unit.info.get("skip"):
        code, message = unit.info["skip"]
        raise ParseError(unit.info.get("skip_path", unit.root), message, code=code)
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


def load_batch(units: list[Unit], lctx: LoadContext) -> list[dict[str, Any] | ParseError]:
    """Load several rank exports with the readers (:func:`advisor.ingest.ascend_readers.read_exports`);
    one result per unit: its ranks-table info, or the ParseError that skipped it."""
    cur = lctx.cursor()
    try:
        return ascend_readers.read_exports(units, lctx, cur)
    finally:
        with contextlib.suppress(Exception):
            cur.close()  # a cursor is a connection with its own temp catalog: do not keep many of them open


__all__ = ["SOURCE", "SOURCES", "UNIT_SOURCE_FOR", "claim", "load", "load_batch", "restrict_batches"]
