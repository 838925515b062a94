"""Critical path of one (rank, step) (Hermes §4.2.1).

The walk starts at the end of the step window and goes back in time along the dependency
that made each operator start when it did (the "last arriving input"), until it reaches the
window start. The dependencies it follows, each a real edge that can be named:

* **host order** – on a host thread, work runs one piece after another; nested operators are
  flattened so the innermost running event owns each instant;
* **launch** – a device task cannot start before the host call that launched it (same
  correlation id); when the previous task on the stream ended earlier than the launch, the
  launch is the binding edge and the walk jumps to the host;
* **stream order** – a device task starts after the previous task on its stream; when that
  task ended last, it is the binding edge;
* **communication completion** – a device task that waited on its stream after the previous task
  there had ended, and later than its launch, waited for something else: when a communication
  task (NCCL / HCCL ...) of another stream ended in that wait, the latest such one is the binding
  edge (its completion event released the stream: ``cudaStreamWaitEvent`` / HCCL's notify wait,
  which the trace does not link) and the walk moves to it;
* **computation completion** – a communication task that so waited, with no collective ending
  in the wait, waited for the computation of another stream that ended last in it (data
  parallelism: the NCCL / HCCL stream waits for the event recorded after a bucket's gradient
  kernels) and the walk moves to it. A compute task is not given this edge: between compute
  streams a late start has no one mechanism to name (an event wait, or the other stream holding
  the device), so its wait stays "device waiting" on its own stream;
* **event wait** (recorded) – a Kineto trace taken with ``enable_cuda_sync_events`` names each
  stream-to-stream wait: a ``cuda_sync`` "Stream Wait Event" on the waiting stream (its
  ``stream``, the ``correlation`` of its ``cudaStreamWaitEvent``) with the stream the event was
  recorded on (``wait_on_stream``) and the correlation of that ``cudaEventRecord``
  (``wait_on_cuda_event_record_corr_id``). Correlation ids grow with the API calls, so the wait
  holds back the first task of its stream launched after it, and the recorded event completes
  with the last task of the recording stream launched before the record: the producer. A task
  that waited, with such a wait before it whose producer ended in its wait, depends on that
  producer, compute or communication alike. Where a window has recorded waits, they replace
  the two completion edges above, which are inferences from timing (a task with an unrecorded
  wait before it — ``wait_on_cuda_event_record_corr_id`` -1 — still gets them);
* **sync wait** – a host sync call (``cudaStreamSynchronize``, ``aclrtSynchronizeStream``,
  blocking ``cudaMemcpy`` …) ends after the device work it waited for; the walk jumps from the
  end of the wait to the device task that finished last inside it. Where the trace records the
  sync (``cuda_sync`` "Stream Sync" / "Event Sync" with the call's correlation), only the task
  it names can end the wait: the last task of that stream, or the event's producer;
* **thread hand-off** – a helper thread (e.g. autograd's) with nothing earlier in the window
  was started from the main thread (the one holding the step marker, or where another thread
  makes the device calls, the one making most of them); the walk moves there.

The walk runs only on threads that do the step's work: those launching the window's device
tasks (a runtime call with the task's correlation; else any runtime / sync call), else those
running framework operators. A background thread that only waits (tqdm's
monitor, a usage reporter in ``threading.py``) spans the window but is never the path.

Gaps where the chosen track was doing nothing become ``idle`` segments on the path, so the
path's length is exactly the window's wall time. A gap between a device task's launch and its start
is launch latency, except the part where the launching thread was blocked in a sync call or a
blocking copy: that is named for the call (``host waits in hipMemcpyWithStream (blocking copy)``). A
device task launched before the window began (its launch call ended before the window's start),
with nothing before it on its stream in the window, was held back by what lies before the window:
from the window's start to it the path is ``idle (device work queued before the window)`` and the
walk ends there (edge ``launch before the window``). Time on the path is credited to the
outermost framework operator that encloses the host instant (``aten::conv2d`` rather than the
``cudaLaunchKernel`` inside it), to the kernel for device time, and to ``idle`` for gaps.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from advisor.kinds import EdgeKind, SegmentKind

# event kind -> the kind of critical-path segment its time counts as
REPORT_KIND: dict[str, SegmentKind] = {
    "host_op": SegmentKind.HOST,
    "runtime": SegmentKind.HOST,
    "sync": SegmentKind.HOST,
    "python": SegmentKind.HOST,
    "queue": SegmentKind.HOST,
    "other": SegmentKind.OTHER,
    "kernel": SegmentKind.COMPUTE,
    "memcpy": SegmentKind.COMPUTE,
    "memset": SegmentKind.COMPUTE,
    "comm": SegmentKind.COMMUNICATION,
    "dataloader": SegmentKind.IO,
}

# host event kinds that are framework work (a thread with none of them, and no runtime call, only waits)
WORK_KINDS = ("host_op", "comm", "dataloader", "queue")

_EVENTS_SQL = """
SELECT start_ns, start_ns + dur_ns AS end_ns, kind, name, device, coalesce(pid, '') AS pid, coalesce(tid, '') AS tid,
       coalesce(stream, -1) AS stream, corr
FROM events
WHERE rank = $rank AND dur_ns > 0 AND start_ns < $end AND start_ns + dur_ns > $start
  AND start_ns >= $start - (SELECT max(dur_ns) FROM events WHERE rank = $rank)  -- implied; lets the scan skip
  AND (device AND kind IN ('kernel', 'comm', 'memcpy', 'memset')
       OR NOT device AND kind IN ('host_op', 'runtime', 'sync', 'dataloader', 'queue', 'comm', 'python', 'other', 'step'))
ORDER BY start_ns, dur_ns DESC
"""
# device-side records of synchronisation calls (Kineto cuda_sync): the waiting stream, the call's
# correlation, and for an event wait the recording stream and the record's correlation. Taken by
# correlation, not time (the calls are made ahead of the device work): a record that matters
# names a device task of the window, launched before the call, so its correlation lies above the
# window's lowest device-task correlation ($lo) and at most its highest correlation ($hi)
_SYNCS_SQL = """
SELECT name, coalesce(pid, '') AS pid, coalesce(stream, -1) AS stream, corr, wait_stream, wait_corr
FROM events
WHERE rank = $rank AND device AND kind = 'sync' AND corr > $lo AND corr <= $hi
ORDER BY corr
"""
WAIT_EVENT = "Stream Wait Event"


@dataclass
class _Track:
    """Flattened timeline of one host thread: innermost event per segment."""

    seg_start: list[int]
    seg_end: list[int]
    seg_event: list[int]


def _flatten(idx: list[int], start: np.ndarray, end: np.ndarray) -> _Track:
    """Cut nested intervals (sorted by start, longer first) into innermost-owner segments."""
    ss: list[int] = []
    se: list[int] = []
    sv: list[int] = []
    stack: list[int] = []
    cursor = None

    def emit(a: int, b: int, owner: int) -> None:
        if b > a:
            ss.append(a)
            se.append(b)
            sv.append(owner)

    for i in idx:
        s, e = int(start[i]), int(end[i])
        while stack and int(end[stack[-1]]) <= s:
            top = stack.pop()
            emit(cursor, int(end[top]), top)  # type: ignore[arg-type]
            cursor = int(end[top])
        if stack:
            emit(cursor, s, stack[-1])  # type: ignore[arg-type]
        if stack and e > int(end[stack[-1]]):
            e = int(end[stack[-1]])  # badly nested: clip to parent
            end[i] = e
        stack.append(i)
        cursor = s
    while stack:
        top = stack.pop()
        emit(cursor, int(end[top]), top)  # type: ignore[arg-type]
        cursor = int(end[top])
    return _Track(ss, se, sv)


@dataclass
class Window:
    """The events of one (rank, step) window, one list (or array) per column, in start order;
    times clipped to the window."""

    start_ns: int
    end_ns: int
    start: np.ndarray
    end: np.ndarray
    kind: list[str]
    name: list[str]
    device: list[bool]
    pid: list[str]
    tid: list[str]  # a host thread by its id; a device stream's lane by pid/tid
    stream: list[Any]
    corr: list[Any]
    raw_tid: list[str] = field(default_factory=list)  # the trace's own tid (a device's stream lane)

    @property
    def n(self) -> int:
        return len(self.kind)


def read_window(cur: Any, rank: int, start_ns: int, end_ns: int) -> Window | None:
    """The events of the window (:data:`_EVENTS_SQL`), None when it has none or no length."""
    return read_windows(cur, rank, [(start_ns, end_ns)])[0]


def read_windows(cur: Any, rank: int, windows: list[tuple[int, int]]) -> list[Window | None]:
    """The events of each window (start_ns, end_ns) of one rank, read in one query over their span:
    each as :func:`read_window` gives it (None when it has none or no length)."""
    spans = [(a, b) for a, b in windows if b - a > 0]
    if not spans:
        return [None] * len(windows)
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    cols = cur.execute(_EVENTS_SQL, {"rank": rank, "start": lo, "end": hi}).fetchnumpy()
    start = np.asarray(cols["start_ns"], dtype=np.int64)
    end = np.asarray(cols["end_ns"], dtype=np.int64)
    if not len(start):
        return [None] * len(windows)
    device = [bool(x) for x in cols["device"].tolist()]
    pid = [str(x) for x in cols["pid"].tolist()]
    raw_tid = [str(x) for x in cols["tid"].tolist()]
    kind = [str(x) for x in cols["kind"].tolist()]
    name = [x if isinstance(x, str) else ("" if x is None else str(x)) for x in _plain(cols["name"])]
    # a stream is known by its device too: Kineto numbers the streams of each GPU of a process (its
    # own pid there) alike, so two devices both have a "stream 7". A host thread by its id alone: one
    # OS thread may show under several layer "processes" (torch_npu: Python, CANN)
    tid = [f"{p}/{t}" if d else t for p, t, d in zip(pid, raw_tid, device, strict=True)]
    stream = [int(x) for x in cols["stream"].tolist()]
    corr = _plain(cols["corr"])
    whole = len(spans) == 1
    out: list[Window | None] = []
    for a, b in windows:
        if b - a <= 0:
            out.append(None)
            continue
        ix = np.arange(len(start)) if whole else np.flatnonzero((start < b) & (end > a))
        if not len(ix):
            out.append(None)
            continue
        sel = ix.tolist()
        out.append(Window(
            start_ns=a, end_ns=b, start=start[ix].clip(a, b), end=end[ix].clip(a, b),
            kind=[kind[i] for i in sel], name=[name[i] for i in sel], device=[device[i] for i in sel],
            pid=[pid[i] for i in sel], tid=[tid[i] for i in sel], stream=[stream[i] for i in sel],
            corr=[corr[i] for i in sel], raw_tid=[raw_tid[i] for i in sel],
        ))
    return out


def _plain(col: Any) -> list[Any]:
    """A fetched column as a list, its NULLs as None."""
    if hasattr(col, "mask"):
        return [None if m else v for v, m in zip(col.data.tolist(), np.broadcast_to(col.mask, col.shape).tolist(),
                                                 strict=True)]
    return list(col.tolist())


@dataclass
class Threads:
    """The window's host threads: the ones the path may run on, the main one, each one's
    flattened timeline, and the outermost framework operator owning each host event."""

    by_thread: dict[str, list[int]]
    workers: set[str]
    main_tid: str | None
    tracks: dict[str, _Track]
    owner: list[int]


def host_threads(w: Window, owners: bool = True, flatten: Any = None) -> Threads:
    """The host threads of the window; the main thread is the one holding the step marker, unless
    other threads drive the device (then the one making most launches). ``owners``: find each
    event's outermost operator (else ``owner`` is empty); ``flatten``: which threads' timelines to
    flatten (a predicate on the thread id and its events; default all)."""
    kind, corr, tid, device = w.kind, w.corr, w.tid, w.device
    by_thread: dict[str, list[int]] = defaultdict(list)
    for i in range(w.n):
        if not device[i] and kind[i] != "step":
            by_thread[tid[i]].append(i)
    # the threads the path may run on: those that drive the device (runtime / sync calls), else those
    # running framework operators; a background thread that only waits (a progress-bar monitor, a
    # reporter sleeping in threading.py) is never what the step waits on
    dev_corr = {corr[i] for i in range(w.n) if device[i] and corr[i] is not None}
    launches: dict[str, int] = defaultdict(int)
    for th, ix in by_thread.items():
        launches[th] = sum(1 for i in ix if kind[i] in ("runtime", "sync") and corr[i] in dev_corr)
    drivers = {th for th, c in launches.items() if c}
    if not drivers:  # no launch linked to its device task: the threads making runtime calls
        for th, ix in by_thread.items():
            launches[th] = sum(1 for i in ix if kind[i] in ("runtime", "sync"))
        drivers = {th for th, c in launches.items() if c}
    workers = drivers or {th for th, ix in by_thread.items() if any(kind[i] in WORK_KINDS for i in ix)} or set(by_thread)
    marker_tid = next((tid[i] for i in range(w.n) if kind[i] == "step"), None)
    if drivers and marker_tid not in drivers:
        main_tid: str | None = max(sorted(drivers), key=lambda th: launches[th])
    else:
        main_tid = marker_tid
    if main_tid is None and by_thread:
        main_tid = max(sorted(workers), key=lambda th: len(by_thread[th]))
    if main_tid is not None:
        workers.add(main_tid)
    tracks = {t: _flatten(ix, w.start, w.end) for t, ix in by_thread.items()
              if flatten is None or t in workers or flatten(t, ix)}
    return Threads(by_thread, workers, main_tid, tracks, outermost_owners(w, by_thread) if owners else [])


def outermost_owners(w: Window, by_thread: dict[str, list[int]]) -> list[int]:
    """For each event, the outermost framework operator of its thread enclosing it (itself when
    none does): the one its time on the path is credited to."""
    owner = list(range(w.n))
    for ix in by_thread.values():
        stack: list[int] = []
        for i in ix:
            while stack and w.end[stack[-1]] <= w.start[i]:
                stack.pop()
            outer = next((j for j in stack if w.kind[j] in ("host_op", "dataloader", "comm")), None)
            owner[i] = outer if outer is not None else i
            stack.append(i)
    return owner


@dataclass
class Streams:
    """The window's device tasks: all of them and by end (every kind, communication, computation),
    each stream's tasks by end, and the host call that launched each correlation."""

    dev_all: list[int]
    ends_sorted: list[int]
    end_vals: list[int]
    comm_sorted: list[int]
    comm_vals: list[int]
    comp_sorted: list[int]
    comp_vals: list[int]
    stream_ends: dict[Any, tuple[list[int], list[int]]]
    launch_of: dict[Any, int]
    #: correlations of the window's device tasks whose launch call ended before the window began
    launched_before: set[Any] = field(default_factory=set)


# the launch calls, among correlations $lo..$hi, that ended before the window ($start): the device
# work they launched was queued before the window began
_LAUNCHED_BEFORE_SQL = """
SELECT DISTINCT corr FROM events
WHERE rank = $rank AND NOT device AND corr BETWEEN $lo AND $hi AND start_ns + dur_ns <= $start
  AND kind IN ('runtime', 'sync', 'queue', 'other', 'host_op')
"""


def device_streams(w: Window, cur: Any = None, rank: int | None = None) -> Streams:
    """The device tasks of the window, indexed for the walk's look-ups; with a cursor on the
    profile (``cur``, ``rank``), also which of them were launched before the window began."""
    dev_by_stream: dict[Any, list[int]] = defaultdict(list)
    dev_all: list[int] = []
    for i in range(w.n):
        if w.device[i]:
            dev_by_stream[(w.tid[i], w.stream[i])].append(i)
            dev_all.append(i)
    ends_sorted = sorted(dev_all, key=lambda i: w.end[i])
    comm_sorted = [i for i in ends_sorted if w.kind[i] == "comm"]
    comp_sorted = [i for i in ends_sorted if w.kind[i] != "comm"]
    stream_ends: dict[Any, tuple[list[int], list[int]]] = {}
    for key, ix in dev_by_stream.items():
        ix.sort(key=lambda i: (w.end[i], w.start[i]))
        stream_ends[key] = ([int(w.end[i]) for i in ix], ix)
    launch_of: dict[Any, int] = {}
    for i in range(w.n):
        if not w.device[i] and w.corr[i] is not None and w.kind[i] in ("runtime", "sync", "queue", "other", "host_op"):
            launch_of.setdefault(w.corr[i], i)
    before: set[Any] = set()
    unlaunched = [w.corr[i] for i in dev_all if w.corr[i] is not None and w.corr[i] not in launch_of]
    if cur is not None and rank is not None and unlaunched:
        rows = cur.execute(_LAUNCHED_BEFORE_SQL, {"rank": rank, "lo": min(unlaunched), "hi": max(unlaunched),
                                                  "start": w.start_ns}).fetchall()
        before = {r[0] for r in rows} & set(unlaunched)
    return Streams(dev_all, ends_sorted, [int(w.end[i]) for i in ends_sorted], comm_sorted,
                   [int(w.end[i]) for i in comm_sorted], comp_sorted, [int(w.end[i]) for i in comp_sorted],
                   stream_ends, launch_of, before)


def last_end_in(w: Window, vals: list[int], order: list[int], a: int, b: int, key: Any = None) -> int | None:
    """Task of ``order`` (sorted by end, ends ``vals``) with the latest end in (a, b], on another
    stream than ``key`` (None: on any)."""
    p = bisect.bisect_right(vals, b) - 1
    while p >= 0 and vals[p] > a:
        i = order[p]
        if (w.tid[i], w.stream[i]) != key:
            return i
        p -= 1
    return None


def rank_sync_rows(cur: Any, rank: int) -> list[tuple[Any, ...]]:
    """Every device sync record of the rank (:data:`_SYNCS_SQL` unbounded), in correlation order."""
    return list(cur.execute(_SYNCS_SQL, {"rank": rank, "lo": -(1 << 62), "hi": 1 << 62}).fetchall())


class Syncs:
    """The window's recorded synchronisation (Kineto ``cuda_sync``): which stream waited for which
    recorded event, and which host sync call waited for what."""

    def __init__(self, cur: Any, rank: int, w: Window, streams: Streams,
                 rank_syncs: list[tuple[Any, ...]] | None = None) -> None:
        """``rank_syncs``: every device sync record of the rank (:func:`rank_sync_rows`), read once for
        several windows; else the window's are read here."""
        self.w = w
        self.streams = streams
        self.waits: dict[tuple[str, int], tuple[list[int], list[tuple[Any, Any]]]] = defaultdict(lambda: ([], []))
        self.sync_of_call: dict[int, tuple[str, tuple[str, int], Any, Any]] = {}
        corr, dev_all = w.corr, streams.dev_all
        dev_corrs = [corr[i] for i in dev_all if corr[i] is not None]
        all_corrs = [c for c in corr if c is not None]
        if not dev_corrs:
            syncs: list[tuple[Any, ...]] = []
        elif rank_syncs is not None:
            lo_c, hi_c = min(dev_corrs), max(all_corrs)
            keys = [r[3] for r in rank_syncs]
            syncs = rank_syncs[bisect.bisect_right(keys, lo_c):bisect.bisect_right(keys, hi_c)]
        else:
            syncs = cur.execute(_SYNCS_SQL, {"rank": rank, "lo": min(dev_corrs), "hi": max(all_corrs)}).fetchall()
        for nm, dv, st, c, ws, wc in syncs:
            self.sync_of_call.setdefault(int(c), (nm, (dv, int(st)), ws, wc))
            if nm == WAIT_EVENT:
                self.waits[(dv, int(st))][0].append(int(c))
                self.waits[(dv, int(st))][1].append((ws, wc))
        #: the window's stream waits are recorded: no inferred completion edges
        self.recorded = bool(self.waits)
        #: device tasks without any launch link (torch_npu Level0: no CANN layer, no flows): which host
        #: call waited for which task is unknown, so a host operator during which device work ended
        #: hands the walk to that work (device order) rather than owning the time itself
        self.no_links = bool(dev_all) and not dev_corrs
        # device tasks per (device, stream number) in correlation (launch) order, and by end (only
        # read through the records above)
        self.by_corr: dict[tuple[str, int], tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        self.by_end: dict[tuple[str, int], tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        if syncs:
            for i in streams.ends_sorted:
                self.by_end[(w.pid[i], w.stream[i])][0].append(int(w.end[i]))
                self.by_end[(w.pid[i], w.stream[i])][1].append(i)
            for i in sorted((i for i in dev_all if corr[i] is not None), key=lambda i: corr[i]):
                self.by_corr[(w.pid[i], w.stream[i])][0].append(int(corr[i]))
                self.by_corr[(w.pid[i], w.stream[i])][1].append(i)

    def producer(self, dev: str, ws: int, wc: int) -> int | None:
        """The task whose completion an event recorded on stream ``ws`` by the call with
        correlation ``wc`` marks: the last one launched there before the record. The stream is
        the waiting device's (``dev``); where that has none so numbered, the one other device's
        that has (an event of another GPU), if exactly one has."""
        key = (dev, ws)
        if key not in self.by_corr:
            other = [k for k in self.by_corr if k[1] == ws]
            key = other[0] if len(other) == 1 else key
        corrs, order = self.by_corr.get(key, ([], []))
        p = bisect.bisect_left(corrs, wc) - 1
        return order[p] if p >= 0 else None

    def recorded_wait(self, v: int, prev: int | None, a: int, b: int) -> tuple[int | None, bool]:
        """(the producer ending last in (a, b] among the recorded waits between ``prev`` and
        ``v`` on their stream, whether one of those waits names no producer)."""
        w = self.w
        if w.corr[v] is None:
            return None, True
        lo = w.corr[prev] if prev is not None and w.corr[prev] is not None else -1
        calls, what = self.waits.get((w.pid[v], w.stream[v]), ([], []))
        best, unknown = None, False
        for k in range(bisect.bisect_right(calls, lo), bisect.bisect_left(calls, w.corr[v])):
            ws, wc = what[k]
            if ws is None or wc is None:
                unknown = True
                continue
            p = self.producer(w.pid[v], int(ws), int(wc))
            if p is not None and a < w.end[p] <= b and (best is None or w.end[p] > w.end[best]):
                best = p
        return best, unknown

    def released_by(self, i: int, a: int, b: int) -> int | None:
        """The device task whose end released host sync call ``i`` waiting in (a, b]: the one
        its cuda_sync record names (a stream's last task, an event's producer) when there is
        one, else the last task ending in the wait on any stream."""
        w = self.w
        rec = self.sync_of_call.get(w.corr[i]) if w.corr[i] is not None else None
        if rec is not None and rec[0] == "Stream Sync":
            vals, order = self.by_end.get(rec[1], ([], []))
            return last_end_in(w, vals, order, a, b)
        if rec is not None and rec[0] == "Event Sync" and rec[2] is not None and rec[3] is not None:
            p = self.producer(rec[1][0], int(rec[2]), int(rec[3]))
            return p if p is not None and a < w.end[p] <= b else None
        return last_end_in(w, self.streams.end_vals, self.streams.ends_sorted, a, b)


class PathAccount:
    """The path as it is walked: its segments, and the time credited to each (name, kind)."""

    def __init__(self, w: Window, owner: list[int]) -> None:
        self.w = w
        self.owner = owner
        self.credit: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
        self.segments: list[tuple[int, int, str, str]] = []
        self.tracks: list[tuple[str, str] | None] = []  # per segment, the (pid, tid) it ran on

    def add(self, a: int, b: int, nm: str, kind_: SegmentKind, track: tuple[str, str] | None = None) -> None:
        """A segment (a, b] of the path, credited to ``nm``; ``track`` the (pid, tid) it ran on."""
        if b <= a:
            return
        kd = kind_.value
        c = self.credit[(nm, kd)]
        c[0] += (b - a) / 1000.0
        c[1] += 1
        self.segments.append((a, b, nm, kd))
        self.tracks.append(track)

    def credit_event(self, i: int, a: int, b: int) -> None:
        """(a, b] of event ``i``, credited to its outermost operator (a device task to itself)."""
        o = self.owner[i] if not self.w.device[i] else i
        track = (str(self.w.pid[i]), str(self.w.raw_tid[i])) if self.w.raw_tid else None
        self.add(a, b, self.w.name[o], REPORT_KIND.get(self.w.kind[o], SegmentKind.OTHER), track)


#: Where the walk is: on a device task ("dev", index) or on a host thread ("host", thread id).
Mode = tuple[str, Any]


def blocking(w: Window, i: int) -> bool:
    """Whether host event ``i`` waits for the device: a sync call, or a copy call that is not async
    (``cudaMemcpy``, ``hipMemcpyWithStream`` …)."""
    return w.kind[i] == "sync" or (w.kind[i] in ("runtime", "sync") and "Memcpy" in w.name[i]
                                   and "Async" not in w.name[i])


def host_wait_label(w: Window, i: int) -> str:
    """The path's name for time the host spent blocked in call ``i``."""
    what = "blocking copy" if "Memcpy" in w.name[i] else "sync"
    return f"host waits in {w.name[i]} ({what})"


#: the path's name for the time from the window's start to the start of device work launched
#: before the window began
QUEUED_BEFORE = "idle (device work queued before the window)"


def add_launch_gap(w: Window, th: Threads, path: PathAccount, thread: Any, launch_t: int, t: int) -> None:
    """The time (launch_t, t] between a device task's launch and its start. Where the launching
    thread was blocked in a sync or blocking copy when the task started, the host was waiting, not
    launching: that part is named for the call (``host waits in hipMemcpyWithStream (blocking
    copy)``); the rest is launch latency."""
    tr = th.tracks.get(thread)
    wait_from = t
    if tr is not None and t > launch_t:
        p = bisect.bisect_left(tr.seg_end, t)  # the segment running just before t
        if p < len(tr.seg_end) and tr.seg_start[p] < t:
            i = tr.seg_event[p]
            if blocking(w, i) and int(w.start[i]) < t:
                wait_from = max(launch_t, int(w.start[i]))
                path.add(wait_from, t, host_wait_label(w, i), SegmentKind.IDLE)
    path.add(launch_t, wait_from, "idle (launch latency)", SegmentKind.IDLE)


def device_step(w: Window, th: Threads, st: Streams, sy: Syncs, path: PathAccount, v: int,
                t: int) -> tuple[int, Mode | None, EdgeKind | None]:
    """One step back from device task ``v`` (ending at ``t`` on the path): its time credited, then
    the last arriving of its inputs. Returns the new time, where the walk goes (None: the window's
    start is reached) and the edge taken."""
    s = int(w.start[v])
    path.credit_event(v, s, t)
    t = s
    if t <= w.start_ns:
        return t, None, None
    key = (w.tid[v], w.stream[v])
    ends, ix = st.stream_ends[key]
    p = bisect.bisect_right(ends, t) - 1
    prev = ix[p] if p >= 0 else None
    if prev == v:
        p -= 1
        prev = ix[p] if p >= 0 else None
    prev_end = int(w.end[prev]) if prev is not None else None
    launch = st.launch_of.get(w.corr[v]) if w.corr[v] is not None else None
    launch_t = min(int(w.end[launch]), t) if launch is not None else None
    # the last arriving input: the launch, the previous task on the stream, or a
    # communication task of another stream that ended after both; for a collective,
    # else the computation of another stream that ended after both (its gradients)
    after = max(x for x in (launch_t, prev_end, w.start_ns) if x is not None)
    waited, infer = sy.recorded_wait(v, prev, after, t) if sy.recorded else (None, True)
    comm = last_end_in(w, st.comm_vals, st.comm_sorted, after, t, key) if infer and waited is None else None
    comp = (last_end_in(w, st.comp_vals, st.comp_sorted, after, t, key)
            if infer and waited is None and comm is None and w.kind[v] == "comm" else None)
    if waited is not None:
        label = "communication" if w.kind[waited] == "comm" else "computation"
        path.add(int(w.end[waited]), t, f"idle (waiting for {label})", SegmentKind.IDLE)
        return int(w.end[waited]), ("dev", waited), EdgeKind.RECORDED_EVENT_WAIT
    if comm is not None:
        path.add(int(w.end[comm]), t, "idle (waiting for communication)", SegmentKind.IDLE)
        return int(w.end[comm]), ("dev", comm), EdgeKind.COMMUNICATION_COMPLETION
    if comp is not None:
        path.add(int(w.end[comp]), t, "idle (waiting for computation)", SegmentKind.IDLE)
        return int(w.end[comp]), ("dev", comp), EdgeKind.COMPUTATION_COMPLETION
    if launch is not None and launch_t is not None and (prev_end is None or launch_t >= prev_end):
        add_launch_gap(w, th, path, w.tid[launch], launch_t, t)
        return launch_t, ("host", w.tid[launch]), EdgeKind.LAUNCH
    if prev is not None and prev_end is not None:
        path.add(prev_end, t, "idle (device waiting)", SegmentKind.IDLE)
        return prev_end, ("dev", prev), EdgeKind.STREAM_ORDER
    if w.corr[v] is not None and w.corr[v] in st.launched_before:
        # launched before the window, with nothing before it on its stream in the window: what
        # held it back (its launch, the stream's earlier work) lies before the window, whose start
        # the path reaches here; the wait is neither launch latency nor this window's host work
        path.add(w.start_ns, t, QUEUED_BEFORE, SegmentKind.IDLE)
        return w.start_ns, None, EdgeKind.LAUNCH_BEFORE_WINDOW
    # nothing earlier on this stream and no known launch: fall back to the main thread
    return t, ("host", th.main_tid), EdgeKind.UNKNOWN_LAUNCH


def host_step(w: Window, th: Threads, st: Streams, sy: Syncs, path: PathAccount, thread: Any,
              t: int) -> tuple[int, Mode | None, EdgeKind | None]:
    """One step back along host thread ``thread``'s flattened timeline from ``t``: its gap and the
    event running then credited, or a hand-off to the device work it waited for, or to the main
    thread. Returns the new time, where the walk goes (None: it ends) and the edge taken."""
    tr = th.tracks.get(thread)
    if tr is None:
        path.add(w.start_ns, t, "idle", SegmentKind.IDLE)
        return w.start_ns, None, None
    p = bisect.bisect_left(tr.seg_end, t)  # first segment ending at or after t
    seg = p if p < len(tr.seg_end) and tr.seg_start[p] < t else p - 1
    if seg < 0:
        if thread != th.main_tid and th.main_tid in th.tracks:
            return t, ("host", th.main_tid), EdgeKind.THREAD_HAND_OFF
        path.add(w.start_ns, t, "idle (host)", SegmentKind.IDLE)
        return w.start_ns, None, None
    a, b, i = tr.seg_start[seg], min(tr.seg_end[seg], t), tr.seg_event[seg]
    if b < t:
        path.add(b, t, "idle (host: Python / untraced)", SegmentKind.IDLE)
        t = b
    if sy.no_links and w.kind[i] != "dataloader":
        d = last_end_in(w, st.end_vals, st.ends_sorted, max(a, int(w.start[i])), t)
        if d is not None:
            path.credit_event(i, int(w.end[d]), t)
            return int(w.end[d]), ("dev", d), EdgeKind.DEVICE_ORDER
    # a sync (or a blocking call) waits for device work finishing inside it
    if blocking(w, i):
        d = sy.released_by(i, max(a, int(w.start[i])), t)
        if d is not None:
            path.credit_event(i, int(w.end[d]), t)
            return int(w.end[d]), ("dev", d), EdgeKind.SYNC_WAIT
    path.credit_event(i, a, t)
    return a, ("host", thread), EdgeKind.HOST_ORDER


def walk(w: Window, th: Threads, st: Streams, sy: Syncs, path: PathAccount) -> dict[EdgeKind, int] | None:
    """The walk back from the latest-ending piece of work of the window to its start, the path's
    segments into ``path``; how often it took each kind of edge (None: no work to start from)."""
    t = int(w.end_ns)
    last = max((i for i in range(w.n) if w.device[i] or (w.tid[i] in th.workers and w.kind[i] != "step")),
               key=lambda i: (w.end[i], w.device[i]), default=None)
    if last is None:
        return None
    if w.end[last] < t:
        path.add(int(w.end[last]), t, "idle (after last operator)", SegmentKind.IDLE)
        t = int(w.end[last])
    mode: Mode | None = ("dev", last) if w.device[last] else ("host", w.tid[last])
    edges: dict[EdgeKind, int] = defaultdict(int)
    guard = 0
    while mode is not None and t > w.start_ns and guard < 4 * w.n + 1000:
        guard += 1
        if mode[0] == "dev":
            t, mode, edge = device_step(w, th, st, sy, path, mode[1], t)
        else:
            t, mode, edge = host_step(w, th, st, sy, path, mode[1], t)
        if edge is not None:
            edges[edge] += 1
    if t > w.start_ns:
        path.add(w.start_ns, t, "idle", SegmentKind.IDLE)
    return edges


NO_LINKS_NOTE = (
    "the device tasks carry no launch links (no CANN layer or flow events, e.g. a torch_npu Level0 "
    "export): which host call waited for which task is not known; the path follows device order "
    "where device work ran, and host time on it may include waits for the device"
)


def summarise_path(result: dict[str, Any], w: Window, st: Streams, sy: Syncs, path: PathAccount,
                   edges: dict[EdgeKind, int], top_n: int) -> None:
    """The walked path into ``result``: its operators by time, edges, how stream waits were known,
    totals by kind and its segments in time order."""
    total = sum(v[0] for v in path.credit.values())
    ops: list[dict[str, Any]] = sorted(
        ({"name": k[0], "kind": k[1], "total_us": round(v[0], 3), "count": int(v[1])} for k, v in path.credit.items()),
        key=lambda o: -o["total_us"],
    )
    result["ops"] = ops[:top_n]
    # the dependencies the path followed, by kind (host order: one per host segment walked), and
    # whether cross-stream waits were recorded by the profiler or inferred from timing
    result["edges"] = {k.value: v for k, v in sorted(edges.items(), key=lambda kv: -kv[1])}
    result["stream_waits"] = "recorded" if sy.recorded else ("inferred" if st.dev_all else None)
    if sy.no_links:
        result["note"] = NO_LINKS_NOTE
    result["ops_total"] = len(ops)
    result["path_us"] = round(total, 3)
    by_kind: dict[str, float] = defaultdict(float)
    for o in ops:
        by_kind[o["kind"]] += o["total_us"]
    result["by_kind_us"] = {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}
    order = sorted(range(len(path.segments)), key=lambda j: path.segments[j])
    result["segments"] = [
        {"start_us": (a - w.start_ns) / 1000.0, "dur_us": (b - a) / 1000.0, "name": nm, "kind": kd,
         # the trace's pid / tid the segment ran on (a host thread or a device stream); none for idle time
         **({"pid": tr[0], "tid": tr[1]} if tr else {})}
        for (a, b, nm, kd), tr in ((path.segments[j], path.tracks[j]) for j in order)
    ]


def compute(con: Any, rank: int, step: int, start_ns: int, end_ns: int, top_n: int = 15) -> dict[str, Any]:
    """Critical path of one window. Returns the contract's ``critical_path`` object plus segments:
    the window's events read, its host threads and device streams indexed, the recorded syncs
    read, the walk back from the last piece of work, the path summarised."""
    cur = con.cursor()
    result: dict[str, Any] = {"rank": rank, "step": step, "length_us": (end_ns - start_ns) / 1000.0, "ops": [],
                              "segments": []}
    w = read_window(cur, rank, start_ns, end_ns)
    if w is None:
        return result
    th = host_threads(w)
    st = device_streams(w, cur, rank)
    sy = Syncs(cur, rank, w, st)
    path = PathAccount(w, th.owner)
    edges = walk(w, th, st, sy, path)
    if edges is None:
        return result
    summarise_path(result, w, st, sy, path, edges, top_n)
    return result


#: Default resolution of the report's segment list: runs of segments shorter than this share of the
#: step are merged (at the HTML timeline's width, 0.1 % is about one pixel).
SEGMENT_RESOLUTION = 0.001
_TOUCH_US = 1e-3  # segments closer than 1 ns are contiguous (times are whole ns)


def summarise_segments(cp: dict[str, Any], resolution: float = SEGMENT_RESOLUTION) -> dict[str, Any]:
    """The critical path with its ``segments`` merged below ``resolution`` x the step length.

    Two passes, both over contiguous segments only, so the durations still add up to the step's
    wall time and each kind's share stays exact:

    * neighbours with the same operator and kind become one segment (``merged``: how many);
    * runs of segments each shorter than the resolution become one segment per run, closed once
      it spans the resolution: ``name`` says how many it holds, ``kind`` is the kind with the most
      time in it, ``by_kind_us`` the time of each kind, ``top`` its three longest operators.

    ``ops`` (the per-operator ranking) comes from the walk itself and is unchanged. Added:
    ``segments_total`` (segments before merging) and ``segments_resolution_us``.
    """
    segs = list(cp.get("segments") or [])
    length = float(cp.get("length_us") or 0.0)
    out = dict(cp)
    out["segments_total"] = len(segs)
    res_us = resolution * length
    out["segments_resolution_us"] = round(res_us, 3)
    if not segs or res_us <= 0:
        return out
    same: list[dict[str, Any]] = []
    for s in segs:
        p = same[-1] if same else None
        if (p is not None and p["name"] == s["name"] and p["kind"] == s["kind"]
                and (p.get("pid"), p.get("tid")) == (s.get("pid"), s.get("tid"))
                and abs(s["start_us"] - (p["start_us"] + p["dur_us"])) <= _TOUCH_US):
            p["dur_us"] += s["dur_us"]
            p["merged"] = p.get("merged", 1) + s.get("merged", 1)
        else:
            same.append(dict(s))
    merged: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []

    def close() -> None:
        if len(run) == 1:
            merged.append(run[0])
        elif run:
            merged.append(_merge_run(run))
        run.clear()

    for s in same:
        short = s["dur_us"] < res_us
        if run and (not short or abs(s["start_us"] - (run[-1]["start_us"] + run[-1]["dur_us"])) > _TOUCH_US
                    or run[-1]["start_us"] + run[-1]["dur_us"] - run[0]["start_us"] >= res_us):
            close()
        if short:
            run.append(s)
        else:
            merged.append(s)
    close()
    for s in merged:
        s["start_us"] = round(s["start_us"], 3)
        s["dur_us"] = round(s["dur_us"], 3)
    out["segments"] = merged
    return out


def _merge_run(run: list[dict[str, Any]]) -> dict[str, Any]:
    """One segment for a run of contiguous short segments."""
    by_kind: dict[str, float] = defaultdict(float)
    by_op: dict[tuple[str, str], float] = defaultdict(float)
    n = 0
    for s in run:
        by_kind[s["kind"]] += s["dur_us"]
        by_op[(s["name"], s["kind"])] += s["dur_us"]
        n += int(s.get("merged", 1))
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:3]
    tracks = {(s.get("pid"), s.get("tid")) for s in run}
    one = next(iter(tracks)) if len(tracks) == 1 and None not in next(iter(tracks)) else None
    return {
        **({"pid": one[0], "tid": one[1]} if one else {}),
        "start_us": run[0]["start_us"],
        "dur_us": sum(s["dur_us"] for s in run),
        "name": f"{n} merged segments",
        "kind": max(by_kind, key=lambda k: by_kind[k]),
        "merged": n,
        "by_kind_us": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top": [{"name": k[0], "kind": k[1], "us": round(v, 3)} for k, v in top],
    }
