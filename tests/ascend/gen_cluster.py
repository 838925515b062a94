"""Synthetic torch_npu cluster exports with planted, known facts (test code, not a runtime feature).

No real multi-rank Ascend export is public, so this writes one in exactly the layout, file
names, columns, units and process/thread names of the real files (``sample_profiles``) and of
``tests/data/ascend/ascend-formats.md`` (the "format doc"):

    <out>/<host>_<pid>_<YYYYmmddHHMMSSmmm>_ascend_pt/        one folder per rank
        profiler_info_{rank}.json, profiler_metadata.json
        ASCEND_PROFILER_OUTPUT/
            text form: trace_view.json, kernel_details.csv, step_trace_time.csv,
                       communication.json, communication_matrix.json, op_statistic.csv
            db form:   ascend_pytorch_profiler_{rank}.db, analysis.db

All ranks come from one simulated cluster timeline, so the files agree with each other:
compute runs back to back on each rank's compute stream; every collective of a group ends on
all members at the same time (the last arrival plus the transfer time), so a slow rank makes
its peers wait inside their collectives; the Overlap Analysis lanes, step_trace_time.csv,
communication.json and the matrix are computed from that same timeline.

Planted facts (see :class:`Scenario`): a slow rank, misaligned HCCS transfers (size mod 512 !=
0), an RDMA transfer longer than 4 s, small packets, one slow step, a slow link, AI_CPU
operators and low block dim. :func:`generate` returns a :class:`Facts` describing them.

Run ``python tests/ascend/gen_cluster.py OUT_DIR [scenario] [text|db|both]`` to write one.
"""

from __future__ import annotations

import csv
import io
import json
import random
import sqlite3
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# Scenario and facts
# ---------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    """What to simulate. Times in µs unless the name says otherwise."""

    name: str = "baseline"
    world: int = 8
    ranks_per_node: int = 8
    tp: int = 2  # tensor-parallel size; data-parallel groups are ranks with the same (rank % tp)
    steps: int = 4
    first_step: int = 1
    layers: int = 4  # forward: `layers` blocks of fwd_kernels, each followed by a TP allgather
    fwd_kernels: int = 4
    buckets: int = 4  # backward: one DP allreduce per bucket
    bwd_kernels: int = 5  # per bucket
    opt_kernels: int = 3
    bucket_bytes: int = 32 << 20
    tp_bytes: int = 8 << 20
    slow_rank: int | None = None
    slow_factor: float = 1.6
    slow_step: int | None = None  # step number with a long dataloader stall (step fluctuation)
    slow_step_stall_us: float = 40_000.0
    loader_us: float = 1_300.0  # the data loader's time in every other step
    rdma_retrans: tuple[int, int] | None = None  # (step number, bucket) whose first RDMA transfer takes > 4 s
    rdma_retrans_us: float = 4_500_000.0
    misaligned_buckets: tuple[int, ...] = ()  # buckets whose chunk size is not a multiple of 512
    misaligned_factor: float = 1.0  # misaligned HCCS transfers run at the link's bandwidth / this
    # the TP all-gathers move their bytes (tp_bytes) as messages of small_packet_bytes, each paying the
    # fixed per-message latency (MESSAGE_LATENCY_NS) every transfer pays, instead of one message per ring step
    small_packets: bool = False
    small_packet_bytes: int = 64 << 10
    # the next layer's compute waits for the layer's TP all-gather (its output is that layer's input), so the
    # all-gathers are exposed on the step instead of overlapping the following compute
    tp_waits: bool = False
    slow_link: tuple[int, int] | None = None  # (src global rank, dst global rank) on a DP ring
    slow_link_factor: float = 8.0
    aicpu: bool = False  # some AI_CPU operators (long, on the compute stream)
    low_block_dim: bool = False  # some long AI_CORE kernels with block dim 2 (of 24 cores)
    comm_process_name: str = "HCCL"  # current CANN also writes 'Communication' (format doc addendum)
    flavor: str = "pt"  # "ms": a MindSpore *_ascend_ms export (text form), format doc §20
    seed: int = 7
    hccs_gbps: float = 56.0
    rdma_gbps: float = 12.5
    # parallel layout (tests/test_groups.py): rank = stage * (dp * tp) + dp_index * tp + tp_index (Megatron's order)
    pp: int = 1  # pipeline stages; > 1 simulates GPipe micro-batches with send / receive between stages
    micro_batches: int = 2  # per step, when pp > 1
    act_bytes: int = 4 << 20  # activation (and its gradient) sent between stages per micro-batch
    bucket_scales: tuple[float, ...] = ()  # DP bucket b moves bucket_bytes * bucket_scales[b] (DDP buckets differ)
    slow_group: int | None = None  # index into Cluster.dp_groups whose collectives run on slower links
    slow_group_factor: float = 4.0
    slow_stage: int | None = None  # pipeline stage whose compute takes slow_stage_factor longer
    slow_stage_factor: float = 1.8
    slow_rank_step: tuple[int, int] | None = None  # (rank, step number) whose compute is slower in that step only
    slow_rank_step_factor: float = 2.0


@dataclass
class Facts:
    """What the generator planted, for the tests to find again."""

    scenario: Scenario
    root: Path
    rank_dirs: dict[int, Path] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    slow_rank: int | None = None
    slow_step: int | None = None
    rdma_retrans: list[tuple[int, int, str]] = field(default_factory=list)  # (rank, step, op name)
    misaligned: list[tuple[int, int, str, int]] = field(default_factory=list)  # (rank, step, op, transfer bytes)
    slow_link: tuple[int, int] | None = None
    aicpu_kernels: list[str] = field(default_factory=list)
    low_block_kernels: list[str] = field(default_factory=list)
    groups: dict[str, list[int]] = field(default_factory=dict)  # group hash -> global ranks
    group_kind: dict[str, str] = field(default_factory=dict)  # group hash -> dp | tp | pp | default_group
    slow_group: str | None = None  # group hash of the planted slow DP group
    slow_stage_ranks: list[int] = field(default_factory=list)  # ranks of the planted slow pipeline stage
    files: list[Path] = field(default_factory=list)
    step_span_us: dict[int, float] = field(default_factory=dict)  # step -> the cluster's step (µs), below


SCENARIOS: dict[str, Scenario] = {
    "baseline8": Scenario(name="baseline8"),
    "faults8": Scenario(
        name="faults8",
        world=8,
        ranks_per_node=4,
        slow_rank=3,
        slow_step=3,
        rdma_retrans=(2, 1),
        misaligned_buckets=(1, 3),
        small_packets=True,
        slow_link=(0, 2),
        aicpu=True,
        low_block_dim=True,
    ),
    "mindspore4": Scenario(name="mindspore4", world=4, ranks_per_node=4, steps=3, slow_rank=1, flavor="ms"),
    # parallel layouts (tests/test_groups.py): 16 ranks on 2 nodes of 8, DDP buckets of different sizes
    "layout_dp4_tp2_pp2": Scenario(name="layout_dp4_tp2_pp2", world=16, ranks_per_node=8, tp=2, pp=2, steps=3,
                                   layers=2, buckets=3, bwd_kernels=3, bucket_scales=(1.0, 0.75, 0.4)),
    "layout_dp8_tp2": Scenario(name="layout_dp8_tp2", world=16, ranks_per_node=8, tp=2, steps=3, layers=2,
                               buckets=3, bwd_kernels=3, bucket_scales=(1.0, 0.75, 0.4)),
    "cluster64": Scenario(
        name="cluster64",
        world=64,
        ranks_per_node=8,
        tp=2,
        slow_rank=17,
        slow_step=3,
        misaligned_buckets=(2,),
        small_packets=True,
        slow_link=(8, 10),
        aicpu=True,
        low_block_dim=True,
        layers=2,
        bwd_kernels=3,
        buckets=3,
    ),
}

# ---------------------------------------------------------------------------------------------
# helpers: names, hashes, formatting
# ---------------------------------------------------------------------------------------------

BASE_NS = 1_704_161_511_000_000_000  # 2024-01-02, like the real sample
KD_HEADER = [
    "Step Id",
    "Model ID",
    "Task ID",
    "Stream ID",
    "Name",
    "Type",
    "Accelerator Core",
    "Start Time(us)",
    "Duration(us)",
    "Wait Time(us)",
    "Block Dim",
    "Mix Block Dim",
    "Input Shapes",
    "Input Data Types",
    "Input Formats",
    "Output Shapes",
    "Output Data Types",
    "Output Formats",
    "Context ID",
    "aicore_time(us)",
    "aic_total_cycles",
    "aic_mac_fp16_ratio",
    "aic_mac_int8_ratio",
    "aic_cube_fops",
    "aic_vector_fops",
    "aiv_time(us)",
    "aiv_total_cycles",
    "aiv_vec_fp32_ratio",
    "aiv_vec_fp16_ratio",
    "aiv_vec_int32_ratio",
    "aiv_vec_misc_ratio",
    "aiv_cube_fops",
    "aiv_vector_fops",
]  # the real sample's header, in its order (format doc §6.1)
STEP_TRACE_HEADER = [
    "Device_id",
    "Step",
    "Computing",
    "Communication(Not Overlapped)",
    "Overlapped",
    "Communication",
    "Free",
    "Stage",
    "Bubble",
    "Communication(Not Overlapped and Exclude Receive)",
    "Preparing",
]  # format doc §7 (torch_npu >= 2.6.0)
OP_STAT_HEADER = [
    "OP Type",
    "Core Type",
    "Count",
    "Total Time(us)",
    "Min Time(us)",
    "Avg Time(us)",
    "Max Time(us)",
    "Ratio(%)",
]
TIME_INFO_KEYS = [
    "Start Timestamp(us)",
    "Elapse Time(ms)",
    "Transit Time(ms)",
    "Wait Time(ms)",
    "Synchronization Time(ms)",
    "Idle Time(ms)",
    "Wait Time Ratio",
    "Synchronization Time Ratio",
]  # format doc §8.2
BW_KEYS = ["Transit Size(MB)", "Transit Time(ms)", "Bandwidth(GB/s)", "Large Packet Ratio", "Size Distribution"]  # §8.3
TRANSPORTS = ["HCCS", "PCIE", "RDMA", "SDMA", "SIO"]  # "all five transport keys are always present" (addendum)
LARGE_PACKET_MB = {"HCCS": 32.0, "PCIE": 32.0, "SIO": 32.0, "RDMA": 0.5}  # addendum thresholds
N_AI_CORES = 24
# the fixed cost of every transfer message (a task's launch and notify handshake), ns
MESSAGE_LATENCY_NS = 2_000


def group_hash(name: str) -> str:
    """CANN's group id: two 32-bit polynomial hashes (29, 131) packed, in decimal (format doc §8.4)."""
    h1 = h2 = 0
    for ch in name:
        h1 = (h1 * 29 + ord(ch)) & 0xFFFFFFFF
        h2 = (h2 * 131 + ord(ch)) & 0xFFFFFFFF
    return str((h1 << 32) | h2)


def us(ns: int) -> str:
    """ns -> the trace's µs string with exactly three decimals."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def us_f(ns: int) -> float:
    """ns -> µs number (framework durations: at most 3 decimals)."""
    return round(ns / 1000.0, 3)


def ms(ns: float) -> float:
    return ns / 1e6


def mb(b: float) -> float:
    return b / 1e6  # communication MB = 10^6 bytes (format doc addendum)


@dataclass
class Kernel:
    step: int
    name: str
    op_type: str
    core: str
    start: int
    dur: int
    block: int
    shapes: str
    dtypes: str
    task_id: int
    host_op: str
    api: str


@dataclass
class Transfer:
    transport: str  # HCCS | RDMA | LOCAL
    src_local: int
    dst_local: int
    size: int
    start: int
    dur: int


@dataclass
class CommOp:
    step: int
    name: str  # hcom_allReduce__233_58_1
    op_type: str  # allReduce / allGather
    group: str  # hash
    start: int
    end: int
    wait: int
    transit: int
    idle: int
    transfers: list[Transfer]
    count: int
    local_rank: int


@dataclass
class HostEv:
    name: str
    cat: str
    tid: int
    start: int
    dur: int
    args: dict[str, Any]


@dataclass
class RankModel:
    rank: int
    kernels: list[Kernel] = field(default_factory=list)
    comm: list[CommOp] = field(default_factory=list)
    host: list[HostEv] = field(default_factory=list)  # Python process
    cann: list[HostEv] = field(default_factory=list)  # CANN process
    flows: list[tuple[str, str, str, int, int, int, int]] = field(
        default_factory=list
    )  # (cat, name, id, pid_s, tid_s, ts_s, kernel ts)
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (step, host start, host end)


# ---------------------------------------------------------------------------------------------
# simulation
# ---------------------------------------------------------------------------------------------

_FWD_OPS = [
    ("MatMul", "aclnnMm", "aten::mm", "AI_CORE"),
    ("Add", "aclnnAdd", "aten::add", "AI_VECTOR_CORE"),
    ("Gelu", "aclnnGelu", "aten::gelu", "AI_VECTOR_CORE"),
    ("LayerNorm", "aclnnLayerNorm", "aten::layer_norm", "MIX_AIV"),
]
_BWD_OPS = [
    ("MatMul", "aclnnMm", "aten::mm", "AI_CORE"),
    ("GeluGrad", "aclnnGeluBackward", "aten::gelu_backward", "AI_VECTOR_CORE"),
    ("Mul", "aclnnMul", "aten::mul", "AI_VECTOR_CORE"),
]
_OPT_OPS = [("ApplyAdamW", "aclnnApplyAdamW", "aten::_fused_adamw_", "AI_VECTOR_CORE")]


class Cluster:
    """The simulated cluster: groups, per-rank models, planted facts."""

    def __init__(self, scn: Scenario) -> None:
        if scn.world % scn.tp:
            raise ValueError("world must be a multiple of tp")
        self.scn = scn
        self.rng = random.Random(scn.seed)
        self.ranks = [RankModel(r) for r in range(scn.world)]
        self.comm_names: dict[str, str] = {}  # hash -> communicator name
        self.group_members: dict[str, list[int]] = {}
        self.group_kind: dict[str, str] = {}
        world = list(range(scn.world))
        self.world_group = self._group("default_group", world, 0)
        if scn.world % (scn.tp * scn.pp):
            raise ValueError("world must be a multiple of tp * pp")
        per_stage = scn.world // scn.pp  # ranks of one pipeline stage
        self.dp_groups = {
            st * scn.tp + j: self._group("dp", list(range(st * per_stage + j, (st + 1) * per_stage, scn.tp)),
                                         1 + st * scn.tp + j)
            for st in range(scn.pp) for j in range(scn.tp)
        }
        self.tp_groups = {
            k: self._group("tp", list(range(k * scn.tp, (k + 1) * scn.tp)), 100 + k) for k in range(scn.world // scn.tp)
        }
        self.pp_groups = {
            off: self._group("pp", list(range(off, scn.world, per_stage)), 200 + off)
            for off in range(per_stage) if scn.pp > 1
        }
        self.slow_groups = {self.dp_groups[scn.slow_group]} if scn.slow_group is not None else set()
        self.seq: dict[str, int] = {g: 0 for g in self.group_members}
        self.facts = Facts(scn, Path("."), slow_rank=scn.slow_rank, slow_step=scn.slow_step, slow_link=scn.slow_link)
        self.facts.groups = dict(self.group_members)
        self.facts.group_kind = dict(self.group_kind)
        self.facts.slow_group = self.dp_groups[scn.slow_group] if scn.slow_group is not None else None
        if scn.slow_stage is not None:
            self.facts.slow_stage_ranks = list(range(scn.slow_stage * per_stage, (scn.slow_stage + 1) * per_stage))
        # per-kernel durations shared by every rank (ns)
        self.fwd_durs = [self.rng.randint(60_000, 260_000) for _ in range(scn.layers * scn.fwd_kernels)]
        self.bwd_durs = [self.rng.randint(80_000, 300_000) for _ in range(scn.buckets * scn.bwd_kernels)]
        self.opt_durs = [self.rng.randint(20_000, 50_000) for _ in range(scn.opt_kernels)]
        self.task_ids = [1000] * scn.world
        self.host_pid = [437675 + 13 * r for r in range(scn.world)]

    def _group(self, kind: str, members: list[int], idx: int) -> str:
        name = f"10.0.0.1%enp189s0f0_60000_{idx}_1704161511420289"
        h = group_hash(name)
        self.comm_names[h] = name
        self.group_members[h] = members
        self.group_kind[h] = kind
        return h

    def node(self, r: int) -> int:
        return r // self.scn.ranks_per_node

    def simulate(self) -> None:
        scn = self.scn
        t0 = BASE_NS + 420_289_011
        for i in range(scn.steps):
            step = scn.first_step + i
            t1 = self._step_pp(step, t0) if scn.pp > 1 else self._step(step, t0)
            # the cluster's step: every rank's marker starts at t0; the next step starts at t1 on every rank
            self.facts.step_span_us[step] = (t1 - t0) / 1000.0
            t0 = t1
        self.facts.steps = [scn.first_step + i for i in range(scn.steps)]

    # -- one step on every rank ------------------------------------------------------------------
    def _step(self, step: int, h0: int) -> int:
        scn = self.scn
        stall = int((scn.slow_step_stall_us if step == scn.slow_step else scn.loader_us) * 1000)
        factor: dict[int, float] = {}
        ht: dict[int, int] = {}
        dt: dict[int, int] = {}
        arrivals_fwd: dict[int, list[int]] = {r: [] for r in range(scn.world)}
        arrivals_bwd: dict[int, list[int]] = {r: [] for r in range(scn.world)}
        for r in range(scn.world):
            factor[r] = scn.slow_factor if r == scn.slow_rank else 1.0
            if scn.slow_rank_step == (r, step):
                factor[r] *= scn.slow_rank_step_factor
            self.ranks[r].host.append(
                HostEv(
                    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                    "cpu_op",
                    self.host_pid[r],
                    h0 + 20_000,
                    stall,
                    {"Sequence number": -1, "Fwd thread id": 0},
                )
            )
            ht[r] = h0 + 20_000 + stall + 30_000
            dt[r] = ht[r] + 40_000
        # collectives, in launch order; each rank's HCCL stream runs one at a time
        comm_free = {r: 0 for r in range(scn.world)}
        message = scn.small_packet_bytes if scn.small_packets else None
        for layer in range(scn.layers):
            for r in range(scn.world):
                rm = self.ranks[r]
                for j in range(scn.fwd_kernels):
                    op = _FWD_OPS[j % len(_FWD_OPS)]
                    dur = int(self.fwd_durs[layer * scn.fwd_kernels + j] * factor[r])
                    core, block = op[3], 24 if op[3] == "AI_CORE" else 48
                    name = f"{op[1]}_{op[0]}_{op[0]}"
                    if scn.aicpu and layer == 0 and j == 1:
                        core, block, dur, name = "AI_CPU", 1, dur + 400_000, f"{op[1]}_{op[0]}AiCpu_{op[0]}"
                        self.facts.aicpu_kernels.append(name)
                    if scn.low_block_dim and layer == 1 and j == 0:
                        block, dur, name = 2, dur + 300_000, f"{op[1]}_{op[0]}LowBlock_{op[0]}"
                        self.facts.low_block_kernels.append(name)
                    ht[r], dt[r] = self._launch(rm, step, op, name, core, block, dur, ht[r], dt[r])
                arrivals_fwd[r].append(dt[r])
            if scn.tp_waits:  # the next layer starts when its input has been gathered
                for g in self.tp_groups.values():
                    arr = {r: arrivals_fwd[r][layer] for r in self.group_members[g]}
                    end = self._collective(step, g, "allGather", arr, comm_free, scn.tp_bytes, None, message)
                    for r in self.group_members[g]:
                        dt[r] = max(dt[r], end)
        for r in range(scn.world):
            rm = self.ranks[r]
            k = 0
            for _bucket in range(scn.buckets):
                for j in range(scn.bwd_kernels):
                    op = _BWD_OPS[j % len(_BWD_OPS)]
                    dur = int(self.bwd_durs[k] * factor[r])
                    ht[r], dt[r] = self._launch(
                        rm, step, op, f"{op[1]}_{op[0]}_{op[0]}", op[3], 24 if op[3] == "AI_CORE" else 48, dur, ht[r],
                        dt[r]
                    )
                    k += 1
                arrivals_bwd[r].append(dt[r])
        dev_ready, host_t = dict(dt), dict(ht)
        if not scn.tp_waits:  # the all-gathers overlap the compute that follows them
            for layer in range(scn.layers):
                for g in self.tp_groups.values():
                    arr = {r: arrivals_fwd[r][layer] for r in self.group_members[g]}
                    self._collective(step, g, "allGather", arr, comm_free, scn.tp_bytes, None, message)
        for b in range(scn.buckets):
            for g in self.dp_groups.values():
                arr = {r: arrivals_bwd[r][b] for r in self.group_members[g]}
                nbytes = self.bucket_size(b)
                if b in scn.misaligned_buckets:
                    n = len(self.group_members[g])
                    nbytes = (scn.bucket_bytes // n + 1) * n  # chunk = bucket/n + 1 byte: not a multiple of 512
                self._collective(step, g, "allReduce", arr, comm_free, nbytes, bucket=b)
        arr = {r: dev_ready[r] for r in range(scn.world)}
        end_w = self._collective(step, self.world_group, "allReduce", arr, comm_free, 4096, bucket=None)
        # host waits for the device (sync), then launches the optimizer; identical on every rank
        step_end = 0
        for r in range(scn.world):
            rm = self.ranks[r]
            tid = self.host_pid[r]
            hs = host_t[r]
            rm.cann.append(
                HostEv(
                    "AscendCL@aclrtSynchronizeStream",
                    "",
                    tid,
                    hs,
                    max(end_w - hs, 1000),
                    {
                        "Thread Id": tid,
                        "Mode": "ACL_RTS",
                        "level": "acl",
                        "id": "aclrtSynchronizeStream",
                        "item_id": "0",
                        "connection_id": 0,
                    },
                )
            )
            ht = max(hs, end_w) + 20_000
            dt = max(end_w + 5_000, ht + 40_000)
            for j, d in enumerate(self.opt_durs):
                op = _OPT_OPS[0]
                ht, dt = self._launch(rm, step, op, f"{op[1]}_{op[0]}_{op[0]}_{j}", op[3], 48, d, ht, dt)
            host_end = ht + 30_000
            rm.steps.append((step, h0, host_end))
            rm.host.append(
                HostEv(
                    f"ProfilerStep#{step}",
                    "cpu_op",
                    tid,
                    h0,
                    host_end - h0,
                    {"Sequence number": -1, "Fwd thread id": 0},
                )
            )
            step_end = max(step_end, host_end, dt)
        return step_end + 100_000

    def bucket_size(self, b: int) -> int:
        """Bytes of DP bucket ``b`` (every bucket the same size unless ``bucket_scales`` is set)."""
        sc = self.scn.bucket_scales
        return int(self.scn.bucket_bytes * sc[b % len(sc)]) if sc else self.scn.bucket_bytes

    def _step_pp(self, step: int, h0: int) -> int:
        """One step with pipeline stages (GPipe): every micro-batch's forward runs stage after stage, each
        stage receiving its activations from the one before; then the backwards in reverse, the gradients
        going back the same way; then the DP all-reduce of each bucket inside each stage, the world
        all-reduce and the optimizer."""
        scn = self.scn
        per_stage = scn.world // scn.pp
        stall = int((scn.slow_step_stall_us if step == scn.slow_step else scn.loader_us) * 1000)
        ht: dict[int, int] = {}
        dt: dict[int, int] = {}
        for r in range(scn.world):
            self.ranks[r].host.append(
                HostEv("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "cpu_op", self.host_pid[r],
                       h0 + 20_000, stall, {"Sequence number": -1, "Fwd thread id": 0})
            )
            ht[r] = h0 + 20_000 + stall + 30_000
            dt[r] = ht[r] + 40_000
        comm_free = {r: 0 for r in range(scn.world)}

        def factor(r: int) -> float:
            f = scn.slow_factor if r == scn.slow_rank else 1.0
            f *= scn.slow_rank_step_factor if scn.slow_rank_step == (r, step) else 1.0
            return f * (scn.slow_stage_factor if r // per_stage == scn.slow_stage else 1.0)

        def launch(r: int, op: tuple[str, str, str, str], dur: int) -> None:
            core = op[3]
            ht[r], dt[r] = self._launch(self.ranks[r], step, op, f"{op[1]}_{op[0]}_{op[0]}", core,
                                        24 if core == "AI_CORE" else 48, int(dur * factor(r)), ht[r], dt[r])

        stages = [list(range(st * per_stage, (st + 1) * per_stage)) for st in range(scn.pp)]
        tp_of_stage = [[g for g in self.tp_groups.values() if self.group_members[g][0] in st] for st in stages]
        for _mb in range(scn.micro_batches):
            for si, ranks in enumerate(stages):
                if si > 0:
                    for r in ranks:
                        self._p2p(step, r - per_stage, r, dt, comm_free, scn.act_bytes)
                k = 0
                for _layer in range(scn.layers):
                    for r in ranks:
                        for j in range(scn.fwd_kernels):
                            launch(r, _FWD_OPS[j % len(_FWD_OPS)], self.fwd_durs[k + j])
                    k += scn.fwd_kernels
                    for g in tp_of_stage[si]:
                        arr = {r: dt[r] for r in self.group_members[g]}
                        end = self._collective(step, g, "allGather", arr, comm_free, scn.tp_bytes, None,
                                               scn.small_packet_bytes if scn.small_packets else None)
                        if scn.tp_waits:
                            for r in self.group_members[g]:
                                dt[r] = max(dt[r], end)
        bucket_ready: dict[int, list[int]] = {r: [] for r in range(scn.world)}
        for mb in range(scn.micro_batches):
            for si in reversed(range(scn.pp)):
                ranks = stages[si]
                if si < scn.pp - 1:
                    for r in ranks:
                        self._p2p(step, r + per_stage, r, dt, comm_free, scn.act_bytes)
                for r in ranks:
                    k = 0
                    for _b in range(scn.buckets):
                        for j in range(scn.bwd_kernels):
                            launch(r, _BWD_OPS[j % len(_BWD_OPS)], self.bwd_durs[k])
                            k += 1
                        if mb == scn.micro_batches - 1:
                            bucket_ready[r].append(dt[r])
        for b in range(scn.buckets):
            for g in self.dp_groups.values():
                arr = {r: bucket_ready[r][b] for r in self.group_members[g]}
                self._collective(step, g, "allReduce", arr, comm_free, self.bucket_size(b), bucket=b)
        end_w = self._collective(step, self.world_group, "allReduce", dict(dt), comm_free, 4096, bucket=None)
        step_end = 0
        for r in range(scn.world):
            rm = self.ranks[r]
            tid = self.host_pid[r]
            hs = ht[r]
            rm.cann.append(
                HostEv("AscendCL@aclrtSynchronizeStream", "", tid, hs, max(end_w - hs, 1000),
                       {"Thread Id": tid, "Mode": "ACL_RTS", "level": "acl", "id": "aclrtSynchronizeStream",
                        "item_id": "0", "connection_id": 0})
            )
            h = max(hs, end_w) + 20_000
            d = max(end_w + 5_000, h + 40_000)
            for j, du in enumerate(self.opt_durs):
                op = _OPT_OPS[0]
                h, d = self._launch(rm, step, op, f"{op[1]}_{op[0]}_{op[0]}_{j}", op[3], 48, du, h, d)
            host_end = h + 30_000
            rm.steps.append((step, h0, host_end))
            rm.host.append(HostEv(f"ProfilerStep#{step}", "cpu_op", tid, h0, host_end - h0,
                                  {"Sequence number": -1, "Fwd thread id": 0}))
            step_end = max(step_end, host_end, d)
        return step_end + 100_000

    def _p2p(self, step: int, src: int, dst: int, dt: dict[int, int], comm_free: dict[int, int], nbytes: int) -> None:
        """One send (on ``src``) and its receive (on ``dst``) in their pipeline group: both end when the later
        of the two is posted plus the transfer; the receiver's compute waits for the data."""
        scn = self.scn
        g = self.pp_groups[src % (scn.world // scn.pp)]
        members = self.group_members[g]
        self.seq[g] += 1
        same_node = self.node(src) == self.node(dst)
        transport = "HCCS" if same_node else "RDMA"
        gbps = scn.hccs_gbps if same_node else scn.rdma_gbps
        dur = int(nbytes / (gbps * 1e9) * 1e9) + MESSAGE_LATENCY_NS
        idle = 3_000
        s_start = max(dt[src], comm_free[src])
        r_start = max(dt[dst], comm_free[dst])
        end = max(s_start, r_start) + dur + idle
        for r, start, typ in ((src, s_start, "send"), (dst, r_start, "receive")):
            x = Transfer(transport, members.index(src), members.index(dst), nbytes, end - idle - dur, dur)
            name = f"hcom_{typ}__{g[-3:]}_{self.seq[g]}_1"
            self.ranks[r].comm.append(
                CommOp(step, name, typ, g, start, end, end - start - dur - idle, dur, idle, [x], nbytes // 2,
                       members.index(r))
            )
            comm_free[r] = end
        dt[dst] = max(dt[dst], end)

    def _launch(
        self,
        rm: RankModel,
        step: int,
        op: tuple[str, str, str, str],
        name: str,
        core: str,
        block: int,
        dur: int,
        ht: int,
        dt: int,
    ) -> tuple[int, int]:
        """Host op -> Enqueue -> Dequeue (queue thread) -> AscendCL call -> device task; flows between them."""
        r = rm.rank
        pid, main, qtid = self.host_pid[r], self.host_pid[r], self.host_pid[r] + 1409
        op_start = ht
        cid = len(rm.kernels) + 148
        rm.host.append(HostEv(op[2], "cpu_op", main, op_start, 18_000, {"Sequence number": -1, "Fwd thread id": 0}))
        rm.host.append(
            HostEv(op[1], "cpu_op", main, op_start + 1_000, 16_000, {"Sequence number": -1, "Fwd thread id": 0})
        )
        enq = op_start + 2_500
        rm.host.append(HostEv("Enqueue", "enqueue", main, enq, 11_000, {"correlation_id": cid}))
        deq = enq + 26_000
        rm.host.append(HostEv(f"Dequeue@{op[1]}", "dequeue", qtid, deq, 36_000, {"correlation_id": cid}))
        api = deq + 4_000
        self.task_ids[r] += 1
        conn = self.task_ids[r]
        rm.cann.append(
            HostEv(
                f"AscendCL@{op[1]}",
                "",
                qtid,
                api,
                21_000,
                {
                    "Thread Id": qtid,
                    "Mode": "ACL_NN",
                    "level": "acl",
                    "id": op[1],
                    "item_id": "0",
                    "connection_id": conn,
                },
            )
        )
        start = max(dt, api + 25_000)
        shapes, dtypes = ("4096,12288;4608,12288", "FLOAT16;FLOAT16") if op[0] == "MatMul" else ("4096,4608", "FLOAT16")
        rm.kernels.append(
            Kernel(step, name, op[0], core, start, dur, block, shapes, dtypes, self.task_ids[r], op[1], op[2])
        )
        h2d_id = str((conn << 32) | 0xFFFFFFFF)  # the older sample's form (format doc addendum)
        rm.flows.append(("HostToDevice", f"HostToDevice{h2d_id}", h2d_id, 0, qtid, api + 2_000, start))
        rm.flows.append(("async_npu", "torch_to_npu", str(start + 0), pid, main, op_start + 1_000, start))
        rm.flows.append(("async_task_queue", "enqueue_to_dequeue", str(cid), pid, main, enq, deq))
        return op_start + 30_000, start + dur + 1_500

    def _collective(
        self,
        step: int,
        g: str,
        op_type: str,
        arrivals: dict[int, int],
        comm_free: dict[int, int],
        nbytes: int,
        bucket: int | None,
        message_bytes: int | None = None,
    ) -> int:
        """One collective of group ``g`` (a ring): each member sends its chunk to its successor in ``k`` ring
        steps, one message per step, or messages of at most ``message_bytes`` each (every message pays
        :data:`MESSAGE_LATENCY_NS`); every member ends when the last one has arrived and transferred."""
        scn = self.scn
        members = self.group_members[g]
        n = len(members)
        self.seq[g] += 1
        g3 = g[-3:]
        name = f"hcom_{op_type}__{g3}_{self.seq[g]}_1"
        starts = {r: max(arrivals[r], comm_free[r]) for r in members}
        chunk = max(nbytes // n, 1)
        plans: dict[int, list[Transfer]] = {}
        transit: dict[int, int] = {}
        for li, r in enumerate(members):
            succ = members[(li + 1) % n]
            same_node = self.node(r) == self.node(succ)
            transport = "HCCS" if same_node else "RDMA"
            gbps = scn.hccs_gbps if same_node else scn.rdma_gbps
            if scn.slow_link == (r, succ):
                gbps /= scn.slow_link_factor
            if g in self.slow_groups:
                gbps /= scn.slow_group_factor
            if bucket is not None and bucket in scn.misaligned_buckets and chunk % 512 and transport == "HCCS":
                gbps /= scn.misaligned_factor
            k = 2 * (n - 1) if op_type == "allReduce" else (n - 1)
            xs = []
            sizes = [chunk] if message_bytes is None else _messages(chunk, message_bytes)
            for j in range(k if n > 1 else 0):
                for m, size in enumerate(sizes):
                    d = int(size / (gbps * 1e9) * 1e9) + MESSAGE_LATENCY_NS
                    if (
                        scn.rdma_retrans
                        and (step, bucket) == scn.rdma_retrans
                        and transport == "RDMA"
                        and j == 0
                        and m == 0
                        and not any(f[0] == r for f in self.facts.rdma_retrans)
                        and len(self.facts.rdma_retrans) < 1
                    ):
                        d = int(scn.rdma_retrans_us * 1000)
                        self.facts.rdma_retrans.append((r, step, name))
                    xs.append(Transfer(transport, li, (li + 1) % n, size, 0, d))
            xs.append(Transfer("LOCAL", li, li, chunk, 0, int(chunk / 200e9 * 1e9) + 500))
            plans[r] = xs
            transit[r] = sum(x.dur for x in xs)
            if bucket is not None and bucket in scn.misaligned_buckets and chunk % 512:
                self.facts.misaligned.append((r, step, name, chunk))
        idle = 3_000
        end = max(starts[r] + transit[r] + idle for r in members)
        for li, r in enumerate(members):
            wait = end - starts[r] - transit[r] - idle
            t = starts[r] + wait
            for x in plans[r]:
                x.start = t
                t += x.dur
            self.ranks[r].comm.append(
                CommOp(step, name, op_type, g, starts[r], end, wait, transit[r], idle, plans[r], nbytes // 2, li)
            )
            comm_free[r] = end
        return end


def _messages(nbytes: int, most: int) -> list[int]:
    """``nbytes`` cut into messages of ``most`` bytes (the last one the rest)."""
    full, rest = divmod(nbytes, most)
    return [most] * full + ([rest] if rest else [])


# ---------------------------------------------------------------------------------------------
# derived per-rank figures: overlap lanes, step trace
# ---------------------------------------------------------------------------------------------


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(a, b) for a, b in out]


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def overlap_lanes(rm: RankModel) -> dict[str, list[tuple[int, int]]]:
    """The four Overlap Analysis lanes (format doc §5.7) from the rank's device intervals."""
    comp = _merge([(k.start, k.start + k.dur) for k in rm.kernels])
    comm = _merge([(c.start, c.end) for c in rm.comm])
    span0 = min([a for a, _ in comp] + [a for a, _ in comm])
    span1 = max([b for _, b in comp] + [b for _, b in comm])
    busy = _merge(comp + comm)
    free = _subtract([(span0, span1)], busy)
    return {
        "Computing": comp,
        "Communication": comm,
        "Communication(Not Overlapped)": _subtract(comm, comp),
        "Free": free,
    }


def step_ranges(rm: RankModel) -> dict[int, tuple[int, int, int]]:
    """Device-extended step ranges (format doc §4.3): (start, end, host start) per step."""
    out = {}
    for step, hs, he in rm.steps:
        ks = [k for k in rm.kernels if k.step == step]
        cs = [c.start for c in rm.comm if c.step == step]  # a pipeline stage may receive before it computes
        start = min([k.start for k in ks] + cs) if ks or cs else hs
        end = max([k.start + k.dur for k in ks] + [he])
        out[step] = (start, end, hs)
    return out


# ---------------------------------------------------------------------------------------------
# writers: text form
# ---------------------------------------------------------------------------------------------


def rank_dir_name(scn: Scenario, r: int) -> str:
    node = r // scn.ranks_per_node
    suffix = "ascend_ms" if scn.flavor == "ms" else "ascend_pt"
    return f"node{node}_{437675 + 13 * r}_20240102103151{r % 1000:03d}_{suffix}"


def _profiler_info(scn: Scenario, r: int, end_ns: int) -> dict[str, Any]:
    """torch_npu profiler_info_{rank}.json keys (format doc §15); MindSpore's own keys for flavor 'ms'."""
    if scn.flavor == "ms":
        return {
            "profiler_parameters": {
                "profiler_level": "Level1",
                "activities": ["CPU", "NPU"],
                "aic_metrics": "ArithmeticUtilization",
                "with_stack": False,
                "profile_memory": False,
                "export_type": ["text"],
                "mstx": False,
            },
            "ms_profiler_info": {"rank_id": str(r), "device_id": str(r % scn.ranks_per_node)},
            "cann_profiler_info": {},
            "analysis_cost_time": {},
            "ms_version": "2.5.0",
            "cann_version": "8.0.0",
            "jit_level": "O0",
        }
    return {
        "config": {
            "common_config": {
                "activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                "schedule": {
                    "wait": 1,
                    "active": scn.steps,
                    "warmup": 1,
                    "repeat": 1,
                    "skip_first": 0,
                    "skip_first_wait": 0,
                },
                "record_shapes": True,
                "profile_memory": False,
                "with_stack": False,
                "with_flops": False,
                "with_modules": False,
            },
            "experimental_config": {
                "_profiler_level": "Level1",
                "_aic_metrics": "ACL_AICORE_ARITHMETIC_UTILIZATION",
                "_l2_cache": False,
                "_msprof_tx": False,
                "_mstx": False,
                "_data_simplification": True,
                "record_op_args": False,
                "_export_type": ["text"],
                "_host_sys": [],
                "_op_attr": False,
                "_gc_detect_threshold": None,
                "_mstx_domain_include": [],
                "_mstx_domain_exclude": [],
                "_sys_io": False,
                "_sys_interconnection": False,
            },
        },
        "start_info": {"syscnt_enable": True, "freq": 100000000, "start_cnt": 123456789, "start_monotonic": 987654321},
        "end_info": {"collectionTimeEnd": end_ns, "MonotonicTimeEnd": 1234567890123},
        "torch_npu_version": "2.6.0",
        "cann_version": "8.0.0",
        "rank_id": r,
    }


def _profiler_metadata(cl: Cluster, r: int) -> dict[str, Any]:
    """profiler_metadata.json keys (format doc §16)."""
    scn = cl.scn
    pgi = {}
    for h, members in cl.group_members.items():
        if r in members:
            pgi[cl.comm_names[h]] = {
                "group_name": cl.group_kind[h],
                "group_rank": members.index(r),
                "global_ranks": members,
            }
    return {
        "ENV_VARIABLES": {
            "ASCEND_GLOBAL_LOG_LEVEL": "3",
            "HCCL_RDMA_TC": "",
            "HCCL_RDMA_SL": "",
            "ACLNN_CACHE_LIMIT": "",
            "HOST_CACHE_CAPACITY": "",
            "ASCEND_ENHANCE_ENABLE": "",
            "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
            "ASCEND_LAUNCH_BLOCKING": "",
            "HCCL_ALGO": "",
        },
        "parallel_group_info": pgi,
        "distributed_args": {
            "world_size": scn.world,
            "tensor_model_parallel_size": scn.tp,
            "pipeline_model_parallel_size": scn.pp,
            "data_parallel_size": scn.world // (scn.tp * scn.pp),
            "context_parallel_size": 1,
            "expert_model_parallel_size": 1,
        },
    }


def _m(name: str, pid: int, tid: int, args: dict[str, Any]) -> str:
    return json.dumps({"name": name, "pid": pid, "tid": tid, "args": args, "ph": "M"})


def write_trace(cl: Cluster, rm: RankModel, path: Path) -> None:
    """trace_view.json: framework events first, then the CANN timeline, then flows (format doc §5.1)."""
    scn = cl.scn
    r = rm.rank
    pid = cl.host_pid[r]
    qtid = pid + 1409
    cann_pid = pid * 100 + 2
    hw_pid = 800 + r % 100
    hccl_pid = 900 + r % 100
    ov_pid = pid * 10000 + 1100
    out: list[str] = []
    ms = scn.flavor == "ms"
    if ms:  # MindSpore: framework lane 'MindSpore' (pid 1), no task queue, dur written as a string (format doc §20)
        pid = 1
    for e in sorted(rm.host, key=lambda e: (e.start, -e.dur)):
        if ms and e.cat in ("enqueue", "dequeue"):
            continue
        if ms:
            name = (
                e.name if e.name.startswith("ProfilerStep#") else f"Default::{e.name.replace('::', '_')}::KernelLaunch"
            )
            out.append(
                json.dumps(
                    {
                        "ph": "X",
                        "name": name,
                        "pid": pid,
                        "tid": e.tid,
                        "ts": us(e.start),
                        "dur": str(us_f(e.dur)),
                        "cat": "",
                        "args": {},
                    }
                )
            )
            continue
        out.append(
            json.dumps(
                {
                    "ph": "X",
                    "name": e.name,
                    "pid": pid,
                    "tid": e.tid,
                    "ts": us(e.start),
                    "dur": us_f(e.dur),
                    "cat": e.cat,
                    "args": e.args,
                }
            )
        )
    out.append(
        json.dumps(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "MindSpore" if ms else "Python"}}
        )
    )
    out.append(json.dumps({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}}))
    out.append(json.dumps({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": 0}}))
    for tid, sort in ((pid, pid), (qtid, qtid + 1)):
        out.append(
            json.dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"Thread {tid}"}})
        )
        out.append(
            json.dumps({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort}})
        )
    for e in rm.flows:
        if e[0] == "async_task_queue" and not ms:
            out.append(
                json.dumps(
                    {
                        "ph": "s",
                        "bp": "e",
                        "name": e[1],
                        "id": int(e[2]),
                        "pid": pid,
                        "tid": e[4],
                        "ts": us(e[5]),
                        "cat": e[0],
                    }
                )
            )
            out.append(
                json.dumps(
                    {
                        "ph": "f",
                        "bp": "e",
                        "name": e[1],
                        "id": int(e[2]),
                        "pid": pid,
                        "tid": qtid,
                        "ts": us(e[6]),
                        "cat": e[0],
                    }
                )
            )
    # CANN timeline: hardware, CANN, HCCL, overlap
    out.append(_m("process_name", hw_pid, 0, {"name": "Ascend Hardware"}))
    out.append(_m("thread_name", hw_pid, 2, {"name": "Stream 2"}))
    out.append(_m("thread_sort_index", hw_pid, 2, {"sort_index": 2}))
    out.append(_m("process_labels", hw_pid, 0, {"labels": "NPU"}))
    out.append(_m("process_sort_index", hw_pid, 0, {"sort_index": 8}))
    out.append(_m("process_name", cann_pid, 0, {"name": "CANN"}))
    for tid in (pid, qtid):
        out.append(_m("thread_name", cann_pid, tid, {"name": f"Thread {tid}"}))
        out.append(_m("thread_sort_index", cann_pid, tid, {"sort_index": tid}))
    out.append(_m("process_labels", cann_pid, 0, {"labels": "CPU"}))
    out.append(_m("process_sort_index", cann_pid, 0, {"sort_index": 2}))
    # HCCL: one operator lane per group, followed by its plane lanes (tid = op lane tid + p + 1)
    groups = sorted({c.group for c in rm.comm}, key=lambda g: list(cl.group_members).index(g))
    lane_tid = {}
    out.append(_m("process_name", hccl_pid, 0, {"name": scn.comm_process_name}))
    for gi, g in enumerate(groups):
        t = 1000 * (gi + 1)
        lane_tid[g] = t
        out.append(_m("thread_name", hccl_pid, t, {"name": f"Group {g} Communication"}))
        out.append(_m("thread_sort_index", hccl_pid, t, {"sort_index": t}))
        out.append(_m("thread_name", hccl_pid, t + 1, {"name": "Plane 0"}))
        out.append(_m("thread_sort_index", hccl_pid, t + 1, {"sort_index": t + 1}))
    out.append(_m("process_labels", hccl_pid, 0, {"labels": "NPU"}))
    out.append(_m("process_sort_index", hccl_pid, 0, {"sort_index": 10}))
    out.append(_m("process_name", ov_pid, 0, {"name": "Overlap Analysis"}))
    for tid, nm in enumerate(("Computing", "Communication", "Communication(Not Overlapped)", "Free")):
        out.append(_m("thread_name", ov_pid, tid, {"name": nm}))
    out.append(_m("process_labels", ov_pid, 0, {"labels": "NPU"}))
    out.append(_m("process_sort_index", ov_pid, 0, {"sort_index": 11}))
    for e in rm.cann:
        out.append(
            json.dumps(
                {
                    "name": e.name,
                    "pid": cann_pid,
                    "tid": e.tid,
                    "ts": us(e.start),
                    "dur": e.dur / 1000.0,
                    "args": e.args,
                    "ph": "X",
                }
            )
        )
    flows_by_kernel = {f[6]: f for f in rm.flows if f[0] == "HostToDevice"}
    for k in rm.kernels:
        f = flows_by_kernel[k.start]
        out.append(
            json.dumps(
                {
                    "name": f[1],
                    "ph": "s",
                    "cat": "HostToDevice",
                    "id": f[2],
                    "pid": cann_pid,
                    "tid": f[4],
                    "ts": us(f[5]),
                }
            )
        )
        task_type = k.core
        out.append(
            json.dumps(
                {
                    "name": k.name,
                    "pid": hw_pid,
                    "tid": 2,
                    "ts": us(k.start),
                    "dur": k.dur / 1000.0,
                    "args": {
                        "Model Id": 4294967295,
                        "Task Type": task_type,
                        "Stream Id": 2,
                        "Task Id": k.task_id,
                        "Batch Id": 0,
                        "Subtask Id": 4294967295,
                        "connection_id": k.task_id,
                    },
                    "ph": "X",
                }
            )
        )
        out.append(
            json.dumps(
                {
                    "name": f[1],
                    "ph": "f",
                    "id": f[2],
                    "ts": us(k.start),
                    "cat": "HostToDevice",
                    "pid": hw_pid,
                    "tid": 2,
                    "bp": "e",
                }
            )
        )
    for c in rm.comm:
        t = lane_tid[c.group]
        out.append(
            json.dumps(
                {
                    "name": c.name,
                    "pid": hccl_pid,
                    "tid": t,
                    "ts": us(c.start),
                    "dur": (c.end - c.start) / 1000.0,
                    "args": {
                        "connection_id": 0,
                        "model id": 4294967295,
                        "data_type": "FP16",
                        "alg_type": "RING",
                        "count": c.count,
                        "relay": "no",
                        "retry": "no",
                        "rank_size": len(cl.group_members[c.group]),
                    },
                    "ph": "X",
                }
            )
        )
        waits = [("Notify_Wait", c.start, c.wait, 0, None)]
        for x in c.transfers:
            nm = "RDMASend" if x.transport == "RDMA" else "Memcpy"
            waits.append((nm, x.start, x.dur, x.size, x))
        for nm, st, d, size, x in waits:
            tr = "SDMA" if x is None or x.transport != "RDMA" else "RDMA"
            link = "ON_CHIP" if x is None or x.transport == "LOCAL" else ("HCCS" if x.transport == "HCCS" else "ROCE")
            out.append(
                json.dumps(
                    {
                        "name": nm,
                        "pid": hccl_pid,
                        "tid": t + 1,
                        "ts": us(st),
                        "dur": d / 1000.0,
                        "args": {
                            "notify_id": 0,
                            "duration estimated(us)": d / 1000.0,
                            "stream id": 3,
                            "task id": 0,
                            "context id": 4294967295,
                            "task type": "Notify Wait" if x is None else tr,
                            "src rank": c.local_rank if x is None else x.src_local,
                            "dst rank": c.local_rank if x is None else x.dst_local,
                            "transport type": tr,
                            "size(Byte)": size,
                            "data type": "FP16",
                            "link type": link,
                            "bandwidth(GB/s)": round(size / d, 4) if d else 0,
                            "model id": 4294967295,
                        },
                        "ph": "X",
                    }
                )
            )
    for tid, (lane, ivs) in enumerate(overlap_lanes(rm).items()):
        for s, e in ivs:
            out.append(
                json.dumps({"name": lane, "pid": ov_pid, "tid": tid, "ts": us(s), "dur": (e - s) / 1000.0, "ph": "X"})
            )
    for e in rm.flows:
        if e[0] == "async_npu":
            name, fid = ("mindspore_to_npu", us(e[6])) if ms else (e[1], int(e[2]))  # MindSpore: string id
            out.append(
                json.dumps(
                    {
                        "ph": "s",
                        "bp": "e",
                        "name": name,
                        "id": fid,
                        "pid": pid,
                        "tid": e[4],
                        "ts": us(e[5]),
                        "cat": e[0],
                    }
                )
            )
            out.append(
                json.dumps(
                    {
                        "ph": "f",
                        "bp": "e",
                        "name": name,
                        "id": fid,
                        "pid": hw_pid,
                        "tid": 2,
                        "ts": us(e[6]),
                        "cat": e[0],
                    }
                )
            )
    path.write_text("[\n" + ",\n".join(out) + "\n]\n")


def _csv_text(header: list[str], rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)  # Python's csv ends rows with CR LF, as torch_npu's files (format doc §3.3)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def _kd_rows(rm: RankModel) -> list[list[Any]]:
    rows = []
    events = [("k", k.start, k) for k in rm.kernels] + [("c", c.start, c) for c in rm.comm]
    prev_end = None
    for kind, _, x in sorted(events, key=lambda e: e[1]):
        if kind == "k":
            k: Kernel = x
            wait = 0 if prev_end is None else max(k.start - prev_end, 0)
            prev_end = k.start + k.dur
            q = lambda s: '"' + s + '"'
            oshape = k.shapes.split(";")[0]
            if k.core == "AI_CPU":
                pmu = ["N/A"] * 14
            elif k.core == "AI_CORE":
                t = round(k.dur / 1000 * 0.98, 2)
                pmu = [t, int(t * 44400), 0.893, 0, 473250242560, 0, 0, 0, 0, 0, 0, 0, 0, 0]
            else:
                t = round(k.dur / 1000 * 0.96, 2)
                pmu = [0, 0, 0, 0, 0, 0, t, int(t * 88800), 0, 0.35, 0.01, 0.0, 0, 137176320]
            rows.append(
                [
                    k.step,
                    4294967295,
                    k.task_id,
                    2,
                    k.name,
                    k.op_type,
                    k.core,
                    us(k.start),
                    us(k.dur),
                    us(wait),
                    k.block,
                    0,
                    q(k.shapes),
                    k.dtypes,
                    ";".join(["FORMAT_ND"] * len(k.dtypes.split(";"))),
                    q(oshape),
                    "FLOAT16",
                    "FORMAT_ND",
                    "N/A",
                    *pmu,
                ]
            )
        else:
            c: CommOp = x
            rows.append(
                [
                    c.step,
                    4294967295,
                    "N/A",
                    "N/A",
                    c.name,
                    f"hcom_{c.op_type}_",
                    "HCCL",
                    us(c.start),
                    us(c.end - c.start),
                    "0",
                    0,
                    *(["N/A"] * 22),
                ]
            )
    return rows


def _comm_json(cl: Cluster, rm: RankModel) -> dict[str, Any]:
    """communication.json (format doc §8): per step, per op, time and bandwidth info; Total Op Info."""
    out: dict[str, Any] = {}
    for step in cl.facts.steps:
        ops = [c for c in rm.comm if c.step == step]
        coll: dict[str, Any] = {}
        for c in ops:
            bw: dict[str, Any] = {}
            for tr in TRANSPORTS:
                xs = [x for x in c.transfers if x.transport == tr] if tr in ("HCCS", "RDMA") else []
                if tr == "SDMA":
                    xs = [x for x in c.transfers if x.transport in ("HCCS",)]
                size = sum(x.size for x in xs)
                t = sum(x.dur for x in xs)
                dist: dict[str, list[float]] = {}
                if tr != "SDMA":
                    for x in xs:
                        key = f"{mb(x.size):.6f}".rstrip("0").rstrip(".")
                        dist.setdefault(key, [0, 0.0])
                        dist[key][0] += 1
                        dist[key][1] = round(dist[key][1] + ms(x.dur), 6)
                large = sum(1 for x in xs if tr in LARGE_PACKET_MB and mb(x.size) > LARGE_PACKET_MB[tr])
                bw[tr] = {
                    "Transit Size(MB)": round(mb(size), 6),
                    "Transit Time(ms)": round(ms(t), 6),
                    "Bandwidth(GB/s)": round(mb(size) / ms(t), 4) if t else 0,
                    "Large Packet Ratio": round(large / len(xs), 4) if xs else 0,
                    "Size Distribution": dist,
                }
            wait, transit, sync = ms(c.wait), ms(c.transit - _local_dur(c)), ms(c.wait)
            coll[f"{c.name}@{c.group}"] = {
                "Communication Time Info": {
                    "Start Timestamp(us)": c.start / 1000.0,
                    "Elapse Time(ms)": round(ms(c.end - c.start), 6),
                    "Transit Time(ms)": round(transit, 6),
                    "Wait Time(ms)": round(wait, 6),
                    "Synchronization Time(ms)": round(sync, 6),
                    "Idle Time(ms)": round(ms(c.end - c.start) - transit - wait, 6),
                    "Wait Time Ratio": round(wait / (wait + transit), 4) if wait + transit else 0,
                    "Synchronization Time Ratio": round(sync / (sync + transit), 4) if sync + transit else 0,
                },
                "Communication Bandwidth Info": bw,
            }
        if coll:
            tot_t = {
                k: 0.0
                for k in TIME_INFO_KEYS
                if k not in ("Start Timestamp(us)", "Wait Time Ratio", "Synchronization Time Ratio")
            }
            tot_b: dict[str, Any] = {
                tr: {"Transit Time(ms)": 0.0, "Transit Size(MB)": 0.0, "Size Distribution": {}} for tr in TRANSPORTS
            }
            for v in coll.values():
                for k in tot_t:
                    tot_t[k] += v["Communication Time Info"][k]
                for tr, b in v["Communication Bandwidth Info"].items():
                    tot_b[tr]["Transit Time(ms)"] += b["Transit Time(ms)"]
                    tot_b[tr]["Transit Size(MB)"] += b["Transit Size(MB)"]
                    for sz, (cnt, tm) in b["Size Distribution"].items():
                        d = tot_b[tr]["Size Distribution"].setdefault(sz, [0, 0.0])
                        d[0] += cnt
                        d[1] += tm
            w, tr_, s = tot_t["Wait Time(ms)"], tot_t["Transit Time(ms)"], tot_t["Synchronization Time(ms)"]
            tot_t["Wait Time Ratio"] = round(w / (w + tr_), 4) if w + tr_ else 0
            tot_t["Synchronization Time Ratio"] = round(s / (s + tr_), 4) if s + tr_ else 0
            coll["Total Op Info"] = {"Communication Time Info": tot_t, "Communication Bandwidth Info": tot_b}
            out[f"step{step}"] = {"collective": coll}
    return out


def _local_dur(c: CommOp) -> int:
    return sum(x.dur for x in c.transfers if x.transport == "LOCAL")


_MATRIX_TYPE = {"allReduce": "allreduce", "allGather": "allgather", "send": "send", "receive": "receive"}


def _matrix_json(cl: Cluster, rm: RankModel) -> dict[str, Any]:
    """communication_matrix.json (format doc §9): per op type and group, top1/middle/bottom1..3/total per link."""
    out: dict[str, Any] = {}
    for step in cl.facts.steps:
        by: dict[tuple[str, str], dict[str, list[tuple[float, float, float, str, str]]]] = {}
        for c in rm.comm:
            if c.step != step:
                continue
            links: dict[str, list[Transfer]] = {}
            for x in c.transfers:
                links.setdefault(f"{x.src_local}-{x.dst_local}", []).append(x)
            for lk, xs in links.items():
                size, t = sum(x.size for x in xs), sum(x.dur for x in xs)
                tr = xs[0].transport
                by.setdefault((_MATRIX_TYPE[c.op_type], c.group), {}).setdefault(lk, []).append(
                    (round(mb(size) / ms(t), 4) if t else 0, mb(size), ms(t), tr, c.name)
                )
        coll: dict[str, Any] = {}
        for (typ, g), links in by.items():
            for suffix in ("top1", "middle", "bottom1", "bottom2", "bottom3", "total"):
                entry: dict[str, Any] = {}
                for lk, vals in links.items():
                    vs = sorted(vals, key=lambda v: -v[0])
                    if suffix == "total":
                        size, t = sum(v[1] for v in vs), sum(v[2] for v in vs)
                        entry[lk] = {
                            "Transport Type": vs[0][3],
                            "Transit Size(MB)": round(size, 6),
                            "Transit Time(ms)": round(t, 6),
                            "Bandwidth(GB/s)": round(size / t, 4) if t else 0,
                        }
                        continue
                    idx = {
                        "top1": 0,
                        "middle": len(vs) // 2,
                        "bottom1": len(vs) - 1,
                        "bottom2": len(vs) - 2,
                        "bottom3": len(vs) - 3,
                    }[suffix]
                    if idx < 0 or (suffix == "bottom2" and len(vs) < 2) or (suffix == "bottom3" and len(vs) < 3):
                        continue
                    v = vs[idx]
                    entry[lk] = {
                        "Transport Type": v[3],
                        "Transit Size(MB)": round(v[1], 6),
                        "Transit Time(ms)": round(v[2], 6),
                        "Bandwidth(GB/s)": v[0],
                        "Op Name": v[4],
                    }
                if entry:
                    coll[f"{typ}-{suffix}@{g}"] = entry
        if coll:
            out[f"step{step}"] = {"collective": coll}
    return out


def _step_trace_rows(rm: RankModel, device_id: int) -> list[list[Any]]:
    lanes = overlap_lanes(rm)
    rows = []
    for step, (s, e, hs) in step_ranges(rm).items():
        sums = {k: sum(b - a for a, b in v if s <= a < e) for k, v in lanes.items()}
        ivs = [iv for v in lanes.values() for iv in v if s <= iv[0] < e]
        stage = (max(b for _, b in ivs) - min(a for a, _ in ivs)) if ivs else 0
        comp, cno, comm, free = (
            sums["Computing"],
            sums["Communication(Not Overlapped)"],
            sums["Communication"],
            sums["Free"],
        )
        rows.append(
            [
                device_id,
                step,
                comp / 1000,
                cno / 1000,
                (comm - cno) / 1000,
                comm / 1000,
                free / 1000,
                stage / 1000,
                0.0,
                max(cno, 0) / 1000,
                (s - hs) / 1000,
            ]
        )
    return rows


def _op_stat_rows(rm: RankModel) -> list[list[Any]]:
    agg: dict[tuple[str, str], list[int]] = {}
    for k in rm.kernels:
        agg.setdefault((k.op_type, k.core), []).append(k.dur)
    total = sum(sum(v) for v in agg.values())
    rows = []
    for (typ, core), ds in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
        rows.append(
            [
                typ,
                core,
                len(ds),
                sum(ds) / 1000,
                min(ds) / 1000,
                round(statistics.fmean(ds) / 1000, 3),
                max(ds) / 1000,
                round(100 * sum(ds) / total, 4),
            ]
        )
    return rows


def write_rank_text(cl: Cluster, rm: RankModel, d: Path) -> list[Path]:
    out = d / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True, exist_ok=True)
    write_trace(cl, rm, out / "trace_view.json")
    kd_header, kd_rows, st_header = KD_HEADER, _kd_rows(rm), STEP_TRACE_HEADER
    st_rows = _step_trace_rows(rm, rm.rank % cl.scn.ranks_per_node)
    if (
        cl.scn.flavor == "ms"
    ):  # 'Step ID', Name = '<launch op>/<kernel>', no Device_id in step_trace_time (format doc §20)
        kd_header = ["Step ID" if h == "Step Id" else h for h in KD_HEADER]
        ops = {k.name: k.host_op for k in rm.kernels}
        kd_rows = [[*r[:4], f"{ops[r[4]]}/{r[4]}" if r[4] in ops else r[4], *r[5:]] for r in kd_rows]
        st_header, st_rows = STEP_TRACE_HEADER[1:], [r[1:] for r in st_rows]
    (out / "kernel_details.csv").write_text(_csv_text(kd_header, kd_rows), newline="")
    (out / "step_trace_time.csv").write_text(_csv_text(st_header, st_rows), newline="")
    (out / "communication.json").write_text(json.dumps(_comm_json(cl, rm), indent=4))
    (out / "communication_matrix.json").write_text(json.dumps(_matrix_json(cl, rm), indent=4))
    (out / "op_statistic.csv").write_text(_csv_text(OP_STAT_HEADER, _op_stat_rows(rm)), newline="")
    return [
        out / n
        for n in (
            "trace_view.json",
            "kernel_details.csv",
            "step_trace_time.csv",
            "communication.json",
            "communication_matrix.json",
            "op_statistic.csv",
        )
    ]


# ---------------------------------------------------------------------------------------------
# writers: db form (format doc §17)
# ---------------------------------------------------------------------------------------------

DB_SCHEMA = {
    "STRING_IDS": "id INTEGER PRIMARY KEY, value TEXT",
    "ENUM_API_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
    "ENUM_HCCL_DATA_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
    "ENUM_HCCL_LINK_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
    "ENUM_HCCL_TRANSPORT_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
    "TASK": "startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, globalTaskId INTEGER, globalPid INTEGER, "
    "taskType INTEGER, contextId INTEGER, streamId INTEGER, taskId INTEGER, modelId INTEGER",
    "COMPUTE_TASK_INFO": "name INTEGER, globalTaskId INTEGER, blockDim INTEGER, mixBlockDim INTEGER, taskType INTEGER, opType INTEGER, "
    "inputFormats INTEGER, inputDataTypes INTEGER, inputShapes INTEGER, outputFormats INTEGER, "
    "outputDataTypes INTEGER, outputShapes INTEGER",
    "TASK_PMU_INFO": "globalTaskId INTEGER, name INTEGER, value NUMERIC",
    "COMMUNICATION_OP": "opName INTEGER, startNs INTEGER, endNs INTEGER, connectionId INTEGER, groupName INTEGER, opId INTEGER PRIMARY KEY, "
    "relay INTEGER, retry INTEGER, dataType INTEGER, algType INTEGER, count NUMERIC, opType INTEGER",
    "COMMUNICATION_TASK_INFO": "name INTEGER, globalTaskId INTEGER, taskType INTEGER, planeId INTEGER, groupName INTEGER, notifyId INTEGER, "
    "rdmaType INTEGER, srcRank INTEGER, dstRank INTEGER, transportType INTEGER, size INTEGER, dataType INTEGER, "
    "linkType INTEGER, opId INTEGER",
    "CANN_API": "startNs INTEGER, endNs INTEGER, type INTEGER, globalTid INTEGER, connectionId INTEGER PRIMARY KEY, name INTEGER",
    "PYTORCH_API": "startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER, name INTEGER, sequenceNumber INTEGER, "
    "fwdThreadId INTEGER, inputDtypes INTEGER, inputShapes INTEGER, callchainId INTEGER, type INTEGER",
    "CONNECTION_IDS": "id INTEGER, connectionId INTEGER",
    "STEP_TIME": "id INTEGER, startNs INTEGER, endNs INTEGER",
    "META_DATA": "name TEXT, value TEXT",
    "RANK_DEVICE_MAP": "rankId INTEGER, deviceId INTEGER",
    "HOST_INFO": "hostUid TEXT, hostName TEXT",
}
ANALYSIS_SCHEMA = {
    "CommAnalyzerTime": "hccl_op_name TEXT, group_name TEXT, start_timestamp NUMERIC, elapse_time NUMERIC, transit_time NUMERIC, "
    "wait_time NUMERIC, synchronization_time NUMERIC, idle_time NUMERIC, step TEXT, type TEXT",
    "CommAnalyzerBandwidth": "hccl_op_name TEXT, group_name TEXT, transport_type TEXT, transit_size NUMERIC, transit_time NUMERIC, "
    "bandwidth NUMERIC, large_packet_ratio NUMERIC, package_size NUMERIC, count NUMERIC, total_duration NUMERIC, "
    "step TEXT, type TEXT",
    "CommAnalyzerMatrix": "hccl_op_name TEXT, group_name TEXT, src_rank TEXT, dst_rank TEXT, transport_type TEXT, transit_size NUMERIC, "
    "transit_time NUMERIC, bandwidth NUMERIC, step TEXT, type TEXT, op_name TEXT",
    "StepTraceTime": "deviceId INTEGER, step TEXT, computing NUMERIC, communication_not_overlapped NUMERIC, overlapped NUMERIC, "
    "communication NUMERIC, free NUMERIC, stage NUMERIC, bubble NUMERIC, "
    "communication_not_overlapped_and_exclude_receive NUMERIC, preparing NUMERIC",
}


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        if s not in self.ids:
            self.ids[s] = len(self.ids) + 1
        return self.ids[s]


def write_rank_db(cl: Cluster, rm: RankModel, d: Path) -> list[Path]:
    out = d / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True, exist_ok=True)
    r = rm.rank
    dev = r % cl.scn.ranks_per_node
    path = out / f"ascend_pytorch_profiler_{r}.db"
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    S = _Strings()
    for t, cols in DB_SCHEMA.items():
        con.execute(f"CREATE TABLE {t} ({cols})")
    pid = cl.host_pid[r]
    gtid = lambda tid: (pid << 32) | tid
    api_types = [
        (10000, "node"),
        (5000, "runtime"),
        (20000, "acl"),
        (50001, "op"),
        (50002, "queue"),
        (50003, "trace"),
        (50004, "mstx"),
    ]
    con.executemany("INSERT INTO ENUM_API_TYPE VALUES (?, ?)", api_types)
    con.executemany(
        "INSERT INTO ENUM_HCCL_DATA_TYPE VALUES (?, ?)",
        [(0, "INT8"), (1, "INT16"), (2, "INT32"), (3, "FP16"), (4, "FP32")],
    )
    con.executemany(
        "INSERT INTO ENUM_HCCL_LINK_TYPE VALUES (?, ?)", [(0, "ON_CHIP"), (1, "HCCS"), (2, "PCIE"), (3, "ROCE")]
    )
    con.executemany("INSERT INTO ENUM_HCCL_TRANSPORT_TYPE VALUES (?, ?)", [(0, "SDMA"), (1, "RDMA"), (2, "LOCAL")])
    tasks, cti, pmu, capi, papi, conn_ids = [], [], [], [], [], []
    gtask = 0
    flows = {f[6]: f for f in rm.flows if f[0] == "HostToDevice"}
    for k in rm.kernels:
        gtask += 1
        f = flows[k.start]
        conn = int(f[2]) >> 32
        tasks.append(
            (
                k.start,
                k.start + k.dur,
                dev,
                conn,
                gtask,
                pid,
                S("KERNEL_AICORE" if k.core != "AI_CPU" else "KERNEL_AICPU"),
                4294967295,
                2,
                k.task_id,
                4294967295,
            )
        )
        oshape = k.shapes.split(";")[0]
        cti.append(
            (
                S(k.name),
                gtask,
                k.block,
                0,
                S(k.core),
                S(k.op_type),
                S(";".join(["FORMAT_ND"] * len(k.dtypes.split(";")))),
                S(k.dtypes),
                S(k.shapes),
                S("FORMAT_ND"),
                S("FLOAT16"),
                S(oshape),
            )
        )
        if k.core == "AI_CORE":
            pmu += [(gtask, S("aic_total_time"), k.dur * 0.98), (gtask, S("aic_mac_ratio"), 0.893)]
        elif k.core != "AI_CPU":
            pmu += [(gtask, S("aiv_total_time"), k.dur * 0.96), (gtask, S("aiv_vec_ratio"), 0.35)]
    unlinked = iter(range(1 << 30, 1 << 31))  # connectionId is the key: a call that launches no task gets its own
    for e in rm.cann:
        if e.name.startswith("AscendCL@"):
            conn = e.args.get("connection_id") or next(unlinked)
            capi.append((e.start, e.start + e.dur, 20000, gtid(e.tid), conn, S(e.name.split("@", 1)[1])))
    ops, ctasks = [], []
    for oi, c in enumerate(rm.comm):
        # 4294967295: "no connection" (format doc §3.3); the generator has no host-side HCCL launch
        ops.append(
            (S(c.name), c.start, c.end, 4294967295, S(c.group), oi + 1, 0, 0, 3, 0, c.count, S(f"hcom_{c.op_type}_"))
        )
        seq = [("Notify_Wait", c.start, c.wait, None)] + [
            ("RDMASend" if x.transport == "RDMA" else "Memcpy", x.start, x.dur, x) for x in c.transfers
        ]
        for nm, st, du, x in seq:
            gtask += 1
            tasks.append((st, st + du, dev, 0, gtask, pid, S("C_CORE_SQE"), 4294967295, 3, 0, 4294967295))
            tr = (
                1 if x is not None and x.transport == "RDMA" else (2 if x is not None and x.transport == "LOCAL" else 0)
            )
            link = 0 if x is None or x.transport == "LOCAL" else (1 if x.transport == "HCCS" else 3)
            ctasks.append(
                (
                    S(nm),
                    gtask,
                    S("Notify Wait" if x is None else ("RDMA" if tr == 1 else "SDMA")),
                    0,
                    S(c.group),
                    0,
                    0,
                    c.local_rank if x is None else x.src_local,
                    c.local_rank if x is None else x.dst_local,
                    tr,
                    0 if x is None else x.size,
                    3,
                    link,
                    oi + 1,
                )
            )
    host_sorted = sorted(rm.host, key=lambda e: (e.start, -e.dur))
    for i, e in enumerate(host_sorted):
        typ = {"cpu_op": 50001, "enqueue": 50002, "dequeue": 50002}.get(e.cat, 50001)
        cid = i + 1 if e.cat == "cpu_op" and e.name.startswith("aclnn") else None
        papi.append((str(e.start), str(e.start + e.dur), gtid(e.tid), cid, S(e.name), -1, 0, None, None, None, typ))
    # connection ids: each aclnn torch op -> the CANN call that launched its kernel (matched by flow time)
    async_by_op = {f[5]: f[6] for f in rm.flows if f[0] == "async_npu"}
    for row, e in zip(papi, host_sorted, strict=True):
        if row[3] is not None and e.start in async_by_op:
            kstart = async_by_op[e.start]
            conn_ids.append((row[3], int(flows[kstart][2]) >> 32))
    con.executemany(f"INSERT INTO TASK VALUES ({','.join('?' * 11)})", tasks)
    con.executemany(f"INSERT INTO COMPUTE_TASK_INFO VALUES ({','.join('?' * 12)})", cti)
    con.executemany("INSERT INTO TASK_PMU_INFO VALUES (?, ?, ?)", pmu)
    con.executemany(f"INSERT INTO COMMUNICATION_OP VALUES ({','.join('?' * 12)})", ops)
    con.executemany(f"INSERT INTO COMMUNICATION_TASK_INFO VALUES ({','.join('?' * 14)})", ctasks)
    con.executemany("INSERT INTO CANN_API VALUES (?, ?, ?, ?, ?, ?)", capi)
    con.executemany(f"INSERT INTO PYTORCH_API VALUES ({','.join('?' * 11)})", papi)
    con.executemany("INSERT INTO CONNECTION_IDS VALUES (?, ?)", conn_ids)
    con.executemany("INSERT INTO STEP_TIME VALUES (?, ?, ?)", [(s, a, b) for s, a, b in rm.steps])
    meta = _profiler_metadata(cl, r)
    con.executemany("INSERT INTO META_DATA VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])
    con.execute("INSERT INTO RANK_DEVICE_MAP VALUES (?, ?)", (r, dev))
    con.execute(
        "INSERT INTO HOST_INFO VALUES (?, ?)",
        (str(10000 + r // cl.scn.ranks_per_node), f"node{r // cl.scn.ranks_per_node}"),
    )
    con.executemany("INSERT INTO STRING_IDS VALUES (?, ?)", [(i, s) for s, i in S.ids.items()])
    con.commit()
    con.close()
    apath = out / "analysis.db"
    con = sqlite3.connect(apath)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    for t, cols in ANALYSIS_SCHEMA.items():
        con.execute(f"CREATE TABLE {t} ({cols})")
    cj = _comm_json(cl, rm)
    times, bws = [], []
    for sk, kinds in cj.items():
        for typ, opsd in kinds.items():
            for key, v in opsd.items():
                if key.startswith("Total"):
                    continue
                op, g = key.rsplit("@", 1)
                ti = v["Communication Time Info"]
                times.append(
                    (
                        op,
                        g,
                        ti["Start Timestamp(us)"],
                        ti["Elapse Time(ms)"],
                        ti["Transit Time(ms)"],
                        ti["Wait Time(ms)"],
                        ti["Synchronization Time(ms)"],
                        ti["Idle Time(ms)"],
                        sk,
                        typ,
                    )
                )
                for tr, b in v["Communication Bandwidth Info"].items():
                    dist = b["Size Distribution"] or {None: [None, None]}
                    for size, (cnt, tot) in dist.items():
                        bws.append(
                            (
                                op,
                                g,
                                tr,
                                b["Transit Size(MB)"],
                                b["Transit Time(ms)"],
                                b["Bandwidth(GB/s)"],
                                b["Large Packet Ratio"],
                                None if size is None else float(size),
                                cnt,
                                tot,
                                sk,
                                typ,
                            )
                        )
    mats = []
    for sk, kinds in _matrix_json(cl, rm).items():
        for typ, aggs in kinds.items():
            for key, links in aggs.items():
                op, g = key.rsplit("@", 1)
                for lk, v in links.items():
                    src, dst = lk.split("-")
                    mats.append(
                        (
                            op,
                            g,
                            src,
                            dst,
                            v["Transport Type"],
                            v["Transit Size(MB)"],
                            v["Transit Time(ms)"],
                            v["Bandwidth(GB/s)"],
                            sk,
                            typ,
                            v.get("Op Name", ""),
                        )
                    )
    st = [(dev, str(row[1]), *row[2:]) for row in _step_trace_rows(rm, dev)]
    con.executemany(f"INSERT INTO CommAnalyzerTime VALUES ({','.join('?' * 10)})", times)
    con.executemany(f"INSERT INTO CommAnalyzerBandwidth VALUES ({','.join('?' * 12)})", bws)
    con.executemany(f"INSERT INTO CommAnalyzerMatrix VALUES ({','.join('?' * 11)})", mats)
    con.executemany(f"INSERT INTO StepTraceTime VALUES ({','.join('?' * 11)})", st)
    con.commit()
    con.close()
    return [path, apath]


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------


def generate(scn: Scenario | str, out: Path, form: str = "text") -> Facts:
    """Simulate ``scn`` and write one ``*_ascend_pt`` folder per rank under ``out`` (text, db or both)."""
    if isinstance(scn, str):
        scn = SCENARIOS[scn]
    cl = Cluster(scn)
    cl.simulate()
    facts = cl.facts
    facts.root = out
    out.mkdir(parents=True, exist_ok=True)
    for rm in cl.ranks:
        d = out / rank_dir_name(scn, rm.rank)
        d.mkdir(parents=True, exist_ok=True)
        end_ns = max(c.end for c in rm.comm) if rm.comm else rm.steps[-1][2]
        (d / f"profiler_info_{rm.rank}.json").write_text(json.dumps(_profiler_info(scn, rm.rank, end_ns), indent=4))
        (d / "profiler_metadata.json").write_text(json.dumps(_profiler_metadata(cl, rm.rank), indent=4))
        facts.rank_dirs[rm.rank] = d
        facts.files += [d / f"profiler_info_{rm.rank}.json", d / "profiler_metadata.json"]
        if form in ("text", "both"):
            facts.files += write_rank_text(cl, rm, d)
        if form in ("db", "both"):
            if scn.flavor == "ms":
                raise ValueError("the MindSpore flavour is generated in text form only")
            facts.files += write_rank_db(cl, rm, d)
    return facts


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("ascend_cluster")
    name = sys.argv[2] if len(sys.argv) > 2 else "faults8"
    form = sys.argv[3] if len(sys.argv) > 3 else "text"
    f = generate(name, target, form)
    print(f"wrote {len(f.rank_dirs)} ranks, {len(f.files)} files under {target}")
