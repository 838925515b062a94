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
_DIGIT = re.compile(r"\d")
_COMPILE = re.compile(COMPILE_RE)
_NOT_COMPILE = re.compile(NOT_COMPILE_RE)


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


_NONE = np.iinfo(np.int64).min


def _last_above(e: np.ndarray, p: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per query: the last index ``j < p`` with ``e[j] > t`` (-1 when none), by a max segment tree over ``e``."""
    ans = np.full(len(p), -1, dtype=np.int64)
    m = len(e)
    if not m or not len(p):
        return ans
    near = (p > 0) & (e[np.clip(p - 1, 0, None)] > t)  # most often the event started last is still running
    ans[near] = p[near] - 1
    act = np.flatnonzero(~near & (p > 1))
    if not len(act):
        return ans
    size = 1 << int(m).bit_length()  # > m: leaf p exists for every p <= m
    tree = np.full(2 * size, _NONE, dtype=np.int64)
    tree[size:size + m] = e
    lo = size
    while lo > 1:
        tree[lo // 2:lo] = np.maximum(tree[lo:2 * lo:2], tree[lo + 1:2 * lo:2])
        lo //= 2
    # climb from leaf p: a right child's left sibling holds the indices just before those already passed
    v, tt = size + p[act], t[act]
    found_q: list[np.ndarray] = []
    found_v: list[np.ndarray] = []
    while len(act):
        got = ((v & 1) == 1) & (tree[v - 1] > tt)
        found_q.append(act[got])
        found_v.append(v[got] - 1)
        keep = ~got
        v, act, tt = v[keep] >> 1, act[keep], tt[keep]
        more = (v & (v - 1)) != 0  # a leftmost node has nothing before it
        v, act, tt = v[more], act[more], tt[more]
    q = np.concatenate(found_q)
    u = np.concatenate(found_v)
    tt = t[q]
    while len(u) and (u < size).any():  # down to the rightmost leaf above t
        inner = u < size
        r = 2 * u[inner] + 1
        u[inner] = np.where(tree[r] > tt[inner], r, r - 1)
    ans[q] = u - size
    return ans


def _own_times(th: np.ndarray, valid: np.ndarray, start: np.ndarray, dur: np.ndarray,
               outer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Own time and whether inside a data-loader or compile event (``outer``), per event; ``th``: each event's
    thread (ascending), the events sorted by thread, then start, then longest first; events not ``valid`` (no
    thread known) are not attributed. Each instant of a thread belongs to the innermost event running then: the
    one that started last (in that order) of those still running (so an event that outlives its parent, as
    record_function ranges end inside Python's ``__exit__``, does not swallow what follows its parent); events
    ending at an instant end before those starting at it; zero-length events own nothing."""
    n = len(th)
    own = np.zeros(n, dtype=np.int64)
    inside = np.zeros(n, dtype=bool)
    end = start + dur
    idx = np.flatnonzero(valid & (dur > 0))
    if len(idx):
        s, e, tp = start[idx], end[idx], th[idx]
        m = len(idx)
        # the thread's boundaries in time order; each span up to the next one belongs to the event running in it
        qt = np.concatenate([s, e])
        qth = np.concatenate([tp, tp])
        o = np.lexsort((qt, qth))
        qt, qth = qt[o], qth[o]
        span = np.zeros(len(qt), dtype=np.int64)
        span[:-1] = np.where(qth[1:] == qth[:-1], qt[1:] - qt[:-1], 0)
        q = span > 0
        qt, qth, span = qt[q], qth[q], span[q]
        # p: how many of the events (in order) started by then; the running one is the last of them not ended
        k = np.concatenate([np.zeros(m, dtype=np.int8), np.ones(len(qt), dtype=np.int8)])
        o = np.lexsort((k, np.concatenate([s, qt]), np.concatenate([tp, qth])))
        at = o >= m
        p = np.empty(len(qt), dtype=np.int64)
        p[o[at] - m] = np.cumsum(~at)[at]
        first = np.searchsorted(tp, qth, side="left")  # the thread's first event
        run = _last_above(e, p, qt)
        ok = run >= first
        own_pos = np.zeros(m, dtype=np.int64)
        np.add.at(own_pos, run[ok], span[ok])
        own[idx] = own_pos
    # inside: a data-loader or compile event of positive length that started earlier (in order) ends after it starts
    lo = np.flatnonzero(outer & valid & (dur > 0))
    for t0 in np.unique(th[lo]).tolist():
        a = int(np.searchsorted(th, t0, side="left"))
        b = int(np.searchsorted(th, t0, side="right"))
        ends = np.where(outer[a:b] & valid[a:b] & (dur[a:b] > 0), end[a:b], _NONE)
        before = np.maximum.accumulate(ends)
        inside[a + 1:b] = (before[:-1] > start[a + 1:b]) & valid[a + 1:b]
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


def _drop(hit: np.ndarray, mask: Any, why: str, left: dict[str, int]) -> np.ndarray:
    """``hit`` (positions) without those of ``mask``, counted in ``left`` under ``why``."""
    m = np.asarray(mask, dtype=bool)
    if m.any():
        left[why] = left.get(why, 0) + int(m.sum())
    kept: np.ndarray = hit[~m]
    return kept


def _starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Where each run of equal values of ``sorted_keys`` begins."""
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if len(sorted_keys) else np.zeros(0, np.int64)


def _medians(g: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct value of ``g``: that value, the median of its ``v`` (as pandas': the mean of the two middle
    values for an even count) and its count."""
    o = np.lexsort((v, g))
    gs, vs = g[o], v[o].astype(np.float64)
    st = _starts(gs)
    size = np.diff(np.r_[st, len(gs)])
    mid = st + size // 2
    med = np.where(size % 2 == 1, vs[mid], (vs[mid - 1] + vs[mid]) / 2)
    return gs[st], med, size


def _typical(gid: np.ndarray, step: np.ndarray, own: np.ndarray, digits: np.ndarray,
             min_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one rank's judged calls (in order; ``gid``: the key, numbered from 0; ``digits``: whether the call's
    shapes hold a number): each call's usual own time (``typ``: the median of the same occurrence in the step
    where its key runs as often in every step, else of the key's calls where they have shapes), whether it has
    one over at least ``min_steps`` steps (``judged``), and whether it is compared by its occurrence (``same``)."""
    n_g = int(gid.max()) + 1
    # ord: the call's occurrence of its key in the step
    o = np.lexsort((step, gid))
    pair = gid[o] * (int(step.max()) - int(step.min()) + 1) + (step[o] - int(step.min()))
    st = _starts(pair)
    size = np.diff(np.r_[st, len(o)])
    ordn = np.empty(len(o), dtype=np.int64)
    ordn[o] = np.arange(len(o)) - np.repeat(st, size)
    pair_gid = gid[o][st]
    lo = np.full(n_g, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(n_g, dtype=np.int64)
    np.minimum.at(lo, pair_gid, size)
    np.maximum.at(hi, pair_gid, size)
    same = (lo == hi)[gid]
    typ = np.zeros(len(gid), dtype=np.float64)
    typ_steps = np.zeros(len(gid), dtype=np.int64)
    if same.any():
        rows = np.flatnonzero(same)
        slot = gid[rows] * (int(ordn.max()) + 1) + ordn[rows]
        keys, med, cnt = _medians(slot, own[rows])
        at = np.searchsorted(keys, slot)
        typ[rows], typ_steps[rows] = med[at], cnt[at]
    keyed = ~same & digits
    if keyed.any():
        rows = np.flatnonzero(keyed)
        keys, med, _ = _medians(gid[rows], own[rows])
        at = np.searchsorted(keys, gid[rows])
        typ[rows] = med[at]
        typ_steps[rows] = np.bincount(pair_gid, minlength=n_g)[gid[rows]]  # the steps it runs in
    judged = (same | keyed) & (typ_steps >= min_steps)
    return typ, judged, same


def _texts(values: list[Any], codes: np.ndarray) -> pd.Series:
    """The texts of ``codes`` (NULL as NaN, as pandas reads it), as plain Python strings."""
    out = [values[x] for x in codes.tolist()]
    return pd.Series([np.nan if v is None else v for v in out], dtype=object)


def _is_sync(name: Any) -> bool:
    """The call reads a device value or synchronises (CPU003's names)."""
    x = "nan" if name is None else str(name)
    return bool(_SYNC.search(x) or (_PY_SYNC.search(x) and not _PY_NOT_SYNC.search(x)))


def _empty(rank: int, judged: tuple[int, ...]) -> Stalls:
    return Stalls(rank, pd.DataFrame(columns=list(STALL_COLUMNS)), {}, judged)


def _codes_where(names: list[Any], f: Any) -> np.ndarray:
    """``f`` of each distinct value (as text), by code."""
    return np.asarray([bool(f("nan" if v is None else str(v))) for v in names], dtype=bool)


def find(ctx: Any, *, min_steps: int, min_stall_us: float, max_stall_us: float, stall_ratio: float,
         release_us: float, compile_share: float, broad_share: float, med_step: dict[int, float]) -> dict[int, Stalls]:
    """The stalled calls of every rank (see the module doc); ``med_step``: each rank's median step (µs)."""
    ev = ctx.arrays(EVENTS_SQL, codes=("pid", "tid", "kind", "name", "shapes"))
    n = len(ev["rank"])
    if not n:
        return {}
    names = ev.names
    rank_a, step_a = ev["rank"], ev["step"]
    pid, tid, kind, name, shapes = ev["pid"], ev["tid"], ev["kind"], ev["name"], ev["shapes"]
    start = ev["start_ns"].astype(np.int64)
    dur = ev["dur_ns"].astype(np.int64)
    end = start + dur
    kinds = [str(k) for k in names["kind"]]

    def kind_in(ks: tuple[str, ...]) -> np.ndarray:
        return np.isin(kind, [i for i, k in enumerate(kinds) if k in ks])

    out: dict[int, Stalls] = {}
    dev_ranks = set(ctx.device_ranks)
    dev_ends: dict[int, np.ndarray] = {}
    ranks = np.unique(rank_a)
    if dev_ranks & set(ranks.tolist()):
        de = ctx.arrays(DEVICE_ENDS_SQL, {"ranks": sorted(int(r) for r in dev_ranks)})
        de_rank, de_end = de["rank"], de["end_ns"].astype(np.int64)
        for r in np.unique(de_rank).tolist():
            dev_ends[int(r)] = de_end[de_rank == r]
    compiling = _codes_where(names["name"], lambda x: _COMPILE.search(x) and not _NOT_COMPILE.search(x))[name] \
        & ~kind_in(("step", "python"))
    outer = kind_in(("dataloader",)) | compiling
    # a thread: rank, pid and tid (the events come sorted by them); one without pid or tid is not attributed
    new_th = np.r_[True, (rank_a[1:] != rank_a[:-1]) | (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])]
    th = np.cumsum(new_th) - 1
    none_pid = len(names["pid"]) - 1 if names["pid"] and names["pid"][-1] is None else -1
    none_tid = len(names["tid"]) - 1 if names["tid"] and names["tid"][-1] is None else -1
    valid = (pid != none_pid) & (tid != none_tid)
    own, inside = _own_times(th, valid, start, dur, outer)
    judged_kind = kind_in(JUDGED_KINDS) & ~np.isin(name, [i for i, x in enumerate(names["name"]) if x in GC_NAMES])
    is_gc = np.isin(name, [i for i, x in enumerate(names["name"]) if x in GC_NAMES])
    digits = _codes_where(names["shapes"], _DIGIT.search)
    host_op = kinds.index("host_op") if "host_op" in kinds else -1
    key_of_name = np.unique([_ADDR.sub("", "nan" if x is None else str(x)) for x in names["name"]],
                            return_inverse=True)[1] if names["name"] else np.zeros(0, np.int64)
    n_shapes = max(len(names["shapes"]), 1)
    bounds = np.searchsorted(rank_a, ranks, side="left").tolist() + [n]
    thr = min_stall_us * 1000
    for i, rank in enumerate(ranks.tolist()):
        rank = int(rank)
        a, b = bounds[i], bounds[i + 1]
        step = step_a[a:b]
        steps = [int(s) for s in np.unique(step).tolist()]
        have = set(steps)
        first = {s for s in steps if s - 1 not in have}  # the first step of each profiling cycle
        # steps whose compiles (CPU001's) take min_excess_ratio of the median step are warm-up too (as CLU003's)
        cm = compiling[a:b] & ~inside[a:b]
        med = med_step.get(rank, 0.0) * 1000.0
        if cm.any() and med:
            cs, ci = np.unique(step[cm], return_inverse=True)
            sums = np.zeros(len(cs), dtype=np.int64)
            np.add.at(sums, ci, dur[a:b][cm])
            first |= {int(s) for s, v in zip(cs.tolist(), sums.tolist(), strict=True) if float(v) >= compile_share * med}
        judged_steps = tuple(s for s in steps if s not in first)
        rows = a + np.flatnonzero(judged_kind[a:b])
        if not len(rows):
            continue
        # a call's key (thread, name, shapes) as one integer: the groupings below are over it
        ks = np.unique(key_of_name[name[rows]] * n_shapes + shapes[rows], return_inverse=True)[1].reshape(-1)
        gid = np.unique(th[rows] * (int(ks.max()) + 1) + ks, return_inverse=True)[1].reshape(-1)
        c_own = own[rows]
        # a call's usual time is a median of its key's calls (at least their shortest): a key whose calls
        # differ by less than min_stall_us holds no stall
        n_g = int(gid.max()) + 1
        lo = np.full(n_g, np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.full(n_g, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(lo, gid, c_own)
        np.maximum.at(hi, gid, c_own)
        wide = (hi - lo) >= thr
        if not wide.any():
            out[rank] = _empty(rank, judged_steps)
            continue
        c_step = step_a[rows]
        typ, judged, same = _typical(gid, c_step, c_own, digits[shapes[rows]], min_steps)
        excess = c_own - typ
        stalled = judged & wide[gid] & (excess >= thr) & (c_own >= stall_ratio * typ)
        if not stalled.any():
            out[rank] = _empty(rank, judged_steps)
            continue
        # in the order compared by occurrence, then by key (each in the events' order)
        sel = np.r_[np.flatnonzero(stalled & same), np.flatnonzero(stalled & ~same)]
        rows_h, typ_h, exc_h = rows[sel], typ[sel], excess[sel]
        hit = np.arange(len(sel))  # the stalls kept, by position in rows_h
        left: dict[str, int] = {}
        # a step where the stalled calls are most of the work (at its usual time) ran slower as a whole: a broad
        # slowdown, not slices lost by a few calls
        us, ui = np.unique(c_step[judged], return_inverse=True)
        usual = np.zeros(len(us), dtype=np.float64)
        np.add.at(usual, ui, typ[judged])
        hs, hi_ = np.unique(step_a[rows_h], return_inverse=True)
        hsum = np.zeros(len(hs), dtype=np.float64)
        np.add.at(hsum, hi_, typ_h)
        part = hsum / np.maximum(usual[np.searchsorted(us, hs)], 1.0)
        broad = [int(s) for s, v in zip(hs.tolist(), part.tolist(), strict=True) if float(v) >= broad_share]
        hit = _drop(hit, np.isin(step_a[rows_h], broad), "in a step where most of the work ran slower (a broad slowdown)",
                    left)
        hit = _drop(hit, exc_h[hit] > max_stall_us * 1000, "longer than a few scheduler slices", left)
        hit = _drop(hit, np.isin(step_a[rows_h[hit]], sorted(first)),
                    "in a warm-up step (first of a profiling cycle, or compiling)", left)
        hit = _drop(hit, inside[rows_h[hit]], "inside a data-loader fetch or a compile", left)
        gc = a + np.flatnonzero(is_gc[a:b])
        if len(gc) and len(hit):
            ga, gb = start[gc], end[gc]
            near = [bool(((ga < e) & (gb > s)).any())
                    for s, e in zip(start[rows_h[hit]].tolist(), end[rows_h[hit]].tolist(), strict=True)]
            hit = _drop(hit, near, "overlapping a Python GC event", left)
        if rank in dev_ranks and len(hit):
            ends = dev_ends.get(rank, np.zeros(0, dtype=np.int64))
            e = end[rows_h[hit]]
            p = np.searchsorted(ends, e, side="right")
            last = np.where(p > 0, ends[np.clip(p - 1, 0, None)] if len(ends) else 0, np.iinfo(np.int64).min)
            released = (p > 0) & (last >= e - int(release_us * 1000))
            sync = np.asarray([_is_sync(names["name"][x]) for x in name[rows_h[hit]].tolist()], dtype=bool) | released
            hit = _drop(hit, sync, "possibly waiting for the device", left)
        if len(hit):
            busy = []
            by_pid: dict[int, np.ndarray] = {}  # the rank's events of each process
            for x, xs in zip(rows_h[hit].tolist(), exc_h[hit].tolist(), strict=True):
                pc = int(pid[x])
                if pc not in by_pid:
                    by_pid[pc] = a + np.flatnonzero(pid[a:b] == pc)
                o = by_pid[pc]
                o = o[tid[o] != tid[x]]
                busy.append(_covered(start[o], end[o], int(start[x]), int(end[x])) >= 0.5 * float(xs))
            hit = _drop(hit, busy, "another thread of the process ran meanwhile (a lock or hand-off)", left)
        if len(hit) and not (kind[rows_h[hit]] == host_op).any():
            left["in Python code or user ranges only (no operator stalled: could be unrecorded GC or the "
                 "code's own work)"] = len(hit)
            hit = hit[0:0]
        h = rows_h[hit]

        calls = pd.DataFrame({
            "step": step_a[h], **{c: _texts(names[c], ev[c][h]) for c in ("pid", "tid", "kind", "name", "shapes")}, "start_ns": start[h], "dur_ns": dur[h],
            "own_ns": own[h], "typ_ns": typ_h[hit], "excess_ns": exc_h[hit]})
        out[rank] = Stalls(rank, calls.sort_values("start_ns").reset_index(drop=True), left, judged_steps)
    return out
