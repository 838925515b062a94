"""Canonical-row fixtures for the parallel and cluster rules (PAR*, CLU*).

Every profile here is synthetic and small; the planted magnitudes are written next to each
function, and every number asserted in tests/rules/cases/PAR*.toml / CLU*.toml is computed by
hand from them (the comments show the arithmetic). Times in the helpers are milliseconds and
are converted to integer ns.

Device ranks: a host ``ProfilerStep#N`` marker per step (contiguous, so step windows tile the
timeline), device kernels (kind ``kernel``) and device communication (kind ``comm``), plus a
``comm_ops`` row per communication kernel where the rule needs groups.
"""

from __future__ import annotations

from typing import Any

MS = 1_000_000
T0 = 1_000_000_000_000  # an arbitrary epoch-ns origin


def _ns(ms: float) -> int:
    return round(ms * MS)


def _step_marker(rank: int, step: int, start_ms: float, dur_ms: float) -> dict[str, Any]:
    return {"rank": rank, "kind": "step", "name": f"ProfilerStep#{step}", "cat": "user_annotation",
            "device": False, "tid": "1", "start_ns": T0 + _ns(start_ms), "dur_ns": _ns(dur_ms)}


def _dev(rank: int, kind: str, name: str, start_ms: float, dur_ms: float, stream: int = 7,
         corr: int | None = None) -> dict[str, Any]:
    return {"rank": rank, "kind": kind, "name": name, "cat": "kernel", "device": True, "pid": "0", "tid": f"stream {stream}",
            "stream": stream, "start_ns": T0 + _ns(start_ms), "dur_ns": _ns(dur_ms), "corr": corr}


def _comm_op(rank: int, step: int, group: str, start_ms: float, dur_ms: float, op_type: str = "allreduce",
             nbytes: int = 64 << 20, wait_ms: float | None = None) -> dict[str, Any]:
    return {"rank": rank, "step": step, "name": f"hcom_{op_type}_{step}", "op_type": op_type, "group_name": group,
            "start_ns": T0 + _ns(start_ms), "dur_ns": _ns(dur_ms), "bytes": nbytes,
            "wait_ns": None if wait_ms is None else _ns(wait_ms)}


# ---------------------------------------------------------------------------------------------
# CLU001 slow rank
# ---------------------------------------------------------------------------------------------

JITTER_MS = (10.0, 10.2, 9.8, 10.1, 9.9, 10.3, 9.7, 10.0)


def _sync_group(compute_ms: dict[int, float], steps: int = 5, step_ms: float = 33.0, comm_end_ms: float = 32.0,
                group: str = "dp0") -> dict[str, list[dict[str, Any]]]:
    """Ranks compute, then all-reduce; the all-reduce of every rank ends at ``comm_end_ms`` (the group meets).

    Per step and rank r: compute kernel [0, c_r), all-reduce [c_r, comm_end), free [comm_end, step_ms).
    So own time (step − not-overlapped comm) = step_ms − (comm_end − c_r) = c_r + 1 ms, and the wait
    of rank r is comm_end − c_r.
    """
    events: list[dict[str, Any]] = []
    comm_ops: list[dict[str, Any]] = []
    for r, c in compute_ms.items():
        for i in range(steps):
            s0 = i * step_ms
            step = i + 1
            events.append(_step_marker(r, step, s0, step_ms))
            events.append(_dev(r, "kernel", "MatMul", s0, c))
            events.append(_dev(r, "comm", "hcom_allReduce", s0 + c, comm_end_ms - c, stream=9))
            comm_ops.append(_comm_op(r, step, group, s0 + c, comm_end_ms - c))
    return {"events": events, "comm_ops": comm_ops}


def slow_rank_group_of_8() -> dict[str, list[dict[str, Any]]]:
    """8 ranks in group dp0; rank 5 computes 30 ms per step, the others 9.7–10.3 ms.

    Rank 5: own = 30 + 1 = 31 ms. Peers' own = c + 1, median of (10.0, 10.2, 9.8, 10.1, 9.9, 10.3, 10.0)
    + 1 = 11.0 ms. Excess = 20.0 ms (ratio 20/11 = 1.82). Peers' wait = 32 − c, median 22.0 ms
    (share 22/33 = 0.667). Saving per step = min(20, 22) = 20 ms of 33 ms = 61 % -> critical.
    """
    c = dict(enumerate(JITTER_MS))
    c[5] = 30.0
    return _sync_group(c)


def healthy_group_of_8() -> dict[str, list[dict[str, Any]]]:
    """8 ranks, compute 9.7–10.3 ms (±3 % jitter): no straggler."""
    return _sync_group(dict(enumerate(JITTER_MS)))


def slow_rank_but_nobody_waits() -> dict[str, list[dict[str, Any]]]:
    """Rank 2 has 3× the own time of ranks 0/1/3 but nobody waits: no communication at all.

    Independent ranks (no collective) cannot hold each other back, so this is not a straggler.
    """
    events: list[dict[str, Any]] = []
    for r, c in {0: 10.0, 1: 10.2, 2: 30.0, 3: 9.8}.items():
        for i in range(5):
            events.append(_step_marker(r, i + 1, i * 33.0, 33.0))
            events.append(_dev(r, "kernel", "MatMul", i * 33.0, c))
    return {"events": events}


# ---------------------------------------------------------------------------------------------
# CLU004 slow group
# ---------------------------------------------------------------------------------------------

def slow_group_of_4() -> dict[str, list[dict[str, Any]]]:
    """4 DP groups of 2 ranks: dp0 {0,1}, dp1 {2,3}, dp2 {4,5}, dp3 {6,7}; each rank computes 10 ms,
    then one all-reduce of 64 MiB per step. All-reduce takes 5.0 / 5.1 / 15.0 / 4.9 ms in dp0..dp3.

    dp2: 15.0 ms vs baseline median of the faster half (4.9, 5.0) = 4.95 ms; with dp1 added the
    baseline is (4.9, 5.0, 5.1), median 5.0 -> excess 10.0 ms per step (3.0×); step = 10 + 15 + 1 = 26 ms
    on dp2's ranks -> 38 % -> critical.
    """
    comm = {0: 5.0, 1: 5.0, 2: 5.1, 3: 5.1, 4: 15.0, 5: 15.0, 6: 4.9, 7: 4.9}
    events: list[dict[str, Any]] = []
    comm_ops: list[dict[str, Any]] = []
    for r, d in comm.items():
        group = f"dp{r // 2}"
        step_ms = 10.0 + d + 1.0
        for i in range(5):
            s0 = i * step_ms
            events.append(_step_marker(r, i + 1, s0, step_ms))
            events.append(_dev(r, "kernel", "MatMul", s0, 10.0))
            events.append(_dev(r, "comm", "hcom_allReduce", s0 + 10.0, d, stream=9))
            comm_ops.append(_comm_op(r, i + 1, group, s0 + 10.0, d))
    return {"events": events, "comm_ops": comm_ops}


def even_groups_of_4() -> dict[str, list[dict[str, Any]]]:
    """Same 4 groups with all-reduce 5.0 / 5.1 / 5.2 / 4.9 ms: no slow group."""
    data = slow_group_of_4()
    for row in data["comm_ops"]:
        if row["group_name"] == "dp2":
            row["dur_ns"] = _ns(5.2)
    return data


def two_groups_only() -> dict[str, list[dict[str, Any]]]:
    """Only dp0 and dp2 of :func:`slow_group_of_4`: fewer than 3 groups, so the rule cannot decide."""
    data = slow_group_of_4()
    keep = {0, 1, 4, 5}
    return {k: [r for r in v if r["rank"] in keep] for k, v in data.items()}


# ---------------------------------------------------------------------------------------------
# CLU002 slow link
# ---------------------------------------------------------------------------------------------

def _links(slow: bool) -> dict[str, list[dict[str, Any]]]:
    """8 ranks, ring of HCCS links within two nodes (0→1→2→3→0, 4→5→6→7→4), 100 MB each over 5.5 ms
    (100e6 B / 5.5e6 ns = 18.18 GB/s), except 5→6 over 16.5 ms (6.06 GB/s, one third) when ``slow``.
    Plus 4 RDMA links 0→4, 4→0, 3→7, 7→3 at 2 GB/s (100 MB / 50 ms): a different transport, never
    compared with HCCS. One step, 60 ms, on every rank.

    Slow link excess: 16.5 − 5.5 = 11.0 ms per step (1 step) of 60 ms -> 18 % -> high.
    """
    events = []
    for r in range(8):
        events.append(_step_marker(r, 1, 0.0, 60.0))
        events.append(_dev(r, "kernel", "MatMul", 0.0, 30.0))
    rows = []
    ring = [(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4)]
    for s, d in ring:
        t = 16.5 if slow and (s, d) == (5, 6) else 5.5
        rows.append({"rank": s, "step": 1, "group_name": "tp", "name": "allreduce-total", "src_rank": s, "dst_rank": d,
                     "transport": "HCCS", "bytes": 100_000_000, "transit_ns": _ns(t), "bandwidth_gbps": 100 / t})
    for s, d in [(0, 4), (4, 0), (3, 7), (7, 3)]:
        rows.append({"rank": s, "step": 1, "group_name": "dp", "name": "allreduce-total", "src_rank": s, "dst_rank": d,
                     "transport": "RDMA", "bytes": 100_000_000, "transit_ns": _ns(50.0), "bandwidth_gbps": 2.0})
    for r in range(8):  # the LOCAL self-link every real matrix has: never a peer
        rows.append({"rank": r, "step": 1, "group_name": "tp", "name": "allreduce-total", "src_rank": r, "dst_rank": r,
                     "transport": "LOCAL", "bytes": 100_000_000, "transit_ns": _ns(500.0), "bandwidth_gbps": 0.2})
    return {"events": events, "comm_matrix": rows}


def slow_link() -> dict[str, list[dict[str, Any]]]:
    """See :func:`_links` (5→6 at one third of the HCCS bandwidth)."""
    return _links(slow=True)


def _with_packets(slow_packets: tuple[float, float]) -> dict[str, list[dict[str, Any]]]:
    """:func:`slow_link` with each rank's Size Distribution of its group "tp" operators over HCCS (the
    ring's links): 10 packets of 10 MB per rank, and on rank 5 (the slow link's sender) ``slow_packets``
    (count, size MB) over its 16.5 ms."""
    data = _links(slow=True)
    rows = []
    for r in range(8):
        n, mb = slow_packets if r == 5 else (10.0, 10.0)
        t = 16.5 if r == 5 else 5.5
        rows.append({"rank": r, "step": 1, "name": "hcom_allReduce__1_1", "group_name": "tp", "transport": "HCCS",
                     "bytes": 100_000_000, "transit_ns": _ns(t), "bandwidth_gbps": 100 / t,
                     "packet_sizes": f'{{"{mb:g}": [{n:g}, {t:g}]}}'})
    data["comm_bandwidth"] = rows
    return data


def slow_link_small_packets() -> dict[str, list[dict[str, Any]]]:
    """:func:`slow_link` where link 5→6 carries its 100 MB as 1,000 packets of 0.1 MB against 10 packets of
    10 MB on the other HCCS links: packets 100x smaller, which alone can make a link up to 100x slower;
    at one third of the others' bandwidth it is not slow beyond its packets."""
    return _with_packets((1000.0, 0.1))


def slow_link_like_packets() -> dict[str, list[dict[str, Any]]]:
    """:func:`slow_link` with the same packets on every link (10 of 10 MB): 5→6 is slow like for like."""
    return _with_packets((10.0, 10.0))


def even_links() -> dict[str, list[dict[str, Any]]]:
    """See :func:`_links` (every HCCS link at 18.18 GB/s; RDMA slower but a different transport)."""
    return _links(slow=False)


# ---------------------------------------------------------------------------------------------
# PAR001 poor overlap
# ---------------------------------------------------------------------------------------------

def _overlap(overlapped: bool, wait_ms: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """2 ranks, 4 steps of 21 ms: compute [0, 10) on stream 7; all-reduce of 10 ms on stream 9.

    Serial (``overlapped=False``): all-reduce [10, 20) -> overlapped 0, comm_only 10 ms (47.6 % of
    the step), compute_only 10 ms; saving = min(10, 10) = 10 ms = 47.6 % -> critical.
    With ``wait_ms`` = 8 (Ascend wait time in communication.json): hideable = 10 × (1 − 0.8) = 2 ms
    -> saving 2 ms = 9.5 % -> medium.
    Overlapped: all-reduce [0.5, 9.5) under compute -> overlap ratio 1, comm_only 0 -> quiet.
    """
    events: list[dict[str, Any]] = []
    comm_ops: list[dict[str, Any]] = []
    for r in (0, 1):
        for i in range(4):
            s0 = i * 21.0
            events.append(_step_marker(r, i + 1, s0, 21.0))
            events.append(_dev(r, "kernel", "MatMul", s0, 10.0))
            cs, cd = (s0 + 0.5, 9.0) if overlapped else (s0 + 10.0, 10.0)
            events.append(_dev(r, "comm", "hcom_allReduce", cs, cd, stream=9))
            comm_ops.append(_comm_op(r, i + 1, "dp", cs, cd, wait_ms=wait_ms))
    return {"events": events, "comm_ops": comm_ops}


def serial_comm() -> dict[str, list[dict[str, Any]]]:
    """See :func:`_overlap` (communication after computation, no wait information)."""
    data = _overlap(False)
    for row in data["comm_ops"]:
        row["wait_ns"] = None
    return data


def serial_comm_mostly_wait() -> dict[str, list[dict[str, Any]]]:
    """See :func:`_overlap` (serial, 8 of the 10 ms are waiting for peers)."""
    return _overlap(False, wait_ms=8.0)


def overlapped_comm() -> dict[str, list[dict[str, Any]]]:
    """See :func:`_overlap` (communication fully under computation)."""
    return _overlap(True)


# ---------------------------------------------------------------------------------------------
# PAR002 pipeline bubble
# ---------------------------------------------------------------------------------------------

def _minimal(rank: int, steps: int, step_ms: float) -> list[dict[str, Any]]:
    out = []
    for i in range(steps):
        out.append(_step_marker(rank, i + 1, i * step_ms, step_ms))
        out.append(_dev(rank, "kernel", "MatMul", i * step_ms, step_ms * 0.5))
    return out


def vendor_bubble() -> dict[str, list[dict[str, Any]]]:
    """Ascend step_trace_time rows, 2 ranks × 3 steps: Stage 70 ms, Bubble 30 ms on rank 0; Stage 98,
    Bubble 2 on rank 1. Bubble share = 30 / (70 + 30) = 0.30 on rank 0 (critical), 0.02 on rank 1 (quiet)."""
    rows = []
    for i in range(3):
        rows.append({"rank": 0, "step": i + 1, "stage_ns": _ns(70.0), "bubble_ns": _ns(30.0), "computing_ns": _ns(60.0)})
        rows.append({"rank": 1, "step": i + 1, "stage_ns": _ns(98.0), "bubble_ns": _ns(2.0), "computing_ns": _ns(90.0)})
    return {"events": _minimal(0, 3, 100.0) + _minimal(1, 3, 100.0), "vendor_steps": rows}


def _kineto_p2p(host_names: tuple[str, str]) -> dict[str, list[dict[str, Any]]]:
    """One device rank, 3 steps of 60 ms. Per step (ms from step start):

    compute [0, 20); idle [20, 25); a transfer launched under host ``host_names[0]`` on the device
    [25, 27); one launched under ``host_names[1]`` [27, 47); compute [47, 60). Both device kernels
    are NCCL ``SendRecv`` kernels, as NCCL names P2P and all-to-all alike.

    With ("nccl:send", "nccl:recv"): bubble = recv 20 ms + idle before the send 5 ms + idle before
    the recv 0 = 25 ms = 41.7 % of 60 ms -> critical. With all-to-all host calls: no P2P -> quiet.
    """
    events: list[dict[str, Any]] = []
    corr = 100
    for i in range(3):
        s0 = i * 60.0
        events.append(_step_marker(0, i + 1, s0, 60.0))
        events.append(_dev(0, "kernel", "fwd_gemm", s0, 20.0))
        for name, (hs, ds, dd) in zip(host_names, ((s0 + 19.0, s0 + 25.0, 2.0), (s0 + 19.5, s0 + 27.0, 20.0)), strict=True):
            corr += 1
            events.append({"rank": 0, "kind": "comm", "name": name, "cat": "user_annotation", "device": False, "tid": "1",
                           "start_ns": T0 + _ns(hs), "dur_ns": _ns(0.4)})
            events.append({"rank": 0, "kind": "runtime", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "device": False,
                           "tid": "1", "start_ns": T0 + _ns(hs + 0.1), "dur_ns": _ns(0.05), "corr": corr})
            events.append(_dev(0, "comm", "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", ds, dd,
                               stream=20, corr=corr))
        events.append(_dev(0, "kernel", "bwd_gemm", s0 + 47.0, 13.0))
    return {"events": events}


def kineto_p2p_bubble() -> dict[str, list[dict[str, Any]]]:
    """See :func:`_kineto_p2p` with nccl:send / nccl:recv."""
    return _kineto_p2p(("nccl:send", "nccl:recv"))


def kineto_all_to_all() -> dict[str, list[dict[str, Any]]]:
    """See :func:`_kineto_p2p` with the same kernels launched by nccl:all_to_all: not a pipeline."""
    return _kineto_p2p(("nccl:all_to_all", "nccl:all_to_all"))


# ---------------------------------------------------------------------------------------------
# Ascend cluster exports from tests/ascend/gen_cluster.py (planted facts in its Scenario table)
# ---------------------------------------------------------------------------------------------

def gen_faults8(out: Any) -> Any:
    """8 ranks, 4 steps: slow rank 3 (compute × 1.6), slow step 3 (40 ms stall), an RDMA transfer
    of 4.5 s in step 2, slow HCCS link 0 → 2 (bandwidth / 8), and other non-cluster faults."""
    from tests.ascend.gen_cluster import generate

    generate("faults8", out)
    return out


def gen_baseline8(out: Any) -> Any:
    """The same 8-rank job without any planted fault (the control)."""
    from tests.ascend.gen_cluster import generate

    generate("baseline8", out)
    return out


def _sync_group_per_step(compute_ms: dict[int, list[float]], step_ms: float = 33.0, comm_end_ms: float = 32.0,
                         group: str = "dp0") -> dict[str, list[dict[str, Any]]]:
    """As :func:`_sync_group`, with rank r computing ``compute_ms[r][i]`` ms in step i + 1."""
    events: list[dict[str, Any]] = []
    comm_ops: list[dict[str, Any]] = []
    for r, cs in compute_ms.items():
        for i, c in enumerate(cs):
            s0 = i * step_ms
            events.append(_step_marker(r, i + 1, s0, step_ms))
            events.append(_dev(r, "kernel", "MatMul", s0, c))
            events.append(_dev(r, "comm", "hcom_allReduce", s0 + c, comm_end_ms - c, stream=9))
            comm_ops.append(_comm_op(r, i + 1, group, s0 + c, comm_end_ms - c))
    return {"events": events, "comm_ops": comm_ops}


def one_slow_step_group_of_8() -> dict[str, list[dict[str, Any]]]:
    """8 ranks, 6 steps; rank 5 computes 30 ms in step 3 only, 10 ms otherwise (the others 9.7-10.3 ms).

    Rank 5's lead over the others' median own time per step is about 0, 0, 20, 0, 0, 0 ms: mean 3.3 ms,
    sample σ 8.2 ms, standard error 8.2 / √6 = 3.3 ms, so the mean is 1 standard error, not 3: one slow
    step, not a straggler (cluster.step_fluctuation reports it).
    """
    c = {r: [v] * 6 for r, v in enumerate(JITTER_MS)}
    c[5] = [10.0, 10.0, 30.0, 10.0, 10.0, 10.0]
    return _sync_group_per_step(c)


def two_slow_ranks_group_of_8() -> dict[str, list[dict[str, Any]]]:
    """8 ranks, 5 steps; ranks 2 and 5 compute 30 ms per step, the other six 9.7-10.3 ms. Both are
    stragglers; neither is the other's peer: the ranks that wait are 0, 1, 3, 4, 6, 7."""
    c = dict(enumerate(JITTER_MS))
    c[2] = 30.0
    c[5] = 30.0
    return _sync_group(c)
