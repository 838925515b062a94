"""What-if replay of one (rank, step): the step's dependency graph, replayed with and without a change.

The graph is built from the window :mod:`advisor.stages.critical_path` reads, with the edges that
stage names (its readers and look-ups are reused, not repeated here):

* **host order** – each host thread that drives the step (``Threads.workers``) is its flattened
  timeline: one node per segment, owned by the innermost event running then; a segment starts after
  the previous one of its thread has ended, plus the measured gap between them (Python or untraced
  host work: a fixed delay);
* **launch** – a device task starts no earlier than the host call that launched it (same
  correlation id) started, plus the measured launch latency when the launch is what held it back;
* **stream order** – a device task starts after the task of its stream that ended last before it;
* **event waits** – a task that waited on its stream after its launch and its predecessor waited
  for another stream's task: the producer of a recorded ``Stream Wait Event``, else (inferred as the
  critical-path walk does) a collective of another stream that ended in the wait, or for a collective
  the computation that ended last in it;
* **sync wait** – a blocking host call (``blocking``) is split where the device task that released it
  (``Syncs.released_by``) ended: the call's first part is an elastic wait (no duration of its own),
  its rest starts when both the call has begun and that task has ended;
* **thread hand-off** – a helper thread that wakes up (its first segment, or one after an idle gap)
  starts at a fixed offset into the main thread's segment running then;
* **host collective completion** – a thread resuming after an idle gap in which a host collective of
  another thread ended (gloo runs its collectives on work threads: DDP's caller waits for them) starts
  after the one that ended last in the gap;
* **data-loader waits** are host segments owned by the ``dataloader`` events (``__next__``): host
  order makes the next launches wait for them.

A communication operator that only spans the tasks recorded for it on another lane (Ascend: the
``hcom_allReduce`` op above its ``Notify Wait`` / ``SDMA`` tasks) is not a node: its tasks are, and the
first of them inherits its launch.

**Replay** is forward list scheduling over the nodes in their measured start order (a topological
order of these edges, which all point forward in time): a node starts when all its predecessors have
reached their edge's point, plus the edge's delay; it lasts its measured duration unless a
:class:`Change` alters it. An edge's delay is the measured time between that point and the node's
start on the edge that bound it (the latest one), zero on the others: replaying with no change gives
the measured schedule back, unless an edge contradicts the timestamps (a node started before a
predecessor reached its point), which the **reproduction error** measures. The replayed step is the
latest replayed end plus the measured time from the last work to the step's end.

A :class:`Change` is data: remove events, bound (by name or per instance) or scale their durations,
or drop edges of a kind (a sync's wait edge: the host no longer waits). :func:`saving` = measured step − replayed step.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from advisor.kinds import EdgeKind
from advisor.stages.critical_path import (
    WORK_KINDS,
    Syncs,
    Window,
    blocking,
    device_streams,
    host_threads,
    last_end_in,
    rank_sync_rows,
    read_window,
    read_windows,
)

#: a step reproduces when the no-change replay is within this share of the measured step
REPRODUCE_WITHIN = 0.02

#: edge kinds by code (the graph's ``etype``)
EDGE_KINDS: tuple[EdgeKind, ...] = (
    EdgeKind.HOST_ORDER, EdgeKind.LAUNCH, EdgeKind.STREAM_ORDER, EdgeKind.RECORDED_EVENT_WAIT,
    EdgeKind.COMMUNICATION_COMPLETION, EdgeKind.COMPUTATION_COMPLETION, EdgeKind.SYNC_WAIT,
    EdgeKind.THREAD_HAND_OFF,
)
_CODE = {k: i for i, k in enumerate(EDGE_KINDS)}
#: host event kinds that make a thread part of the step's graph (besides driving the device)
_WORK = frozenset((*WORK_KINDS, "runtime", "sync"))


@dataclass
class Graph:
    """The dependency graph of one (rank, step) window; nodes in their measured start order.

    Per node: measured ``start`` / ``dur`` (ns), the window ``event`` it belongs to, whether it is on
    the ``device``, its host ``thread`` (None on the device), whether it is the elastic wait part of a
    sync (``wait``). Edges: ``src`` -> ``dst`` of kind ``etype`` (:data:`EDGE_KINDS` index), from the
    source's start (``from_start``, a launch or hand-off) or end, plus ``delay`` ns."""

    rank: int
    step: int | None
    start_ns: int
    end_ns: int
    w: Window
    start: np.ndarray
    dur: np.ndarray
    event: np.ndarray
    device: np.ndarray
    thread: list[str | None]
    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray
    from_start: np.ndarray
    delay: np.ndarray
    tail: int  # ns from the last work's end to the step's end
    sink: np.ndarray  # the nodes whose end ends the step: the device's and the step's own thread's
    containers: dict[int, list[int]] = field(default_factory=dict)  # comm op -> its task nodes
    bind: np.ndarray | None = None  # per node, the index of the edge that bound its start (-1: none)

    @property
    def n(self) -> int:
        return len(self.start)

    @property
    def length(self) -> int:
        """The measured step (ns)."""
        return self.end_ns - self.start_ns


# -- building -------------------------------------------------------------------------------


def build(cur: Any, rank: int, step: int | None, start_ns: int, end_ns: int) -> Graph | None:
    """The graph of one window (None when it has no events or no length)."""
    w = read_window(cur, rank, start_ns, end_ns)
    if w is None:
        return None
    return graph_of(cur, rank, step, w)


class _Nodes:
    """Nodes as they are made: measured start, duration, event, device, thread, wait part."""

    def __init__(self) -> None:
        self.start: list[int] = []
        self.dur: list[int] = []
        self.event: list[int] = []
        self.device: list[bool] = []
        self.thread: list[str | None] = []
        self.wait: list[bool] = []

    def add(self, s: int, e: int, ev: int, dev: bool, th: str | None, wait: bool = False) -> int:
        self.start.append(s)
        self.dur.append(max(e - s, 0))
        self.event.append(ev)
        self.device.append(dev)
        self.thread.append(th)
        self.wait.append(wait)
        return len(self.start) - 1


def graph_of(cur: Any, rank: int, step: int | None, w: Window, rank_syncs: list[tuple[Any, ...]] | None = None) -> Graph:
    """The graph of window ``w`` (see the module docstring); ``rank_syncs``: the rank's device sync
    records read once (:func:`advisor.stages.critical_path.rank_sync_rows`), else read here."""
    def does_work(_t: str, ix: list[int]) -> bool:
        return any(w.kind[i] in _WORK for i in ix)

    th = host_threads(w, owners=False, flatten=does_work)
    st = device_streams(w)
    sy = Syncs(cur, rank, w, st, rank_syncs)
    nodes = _Nodes()
    edges: list[tuple[int, int, int, bool]] = []  # src, dst, kind code, from the source's start
    sync_waits: list[tuple[int, int]] = []  # (releasing task, the sync's node after the wait)
    first_of_event: dict[int, int] = {}  # host event -> its first segment node
    # host threads: flattened segments, blocking calls split where the task releasing them ended
    main_segs: tuple[list[int], list[int], list[int]] | None = None  # starts, ends, nodes of the main thread
    thread_nodes: dict[str, tuple[list[int], list[int], list[int]]] = {}
    seg_last: dict[str, tuple[list[int], list[int]]] = {}  # thread -> its segments' ends, their last nodes
    # the threads of the step: those driving the device, and those running framework work (torch_npu's
    # Python thread enqueues what its task-queue thread launches; autograd's thread runs the backward)
    marker = next((w.tid[i] for i in range(w.n) if w.kind[i] == "step"), None)
    lead = marker if marker in th.tracks else th.main_tid
    work = set(th.tracks)
    ws, we = w.start.tolist(), w.end.tolist()
    blocking_ev = {i for i in range(w.n) if w.kind[i] in ("runtime", "sync") and not w.device[i] and blocking(w, i)}
    blocking_ev |= _host_sync_ops(w, blocking_ev)
    released: dict[int, int | None] = {}
    # task queue (torch_npu): a thread that enqueues drains the queue before it blocks on the device
    enqueuers = {w.tid[i] for i in range(w.n) if w.kind[i] == "queue" and w.name[i].startswith("Enqueue")}
    dq = sorted((int(w.end[i]), i) for i in range(w.n) if w.kind[i] == "queue" and w.name[i].startswith("Dequeue"))
    dq_end = [e for e, _ in dq]
    drain_waits: list[tuple[int, int]] = []  # (last dequeue before a sync, the draining segment's node after it)
    n_start, n_dur, n_event, n_device, n_thread, n_wait = (nodes.start, nodes.dur, nodes.event, nodes.device,
                                                           nodes.thread, nodes.wait)
    host_order = _CODE[EdgeKind.HOST_ORDER]
    edge_chunks: list[np.ndarray] = []
    for tid in sorted(work, key=lambda t: (t != lead, t)):
        tr = th.tracks.get(tid)
        if tr is None:
            continue
        starts: list[int] = tr.seg_start
        ends: list[int] = tr.seg_end
        ev = tr.seg_event
        # the blocking calls' segments that a device task's end splits (few: handled one by one)
        split_at: dict[int, tuple[int, int]] = {}  # segment -> (releasing task, its end)
        for k, i in enumerate(ev):
            if i in blocking_ev:
                if i not in released:
                    released[i] = sy.released_by(i, ws[i], we[i])
                d = released[i]
                if d is not None and starts[k] < we[d] <= ends[k]:
                    split_at[k] = (d, we[d])
        drains: set[int] = set()  # segments split where the queue they wait for drained
        if tid in enqueuers and dq:
            for k in range(1, len(ev)):
                i = ev[k]
                if i not in blocking_ev or ev[k - 1] == i or (k - 1) in split_at:
                    continue
                p = bisect.bisect_right(dq_end, starts[k]) - 1
                while p >= 0 and w.tid[dq[p][1]] == tid:
                    p -= 1
                if p >= 0 and starts[k - 1] < dq_end[p] <= ends[k - 1]:
                    split_at[k - 1] = (dq[p][1], dq_end[p])
                    drains.add(k - 1)
        m = len(ev)
        sa, sb = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        split = np.zeros(m, dtype=bool)
        if split_at:
            split[list(split_at)] = True
        count = 1 + split.astype(np.int64)
        base = len(n_start)
        first_ix = np.cumsum(count) - count  # each segment's first node, from base
        last_ix = first_ix + split
        total = int(count.sum())
        n_s = np.empty(total, dtype=np.int64)
        n_d = np.empty(total, dtype=np.int64)
        n_e = np.empty(total, dtype=np.int64)
        n_w = np.zeros(total, dtype=bool)
        n_s[first_ix] = sa
        n_d[first_ix] = sb - sa
        n_e[first_ix] = ev
        n_e[last_ix] = ev
        if split_at:
            ks = np.asarray(list(split_at), dtype=np.int64)
            rel = np.asarray([t for _, t in split_at.values()], dtype=np.int64)
            n_d[first_ix[ks]] = 0
            n_w[first_ix[ks]] = True
            n_s[last_ix[ks]] = rel
            n_d[last_ix[ks]] = sb[ks] - rel
            for k, (d, _t) in split_at.items():
                (drain_waits if k in drains else sync_waits).append((d, base + int(last_ix[k])))
            edge_chunks.append(np.stack([base + first_ix[ks], base + last_ix[ks],
                                         np.full(len(ks), host_order), np.zeros(len(ks), dtype=np.int64)], axis=1))
        if m > 1:
            edge_chunks.append(np.stack([base + last_ix[:-1], base + first_ix[1:], np.full(m - 1, host_order),
                                         np.zeros(m - 1, dtype=np.int64)], axis=1))
        n_start.extend(n_s.tolist())
        n_dur.extend(n_d.tolist())
        n_event.extend(n_e.tolist())
        n_device.extend([False] * total)
        n_thread.extend([tid] * total)
        n_wait.extend(n_w.tolist())
        ids = (base + first_ix).tolist()
        for i, v in zip(reversed(ev), reversed(ids), strict=True):
            first_of_event[i] = v  # the event's first segment wins
        thread_nodes[tid] = (starts, ends, ids)
        seg_last[tid] = (ends, (base + last_ix).tolist())
        if tid == lead:
            main_segs = (starts, ends, ids)
    # task queue: the k-th enqueue (any thread) is the k-th dequeue's work (torch_npu: the Python and
    # autograd threads enqueue, the task-queue thread dequeues and launches)
    queued = [i for i, k in enumerate(w.kind) if k == "queue" and i in first_of_event]
    enq = sorted((i for i in queued if w.name[i].startswith("Enqueue")), key=lambda i: ws[i])
    deq = sorted((i for i in queued if w.name[i].startswith("Dequeue")), key=lambda i: ws[i])
    fed: set[int] = set()  # nodes that start a dequeue: their enqueue is what they wait for
    for e_, d_ in zip(enq, deq, strict=False):
        if int(w.start[e_]) <= int(w.start[d_]) and w.tid[e_] != w.tid[d_]:
            edges.append((first_of_event[e_], first_of_event[d_], _CODE[EdgeKind.THREAD_HAND_OFF], True))
            fed.add(first_of_event[d_])
    # thread hand-off: a helper thread waking up starts at an offset into the main thread's segment then
    # (a dequeue waits for its enqueue instead)
    if main_segs is not None:
        for tid, (starts, ends, ids) in thread_nodes.items():
            if tid == lead:
                continue
            for k, (a, v) in enumerate(zip(starts, ids, strict=True)):
                if k and ends[k - 1] >= a or v in fed:
                    continue
                p = bisect.bisect_right(main_segs[0], a) - 1
                if p >= 0 and main_segs[0][p] <= a:
                    edges.append((main_segs[2][p], v, _CODE[EdgeKind.THREAD_HAND_OFF], True))
    edges += _host_comm_waits(w, thread_nodes, seg_last)
    # device tasks (communication ops that only span their tasks on another lane are left out)
    containers = _containers(w, st.dev_all)
    node_of_task: dict[int, int] = {}
    inside = {t for ts in containers.values() for t in ts}
    for i in st.dev_all:
        if i in containers:
            continue
        node_of_task[i] = nodes.add(ws[i], we[i], i, True, None)
    for key, (ends, ix) in st.stream_ends.items():
        for i in ix:
            if i not in node_of_task:
                continue
            s = ws[i]
            p = bisect.bisect_right(ends, s) - 1
            while p >= 0 and (ix[p] == i or ix[p] not in node_of_task):
                p -= 1
            prev_task = ix[p] if p >= 0 else None
            if prev_task is not None:
                edges.append((node_of_task[prev_task], node_of_task[i], _CODE[EdgeKind.STREAM_ORDER], False))
            launch = st.launch_of.get(w.corr[i]) if w.corr[i] is not None else None
            launch_t = None
            if launch is not None and launch in first_of_event and ws[launch] <= s:
                edges.append((first_of_event[launch], node_of_task[i], _CODE[EdgeKind.LAUNCH], True))
                launch_t = min(we[launch], s)
            prev_end = we[prev_task] if prev_task is not None else None
            after = w.start_ns
            if launch_t is not None and launch_t > after:
                after = launch_t
            if prev_end is not None and prev_end > after:
                after = prev_end
            if s <= after or i in inside:
                continue
            waited, infer = sy.recorded_wait(i, prev_task, after, s) if sy.recorded else (None, True)
            kind = EdgeKind.RECORDED_EVENT_WAIT
            if waited is None and infer:
                waited = last_end_in(w, st.comm_vals, st.comm_sorted, after, s, key)
                kind = EdgeKind.COMMUNICATION_COMPLETION
                if waited is None and w.kind[i] == "comm":
                    waited = last_end_in(w, st.comp_vals, st.comp_sorted, after, s, key)
                    kind = EdgeKind.COMPUTATION_COMPLETION
            if waited is not None and waited in node_of_task:
                edges.append((node_of_task[waited], node_of_task[i], _CODE[kind], False))
    # a container's launch goes to the first of its tasks
    for c, tasks in containers.items():
        launch = st.launch_of.get(w.corr[c]) if w.corr[c] is not None else None
        if launch is not None and launch in first_of_event and tasks:
            t0 = min(tasks, key=lambda t: int(w.start[t]))
            if int(w.start[launch]) <= int(w.start[t0]):
                edges.append((first_of_event[launch], node_of_task[t0], _CODE[EdgeKind.LAUNCH], True))
    # sync waits: the releasing task's node; a queue drain: the node that ends the last dequeue
    edges += [(node_of_task[d], v, _CODE[EdgeKind.SYNC_WAIT], False) for d, v in sync_waits if d in node_of_task]
    for d, v in drain_waits:
        ends_d, last_d = seg_last.get(w.tid[d], ([], []))
        p = bisect.bisect_left(ends_d, we[d])
        if p < len(ends_d) and ends_d[p] == we[d]:
            edges.append((last_d[p], v, _CODE[EdgeKind.SYNC_WAIT], False))
    sink = [dev or th_ == lead for dev, th_ in zip(nodes.device, nodes.thread, strict=True)]
    if edges:
        edge_chunks.append(np.asarray(edges, dtype=np.int64))
    return _finish(rank, step, w, nodes, edge_chunks, {c: [node_of_task[t] for t in ts] for c, ts in containers.items()},
                   sink)


#: framework operators that read a device value on the host, so block until it is computed (PyTorch's
#: ``.item()``, ``nonzero`` ...): blocking calls of their own where no blocking runtime call is recorded in them
HOST_SYNC_OPS_RE = re.compile(r"^aten::(item|_local_scalar_dense|nonzero|is_nonzero)$")


def _host_sync_ops(w: Window, calls: set[int]) -> set[int]:
    """The host operators of :data:`HOST_SYNC_OPS_RE` with none of the blocking runtime ``calls`` inside
    them on their thread (where one is, that call is where the host waited)."""
    ops = [i for i in range(w.n) if w.kind[i] == "host_op" and not w.device[i] and HOST_SYNC_OPS_RE.match(w.name[i] or "")]
    if not ops:
        return set()
    by_tid: dict[Any, list[int]] = defaultdict(list)
    for c in calls:
        by_tid[w.tid[c]].append(int(w.start[c]))
    for v in by_tid.values():
        v.sort()
    out = set()
    for i in ops:
        starts = by_tid.get(w.tid[i], [])
        p = bisect.bisect_left(starts, int(w.start[i]))
        if p < len(starts) and starts[p] < int(w.end[i]):
            continue
        out.add(i)
    return out


def _host_comm_waits(w: Window, thread_nodes: dict[str, tuple[list[int], list[int], list[int]]],
                     seg_last: dict[str, tuple[list[int], list[int]]]) -> list[tuple[int, int, int, bool]]:
    """Host collective completion: a thread that resumes after an idle gap in which a host collective
    of another thread of the step ended (gloo / MPI run their collectives on work threads; the caller
    waits for them, e.g. DDP before the optimizer) waits for the one that ended last in the gap
    (inferred from timing, as on the device)."""
    comm = sorted((int(w.end[i]), i) for i in range(w.n)
                  if w.kind[i] == "comm" and not w.device[i] and w.tid[i] in thread_nodes)
    if not comm:
        return []
    comm_end = [e for e, _ in comm]
    code = _CODE[EdgeKind.COMMUNICATION_COMPLETION]
    out: list[tuple[int, int, int, bool]] = []
    for tid, (starts, ends, ids) in thread_nodes.items():
        for k in range(1, len(starts)):
            a, b = ends[k - 1], starts[k]
            if b <= a:
                continue
            p = bisect.bisect_right(comm_end, b) - 1
            while p >= 0 and comm_end[p] > a and w.tid[comm[p][1]] == tid:
                p -= 1
            if p < 0 or comm_end[p] <= a:
                continue
            i = comm[p][1]
            c_ends, c_last = seg_last[w.tid[i]]
            q = bisect.bisect_left(c_ends, comm_end[p])
            if q < len(c_ends) and c_ends[q] == comm_end[p]:
                out.append((c_last[q], ids[k], code, False))
    return out


def _containers(w: Window, dev_all: list[int]) -> dict[int, list[int]]:
    """Communication ops with a launch link that span communication tasks without one recorded on
    another lane (Ascend ``hcom_*`` ops over their HCCL tasks): op -> its tasks."""
    ops = [i for i in dev_all if w.kind[i] == "comm" and w.corr[i] is not None]
    tasks = sorted((i for i in dev_all if w.kind[i] == "comm" and w.corr[i] is None), key=lambda i: int(w.start[i]))
    if not ops or not tasks:
        return {}
    t_start = [int(w.start[i]) for i in tasks]
    out: dict[int, list[int]] = {}
    for o in ops:
        a, b = int(w.start[o]), int(w.end[o])
        lane = (w.tid[o], w.stream[o])
        inner = [t for t in tasks[bisect.bisect_left(t_start, a):bisect.bisect_right(t_start, b)]
                 if int(w.end[t]) <= b and (w.tid[t], w.stream[t]) != lane]
        if inner:
            out[o] = inner
    return out


def _finish(rank: int, step: int | None, w: Window, nodes: _Nodes, edges: list[np.ndarray],
            containers: dict[int, list[int]], sink: list[bool]) -> Graph:
    """Nodes sorted by measured start (waits before the work that starts with them), edges renumbered,
    and each edge's delay: on the edge that bound its node, the time from its point to the node's
    start; zero elsewhere."""
    start = np.asarray(nodes.start, dtype=np.int64)
    dur = np.asarray(nodes.dur, dtype=np.int64)
    n = len(start)
    order = np.lexsort((np.arange(n), ~np.asarray(nodes.wait, dtype=bool), start))
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[order] = np.arange(n)
    if edges:
        e = np.concatenate(edges)
        src, dst, kind, fs = rank_of[e[:, 0]], rank_of[e[:, 1]], e[:, 2], e[:, 3].astype(bool)
    else:
        src = dst = kind = np.empty(0, dtype=np.int64)
        fs = np.empty(0, dtype=bool)
    start, dur = start[order], dur[order]
    # an edge pointing backwards in the order contradicts the timestamps: dropped (it cannot bind)
    fwd = src < dst
    src, dst, kind, fs = src[fwd], dst[fwd], kind[fwd], fs[fwd]
    by = np.lexsort((src, dst))
    src, dst, kind, fs = src[by], dst[by], kind[by], fs[by]
    point = np.where(fs, start[src], start[src] + dur[src])
    slack = start[dst] - point
    delay = np.zeros(len(src), dtype=np.int64)
    if len(src):
        # the binding edge of each node: the one whose point is latest (first such in edge order)
        last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last, dst, point)
        bind = np.flatnonzero(point == last[dst])
        _, firsts = np.unique(dst[bind], return_index=True)  # one binding edge per node: its first
        keep = bind[firsts]
        delay[keep] = np.maximum(slack[keep], 0)
        bound_by = np.full(n, -1, dtype=np.int64)
        bound_by[dst[keep]] = keep
    else:
        bound_by = np.full(n, -1, dtype=np.int64)
    ev = np.asarray(nodes.event, dtype=np.int64)[order]
    dev = np.asarray(nodes.device, dtype=bool)[order]
    thread = [nodes.thread[i] for i in order]
    snk = np.asarray(sink, dtype=bool)[order]
    if n and not snk.any():
        snk[:] = True
    last_end = int((start + dur)[snk].max()) if n else w.start_ns
    g = Graph(rank=rank, step=step, start_ns=w.start_ns, end_ns=w.end_ns, w=w, start=start, dur=dur, event=ev,
              device=dev, thread=thread, src=src, dst=dst, etype=kind, from_start=fs, delay=delay,
              tail=max(w.end_ns - last_end, 0), sink=snk,
              containers={c: [int(rank_of[t]) for t in ts] for c, ts in containers.items()}, bind=bound_by)
    return g


def carried(g: Graph) -> dict[str, int]:
    """How the measured step is carried along its binding chain (ns), walked back from the work that ends
    last: ``work`` (node durations on the chain), ``gap:<edge kind>`` (the fixed delays of the edges on
    it: time the replay keeps whatever a change does upstream), ``head`` (window start to the chain's
    first node) and ``tail`` (last work to the step's end). The parts sum to the step's length when the
    no-change replay reproduces it; the gaps are what the dependencies do not explain."""
    out: dict[str, int] = defaultdict(int)
    if not g.n:
        out["tail"] = g.length
        return dict(out)
    ends = g.start + g.dur
    v = int(np.flatnonzero(g.sink)[np.argmax(ends[g.sink])])
    count_dur = True
    bind = g.bind if g.bind is not None else np.full(g.n, -1, dtype=np.int64)
    while True:
        if count_dur:
            out["work"] += int(g.dur[v])
        e = int(bind[v])
        if e < 0:
            out["head"] += int(g.start[v]) - g.start_ns
            break
        out[f"gap:{EDGE_KINDS[int(g.etype[e])].value}"] += int(g.delay[e])
        count_dur = not bool(g.from_start[e])
        v = int(g.src[e])
    out["tail"] += g.tail
    return dict(out)


# -- replay ---------------------------------------------------------------------------------


def replay(g: Graph, dur: np.ndarray | None = None, keep: np.ndarray | None = None,
           hold: dict[int, int] | None = None, delays: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Forward list scheduling: each node's (start, end) replayed, with durations ``dur`` (default:
    measured) and only the edges ``keep`` (default: all). A node with no predecessor keeps its measured
    start. ``hold``: nodes that end no earlier than a given time (ns; a collective held until its last
    member has arrived and transferred, :func:`cluster_replay`); ``delays``: the edges' delays (default:
    measured, :func:`gap_delays`)."""
    d = (g.dur if dur is None else dur).tolist()
    s0 = g.start.tolist()
    src, dst, fs, delay = g.src, g.dst, g.from_start, g.delay if delays is None else delays
    if keep is not None:
        src, dst, fs, delay = src[keep], dst[keep], fs[keep], delay[keep]
    n = g.n
    ptr = np.searchsorted(dst, np.arange(n + 1)).tolist()
    src_l, fs_l, delay_l = src.tolist(), fs.tolist(), delay.tolist()
    start = [0] * n
    end = [0] * n
    for v in range(n):
        lo, hi = ptr[v], ptr[v + 1]
        if hi - lo == 1:  # most nodes: one predecessor
            s = (start[src_l[lo]] if fs_l[lo] else end[src_l[lo]]) + delay_l[lo]
        elif lo == hi:
            s = s0[v]
        else:
            s = -(1 << 62)
            for k in range(lo, hi):
                u = src_l[k]
                t = (start[u] if fs_l[k] else end[u]) + delay_l[k]
                if t > s:  # noqa: PLR1730 -- cheaper than a call in this loop
                    s = t
        start[v] = s
        end[v] = s + d[v]
        if hold and v in hold and hold[v] > end[v]:
            end[v] = hold[v]
    return np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)


def step_length(g: Graph, end: np.ndarray) -> int:
    """The replayed step (ns): from the window's start to the latest replayed end, plus the tail."""
    if not len(end):
        return g.length
    return int(end[g.sink].max()) + g.tail - g.start_ns


def reproduction_error(g: Graph) -> float:
    """|replayed − measured| / measured of the no-change replay."""
    _, end = replay(g)
    return abs(step_length(g, end) - g.length) / g.length if g.length > 0 else 0.0


# -- changes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Select:
    """Which events of a window a change applies to: all of these that are given must hold.

    ``kinds`` event kinds (``not_kinds`` not these); ``names`` exact names; ``name_re`` / ``not_name_re`` regular expressions
    on the name; ``at`` these recorded events, each by (name, start ns); ``device`` host (False) or device
    (True) events; ``tids`` events of these threads (host thread ids); ``not_inside``: not nested in an event of these kinds on their thread; ``outermost``: of the host events these
    conditions select, only those not nested in another of them on their thread; ``max_dur_ns``: then only
    events shorter than this (their time in the window). On host threads a change takes the events nested
    in a selected one with it, unless ``exclusive``: then only the selected events' own segments (where
    one of them is the innermost event running), not those of the events nested in them. ``launched``:
    instead of the selected events, the device tasks launched from inside them (their launch call is a
    selected host event or nested in one)."""

    kinds: tuple[str, ...] = ()
    not_kinds: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    name_re: str | None = None
    not_name_re: str | None = None
    at: tuple[tuple[str, int], ...] = ()
    device: bool | None = None
    tids: tuple[str, ...] = ()
    not_inside: tuple[str, ...] = ()
    outermost: bool = False
    max_dur_ns: int | None = None
    exclusive: bool = False
    launched: bool = False

    def events(self, w: Window) -> np.ndarray:
        """The window's events this selects (a boolean mask)."""
        ok = np.ones(w.n, dtype=bool)
        if self.kinds:
            ok &= np.fromiter((k in self.kinds for k in w.kind), dtype=bool, count=w.n)
        if self.not_kinds:
            ok &= np.fromiter((k not in self.not_kinds for k in w.kind), dtype=bool, count=w.n)
        if self.names:
            names = set(self.names)
            ok &= np.fromiter((nm in names for nm in w.name), dtype=bool, count=w.n)
        if self.at:
            at = set(self.at)
            ok &= np.fromiter(((nm, int(t)) in at for nm, t in zip(w.name, w.start.tolist(), strict=True)),
                              dtype=bool, count=w.n)
        if self.device is not None:
            ok &= np.asarray(w.device, dtype=bool) == self.device
        if self.name_re is not None:
            rx = re.compile(self.name_re)
            ok &= np.fromiter((bool(rx.search(nm or "")) for nm in w.name), dtype=bool, count=w.n)
        if self.not_name_re is not None:
            rx = re.compile(self.not_name_re)
            ok &= np.fromiter((not rx.search(nm or "") for nm in w.name), dtype=bool, count=w.n)
        if self.tids:
            tids = set(self.tids)
            ok &= np.fromiter((t in tids for t in w.tid), dtype=bool, count=w.n)
        if self.not_inside:
            ok &= ~_inside_kinds(w, self.not_inside)
        if self.outermost:
            ok &= ~_nested(w, ok)
        if self.max_dur_ns is not None:
            ok &= (w.end - w.start) < int(self.max_dur_ns)
        return ok


def _inside_kinds(w: Window, kinds: tuple[str, ...]) -> np.ndarray:
    """The host events lying within an event of ``kinds`` on their thread (those events themselves too)."""
    out = np.zeros(w.n, dtype=bool)
    host = ~np.asarray(w.device, dtype=bool)
    outer = host & np.fromiter((k in kinds for k in w.kind), dtype=bool, count=w.n)
    if not outer.any():
        return out
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i in np.flatnonzero(outer).tolist():
        spans[w.tid[i]].append((int(w.start[i]), int(w.end[i])))
    for tid, sp in spans.items():
        sp.sort()
        a = np.asarray([x for x, _ in sp], dtype=np.int64)
        b = np.maximum.accumulate(np.asarray([y for _, y in sp], dtype=np.int64))
        ix = np.flatnonzero(host & np.fromiter((t == tid for t in w.tid), dtype=bool, count=w.n))
        p = np.searchsorted(a, w.start[ix], side="right") - 1
        out[ix] = (p >= 0) & (w.end[ix] <= np.where(p >= 0, b[np.clip(p, 0, None)], 0))
    return out


def _nested(w: Window, among: np.ndarray) -> np.ndarray:
    """The host events of ``among`` (a mask) nested in another of them on their thread: one starting no
    earlier than it whose span reaches past its start, of those starting earlier (longer first on ties)."""
    out = np.zeros(w.n, dtype=bool)
    host = np.flatnonzero(among & ~np.asarray(w.device, dtype=bool))
    by_tid: dict[str, list[int]] = defaultdict(list)
    for i in host.tolist():
        by_tid[w.tid[i]].append(i)
    for ix in by_tid.values():
        ix.sort(key=lambda i: (int(w.start[i]), -int(w.end[i])))
        reach = None
        for i in ix:
            if reach is not None and reach > int(w.start[i]):
                out[i] = True
            reach = int(w.end[i]) if reach is None else max(reach, int(w.end[i]))
    return out


@dataclass(frozen=True)
class Change:
    """One what-if, as data.

    ``action``: ``remove`` (the selected events take no time: host events with everything nested in
    them), ``bound`` (at most ``value`` ns each; per event name ``bounds`` or, on the device, per event
    ``event_bounds``; per event ``at``, host events shrinking with their nested ones in proportion),
    ``scale`` (times ``value``), ``scale_gaps`` (the fixed gaps before the selected nodes, host or device,
    times ``value``: untraced time; with ``max_gap_ns`` only the gaps shorter than that), ``drop_edges``
    (the edges of kind ``edge`` into or out of the selected events' nodes are gone, e.g. a sync's wait: the
    host continues)."""

    action: str
    select: Select
    value: float | None = None
    edge: EdgeKind | None = None
    #: ``bound`` per event name (ns), for events whose bound differs (a collective's transfer time)
    bounds: tuple[tuple[str, int], ...] = ()
    #: ``bound`` per event instance: (name, start ns, bound ns) of selected events (a collective's share
    #: of a merged one's time); a host event's nodes, its nested events' too, shrink in proportion
    at: tuple[tuple[str, int, int], ...] = ()
    #: ``scale`` per event name (device tasks), for events whose factor differs (each kernel to its own roof)
    scales: tuple[tuple[str, float], ...] = ()
    #: ``scale_gaps``: only the gaps shorter than this (ns)
    max_gap_ns: int | None = None
    #: ``bound`` per event (name, measured start ns, at most ns), for events of one name whose bounds differ
    #: one by one (the transfer tasks of several collectives, each at its bytes / a bandwidth)
    event_bounds: tuple[tuple[str, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ("remove", "bound", "scale", "scale_gaps", "drop_edges"):
            raise ValueError(f"unknown change {self.action!r}")
        if self.action == "drop_edges" and self.edge is None:
            raise ValueError("drop_edges needs an edge kind")


def select_nodes(g: Graph, select: Select) -> np.ndarray:
    """The nodes ``select`` names in graph ``g`` (:class:`Select`)."""
    events = select.events(g.w)
    if select.launched:
        host = nodes_of(g, events & ~np.asarray(g.w.device, dtype=bool), select.exclusive)
        code = _CODE[EdgeKind.LAUNCH]
        out = np.zeros(g.n, dtype=bool)
        launch = (g.etype == code) & host[g.src]
        out[g.dst[launch]] = True
        # a communication op's launch reaches its first task: the op's other tasks go with it
        for ts in g.containers.values():
            if out[ts].any():
                out[ts] = True
        return out
    return nodes_of(g, events, select.exclusive)


def nodes_of(g: Graph, events: np.ndarray, exclusive: bool = False) -> np.ndarray:
    """The nodes belonging to the selected events (mask over the window's events): a device task's
    node, a communication op's task nodes, and on host threads every segment inside a selected
    event's span on its thread (its nested events' too; ``exclusive``: only the segments a selected
    event owns itself)."""
    w = g.w
    sel = np.zeros(g.n, dtype=bool)
    if not events.any():
        return sel
    if exclusive:
        own: np.ndarray = (g.event >= 0) & events[np.clip(g.event, 0, None)] | _container_tasks(g, events)
        return own
    on_dev = g.device & (g.event >= 0)
    sel |= on_dev & events[np.clip(g.event, 0, None)]
    sel |= _container_tasks(g, events)
    host_ev = np.flatnonzero(events & ~np.asarray(w.device, dtype=bool))
    if not len(host_ev):
        return sel
    by_thread: dict[str, list[int]] = defaultdict(list)
    for v in np.flatnonzero(~g.device).tolist():
        by_thread[g.thread[v]].append(v)  # type: ignore[index]
    for tid, vs in by_thread.items():
        vs_a = np.asarray(vs, dtype=np.int64)
        s = g.start[vs_a]
        e = s + g.dur[vs_a]
        evs = [i for i in host_ev.tolist() if w.tid[i] == tid]
        if not evs:
            continue
        a = np.asarray([int(w.start[i]) for i in evs], dtype=np.int64)
        b = np.asarray([int(w.end[i]) for i in evs], dtype=np.int64)
        order = np.argsort(a)
        a, b = a[order], np.maximum.accumulate(b[order])
        # a segment is inside a selected event when the latest-starting one before it still covers its end
        p = np.searchsorted(a, s, side="right") - 1
        inside = (p >= 0) & (e <= np.where(p >= 0, b[np.clip(p, 0, None)], 0))
        sel[vs_a[inside]] = True
    return sel


def _container_tasks(g: Graph, events: np.ndarray) -> np.ndarray:
    """The task nodes of the selected communication ops that only span their tasks (:func:`_containers`)."""
    sel = np.zeros(g.n, dtype=bool)
    for c, ts in g.containers.items():
        if events[c]:
            sel[ts] = True
    return sel


def apply(g: Graph, changes: Sequence[Change]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The durations and kept edges after ``changes``; and the nodes they touch."""
    dur = g.dur.copy()
    keep: np.ndarray | None = None
    touched = np.zeros(g.n, dtype=bool)
    for ch in changes:
        sel = select_nodes(g, ch.select)
        touched |= sel
        if ch.action == "remove":
            dur[sel] = 0
        elif ch.action == "bound" and (ch.at or ch.bounds or ch.event_bounds):
            if ch.at:
                _bound_at(g, ch, dur)
            if not (ch.bounds or ch.event_bounds):
                continue
            per = dict(ch.bounds)
            each = {(n, int(t)): int(b) for n, t, b in ch.event_bounds}
            for v in np.flatnonzero(sel & g.device).tolist():
                ev = int(g.event[v])
                b = each.get((g.w.name[ev], int(g.w.start[ev])), per.get(g.w.name[ev]))
                if b is not None:
                    dur[v] = min(int(dur[v]), max(int(b), 0))
        elif ch.action == "bound":
            dur[sel] = np.minimum(dur[sel], int(ch.value or 0))
        elif ch.action == "scale" and ch.scales:
            factor = dict(ch.scales)
            for v in np.flatnonzero(sel & g.device).tolist():
                f = factor.get(g.w.name[int(g.event[v])])
                if f is not None:
                    dur[v] = round(int(dur[v]) * float(f))
        elif ch.action == "scale":
            dur[sel] = np.round(dur[sel] * float(ch.value if ch.value is not None else 1.0)).astype(np.int64)
        elif ch.action == "scale_gaps":
            pass  # see gap_delays
        else:
            code = _CODE[ch.edge]  # type: ignore[index]
            drop = (g.etype == code) & (sel[g.dst] | sel[g.src])
            keep = ~drop if keep is None else keep & ~drop
    return dur, keep, touched


def _bound_at(g: Graph, ch: Change, dur: np.ndarray) -> None:
    """Apply ``ch.at``: each listed event (among those ``ch.select`` selects) takes at most its bound."""
    w = g.w
    per = {(nm, int(s)): int(b) for nm, s, b in ch.at}
    chosen = ch.select.events(w)
    for i in np.flatnonzero(chosen).tolist():
        b = per.get((str(w.name[i]), int(w.start[i])))
        if b is None:
            continue
        one = np.zeros(w.n, dtype=bool)
        one[i] = True
        vs = nodes_of(g, one)
        if w.device[i]:
            dur[vs] = np.minimum(dur[vs], max(b, 0))
            continue
        span = int(w.end[i]) - int(w.start[i])
        if span > b:
            dur[vs] = np.round(dur[vs] * (max(b, 0) / span)).astype(np.int64)


def gap_delays(g: Graph, changes: Sequence[Change]) -> np.ndarray | None:
    """The edges' delays after the ``scale_gaps`` changes (None: as measured)."""
    delay: np.ndarray | None = None
    for ch in changes:
        if ch.action != "scale_gaps":
            continue
        sel = select_nodes(g, ch.select)
        delay = g.delay.copy() if delay is None else delay
        on = sel[g.dst]
        if ch.max_gap_ns is not None:
            on &= g.delay < int(ch.max_gap_ns)
        delay[on] = np.round(delay[on] * float(ch.value if ch.value is not None else 1.0)).astype(np.int64)
    return delay


def saving(g: Graph, changes: Sequence[Change]) -> int:
    """Measured step − replayed step with ``changes`` (ns)."""
    dur, keep, _ = apply(g, changes)
    _, end = replay(g, dur, keep, delays=gap_delays(g, changes))
    return g.length - step_length(g, end)


# -- per rank and step ----------------------------------------------------------------------


@dataclass
class StepResult:
    """One (rank, step): its measured step, the no-change replay's error, the replayed saving."""

    rank: int
    step: int | None
    measured_ns: int
    error: float
    saving_ns: int | None
    touched: bool
    #: why the step's saving is not estimated although it reproduces (None: it is, or it does not reproduce)
    reason: str | None = None
    #: the step was not replayed: its events exceed the rule's replay budget (no graph was built)
    over_budget: bool = False

    @property
    def reproduced(self) -> bool:
        return self.error <= REPRODUCE_WITHIN


GRAPHS_KEY = "replay_graphs"

#: the events one rule's replays may read in an analysis: this share of the profile's events, and at
#: least BUDGET_FLOOR (a replay costs a few times what loading and analysing the same events does, so
#: a share of a few percent keeps it a small part of the analysis); a shard of a larger profile gets
#: its share of the floor, or the floor would be paid once per shard
BUDGET_SHARE = 0.05
BUDGET_FLOOR = 100_000
#: the analysis' extras key holding its share of the profile's bytes (a shard's; 1.0: the whole profile)
PART_KEY = "replay_part_of_profile"
#: why a step is not replayed when its events do not fit the rule's budget
OVER_BUDGET = "its events exceed the replay's budget ({need:,} events, {left:,} left of {limit:,}): not replayed"


class Budget:
    """The events one rule may still replay. A window is charged whether or not another rule built its
    graph already, so what a rule replays never depends on the order the rules ran in."""

    def __init__(self, limit: int) -> None:
        self.limit = self.left = int(limit)

    def take(self, need: int) -> bool:
        """Charge ``need`` events if they fit."""
        if need > self.left:
            return False
        self.left -= need
        return True

    def refusal(self, need: int) -> str:
        return OVER_BUDGET.format(need=need, left=self.left, limit=self.limit)


def budget_for(cur: Any, cache: dict[Any, Any]) -> Budget:
    """A new rule budget for the analysis whose events ``cur`` reads (their count read once)."""
    n = cache.get("replay_events")
    if n is None:
        n = cache["replay_events"] = int(cur.execute("SELECT count(*) FROM events").fetchone()[0])
    return Budget(max(int(BUDGET_FLOOR * float(cache.get(PART_KEY, 1.0))), int(BUDGET_SHARE * n)))


def window_events(cur: Any, cache: dict[Any, Any], rank: int, windows: Sequence[tuple[int | None, int, int]]) -> list[int]:
    """How many of the rank's events overlap each window (step, start_ns, end_ns), counted once per analysis."""
    store = cache.setdefault("replay_window_events", {})
    need = [(a, b) for _s, a, b in windows if (rank, a, b) not in store]
    if need:
        rows = cur.execute(
            "SELECT w.i, count(e.start_ns) FROM (SELECT unnest($a) AS a, unnest($b) AS b, "
            "unnest(range(len($a))) AS i) w LEFT JOIN events e ON e.rank = $rank AND e.start_ns < w.b "
            "AND e.start_ns + greatest(e.dur_ns, 0) > w.a GROUP BY w.i",
            {"a": [a for a, _ in need], "b": [b for _, b in need], "rank": int(rank)}).fetchall()
        got = {int(i): int(n) for i, n in rows}
        for i, (a, b) in enumerate(need):
            store[(rank, a, b)] = got.get(i, 0)
    return [int(store[(rank, a, b)]) for _s, a, b in windows]


def graphs(cur: Any, cache: dict[Any, Any], rank: int, windows: Iterable[tuple[int | None, int, int]]) -> list[Graph]:
    """The graphs of a rank's windows (step, start_ns, end_ns), built once per analysis in ``cache``."""
    store = cache.setdefault(GRAPHS_KEY, {})
    wins = list(windows)
    need = [(step, a, b) for step, a, b in wins if (rank, step, a, b) not in store]
    if need:  # the rank's windows read in one query, its sync records in another
        read = read_windows(cur, rank, [(a, b) for _, a, b in need])
        syncs = rank_sync_rows(cur, rank) if any(w is not None for w in read) else []
        for (step, a, b), w in zip(need, read, strict=True):
            store[(rank, step, a, b)] = None if w is None else graph_of(cur, rank, step, w, syncs)
    return [store[(rank, step, a, b)] for step, a, b in wins if store[(rank, step, a, b)] is not None]


def what_if(gs: Sequence[Graph], changes: Sequence[Change]) -> list[StepResult]:
    """Each graph replayed without and with ``changes``."""
    out = []
    for g in gs:
        err = _error(g)
        dur, keep, touched = apply(g, changes)
        if touched.any() and not (touched & g.device).any() and g.device.any() and not launch_linked(g):
            out.append(StepResult(g.rank, g.step, g.length, err, None, True, NO_LAUNCH_LINKS))
            continue
        if touched.any() or keep is not None:
            _, end = replay(g, dur, keep, delays=gap_delays(g, changes))
            sv: int | None = g.length - step_length(g, end)
        else:
            sv = 0
        out.append(StepResult(g.rank, g.step, g.length, err, sv, bool(touched.any())))
    return out


#: why a host change is not replayed in a window whose device tasks carry no launch links
NO_LAUNCH_LINKS = ("the device tasks carry no launch links: which device work waits for the host calls the change "
                   "moves is not known")


def launch_linked(g: Graph) -> bool:
    """Whether some device task of the graph is linked to the host call that launched it."""
    return bool((g.etype == _CODE[EdgeKind.LAUNCH]).any())


def _error(g: Graph) -> float:
    err = getattr(g, "_error", None)
    if err is None:
        err = reproduction_error(g)
        g._error = err  # type: ignore[attr-defined]
    return float(err)


def summary(results: Sequence[StepResult], assumption: str) -> dict[str, Any]:
    """The finding's ``replay`` object: the mean replayed saving per step over the steps that
    reproduce, the assumption in words, whether every step reproduced and the largest error; or
    ``estimated: false`` with the reason when no step reproduces."""
    if not results:
        return {"estimated": False, "reason": "no step window with events to replay"}
    good = [r for r in results if r.reproduced and r.saving_ns is not None]
    worst = max(r.error for r in results)
    why = sorted({r.reason for r in results if r.reason})
    if not good and why:
        return {"estimated": False, "assumption": assumption, "reproduced": all(r.reproduced for r in results),
                "reproduction_error": round(worst, 4), "reason": "; ".join(why)}
    if not good:
        return {"estimated": False, "assumption": assumption, "reproduced": False,
                "reproduction_error": round(worst, 4),
                "reason": f"no step's replay reproduces the measured step within {REPRODUCE_WITHIN:.0%} "
                          f"(worst error {worst:.1%})"}
    saving_us = sum(r.saving_ns for r in good) / len(good) / 1000.0  # type: ignore[misc]
    step_us = sum(r.measured_ns for r in good) / len(good) / 1000.0
    out = {"estimated": True, "saving_us": round(max(saving_us, 0.0), 3),
           "saving_fraction": round(max(saving_us, 0.0) / step_us, 4) if step_us > 0 else None,
           "assumption": assumption, "reproduced": len(good) == len(results),
           "reproduction_error": round(worst, 4), "steps": len(results), "steps_replayed": len(good)}
    if why and len(good) < len(results):
        out["reason"] = "; ".join(why)  # why the other steps were not replayed
    return out


# -- across ranks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Collective:
    """One collective instance matched across the ranks of its group: its node on each member
    (``members``: (rank, node) pairs) and its transfer time (ns)."""

    members: tuple[tuple[int, int], ...]
    transfer_ns: int


def collectives_of(gs: dict[int, Graph]) -> list[Collective]:
    """The collectives of one step's graphs (rank -> graph) matched across ranks: the k-th device
    communication node of a name on each rank is one instance (the order matching COM001 uses where
    names carry no sequence number); its transfer time is the shortest member's duration (the member that
    arrived last waited for nobody). A collective recorded as several tasks (Ascend: an ``hcom_*`` op over
    its HCCL tasks, some of them local waits that end before a peer arrives) is not joined: which of its
    tasks waits for the peers the export does not say, so its tasks keep their measured times."""
    per: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for rank, g in gs.items():
        inner = {t for ts in g.containers.values() for t in ts}
        seen: dict[str, int] = defaultdict(int)
        for v in range(g.n):
            if not g.device[v] or v in inner:
                continue
            ev = int(g.event[v])
            if g.w.kind[ev] != "comm":
                continue
            name = str(g.w.name[ev])
            per[(name, seen[name])].append((rank, v))
            seen[name] += 1
    out = []
    for members in per.values():
        if len({r for r, _ in members}) >= 2:
            out.append(Collective(tuple(members), min(int(gs[r].dur[v]) for r, v in members)))
    return out


def cluster_replay(gs: dict[int, Graph], colls: Sequence[Collective],
                   changes: dict[int, Sequence[Change]] | None = None, max_rounds: int = 16) -> dict[int, int]:
    """Each rank's replayed step (ns) with the ranks joined by their collectives: a member's collective
    lasts its transfer time and ends no earlier than the last member's arrival (its replayed start) plus
    that transfer. ``changes`` per rank. Replayed rank by rank until the collectives' ends settle (each
    round can only delay them; ``max_rounds`` bounds it). A change on one rank thus reaches its peers
    through the collectives it shortens or delays."""
    changes = changes or {}
    base: dict[int, tuple[np.ndarray, np.ndarray | None, np.ndarray | None]] = {}
    for rank, g in gs.items():
        dur, keep, _ = apply(g, changes.get(rank, ()))
        for c in colls:
            for r, v in c.members:
                if r == rank:
                    dur[v] = min(int(dur[v]), c.transfer_ns)
        base[rank] = (dur, keep, gap_delays(g, changes.get(rank, ())))
    holds: dict[int, dict[int, int]] = {r: {} for r in gs}
    ends: dict[int, np.ndarray] = {}
    for _ in range(max_rounds):
        starts: dict[int, np.ndarray] = {}
        for rank, g in gs.items():
            starts[rank], ends[rank] = replay(g, base[rank][0], base[rank][1], holds[rank], base[rank][2])
        new: dict[int, dict[int, int]] = {r: {} for r in gs}
        for c in colls:
            release = max(int(starts[r][v]) for r, v in c.members) + c.transfer_ns
            for r, v in c.members:
                new[r][v] = release
        if new == holds:
            break
        holds = new
    return {rank: step_length(g, ends[rank]) for rank, g in gs.items()}


def cluster_saving(gs: dict[int, Graph], changes: dict[int, Sequence[Change]]) -> tuple[int, int]:
    """The cluster's step (its slowest rank) replayed joined with no change, less with ``changes``; and the
    no-change cluster step (ns), to compare with the measured one."""
    colls = collectives_of(gs)
    before = max(cluster_replay(gs, colls).values())
    after = max(cluster_replay(gs, colls, changes).values())
    return before - after, before


def own_times(gs: dict[int, Graph], colls: Sequence[Collective]) -> dict[int, int]:
    """Each rank's own time (ns): from its window's start to its last work's end, less the time inside its
    joined collectives (where it waits for the others and transfers)."""
    inside: dict[int, int] = defaultdict(int)
    for c in colls:
        for r, v in c.members:
            inside[r] += int(gs[r].dur[v])
    return {r: g.length - g.tail - inside[r] for r, g in gs.items()}


def straggler_factor(gs: dict[int, Graph], colls: Sequence[Collective], rank: int) -> float | None:
    """The peers' median own time over rank ``rank``'s (:func:`own_times`); None when the rank is not slower
    than that median or has no peers."""
    own = own_times(gs, colls)
    peers = sorted(v for r, v in own.items() if r != rank)
    if not peers or own.get(rank, 0) <= 0:
        return None
    m = len(peers) // 2
    median = peers[m] if len(peers) % 2 else (peers[m - 1] + peers[m]) / 2
    return median / own[rank] if median < own[rank] else None


def straggler_changes(gs: dict[int, Graph], colls: Sequence[Collective], rank: int) -> dict[int, Sequence[Change]]:
    """The counterfactual of a straggler: rank ``rank`` runs at its peers' median speed. A rank's own time
    is its work less the time inside its collectives (:func:`own_times`); the straggler's own time, its
    work other than communication and the fixed gaps between its nodes alike, is scaled by the peers'
    median own time over its own, never lengthened."""
    f = straggler_factor(gs, colls, rank)
    if f is None:
        return {}
    return {rank: (Change("scale", Select(not_kinds=("comm",)), value=f),
                   Change("scale_gaps", Select(), value=f))}
