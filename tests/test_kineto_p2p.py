"""Point-to-point transfers of Kineto traces feed the communication matrix.

The peer of a send / recv is read where the trace writes it: record_param_comms' ``Dst Rank`` /
``Src Rank`` (global), its ``Rank`` (group-local) mapped through ``Process Group Ranks`` or the
group in ``distributedInfo.pg_config``, and gloo's ``c10d::send`` / ``c10d::recv_`` third concrete
input. The rows are marked ``kineto:<backend>`` and never judged by the Ascend link rules
(COM004 RDMA retransmission, COM006 HCCS alignment).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TRACES, report_json
from tests.test_html_charts import assert_drawn, charts_of

MIB = 1 << 20


def _raw_events(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])


def test_gloo_pipeline_links_are_read_from_the_trace() -> None:
    """gloo_pipeline_bubble (2 stages, gloo, one world group [0, 1] in pg_config). By hand from the
    raw JSON: each rank records 6 ``c10d::send`` (Concrete Inputs[2] = the other rank) and 6
    ``c10d::recv_``; each send holds a ``gloo:send`` of one float tensor [256, 1024] = 1 MiB. So
    0 -> 1 and 1 -> 0 each move 6 MiB in 6 transfers, counted once (the sender's record)."""
    from advisor.analyze import analyze
    from advisor.render import html

    d = TRACES / "gloo_pipeline_bubble"
    # the same facts, recomputed from the raw events
    for rank, peer in ((0, "1"), (1, "0")):
        ev = _raw_events(d / f"rank{rank}.pt.trace.json.gz")
        sends = [e for e in ev if e.get("name") == "c10d::send"]
        assert len(sends) == 6 and all(e["args"]["Concrete Inputs"][2] == peer for e in sends)
        gloo = [e for e in ev if e.get("name") == "gloo:send"]
        assert len(gloo) == 6 and all(e["args"]["Input Dims"] == [[256, 1024]] for e in gloo)
        assert all(e["args"]["Input type"] == ["float"] for e in gloo)

    report = analyze(d)
    data = report_json(report)
    links = {(r["src"], r["dst"]): r for r in data["comm_matrix"]}
    assert links == {
        (0, 1): {"src": 0, "dst": 1, "bytes": 6 * MIB, "bandwidth_gbps": None, "transport": "GLOO", "transfers": 6},
        (1, 0): {"src": 1, "dst": 0, "bytes": 6 * MIB, "bandwidth_gbps": None, "transport": "GLOO", "transfers": 6},
    }
    assert not any(w["code"] == "p2p_peer" for w in data["warnings"])
    assert not {f["rule"] for f in data["findings"]} & {"COM004", "COM006"}

    charts = charts_of(html.render(report))
    c = assert_drawn(charts, "chart-comm", "rect", at_least=2)
    assert c["tags"]["rect"] == 2 and "bytes moved" in c["aria"]
    assert any(t.startswith("rank 0 → rank 1: 6.0 MiB") and "GLOO" in t for t in c["titles"]), c["titles"]


# -- a hand-written NCCL pipeline ---------------------------------------------------------------


def _op(name: str, ts: float, dur: float, args: dict[str, Any], cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _nccl_transfer(ts: float, op: str, nelems: int, dtype: str, peer_args: dict[str, Any],
                   label: str) -> list[dict[str, Any]]:
    """c10d::send / recv_ holding record_param_comms holding the ``nccl:send a->b`` annotation, as
    ProcessGroupNCCL records them (the c10d op's own concrete input is the group-local peer)."""
    c10d = "c10d::send" if op == "send" else "c10d::recv_"
    rpc = {"Collective name": op, "dtype": dtype, "In msg nelems": nelems, "Out msg nelems": nelems, **peer_args}
    return [_op(c10d, ts, 100.0, {"Concrete Inputs": ["", "", str(peer_args.get("Rank", 0)), "0"]}),
            _op("record_param_comms", ts + 10, 80.0, rpc),
            _op(f"nccl:{op} {label}", ts + 20, 30.0, {"Input Dims": [[nelems]], "Input type": [dtype.lower()]},
                cat="user_annotation")]


def _trace(directory: Path, rank: int, events: list[dict[str, Any]], pg_config: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    ev += [_op(f"ProfilerStep#{s}", 1000.0 + 10000 * s, 9000.0, {}, cat="user_annotation") for s in (1, 2)]
    ev += [_op("aten::mm", 1000.0 + 10000 * s + 100, 5000.0, {}) for s in (1, 2)]
    ev += events
    dist = {"backend": "nccl", "rank": rank, "world_size": 4, "pg_config": pg_config}
    (directory / f"rank{rank}.pt.trace.json").write_text(
        json.dumps({"schemaVersion": 1, "distributedInfo": dist, "deviceProperties": [], "traceEvents": ev}))


WORLD = {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 4, "ranks": [0, 1, 2, 3]}
PP = {"pg_name": "5", "pg_desc": "pp", "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 2]}


def write_nccl_pipeline(directory: Path, old_schema_key: bool = False) -> None:
    """Ranks 0 and 2 of a 4-rank job (traces of ranks 1 and 3 not in the profile); pipeline group
    [0, 2] (pg '5'). Rank 0: in step 1 a send of 1000 Float to rank 2 naming "Dst Rank" 2; in step 2
    a send of 3000 BFloat16 naming only "Rank" 1 and "Process Group Name" '5' (pg_config maps it to
    2); a recv of 500 Float from "Src Rank" 1. Rank 2: the matching recvs, one with "Rank" 0 and
    "Process Group Ranks" "[0, 2]", one with "Src Rank" 0; a gloo c10d::send (no record_param_comms)
    to group-local rank 1 of an unnamed group: in the world group that is rank 1, in the pipeline
    group rank 2 -- ambiguous, so left out with a warning. ``old_schema_key``: one operator spells
    ``Input dims`` as the old schema did, so the reader takes ``args`` as JSON text, not a STRUCT."""
    r0 = (_nccl_transfer(11200.0, "send", 1000, "Float", {"Dst Rank": 2, "Rank": 1, "Process Group Name": "5",
                                                          "Process Group Ranks": "[0, 2]"}, "0->1")
          + _nccl_transfer(21200.0, "send", 3000, "BFloat16", {"Rank": 1, "Process Group Name": "5"}, "0->1")
          + _nccl_transfer(22200.0, "recv", 500, "Float", {"Src Rank": 1, "Rank": 1, "Process Group Name": "0",
                                                          "Process Group Ranks": "[0, 1, 2, 3]"}, "1<-0"))
    r2 = (_nccl_transfer(11300.0, "recv", 1000, "Float", {"Rank": 0, "Process Group Name": "5",
                                                          "Process Group Ranks": "[0, 2]"}, "1<-0")
          + _nccl_transfer(21300.0, "recv", 3000, "BFloat16", {"Src Rank": 0, "Rank": 0}, "1<-0")
          + [_op("c10d::send", 23000.0, 50.0, {"Concrete Inputs": ["", "", "1", "0"]}),
             _op("gloo:send", 23010.0, 20.0, {"Input Dims": [[64]], "Input type": ["float"]}, cat="user_annotation")])
    if old_schema_key:
        r0.append(_op("aten::add", 12000.0, 10.0, {"Input dims": [[4], [4]]}))
    _trace(directory, 0, r0, [WORLD, PP])
    _trace(directory, 2, r2, [WORLD, PP])


@pytest.mark.parametrize("old_schema_key", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_record_param_comms_peers_are_mapped_to_global_ranks(tmp_path: Path, old_schema_key: bool) -> None:
    """By hand (see write_nccl_pipeline): 0 -> 2 = 1000 x 4 B + 3000 x 2 B = 10 000 B in 2 transfers
    (the sender's records; rank 2's recvs are the same transfers); 1 -> 0 = 500 x 4 B = 2000 B in 1
    transfer, from the receiver (rank 1's trace is not in the profile). Each c10d op holding a
    record_param_comms is the same transfer, not counted again. Rank 2's gloo send is left out."""
    from advisor.analyze import analyze
    from advisor.engine.context import load_profile

    write_nccl_pipeline(tmp_path / "pp", old_schema_key)
    data = report_json(analyze(tmp_path / "pp"))
    links = {(r["src"], r["dst"]): r for r in data["comm_matrix"]}
    assert links == {
        (0, 2): {"src": 0, "dst": 2, "bytes": 10_000, "bandwidth_gbps": None, "transport": "NCCL", "transfers": 2},
        (1, 0): {"src": 1, "dst": 0, "bytes": 2_000, "bandwidth_gbps": None, "transport": "NCCL", "transfers": 1},
    }
    warned = [w for w in data["warnings"] if w["code"] == "p2p_peer"]
    assert len(warned) == 1 and warned[0]["path"].endswith("rank2.pt.trace.json")
    assert warned[0]["message"].startswith("1 point-to-point transfer(s)")

    ctx = load_profile(tmp_path / "pp")
    rows = ctx.con.execute("SELECT rank, step, group_name, name, src_rank, dst_rank, transport, bytes, transit_ns "
                           "FROM comm_matrix ORDER BY rank, src_rank, bytes").fetchall()
    assert rows == [(0, 1, "5", "send", 0, 2, "kineto:nccl", 4000, None),
                    (0, 2, "5", "send", 0, 2, "kineto:nccl", 6000, None),
                    (0, 2, "0", "recv", 1, 0, "kineto:nccl", 2000, None),
                    (2, 1, "5", "recv", 0, 2, "kineto:nccl", 4000, None),
                    (2, 2, None, "recv", 0, 2, "kineto:nccl", 6000, None)]


def test_ascend_link_rules_never_judge_kineto_rows() -> None:
    """COM004 and COM006 run (the profile has Ascend bandwidth rows: HCCS 32 MiB in 1.5 ms, aligned)
    beside Kineto point-to-point rows that would look misaligned (1000 B) over HCCS or slow over
    RDMA: they stay quiet, and their SQL reads no Kineto row."""
    from advisor.analyze import analyze_context
    from advisor.stages.comm_links import NOT_KINETO_SQL
    from advisor.testing import context_from_tables
    from tests.rules.fixtures_comm import hccs_aligned

    tables = hccs_aligned()
    kineto = [{"rank": r, "step": s, "name": op, "src_rank": 0, "dst_rank": 1, "transport": t, "bytes": 1000}
              for r, op in ((0, "send"), (1, "recv")) for s in (1, 2, 3) for t in ("kineto:hccs", "kineto:nccl")]
    kineto += [{"rank": 0, "step": 1, "name": "send", "src_rank": 0, "dst_rank": 1, "transport": "kineto:rdma",
                "bytes": 1000, "transit_ns": 5_000_000_000}]
    tables["comm_matrix"] = list(tables.get("comm_matrix", [])) + kineto
    ctx = context_from_tables(tables)
    n = ctx.con.execute(f"SELECT count(*) FROM comm_matrix WHERE {NOT_KINETO_SQL}").fetchone()
    assert n is not None and n[0] == len(tables["comm_matrix"]) - len(kineto)
    report = analyze_context(ctx)
    data = report_json(report)
    ran = {r["rule"]: r for r in data["rules"]}
    assert ran["COM004"]["status"] == "ran" and ran["COM006"]["status"] == "ran", (ran["COM004"], ran["COM006"])
    assert not {f["rule"] for f in data["findings"]} & {"COM004", "COM006"}


def test_malformed_p2p_arguments_cost_only_those_transfers(tmp_path: Path) -> None:
    """Arguments of the wrong shape (concrete inputs that are no list, dims that are no JSON list, a
    peer that is no number) leave the trace readable: those transfers are left out with a warning,
    the good one stays (rank 0 -> 1, 16 float = 64 B)."""
    from advisor.analyze import analyze

    bad = [_op("c10d::send", 11200.0, 50.0, {"Concrete Inputs": "x"}),
           _op("gloo:send", 11210.0, 20.0, {"Input Dims": "abc", "Input type": 5}, cat="user_annotation"),
           _op("record_param_comms", 11400.0, 50.0, {"Collective name": "send", "Dst Rank": "two", "Rank": [1]}),
           _op("c10d::recv_", 11600.0, 50.0, {"Concrete Inputs": {"2": 1}}),
           _op("c10d::send", 21200.0, 50.0, {"Concrete Inputs": ["", "", "1", "0"]}),
           _op("gloo:send", 21210.0, 20.0, {"Input Dims": [[16]], "Input type": ["float"]}, cat="user_annotation")]
    _trace(tmp_path / "bad", 0, bad, [WORLD])
    data = report_json(analyze(tmp_path / "bad"))
    assert data["comm_matrix"] == [{"src": 0, "dst": 1, "bytes": 64, "bandwidth_gbps": None, "transport": "GLOO",
                                    "transfers": 1}]
    warned = [w["message"] for w in data["warnings"] if w["code"] == "p2p_peer"]
    assert len(warned) == 1 and warned[0].startswith("3 point-to-point transfer(s) record no peer rank")
