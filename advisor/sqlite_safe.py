"""Reading an SQLite file of a profile without trusting it.

A profile's ``.db`` is untrusted input: its table and column names, its views and its schema are
the sender's. Every SQLite connection of the advisor is opened here, by :class:`SafeSqlite`:

* read-only and immutable (``file:<path>?mode=ro&immutable=1``, the path URI-quoted): nothing is
  written beside the file (no journal, no -shm) and nothing in it changes;
* ``PRAGMA trusted_schema = OFF``: functions and virtual tables named by the schema (generated
  columns, indexes on expressions) run only when SQLite marks them harmless;
* an authorizer: a statement may only SELECT and READ the real tables its caller names, call the
  functions its caller names, and run ``PRAGMA table_info`` on a named table; anything else (a
  view's body, ``sqlite_master`` unless named, ATTACH, recursive CTEs, any other function or
  pragma) fails the statement when it is prepared;
* only real tables are offered (``sqlite_master.type = 'table'``, not a virtual table): a view or
  a virtual table where a table is expected is noted in :attr:`SafeSqlite.notes` for the caller
  to warn about, and never read;
* a progress handler bounds the work of every statement (SQLite virtual machine steps, scaled to
  the file's size): past it the statement stops with :class:`SqliteRefused`, one line naming the
  file and the table;
* identifiers from the file reach SQL text only through :func:`quote_ident`.

This module imports nothing of the advisor, so the loaders and the metric readers share it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

#: SQLite virtual machine steps between two calls of the progress handler.
STEPS_PER_CHECK = 10_000
#: Steps any statement may take, whatever the file's size ...
BASE_STEPS = 200_000_000
#: ... plus this many per byte of the file: a read of real tables visits each row a bounded number
#: of times, so its work grows with the file; a recursive view or a runaway join does not stop.
STEPS_PER_BYTE = 500

_OK, _DENY = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})


class SqliteRefused(Exception):
    """A statement on an untrusted SQLite file was refused or stopped. ``str()`` is one line naming
    the table; ``path`` and ``table`` say where."""

    def __init__(self, path: Path, table: str, message: str) -> None:
        super().__init__(f"table {table}: {message}")
        self.path = path
        self.table = table
        self.message = message


def quote_ident(name: str) -> str:
    """An SQLite identifier as SQL text: in double quotes, each ``"`` doubled (any name is safe)."""
    return '"' + str(name).replace('"', '""') + '"'


def printable(name: str, limit: int = 80) -> str:
    """A name from the file for a message: control characters escaped, cut at ``limit``."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(name))
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Statement:
    """What the authorizer and the progress handler check for the statement being stepped."""

    def __init__(self, tables: frozenset[str], functions: frozenset[str], label: str, budget: int) -> None:
        self.tables, self.functions, self.label, self.budget = tables, functions, label, budget
        self.checks = 0
        self.stopped = False


class SafeSqlite:
    """One untrusted SQLite file, open for reading. :attr:`tables` maps each real table's lower-case
    name to its name; :attr:`skipped` holds the views and virtual tables not yet looked up."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        self.budget = (BASE_STEPS + STEPS_PER_BYTE * size) // STEPS_PER_CHECK
        self._stmt: _Statement | None = None
        self.con = sqlite3.connect(
            f"file:{quote(str(self.path.resolve()))}?mode=ro&immutable=1", uri=True, check_same_thread=False,
            cached_statements=0,  # each statement is authorized for its own tables when prepared: never reused
        )
        try:
            self.con.execute("PRAGMA trusted_schema = OFF")
            self.con.execute("PRAGMA query_only = ON")
            self.con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            self.con.set_authorizer(self._authorize)
            self.con.set_progress_handler(self._progress, STEPS_PER_CHECK)
            rows = self.query("SELECT type, name, sql FROM sqlite_master", ["sqlite_master"])
        except BaseException:
            self.con.close()
            raise
        self.tables: dict[str, str] = {}
        self.skipped: dict[str, tuple[str, str]] = {}
        self.notes: list[str] = []
        for typ, name, sql in rows:
            if not isinstance(name, str):
                continue
            if typ == "table" and not str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
                self.tables[name.lower()] = name
            elif typ in ("table", "view"):
                self.skipped[name.lower()] = (name, "a view" if typ == "view" else "a virtual table")

    # -- the guards ---------------------------------------------------------------------------------

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None, inner: str | None) -> int:
        st = self._stmt
        if st is None:
            return _DENY
        if action == sqlite3.SQLITE_SELECT:
            return _OK
        if action == sqlite3.SQLITE_READ:
            # a read on behalf of a view or trigger (``inner``) or of another database is refused
            ok = inner is None and db in ("main", None) and (arg1 or "").lower() in st.tables
            return _OK if ok else _DENY
        if action == sqlite3.SQLITE_FUNCTION:
            return _OK if (arg2 or "").lower() in st.functions else _DENY
        if action == sqlite3.SQLITE_PRAGMA:
            ok = (arg1 or "").lower() == "table_info" and (arg2 or "").lower() in st.tables
            return _OK if ok else _DENY
        return _DENY

    def _progress(self) -> int:
        st = self._stmt
        if st is None:
            return 1
        st.checks += 1
        if st.checks > st.budget:
            st.stopped = True
            return 1
        return 0

    def _refused(self, st: _Statement, exc: sqlite3.Error) -> SqliteRefused | sqlite3.Error:
        if st.stopped:
            return SqliteRefused(
                self.path, st.label,
                f"reading it took more than {st.budget * STEPS_PER_CHECK:,} SQLite steps, more than a file "
                "of this size needs; stopped",
            )
        text = str(exc).lower()
        if "not authorized" in text or "prohibited" in text:
            return SqliteRefused(self.path, st.label, "the statement reads something other than the named tables; refused")
        return exc

    def _statement(self, tables: Iterable[str], functions: Iterable[str]) -> _Statement:
        names = [t for t in tables]
        label = ", ".join(printable(t) for t in names if t.lower() not in _SCHEMA_TABLES) or "sqlite_master"
        if not names:
            label = "(none)"
        return _Statement(frozenset(t.lower() for t in names), frozenset(f.lower() for f in functions), label,
                          self.budget)

    def _step(self, st: _Statement, fn: Any, *args: Any) -> Any:
        """Run ``fn`` (an execute or fetch) as statement ``st``: its guards apply."""
        prev, self._stmt = self._stmt, st
        try:
            return fn(*args)
        except sqlite3.Error as exc:
            err = self._refused(st, exc)
            if err is exc:
                raise
            raise err from None
        finally:
            self._stmt = prev

    # -- reading --------------------------------------------------------------------------------------

    def table(self, name: str) -> str | None:
        """The name of the real table called ``name`` (any case), None when there is none. Looking
        up a view or virtual table adds a line to :attr:`notes` (once) and gives None."""
        key = name.lower()
        if key in self.skipped:
            real, what = self.skipped.pop(key)
            self.notes.append(f"table {printable(real)} is {what}, not a table: not read")
        return self.tables.get(key)

    def has(self, name: str) -> bool:
        """True when a real table ``name`` exists (see :meth:`table`)."""
        return self.table(name) is not None

    def columns(self, table: str) -> list[str]:
        """The column names of real table ``table`` ([] when there is none)."""
        name = self.table(table)
        if name is None:
            return []
        rows = self.query(f"PRAGMA table_info({quote_ident(name)})", [name])
        return [r[1] for r in rows if isinstance(r[1], str)]

    def query(self, sql: str, tables: Iterable[str], functions: Iterable[str] = (), params: Any = ()) -> list[Any]:
        """All rows of ``sql``, which may read only ``tables`` and call only ``functions``."""
        st = self._statement(tables, functions)
        cur = self._step(st, self.con.execute, sql, params)
        return list(self._step(st, cur.fetchall))

    def chunks(self, sql: str, tables: Iterable[str], size: int, functions: Iterable[str] = ()) -> Iterator[list[Any]]:
        """The rows of ``sql`` in lists of at most ``size`` (the guards as for :meth:`query`)."""
        st = self._statement(tables, functions)
        cur = self._step(st, self.con.execute, sql)
        while True:
            rows = self._step(st, cur.fetchmany, size)
            if not rows:
                return
            yield rows

    def close(self) -> None:
        """Close the connection."""
        self.con.close()
