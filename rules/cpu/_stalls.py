"""Preemption stalls: host calls whose own time jumps by a scheduler slice (CPU005's second part).

Not a rule module (the name starts with ``_``). A host call's *own* time is its duration less the
time of the events nested directly in it on its thread. The same work is the same *slot*: the same
thread, name (Python object addresses removed) and input shapes, and the same occurrence of that key
in the step, where the key runs the same number of times in every step it appears in; where that
count varies, keys with recorded shapes are compared with the key's median over all its calls, keys
without shapes are not compared (different calls may do different work). A call *stalled* when its own
time exceeds its slot's median own time (over at least ``min_steps`` steps) by at least ``min_stall_us``
(a scheduler slice: milliseconds) and by at least ``stall_ratio`` times, and by at most ``max_stall_us``
(a few slices: a longer pause is something else, a sleep, a full GC, I/O).

What else makes a call's own time jump, and how it is told apart:

* nested work (a sync, a copy, a data-loader fetch, a GC pause recorded as an event): not own time;
* a data-loader fetch or a compile: calls inside a ``dataloader`` event or a compile event (CPU001's:
  the compiler runs Python, and collects garbage, inside its ranges) are not judged;
* Python GC: calls overlapping a recorded GC event (``Python GC`` / ``GC``) on the rank are not judged;
  where GC events are not recorded, a stall in a Python function's or user range's own time could be a
  collection, so those are counted only on ranks where framework operators (``host_op``: the same
  operator on the same shapes does the same work) stalled too, and are reported apart;
* page faults on first touch, allocator growth, lazy initialisation, recompiles: warm-up steps are not
  judged: the first step of each profiling cycle (the step before it not profiled) and the steps whose
  compiles take ``compile_share`` of the median step (CLU003's warm-up);
* a lock, the GIL, a hand-off: calls during whose stall another thread of the same process ran traced
  host work for at least half of it are not judged (the call may have waited for that thread);
* a broad slowdown: in a step where the stalled calls are at least ``broad_share`` of the judged calls'
  usual own time, the whole step ran slower (CPU005's other finding), not a few calls: not counted;
* a wait for the device: on ranks with device events, calls that read a device value or synchronise
  (CPU003's names: ``aten::item``, ``.item()``, ``synchronize`` ...) and calls ending within
  ``release_us`` after a device task ended (the host may have been released by it) are not judged.

The trace has no per-thread CPU time, so that the thread was descheduled is inferred, not observed.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rules.cpu.cpu001_operator_compilation import COMPILE_RE, NOT_COMPILE_RE
from rules.cpu.cpu003_host_device_sync import HOST_SYNC_RE, PY_NOT_SYNC_RE, PY_SYNC_RE

_SYNC = re.compile(HOST_SYNC_RE)
_PY_SYNC = re.compile(PY_SYNC_RE)
_PY_NOT_SYNC = re.compile(PY_NOT_SYNC_RE)

GC_NAMES = ("Python GC", "GC")
#: kinds of host calls judged; ``host_op`` calls do fixed work for fixed shapes, the others run Python
JUDGED_KINDS = ("host_op", "python", "annotation")
_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")
_COMPILE = re.compile(COMPILE_RE)
_NOT_COMPILE = re.compile(NOT_COMPILE_RE)


def _by_name(names: pd.Series, f: Any, dtype: Any = object) -> pd.Series:
    """``f`` of each name (a text), computed once per distinct name."""
    codes, uniques = pd.factorize(names, use_na_sentinel=False)
    values = np.asarray([f(str(u)) for u in uniques], dtype=dtype)
    out: pd.Series = pd.Series(values[codes], index=names.index, dtype=dtype)
    return out

EVENTS_SQL = """
SELECT rank, step, pid, tid, kind::VARCHAR AS kind, name, coalesce(shapes, '') AS shapes, start_ns, dur_ns
FROM events WHERE NOT device AND step >= 0 AND kind <> 'step' AND dur_ns >= 0
ORDER BY rank, pid, tid, start_ns, dur_ns DESC
"""

DEVICE_ENDS_SQL = """
SELECT rank, start_ns + dur_ns AS end_ns FROM events
WHERE device AND kind IN ('kernel', 'comm', 'memcpy', 'memset') AND rank IN (SELECT unnest($ranks))
ORDER BY rank, end_ns
"""


#: the columns of :attr:`Stalls.calls`
STALL_COLUMNS = ("step", "pid", "tid", "kind", "name", "shapes", "start_ns", "dur_ns", "own_ns", "typ_ns", "excess_ns")


@dataclass
class Stalls:
    """The stalls found on one rank: one row per stalled call (``calls``) and the calls not judged, by why."""

    rank: int
    calls: pd.DataFrame
    left_out: dict[str, int] = field(default_factory=dict)
    #: the steps judged (those not warm-up)
    judged: tuple[int, ...] = ()


def _own_times(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Own time and whether inside a data-loader or compile event (``g["outer"]``), per row of one thread's
    events (sorted by start, then longest first). Each instant of the thread belongs to the innermost event running then: the one that started
    last of those still running (so an event that outlives its parent, as record_function ranges end inside
    Python's ``__exit__``, does not swallow what follows its parent)."""
    n = len(g)
    start = g["start_ns"].to_numpy(np.int64)
    end = start + g["dur_ns"].to_numpy(np.int64)
    loader = g["outer"].to_numpy(dtype=bool)
    own = np.zeros(n, dtype=np.int64)
    inside = np.zeros(n, dtype=bool)
    # boundaries: ends before starts at the same instant; zero-length events own nothing
    t = np.concatenate([end, start])
    typ = np.concatenate([np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)])
    k = np.concatenate([np.arange(n), np.arange(n)])
    order = np.lexsort((k, typ, t))
    ended = np.zeros(n, dtype=bool)
    heap: list[int] = []  # -k of the running events: the top is the latest started
    loaders = 0
    cur = int(t[order[0]]) if n else 0
    for o in order.tolist():
        x, kind, i = int(t[o]), int(typ[o]), int(k[o])
        while heap and ended[-heap[0]]:
            heapq.heappop(heap)
        if heap and x > cur:
            own[-heap[0]] += x - cur
        cur = x
        if kind == 0:
            if not ended[i] and end[i] > start[i]:
                ended[i] = True
                loaders -= int(loader[i])
            continue
        if end[i] <= start[i]:
            ended[i] = True
            inside[i] = loaders > 0
            continue
        inside[i] = loaders > 0
        loaders += int(loader[i])
        heapq.heappush(heap, -i)
    return own, inside


def _covered(a: np.ndarray, b: np.ndarray, lo: int, hi: int) -> int:
    """How much of [lo, hi) the intervals [a, b) cover (their union)."""
    m = (a < hi) & (b > lo)
    if not m.any():
        return 0
    s = np.clip(a[m], lo, hi)
    e = np.clip(b[m], lo, hi)
    order = np.argsort(s)
    total, cur_s, cur_e = 0, int(s[order[0]]), int(e[order[0]])
    for x, y in zip(s[order[1:]].tolist(), e[order[1:]].tolist(), strict=True):
        if x > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = x, y
        else:
            cur_e = max(cur_e, y)
    return total + cur_e - cur_s


def _drop(hit: pd.DataFrame, mask: Any, why: str, left: dict[str, int]) -> pd.DataFrame:
    """``hit`` without the rows of ``mask``, counted in ``left`` under ``why``."""
    m = np.asarray(mask, dtype=bool)
    if m.any():
        left[why] = left.get(why, 0) + int(m.sum())
    return hit[~m]



def _typical(c: pd.DataFrame, grp: list[str], min_steps: int, min_stall_us: float,
             stall_ratio: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each call of ``c`` (one rank's judged calls) with its usual own time (``typ_ns``: the median of the
    same occurrence in the step where its key runs as often in every step, else of the key's calls where
    they have shapes; ``typ_steps``: over how many steps) and ``excess_ns``, those with a usual time over
    ``min_steps`` steps; and the calls that stalled."""
    c = c.copy()
    c["ord"] = c.groupby([*grp, "step"]).cumcount()
    per_step = c.groupby([*grp, "step"]).size().rename("n").reset_index()
    steady = per_step.groupby(grp)["n"].agg(["min", "max"]).reset_index()
    steady["same_count"] = steady["min"] == steady["max"]
    c = c.merge(steady[[*grp, "same_count"]], on=grp, how="left")
    slot = c[c["same_count"]].groupby([*grp, "ord"])["own_ns"].agg(["median", "size"]).reset_index()
    slot.columns = [*grp, "ord", "typ_ns", "typ_steps"]
    keyed = c[~c["same_count"] & c["shapes"].str.contains(r"\d", regex=True)]
    key = keyed.groupby(grp)["own_ns"].agg(["median", "size"]).reset_index()
    key.columns = [*grp, "typ_ns", "typ_steps"]
    key["typ_steps"] = keyed.groupby(grp)["step"].nunique().to_numpy()
    a = c[c["same_count"]].merge(slot, on=[*grp, "ord"], how="inner")
    b = keyed.merge(key, on=grp, how="inner")
    c = pd.concat([a, b], ignore_index=True)
    c = c[c["typ_steps"] >= min_steps]
    c["excess_ns"] = c["own_ns"] - c["typ_ns"]
    hit = c[(c["excess_ns"] >= min_stall_us * 1000) & (c["own_ns"] >= stall_ratio * c["typ_ns"])].copy()
    return c, hit

def find(ctx: Any, *, min_steps: int, min_stall_us: float, max_stall_us: float, stall_ratio: float,
         release_us: float, compile_share: float, broad_share: float, med_step: dict[int, float]) -> dict[int, Stalls]:
    """The stalled calls of every rank (see the module doc); ``med_step``: each rank's median step (µs)."""
    ev = ctx.df(EVENTS_SQL)
    if ev.empty:
        return {}
    # plain Python strings: the many row selections below copy them by reference, Arrow strings by value
    for col in ev.columns:
        if ev[col].dtype.kind not in "iufb":
            ev[col] = ev[col].astype(object)
    out: dict[int, Stalls] = {}
    dev_ranks = set(ctx.device_ranks)
    dev_ends: dict[int, np.ndarray] = {}
    if dev_ranks & set(ev["rank"].unique().tolist()):
        de = ctx.df(DEVICE_ENDS_SQL, {"ranks": sorted(int(r) for r in dev_ranks)})
        dev_ends = {int(r): g["end_ns"].to_numpy(np.int64) for r, g in de.groupby("rank")}
    for rank, er in ev.groupby("rank", sort=True):
        rank = int(rank)
        er = er.reset_index(drop=True)
        compiling = _by_name(er["name"], lambda n: bool(_COMPILE.search(n)) and not _NOT_COMPILE.search(n), bool) \
            & ~er["kind"].isin(("step", "python"))
        er["outer"] = (er["kind"] == "dataloader") | compiling
        own = np.zeros(len(er), dtype=np.int64)
        inside = np.zeros(len(er), dtype=bool)
        for ix in er.groupby(["pid", "tid"], sort=False).indices.values():
            o, ins = _own_times(er.iloc[ix])
            own[ix], inside[ix] = o, ins
        er["own_ns"] = own
        er["in_loader"] = inside
        er["end_ns"] = er["start_ns"] + er["dur_ns"]
        steps = sorted(int(s) for s in er["step"].unique())
        first = {s for s in steps if s - 1 not in steps}  # the first step of each profiling cycle
        # steps whose compiles (CPU001's) take min_excess_ratio of the median step are warm-up too (as CLU003's)
        comp = er[compiling & ~er["in_loader"]].groupby("step")["dur_ns"].sum()
        med = med_step.get(rank, 0.0) * 1000.0
        first |= {int(str(s)) for s, v in comp.items() if med and float(v) >= compile_share * med}
        c = er[er["kind"].isin(JUDGED_KINDS) & ~er["name"].isin(GC_NAMES)].copy()
        if c.empty:
            continue
        c["key"] = _by_name(c["name"], lambda n: _ADDR.sub("", n))
        # a call's key (thread, name, shapes) as one integer: the groupings below are over it
        c["gid"] = c.groupby(["pid", "tid", "key", "shapes"], sort=False, dropna=False).ngroup()
        grp = ["gid"]
        # a call's usual time is a median of its key's calls (at least their shortest): a key whose calls
        # differ by less than min_stall_us holds no stall, and the rest of the work is only for those that do
        spread = c.groupby(grp)["own_ns"].agg(["min", "max"])
        if not ((spread["max"] - spread["min"]) >= min_stall_us * 1000).any():
            out[rank] = Stalls(rank, pd.DataFrame(columns=list(STALL_COLUMNS)), {},
                               tuple(s for s in steps if s not in first))
            continue
        # the usual time of the keys whose calls spread that much first: where none of their calls stalled,
        # nothing did (the other keys' usual times only weigh a stall against its step's work)
        wide = spread.index[(spread["max"] - spread["min"]) >= min_stall_us * 1000].to_frame(index=False)
        is_wide = c.merge(wide.assign(_wide=True), on=grp, how="left")["_wide"].fillna(False).to_numpy(dtype=bool)
        c_wide, hit = _typical(c[is_wide], grp, min_steps, min_stall_us, stall_ratio)
        if hit.empty:
            out[rank] = Stalls(rank, pd.DataFrame(columns=list(STALL_COLUMNS)), {},
                               tuple(s for s in steps if s not in first))
            continue
        c = pd.concat([c_wide, _typical(c[~is_wide], grp, min_steps, min_stall_us, stall_ratio)[0]], ignore_index=True)
        left: dict[str, int] = {}
        # a step where the stalled calls are most of the work (at its usual time) ran slower as a whole: a broad
        # slowdown, not slices lost by a few calls
        usual = c.groupby("step")["typ_ns"].sum()
        part = hit.groupby("step")["typ_ns"].sum() / usual.reindex(hit["step"].unique()).clip(lower=1)
        broad = {int(str(s)) for s, v in part.items() if float(v) >= broad_share}
        hit = _drop(hit, hit["step"].isin(broad), "in a step where most of the work ran slower (a broad slowdown)", left)
        hit = _drop(hit, hit["excess_ns"] > max_stall_us * 1000, "longer than a few scheduler slices", left)
        hit = _drop(hit, hit["step"].isin(first), "in a warm-up step (first of a profiling cycle, or compiling)", left)
        hit = _drop(hit, hit["in_loader"], "inside a data-loader fetch or a compile", left)
        gc = er[er["name"].isin(GC_NAMES)]
        if len(gc) and len(hit):
            ga, gb = gc["start_ns"].to_numpy(np.int64), gc["end_ns"].to_numpy(np.int64)
            near = [bool(((ga < e) & (gb > s)).any()) for s, e in zip(hit["start_ns"], hit["end_ns"], strict=True)]
            hit = _drop(hit, near, "overlapping a Python GC event", left)
        if rank in dev_ranks and len(hit):
            ends = dev_ends.get(rank, np.zeros(0, dtype=np.int64))
            e = hit["end_ns"].to_numpy(np.int64)
            p = np.searchsorted(ends, e, side="right")
            last = np.where(p > 0, ends[np.clip(p - 1, 0, None)] if len(ends) else 0, np.iinfo(np.int64).min)
            released = (p > 0) & (last >= e - int(release_us * 1000))
            sync = np.asarray([bool(_SYNC.search(str(n)) or (_PY_SYNC.search(str(n)) and not _PY_NOT_SYNC.search(str(n))))
                               for n in hit["name"]], dtype=bool) | released
            hit = _drop(hit, sync, "possibly waiting for the device", left)
        if len(hit):
            busy = []
            for pid, tid, s, e2, x in zip(hit["pid"], hit["tid"], hit["start_ns"], hit["end_ns"], hit["excess_ns"],
                                          strict=True):
                o = er[(er["pid"] == pid) & (er["tid"] != tid) & (er["kind"] != "step")]
                busy.append(_covered(o["start_ns"].to_numpy(np.int64), o["end_ns"].to_numpy(np.int64), int(s),
                                     int(e2)) >= 0.5 * float(x))
            hit = _drop(hit, busy, "another thread of the process ran meanwhile (a lock or hand-off)", left)
        if not (hit["kind"] == "host_op").any():
            if len(hit):
                left["in Python code or user ranges only (no operator stalled: could be unrecorded GC or the "
                     "code's own work)"] = len(hit)
            hit = hit.iloc[0:0]
        out[rank] = Stalls(rank, hit[list(STALL_COLUMNS)].sort_values("start_ns").reset_index(drop=True), left,
                           tuple(s for s in steps if s not in first))
    return out
