"""Cross-check advisor's breakdown against Meta's HolisticTraceAnalysis (HTA 0.5.0).

HTA is an independent implementation (pandas, one Python row per event). For every Kineto sample we
run HTA's ``get_temporal_breakdown``, ``get_comm_comp_overlap`` and ``get_idle_time_breakdown``
and compute advisor's figures over **the same window and the same events**, then require
agreement within 1 %.

What HTA 0.5.0 does (read from ``hta/common/trace.py``, ``hta/analyzers/breakdown_analysis.py``,
``hta/analyzers/communication_analysis.py``, ``hta/utils/utils.py``):

* **Events.** A "GPU kernel" is any event with an integer ``args.stream`` (``stream != -1``) —
  kernels, memcpy and memset alike, and also Kineto's ``cuda_sync`` records ("Stream Wait Event",
  "Stream Sync" … of a trace taken with ``enable_cuda_sync_events``), which carry ``args.stream``
  but are the host API call's time written on the stream's row, not device work: advisor does not
  count them as busy (none of the samples has them, so no figure here differs by them). At load time (``Trace._filter_irrelevant_gpu_kernels``) HTA
  keeps only GPU events whose correlation id matches a host event that started *before the last
  ``ProfilerStep``* (the last step is dropped as possibly incomplete).
* **Window.** Per rank, from the first start to the last end of those GPU events (one window per
  rank, not per step). ``kernel_time`` is its length.
* **idle** = window − union of all GPU events (merged across streams).
  advisor: ``free + host_only`` (the device runs nothing), i.e. step − device busy.
* **compute** = union of "COMPUTATION" kernels: names not matching ``^nccl.*Kernel``,
  ``.*Memcpy``, ``^Memset`` or ``.*Sync``. advisor: ``kernel_us`` (union of ``kind = 'kernel'``).
  advisor's *compute* class also contains memcpy/memset (device busy but not communication): that
  difference is on purpose, so ``kernel_us`` is the matching quantity.
* **non_compute** = window − compute − idle = time only comm/memory run.
  advisor: device busy − ``kernel_us`` = compute_only + overlapped + comm_only − kernel_us.
* **comm/comp overlap** = |union(COMPUTATION) ∩ union(nccl kernels)| / |union(nccl kernels)|.
  advisor's ``overlap_ratio`` counts memcpy/memset as computation too (on purpose: a copy hides
  communication as well as a kernel does), so it is ≥ HTA's. The matching quantity is advisor's
  breakdown over the same events without memcpy/memset; that must agree within 1 %.
* **idle time breakdown** is per stream: the sum of gaps between consecutive GPU events of one
  stream (categorised host wait / kernel wait / other). advisor has no per-stream breakdown (its
  breakdown is the union over streams, which is what matters for the step), so the matching
  quantity is advisor's union-of-intervals over that stream's events alone, between the stream's
  first start and last end: its ``free + host_only``. HTA's categories (host wait = the launch
  started after the previous kernel ended; kernel wait = gap < 30 ns) have no breakdown
  counterpart and are not compared.
* Timestamps: HTA works in integer µs relative to the earliest event of all ranks (``min_ts``)
  and to ``baseTimeNanoseconds`` when the trace has one; advisor in absolute ns. The window is
  converted back with both.
* CPU-only traces: HTA's temporal breakdown, overlap and idle breakdown are defined on GPU events
  only (HTA raises ``IndexError`` on a trace without any). There is nothing of advisor's CPU-only
  breakdown (host operators as compute) to compare; for those traces we check what HTA and advisor
  share: the profiler steps (iteration numbers and the ``ProfilerStep#N`` marker times).

Trace layout: HTA takes a directory of ``*.json`` / ``*.json.gz`` and finds each file's rank with
the regex ``"rank":\\s+(\\d+)`` (default 0); several files of one rank overwrite each other. The
samples are copied to ``tmp_path`` (HTA gets a directory it may write into; samples stay untouched).
"""

from __future__ import annotations

import logging
import math
import shutil
import warnings
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from tests.conftest import SAMPLES, TRACES

pytestmark = [
    pytest.mark.hta,
    # HTA's own pandas idioms (replace() downcasting, 0/0 without communication)
    pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::RuntimeWarning", "ignore::DeprecationWarning"),
]

try:  # HTA is a test-only extra (pip install -e '.[hta]'); skip cleanly without it
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import KernelType, get_kernel_type
except ImportError as exc:  # note: hta 0.5.0 imports psutil without declaring it
    pytest.skip(
        f"holistictraceanalysis is not importable ({type(exc).__name__}: {exc}); "
        "install the test extra: pip install -e '.[hta]' psutil",
        allow_module_level=True,
    )

from advisor.ingest import load_profile
from advisor.stages import breakdown as breakdown_stage

REL = 0.01  # agreement required wherever the definitions coincide
ABS_US = 1.0  # HTA works in whole microseconds

GPU_SAMPLES = ["kineto_resnet50_num_workers_0", "kineto_two_ranks"]
CPU_TRACES = sorted(p.name for p in TRACES.iterdir() if p.is_dir() and any(p.glob("*.json*"))) if TRACES.is_dir() else []

logging.getLogger("hta").setLevel(logging.ERROR)


def _approx(expected: float) -> object:
    return pytest.approx(expected, rel=REL, abs=ABS_US)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("*.json*")):
        shutil.copy(f, dst / f.name)
    return dst


def _hta(trace_dir: Path) -> TraceAnalysis:
    """``TraceAnalysis(trace_dir=...)``, parsing in this process.

    The constructor parses several ranks in a fork()ed multiprocessing pool; forking a process
    that already runs DuckDB's worker threads can deadlock the children, so the same steps are
    done here with ``use_multiprocessing=False`` (same parser, same filtering, same results).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ta = TraceAnalysis.__new__(TraceAnalysis)
        ta.t = Trace(trace_dir=str(trace_dir))
        ta.t.load_traces(include_last_profiler_step=False, use_multiprocessing=False)
        assert ta.t.is_parsed
        return ta


def _base_ns(t, rank: int) -> int:
    """HTA keeps ``ts`` relative to ``baseTimeNanoseconds`` (Kineto >= 2.1); advisor adds it back."""
    return int(t.meta_data.get(rank, {}).get("baseTimeNanoseconds", 0) or 0)


class _Pair:
    """HTA's analysis and advisor's context of one sample, plus HTA's per-rank GPU event set."""

    def __init__(self, trace_dir: Path):
        self.hta = _hta(trace_dir)
        self.ctx = load_profile(trace_dir)
        t = self.hta.t
        sym = t.symbol_table.get_sym_table()
        self.gpu: dict[int, pd.DataFrame] = {}
        for rank, df in t.traces.items():
            base = _base_ns(t, rank)
            g = df[df["stream"].ne(-1)]
            names = [sym[i] for i in g["name"]]
            self.gpu[int(rank)] = pd.DataFrame(
                {
                    # back to advisor's clock: absolute ns
                    "start_ns": ((g["ts"].astype("int64") + int(t.min_ts)) * 1000 + base).to_numpy(),
                    "dur_ns": (g["dur"].astype("int64") * 1000).to_numpy(),
                    "stream": g["stream"].astype("int64").to_numpy(),
                    "name": names,
                    "type": [get_kernel_type(n) for n in names],
                }
            )

    def window(self, rank: int) -> tuple[int, int]:
        g = self.gpu[rank]
        return int(g["start_ns"].min()), int((g["start_ns"] + g["dur_ns"]).max())


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, _Pair]:
    if not SAMPLES.is_dir():
        pytest.skip("../shared/samples not present")
    out = {}
    for name in GPU_SAMPLES:
        src = SAMPLES / name
        if not src.is_dir():
            pytest.skip(f"sample {name} not present")
        out[name] = _Pair(_copy(src, tmp_path_factory.mktemp(name)))
    return out


def _advisor(con, windows: list[tuple[int, int, int, int]], drop_kinds: tuple[str, ...] = (), stream: int | None = None):
    """advisor's breakdown over explicit windows, optionally on a subset of the device events.

    The subset runs on a copy of the canonical tables in a fresh DuckDB connection (the
    breakdown stage opens its own cursor, so it must see ordinary tables, not temp ones).
    """
    if drop_kinds or stream is not None:
        where = ["true"]
        if drop_kinds:
            where.append(f"NOT (device AND kind IN ({', '.join(repr(k) for k in drop_kinds)}))")
        if stream is not None:
            where.append(f"(NOT device OR stream = {int(stream)})")
        dst = duckdb.connect(":memory:")
        for table, cond in (("events", " AND ".join(where)), ("ranks", "true"), ("steps", "true")):
            rel = con.cursor().sql(f"SELECT * FROM {table} WHERE {cond}")
            # duckdb >= 1.4 calls it to_arrow_table, older ones arrow
            arrow = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
            dst.register("_src", arrow)
            dst.execute(f"CREATE TABLE {table} AS SELECT * FROM _src")
            dst.unregister("_src")
        con = dst
    cur = con.cursor()
    cur.execute("CREATE OR REPLACE TABLE hta_windows (rank INTEGER, step INTEGER, start_ns BIGINT, end_ns BIGINT)")
    cur.executemany("INSERT INTO hta_windows VALUES (?, ?, ?, ?)", windows)
    try:
        return breakdown_stage.compute(con, windows="hta_windows").set_index("rank")
    finally:
        cur.execute("DROP TABLE hta_windows")


def _busy(row) -> float:
    return row["compute_only_us"] + row["overlapped_us"] + row["comm_only_us"]


@pytest.mark.parametrize("name", GPU_SAMPLES)
def test_same_gpu_events_and_classes(pairs, name):
    """Inside HTA's window advisor sees exactly HTA's GPU events, classified alike.

    This is what makes the figures below comparable: no event is counted by one and not the
    other (HTA selects by launch step, advisor by time; on these samples the sets coincide).
    """
    p = pairs[name]
    assert sorted(p.gpu) == sorted(p.ctx.ranks)
    kind_of = {KernelType.COMPUTATION.name: {"kernel"}, KernelType.COMMUNICATION.name: {"comm"},
               KernelType.MEMORY.name: {"memcpy", "memset"}}
    for rank, g in p.gpu.items():
        s, e = p.window(rank)
        adv = p.ctx.con.cursor().execute(
            """SELECT start_ns, dur_ns, stream, kind FROM events
               WHERE rank = ? AND device AND kind IN ('kernel', 'comm', 'memcpy', 'memset')
                 AND start_ns < ? AND start_ns + dur_ns > ?""",
            [rank, e, s],
        ).df()
        assert len(adv) == len(g), (rank, len(adv), len(g))
        m = adv.merge(g, on=["start_ns", "dur_ns", "stream"], how="outer", indicator=True)
        assert (m["_merge"] == "both").all(), m[m["_merge"] != "both"].head()
        for htype, kinds in kind_of.items():
            assert set(m.loc[m["type"] == htype, "kind"]) <= kinds, (rank, htype)
        assert not (m["type"] == KernelType.OTHER.name).any()


@pytest.mark.parametrize("name", GPU_SAMPLES)
def test_temporal_breakdown(pairs, name):
    p = pairs[name]
    hta = p.hta.get_temporal_breakdown(visualize=False).set_index("rank")
    adv = _advisor(p.ctx.con, [(r, 0, *p.window(r)) for r in p.gpu])
    for rank in p.gpu:
        h, a = hta.loc[rank], adv.loc[rank]
        assert a["step_us"] == _approx(h["kernel_time(us)"]), rank
        # idle: no GPU event on any stream
        assert a["free_us"] + a["host_only_us"] == _approx(h["idle_time(us)"]), rank
        assert a["step_us"] - _busy(a) == _approx(h["idle_time(us)"]), rank
        # compute: HTA's COMPUTATION kernels = advisor's kind 'kernel' (not its compute class, which adds memcpy/memset)
        assert a["kernel_us"] == _approx(h["compute_time(us)"]), rank
        # non-compute: GPU busy with communication or memory only
        assert _busy(a) - a["kernel_us"] == _approx(h["non_compute_time(us)"]), rank


@pytest.mark.parametrize("name", GPU_SAMPLES)
def test_comm_comp_overlap(pairs, name):
    p = pairs[name]
    hta = p.hta.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    windows = [(r, 0, *p.window(r)) for r in p.gpu]
    adv = _advisor(p.ctx.con, windows)
    # HTA's definition of computation: kernels only (no memcpy / memset)
    adv_k = _advisor(p.ctx.con, windows, drop_kinds=("memcpy", "memset"))
    for rank in p.gpu:
        h = hta.loc[rank]
        if adv.loc[rank, "comm_us"] == 0:
            # no communication: HTA divides by zero (NaN), advisor reports null
            assert h is None or math.isnan(h), rank
            assert math.isnan(adv.loc[rank, "overlap_ratio"]), rank
            continue
        # the communication time itself is the same in both variants
        assert adv_k.loc[rank, "comm_us"] == pytest.approx(adv.loc[rank, "comm_us"], rel=1e-9)
        assert 100 * adv_k.loc[rank, "overlap_ratio"] == pytest.approx(h, rel=REL, abs=0.01), rank
        # advisor's own ratio also counts copies under communication, so it can only be larger
        assert adv.loc[rank, "overlap_ratio"] >= adv_k.loc[rank, "overlap_ratio"] - 1e-12, rank


@pytest.mark.parametrize("name", GPU_SAMPLES)
def test_idle_time_per_stream(pairs, name):
    p = pairs[name]
    ranks = sorted(p.gpu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hta, _ = p.hta.get_idle_time_breakdown(ranks=ranks, visualize=False)
    per_stream = hta.groupby(["rank", "stream"])["idle_time"].sum()
    assert len(per_stream) > 0
    for (rank, stream), h_idle in per_stream.items():
        g = p.gpu[int(rank)]
        g = g[g["stream"] == int(stream)]
        win = (int(rank), 0, int(g["start_ns"].min()), int((g["start_ns"] + g["dur_ns"]).max()))
        a = _advisor(p.ctx.con, [win], stream=int(stream)).loc[int(rank)]
        assert a["free_us"] + a["host_only_us"] == pytest.approx(h_idle, rel=REL, abs=ABS_US), (
            rank,
            stream,
        )


@pytest.mark.parametrize("name", CPU_TRACES)
def test_cpu_trace_steps(tmp_path, name):
    """CPU-only traces: HTA has no GPU breakdown; the steps both see must agree."""
    trace_dir = _copy(TRACES / name, tmp_path / name)
    h = _hta(trace_dir)
    ctx = load_profile(trace_dir)
    t = h.t
    sym = t.symbol_table.get_sym_table()
    for rank, df in t.traces.items():
        assert not df["stream"].ne(-1).any(), "a CPU-only trace has no GPU event"
        # HTA's temporal breakdown is undefined without GPU events (its window is the GPU span)
        with pytest.raises((IndexError, KeyError, ValueError)):
            h.get_temporal_breakdown(visualize=False)
        names = pd.Series([sym[i] for i in df["name"]], index=df.index)
        marks = df[names.str.match(r"ProfilerStep#\d+$")]
        steps = {
            int(s): (int(b), int(e))
            for s, b, e in ctx.con.cursor()
            .execute("SELECT step, host_start_ns, host_end_ns FROM steps WHERE rank = ?", [int(rank)])
            .fetchall()
        }
        hta_iters = {int(i) for i in t.get_iterations(rank)}
        if not hta_iters:
            assert set(steps) == {-1}, "no marker: advisor analyses the whole trace as one window"
            continue
        # HTA drops the last step (and keeps one file per rank), so its steps are a subset
        assert hta_iters <= set(steps), (rank, sorted(hta_iters), sorted(steps))
        for idx, row in marks.iterrows():
            step = int(names[idx].split("#")[1])
            b = (int(row["ts"]) + int(t.min_ts)) * 1000 + _base_ns(t, rank)
            e = b + int(row["dur"]) * 1000
            # HTA rounds ns-resolution traces to whole µs (start up, end down)
            assert abs(steps[step][0] - b) < 1000, (rank, step)
            assert abs(steps[step][1] - e) < 2000, (rank, step)


def test_recorded_stream_wait_on_the_critical_path_as_hta_has_it(tmp_path):
    """A stream wait recorded by Kineto (``cuda_sync`` 'Stream Wait Event' naming the recording
    stream and the cudaEventRecord's correlation): HTA's critical path analysis (its GPU-GPU sync
    edge) and advisor's both run B <- A, the producer of the event B's stream waited on, and
    neither takes the collective of a third stream that ended later inside B's wait. The trace is
    ``tests/test_ingest_kineto.py``'s, its runtime calls inside operators as PyTorch has them
    (HTA's graph hangs launches on operators) and without the Context / Event Sync records (HTA
    needs their host calls)."""
    import json

    from advisor.analyze import analyze
    from tests.test_ingest_kineto import _cuda_sync_trace

    (tmp_path / "trace").mkdir()
    path = _cuda_sync_trace(tmp_path / "trace") / "rank-0.json"
    doc = json.loads(path.read_text())
    events = [e for e in doc["traceEvents"] if e["name"] not in ("Context Sync", "Event Sync")]
    for e in [e for e in events if e["cat"] == "cuda_runtime"]:
        corr = e["args"]["correlation"]
        e["args"]["External id"] = corr
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op_{corr}", "pid": 1, "tid": 1,
                       "ts": e["ts"] - 1, "dur": e["dur"] + 2, "args": {"External id": corr}})
    path.write_text(json.dumps({**doc, "traceEvents": events}))
    gpu = {"A", "B", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph, ok = _hta(path.parent).critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=None)
    assert ok
    on_hta = graph.get_critical_path_breakdown()
    hta_gpu = set(on_hta["s_name"].dropna()) & gpu
    assert "critical_path_sync_dependency" in set(on_hta["type"])

    ours = {o["name"] for o in analyze(path.parent).critical_path["ops"]} & gpu
    assert hta_gpu == ours == {"A", "B"}
