"""The analysis context rules run against: the DuckDB connection plus derived figures."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from advisor.model import Profile, Warning_
from advisor.schema import TABLES

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

_PARAM_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


_STAGE_TABLES = re.compile(r"\bbreakdown\b")  # tables the stages write

CAPABILITIES: dict[str, str] = {
    "device": "device (accelerator) events on at least one rank",
    "multi_rank": "at least two ranks",
    "multi_step": "at least two steps on some rank",
    "kernel_detail": "per-kernel detail: kernels rows (Ascend) or kernel launch grids (Kineto events.block_dim)",
    "breakdown": "the per-(rank, step) breakdown",
    "critical_path": "the critical path of the analysed step",
}


def bind(sql: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Keep only the parameters the SQL names (DuckDB rejects unused ones)."""
    if not params:
        return {}
    used = set(_PARAM_RE.findall(sql))
    return {k: v for k, v in params.items() if k in used}


class _StageResult:
    """An attribute of :class:`AnalysisContext` that the stages set (None until then); reading it
    waits for the stages' thread when they run beside the rules."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        obj.wait_stages()
        return obj.__dict__.get(self.attr)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.attr] = value


class Arrays(dict[str, "np.ndarray"]):
    """A query's columns by name as numpy arrays, with the distinct values of its coded columns."""

    names: dict[str, list[Any]]

    @classmethod
    def of(cls, table: Any, codes: Iterable[str] = ()) -> Arrays:
        """The columns of a pyarrow table; those in ``codes`` dictionary-encoded."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        out = cls()
        out.names = {}
        coded = set(codes)
        for name, col in zip(table.column_names, table.columns, strict=True):
            if name in coded:
                enc = pc.dictionary_encode(col.combine_chunks() if col.num_chunks else pa.array([], col.type),
                                           null_encoding="encode")
                values = enc.dictionary.to_pylist()
                order = sorted(range(len(values)), key=lambda i: (values[i] is None, values[i] or ""))
                code = np.empty(len(values), np.int64)
                code[order] = np.arange(len(values))
                out[name] = code[enc.indices.to_numpy(zero_copy_only=False)]
                out.names[name] = [values[i] for i in order]
            else:
                out[name] = col.to_numpy()
        return out


@dataclass
class AnalysisContext:
    """A loaded profile and its derived views."""

    con: Any
    path: str
    sources: list[str]
    ranks: list[int]
    warnings: list[Warning_] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    # set by the stages; not dataclass fields (no annotation), read through _StageResult
    breakdown = _StageResult()  # pd.DataFrame | None: one row per (rank, step)
    critical_path = _StageResult()  # dict | None: the critical path of the focus (rank, step)
    focus_rank = _StageResult()  # int | None
    focus_step = _StageResult()  # int | None
    _stages: threading.Thread | None = None  # the stages' thread while it runs beside the rules
    _stages_error: BaseException | None = None
    _counts: dict[str, int] = field(default_factory=dict)
    _derived: set[str] = field(default_factory=set)
    _building: dict[str, threading.Lock] = field(default_factory=dict)
    # one cursor per thread for query / df / scalar, whose results are fetched whole before they
    # return (a new cursor costs a statement selecting the database, which waits on busy ones)
    _local: threading.local = field(default_factory=threading.local, repr=False)

    # -- the inter-operator stages (breakdown, focus, critical path) -------------------------
    # They may run in a thread beside the rules (:meth:`run_stages_beside`): reading any of their
    # results, or SQL naming the ``breakdown`` table, waits for them.
    def run_stages_beside(self, stages: Any) -> None:
        """Run ``stages()`` (which sets the breakdown, focus and critical path) in a thread."""
        def run() -> None:
            try:
                stages()
            except BaseException as exc:  # noqa: BLE001 -- re-raised where a result is read
                self._stages_error = exc

        self._stages = threading.Thread(target=run, name="advisor-stages", daemon=True)
        self._stages.start()

    def wait_stages(self) -> None:
        """Wait for the stages' thread, if one runs; its error is raised here."""
        t = self._stages
        if t is not None and t is not threading.current_thread():
            t.join()
            if self._stages_error is not None:
                raise self._stages_error

    # -- SQL helpers -----------------------------------------------------------------------
    def prepare(self, sql: str) -> str:
        """Wait for the stages when ``sql`` reads a table they write (``breakdown``)."""
        if self._stages is not None and _STAGE_TABLES.search(sql):
            self.wait_stages()
        return sql

    def ensure_derived(self, names: Iterable[str]) -> None:
        """Build the shared derived tables ``names`` (:mod:`advisor.engine.derived`), and those their
        builders read, once per analysis. A rule declares the ones it reads (``@rule(derived=...)``)
        and the runner builds them before the rule runs; rules may run in parallel: one that needs a
        table another one is building waits for it."""
        from advisor.engine.derived import DERIVED  # numpy / pandas: imported once analysis starts

        for name in names:
            if name in self._derived:
                continue
            if name not in DERIVED:
                raise KeyError(f"unknown derived table {name!r}")
            with self._building.setdefault(name, threading.Lock()):
                if name not in self._derived:
                    self.ensure_derived(DERIVED[name].needs)
                    DERIVED[name].build(self.con, name)
                    self._derived.add(name)

    def query(self, sql: str, params: dict[str, Any] | None = None, used_only: bool = True) -> list[dict[str, Any]]:
        """Run SQL with ``$name`` parameters and return rows as dicts."""
        self.prepare(sql)
        cur = self._cursor()
        res = cur.execute(sql, bind(sql, params) if used_only else (params or {}))
        cols = [d[0] for d in res.description]
        return [dict(zip(cols, row, strict=True)) for row in res.fetchall()]

    def df(self, sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Run SQL and return a DataFrame."""
        self.prepare(sql)
        return cast("pd.DataFrame", self._cursor().execute(sql, bind(sql, params)).df())

    def arrays(self, sql: str, params: dict[str, Any] | None = None, codes: Iterable[str] = ()) -> Arrays:
        """Run SQL and return its columns as numpy arrays (no pandas objects; an integer column with
        NULLs comes back as floats with NaN). A column named in ``codes`` (strings) comes back as
        integer codes into ``result.names[column]``, its distinct values in order (NULL last, as None):
        codes compare as the values do."""
        self.prepare(sql)
        table = self._cursor().sql(sql, params=bind(sql, params)).to_arrow_table()
        return Arrays.of(table, codes)

    def scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        """First column of the first row (None when there is no row). The rows are all fetched: a result
        left unread keeps the thread's cursor busy, and :meth:`arrays` on it would fail."""
        self.prepare(sql)
        rows = self._cursor().execute(sql, bind(sql, params)).fetchall()
        return rows[0][0] if rows else None

    def _cursor(self) -> Any:
        """This thread's cursor for :meth:`query`, :meth:`df` and :meth:`scalar`."""
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self.con.cursor()
        return cur

    def rows(self, table: str) -> int:
        """Row count of a canonical table or of the derived ``breakdown`` table (cached)."""
        if table == "breakdown":
            return 0 if self.breakdown is None else len(self.breakdown)
        return self._kept(table, lambda: int(self.scalar(f"SELECT count(*) FROM {table}")) if table in TABLES else 0)

    def _kept(self, key: str, compute: Callable[[], Any]) -> int:
        """``compute()`` (a figure of the loaded tables) once per analysis under ``key``; a thread asking
        while another computes it waits for that answer."""
        if key not in self._counts:
            with self._building.setdefault("_counts:" + key, threading.Lock()):
                if key not in self._counts:
                    self._counts[key] = int(compute())
        return self._counts[key]

    @property
    def vendor_kernels(self) -> int:
        """Rows of ``kernels`` from a vendor's per-operator export (Ascend op_summary /
        kernel_details), not the launch geometry Kineto records for GPU kernels (core type GPU):
        rules with an Ascend path and a Kineto path choose by this, not by ``rows("kernels")``."""
        return self._kept("_vendor_kernels", lambda: int(
            self.scalar("SELECT count(*) FROM kernels WHERE core_type IS DISTINCT FROM 'GPU'") or 0))

    # -- capabilities ----------------------------------------------------------------------
    @property
    def has_device(self) -> bool:
        """Some rank has device events (cached: ``ranks`` is not changed once loaded)."""
        return bool(self._kept("_has_device", lambda: bool(self.scalar("SELECT bool_or(has_device) FROM ranks"))))

    def missing(self, requirement: str) -> str | None:
        """Why a requirement is not met (None when it is)."""
        if requirement in TABLES:
            return None if self.rows(requirement) > 0 else f"no {requirement} data in this profile ({TABLES[requirement].doc})"
        if requirement == "device":
            return None if self.has_device else "CPU-only trace: no device events"
        if requirement == "multi_rank":
            return None if len(self.ranks) >= 2 else "single rank"
        # the loaded tables do not change once rules run: the answers below are kept
        if requirement == "multi_step":
            n = self._kept("_max_steps", lambda: self.scalar(
                "SELECT max(c) FROM (SELECT count(*) c FROM steps WHERE step >= 0 GROUP BY rank)") or 0)
            return None if n >= 2 else "fewer than two steps"
        if requirement == "kernel_detail":
            return None if self.rows("kernels") > 0 or self._kept("_grids", lambda: self.scalar(
                "SELECT count(*) FROM (SELECT 1 FROM events WHERE block_dim IS NOT NULL LIMIT 1)") or 0) else (
                "no per-kernel detail in this profile (Ascend kernel_details / op_summary, Kineto kernel launch grids)")
        if requirement == "breakdown":
            return None if self.breakdown is not None and len(self.breakdown) else "no breakdown"
        if requirement == "critical_path":
            return None if self.critical_path and self.critical_path.get("ops") else "no critical path"
        return f"unknown requirement {requirement!r}"

    # -- figures rules use often --------------------------------------------------------------
    def step_us(self, rank: int | None = None, step: int | None = None) -> float:
        """Step time in µs: one (rank, step), the median over a rank's steps, or over everything."""
        bd = self.breakdown
        if bd is None or bd.empty:
            return 0.0
        sel = bd
        if rank is not None:
            sel = sel[sel["rank"] == rank]
        if step is not None:
            sel = sel[sel["step"] == step]
        return float(sel["step_us"].median()) if len(sel) else 0.0


def context_of(profile: Profile) -> AnalysisContext:
    """The rules' context over a loaded profile (its tables, ranks and warnings so far)."""
    ctx = AnalysisContext(con=profile.con, path=profile.path, sources=profile.sources, ranks=profile.ranks,
                          warnings=profile.warnings)
    ctx.extras["parse_seconds"] = profile.parse_seconds
    return ctx


def load_profile(path: str | Path, **kwargs: Any) -> AnalysisContext:
    """:func:`advisor.ingest.load` as the engine's context, for callers that query the loaded tables
    or run rules on them (the analysis builds its contexts itself). Same keywords as the load."""
    from advisor.ingest import load

    return context_of(load(path, **kwargs))
