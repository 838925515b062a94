"""Ascend outputs other than a torch_npu export (issue 31, "Formats refused today").

* CANN's stand-alone ``PROF_*/msprof_<ts>.db`` (msprof command line, offline inference, MindSpore
  graph mode) is the unified CANN db without the PyTorch layer (format doc §17.2, §17.4, §18): made
  here from the real torch_npu db of ``tests/data/ascend_real`` (see its README) with torch_npu's
  own tables dropped, so what is left is CANN's tables only.
* msprof-analyze's ``cluster_analysis_output/`` (format doc §19) holds summaries of the rank exports,
  written here from the documented file names and columns (no real one is public).
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.ascend.test_real import DB, TEXT

PROF = "PROF_000001_20250109071234567_ABCDEFGHIJ"  # stand-alone msprof folder name (format doc §2.3)
#: torch_npu's tables in its db (format doc §17.2 "Tables added by torch_npu"); CANN's msprof db has none
TORCH_NPU_TABLES = ("PYTORCH_API", "CONNECTION_IDS", "PYTORCH_CALLCHAINS", "STEP_TIME", "GC_RECORD",
                    "MEMORY_RECORD", "OP_MEMORY")


def _msprof_db(tmp_path: Path) -> Path:
    prof = tmp_path / PROF
    (prof / "device_0").mkdir(parents=True)
    (prof / "device_0" / "info.json.0").write_text('{"DeviceInfo": [{"id": 0}], "rank_id": -1}')
    db = prof / "msprof_20250109071300.db"
    shutil.copy(DB / "rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db", db)
    db.chmod(0o644)
    con = sqlite3.connect(db)
    for t in TORCH_NPU_TABLES:
        con.execute(f"DROP TABLE IF EXISTS {t}")
    con.commit()
    con.close()
    return db


def test_msprof_db_without_the_pytorch_layer_is_read(tmp_path: Path) -> None:
    """Device breakdown, kernels and communication from CANN's tables alone."""
    from advisor.engine.context import load_profile
    from advisor.stages import breakdown

    db = _msprof_db(tmp_path)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    n_compute = con.execute("SELECT count(*) FROM COMPUTE_TASK_INFO JOIN TASK USING (globalTaskId)").fetchone()[0]
    n_ops, op_ns = con.execute("SELECT count(*), sum(endNs - startNs) FROM COMMUNICATION_OP").fetchone()
    con.close()
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0] and ctx.has_device
    assert not [w for w in ctx.warnings if w.code in ("bad_file", "bad_db", "bad_export")]
    assert ctx.con.execute("SELECT count(*) FROM kernels WHERE core_type <> 'HCCL'").fetchone()[0] == n_compute
    assert ctx.con.execute("SELECT count(*), sum(dur_ns) FROM comm_ops").fetchone() == (n_ops, op_ns)
    bd = breakdown.compute(ctx.con)
    assert len(bd) == 1  # no step marker (no framework layer): the window is one step
    b = bd.iloc[0]
    # the 4 all-reduces run one after the other: the device's communication time is their span sum
    assert 0.9 * op_ns / 1000.0 <= b["comm_us"] <= 1.01 * op_ns / 1000.0
    assert b["compute_us"] > 0


def _cluster_output(parent: Path) -> Path:
    """The files msprof-analyze's cluster command writes in text mode (format doc §19), small."""
    out = parent / "cluster_analysis_output"
    out.mkdir(parents=True)
    (out / "cluster_step_trace_time.csv").write_text(
        "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
        "Communication(Not Overlapped and Exclude Receive),Preparing\n"
        "50,rank,0,8873.756,101963.203,4028.675,105991.878,25744.05,136581.0,0,101963.203,17902.5\n"
        '50,stage,"(0, 1)",8878.3,101963.203,4028.675,105991.878,26675.2,136581.0,0,101963.203,17902.5\n')
    (out / "communication_group.json").write_text('{"collective": [[0, 1]], "p2p": [], "comm_group_parallel_info": []}')
    (out / "cluster_communication.json").write_text('{"(0, 1)": {"step50": {}}}')
    return out


def test_cluster_analysis_output_alone_is_refused_with_what_to_analyse(tmp_path: Path) -> None:
    out = _cluster_output(tmp_path / "job")
    p = subprocess.run([sys.executable, "-m", "advisor.cli", "analyze", str(out)],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for words in ("msprof-analyze cluster output", "cluster_step_trace_time.csv", "not a profile", "_ascend_pt",
                  str(tmp_path / "job")):
        assert words in lines[0]


def test_cluster_analysis_output_beside_the_rank_exports_is_named_not_read(tmp_path: Path) -> None:
    from advisor.engine.context import load_profile

    root = tmp_path / "job"
    shutil.copytree(TEXT, root)
    _cluster_output(root)
    ctx = load_profile(root)
    assert ctx.ranks == [0, 1]
    (w,) = [w for w in ctx.warnings if w.code == "cluster_summary"]
    assert "not read" in w.message and w.path == str(root / "cluster_analysis_output")
    # nothing else complains about its files (no reader takes them for a trace)
    assert not [w for w in ctx.warnings if w.path and "cluster_analysis_output/" in w.path]
