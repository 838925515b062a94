"""Step-time breakdown by union of intervals (Hermes §4.2.1, inter-operator analysis).

Every (rank, step) window is cut into elementary segments at every event boundary; each
segment gets exactly one class, so the five classes add up to the window:

Ranks with device events (GPU / NPU traces):

* **overlapped** – device computation and device communication both running;
* **compute_only** – device computation (kernels, memcpy, memset) without communication;
* **comm_only** – device communication (NCCL/RCCL/HCCL kernels and tasks) without computation;
* **host_only** – the device idle while a host thread runs an operator, a runtime call, a sync
  wait, data loading or a host-side collective (step markers, annotations and Python-function
  frames alone do not count: they only enclose other work);
* **free** – nothing of the above.

Ranks without any device event (CPU-only traces, e.g. ``activities=[CPU]`` or gloo training):
the host *is* the compute device, so

* **compute** is host operators (``aten::*`` …), **comm** is host collectives (``gloo:*``,
  ``c10d::*``, ``record_param_comms``), and **overlapped** is both at once (a collective on one
  thread while operators run on another, or an operator enclosing a collective);
* **host_only** is data loading (``enumerate(DataLoader)#…``, which takes precedence over the
  operators it runs, such as ``collate``'s ``aten::stack``), sync and other host activity that is
  not an operator;
* **free** is time when no operator runs (Python between operators, sleeps).

Extra columns: ``kernel_us`` (device compute kernels only, HTA's "compute"), ``memory_us``
(memcpy/memset), ``dataloader_us``, ``overlap_ratio`` = overlapped / comm (share of
communication hidden under computation; null without communication).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from advisor.schema import DEVICE_BUSY_KINDS, HOST_BUSY_KINDS
from advisor.stages import vendor_basis

CLASSES = ("compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")

NS_COLUMNS = ("step_ns", "overlapped_ns", "compute_only_ns", "comm_only_ns", "host_only_ns", "free_ns",
              "kernel_ns", "memory_ns", "dataloader_ns", "host_busy_ns")

# The events that take part, as (device, kind) pairs; SQL numbers them, numpy does the rest.
_PAIRS = [(True, k) for k in DEVICE_BUSY_KINDS] + [(False, k) for k in HOST_BUSY_KINDS]
_C, _M, _H, _D, _K, _Y = 1, 2, 4, 8, 16, 32  # compute, comm, host busy, dataloader, kernel, memcpy/memset


def _bits(dev: bool, device: bool, kind: str) -> int:
    """Class bits of one event on a rank with (``dev``) or without device events."""
    if dev:
        c = device and kind in DEVICE_BUSY_KINDS and kind != "comm"
        m = device and kind == "comm"
    else:
        c = not device and kind == "host_op"
        m = not device and kind == "comm"
    h = not device and kind in HOST_BUSY_KINDS
    d = not device and kind == "dataloader"
    k = device and kind == "kernel"
    y = device and kind in ("memcpy", "memset")
    return _C * c + _M * m + _H * h + _D * d + _K * k + _Y * y


def _state_columns(dev: bool) -> np.ndarray:
    """64 x len(NS_COLUMNS) 0/1 matrix: the output columns a state (set of active classes) adds to."""
    out = np.zeros((64, len(NS_COLUMNS)), dtype=np.int64)
    for b in range(64):
        c, m, h, d, k, y = (bool(b & x) for x in (_C, _M, _H, _D, _K, _Y))
        quiet = not c and not m
        out[b] = [
            True,  # step
            c and m and (dev or not d),  # overlapped
            c and not m and (dev or not d),  # compute only
            m and not c and (dev or not d),  # comm only
            (quiet and (h or d)) or (not dev and d),  # host only
            quiet and not h and not d,  # free
            k,  # kernel
            y,  # memory
            d,  # dataloader
            h or d,  # host busy
        ]
    return out


# _BITS[has a ranks row with device events, has one without, pair] -> class bits (a rank listed
# twice in ``ranks`` counts under both flags, as a join would)
_BITS = np.array(
    [[[(_bits(True, dv, k) if with_dev else 0) | (_bits(False, dv, k) if with_host else 0) for dv, k in _PAIRS]
      for with_host in (False, True)] for with_dev in (False, True)],
    dtype=np.uint8,
)
# _STEP[class][bits, +64 at an interval's end] -> that class's counter change at a bound
_STEP = np.array([[sign * (b >> j & 1) for sign in (1, -1) for b in range(64)] for j in range(6)], dtype=np.int8)
# _STEP2[p][change]: classes 2p and 2p + 1 in one int64 (2p + 1 in the high 32 bits), so that one
# running sum gives both counters (32 ranks x 10 MB: the stage 0.20 -> 0.15 s). Exact while no
# counter reaches 2^31: a low counter that dips below zero (an end before a start at one time, in
# the general sort) borrows from the high one as integer arithmetic does, and is read back
# sign-extended, the high one after it is taken away.
_STEP2 = _STEP[0::2].astype(np.int64) + (_STEP[1::2].astype(np.int64) << 32)
_COLS_DEV = _state_columns(True)
_COLS_HOST = _state_columns(False)

_PAIRS_SQL = ", ".join(f"({dv}, '{k}', {i})" for i, (dv, k) in enumerate(_PAIRS))
_EVENTS_SQL = f"""
SELECT e.rank, e.start_ns AS s, e.start_ns + e.dur_ns AS e, p.pair
FROM events e JOIN (VALUES {_PAIRS_SQL}) p(device, kind, pair) ON e.device = p.device AND e.kind = p.kind
WHERE e.dur_ns > 0
"""


def compute(con: Any, windows: str | None = None) -> pd.DataFrame:
    """Breakdown per (rank, step) in µs.

    ``windows`` optionally names a table/view with the same columns as ``steps`` (rank, step,
    start_ns, end_ns) to break down other windows (tests use it to match a peer's window).

    One sweep per rank: every event start and end and every window bound, sorted once (numpy);
    the six class counters are running sums over them, and each elementary segment goes to the
    window with the latest start at or before it, if it starts before that window's end.
    """
    cur = con.cursor()
    win = cur.execute(f"SELECT rank, step, start_ns, end_ns FROM {windows or 'steps'}").fetchnumpy()
    ranks = cur.execute("SELECT rank, coalesce(has_device, false) AS dev FROM ranks").fetchnumpy()
    ev = cur.execute(_EVENTS_SQL).fetchnumpy()
    return vendor_basis.apply(cur, _frame(_sweep(win, ranks, ev)))  # ranks without a timeline


def _col(d: dict[str, Any], name: str) -> tuple[np.ndarray, np.ndarray]:
    """A fetched column as (values, not NULL); DuckDB returns a column with NULLs masked."""
    a = d[name]
    if isinstance(a, np.ma.MaskedArray):
        return np.ma.getdata(a.filled(0)), ~np.ma.getmaskarray(a)
    a = np.asarray(a)
    return a, np.ones(len(a), dtype=bool)


def _sweep(win: dict[str, Any], ranks: dict[str, Any], ev: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-window sums (ns) of every output column, with ``rank`` and ``step``.

    Follows the SQL it replaced, NULLs included: a bound with a NULL time takes no part, a
    window with a NULL start is never found, one with a NULL end holds nothing.
    """
    w_rank, w_ok = _col(win, "rank")
    w_step, w_step_ok = _col(win, "step")
    w_start, w_start_ok = _col(win, "start_ns")
    w_end, w_end_ok = _col(win, "end_ns")
    w_rank, w_step, w_step_ok, w_start, w_start_ok, w_end, w_end_ok = (
        a[w_ok] for a in (w_rank, w_step, w_step_ok, w_start, w_start_ok, w_end, w_end_ok))
    uranks = np.unique(w_rank)
    w_ridx = np.searchsorted(uranks, w_rank)
    n_dev, n_host = _multiplicity(uranks, ranks)

    # the windows that can be found, in (rank, start) order
    tw = np.flatnonzero(w_start_ok)
    tw = tw[np.lexsort((w_step[tw], w_start[tw], w_ridx[tw]))]  # equal starts: the later step wins
    t_ridx = w_ridx[tw]
    t_end = np.where(w_end_ok[tw], w_end[tw], np.iinfo(np.int64).min)
    we = np.flatnonzero(w_end_ok)

    e_rank, e_rank_ok = _col(ev, "rank")
    e_s, e_s_ok = _col(ev, "s")
    e_e, e_e_ok = _col(ev, "e")
    e_ridx = np.searchsorted(uranks, e_rank)
    keep = e_rank_ok & e_s_ok & e_e_ok & (e_ridx < len(uranks))
    keep[keep] = uranks[e_ridx[keep]] == e_rank[keep]
    everything = bool(keep.all())  # the usual case: no copies of the event columns
    e_ridx = e_ridx if everything else e_ridx[keep]
    bits = _BITS[(n_dev[e_ridx] > 0).astype(np.intp), (n_host[e_ridx] > 0).astype(np.intp),
                 np.asarray(ev["pair"], dtype=np.intp) if everything else np.asarray(ev["pair"], dtype=np.intp)[keep]]
    e_ridx = e_ridx.astype(np.int32)
    e_s, e_e = (e_s, e_e) if everything else (e_s[keep], e_e[keep])

    n_ws, n_we = len(tw), len(we)
    if n_ws == 0:
        return _empty_sums()
    t = np.concatenate([w_start[tw], w_end[we], e_s, e_e])
    del e_s, e_e
    ridx = np.concatenate([t_ridx.astype(np.int32), w_ridx[we].astype(np.int32), e_ridx, e_ridx])
    change = np.concatenate([np.zeros(n_ws + n_we, np.uint8), bits, bits | 64])
    t, rank_begin, starts, change = _sorted(t, ridx, len(uranks), n_ws, change)
    del ridx
    # the classes active after each bound (positive running counters), as a 6-bit state
    combo = _active_classes(change)
    del change
    # The k-th window start met is window tw[k]; the bounds from it to the next window start have
    # it as the window with the latest start at or before them (as an ASOF join would). An
    # elementary segment runs from a bound to the next one; it counts for the window when both
    # bounds are on the window's rank and it starts before the window ends: a run of bounds from
    # the window start, as times only grow within a rank.
    per_state = np.zeros((n_ws, 64), np.int64)
    found = np.zeros(n_ws, bool)
    nxt = np.append(starts[1:], len(t))
    last = rank_begin[t_ridx + 1] - 1  # a rank's last bound starts no segment
    for k in range(n_ws):
        a = int(starts[k])
        hi = min(int(nxt[k]), int(last[k]))
        if hi <= a:
            continue
        b = a + int(np.searchsorted(t[a:hi], t_end[k]))
        if b == a:
            continue
        found[k] = True
        length = np.diff(t[a:b + 1])
        state = combo[a:b]
        if int(t[b]) - int(t[a]) < 2**53:  # float sums of integers stay exact
            per_state[k] = np.bincount(state, weights=length, minlength=64)
        else:
            per_state[k] = (np.bincount(state, weights=length & ((1 << 26) - 1), minlength=64).astype(np.int64)
                            + (np.bincount(state, weights=length >> 26, minlength=64).astype(np.int64) << 26))
    mult_dev, mult_host = n_dev[t_ridx], n_host[t_ridx]
    found = np.flatnonzero(found & (mult_dev + mult_host > 0))
    sums = (mult_dev[found, None] * (per_state[found] @ _COLS_DEV)
            + mult_host[found, None] * (per_state[found] @ _COLS_HOST))
    out = {col: sums[:, i] for i, col in enumerate(NS_COLUMNS)}
    out["rank"] = w_rank[tw[found]].astype(np.int64)
    out["step"] = np.where(w_step_ok[tw[found]], w_step[tw[found]], np.nan)
    return out


_PAIRED_MAX = 1 << 31  # bounds from which a counter could reach 2^31


def _active_classes(change: np.ndarray) -> np.ndarray:
    """The classes active after each bound (positive running counters) as a 6-bit state: two
    classes' counters per int64 running sum (:data:`_STEP2`), exact while a counter cannot reach
    2^31 (fewer bounds than that); one int32 sum per class beyond."""
    combo = np.zeros(len(change), np.uint8)
    if len(change) >= _PAIRED_MAX:
        count = np.empty(len(change), np.int64)
        for j in range(6):
            np.cumsum(_STEP[j][change], dtype=np.int64, out=count)
            combo |= (count > 0).view(np.uint8) << j
        return combo
    both = np.empty(len(change), np.int64)
    low = np.empty(len(change), np.int64)
    for j in range(3):
        np.cumsum(_STEP2[j][change], out=both)
        np.left_shift(both, 32, out=low)
        low >>= 32  # the low counter, sign-extended
        combo |= (low > 0).view(np.uint8) << (2 * j)
        both -= low
        both >>= 32  # the high counter
        combo |= (both > 0).view(np.uint8) << (2 * j + 1)
    return combo


def _multiplicity(uranks: np.ndarray, ranks: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """How many ``ranks`` rows each rank has, with and without device events."""
    r_rank, r_ok = _col(ranks, "rank")
    r_dev = np.asarray(np.ma.getdata(ranks["dev"]), dtype=bool)[r_ok]
    r_rank = r_rank[r_ok]
    pos = np.searchsorted(uranks, r_rank)
    hit = pos < len(uranks)
    hit[hit] = uranks[pos[hit]] == r_rank[hit]
    n_dev = np.bincount(pos[hit & r_dev], minlength=len(uranks)).astype(np.int64)
    n_host = np.bincount(pos[hit & ~r_dev], minlength=len(uranks)).astype(np.int64)
    return n_dev, n_host


def _sorted(t: np.ndarray, ridx: np.ndarray, n_ranks: int, n_starts: int,
            change: np.ndarray) -> tuple[np.ndarray, ...]:
    """Bounds by (rank, time), the first ``n_starts`` (window starts) first among equal times.

    Returns the sorted times, where each rank's bounds begin (``n_ranks + 1`` positions), the
    sorted positions of the window starts and the sorted ``change``. (rank, time, window-start
    flag, change) packed in one int64 key and sorted by value (no argsort and gathers; a stable
    sort, timsort, takes the long sorted runs the bounds come in: 32 ranks x 10 MB 0.19 -> 0.05 s);
    timestamps too far apart for that key fall back to a lexsort. Among equal times the window
    starts come first, then the other bounds by ``change`` (starts before ends); their order among
    equal times changes no sum, as their segments have no length.
    """
    t0 = int(t.min())
    tbits = (int(t.max()) - t0).bit_length()
    if int(ridx.max()).bit_length() + tbits + 1 + _CHANGE_BITS > 62:
        late = np.ones(len(t), np.int8)
        late[:n_starts] = 0
        order = np.lexsort((late, t, ridx))
        begin = np.searchsorted(ridx[order], np.arange(n_ranks + 1))
        return t[order], begin, np.flatnonzero(order < n_starts), change[order]
    key = t  # reused in place: the caller passes an array of its own
    key -= t0
    key <<= 1
    key[n_starts:] |= 1
    key <<= _CHANGE_BITS
    key |= change
    rank_bits = ridx.astype(np.int64)
    rank_bits <<= tbits + 1 + _CHANGE_BITS
    key |= rank_bits
    del ridx, rank_bits
    key.sort(kind="stable")
    change = (key & ((1 << _CHANGE_BITS) - 1)).astype(np.uint8)
    key >>= _CHANGE_BITS
    starts = np.flatnonzero((key & 1) == 0)
    begin = np.searchsorted(key, np.arange(n_ranks + 1, dtype=np.int64) << (tbits + 1))
    key >>= 1
    key &= (1 << tbits) - 1
    key += t0
    return key, begin, starts, change


_CHANGE_BITS = 7  # a bound's ``change``: 6 class bits, +64 at an interval's end


def _empty_sums() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {col: np.zeros(0, np.int64) for col in NS_COLUMNS}
    out["rank"] = np.zeros(0, np.int64)
    out["step"] = np.zeros(0, np.float64)
    return out


def _frame(sums: dict[str, np.ndarray]) -> pd.DataFrame:
    """The breakdown: one row per (rank, step) in rank and step order, µs columns."""
    step = np.asarray(sums["step"])
    if np.isnan(step).any() or not all(np.asarray(sums[c]).dtype.kind in "iu" for c in NS_COLUMNS):
        return _frame_grouped(sums)  # a window without a step id: as pandas says of it
    rank = np.asarray(sums["rank"], dtype=np.int64)
    order = np.lexsort((step, rank))  # (rank, step) order, as a sorted groupby gives
    rank, step = rank[order], step[order]
    first = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])]) if len(order) else order
    out: dict[str, np.ndarray] = {"rank": rank[first], "step": step[first].astype(np.int64)}
    for c in NS_COLUMNS:
        col = np.asarray(sums[c], dtype=np.int64)[order]
        total = np.add.reduceat(col, first) if len(first) else col  # integer sums: exact in any order
        out[c[:-3] + "_us"] = total.astype(np.float64) / 1000.0
    out["compute_us"] = out["compute_only_us"] + out["overlapped_us"]
    comm = out["comm_us"] = out["comm_only_us"] + out["overlapped_us"]
    ratio = np.full(len(comm), np.nan)
    np.divide(out["overlapped_us"], comm, out=ratio, where=comm > 0)
    out["overlap_ratio"] = ratio
    return pd.DataFrame(out)


def _frame_grouped(sums: dict[str, np.ndarray]) -> pd.DataFrame:
    """:func:`_frame` by a pandas groupby (NULL step ids)."""
    df = pd.DataFrame({"rank": sums["rank"], "step": sums["step"], **{c: sums[c] for c in NS_COLUMNS}})
    df = df.groupby(["rank", "step"], sort=True, dropna=False, as_index=False).sum()
    out = pd.DataFrame({"rank": df["rank"].astype(int), "step": df["step"].astype(int)})
    for c in NS_COLUMNS:
        out[c[:-3] + "_us"] = df[c].astype("float64") / 1000.0
    out["compute_us"] = out["compute_only_us"] + out["overlapped_us"]
    out["comm_us"] = out["comm_only_us"] + out["overlapped_us"]
    out["overlap_ratio"] = (out["overlapped_us"] / out["comm_us"]).where(out["comm_us"] > 0)
    return out


def store(con: Any, df: pd.DataFrame) -> None:
    """Keep the breakdown as table ``breakdown`` (µs columns) so rules can join it in SQL."""
    _breakdown_df = df  # read by name by DuckDB's scan of Python objects (no view to register and drop)
    con.cursor().execute("CREATE OR REPLACE TABLE breakdown AS SELECT * FROM _breakdown_df")


#: Largest gap, as a share of the vendor's Stage, between a figure here and the vendor's own.
VENDOR_TOLERANCE = 0.02

_VENDOR_SQL = """
SELECT v.rank, v.step, v.computing_ns, v.comm_not_overlapped_ns, v.overlapped_ns,
       coalesce(NULLIF(v.stage_ns, 0), v.computing_ns + v.comm_not_overlapped_ns + v.free_ns) AS stage_ns,
       r.form
FROM vendor_steps v
LEFT JOIN (SELECT rank, max(value) AS form FROM meta WHERE key = 'ascend.form' GROUP BY rank) r USING (rank)
ORDER BY v.rank, v.step
"""


def vendor_check(con: Any, df: pd.DataFrame | None) -> list[tuple[str, str]]:
    """Compare the breakdown with the exporter's own step table (Ascend ``step_trace_time.csv`` /
    ``analysis.db`` ``StepTraceTime``, canonical ``vendor_steps``), rank by rank and step by step.

    compute_only + overlapped is compared with Computing, comm_only with Communication(Not
    Overlapped), overlapped with Overlapped. A gap above :data:`VENDOR_TOLERANCE` of the
    vendor's Stage gives a warning naming both figures; steps are matched by id, and ids that
    do not match are reported, not paired by guess. Returns (code, message) pairs.
    """
    try:
        rows = con.cursor().execute(_VENDOR_SQL).fetchall()
    except Exception:  # noqa: BLE001 - no vendor_steps / meta table: nothing to compare
        return []
    if not rows or df is None:
        return []
    cols = ("compute_only_us", "overlapped_us", "comm_only_us")
    values = [df[c].to_numpy(dtype=np.float64) for c in cols]
    ours: dict[tuple[int, int], tuple[float, float, float]] = {
        (int(rk), int(st)): (float(values[0][i]), float(values[1][i]), float(values[2][i]))
        for i, (rk, st) in enumerate(zip(df["rank"].to_numpy(), df["step"].to_numpy(), strict=True))
    }
    out: list[tuple[str, str]] = []
    unmatched: dict[int, tuple[list[int], list[int]]] = {}
    for rank, step, computing, cno, ov, stage, form in rows:
        table = "analysis.db StepTraceTime" if form == "db" else "step_trace_time.csv"
        b = ours.get((int(rank), int(step)))
        if b is None and not any(rk == rank for rk, _ in ours):
            continue  # a rank without any breakdown is reported where it was skipped
        if b is None:
            theirs = sorted(int(s) for (rk, s) in ours if rk == rank)
            unmatched.setdefault(int(rank), (theirs, []))[1].append(int(step))
            continue
        if not stage or stage <= 0:
            continue
        compute_only, overlapped, comm_only = b
        pairs = (
            ("compute_only + overlapped", compute_only + overlapped, "Computing", computing),
            ("comm_only", comm_only, "Communication(Not Overlapped)", cno),
            ("overlapped", overlapped, "Overlapped", ov),
        )
        for ours_name, value, vendor_name, vendor_ns in pairs:
            if vendor_ns is None:
                continue
            vendor_us = vendor_ns / 1000.0
            gap = abs(value - vendor_us) / (stage / 1000.0)
            if gap > VENDOR_TOLERANCE:
                out.append((
                    "vendor_mismatch",
                    (f"rank {rank} step {step}: {ours_name} {value:.1f} µs here, {vendor_name} {vendor_us:.1f} µs "
                     f"in the export's {table} ({gap:.1%} of its Stage {stage / 1000.0:.1f} µs apart)"),
                ))
    for rank, (have, vendor) in sorted(unmatched.items()):
        out.append((
            "vendor_steps_unmatched",
            (f"rank {rank}: the export's step table lists step(s) {', '.join(map(str, sorted(vendor)[:10]))} that "
             f"the breakdown does not have (its steps: {', '.join(map(str, have[:10])) or 'none'}); not compared"),
        ))
    return out
