"""Hardware metric series: each monitoring tool's export form (tests/data/metrics, README there
names the documentation each file follows), the series inside Kineto and Ascend exports, time
alignment and bad input. Expected numbers are worked out by hand from the files (or computed
independently from the raw export), never taken from the reader's output."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from advisor import ingest
from advisor.cli import main
from advisor.metrics import MetricsError, aligning_offset, finish_load, format_offset, map_ranks, read_file
from advisor.metrics.common import Sample, parse_time, parse_tz_offset, parse_yearless
from advisor.model import Warning_
from advisor.options import AnalyzeOptions, UsageFailure
from advisor.text import one_line
from tests.conftest import validate_report

# one worker runs this module: its module-scoped fixtures are built once
pytestmark = pytest.mark.xdist_group("metrics_readers")

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "metrics"
TWO_RANKS = ROOT / "sample_profiles" / "kineto_two_ranks"  # 2023-04-28 23:51:38.079 .. 39.318 UTC, GPU i = rank i
ASCEND = ROOT / "tests" / "data" / "ascend_real"
MIB = 1 << 20


def series(samples: list[Sample], metric: str, device: str | None = None) -> list[float]:
    return [s.value for s in samples if s.metric == metric and (device is None or s.device == device)]


# -- one test per input form ---------------------------------------------------------------------

def test_dcgmi_dmon() -> None:
    form, s, rc = read_file(DATA / "dcgm_dmon.txt")
    assert form == "dcgm"
    assert series(s, "sm_active_pct", "0") == [50.0, 70.0]  # SMACT 0.500, 0.700 (ratios)
    assert series(s, "sm_occupancy_pct", "1") == [20.0, 30.0]
    assert series(s, "tensor_active_pct", "1") == [5.0]  # N/A skipped
    assert series(s, "dram_active_pct", "0") == [30.0, 40.0]
    assert series(s, "power_w", "0") == [250.5, 260.5]
    assert series(s, "util_gpu_pct", "1") == [98.0, 97.0]
    assert all(x.ts_ns is None for x in s) and "untimed" in rc.notes  # dmon prints no time
    assert {x.unit for x in s if x.metric == "sm_active_pct"} == {"%"}


def test_timestamped_rows(tmp_path: Path) -> None:
    """dmon and npu-smi print no time; rows prefixed with one (``| ts``) are aligned by it."""
    dmon = tmp_path / "dmon.log"
    dmon.write_text("#Entity  SMACT  POWER\nID  W\n2023-04-28T23:51:38.500Z GPU 0  0.500  250.0\n"
                    "1682725899 GPU 1  0.250  240.0\n")
    _form, s, rc = read_file(dmon)
    assert [(x.ts_ns, x.device, x.value) for x in s if x.metric == "sm_active_pct"] == [
        (1682725898_500_000_000, "0", 50.0), (1682725899_000_000_000, "1", 25.0)]
    assert "untimed" not in rc.notes
    npu = tmp_path / "watch.log"
    npu.write_text("NpuID(Idx)  ChipId(Idx) Pwr(W)      AI Core(%)\n2023-04-28T23:51:38Z 0  0  90.5  42\n")
    _form, s, rc = read_file(npu)
    assert [(x.ts_ns, x.metric, x.value) for x in s] == [(1682725898 * 10**9, "power_w", 90.5),
                                                           (1682725898 * 10**9, "aicore_util_pct", 42.0)]


def test_dcgm_exporter_text() -> None:
    form, s, rc = read_file(DATA / "dcgm_exporter.prom")
    assert form == "dcgm-exporter"
    assert series(s, "util_gpu_pct") == [87.0, 91.0]
    assert series(s, "mem_used_bytes", "0") == [40960.0 * MIB]  # FB_USED is MiB
    assert series(s, "sm_active_pct", "0") == [62.5]
    assert {x.node for x in s} == {"node-a"}
    assert {x.ts_ns for x in s} == {1682725898500 * 1_000_000}  # the exposition timestamp is ms
    assert rc.kept == {"src:dcgm_fi_prof_pipe_fp16_active"}
    assert series(s, "src:dcgm_fi_prof_pipe_fp16_active") == [0.25]  # kept as exported


def test_nvidia_smi_csv() -> None:
    form, s, rc = read_file(DATA / "nvidia_smi.csv", tz_offset_s=8 * 3600)
    assert form == "nvidia-smi"
    assert series(s, "util_gpu_pct", "0") == [95.0, 97.0, 99.0, 93.0]
    assert series(s, "mem_used_bytes", "1")[0] == 29000.0 * MIB
    assert series(s, "mem_total_bytes", "0")[0] == 81920.0 * MIB
    assert series(s, "power_w", "0")[0] == 310.25
    assert series(s, "clock_sm_mhz", "0") == [1410.0, 1395.0, 1380.0, 1410.0]
    assert series(s, "temp_gpu_c", "1")[0] == 60.0
    assert series(s, "throttle_reasons", "0") == [0.0, 4.0, 4.0, 0.0]  # 0x...04 is a bitmask
    assert rc.kept == {"src:fan.speed"}  # an unknown column is kept, 'name' and 'pstate' are identity text
    # 07:51:38.000 local at UTC+8 = 2023-04-28 23:51:38 UTC = 1682725898 s
    assert min(x.ts_ns for x in s if x.ts_ns is not None) == 1682725898 * 10**9
    assert "zone_less" in rc.notes


def test_rocm_smi_csv() -> None:
    form, s, rc = read_file(DATA / "rocm_smi.csv")
    assert form == "rocm-smi"
    assert series(s, "temp_gpu_c") == [45.0, 46.0]
    assert series(s, "temp_mem_c") == [60.0, 61.0]
    assert series(s, "power_w") == [650.0, 640.0]
    assert series(s, "util_gpu_pct") == [98.0, 97.0]
    assert series(s, "clock_sm_mhz") == [2100.0, 2050.0]  # '(2100Mhz)'
    assert {x.device for x in s} == {"0", "1"}  # card0, card1
    assert rc.kept == {"src:temperature (sensor junction) (c)", "src:gpu memory use (%)"}


def test_amd_smi_csv() -> None:
    form, s, rc = read_file(DATA / "amd_smi.csv")
    assert form == "amd-smi"
    assert series(s, "util_gpu_pct") == [95.0, 90.0]
    assert series(s, "power_w") == [650.0, 640.0]
    assert series(s, "temp_gpu_c") == [45.0, 44.0]
    assert series(s, "mem_used_bytes", "0") == [150000.0 * MIB]  # amd-smi's MB are MiB
    assert rc.kept == {"src:usage_umc_activity", "src:temperature_hotspot"}


def test_prometheus_query_range() -> None:
    form, s, rc = read_file(DATA / "prometheus_range.json")
    assert form == "prometheus"
    assert series(s, "sm_active_pct", "0") == pytest.approx([45.0, 55.0, 65.0])  # Moneo's dcgm_sm_active ratio
    assert series(s, "nvlink_tx_bps", "0") == [1.0e10, 3.0e10]  # NaN dropped
    assert {x.node for x in s} == {"node-a"}  # instance node-a:8000 without the port
    assert [x.ts_ns for x in s if x.metric == "sm_active_pct" and x.device == "1"] == [
        1682725898_000_000_000, 1682725898_500_000_000, 1682725899_000_000_000]
    assert rc.kept == {"src:node_load1"}


def test_npu_smi_watch() -> None:
    form, s, rc = read_file(DATA / "npu_smi_watch.txt")
    assert form == "npu-smi"
    assert series(s, "aicore_util_pct", "0") == [50.0, 60.0]
    assert series(s, "aicore_util_pct", "1") == [70.0, 80.0]
    assert series(s, "power_w", "1") == [95.2, 96.4]
    assert series(s, "temp_gpu_c", "0") == [34.0, 35.0]
    assert "src:npu_smi_memory bw(%)" in rc.kept and "src:npu_smi_memory(%)" in rc.kept


def test_npu_smi_info_usages() -> None:
    form, s, rc = read_file(DATA / "npu_smi_usages.txt")
    assert form == "npu-smi-info"
    assert series(s, "aicore_util_pct", "0") == [35.0, 45.0]
    assert series(s, "aivector_util_pct", "0") == [12.0, 10.0]
    assert series(s, "mem_total_bytes", "0") == [65536.0 * MIB] * 2
    # 2025-01-09T08:16:16Z = 1736410576 s (the date line before each block)
    assert [x.ts_ns for x in s if x.metric == "aicore_util_pct"] == [1736410576 * 10**9, 1736410577 * 10**9]
    assert "src:npu_smi_hbm bandwidth usage rate(%)" in rc.kept and "untimed" not in rc.notes


def test_generic_long_csv() -> None:
    form, s, _rc = read_file(DATA / "metrics_long.csv")
    assert form == "csv"
    assert series(s, "power_w", "0") == [300.0, 310.0]
    assert series(s, "src:fan_rpm") == [3000.0]
    assert {x.unit for x in s if x.metric == "src:fan_rpm"} == {"rpm"}
    assert s[0].ts_ns == 1682725898_100_000_000


def test_generic_wide_csv(tmp_path: Path) -> None:
    f = tmp_path / "wide.csv"
    f.write_text("timestamp,gpu,power_w,sm_active_pct,hotspot_c\n"
                 "1682725898.25,0,300,40,70\n1682725898.75,0,320,60,72\n")
    form, s, rc = read_file(f)
    assert form == "csv"
    assert series(s, "power_w", "0") == [300.0, 320.0]
    assert series(s, "sm_active_pct", "0") == [40.0, 60.0]
    assert rc.kept == {"src:hotspot_c"}
    assert [x.ts_ns for x in s if x.metric == "power_w"] == [1682725898_250_000_000, 1682725898_750_000_000]


def test_form_told_by_content_not_extension(tmp_path: Path) -> None:
    f = tmp_path / "export.txt"  # a Prometheus answer under a .txt name
    f.write_text((DATA / "prometheus_range.json").read_text())
    assert read_file(f)[0] == "prometheus"
    g = tmp_path / "dmon.csv"
    g.write_text((DATA / "dcgm_dmon.txt").read_text())
    assert read_file(g)[0] == "dcgm"


# -- time alignment ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "ns", "zone_less"), [
    ("1682725898", 1682725898 * 10**9, False),  # s
    ("1682725898123", 1682725898123 * 10**6, False),  # ms
    ("1682725898123456", 1682725898123456 * 10**3, False),  # µs
    ("1682725898123456789", 1682725898123456789, False),  # ns
    ("2023-04-28T23:51:38.5Z", 1682725898_500_000_000, False),
    ("2023-04-29T07:51:38+08:00", 1682725898 * 10**9, False),
    ("2023/04/28 23:51:38.250", 1682725898_250_000_000, True),  # nvidia-smi: no zone, read as UTC
])
def test_parse_time(text: str, ns: int, zone_less: bool) -> None:
    assert parse_time(text) == (ns, zone_less)


def test_zone_less_times_take_the_offset() -> None:
    assert parse_time("2023/04/29 07:51:38.000", parse_tz_offset("+08:00")) == (1682725898 * 10**9, True)
    assert parse_tz_offset("-05:30") == -(5 * 3600 + 30 * 60)
    with pytest.raises(ValueError):
        parse_tz_offset("8h")
    with pytest.raises(UsageFailure, match="--metrics-tz-offset"):
        AnalyzeOptions.build(TWO_RANKS, metrics=(DATA / "nvidia_smi.csv",), metrics_tz_offset="eight")


def load(path: Path, metrics: tuple[Path, ...] = (), tz: str | None = None) -> Any:
    """The profile loaded, then the ``--metrics`` files read over its tables, as the analysis does."""
    prof = ingest.load(path)

    def warn(code: str, message: str, p: Path | str | None = None) -> None:
        prof.warnings.append(Warning_(code, one_line(message, 500), None if p is None else str(p)))

    finish_load(prof.con, warn, metrics, tz, str(path))
    return prof


def _load(*files: str, tz: str | None = None) -> Any:
    return load(TWO_RANKS, tuple(DATA / f for f in files), tz)


@pytest.fixture(scope="module")
def two_ranks_utc() -> Any:
    return _load("nvidia_smi.csv", "prometheus_range.json", "dcgm_dmon.txt", "dcgm_exporter.prom")


def test_files_mapped_to_ranks(two_ranks_utc: Any) -> None:
    con = two_ranks_utc.con
    # GPU i ran rank i (the trace's device lanes): Prometheus sm_active of gpu 1 is rank 1's
    got = con.execute("""SELECT rank, avg(value) FROM hw_metrics WHERE source = 'prometheus'
                         AND metric = 'sm_active_pct' GROUP BY rank ORDER BY rank""").fetchall()
    assert got == [(0, pytest.approx(55.0)), (1, pytest.approx(50.0))]  # (45+55+65)/3, (40+50+60)/3
    dmon = con.execute("""SELECT rank, count(*) FROM hw_metrics WHERE source = 'dcgm' AND ts_ns IS NULL
                          AND metric = 'sm_active_pct' GROUP BY rank ORDER BY rank""").fetchall()
    assert dmon == [(0, 2), (1, 2)]
    # a series with no device (node_load1) has no rank
    assert con.execute("SELECT count(*) FROM hw_metrics WHERE metric = 'src:node_load1' AND rank IS NULL"
                       ).fetchone()[0] == 2


def test_overlap_warnings(two_ranks_utc: Any) -> None:
    by_path: dict[str, list[Any]] = {}
    for w in two_ranks_utc.warnings:
        by_path.setdefault(Path(w.path or "").name, []).append(w)
    nv = {w.code: w.message for w in by_path["nvidia_smi.csv"]}
    # 07:51:38-39.5 read as UTC: starts 8 h - 1.3 s after the trace's end (23:51:39.318)
    assert "they start 8.0 h after the trace ends" in nv["metrics_no_overlap"]
    assert "--metrics-tz-offset" in nv["metrics_no_overlap"]
    assert "src:fan.speed" in nv["metrics_kept"]
    assert "metrics_untimed" in {w.code for w in by_path["dcgm_dmon.txt"]}
    prom = {w.code: w.message for w in by_path["prometheus_range.json"]}
    assert "src:node_load1" in prom["metrics_kept"]
    assert "metrics_partial_overlap" in prom  # 23:51:38.0-39.0 against 38.079-39.318
    assert "metrics_unmapped" not in prom


def test_offset_aligns_local_times() -> None:
    prof = _load("nvidia_smi.csv", tz="+08:00")
    codes = {w.code for w in prof.warnings if Path(w.path or "").name == "nvidia_smi.csv"}
    assert "metrics_no_overlap" not in codes and "metrics_partial_overlap" not in codes
    lo, hi = prof.con.execute("SELECT min(ts_ns), max(ts_ns) FROM hw_metrics WHERE source = 'nvidia-smi'").fetchone()
    assert (lo, hi) == (1682725898 * 10**9, 1682725899_500_000_000)


def test_multi_node_ranks() -> None:
    s = [Sample(1, n, d, "power_w", 1.0, "W", "csv") for n in ("b-node", "a-node") for d in ("0", "1")]
    rows = map_ranks(s, [0, 1, 2, 3], {})
    # nodes in name order hold consecutive ranks: a-node 0,1 then b-node 2,3
    assert [(r[5], r[4], r[0]) for r in rows] == [("b-node", "0", 2), ("b-node", "1", 3), ("a-node", "0", 0),
                                                  ("a-node", "1", 1)]
    # the ranks do not fill the nodes exactly: no guess
    assert {r[0] for r in map_ranks(s, [0, 1, 2], {})} == {None}


def test_ranks_by_host_name() -> None:
    """Hosts the profile names (Ascend HOST_INFO) place a node's devices on its ranks."""
    s = [Sample(1, n, d, "power_w", 1.0, "W", "npu-smi") for n in ("worker-2", "worker-1.cluster") for d in ("0", "1")]
    hosts = {0: "worker-1", 1: "worker-1", 2: "worker-2", 3: "worker-2"}
    rows = map_ranks(s, [0, 1, 2, 3], {}, hosts)
    assert [(r[5], r[4], r[0]) for r in rows] == [("worker-2", "0", 2), ("worker-2", "1", 3),
                                                  ("worker-1.cluster", "0", 0), ("worker-1.cluster", "1", 1)]
    # the devices the ranks ran on, where known, decide: rank 3 on NPU 0, rank 2 on NPU 1
    rows = map_ranks(s, [0, 1, 2, 3], {2: 1, 3: 0}, hosts)
    assert [r[0] for r in rows[:2]] == [3, 2]


# -- bad input -----------------------------------------------------------------------------------

def test_bad_files_are_one_line_warnings(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"status": "success", "data": {"resultType": "matrix", "result": [')
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello\nworld\n")
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    runner = CliRunner()
    plain = runner.invoke(main, ["analyze", str(TWO_RANKS), "--format", "json"])
    res = runner.invoke(main, ["analyze", str(TWO_RANKS), "--format", "json", "--metrics", str(broken),
                               "--metrics", str(unknown), "--metrics", str(binary),
                               "--metrics", str(tmp_path / "missing.csv"), "--metrics", str(DATA / "rocm_smi.csv")])
    assert res.exit_code == plain.exit_code == 0
    assert "Traceback" not in res.output
    data = json.loads(res.stdout)
    validate_report(data)
    msgs = {Path(w["path"]).name: w["message"] for w in data["warnings"] if w.get("path") and w["code"] == "bad_metrics"}
    assert "not valid JSON" in msgs["broken.json"]
    assert "not a known metrics form" in msgs["notes.txt"]
    assert "not text" in msgs["blob.csv"]
    assert "no such file" in msgs["missing.csv"]
    assert all("\n" not in m for m in msgs.values())
    err = [ln for ln in res.stderr.splitlines() if "broken.json" in ln]
    assert len(err) == 1 and err[0].startswith("advisor: warning:")


def test_gzip_files(tmp_path: Path) -> None:
    good = tmp_path / "smi.csv.gz"
    good.write_bytes(gzip.compress((DATA / "nvidia_smi.csv").read_bytes()))
    assert read_file(good)[0] == "nvidia-smi"
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(good.read_bytes()[:40])
    with pytest.raises(MetricsError, match="truncated|cannot read"):
        read_file(cut)


# -- series inside the exports -------------------------------------------------------------------

def _counter_trace(tmp_path: Path, lower_case_key: bool) -> Path:
    d = json.loads(gzip.decompress((TWO_RANKS / "rank-0.json.gz").read_bytes()))
    ev = d["traceEvents"]
    t0 = min(float(e["ts"]) for e in ev if e.get("ph") == "X")
    if lower_case_key:  # the old key spelling makes the reader take args as JSON, not as a typed struct
        ev.insert(0, {"ph": "X", "name": "f", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": t0, "dur": 1,
                      "args": {"external id": 1}})
    for i in range(4):
        ev.append({"ph": "C", "name": "sm_active_pct", "pid": 0, "tid": 0, "ts": t0 + 1000 * i,
                   "args": {"value": 10.0 * i}})
        ev.append({"ph": "C", "name": "Queue Length", "pid": 0, "ts": t0 + 1000 * i, "args": {"stream 7": i}})
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps(d))
    return f


@pytest.mark.parametrize("lower_case_key", [False, True])
def test_kineto_counters(tmp_path: Path, lower_case_key: bool) -> None:
    prof = load(_counter_trace(tmp_path, lower_case_key))
    rows = prof.con.execute("""SELECT metric, ts_ns, value, device, unit FROM hw_metrics
                               WHERE source = 'kineto-counter' ORDER BY metric, ts_ns""").fetchall()
    t0 = 1682725897226747 * 1000  # the sample's first event, µs
    assert [r[:3] for r in rows if r[0] == "sm_active_pct"] == [
        ("sm_active_pct", t0 + i * 1_000_000, 10.0 * i) for i in range(4)]
    assert [r[2] for r in rows if r[0] == "src:queue length/stream 7"] == [0.0, 1.0, 2.0, 3.0]
    assert {r[3] for r in rows} == {"0"} and {r[4] for r in rows if r[0] == "sm_active_pct"} == {"%"}
    assert any(w.code == "metrics_kept" and "src:queue length/stream 7" in w.message for w in prof.warnings)
    assert prof.con.execute("SELECT count(*) FROM events WHERE name = 'sm_active_pct'").fetchone()[0] == 0


@pytest.fixture(scope="module")
def ascend_text() -> Any:
    return load(ASCEND / "ascend_pt_resnet_ddp_l1_text")


def test_ascend_text_series(ascend_text: Any) -> None:
    con = ascend_text.con
    raw = json.loads(gzip.decompress((ASCEND / "ascend_pt_resnet_ddp_l1_text/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/"
                                      "trace_view.json.gz").read_bytes()))
    pname = {e["pid"]: e["args"]["name"] for e in raw if e.get("ph") == "M" and e.get("name") == "process_name"}
    hbm_read: dict[str, float] = {}
    for e in raw:  # independent sum of the HBM stacks' read MB/s at each time
        if e.get("ph") == "C" and pname.get(e["pid"]) == "HBM" and e["name"].endswith("/Read"):
            hbm_read[e["ts"]] = hbm_read.get(e["ts"], 0.0) + e["args"]["Read(MB/s)"]
    got = con.execute("SELECT max(value) FROM hw_metrics WHERE rank = 0 AND metric = 'hbm_read_bps'").fetchone()[0]
    assert got == pytest.approx(max(hbm_read.values()) * MIB)
    # by hand from the file: AI Core Freq 1800 MHz; first Device/HBM sample 2402436 KB
    assert con.execute("SELECT DISTINCT value, unit FROM hw_metrics WHERE rank = 0 AND metric = 'aicore_freq_mhz'"
                       ).fetchall() == [(1800.0, "MHz")]
    first = con.execute("""SELECT value FROM hw_metrics WHERE rank = 0 AND metric = 'mem_used_bytes'
                           ORDER BY ts_ns LIMIT 1""").fetchone()[0]
    assert first == 2402436 * 1024
    hit = con.execute("""SELECT min(value), max(value) FROM hw_metrics WHERE rank = 0
                         AND metric = 'src:llc 0 read/hit rate'""").fetchone()
    assert hit == pytest.approx((77.5, 92.7))  # 0.775 .. 0.927 written under 'Hit Rate(%)'
    assert {r[0] for r in con.execute("SELECT DISTINCT source FROM hw_metrics").fetchall()} == {"ascend-text"}


ASCEND_DB = ASCEND / "ascend_pt_resnet_ddp_l1_db/rank1_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_1.db"


def _db_truth() -> tuple[list[tuple[int, float]], list[tuple[int, float]], int]:
    """Independent reads of the database: HBM read bandwidth summed over the stacks per time,
    the device's used HBM, and the number of AI Core frequency samples."""
    with sqlite3.connect(f"file:{ASCEND_DB}?mode=ro&immutable=1", uri=True) as c:
        reads = c.execute("""SELECT timestampNs, sum(bandwidth) FROM HBM WHERE type =
                             (SELECT id FROM STRING_IDS WHERE value = 'read') GROUP BY 1 ORDER BY 1""").fetchall()
        mem = c.execute("""SELECT timestampNs, hbm FROM NPU_MEM WHERE type =
                           (SELECT id FROM STRING_IDS WHERE value = 'device') ORDER BY 1""").fetchall()
        freq = c.execute("SELECT count(*) FROM AICORE_FREQ").fetchone()[0]
    return [(int(t), float(v)) for t, v in reads], [(int(t), float(v)) for t, v in mem], int(freq)


def test_ascend_db_series() -> None:
    from advisor.ingest.ascend_counters import db_rows
    from advisor.sqlite_safe import SafeSqlite

    db = SafeSqlite(ASCEND_DB)
    try:
        rows = db_rows(db, 1)
    finally:
        db.close()
    reads, mem, freq = _db_truth()
    assert sorted((r[2], r[3]) for r in rows if r[1] == "hbm_read_bps") == reads
    assert sorted((r[2], r[3]) for r in rows if r[1] == "mem_used_bytes") == mem
    assert sum(1 for r in rows if r[1] == "aicore_freq_mhz") == freq
    assert {r[0] for r in rows} == {1} and {r[4] for r in rows} == {"1"} and {r[7] for r in rows} == {"ascend-db"}
    assert {r[6] for r in rows if r[1] == "hbm_read_bps"} == {"B/s"}
    kept = {r[1] for r in rows if r[1].startswith("src:")}
    assert {"src:acc_pmu/readbwlevel", "src:soc_bandwidth_level/matabwlevel", "src:npu module mem/hccl"} <= kept


@pytest.mark.slow
def test_ascend_db_series_loaded() -> None:
    prof = load(ASCEND / "ascend_pt_resnet_ddp_l1_db/rank1_ascend_pt")
    reads, mem, _freq = _db_truth()
    con = prof.con
    assert con.execute("""SELECT ts_ns, value FROM hw_metrics WHERE rank = 1 AND metric = 'hbm_read_bps'
                          ORDER BY ts_ns""").fetchall() == reads
    assert con.execute("""SELECT ts_ns, value FROM hw_metrics WHERE rank = 1 AND metric = 'mem_used_bytes'
                          ORDER BY ts_ns""").fetchall() == mem
    assert any(w.code == "metrics_kept" and w.message.startswith("ascend-db") for w in prof.warnings)


def test_npu_smi_beside_an_ascend_export(ascend_text: Any) -> None:
    """An Ascend text export names no device: NPU i is taken as rank i (one node)."""
    from advisor.metrics import load_metrics

    warnings: list[tuple[str, str]] = []
    load_metrics(ascend_text.con, [DATA / "npu_smi_watch.txt"], lambda c, m, p=None: warnings.append((c, m)))
    got = ascend_text.con.execute("""SELECT rank, avg(value) FROM hw_metrics WHERE source = 'npu-smi'
                                     AND metric = 'aicore_util_pct' GROUP BY rank ORDER BY rank""").fetchall()
    assert got == [(0, 55.0), (1, 75.0)]
    assert "metrics_untimed" in {c for c, _ in warnings}


def test_file_without_overlap_is_ignored_and_the_offset_named(two_ranks_utc: Any) -> None:
    """nvidia_smi.csv (local times of UTC+08:00) read as UTC lies 8 h after the trace: none of its
    samples is used, and the warning names the offset that aligns it (test_offset_aligns_local_times)."""
    con = two_ranks_utc.con
    assert con.execute("SELECT count(*) FROM hw_metrics WHERE source = 'nvidia-smi'").fetchone()[0] == 0
    msg = next(w.message for w in two_ranks_utc.warnings
               if w.code == "metrics_no_overlap" and Path(w.path or "").name == "nvidia_smi.csv")
    assert "the file is ignored" in msg and "--metrics-tz-offset +08:00 would align it" in msg


def test_aligning_offset() -> None:
    h, s = 3600, 10**9
    span = (1000 * s, 1060 * s)  # a one-minute trace
    # samples read as UTC 5 h 30 min after it (India, UTC+05:30): +05:30
    assert aligning_offset(1000 * s + 19800 * s, 1090 * s + 19800 * s, span, 0.0) == 5.5 * h
    # read with +02:00 and still 1 h late: +03:00
    assert aligning_offset(1010 * s + h * s, 1050 * s + h * s, span, 2.0 * h) == 3.0 * h
    # 2 h early (a clock two hours behind UTC): -02:00
    assert aligning_offset(1000 * s - 2 * h * s, 1050 * s - 2 * h * s, span, 0.0) == -2.0 * h
    # three days away: no zone aligns it
    assert aligning_offset(1000 * s + 72 * h * s, 1050 * s + 72 * h * s, span, 0.0) is None
    assert format_offset(5.5 * h) == "+05:30" and format_offset(-2 * h) == "-02:00"


def test_dmon_through_ts_with_zone() -> None:
    """``dcgmi dmon ... | ts '%Y-%m-%dT%H:%M:%.S%z'``: the header is prefixed too; times read with their zone."""
    form, s, rc = read_file(DATA / "dcgm_dmon_ts.txt")
    assert form == "dcgm" and "untimed" not in rc.notes and "zone_less" not in rc.notes
    t0 = 1682725898 * 10**9  # 2023-04-28T23:51:38Z
    assert sorted({x.ts_ns for x in s}) == [t0 + 200_000_000, t0 + 1_200_000_000]
    assert {x.value for x in s if x.metric == "sm_active_pct" and x.device == "0"} == {50.0, 70.0}


def test_dmon_through_ts_default_format_takes_the_trace_year() -> None:
    """ts's default prefix ``Apr 28 23:51:38`` has no year: the year of the trace's start is taken
    (the year nearest to it at a new year), and without a trace the rows have no time."""
    t0 = 1682725898 * 10**9  # 2023-04-28T23:51:38Z
    form, s, rc = read_file(DATA / "dcgm_dmon_ts_default.txt", ref_ns=t0 + 79_000_000)
    assert form == "dcgm" and "year_less" in rc.notes and "untimed" not in rc.notes
    assert sorted({x.ts_ns for x in s}) == [t0, t0 + 10**9]
    _f, s2, rc2 = read_file(DATA / "dcgm_dmon_ts_default.txt")
    assert {x.ts_ns for x in s2} == {None} and "untimed" in rc2.notes
    # a trace of 2 Jan 2024 00:00:10 UTC and a sample of "Dec 31 23:59:59": 2023
    ref = 1704153610 * 10**9
    assert parse_yearless("Dec 31 23:59:59", ref) == 1704067199 * 10**9
    assert parse_yearless("Feb 30 10:00:00", ref) is None and parse_yearless("Foo 1 10:00:00", ref) is None


def test_dmon_ts_default_on_the_trace() -> None:
    prof = _load("dcgm_dmon_ts_default.txt")
    msgs = {w.code: w.message for w in prof.warnings}
    assert "the trace's year (2023) taken" in msgs["metrics_year_less"]
    assert "metrics_no_overlap" not in msgs
    n = prof.con.execute("SELECT count(*) FROM hw_metrics WHERE source = 'dcgm' AND ts_ns IS NOT NULL").fetchone()[0]
    assert n == 23  # 4 rows x 6 fields, less one N/A
