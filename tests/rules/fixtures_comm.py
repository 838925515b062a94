"""Canonical-row fixtures for the communication rules (COM001-COM007).

Each function returns ``{table: [rows]}`` for :func:`advisor.testing.context_from_tables`. The
profiles are Ascend-like (communication.json / communication_matrix.json rows as the canonical
``comm_ops`` / ``comm_bandwidth`` / ``comm_matrix`` tables) or Kineto-like (NCCL kernels in
``comm_ops``, no transit split). Every planted number is written next to the rows, and the
expected values in ``tests/rules/cases/COM*.toml`` are worked out from them by hand there.

Until tests/ascend/gen_cluster.py exists, these rows stand in for a generated cluster export.
"""

from __future__ import annotations

import json
from typing import Any

T0 = 1_700_000_000_000_000_000  # ns, an epoch-like origin
MS = 1_000_000  # ns per ms
STEP_NS = 100 * MS  # every step is 100 ms unless a fixture says otherwise
MB = 1_000_000  # exports use MB = 10^6 bytes here (GB/s = bytes per ns)

Rows = dict[str, list[dict[str, Any]]]


def _base(n_ranks: int, steps: tuple[int, ...] = (1, 2, 3), step_ns: int = STEP_NS, source: str = "ascend_pt",
          compute_ms: dict[int, float] | None = None) -> Rows:
    """Ranks, a ProfilerStep marker per step and one device compute kernel (``MatMulV2``) per step.

    The kernel runs from the step start for ``compute_ms[rank]`` (default 40 ms).
    """
    compute_ms = compute_ms or {}
    ranks = [{"rank": r, "source": source, "world_size": n_ranks, "backend": "hccl" if source != "kineto" else "nccl",
              "has_device": True, "rank_source": "test", "files": ""} for r in range(n_ranks)]
    events: list[dict[str, Any]] = []
    for r in range(n_ranks):
        for s in steps:
            t = T0 + (s - 1) * step_ns
            events.append({"rank": r, "kind": "step", "name": f"ProfilerStep#{s}", "start_ns": t, "dur_ns": step_ns - 1000,
                           "tid": "main"})
            events.append({"rank": r, "kind": "kernel", "name": "MatMulV2", "device": True, "tid": "stream7",
                           "start_ns": t, "dur_ns": int(compute_ms.get(r, 40.0) * MS)})
    return {"ranks": ranks, "events": events}


def _comm_event(rank: int, name: str, start_ns: int, dur_ns: int) -> dict[str, Any]:
    return {"rank": rank, "kind": "comm", "name": name, "device": True, "tid": "hccl", "start_ns": start_ns,
            "dur_ns": dur_ns}


# --------------------------------------------------------------------------------------------
# COM001 slow synchronization
# --------------------------------------------------------------------------------------------

def _allreduce_group(late_rank: int | None, late_ms: float, wait_ms: float, transit_ms: float) -> Rows:
    """4 ranks, group 'g1', 3 steps, 2 all-reduces per step (at 40 ms and 70 ms into the step).

    On-time members start at the op's time, wait ``wait_ms`` then transit ``transit_ms``. The late
    member (if any) starts ``late_ms`` later, waits 0 and transits ``transit_ms``: all members end
    together, as a collective does.
    """
    rows = _base(4, compute_ms={late_rank: 40.0 + late_ms} if late_rank is not None else None)
    comm_ops = []
    for s in (1, 2, 3):
        for k, at_ms in enumerate((40.0, 70.0)):
            name = f"hcom_allReduce__123_{(s - 1) * 2 + k}"
            for r in range(4):
                late = r == late_rank
                start = T0 + (s - 1) * STEP_NS + int((at_ms + (late_ms if late else 0.0)) * MS)
                w = 0.0 if late else wait_ms
                dur = int((w + transit_ms) * MS)
                comm_ops.append({"rank": r, "name": name, "op_type": "allreduce", "group_name": "g1",
                                 "start_ns": start, "dur_ns": dur, "transit_ns": int(transit_ms * MS),
                                 "wait_ns": int(w * MS), "sync_ns": 0, "idle_ns": 0, "bytes": 64 * MB})
                rows["events"].append(_comm_event(r, name, start, dur))
    rows["comm_ops"] = comm_ops
    return rows


def slow_rank_ascend() -> Rows:
    """Rank 3 arrives 15 ms late at every all-reduce; the others wait 15 ms, everyone transits 5 ms.

    Per instance: members 0-2 d = 20 ms, w = 15 ms; rank 3 d = 5 ms, w = 0.
    R_wait = (3 x 15) / (3 x 20 + 5) = 45 / 65 = 0.6923 (every instance, so also overall).
    Largest per-step wait of one member: 2 x 15 = 30 ms of a 100 ms step (30 %).
    """
    return _allreduce_group(late_rank=3, late_ms=15.0, wait_ms=15.0, transit_ms=5.0)


def waits_without_a_late_rank_ascend() -> Rows:
    """All 4 ranks arrive together at every all-reduce and spend 20 ms in it, but the export splits rank
    3's time as 20 ms of transit and the others' as 15 ms of wait + 5 ms of transit (rank 3 moves its data
    over a slower path): R_wait = 45 / 80 = 0.5625 and rank 3 "leads" the others' waits by 30 ms per step,
    yet no rank's own time (the 100 ms step less its 40 ms in collectives, 60 ms each) leads its peers':
    nobody is late."""
    rows = _base(4)
    comm_ops = []
    for s in (1, 2, 3):
        for k, at_ms in enumerate((40.0, 70.0)):
            name = f"hcom_allReduce__123_{(s - 1) * 2 + k}"
            for r in range(4):
                start = T0 + (s - 1) * STEP_NS + int(at_ms * MS)
                w, transit = (0.0, 20.0) if r == 3 else (15.0, 5.0)
                comm_ops.append({"rank": r, "name": name, "op_type": "allreduce", "group_name": "g1",
                                 "start_ns": start, "dur_ns": int(20.0 * MS), "transit_ns": int(transit * MS),
                                 "wait_ns": int(w * MS), "sync_ns": 0, "idle_ns": 0, "bytes": 64 * MB})
                rows["events"].append(_comm_event(r, name, start, int(20.0 * MS)))
    rows["comm_ops"] = comm_ops
    return rows


def balanced_ascend() -> Rows:
    """All 4 ranks arrive together; each waits 0.5 ms (handshake) and transits 5.5 ms.

    R_wait = 0.5 / 6 = 0.083 < 0.2.
    """
    return _allreduce_group(late_rank=None, late_ms=0.0, wait_ms=0.5, transit_ms=5.5)


def slow_rank_kineto_nccl() -> Rows:
    """Kineto-like: 2 ranks, one NCCL all-reduce kernel per step, no wait/transit split.

    Rank 0's kernel starts at 40 ms and lasts 12 ms; rank 1 arrives 9 ms later and lasts 3 ms
    (both end at 52 ms). w = d - min d: rank 0 9 ms, rank 1 0.
    R_wait = 9 / (12 + 3) = 0.6. Bytes: 1,048,576 float32 = 4,194,304 B (In msg nelems x 4).
    """
    rows = _base(2, source="kineto", compute_ms={1: 49.0})
    ops = []
    name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    for s in (1, 2, 3):
        t = T0 + (s - 1) * STEP_NS
        for r, (off, dur) in enumerate(((40.0, 12.0), (49.0, 3.0))):
            start = t + int(off * MS)
            ops.append({"rank": r, "name": name, "op_type": "allreduce", "group_name": "0", "start_ns": start,
                        "dur_ns": int(dur * MS), "bytes": 1_048_576 * 4})
            rows["events"].append(_comm_event(r, name, start, int(dur * MS)))
    rows["comm_ops"] = ops
    return rows


# --------------------------------------------------------------------------------------------
# Transport bandwidth (COM002, COM003, COM005, COM006)
# --------------------------------------------------------------------------------------------

def _bandwidth_profile(transport: str, ops_per_step: int, bytes_per_op: int, transit_ms: float,
                       n_ranks: int = 2, matmul_during_comm: bool = True, with_matrix: bool = False,
                       bytes_fn: Any = None, transit_fn: Any = None) -> Rows:
    """``ops_per_step`` all-gathers per step on ``n_ranks`` ranks, each moving ``bytes_per_op`` over
    ``transport`` in ``transit_ms`` (elapse = transit). Ops start at 10 ms into the step, 5 ms + transit apart.

    The compute kernel ``MatMulV2`` covers 0-40 ms of each step when ``matmul_during_comm``, else it
    runs 60-99 ms (after all ops) and nothing overlaps the ops.
    """
    rows = _base(n_ranks)
    if not matmul_during_comm:
        for e in rows["events"]:
            if e["name"] == "MatMulV2":
                e["start_ns"] += 60 * MS
                e["dur_ns"] = 39 * MS
    ops, bw, mx, kernels = [], [], [], []
    for r in range(n_ranks):
        for s in (1, 2, 3):
            t = T0 + (s - 1) * STEP_NS
            kernels.append({"rank": r, "name": "MatMulV2", "op_type": "MatMulV2", "core_type": "AI_CORE",
                            "start_ns": t + (0 if matmul_during_comm else 60 * MS),
                            "dur_ns": (40 if matmul_during_comm else 39) * MS})
            at = t + 10 * MS
            for k in range(ops_per_step):
                name = f"hcom_allGather__456_{(s - 1) * ops_per_step + k}"
                b = bytes_fn(k) if bytes_fn else bytes_per_op
                tr = int((transit_fn(k) if transit_fn else transit_ms) * MS)
                ops.append({"rank": r, "name": name, "op_type": "allgather", "group_name": "g2", "start_ns": at,
                            "dur_ns": tr, "transit_ns": tr, "wait_ns": 0, "sync_ns": 0, "idle_ns": 0, "bytes": b})
                bw.append({"rank": r, "step": s, "name": name, "group_name": "g2", "transport": transport,
                           "bytes": b, "transit_ns": tr, "bandwidth_gbps": b / tr})
                if with_matrix:
                    peer = (r + 1) % n_ranks
                    mx.append({"rank": r, "step": s, "group_name": "g2", "name": name, "src_rank": r,
                               "dst_rank": peer, "transport": transport, "bytes": b, "transit_ns": tr,
                               "bandwidth_gbps": b / tr})
                rows["events"].append(_comm_event(r, name, at, tr))
                at += tr + 5 * MS
    rows.update({"comm_ops": ops, "comm_bandwidth": bw, "kernels": kernels})
    if with_matrix:
        rows["comm_matrix"] = mx
    return rows


def hccs_low_bandwidth() -> Rows:
    """HCCS at 9 GB/s: 90 MB per op in 10 ms, one op per step, 2 ranks, no concurrent MatMul.

    Utilisation 9 / 30 = 0.30 < 0.8. Saving per step: 10 ms - 90e6 B / 24 GB/s = 10 - 3.75 = 6.25 ms
    of a 100 ms step (6.25 %, medium).
    """
    return _bandwidth_profile("HCCS", 1, 90 * MB, 10.0, matmul_during_comm=False)


def hccs_saturated() -> Rows:
    """HCCS at 27 GB/s on every link (27 MB per op in 1 ms): 0.9 of the 30 GB/s peak, with a matrix."""
    return _bandwidth_profile("HCCS", 1, 27 * MB, 1.0, with_matrix=True, matmul_during_comm=False)


def sdma_contention() -> Rows:
    """SDMA at 9 GB/s (90 MB in 10 ms, at 10-20 ms into the step) while MatMulV2 runs 0-40 ms.

    Threshold 0.8 x 18 = 14.4 GB/s. The rule's own figure per step: 10 ms - 90e6 / 14.4 ns = 10 - 6.25 =
    3.75 ms (3.75 % of 100 ms). Nothing waits for the op (it ends inside MatMulV2, the step's last device
    work): replayed faster, the step is as long, no saving.
    """
    return _bandwidth_profile("SDMA", 1, 90 * MB, 10.0, matmul_during_comm=True)


def sdma_contention_exposed() -> Rows:
    """SDMA at 4.5 GB/s (90 MB in 20 ms, 30-50 ms into the step) while MatMulV2 runs 0-40 ms; then LayerNorm on
    the compute stream, 50-60 ms, waits for the op (it starts when the op ends, 10 ms after MatMulV2), and is
    the step's last device work; the step marker lasts 100 ms.

    Threshold 0.8 x 18 = 14.4 GB/s and no operator runs without a MatMul: the rule's own figure is 20 ms - 90e6 B
    / 14.4 GB/s = 20 - 6.25 = 13.75 ms. Replayed at 14.4 GB/s the op ends at 36.25 ms, LayerNorm then follows
    MatMulV2 at 40 ms and ends at 50: the step's last work ends 10 ms earlier, 10 ms of the 100 ms step.
    """
    rows = _base(2)
    ops, bw, kernels = [], [], []
    for r in range(2):
        for s in (1, 2, 3):
            t = T0 + (s - 1) * STEP_NS
            kernels.append({"rank": r, "name": "MatMulV2", "op_type": "MatMulV2", "core_type": "AI_CORE",
                            "start_ns": t, "dur_ns": 40 * MS})
            kernels.append({"rank": r, "name": "LayerNorm", "op_type": "LayerNorm", "core_type": "AI_VECTOR_CORE",
                            "start_ns": t + 50 * MS, "dur_ns": 10 * MS})
            rows["events"].append({"rank": r, "kind": "kernel", "name": "LayerNorm", "device": True,
                                   "tid": "stream7", "start_ns": t + 50 * MS, "dur_ns": 10 * MS})
            name, at, tr, b = f"hcom_allGather__456_{s}", t + 30 * MS, 20 * MS, 90 * MB
            ops.append({"rank": r, "name": name, "op_type": "allgather", "group_name": "g2", "start_ns": at,
                        "dur_ns": tr, "transit_ns": tr, "wait_ns": 0, "sync_ns": 0, "idle_ns": 0, "bytes": b})
            bw.append({"rank": r, "step": s, "name": name, "group_name": "g2", "transport": "SDMA", "bytes": b,
                       "transit_ns": tr, "bandwidth_gbps": b / tr})
            rows["events"].append(_comm_event(r, name, at, tr))
    rows.update({"comm_ops": ops, "comm_bandwidth": bw, "kernels": kernels})
    return rows


def sdma_slow_no_matmul() -> Rows:
    """The same slow SDMA operators, but MatMulV2 runs 60-99 ms: no overlap, so no contention."""
    return _bandwidth_profile("SDMA", 1, 90 * MB, 10.0, matmul_during_comm=False)


def sdma_fast_with_matmul() -> Rows:
    """SDMA at 20 GB/s (200 MB in 10 ms) during MatMulV2: above 14.4 GB/s, no contention."""
    return _bandwidth_profile("SDMA", 1, 200 * MB, 10.0, matmul_during_comm=True)


def hccs_small_packets() -> Rows:
    """8 HCCS ops per step of 2 MB each in 0.5 ms (4 GB/s). All 8 < 16 MB: share 1.0, mean 2 MB.

    Saving per step: 8 x (0.5 ms - 2e6 B / 30 GB/s) = 8 x (0.5 - 0.0667) = 3.467 ms of 100 ms (medium).
    """
    return _bandwidth_profile("HCCS", 8, 2 * MB, 0.5, matmul_during_comm=False)


def hccs_large_packets() -> Rows:
    """2 HCCS ops per step of 64 MB each in 2.5 ms (25.6 GB/s): none small."""
    return _bandwidth_profile("HCCS", 2, 64 * MB, 2.5, matmul_during_comm=False)


def _split_packets(split: bool, side_by_side: bool = False) -> Rows:
    """2 ranks, group "g2" of both, 3 steps. Per step, at 10 ms, 10.2 ms and 10.4 ms, three all-gathers over
    HCCS, one after another: two move 4,000,000 B each, one 20,000,000 B as one packet of 20 MB. Every
    packet costs 1 us plus its bytes at 50 GB/s: 20 MB in 1 + 400 = 401 us.

    ``split``: the 4 MB ones as 40 packets of 0.1 MB (40 x (1 + 2) = 120 us), else as one packet of 4 MB
    (1 + 80 = 81 us). An all-gather over 2 ranks sends one message (n - 1); 4 MB < 16 MB needs one: merged,
    the 40 packets cost 81 us. ``side_by_side``: the operator's own transit time is a quarter of its
    packets' (they ran four at a time).
    """
    rows = _base(2)
    ops, bw = [], []
    for r in range(2):
        for s in (1, 2, 3):
            t = T0 + (s - 1) * STEP_NS
            for k, (nbytes, sizes) in enumerate((
                    (4 * MB, {"0.1": [40, 0.12]} if split else {"4": [1, 0.081]}),
                    (4 * MB, {"0.1": [40, 0.12]} if split else {"4": [1, 0.081]}),
                    (20 * MB, {"20": [1, 0.401]}))):
                name = f"hcom_allGather__456_{(s - 1) * 3 + k}"
                tr = int(sum(v[1] for v in sizes.values()) * MS)
                at = t + 10 * MS + k * 200_000
                own = tr // 4 if side_by_side else tr
                ops.append({"rank": r, "name": name, "op_type": "allgather", "group_name": "g2", "start_ns": at,
                            "dur_ns": tr, "transit_ns": own, "wait_ns": 0, "sync_ns": 0, "idle_ns": 0, "bytes": nbytes})
                bw.append({"rank": r, "step": s, "name": name, "group_name": "g2", "transport": "HCCS",
                           "bytes": nbytes, "transit_ns": tr, "bandwidth_gbps": nbytes / tr,
                           "packet_sizes": json.dumps(sizes)})
                rows["events"].append(_comm_event(r, name, at, tr))
    rows.update({"comm_ops": ops, "comm_bandwidth": bw})
    return rows


def hccs_split_packets() -> Rows:
    """See :func:`_split_packets` (the 4 MB all-gathers as 40 packets of 0.1 MB)."""
    return _split_packets(True)


def hccs_unsplit_packets() -> Rows:
    """See :func:`_split_packets` (each all-gather one packet: under 16 MB, but as few as it needs)."""
    return _split_packets(False)


def hccs_split_packets_side_by_side() -> Rows:
    """See :func:`_split_packets` (split, four packets at a time)."""
    return _split_packets(True, side_by_side=True)


def hccs_misaligned() -> Rows:
    """2 HCCS ops per step of 32 MiB: op 0 aligned (33,554,432 B in 1.5 ms), op 1 misaligned
    (33,554,432 + 100 B, mod 512 = 100, in 3 ms).

    Aligned bandwidth 33,554,432 / 1.5e6 = 22.37 GB/s. Saving per step: 3 ms - 33,554,532 / 22.37
    ≈ 3 - 1.5 = 1.5 ms (1.5 %, low). Misaligned share of HCCS transit: 3 / 4.5 = 0.667.
    """
    return _bandwidth_profile("HCCS", 2, 0, 0.0, matmul_during_comm=False,
                              bytes_fn=lambda k: 33_554_432 + (100 if k == 1 else 0),
                              transit_fn=lambda k: 3.0 if k == 1 else 1.5)


def hccs_aligned() -> Rows:
    """2 HCCS ops per step of exactly 32 MiB (mod 512 = 0)."""
    return _bandwidth_profile("HCCS", 2, 33_554_432, 1.5, matmul_during_comm=False)


# --------------------------------------------------------------------------------------------
# COM004 RDMA retransmission
# --------------------------------------------------------------------------------------------

def _rdma(transit_s: dict[int, float], elapse_s: dict[int, float]) -> Rows:
    """2 ranks, 10 s steps 1-3, one cross-node all-reduce per step moving 50 MB over RDMA.

    In step 2 the transit and elapse times are the given ones; elsewhere 40 ms.
    """
    step_ns = 10_000 * MS
    rows = _base(2, step_ns=step_ns)
    ops, bw = [], []
    for r in range(2):
        for s in (1, 2, 3):
            t = T0 + (s - 1) * step_ns + 100 * MS
            tr = int((transit_s.get(r, 0.04) if s == 2 else 0.04) * 1e9)
            el = int((elapse_s.get(r, 0.04) if s == 2 else 0.04) * 1e9)
            name = f"hcom_allReduce__789_{s}"
            ops.append({"rank": r, "name": name, "op_type": "allreduce", "group_name": "g3", "start_ns": t,
                        "dur_ns": el, "transit_ns": tr, "wait_ns": el - tr, "bytes": 50 * MB})
            bw.append({"rank": r, "step": s, "name": name, "group_name": "g3", "transport": "RDMA",
                       "bytes": 50 * MB, "transit_ns": tr, "bandwidth_gbps": 50 * MB / tr})
            rows["events"].append(_comm_event(r, name, t, el))
    rows.update({"comm_ops": ops, "comm_bandwidth": bw})
    return rows


def rdma_retransmission() -> Rows:
    """Step 2: rank 1's RDMA transit is 4.5 s; both ranks' all-reduce lasts 4.6 s.

    Saving for rank 1 (only step 2 has a long transfer): 4.5 s - 50e6 B / 12.5 GB/s = 4.5 - 0.004
    = 4.496 s; the step is 10 s (45 %, critical).
    """
    return _rdma({1: 4.5}, {0: 4.6, 1: 4.6})


def rdma_normal() -> Rows:
    """All RDMA transfers take 40 ms."""
    return _rdma({}, {})


def rdma_long_but_peer_fast() -> Rows:
    """Step 2: rank 1 reports 4.5 s of RDMA transit, but rank 0 finished the same all-reduce in 1 s:
    the group did not stall 4 s, so it is not counted as a retransmission."""
    return _rdma({1: 4.5}, {0: 1.0, 1: 4.6})


# --------------------------------------------------------------------------------------------
# COM007 network configuration
# --------------------------------------------------------------------------------------------

def _with_meta(meta: list[tuple[int | None, str, str]]) -> Rows:
    rows = hccs_large_packets()
    rows["meta"] = [{"rank": r, "key": k, "value": v} for r, k, v in meta]
    return rows


def env_off() -> Rows:
    """Both ranks: HCCL_INTRA_ROCE_ENABLE=1 (medium) and HCCL_BUFFSIZE=50 (< 200, low); HCCL_RDMA_TC=132 is fine."""
    meta = []
    for r in (0, 1):
        meta += [(r, "env.HCCL_INTRA_ROCE_ENABLE", "1"), (r, "env.HCCL_BUFFSIZE", "50"),
                 (r, "env.HCCL_RDMA_TC", "132"), (r, "env.ASCEND_GLOBAL_LOG_LEVEL", "3")]
    return _with_meta(meta)


def env_ok() -> Rows:
    """Recommended values only: HCCL_BUFFSIZE=200, HCCL_RDMA_TC=132, HCCL_RDMA_SL=4, HCCL_INTRA_ROCE_ENABLE=0."""
    meta = []
    for r in (0, 1):
        meta += [(r, "env.HCCL_BUFFSIZE", "200"), (r, "env.HCCL_RDMA_TC", "132"), (r, "env.HCCL_RDMA_SL", "4"),
                 (r, "env.HCCL_INTRA_ROCE_ENABLE", "0")]
    return _with_meta(meta)


def no_env() -> Rows:
    """Metadata without any env.* key."""
    return _with_meta([(None, "cann_version", "8.0.RC2"), (None, "torch_version", "2.1.0")])


# --------------------------------------------------------------------------------------------
# Generated Ascend cluster exports (tests/ascend/gen_cluster.py): planted facts in its Facts
# --------------------------------------------------------------------------------------------

def gen_faults8(out: Any) -> Any:
    """faults8: 8 ranks, 4 per node, TP 2; slow rank 3, RDMA transfer > 4 s on rank 2 in step 2, misaligned
    DP buckets 1 and 3 (chunks of 8,388,609 B), small TP packets, slow HCCS link 0 -> 2 (56 / 8 = 7 GB/s)."""
    from tests.ascend.gen_cluster import generate

    generate("faults8", out)
    return out


def gen_baseline8(out: Any) -> Any:
    """baseline8: 8 ranks on one node, HCCS at 56 GB/s, nothing planted."""
    from tests.ascend.gen_cluster import generate

    generate("baseline8", out)
    return out


def _nccl_pairs(durations: list[tuple[float, float]], compute_ms: float = 40.0) -> Rows:
    """Kineto-like: 2 ranks, one NCCL all-reduce per step; step s has ``durations[s - 1]`` = (rank 0's,
    rank 1's) kernel duration in ms, both ending at 52 ms into the 100 ms step (the shorter arrived last)."""
    steps = tuple(range(1, len(durations) + 1))
    rows = _base(2, steps=steps, source="kineto", compute_ms={0: compute_ms, 1: compute_ms})
    ops = []
    name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    for s, pair in zip(steps, durations, strict=True):
        t = T0 + (s - 1) * STEP_NS
        for r, dur in enumerate(pair):
            start = t + int((52.0 - dur) * MS)
            ops.append({"rank": r, "name": name, "op_type": "allreduce", "group_name": "0", "start_ns": start,
                        "dur_ns": int(dur * MS), "bytes": 1_048_576 * 4})
            rows["events"].append(_comm_event(r, name, start, int(dur * MS)))
    rows["comm_ops"] = ops
    return rows


def alternating_arrival_kineto_nccl() -> Rows:
    """Equal ranks whose arrival order alternates (a DDP job whose bucket timing varies): 6 steps, in odd
    steps rank 1 arrives 9 ms late (durations 12 / 3 ms), in even steps rank 0 does (3 / 12 ms).

    R_wait = 6 x 9 / (6 x 15) = 0.6, above 0.2; but neither rank is late across steps: rank 0's lead per
    step (rank 1's wait minus its own) is -9, +9, -9, +9, -9, +9 ms, mean 0. No straggler, no finding.
    """
    return _nccl_pairs([(12.0, 3.0), (3.0, 12.0)] * 3)


def slightly_late_rank_kineto_nccl() -> Rows:
    """Rank 1 arrives 1 ms late in each of 6 steps (durations 3 / 2 ms): R_wait = 1 / 5 = 0.2 and the lead
    is +1 ms in every step (significant), but 1 ms is 1 % of the 100 ms step, below min_wait_share (5 %)."""
    return _nccl_pairs([(3.0, 2.0)] * 6)
