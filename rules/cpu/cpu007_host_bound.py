"""The device idles while the host is busy: the host, not the device, sets the step time.

## Why it matters
An accelerator only computes what the host has queued. When the host spends longer issuing work
than the device spends running it (Python and framework overhead per operator, eager decoding of
tiny kernels, one launch call per kernel) or stops to wait (a blocking copy, ``cudaFree`` /
``hipFree`` calls of a caching allocator that has to return memory, an explicit synchronize),
the device runs dry and idles, in gaps of any length. A device busy 14 % of the step is limited
by its host whatever the kernels do; tuning kernels then saves nothing.

## How it is detected
Per step of each rank with device events: the device busy time is the union of its kernels,
copies, memsets and communication; the idle time is the rest of the step window. During each
idle instant, what the threads that drive the device (those whose runtime calls launch its tasks)
are doing is read from their innermost event: a sync call (``*Synchronize``, blocking copies such
as ``cudaMemcpy`` / ROCm's ``hipMemcpyWithStream``), an allocator call (``cudaMalloc`` /
``cudaFree``, ``hip*``), another runtime call (kernel launches), framework operators or Python
(overhead), data loading (left to IO001), or nothing recorded. It fires when the device idles at
least ``min_idle_share`` of the step (median over steps) and the host work above, data loading
excluded, covers at least ``min_host_share`` of the step. The cause is the host-device sync when
sync calls explain most of that idle time, else operator dispatch. Saving: the median per-step
idle time the host work covers (at most the step); an upper bound, as the host work itself
remains and only the device's wait for it can go.

Where the what-if replay of the steps reproduces every step, the saving is the replayed one instead,
with the fix of the main reason as the change on the driving threads (and those feeding them through
a task queue, torch_npu's Python and autograd threads): framework and Python bound,
the framework's and Python's own time removed (the launch calls, syncs and data loading nested in it
kept); launch bound, the launch calls' own time removed too (one graph launch issues the step);
allocator bound, the allocator calls removed with their waits. A sync-bound finding is not replayed:
its idle lies inside the sync calls, which therefore waited for nothing the trace records on the
device, and the finding says so.

## What to do
Launch-bound (many kernels under ``short_kernel_us``, most idle in launches, framework or Python):
capture the step in a CUDA / HIP graph or use ``torch.compile`` (mode ``reduce-overhead``), fuse
operators, run larger batches so each kernel does more work. Sync-bound: remove the blocking copy
or read (``non_blocking=True`` into pinned memory, keep values on the device). Allocator-bound:
stop the allocator from returning memory (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
fewer distinct tensor sizes, no ``torch.cuda.empty_cache()`` in the loop).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from advisor.engine.derived import IntervalIndex
from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.kinds import EdgeKind
from advisor.model import Finding
from rules.cpu._common import fmt_ms, skip_device_gaps, step_table


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU007."""

    min_idle_share: float = knob(0.25, "median share of the step the device idles that fires the rule",
                                 "first principles: a device idle a quarter of the step is not kept fed")
    min_host_share: float = knob(0.10, "median share of the step the device idles while the host works (data loading "
                                       "excluded) that fires the rule",
                                 "CAUSES.md: 10 % of the step is the 'high' severity cut")
    short_kernel_us: float = knob(10.0, "a device kernel shorter than this finishes faster than a typical launch",
                                  "CUDA / ROCm launch calls take about 5-10 µs of host time each")
    top_n: int = knob(5, "host calls listed that the device waited on longest", "presentation")


# what a driving thread is doing, by its innermost event; lower codes win where two threads differ
SYNC, ALLOC, DATA, LAUNCH, FRAMEWORK = 0, 1, 2, 3, 4
CLASS_NAMES = {SYNC: "sync", ALLOC: "allocator", DATA: "data_loading", LAUNCH: "launch", FRAMEWORK: "framework_python"}
HOST_WORK = (SYNC, ALLOC, LAUNCH, FRAMEWORK)  # the classes whose time the device waits on the host for
ALLOC_RE = r"^(cuda|hip)(Malloc|Free|MallocHost|FreeHost|HostAlloc|HostFree)$|^cuMem(Alloc|Free)(_v2)?$"

#: the host event kinds whose own time is framework and Python work (not launches, syncs, data loading or
#: communication calls)
FRAMEWORK_KINDS = ("host_op", "python", "other")


#: why a sync-bound finding is not replayed: its idle lies inside the sync calls
SYNC_NOT_REPLAYED = ("the device idled while the host was inside its sync calls, so they waited for nothing the trace "
                     "records on the device (work launched before the trace, another stream's event, a copy staged "
                     "on the host): what not waiting would give cannot be replayed")


def counterfactual(main: str, tids: tuple[str, ...]) -> tuple[tuple[Change, ...], str]:
    """The fix of the main reason as a replay change on the driving threads ``tids``, and its assumption.

    Framework-bound: the framework's and Python's own time on those threads is gone (CUDA graphs,
    ``torch.compile``: the host issues the step's work without running the model's Python), the launch calls,
    syncs and data loading nested in it kept. Launch-bound: the launch calls' own time goes too (a graph
    issues the step's kernels in one launch). Allocator-bound: the allocator calls take no time and wait for
    nothing. (Sync-bound is not replayed: :data:`SYNC_NOT_REPLAYED`.)"""
    if main == "allocator":
        alloc = Select(kinds=("runtime",), name_re=ALLOC_RE, device=False, tids=tids)
        return ((Change("remove", alloc), Change("drop_edges", alloc, edge=EdgeKind.SYNC_WAIT)),
                "if the allocator calls took no time and waited for nothing (memory kept by the caching allocator)")
    own = Select(kinds=FRAMEWORK_KINDS, device=False, tids=tids, exclusive=True, not_inside=("dataloader",))
    if main == "launch":
        calls = Select(kinds=("runtime",), not_name_re=ALLOC_RE, device=False, tids=tids, exclusive=True,
                       not_inside=("dataloader",))
        return ((Change("remove", own), Change("remove", calls)),
                ("if the threads driving the device spent no time launching and in framework and Python work "
                "(syncs and data loading kept), as when CUDA graphs or graph mode issue the step's work at once"))
    return ((Change("remove", own),),
            ("if the framework and Python work of the threads driving the device took no time between launches "
            "(the launch calls, syncs and data loading kept), as with CUDA graphs or torch.compile"))


# the busy time of a window [a, b) is busy(b) - busy(a), busy(t) the rank's device busy time before t: that of
# the periods before the last one starting at or before t, plus what of that one lies before t; a window with
# no device busy time in it counts as not idle
RANKS_SQL = """
WITH win AS (SELECT s.rank, s.step, s.start_ns, s.end_ns FROM steps s JOIN breakdown b USING (rank, step)
             WHERE s.end_ns > s.start_ns),
busy AS (
    SELECT w.rank, w.start_ns, w.end_ns, coalesce(de.before + least(w.end_ns, de.e) - de.s, 0)
                                         - coalesce(ds.before + least(w.start_ns, ds.e) - ds.s, 0) AS busy_ns
    FROM win w ASOF LEFT JOIN device_busy de ON de.rank = w.rank AND w.end_ns >= de.s
               ASOF LEFT JOIN device_busy ds ON ds.rank = w.rank AND w.start_ns >= ds.s
)
SELECT rank, median(CASE WHEN busy_ns = 0 THEN 0.0 ELSE (end_ns - start_ns - busy_ns) / (end_ns - start_ns) END)
       AS idle_share
FROM busy GROUP BY rank
"""

STEPS_SQL = """
SELECT rank, step, start_ns, end_ns FROM steps
WHERE rank IN (SELECT unnest($ranks)) AND end_ns > start_ns ORDER BY rank, start_ns, step
"""

BUSY_SQL = "SELECT rank, s, e FROM device_busy WHERE rank IN (SELECT unnest($ranks)) ORDER BY rank, s"

# the host events of the threads that drive the device (those launching device tasks, else those making runtime
# calls, else all), per rank, inside the rank's window [lo, hi); Python frames (with_stack traces hold tens of
# thousands, nested deep) only as their union per thread, named "Python"; the rows come unordered.
# calls and sel are inlined in each query reading them (NOT MATERIALIZED), which filters them further, rather
# than held whole (a big rank's host events with their names) while the query runs.
HOST_SQL = """
WITH win AS (SELECT unnest($ranks) AS rank, unnest($los) AS lo, unnest($his) AS hi),
calls AS NOT MATERIALIZED (
    SELECT rank, tid, corr FROM events
    WHERE rank IN (SELECT rank FROM win) AND NOT device AND kind IN ('runtime', 'sync')
),
launchers AS (  -- threads whose runtime calls launched device tasks (a thread that only queries the device is not one)
    SELECT DISTINCT c.rank, c.tid FROM calls c SEMI JOIN (
        SELECT rank, corr FROM events WHERE rank IN (SELECT rank FROM win) AND device AND corr IS NOT NULL
    ) d ON d.rank = c.rank AND d.corr = c.corr
),
drivers AS (
    SELECT rank, tid FROM launchers
    UNION SELECT DISTINCT rank, tid FROM calls WHERE rank NOT IN (SELECT rank FROM launchers)
),
sel AS NOT MATERIALIZED (
    SELECT e.rank, e.tid, e.kind, e.name, e.start_ns AS s, e.start_ns + e.dur_ns AS e FROM events e JOIN win w USING (rank)
    WHERE NOT e.device AND e.dur_ns > 0 AND e.start_ns < w.hi AND e.start_ns + e.dur_ns > w.lo
      AND e.kind IN ('sync', 'runtime', 'dataloader', 'host_op', 'python', 'comm', 'queue', 'other')
      AND (e.tid IN (SELECT d.tid FROM drivers d WHERE d.rank = e.rank) OR e.rank NOT IN (SELECT rank FROM drivers))
),
py AS (
    SELECT rank, tid, s, e, max(e) OVER (PARTITION BY rank, tid ORDER BY s, e DESC
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM sel WHERE kind = 'python'
),
py_isl AS (
    SELECT rank, tid, min(s) AS s, max(e) AS e FROM (
        SELECT rank, tid, s, e, sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
                                OVER (PARTITION BY rank, tid ORDER BY s, e DESC ROWS UNBOUNDED PRECEDING) AS isl
        FROM py
    ) GROUP BY rank, tid, isl
),
host AS (
    SELECT rank, tid, s, e, name,
           CASE WHEN kind = 'sync' THEN 0
                WHEN kind = 'runtime' AND regexp_matches(name, $alloc_re) THEN 1
                WHEN kind = 'dataloader' THEN 2
                WHEN kind = 'runtime' THEN 3
                ELSE 4 END AS cls
    FROM sel WHERE kind <> 'python'
    UNION ALL
    SELECT rank, tid, s, e, 'Python' AS name, 4 AS cls FROM py_isl
)
SELECT rank, tid, s, e, cls, name FROM host
"""

# threads that feed a task queue the launching thread drains (torch_npu: the Python and autograd threads enqueue,
# the task-queue thread dequeues and launches): they drive the device through it
ENQUEUERS_SQL = """
SELECT DISTINCT tid FROM events
WHERE rank = $rank AND NOT device AND kind = 'queue' AND starts_with(name, 'Enqueue') AND tid IS NOT NULL
"""

KERNEL_SQL = """
SELECT rank, step, count(*) AS n, count(*) FILTER (WHERE dur_ns < $short_kernel_us * 1000) AS n_short
FROM events WHERE rank IN (SELECT unnest($ranks)) AND device AND kind = 'kernel' AND step IS NOT NULL
GROUP BY rank, step
"""


@rule("CPU007", "cpu.host-bound", cause="cpu.operator_dispatch", causes=("cpu.host_device_sync",),
      requires=("events", "steps", "breakdown"), thresholds=Thresholds, derived=("device_busy",))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose device waits on its host for a large part of the step."""
    dev_ranks = ctx.device_ranks - skip_device_gaps(ctx, ctx.device_ranks)
    if not dev_ranks:
        return
    bd = step_table(ctx)
    candidates = sorted(int(r["rank"]) for r in ctx.query(RANKS_SQL)
                        if int(r["rank"]) in dev_ranks and r["idle_share"] is not None
                        and float(r["idle_share"]) >= ctx.t.min_idle_share)
    if not candidates:
        return
    # the analysed steps of every candidate rank (those of the breakdown), then one query per table for them all
    kept = set(zip(bd["rank"].astype(int), bd["step"].astype(int), strict=True))
    st = ctx.arrays(STEPS_SQL, {"ranks": candidates})
    keep = np.array([(int(r), int(s)) in kept for r, s in zip(st["rank"], st["step"], strict=True)], dtype=bool)
    st = {k: v[keep] for k, v in st.items()}
    ranks = [r for r in candidates if bool((st["rank"] == r).any())]
    if not ranks:
        return
    los = [int(st["start_ns"][st["rank"] == r].min()) for r in ranks]
    his = [int(st["end_ns"][st["rank"] == r].max()) for r in ranks]
    busy = ctx.arrays(BUSY_SQL, {"ranks": ranks})
    host = ctx.arrays(HOST_SQL, {"ranks": ranks, "los": los, "his": his, "alloc_re": ALLOC_RE}, codes=("tid", "name"))
    kern = ctx.arrays(KERNEL_SQL, {"ranks": ranks})
    names = ["(unnamed)" if nm is None else str(nm) for nm in host.names["name"]]
    tid_names = [str(t) for t in host.names["tid"]]
    for rank, lo, hi, rank_host in zip(ranks, los, his, _split(host, ranks), strict=True):
        finding = _rank(ctx, rank, lo, hi, _of(st, rank), _of(busy, rank), rank_host, _of(kern, rank), names,
                        tid_names)
        if finding is not None:
            yield finding


def _of(cols: Mapping[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
    """The rows of one rank (the columns themselves when all rows are)."""
    sel = cols["rank"] == rank
    if bool(sel.all()):
        return dict(cols)
    return {k: v[sel] for k, v in cols.items()}


def _split(cols: dict[str, np.ndarray], ranks: list[int]) -> Iterator[dict[str, np.ndarray]]:
    """The rows of each rank in turn, ``cols`` emptied once the last is taken (a big rank's host
    events are then held only by the rank's own columns, which :func:`_rank` drops once sorted)."""
    for i, rank in enumerate(ranks):
        part = _of(cols, rank)
        if i == len(ranks) - 1:
            cols.clear()
        yield part


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint union of intervals, sorted by start."""
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _idle(b_s: np.ndarray, b_e: np.ndarray, w_s: np.ndarray, w_e: np.ndarray) -> tuple[np.ndarray, ...]:
    """The idle intervals (starts, ends, step index) of the windows [w_s, w_e) given the device busy
    periods (b_s, b_e), sorted by start."""
    if len(b_s) and bool(np.all(b_s[1:] >= b_e[:-1])) and bool(np.all(b_e >= b_s)):
        # sorted disjoint periods: those of window j are the range [i0, i1); its idle candidates are
        # [a, e_0), [s_0, e_1) ... shifted: starts a, e_0 .. e_k-1 and ends s_0 .. s_k-1, b
        i0 = np.searchsorted(b_e, w_s, "right")
        i1 = np.maximum(np.searchsorted(b_s, w_e, "left"), i0)
        cnt = i1 - i0
        win = np.repeat(np.arange(len(w_s)), cnt)
        idx = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt - i0, cnt)
        cs, ce = np.clip(b_s[idx], w_s[win], w_e[win]), np.clip(b_e[idx], w_s[win], w_e[win])
        at = np.cumsum(cnt + 1) - (cnt + 1)  # where each window's candidates begin
        starts = np.empty(len(win) + len(w_s), np.int64)
        ends = np.empty(len(win) + len(w_s), np.int64)
        step = np.repeat(np.arange(len(w_s)), cnt + 1)
        inner = np.ones(len(starts), dtype=bool)
        inner[at] = False
        starts[at], starts[inner] = w_s, ce
        last = at + cnt
        outer = np.ones(len(ends), dtype=bool)
        outer[last] = False
        ends[last], ends[outer] = w_e, cs
        keep = ends > starts
        i_s, i_e, i_j = starts[keep], ends[keep], step[keep]
        order = np.argsort(i_s, kind="stable")
        return i_s[order], i_e[order], i_j[order]
    idle_s, idle_e, idle_step = [], [], []
    for j in range(len(w_s)):
        a, b = int(w_s[j]), int(w_e[j])
        sel = (b_s < b) & (b_e > a)
        s, e = np.clip(b_s[sel], a, b), np.clip(b_e[sel], a, b)
        starts = np.concatenate([[a], e])
        ends = np.concatenate([s, [b]])
        keep = ends > starts
        idle_s.append(starts[keep])
        idle_e.append(ends[keep])
        idle_step.append(np.full(int(keep.sum()), j, np.int64))
    i_s, i_e, i_j = np.concatenate(idle_s), np.concatenate(idle_e), np.concatenate(idle_step)
    order = np.argsort(i_s, kind="stable")
    return i_s[order], i_e[order], i_j[order]


SEGMENTS_AT_ONCE = 1 << 18  # elementary segments classified at a time (bounds the memory of a big rank)


def _segments(seg_s: np.ndarray, seg_e: np.ndarray, i_s: np.ndarray, i_e: np.ndarray, i_j: np.ndarray,
              index: IntervalIndex, n_threads: int, cls: np.ndarray, d_s: np.ndarray, d_e: np.ndarray,
              per: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Classify the elementary segments [seg_s, seg_e) (consecutive boundaries) that lie in an idle
    interval: add their time to ``per`` (step, class); return, for those in host work, the innermost
    event (row) of the thread that sets their class, their durations and whether that class blocks."""
    k = np.searchsorted(i_s, seg_s, "right") - 1
    in_idle = (k >= 0) & (seg_e <= i_e[np.maximum(k, 0)])
    seg_s, seg_e, seg_j = seg_s[in_idle], seg_e[in_idle], i_j[k[in_idle]]
    # each segment's innermost event on every thread (threads by row), then the thread whose event has
    # the lowest class (the first such thread on ties)
    m = len(seg_s)
    owner = index.find(np.repeat(np.arange(n_threads, dtype=np.int64), m),
                       np.tile(seg_s, n_threads)).reshape(n_threads, m)
    c = np.where(owner >= 0, cls[np.maximum(owner, 0)], 99)
    pick = np.argmin(c, axis=0)
    best = c[pick, np.arange(m)]
    who = np.where(best < 99, owner[pick, np.arange(m)], -1)
    del owner, c
    # inside a data-loading span everything but a sync or allocator call is data loading (IO001's)
    if len(d_s):
        k = np.searchsorted(d_s, seg_s, "right") - 1
        in_dl = (k >= 0) & (seg_s < d_e[np.maximum(k, 0)])
        best = np.where(in_dl & (best > ALLOC), DATA, best)
    dur = (seg_e - seg_s).astype(float)
    for code in CLASS_NAMES:
        sel = best == code
        per[:, code] += np.bincount(seg_j[sel], weights=dur[sel], minlength=per.shape[0])
    calls = np.isin(best, HOST_WORK)
    return who[calls], dur[calls], best[calls] <= ALLOC


def _rank(ctx: RuleContext[Thresholds], rank: int, lo: int, hi: int, steps: dict[str, np.ndarray],
          busy: dict[str, np.ndarray], host: dict[str, np.ndarray], kern: dict[str, np.ndarray],
          names: list[str], tid_names: list[str]) -> Finding | None:
    keep = (busy["s"] < hi) & (busy["e"] > lo)
    b_s, b_e = busy["s"][keep].astype(np.int64), busy["e"][keep].astype(np.int64)
    # threads numbered in the order of their ids (codes follow it); rows by thread, start, longer first (then
    # class and name: duplicates resolve the same way every run)
    present = np.flatnonzero(np.bincount(host["tid"]))
    n_threads = len(present)
    drivers = tuple(tid_names[int(t)] for t in present)
    thr = np.searchsorted(present, host["tid"])
    order = np.lexsort((host["name"], host["cls"], host["s"] - host["e"], host["s"], thr))
    thr, cls, name_id = thr[order], host["cls"][order].astype(np.int64), host["name"][order].astype(np.int64)
    hs, he = host["s"][order].astype(np.int64), host["e"][order].astype(np.int64)
    host.clear()  # the unsorted columns (the caller keeps none of them)
    del order
    # idle intervals of every step, then the elementary segments between any two boundaries (idle or host
    # event) inside them: one class per segment, from the innermost event of each driving thread
    w_s, w_e = steps["start_ns"].astype(np.int64), steps["end_ns"].astype(np.int64)
    step_ids = [int(x) for x in steps["step"]]
    i_s, i_e, i_j = _idle(b_s, b_e, w_s, w_e)
    n_steps = len(step_ids)
    per = np.zeros((n_steps, len(CLASS_NAMES)))
    wait: np.ndarray = np.zeros(0)  # ns the device idled while each host call / operator (by name) was the innermost one
    first = np.zeros(0, np.int64)  # the first such segment of each name (ties in wait keep that order)
    unseen = 0  # first's value for the names of no such segment
    blocking = np.zeros(0, dtype=bool)  # the names among them that are sync or allocator calls
    if len(i_s) and len(hs):
        pts = np.concatenate([i_s, i_e, hs, he])
        pts = np.sort(pts[(pts >= lo) & (pts <= hi)], kind="stable")  # sorted runs: a merge
        pts = pts[np.concatenate([[True], pts[1:] != pts[:-1]])]
        index = IntervalIndex(thr, hs, he)
        dl = np.flatnonzero(cls == DATA)
        d_s, d_e = _union(hs[dl], he[dl]) if len(dl) else (hs[:0], he[:0])
        wait = np.zeros(len(names))
        first = np.full(len(names), -1, np.int64)
        blocking = np.zeros(len(names), dtype=bool)
        # the segments in batches (each is classified on its own; the sums are of whole ns, exact in any order)
        for a in range(0, len(pts) - 1, SEGMENTS_AT_ONCE):
            b = min(a + SEGMENTS_AT_ONCE, len(pts) - 1)
            row, w, blk = _segments(pts[a:b], pts[a + 1:b + 1], i_s, i_e, i_j, index, n_threads, cls, d_s, d_e, per)
            nm = name_id[row]
            wait += np.bincount(nm, weights=w, minlength=len(names))
            blocking |= np.bincount(nm, weights=blk, minlength=len(names)) > 0
            by_name = np.argsort(nm, kind="stable")
            lead = by_name[np.flatnonzero(np.concatenate([[True], np.diff(nm[by_name]) != 0]))] if len(nm) else by_name
            new = first[nm[lead]] < 0
            first[nm[lead[new]]] = unseen + lead[new]
            unseen += len(nm)
        first[first < 0] = unseen
    idle_ns = np.bincount(i_j, weights=(i_e - i_s).astype(float), minlength=n_steps)
    step_ns = (w_e - w_s).astype(float)
    host_ns = np.minimum(per[:, list(HOST_WORK)].sum(axis=1), step_ns)
    idle_share = float(np.median(idle_ns / step_ns))
    host_share = float(np.median(host_ns / step_ns))
    if idle_share < ctx.t.min_idle_share or host_share < ctx.t.min_host_share:
        return None
    saving = float(np.median(host_ns)) / 1000.0
    step_us = float(np.median(step_ns)) / 1000.0
    n = n_steps
    by_class = {nm: round(float(per[:, code].sum()) / 1000.0 / n, 1) for code, nm in CLASS_NAMES.items()}
    untraced = round(float((idle_ns - per.sum(axis=1)).sum()) / 1000.0 / n, 1)
    work = {nm: by_class[nm] for nm in ("sync", "allocator", "launch", "framework_python")}
    main = max(work, key=lambda k: work[k])
    in_steps = np.isin(kern["step"], step_ids)
    n_k, n_short = int(kern["n"][in_steps].sum()), int(kern["n_short"][in_steps].sum())
    short_share = n_short / n_k if n_k else 0.0
    cause = "cpu.host_device_sync" if main == "sync" else "cpu.operator_dispatch"
    reason = {
        "sync": "the host blocks in sync calls (blocking copies, synchronize) while the device has nothing queued",
        "allocator": "the host blocks in allocator calls (cudaMalloc / cudaFree, hipFree) that wait for the device",
        "launch": f"the host spends the time launching kernels ({short_share:.0%} of {n_k / n:.0f} kernels per step "
                  f"run under {ctx.t.short_kernel_us:g} µs)",
        "framework_python": f"the host runs Python and framework code between launches ({short_share:.0%} of "
                            f"{n_k / n:.0f} kernels per step run under {ctx.t.short_kernel_us:g} µs)",
    }[main]
    waited = np.flatnonzero(first < unseen)
    top_ids = [int(i) for i in waited[np.lexsort((first[waited], -wait[waited]))][: ctx.t.top_n]]
    top_calls = [(names[i], float(wait[i])) for i in top_ids]
    busy_share = 1.0 - idle_share
    if main == "sync":
        replay = {"estimated": False, "reason": SYNC_NOT_REPLAYED}
    else:
        feeders = tuple(str(r["tid"]) for r in ctx.query(ENQUEUERS_SQL, {"rank": rank}))
        changes, assumption = counterfactual(main, tuple(sorted({*drivers, *feeders})))
        replay = ctx.what_if(rank, changes, assumption, steps=step_ids)
    return ctx.finding(
        title=f"Rank {rank}'s device is busy {busy_share:.0%} of the step and waits on the host for "
        f"{fmt_ms(saving)} of {fmt_ms(step_us)} ({host_share:.0%}): {reason}",
        evidence={
            "device_busy_share": round(busy_share, 4), "device_idle_share": round(idle_share, 4),
            "min_idle_share": ctx.t.min_idle_share,
            "host_work_share": round(host_share, 4), "min_host_share": ctx.t.min_host_share,
            "device_idle_us_per_step": {**by_class, "nothing_recorded": untraced},
            "main_reason": main,
            "kernels_per_step": round(n_k / n, 1), "short_kernel_share": round(short_share, 4),
            "short_kernel_us": ctx.t.short_kernel_us,
            "driving_threads": n_threads,
            "step_us_median": round(step_us, 1), "steps": n,
        },
        saving_us=min(saving, step_us), step_us=step_us, cause=cause,
        saving_basis="median per-step device idle time during which the threads driving the device were in sync, "
        "allocator, launch, framework or Python work (data loading excluded)",
        # ops: the blocking calls only, so that ranks bound the same way merge into one finding
        ranks=[rank], steps=step_ids, ops=sorted(names[i] for i in top_ids if blocking[i]),
        top=[{"host_call": nm, "device_idle_us_per_step": round(d / 1000.0 / n, 1)} for nm, d in top_calls],
        replay=replay,
    )
