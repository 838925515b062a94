"""The maps on a process pool (``LoadOptions(workers=N)``: advisor.pipeline.schedule) give what the
maps in-process give, warnings and errors included."""

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
from advisor.ingest import InputError
from advisor.options import LoadOptions
from advisor.pipeline import plan, schedule
from advisor.pipeline.executors import share_of
from tests.ascend import gen_cluster
from tests.conftest import SAMPLES, TRACES, report_json
from tests.test_determinism import _strip

# both clusters in the marked run (the quick suite compares --workers 1 and 2 in test_cli_workers)
KINETO_CLUSTERS = [pytest.param(TRACES / "gloo_slow_rank", marks=pytest.mark.slow, id="gloo_slow_rank"),
                   pytest.param(SAMPLES / "kineto_two_ranks", marks=pytest.mark.slow, id="kineto_two_ranks")]


def _report(path: Path, processes: int) -> Any:
    """The report with one rank per shard, the shards mapped by ``processes`` processes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "SHARD_BYTES", 1)
        return _strip(report_json(analyze(path, options=LoadOptions(workers=processes))))


def test_memory_limit_shared() -> None:
    assert share_of("8GB", 2) == "4GB"
    assert share_of("1.5GiB", 3) == "0.5GiB"
    assert share_of("80%", 4) == "20%"
    assert share_of(None, 4) is None


@pytest.mark.parametrize("path", KINETO_CLUSTERS)
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


def _findings(report: Any) -> list[tuple[Any, ...]]:
    """What each finding says that does not depend on the order of rows within a table: on these
    clusters the in-process load alone gives, run after run, other ``ops`` / ``top`` lists (and so
    ids) in COM005 / COM006 and another ``group_size`` in CLU001's evidence, which take the first
    rows of a query without an ORDER BY)."""
    return sorted((f["rule"], f["cause"], f["severity"], f["title"], f["ranks"], f["steps"], f["estimated_saving_us"])
                  for f in report["findings"])


@pytest.fixture(scope="module", params=["text", "db"])
def faults8(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"pool_faults8_{request.param}")
    gen_cluster.generate("faults8", root, request.param)
    return root


@pytest.mark.slow
def test_ascend_same_findings(faults8: Path) -> None:
    one, two = _report(faults8, 1), _report(faults8, 2)
    assert _findings(one) == _findings(two)
    assert one["profile"] == two["profile"]
    assert one["warnings"] == two["warnings"]


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of processes of each pool the maps start (one rank per shard)."""
    started: list[int] = []
    orig = schedule.open_executor

    def spy(engine: Any, workers: Any, **kwargs: Any) -> Any:
        started.append(workers + 1)  # the main process maps shards too
        return orig(engine, workers, **kwargs)

    monkeypatch.setattr(schedule, "open_executor", spy)
    monkeypatch.setattr(plan, "SHARD_BYTES", 1)
    return started


def _cluster_with_bad_rank(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    shutil.copytree(TRACES / "gloo_slow_rank", root)
    whole = gzip.decompress((root / "rank1.pt.trace.json.gz").read_bytes())
    # a second file of rank 1 (its distributedInfo says so), cut in the middle of its events
    (root / "rank2.pt.trace.json").write_bytes(whole[: len(whole) // 2])
    return root


@pytest.mark.slow  # the quick suite's pool test: test_worker_errors_are_input_errors
def test_worker_warnings_come_back(tmp_path: Path, pools: list[int]) -> None:
    root = _cluster_with_bad_rank(tmp_path)
    one = analyze(root)  # no pool unless asked for
    two = analyze(root, options=LoadOptions(workers=3))
    assert pools == [2]  # one process per shard at most
    assert one.profile["ranks"] == two.profile["ranks"] == [0, 1]
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
            analyze(root, options=LoadOptions(workers=n))
        errors.append(str(exc.value))
    assert pools == [2]
    assert errors[0] == errors[1]
    assert "\n" not in errors[1] and str(root) in errors[1]
