"""The per-rank load on a process pool (``load(path, processes=N)``: advisor.ingest._load_in_pool)
gives what the in-process load gives."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from advisor.analyze import analyze
from advisor.cli import main
from advisor.ingest import InputError, load, options
from advisor.ingest.base import Unit
from advisor.ingest.executors import share_of
from advisor.schema import TABLES
from tests.ascend import gen_cluster
from tests.conftest import SAMPLES, TRACES, report_json
from tests.test_determinism import _strip

KINETO_CLUSTERS = [TRACES / "gloo_slow_rank", SAMPLES / "kineto_two_ranks"]


def _report(path: Path, processes: int) -> Any:
    with options(processes=processes):
        return _strip(report_json(analyze(path)))


def test_memory_limit_shared() -> None:
    assert share_of("8GB", 2) == "4GB"
    assert share_of("1.5GiB", 3) == "0.5GiB"
    assert share_of("80%", 4) == "20%"
    assert share_of(None, 4) is None


@pytest.mark.parametrize("path", KINETO_CLUSTERS, ids=lambda p: p.name)
def test_kineto_same_report(path: Path) -> None:
    assert _report(path, 1) == _report(path, 2)


def test_cli_workers(tmp_path: Path) -> None:
    runner = CliRunner()
    path = SAMPLES / "kineto_two_ranks"
    outs = []
    for n in (1, 2):
        out = tmp_path / f"w{n}.json"
        res = runner.invoke(main, ["analyze", str(path), "--workers", str(n), "--out", str(out)])
        assert res.exit_code in (0, 1), res.output
        outs.append(_strip(json.loads(out.read_text())))
    assert outs[0] == outs[1]
    res = runner.invoke(main, ["analyze", str(path), "--workers", "0"])
    assert res.exit_code == 2 and "--workers" in res.output


def _rows(prof: Any, table: str) -> list[str]:
    """The table's rows, sorted: file ids left out (renumbered by the pool), and the readers'
    synthetic external ids (numbered within the batch of ranks read together) as their order
    within the rank."""
    cols = [c for c in TABLES[table].column_names if c != "file_id"]
    synthetic = 1 << 62  # the Ascend readers' base of the ids they make up (ascend_text / ascend_db _EXT_BASE)
    sel = ", ".join(f'"{c}"' if c != "ext_id" else
                    f"CASE WHEN ext_id >= {synthetic} THEN dense_rank() OVER (PARTITION BY rank, ext_id >= {synthetic} "
                    "ORDER BY ext_id) ELSE ext_id END" for c in cols)
    return sorted(map(repr, prof.con.execute(f"SELECT {sel} FROM {table}").fetchall()))


def _findings(report: Any) -> list[tuple[Any, ...]]:
    """What each finding says that does not depend on the order of rows within a table: on these
    clusters the in-process load alone gives, run after run, other ``ops`` / ``top`` lists (and so
    ids) in COM005 / COM006 and another ``group_size`` in CLU001's evidence, which take the first
    rows of a query without an ORDER BY (the loaded rows are in the same multiset: see
    :func:`test_ascend_same_tables`)."""
    return sorted((f["rule"], f["cause"], f["severity"], f["title"], f["ranks"], f["steps"], f["estimated_saving_us"])
                  for f in report["findings"])


@pytest.fixture(scope="module", params=["text", "db"])
def faults8(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"pool_faults8_{request.param}")
    gen_cluster.generate("faults8", root, request.param)
    return root


@pytest.mark.slow
def test_ascend_same_tables(faults8: Path) -> None:
    one, two = load(faults8, processes=1), load(faults8, processes=2)
    assert one.ranks == two.ranks == list(range(8))
    for table in TABLES:
        assert _rows(one, table) == _rows(two, table), table
    assert one.warnings == two.warnings
    # file ids stay one per file
    assert two.con.execute("SELECT count(DISTINCT file_id) = count(*) FROM profile_files").fetchall()[0][0]


@pytest.mark.slow
def test_ascend_same_findings(faults8: Path) -> None:
    one, two = _report(faults8, 1), _report(faults8, 2)
    assert _findings(one) == _findings(two)
    assert one["profile"] == two["profile"]
    assert one["warnings"] == two["warnings"]


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of workers of each pool the loads start."""
    from advisor import ingest

    started: list[int] = []
    orig = ingest._load_in_pool

    def spy(con: Any, lctx: Any, units: list[Unit], infos: Any, n_workers: int, **kwargs: Any) -> Any:
        started.append(n_workers)
        return orig(con, lctx, units, infos, n_workers, **kwargs)

    monkeypatch.setattr(ingest, "_load_in_pool", spy)
    return started


def _cluster_with_bad_rank(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    shutil.copytree(TRACES / "gloo_slow_rank", root)
    whole = gzip.decompress((root / "rank1.pt.trace.json.gz").read_bytes())
    # a second file of rank 1 (its distributedInfo says so), cut in the middle of its events
    (root / "rank2.pt.trace.json").write_bytes(whole[: len(whole) // 2])
    return root


def test_worker_warnings_come_back(tmp_path: Path, pools: list[int]) -> None:
    root = _cluster_with_bad_rank(tmp_path)
    with options(processes=None):
        one = load(root)  # no pool unless asked for
    two = load(root, processes=3)
    assert pools == [2]  # one worker per rank at most
    assert one.ranks == two.ranks == [0, 1]
    said = [(w.code, w.message, w.path) for w in two.warnings]
    assert said == [(w.code, w.message, w.path) for w in one.warnings]
    assert any(p and p.endswith("rank2.pt.trace.json") for _c, _m, p in said)


def test_worker_errors_are_input_errors(tmp_path: Path, pools: list[int]) -> None:
    root = tmp_path / "bad"
    root.mkdir()
    for r in (0, 1):  # each rank's trace cut in the middle of its events
        whole = gzip.decompress((TRACES / "gloo_slow_rank" / f"rank{r}.pt.trace.json.gz").read_bytes())
        (root / f"rank{r}.pt.trace.json").write_bytes(whole[: len(whole) // 2])
    errors = []
    for n in (1, 2):
        with pytest.raises(InputError) as exc:
            load(root, processes=n)
        errors.append(str(exc.value))
    assert pools == [2]
    assert errors[0] == errors[1]
    assert "\n" not in errors[1] and str(root) in errors[1]
