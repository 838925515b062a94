"""The canonical model: every source (Kineto, torch_npu, MindSpore, text or .db) is loaded into these tables.

This module is the single source of truth for table names, columns, units and meaning.
Stages and rules read only these tables (and the derived views the stages add), never raw
exports, so one rule serves every source.

Conventions
-----------
* Times are integer **nanoseconds** (``*_ns``) on the source's own clock (Unix epoch for
  Kineto and Ascend). Sizes are **bytes**. Ratios are 0..1. Microsecond floats appear only
  in reports.
* ``rank`` is the global rank. ``step`` is the training step number as the profiler wrote it
  (``ProfilerStep#N`` -> N). When a trace has no step marker the whole trace is one window
  with ``step = NO_STEP`` (-1), rendered as ``null`` in reports.
* ``device`` is true for events that ran on an accelerator timeline (a CUDA/HIP stream, an
  Ascend task queue), false for host threads.

Event kinds (closed vocabulary, column ``events.kind``)
-------------------------------------------------------
See :data:`KINDS`. Later stages rely on it:

* device busy time = events with ``device`` and ``kind`` in :data:`DEVICE_BUSY_KINDS`;
* communication = ``kind = 'comm'`` (device collectives/P2P; on CPU-only traces the host-side
  gloo/c10d collectives, with ``device = false``);
* host activity = :data:`HOST_BUSY_KINDS` on host threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NO_STEP = -1

KINDS: dict[str, str] = {
    "host_op": "framework operator on a host thread (aten::*, torch_npu op, MindSpore op)",
    "python": "Python function (with_stack / python tracer), including 'Python GC' events",
    "runtime": "runtime / launch API call on the host (cudaLaunchKernel, aclrtLaunch*, AscendCL API)",
    "kernel": "device compute kernel (CUDA/HIP kernel, Ascend AI Core / AI Vector / AI CPU task)",
    "comm": "communication: NCCL/RCCL/HCCL device kernels and tasks, gloo/c10d host collectives and P2P",
    "memcpy": "memory copy (H2D, D2H, D2D, on device) ",
    "memset": "memory set on device",
    "sync": "host waits for the device (cudaDeviceSynchronize, cudaStreamSynchronize, "
    "cudaEventSynchronize, aclrtSynchronize*, ...); on a device row (Kineto cuda_sync), the device-side record "
    "of such a call or of a stream's wait on an event (cudaStreamWaitEvent)",
    "dataloader": "data loading on the host (enumerate(DataLoader)#...__next__, Ascend dataloader events)",
    "queue": "host task-queue hand-off (torch_npu Enqueue / Dequeue)",
    "step": "step marker (ProfilerStep#N)",
    "annotation": "user annotation / record_function range (host or device)",
    "other": "anything else that has a duration",
}

DEVICE_BUSY_KINDS = ("kernel", "comm", "memcpy", "memset")

# SQL: bytes per element of a PyTorch / NumPy dtype name held in the expression ``{d}`` (NULL when
# unknown); Kineto's collective args and the rules reading input dtypes share it
DTYPE_BYTES_SQL = """CASE lower(coalesce({d}, ''))
    WHEN 'float' THEN 4 WHEN 'float32' THEN 4 WHEN 'int' THEN 4 WHEN 'int32' THEN 4
    WHEN 'half' THEN 2 WHEN 'bfloat16' THEN 2 WHEN 'float16' THEN 2 WHEN 'short' THEN 2
    WHEN 'double' THEN 8 WHEN 'long' THEN 8 WHEN 'int64' THEN 8 WHEN 'float64' THEN 8
    WHEN 'byte' THEN 1 WHEN 'char' THEN 1 WHEN 'bool' THEN 1 WHEN 'uint8' THEN 1 WHEN 'int8' THEN 1
    ELSE NULL END"""
HOST_BUSY_KINDS = ("host_op", "runtime", "sync", "dataloader", "queue", "comm")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a canonical table."""

    name: str
    sql_type: str
    doc: str


@dataclass(frozen=True, slots=True)
class Table:
    """One canonical table: name, one-line doc and columns."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    required: bool = False

    def ddl(self) -> str:
        """Return the CREATE TABLE statement for this table."""
        cols = ", ".join(f"{c.name} {c.sql_type}" for c in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({cols})"

    @property
    def column_names(self) -> tuple[str, ...]:
        """Names of the columns, in order."""
        return tuple(c.name for c in self.columns)


def _t(name: str, doc: str, *cols: tuple[str, str, str], required: bool = False) -> Table:
    return Table(name, doc, tuple(Column(*c) for c in cols), required)


TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        _t(
            "events",
            "every timed event of every rank (host and device), one row each",
            ("rank", "INTEGER", "global rank"),
            ("step", "INTEGER", "step the event belongs to (launching host event's step for device events); NULL outside steps"),
            ("kind", "event_kind", "closed vocabulary, see schema.KINDS (a DuckDB ENUM: filters and updates on it compare integers)"),
            ("name", "VARCHAR", "operator / kernel / API name as exported"),
            ("cat", "VARCHAR", "raw category or lane name from the export"),
            ("pid", "VARCHAR", "raw process id (string)"),
            ("tid", "VARCHAR", "raw thread / stream id (string)"),
            ("device", "BOOLEAN", "true when the event ran on an accelerator timeline"),
            ("stream", "BIGINT", "device stream / task-queue id where known"),
            ("start_ns", "BIGINT", "start time, ns"),
            ("dur_ns", "BIGINT", "duration, ns (>= 0)"),
            ("corr", "BIGINT", "correlation id linking a host launch to the device work it launched"),
            ("ext_id", "BIGINT", "external id linking a host operator to the launches it made"),
            ("bytes", "BIGINT", "bytes moved (memcpy/memset/comm) where exported"),
            ("shapes", "VARCHAR", "input shapes as exported (JSON text or Ascend 'a,b;c,d')"),
            ("dtypes", "VARCHAR", "input dtypes as exported"),
            ("flops", "DOUBLE", "floating-point operations where exported (Kineto with_flops)"),
            ("stack", "VARCHAR", "call stack where recorded (newline separated)"),
            ("file_id", "INTEGER", "index into profile_files"),
            ("block_dim", "INTEGER", ("launch grid size of a device kernel where the trace records it (Kineto: product "
                                      "of the grid dims, the GPU analogue of Ascend's block dim; Ascend's own is in "
                                      "kernels), else NULL")),
            ("wait_stream", "BIGINT", ("a device-side wait on a CUDA event (Kineto cuda_sync 'Stream Wait Event' / "
                                       "'Event Sync', recorded with enable_cuda_sync_events): the stream the event "
                                       "was recorded on; NULL elsewhere or when the exporter wrote -1")),
            ("wait_corr", "BIGINT", ("the same wait: correlation id of the cudaEventRecord call that recorded the "
                                     "event; NULL elsewhere or when the exporter wrote -1")),
            required=True,
        ),
        _t(
            "steps",
            "step windows per rank: [start_ns, end_ns) covers the step's host and device work",
            ("rank", "INTEGER", "global rank"),
            ("step", "INTEGER", "step number (NO_STEP = -1 when the trace had no marker)"),
            ("start_ns", "BIGINT", "window start, ns"),
            ("end_ns", "BIGINT", "window end, ns"),
            ("host_start_ns", "BIGINT", "start of the host step marker, ns"),
            ("host_end_ns", "BIGINT", "end of the host step marker, ns"),
            ("inferred", "BOOLEAN", ("true when the window was inferred from the trace (no step marker: "
                                     "advisor.ingest.step_inference), false for a marked step or the one window")),
            required=True,
        ),
        _t(
            "tracks",
            "threads, streams and lanes seen per rank",
            ("rank", "INTEGER", "global rank"),
            ("pid", "VARCHAR", "raw process id"),
            ("tid", "VARCHAR", "raw thread / stream id"),
            ("device", "BOOLEAN", "accelerator timeline"),
            ("process_name", "VARCHAR", "process_name metadata"),
            ("thread_name", "VARCHAR", "thread_name metadata"),
        ),
        _t(
            "ranks",
            "one row per rank: where it came from",
            ("rank", "INTEGER", "global rank"),
            ("source", "VARCHAR", "kineto | ascend_pt | ascend_ms"),
            ("world_size", "INTEGER", "world size as exported, NULL if unknown"),
            ("backend", "VARCHAR", "nccl / gloo / hccl ... where exported"),
            ("device_name", "VARCHAR", "device model, e.g. 'NVIDIA A100-SXM4-80GB', 'Ascend910B'"),
            ("device_count", "INTEGER", "devices on the host where known"),
            ("has_device", "BOOLEAN", "the rank has device events (false for CPU-only traces)"),
            ("rank_source", "VARCHAR", "how the rank was decided: distributedInfo | file_name | order | profiler_info"),
            ("files", "VARCHAR", "files read for this rank, ';' separated"),
        ),
        _t(
            "profile_files",
            "every file that contributed rows",
            ("file_id", "INTEGER", "index"),
            ("rank", "INTEGER", "rank the file belongs to"),
            ("path", "VARCHAR", "file path"),
            ("source", "VARCHAR", "kineto | ascend_pt | ascend_ms"),
            ("events", "BIGINT", "rows it contributed to events"),
        ),
        _t(
            "meta",
            "free key/value metadata per rank (env vars, versions, config, device properties)",
            ("rank", "INTEGER", "global rank (NULL: profile-wide)"),
            ("key", "VARCHAR", "e.g. 'env.HCCL_BUFFSIZE', 'cann_version', 'torch_version', 'num_workers'"),
            ("value", "VARCHAR", "value as text"),
        ),
        _t(
            "kernels",
            "per-kernel detail from a vendor export (Ascend kernel_details / op_summary; Kineto's launch grids are in "
            "events.block_dim)",
            ("rank", "INTEGER", "global rank"),
            ("step", "INTEGER", "step (NULL when unknown)"),
            ("name", "VARCHAR", "kernel / op name"),
            ("op_type", "VARCHAR", "operator type (Ascend 'Type')"),
            ("core_type", "VARCHAR", "AI_CORE | AI_VECTOR_CORE | AI_CPU | MIX_AIC | MIX_AIV | HCCL | CUDA ..."),
            ("start_ns", "BIGINT", "start, ns"),
            ("dur_ns", "BIGINT", "duration, ns"),
            ("wait_ns", "BIGINT", "wait time before the task, ns"),
            ("block_dim", "INTEGER", "block dim (Ascend)"),
            ("mix_block_dim", "INTEGER", "mix block dim (Ascend)"),
            ("input_shapes", "VARCHAR", "input shapes"),
            ("input_dtypes", "VARCHAR", "input data types"),
            ("input_formats", "VARCHAR", "input formats (ND, NZ, NC1HWC0 ...)"),
            ("output_shapes", "VARCHAR", "output shapes"),
            ("output_dtypes", "VARCHAR", "output data types"),
            ("output_formats", "VARCHAR", "output formats"),
            ("flops", "DOUBLE", "floating-point operations, where known"),
            ("mem_bytes", "DOUBLE", "bytes read+written from device memory, where known"),
            ("pmu", "JSON", ("Ascend PMU figures as a JSON object (aic_mac_ratio, aiv_vec_ratio, aic_mte2_ratio, ...); "
                             "NULL where the export has none")),
            ("file_id", "INTEGER", "index into profile_files where the row comes from one file, else NULL"),
        ),
        _t(
            "comm_ops",
            "one row per communication operator per rank (Ascend communication.json / derived from comm events)",
            ("rank", "INTEGER", "global rank"),
            ("step", "INTEGER", "step"),
            ("name", "VARCHAR", "operator name, e.g. hcom_allReduce__123_1_1"),
            ("op_type", "VARCHAR", "allreduce | allgather | reducescatter | broadcast | alltoall | send | recv | ..."),
            ("group_name", "VARCHAR", "communication group id"),
            ("start_ns", "BIGINT", "start, ns"),
            ("dur_ns", "BIGINT", "elapse time, ns"),
            ("transit_ns", "BIGINT", "time moving data, ns"),
            ("wait_ns", "BIGINT", "time waiting for peers, ns"),
            ("sync_ns", "BIGINT", "synchronization time, ns"),
            ("idle_ns", "BIGINT", "idle time, ns"),
            ("bytes", "BIGINT", "bytes transferred (all transports)"),
            ("file_id", "INTEGER", "index into profile_files where the row comes from one trace file (Kineto), else NULL"),
        ),
        _t(
            "comm_bandwidth",
            "per communication operator and transport (Ascend 'Communication Bandwidth Info')",
            ("rank", "INTEGER", "global rank"),
            ("step", "INTEGER", "step"),
            ("name", "VARCHAR", "operator name"),
            ("group_name", "VARCHAR", "group"),
            ("transport", "VARCHAR", "HCCS | PCIE | RDMA | SDMA | SIO | NVLINK | NET | ..."),
            ("bytes", "BIGINT", "bytes"),
            ("transit_ns", "BIGINT", "transit time, ns"),
            ("bandwidth_gbps", "DOUBLE", "GB/s as exported"),
            ("large_packet_ratio", "DOUBLE", "share of large packets, 0..1"),
            ("packet_sizes", "JSON", "size distribution as exported: {size_MB: [count, total_ms]}"),
        ),
        _t(
            "comm_matrix",
            # Kineto rows: one per transfer, transport 'kineto:<backend>', no transit time (advisor.stages.comm_links)
            "point-to-point links (Ascend communication_matrix.json, Kineto send / recv), per rank, step and operator",
            ("rank", "INTEGER", "rank whose export held the row"),
            ("step", "INTEGER", "step"),
            ("group_name", "VARCHAR", "group"),
            ("name", "VARCHAR", "operator (or aggregate, e.g. allreduce-top1@group)"),
            ("src_rank", "INTEGER", "source rank (global where it could be mapped, else group-local)"),
            ("dst_rank", "INTEGER", "destination rank"),
            ("transport", "VARCHAR", "transport type"),
            ("bytes", "BIGINT", "bytes"),
            ("transit_ns", "BIGINT", "transit time, ns"),
            ("bandwidth_gbps", "DOUBLE", "GB/s"),
        ),
        _t(
            "vendor_steps",
            "the exporter's own per-step figures (Ascend step_trace_time.csv), kept for cross-checks",
            ("rank", "INTEGER", "global rank"),
            ("step", "INTEGER", "step"),
            ("computing_ns", "BIGINT", "Computing"),
            ("comm_not_overlapped_ns", "BIGINT", "Communication(Not Overlapped)"),
            ("overlapped_ns", "BIGINT", "Overlapped"),
            ("comm_ns", "BIGINT", "Communication"),
            ("free_ns", "BIGINT", "Free"),
            ("stage_ns", "BIGINT", "Stage (pipeline)"),
            ("bubble_ns", "BIGINT", "Bubble (pipeline)"),
            ("comm_not_overlapped_excl_recv_ns", "BIGINT", "Communication(Not Overlapped and Exclude Receive)"),
            ("preparing_ns", "BIGINT", "Preparing"),
        ),
        _t(
            "vendor_overlap",
            "the exporter's own overlap lanes (Ascend 'Overlap Analysis' process), kept for cross-checks",
            ("rank", "INTEGER", "global rank"),
            ("lane", "VARCHAR", "computing | communication | comm_not_overlapped | free"),
            ("start_ns", "BIGINT", "start, ns"),
            ("dur_ns", "BIGINT", "duration, ns"),
        ),
        _t(
            "queues",
            "queue depth samples (Ascend dataloader / host / device queues) for queue-based I/O analysis",
            ("rank", "INTEGER", "global rank"),
            ("queue", "VARCHAR", "data | host | device"),
            ("ts_ns", "BIGINT", "sample time, ns"),
            ("size", "BIGINT", "items in the queue (or -1 for an 'empty' event)"),
            ("dur_ns", "BIGINT", "duration of the sampled operation, ns"),
        ),
        _t(
            "memory",
            "device memory samples where exported",
            ("rank", "INTEGER", "global rank"),
            ("ts_ns", "BIGINT", "time, ns"),
            ("allocated_bytes", "BIGINT", "allocated"),
            ("reserved_bytes", "BIGINT", "reserved"),
            ("component", "VARCHAR", "component / device type"),
        ),
        _t(
            "hw_metrics",
            "hardware metric series (AI Core frequency, power, temperature, GPU clock ...): the series inside the "
            "exports and those of --metrics files (advisor.metrics.vocab: canonical names and units)",
            ("rank", "INTEGER", "global rank (NULL when the device cannot be mapped to a rank)"),
            ("metric", "VARCHAR", "canonical name with its unit (aicore_freq_mhz, hbm_read_bps ...) or src:<name>"),
            ("ts_ns", "BIGINT", "time, ns, on the trace's clock (epoch); NULL when the source has no times"),
            ("value", "DOUBLE", "value in the metric's unit (percentages 0-100, bandwidths bytes/s)"),
            ("device", "VARCHAR", "device id as the source names it (GPU index, NPU id ...)"),
            ("node", "VARCHAR", "host name where the source gives it"),
            ("unit", "VARCHAR", "unit of value (%, MHz, W, C, B, B/s ...)"),
            ("source", "VARCHAR", "kineto-counter, ascend-text, ascend-db, dcgm, nvidia-smi, rocm-smi, amd-smi, ..."),
        ),
        _t(
            "comm_tasks",
            "one row per task of a communication operator (Ascend HCCL plane tasks: Notify_Wait, Memcpy, RDMASend ...)",
            ("rank", "INTEGER", "global rank"),
            ("step", "INTEGER", "step (NULL when unknown)"),
            ("op_name", "VARCHAR", "communication operator the task belongs to (NULL when it could not be matched)"),
            ("group_name", "VARCHAR", "communication group id"),
            ("plane", "INTEGER", "plane / link index within the operator (0 = master plane)"),
            ("name", "VARCHAR", "task name, e.g. Notify_Wait, Memcpy, Reduce_Inline, RDMASend"),
            ("task_type", "VARCHAR", "task type as exported"),
            ("start_ns", "BIGINT", "start, ns"),
            ("dur_ns", "BIGINT", "duration, ns"),
            ("src_rank", "INTEGER", "source rank as exported (group-local on Ascend), NULL if unknown"),
            ("dst_rank", "INTEGER", "destination rank as exported, NULL if unknown"),
            ("transport", "VARCHAR", "SDMA | RDMA | LOCAL | ... as exported"),
            ("link_type", "VARCHAR", "HCCS | PCIE | ROCE | SIO | ON_CHIP ... as exported"),
            ("bytes", "BIGINT", "bytes moved by this task (0 for waits)"),
        ),
        _t(
            "comm_groups",
            "communication groups a rank belongs to (Ascend profiler_metadata parallel_group_info)",
            ("rank", "INTEGER", "global rank whose export listed the group"),
            ("group_name", "VARCHAR", "group id as used in comm_ops/comm_matrix (Ascend: hash of the communicator name)"),
            ("comm_name", "VARCHAR", "communicator name as exported"),
            ("pg_name", "VARCHAR", "process-group name, e.g. dp, tp, pp, default_group"),
            ("group_rank", "INTEGER", "the rank's index inside the group"),
            ("global_ranks", "VARCHAR", "JSON list of the group's global ranks in group-rank order"),
        ),
        _t(
            "window_phases",
            ("what the profile window holds besides the steady state (advisor.ingest.window): one-time set-up, "
             "graph capture, and the steps left out of every per-step figure for them or for being cut short"),
            ("rank", "INTEGER", "global rank"),
            ("kind", "VARCHAR", ("one_time (set-up calls), capture (graph capture phase), warmup_step / capture_step / "
                                 "stub_step (a step left out: one-time work in it, capture, cut short by the window); "
                                 "device_unmodelled / range_profiler / device_not_recorded (a rank whose device "
                                 "timeline is not modelled or not recorded; the reason in names); inferred_steps (steps "
                                 "inferred without markers: calls = steps, names = the confidence and period)")),
            ("step", "INTEGER", "the step left out (NULL for a phase)"),
            ("start_ns", "BIGINT", "start, ns"),
            ("end_ns", "BIGINT", "end, ns"),
            ("dur_ns", "BIGINT", "time: the union of the one-time calls, the phase's span or the step's window, ns"),
            ("calls", "INTEGER", "one-time calls (one_time rows)"),
            ("names", "VARCHAR", "the largest one-time calls: name x count (what, time)"),
            ("excluded", "BOOLEAN", "true when it is in no per-step figure (left out, trimmed off or before the steps)"),
        ),
        _t(
            "vendor_op_stats",
            "the exporter's own per-operator aggregates (Ascend op_statistic.csv / api_statistic.csv), for cross-checks",
            ("rank", "INTEGER", "global rank"),
            ("source", "VARCHAR", "op_statistic | api_statistic"),
            ("op_type", "VARCHAR", "operator type or API name"),
            ("core_type", "VARCHAR", "core type (AI_CORE, AI_VECTOR_CORE, AI_CPU ...) or API level"),
            ("count", "BIGINT", "calls"),
            ("total_ns", "BIGINT", "total time, ns"),
            ("min_ns", "BIGINT", "shortest call, ns"),
            ("avg_ns", "BIGINT", "mean call, ns"),
            ("max_ns", "BIGINT", "longest call, ns"),
            ("ratio", "DOUBLE", "share of the total as exported, 0..1"),
        ),
    )
}



# the ENUM behind events.kind: KINDS, plus 'meta' (metadata rows, only inside a reader before they are deleted)
# ``INSERT INTO`` target for readers that write every events column but the Kineto-only ones
KINETO_ONLY = ("block_dim", "wait_stream", "wait_corr")
EVENTS_INSERT = "events (" + ", ".join(c for c in TABLES["events"].column_names if c not in KINETO_ONLY) + ")"

#: The condition on DuckDB's catalog functions (``duckdb_tables()``, ``duckdb_columns()``) that keeps
#: what the connection's own analysis sees: its database and its temporary tables, not the other
#: analyses' databases attached to the same DuckDB instance (:func:`advisor.ingest.connect`)
OWN_TABLES_SQL = "database_name IN (current_database(), 'temp')"

KIND_TYPE_DDL = "CREATE TYPE IF NOT EXISTS event_kind AS ENUM (" + ", ".join(f"'{k}'" for k in (*KINDS, "meta")) + ")"


def create_all(con: object) -> None:
    """Create every canonical table (empty) on a DuckDB connection, in one multi-statement string
    (statement by statement took ~1.4 times as long)."""
    con.execute(";\n".join([KIND_TYPE_DDL, *(table.ddl() for table in TABLES.values())]))  # type: ignore[attr-defined]


#: ``comm_matrix.transport`` of a point-to-point transfer read from a Kineto trace: this prefix
#: and the communication backend (advisor.ingest.kineto)
KINETO_TRANSPORT_PREFIX = "kineto:"
#: SQL condition on a ``comm_matrix`` row (its ``transport`` column): not a Kineto point-to-point
#: row. The rules that judge Ascend link types (COM004, COM006) read only rows that pass it.
NOT_KINETO_SQL = f"NOT starts_with(lower(coalesce(transport, '')), '{KINETO_TRANSPORT_PREFIX}')"


def insert_rows(cur: Any, table: str, rows: list[tuple[Any, ...]], chunk: int = 1000) -> None:
    """``INSERT INTO table VALUES ...`` of many rows, ``chunk`` rows per statement (DuckDB's
    executemany runs one statement per row: ~0.4 ms each, 0.1 s for a few tables of 32 ranks)."""
    for a in range(0, len(rows), chunk):
        part = rows[a:a + chunk]
        marks = "(" + ", ".join("?" * len(part[0])) + ")"
        cur.execute(f"INSERT INTO {table} VALUES " + ", ".join([marks] * len(part)),
                    [v for row in part for v in row])
