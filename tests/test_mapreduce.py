"""The per-rank map and cluster reduce (advisor.pipeline): the same report whatever the
shards and wherever they run; the reduce holds no event; cluster rules read only summaries."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from advisor.analyze import analyze
from advisor.config import Config
from advisor.engine.context import AnalysisContext
from advisor.engine.merge import merge_shards
from advisor.engine.registry import discover
from advisor.engine.runner import combine
from advisor.ingest import claim_units
from advisor.ingest.base import Unit
from advisor.model import Finding, RuleOutcome, Severity
from advisor.options import LoadOptions
from advisor.pipeline import map as pmap
from advisor.pipeline import plan, schedule
from advisor.schema import OWN_TABLES_SQL
from tests.ascend import gen_cluster
from tests.conftest import SAMPLES, TRACES, report_json
from tests.test_determinism import _strip

ASCEND_DDP = Path(__file__).parent / "data" / "ascend_real" / "ascend_pt_resnet_ddp_l1_db"


def _report(path: Path, shard_bytes: int, monkeypatch: pytest.MonkeyPatch, processes: int = 1,
            keep: list[AnalysisContext] | None = None) -> Any:
    monkeypatch.setattr(plan, "SHARD_BYTES", shard_bytes)
    return _strip(report_json(analyze(path, keep=keep, options=LoadOptions(workers=processes))))


def _unreplayed_reasons_dropped(report: Any) -> Any:
    """The report with the reason of every replay that estimated nothing left out: a straggler's
    replay joins ranks read together, so a shard holding part of the world says so where the whole
    profile gives the join's own reason (e.g. gloo's host collectives cannot be joined); the
    savings, and everything else, must be the same."""
    for f in report["findings"]:
        rp = f.get("replay")
        if rp and not rp.get("estimated"):
            rp.pop("reason", None)
            f["evidence"].pop("saving_not_replayed", None)
    return report


def _units(tmp_path: Path, sizes: list[int]) -> list[Unit]:
    out = []
    for r, size in enumerate(sizes):
        f = tmp_path / f"r{r}.json"
        f.write_bytes(b"x" * size)
        out.append(Unit("kineto", [f], f, rank=r))
    return out


def test_shards_are_consecutive_ranks_up_to_a_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "ONE_SHARD_SHARDS", 0)  # a profile of any size is cut
    units = _units(tmp_path, [40, 40, 30, 100, 10, 10])
    shards = plan.plan_shards(list(reversed(units)), max_bytes=100)
    assert [[u.rank for u in s] for s in shards] == [[0, 1], [2], [3], [4, 5]]  # 40+40+30 > 100; 100 alone
    assert [[u.rank for u in s] for s in plan.plan_shards(units, max_bytes=1)] == [[r] for r in range(6)]
    assert [[u.rank for u in s] for s in plan.plan_shards(units, max_bytes=1 << 30)] == [list(range(6))]


def test_a_small_profile_is_one_shard(tmp_path: Path) -> None:
    units = _units(tmp_path, [40, 40, 30, 100, 10, 10])  # 230 bytes
    one = [list(range(6))]
    assert plan.ONE_SHARD_SHARDS >= 1
    assert [[u.rank for u in s] for s in plan.plan_shards(list(reversed(units)), max_bytes=230)] == one
    cut = -(-230 // plan.ONE_SHARD_SHARDS)  # 230 bytes are exactly ONE_SHARD_SHARDS shards' worth, or less
    assert [[u.rank for u in s] for s in plan.plan_shards(units, max_bytes=cut)] == one
    assert len(plan.plan_shards(units, max_bytes=229 // plan.ONE_SHARD_SHARDS)) > 1
    assert plan.plan_shards([], max_bytes=1) == []


def test_pool_only_for_several_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert schedule.pool_workers(None, 1) == 1  # one shard: in-process
    assert schedule.pool_workers(None, 3) == 3
    assert schedule.pool_workers(None, 100) == 8
    assert schedule.pool_workers(4, 2) == 2  # never more workers than shards
    assert schedule.pool_workers(1, 100) == 1
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert schedule.pool_workers(None, 100) == 1


@pytest.mark.slow  # three whole analyses twice over (~8 s); the engines' test splits clusters too
@pytest.mark.parametrize("path", [TRACES / "gloo_slow_rank", SAMPLES / "kineto_two_ranks", ASCEND_DDP],
                         ids=lambda p: p.name)
def test_one_rank_per_shard_same_report(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _report(path, 1 << 40, monkeypatch)
    assert _unreplayed_reasons_dropped(_report(path, 1, monkeypatch)) == _unreplayed_reasons_dropped(whole)
    specs = discover()  # these clusters have findings, the cluster rules' among them
    assert any(specs[f["rule"]].scope == "cluster" for f in whole["findings"])


@pytest.fixture(scope="module")
def faults8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mapreduce_faults8")
    gen_cluster.generate("faults8", root, "db")
    return root


def _said(report: Any) -> list[tuple[Any, ...]]:
    """What each finding says, without ``ops`` / ``top`` / ids: COM005 / COM006 take the first
    rows of a query without an ORDER BY (see tests/test_pool.py)."""
    return sorted((f["rule"], f["cause"], f["severity"], f["title"], f["ranks"], f["steps"], f["estimated_saving_us"])
                  for f in report["findings"])


@pytest.mark.slow
def test_ascend_cluster_sharded_same_findings(faults8: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _report(faults8, 1 << 40, monkeypatch)
    for shard_bytes in (1, 3 * (1 << 20)):  # one rank a shard; a few ranks a shard
        part = _report(faults8, shard_bytes, monkeypatch)
        assert _said(part) == _said(whole)
        assert part["profile"] == whole["profile"]
        assert part["critical_path"] == whole["critical_path"]
        assert part["breakdown"] == whole["breakdown"]


@pytest.mark.slow
def test_pool_gives_the_in_process_report(monkeypatch: pytest.MonkeyPatch) -> None:
    path = TRACES / "gloo_slow_rank"
    assert _report(path, 1, monkeypatch, processes=2) == _report(path, 1, monkeypatch, processes=1)


def test_reduce_holds_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    keep: list[AnalysisContext] = []
    report = _report(TRACES / "gloo_slow_rank", 1, monkeypatch, keep=keep)
    con = keep[0].con.cursor()
    tables = {r[0] for r in con.execute(f"SELECT table_name FROM duckdb_tables() WHERE {OWN_TABLES_SQL}").fetchall()}
    assert not tables & set(pmap.BIG_TABLES)
    assert con.execute("SELECT count(*) FROM ranks").fetchone()[0] == 2
    assert keep[0].rows("events") > 0  # counted by the maps: rules' requirements on events still hold
    assert not [w for w in report["warnings"] if w["code"] == "rule_error"]


def test_map_result_is_a_plain_value() -> None:
    path = TRACES / "gloo_slow_rank"
    units = claim_units(path, [], lambda *a: None)
    res = pmap.map_shard(str(path), units[:1], Config())
    back = pickle.loads(pickle.dumps(res))
    assert back.ranks == [0] and back.tables.keys() == res.tables.keys()
    assert "events" not in back.tables and "ranks" in back.tables
    assert back.counts["events"] > 0


def test_the_only_shard_hands_its_database_to_the_reduce() -> None:
    """A shard mapped in the process that reduces it keeps its summary in its own DuckDB: the reduce
    then holds the same tables with the same rows as when the summary travels as Arrow bytes."""
    from advisor.pipeline.reduce import gather

    path = TRACES / "gloo_slow_rank"

    def summary(keep_db: bool) -> dict[str, list[str]]:
        units = claim_units(path, [], lambda *a: None)  # a load notes things in its units: fresh ones
        res = pmap.map_shard(str(path), units, Config(), keep_db=keep_db)
        assert (res.db is not None, bool(res.tables)) == (keep_db, not keep_db)
        cur = gather(str(path), units, iter([res]), [], lambda *a: None, memory_limit=None).con.cursor()
        names = [r[0] for r in cur.execute(f"SELECT table_name FROM duckdb_tables() WHERE {OWN_TABLES_SQL}").fetchall()]
        return {n: sorted(map(repr, cur.execute(f"SELECT * FROM {n}").fetchall())) for n in names}

    kept, sent = summary(True), summary(False)
    assert "ranks" in kept and not kept.keys() & set(pmap.BIG_TABLES)
    assert kept == sent


def test_cluster_rules_are_marked() -> None:
    specs = discover()
    for rid in ("CLU001", "CLU002", "CLU003", "CLU004", "CLU005", "CLU006", "COM001", "COM002", "PAR001", "VAR001",
                "HW001", "HW002", "HW003", "HW004", "HW005"):
        assert specs[rid].scope == "cluster", rid
    assert specs["CPU002"].scope == "rank"


def test_bad_scope_is_refused() -> None:
    from advisor.engine.rule import rule

    with pytest.raises(ValueError, match="scope"):
        rule("ZZZ999", "x.y", cause="x.y", scope="node")(lambda ctx: [])


def _f(rule: str, ranks: tuple[int, ...], saving: float, title: str) -> Finding:
    return Finding(rule=rule, cause="c.d", severity=Severity.MEDIUM, title=title, evidence={"saving": saving},
                   ranks=ranks, estimated_saving_us=saving)


def test_merge_shards_names_every_rank_with_the_worst_evidence() -> None:
    a = [_f("R1", (0, 1), 5.0, "on 2 ranks"), _f("R2", (0,), 1.0, "rank 0")]
    b = [_f("R1", (2, 3), 9.0, "on 2 ranks (worse)"), _f("R2", (2,), 1.0, "rank 2")]
    out = merge_shards([a, b])
    r1 = [f for f in out if f.rule == "R1"]
    assert len(r1) == 1
    assert r1[0].ranks == (0, 1, 2, 3)
    assert r1[0].evidence == {"saving": 9.0, "ranks_affected": 4}
    assert r1[0].title == "on 2 ranks (worse) (and 2 more ranks: 0–1)"
    assert len([f for f in out if f.rule == "R2"]) == 2  # single-rank findings: left to merge_per_rank


def test_combine_outcomes_across_shards() -> None:
    ran = ("ran", (RuleOutcome("R1", "ran", findings=1, seconds=0.5), [_f("R1", (0,), 1.0, "x")], [], ["rank 0: n"]))
    skipped = ("skipped", "no comm_ops data")
    out = combine([{"R1": skipped, "R2": skipped}, {"R1": ran, "R2": skipped}])
    assert out["R2"] == skipped
    status, (outcome, findings, _errors, notes) = out["R1"]
    assert status == "ran" and outcome.status == "ran" and outcome.findings == 1 and notes == ["rank 0: n"]
    assert [f.title for f in findings] == ["x"]


@pytest.mark.slow
def test_pool_by_default_for_the_cli_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI (``LoadOptions(workers=None)``) runs two shards or more on a pool; a library caller
    stays in-process unless it asks (a pool imports its ``__main__`` again)."""
    seen: list[int] = []
    real = schedule.run_maps

    def spy(*args: Any, workers: int, **kwargs: Any) -> Any:
        seen.append(workers)
        return real(*args, workers=1, **kwargs)

    monkeypatch.setattr("advisor.analyze.run_maps", spy)
    monkeypatch.setattr(plan, "SHARD_BYTES", 1)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    analyze(TRACES / "gloo_slow_rank")
    analyze(TRACES / "gloo_slow_rank", options=LoadOptions(workers=None))
    assert seen == [1, 2]  # two ranks: two shards, two workers


def _fake_maps(monkeypatch: pytest.MonkeyPatch, fail: dict[int, BaseException] | None = None) -> list[tuple[int, str]]:
    """``map_shard`` replaced by one that records which thread ran which shard (its first rank), on
    a pool of one thread standing for the spawned worker."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import contextmanager

    ran: list[tuple[int, str]] = []

    def fake(root: str, units: list[Unit], cfg: Config, **kw: Any) -> pmap.ShardResult:
        time.sleep(0.02)  # long enough for the other side to take a shard meanwhile
        ran.append((units[0].rank, threading.current_thread().name))
        if fail and units[0].rank in fail:
            raise fail[units[0].rank]
        return pmap.ShardResult(ranks=[u.rank for u in units], load_warnings=[])

    @contextmanager
    def executor(engine: Any, workers: Any, pool_from: int = 2) -> Any:
        assert workers == 1 and pool_from == 1
        with ThreadPoolExecutor(1, thread_name_prefix="worker") as ex:
            yield ex

    monkeypatch.setattr(schedule, "map_shard", fake)
    monkeypatch.setattr("advisor.pipeline.schedule.open_executor", executor)
    return ran


def _shards(n: int) -> list[list[Unit]]:
    return [[Unit("kineto", [Path(f"r{r}.json")], Path("."), rank=r)] for r in range(n)]


def test_main_process_runs_maps_beside_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _fake_maps(monkeypatch)
    out = list(schedule.run_maps(".", _shards(8), Config(), workers=2, rank=None, step=None, memory_limit=None,
                           max_events=None, debug=False))
    assert [r.ranks for r in out] == [[r] for r in range(8)]  # in shard order, whoever ran them
    assert sorted(r for r, _ in ran) == list(range(8))  # each shard once
    who = {name.split("_")[0] for _, name in ran}
    assert who == {"MainThread", "worker"}


def test_map_errors_come_in_shard_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures.process import BrokenProcessPool

    from advisor.ingest.base import InputError

    _fake_maps(monkeypatch, {3: ValueError("bad shard"), 5: ValueError("later")})
    maps = schedule.run_maps(".", _shards(8), Config(), workers=2, rank=None, step=None, memory_limit=None,
                       max_events=None, debug=False)
    got = []
    with pytest.raises(ValueError, match="bad shard"):
        for r in maps:
            got.append(r.ranks[0])
    assert got == [0, 1, 2]
    _fake_maps(monkeypatch, {r: BrokenProcessPool("gone") for r in range(8)})
    maps = schedule.run_maps(".", _shards(2), Config(), workers=2, rank=None, step=None, memory_limit=None,
                       max_events=None, debug=False)
    # a worker killed under its map: the shard's ranks and the likely cause, not the pool's exception
    with pytest.raises(InputError, match=r"reading ranks 0-0 ended abruptly \(out of memory\?"):
        list(maps)
