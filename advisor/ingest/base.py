"""What every source reader shares: units of work, the load context, errors, safe file discovery."""

from __future__ import annotations

import gzip
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from advisor.model import Warning_
from advisor.schema import insert_rows as insert_rows  # noqa: PLC0414 -- re-exported: the readers import it from here
from advisor.text import one_line as one_line  # noqa: PLC0414 -- re-exported: the readers import it from here


class InputError(Exception):
    """Nothing usable could be read: the CLI prints ``str(exc)`` on one line and exits 2."""


class ParseError(Exception):
    """One file could not be read; it is skipped with a warning and the rest goes on."""

    def __init__(self, path: Path | str, message: str, code: str = "bad_file") -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)
        self.message = message
        self.code = code


@dataclass
class Unit:
    """One rank's export from one source: the files a reader will load together."""

    source: str  # kineto | ascend_pt | ascend_ms
    files: list[Path]
    root: Path
    rank_hint: int | None = None
    rank_source: str = "order"
    world_size: int | None = None
    backend: str | None = None
    run_key: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    rank: int = -1

    @property
    def label(self) -> str:
        """A short name for messages."""
        return str(self.root)


# Times are kept within +-2^62 ns of the epoch (~1830 to ~2116) and durations under 2^62 ns: then
# every start + duration and every difference of two starts fits a BIGINT. An event beyond (only
# garbage or hostile input has one) is dropped with a warning; left in, the first sum over it
# would stop the analysis with an overflow.
TIME_LIMIT_NS = 1 << 62
FAR_TIMES_SQL = f"(start_ns < -{TIME_LIMIT_NS} OR start_ns >= {TIME_LIMIT_NS} OR dur_ns >= {TIME_LIMIT_NS})"
FAR_TIMES_WARNING = "{n} events with a time or duration beyond ±146 years of the epoch were dropped"


class LoadContext:
    """Passed to a reader's ``load``: a cursor, file ids and a thread-safe warning sink."""

    def __init__(self, con: Any, warnings: list[Warning_], max_events: int | None = None,
                 on_scan: Callable[[], object] | None = None) -> None:
        self._con = con
        self._on_scan = on_scan
        self._warnings = warnings
        self._lock = threading.Lock()
        self._next_file_id = 0
        self._files_cur: Any = None  # the cursor files are registered with (under the lock): one for all
        self.max_events = max_events
        self.units_per_rank: dict[int, int] = {}
        self.stepped: set[int] = set()  # ranks whose events got their step on insert
        self.steps_lock = threading.Lock()
        self.events_parts: list[str] = []  # tables of finished events rows, made part of events after loading
        self.clashes: list[tuple[Any, ...]] = []  # files dropped for overlapping another of their rank (not copies)

    def scan_starting(self) -> None:
        """A reader is about to start a bulk scan: DuckDB will parse on every core without the
        GIL, so Python work beside it (the analysis imports) costs the least there, while
        before it the readers' own Python work (finding the event lists, copying them) would
        wait for the GIL behind it. Runs the loader's ``on_scan`` callback, once."""
        with self._lock:
            callback, self._on_scan = self._on_scan, None
        if callback is not None:
            callback()

    def add_events_part(self, table: str) -> None:
        """Hand over a table with exactly the ``events`` columns (see ``adopt_events_parts``)."""
        with self._lock:
            self.events_parts.append(table)

    def units_of_rank(self, rank: int) -> int:
        """How many units (files) make up ``rank``'s timeline."""
        return self.units_per_rank.get(rank, 1)

    def mark_stepped(self, ranks: set[int]) -> None:
        """Record ranks whose events were inserted with their step already assigned."""
        with self._lock:
            self.stepped |= ranks

    def cursor(self) -> Any:
        """A DuckDB cursor for this thread."""
        return self._con.cursor()

    def file_id(self, path: Path, rank: int, source: str) -> int:
        """Register a file and return its id (rows in ``events.file_id`` point at it)."""
        return self.file_ids([(path, rank, source)])[0]

    def file_ids(self, files: list[tuple[Path, int, str]]) -> list[int]:
        """Register ``(path, rank, source)`` files with one statement; their ids, in order."""
        with self._lock:
            first = self._next_file_id
            self._next_file_id += len(files)
            if self._files_cur is None:
                self._files_cur = self._con.cursor()
            insert_rows(self._files_cur, "profile_files",
                        [(first + i, rank, str(path), source, 0) for i, (path, rank, source) in enumerate(files)])
        return list(range(first, first + len(files)))

    def done_reading(self) -> None:
        """The files are read: the cursor that registered them is closed."""
        with self._lock:
            if self._files_cur is not None:
                self._files_cur.close()
                self._files_cur = None

    def warn(self, code: str, message: str, path: Path | str | None = None) -> None:
        """Record an input problem (shown in the report and on stderr)."""
        with self._lock:
            self._warnings.append(Warning_(code, one_line(message, 500), None if path is None else str(path)))


_PURGE: Any = None

# what a failed DuckDB statement raises: its own errors, or UnicodeDecodeError when the Python
# binding cannot decode an error message that quotes bytes of the input which are not UTF-8
DUCKDB_ERRORS: tuple[type[BaseException], ...] = (duckdb.Error, UnicodeDecodeError)


# Python types a column of rows may hold for :func:`insert_columns` to pass it as one typed list
# (a DOUBLE column may mix int and float: each becomes the same double either way)
_LIST_TYPES: tuple[set[type], ...] = ({int}, {float}, {str}, {bool}, set())


def insert_columns(cur: Any, table: str, rows: list[tuple[Any, ...]], chunk: int = 100_000) -> None:
    """:func:`insert_rows` of many rows, each column passed as one list cast to the column's type:
    an INSERT of 1,000 rows x 8 values as VALUES binds 8,000 parameters (~0.1 s); as 8 lists, ~0.01 s.
    A column whose values are not all of one plain type (int, float, str, bool, None) goes
    through :func:`insert_rows` (VALUES), as do rows not as wide as the table."""
    from advisor.schema import TABLES

    cols = TABLES[table].columns
    for a in range(0, len(rows), chunk):
        part = rows[a:a + chunk]
        values = [list(c) for c in zip(*part, strict=True)]
        plain = len(values) == len(cols) and all(
            (kinds := {type(v) for v in c if v is not None}) in _LIST_TYPES
            or (kinds == {int, float} and col.sql_type == "DOUBLE")
            for c, col in zip(values, cols, strict=True))
        if not plain:
            insert_rows(cur, table, part)
            continue
        cur.execute(f"INSERT INTO {table} SELECT "
                    + ", ".join(f"unnest(${i + 1}::{col.sql_type}[])" for i, col in enumerate(cols)), values)


def update_rows(cur: Any, table: str, set_sql: str, key: str, rows: list[tuple[Any, Any]], chunk: int = 1000) -> None:
    """Many ``UPDATE table SET <set_sql using v.value> WHERE key = v.key`` in one statement per
    ``chunk`` rows; ``rows`` are (value, key) pairs, as executemany took them."""
    for a in range(0, len(rows), chunk):
        part = rows[a:a + chunk]
        values = ", ".join(["(?, ?)"] * len(part))
        cur.execute(f"UPDATE {table} SET {set_sql} FROM (VALUES {values}) v(value, key) WHERE {table}.{key} = v.key",
                    [v for row in part for v in row])


_CHECKPOINT_LOCK = threading.Lock()


def checkpoint(cur: Any, db: str = "") -> None:
    """``CHECKPOINT`` (compress the in-memory tables), with one DuckDB thread more than usual
    while it runs: with the default (one thread per core) the checkpoint often ran on one core
    only (32 ranks x 10 MB: 0.44 s in 3 runs of 4, 0.23 s in the other; always 0.23 s with the
    extra thread). Queries are not changed: the setting is put back. Raises duckdb errors."""
    with _CHECKPOINT_LOCK:  # the setting is the database's: one checkpoint at a time changes it
        threads = int(cur.execute("SELECT current_setting('threads')").fetchone()[0])
        cur.execute(f"SET threads = {threads + 1}")
        try:
            cur.execute(f"CHECKPOINT {db}".rstrip())
        finally:
            cur.execute(f"SET threads = {threads}")


#: A database whose tables hold fewer rows in all is not compressed: its tables take a few MB
#: either way (by DuckDB's duckdb_memory(), 54 k rows: 4.0 MB loaded, 3.7 MB compressed; 10 k
#: rows: 1.7 MB loaded, 2.6 MB compressed), and a checkpoint costs ~5-20 ms of CPU however small.
COMPRESS_MIN_ROWS = 50_000


def too_small_to_compress(cur: Any) -> bool:
    """Whether the tables of ``cur``'s database hold fewer than :data:`COMPRESS_MIN_ROWS` rows in
    all (DuckDB's count: the rows deleted since the last compression included)."""
    rows = cur.execute("SELECT coalesce(sum(estimated_size), 0) FROM duckdb_tables() "
                       "WHERE database_name = current_database()").fetchone()[0]
    return bool(rows < COMPRESS_MIN_ROWS)


def release_memory() -> None:
    """Hand the memory DuckDB has freed back to the system (best effort).

    DuckDB's allocator (jemalloc, in the Linux wheels) keeps freed pages for reuse for a while:
    after the JSON buffers and the uncompressed tables of a load are freed, the process would
    keep their ~300 MB per GB of trace resident for no use. This asks jemalloc to purge them
    (``arena.<all>.purge``, what DuckDB itself does after big deallocations). A build without
    that allocator has no such symbol: nothing is done.
    """
    global _PURGE
    if _PURGE is None:
        _PURGE = False
        try:
            import ctypes

            import duckdb

            lib = ctypes.CDLL(duckdb._duckdb.__file__)  # type: ignore[attr-defined]
            fn = lib.duckdb_je_mallctl
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
            fn.restype = ctypes.c_int
            _PURGE = fn
        except (AttributeError, OSError):
            return
    if _PURGE:
        _PURGE(b"arena.4096.purge", None, None, None, 0)  # 4096 = MALLCTL_ARENAS_ALL


def overlapping_files(spans: list[tuple[Any, ...]], warn: Any,
                      clashes: list[tuple[Any, ...]] | None = None) -> list[tuple[Any, ...]]:
    """Files of one rank whose time ranges overlap cannot both be that rank's timeline.

    ``spans``: ``(file_id, rank, path, start, end, events)`` ordered by rank, events descending.
    Cycles of one run (``repeat > 1``) follow each other in time and are kept; a file that
    overlaps a kept file of the same rank (a copy, or a file of another run claiming the same
    rank) is dropped with a warning, keeping the one with more events. Returns the dropped spans;
    those that are not a copy (same range and number of events as the kept file) are also
    appended to ``clashes``, where the loader finds that two runs were mixed.
    """
    kept: dict[int, list[tuple[Any, Any, str, Any]]] = {}
    dropped = []
    for span in spans:
        _fid, rank, fpath, a, b = span[:5]
        n = span[5] if len(span) > 5 else None
        mine = kept.setdefault(rank, [])
        clash = next((k for k in mine if a < k[1] and k[0] < b), None)
        if clash is None:
            mine.append((a, b, fpath, n))
            continue
        dropped.append(span)
        if clashes is not None and (a, b, n) != (clash[0], clash[1], clash[3]):
            clashes.append(span)
        warn("duplicate_rank", f"another file already provides rank {rank} for the same time range ({clash[2]}); this file was not used", fpath)
    return dropped


# Text fields of an event are bounded as they are read: a longer value keeps its first
# characters and a mark of the cut (its length and a hash, so that distinct long names stay
# distinct): a hostile 60 MB operator name costs 4 KiB of every report, not 60 MB. Names
# (operators, kernels, categories, processes, threads) take NAME_MAX characters (real kernel
# names reach ~2,000); call stacks and input shapes / types TEXT_MAX.
NAME_MAX = 4096
TEXT_MAX = 65536
CUT_MARK = "…[cut: "  # what a cut value ends with: "…[cut: <chars> chars, #<8 hex digits of its md5>]"


def bounded_sql(x: str, limit: int = NAME_MAX) -> str:
    """SQL: the text ``x`` cut to ``limit`` characters when longer, the cut marked (see
    :data:`CUT_MARK`); its byte length is looked at first (free), its characters only beyond."""
    return (f"CASE WHEN strlen({x}) > {limit} AND length({x}) > {limit} THEN left({x}, {limit}) || '{CUT_MARK}' || "
            f"length({x}) || ' chars, #' || left(md5({x}), 8) || ']' ELSE {x} END")


def cut_sql(x: str, limit: int = NAME_MAX) -> str:
    """SQL: true when ``x`` is a value :func:`bounded_sql` cut."""
    return f"(strlen({x}) > {limit} AND contains({x}, '{CUT_MARK}'))"


# -- safe discovery ----------------------------------------------------------------------------

# Files walked below a profile directory: an Ascend export holds ~100-200 files a rank (its raw
# PROF_* data included), so 200,000 covers a 1,024-rank cluster; beyond, the walk stops with an error.
MAX_FILES = 200_000
# Kineto trace files (*.json, *.json.gz) read at once: 16,384 = 4,096 ranks x 4 files (several
# profiling cycles), or 1,024 ranks x 16. More is refused before any is read: every file costs
# ~10-20 ms of the analysis, so 60,000 would take many minutes.
MAX_TRACE_FILES = 16_384


LINK_OUTSIDE = "link_outside"  # warning code of a symbolic link not followed out of the profile directory


def walk_files(root: Path, warn: Any, follow_links: bool = False) -> Iterator[Path]:
    """Yield regular files below ``root`` without following links out of it.

    Links are followed only when they resolve inside ``root``, or anywhere with
    ``follow_links``; loops (a directory reached twice), dangling links, pipes, sockets and
    devices are skipped with a warning. Raises InputError beyond :data:`MAX_FILES` files.
    """
    root_real = Path(os.path.realpath(root))
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: set[tuple[int, int]] = set()  # a file reached through links and by its own name is read once
    stack = [root]
    count = 0
    while stack:
        d = stack.pop()
        try:
            st = d.stat()
            key = (st.st_dev, st.st_ino)
            if key in seen_dirs:
                warn("link_loop", "directory reached twice (symlink loop); skipped", d)
                continue
            seen_dirs.add(key)
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as exc:
            warn("unreadable", f"cannot list directory: {exc.strerror or exc}", d)
            continue
        for entry in entries:
            p = Path(entry.path)
            try:
                if entry.is_symlink():
                    target = os.path.realpath(p)
                    if not os.path.exists(target):
                        warn("dangling_link", "symbolic link points nowhere; skipped", p)
                        continue
                    if not follow_links and os.path.commonpath([root_real, target]) != str(root_real):
                        warn(LINK_OUTSIDE, "symbolic link points outside the profile directory; not followed "
                             "(--follow-symlinks follows it)", p)
                        continue
                st = p.stat()
            except OSError as exc:
                warn("unreadable", f"cannot stat: {exc.strerror or exc}", p)
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(p)
            elif stat.S_ISREG(st.st_mode):
                if (st.st_dev, st.st_ino) in seen_files:
                    warn("link_twice", "another name (a link) of a file already read; read once", p)
                    continue
                seen_files.add((st.st_dev, st.st_ino))
                count += 1
                if count > MAX_FILES:
                    raise InputError(f"{one_line(root)}: more than {MAX_FILES:,} files below it, more than a profile of "
                                     "1,024 ranks holds; point advisor at the folder of one run's traces")
                yield p
            else:
                warn("special_file", "not a regular file (pipe, socket or device); skipped", p)


# DuckDB's file readers (read_json, read_csv, read_text ...) expand a name holding one of these
# as a glob pattern ("*", "?", "[...]", "**"); "{" / "}" are escaped as well, should a version
# read them as alternatives
_GLOB_CHARS = re.compile(r"[*?\[{}]")


def duckdb_path(path: Path | str) -> str:
    """The text to hand a DuckDB reader so that it reads ``path`` and nothing else: the
    absolute path (no ``~`` expansion of a relative name, no URL scheme), its glob characters
    each in a one-character class (``x*.json`` -> ``x[*].json``), which matches only itself.
    DuckDB then reports the file as :func:`duckdb_name`. Raises ParseError for a name holding a
    glob character and a backslash, which DuckDB's matcher takes as an escape: no pattern names
    such a file exactly."""
    p = os.path.abspath(path)
    if not _GLOB_CHARS.search(p):
        return p
    if "\\" in p:
        raise ParseError(path, "the file name holds a backslash and a glob character (* ? [ { }), which the JSON/CSV "
                         "reader cannot take literally; rename the file to read it", code="bad_name")
    return _GLOB_CHARS.sub(lambda m: "[" + m.group(0) + "]", p)


def duckdb_name(path: Path | str) -> str:
    """The ``filename`` a DuckDB reader reports for a file read through :func:`duckdb_path`."""
    return os.path.abspath(path)


def read_head(path: Path, n: int = 65536) -> bytes:
    """The first ``n`` bytes of a file, decompressed when it is gzip; b'' when unreadable."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=fh) as gz:
                    return gz.read(n)
            return fh.read(n)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return b""


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic bytes."""
    try:
        with path.open("rb") as fh:
            return fh.read(2) == b"\x1f\x8b"
    except OSError:
        return False
