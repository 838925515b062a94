"""The three engines of the per-rank map give the same report: in-process, the local process pool
(2 workers) and a Dask cluster of 2 worker processes on loopback (advisor.pipeline.executors).

The Dask tests carry the ``dask`` marker (left out of the quick suite) and skip, with the reason,
when Dask is not installed, unless ``ADVISOR_REQUIRE_DASK=1`` (set by .ci/run, which installs the
``dask`` extra). The checks of ``--engine`` itself need no Dask.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from advisor.analyze import analyze
from advisor.cli import main
from advisor.options import LoadOptions
from advisor.pipeline.executors import EngineError, check_engine, is_remote, open_executor, scheduler_address
from tests.conftest import SAMPLES, report_json
from tests.test_determinism import _strip

ROOT = Path(__file__).resolve().parents[1]
KINETO_RANKS = 4


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        if os.environ.get("ADVISOR_REQUIRE_DASK") == "1":
            raise
        pytest.skip(f"Dask is not installed (pip install -e '.[dask]'): {exc}")
    return distributed


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[Any]:
    """A Dask cluster of 2 worker processes (one thread each) on loopback, for this module."""
    distributed = _distributed()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40) as cluster:
        yield cluster


def _ran_on(cluster: Any) -> int:
    """How many rank-reading tasks the cluster's workers have finished so far (the scheduler
    counts each task once in each state it entered)."""
    prefix = cluster.scheduler.task_prefixes.get("run_in_dir")  # load_rank, in the caller's directory
    return 0 if prefix is None else int(prefix.state_counts.get("memory", 0))


def _report(path: Path, **opts: Any) -> Any:
    return _strip(report_json(analyze(path, options=LoadOptions(**opts))))


@pytest.fixture(scope="module")
def kineto_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 ranks of 3 profiler steps each, cut from the two real ranks of sample_profiles/kineto_two_ranks
    by the benchmark's generator (rank r copies sample rank r % 2; distributedInfo names r of 4)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_kineto import Generator
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    root = tmp_path_factory.mktemp("engines_kineto")
    gens = [Generator(SAMPLES / "kineto_two_ranks" / f"rank-{r}.json.gz") for r in (0, 1)]
    for r in range(KINETO_RANKS):
        gens[r % 2].write(root / f"rank-{r}.pt.trace.json", 0, rank=r, world=KINETO_RANKS)
    return root


@pytest.fixture(scope="module", params=["text", "db"])
def ascend_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.ascend import gen_cluster

    root = tmp_path_factory.mktemp(f"engines_ascend_{request.param}")
    gen_cluster.generate("faults8", root, request.param)
    return root


def _same_three_ways(path: Path, cluster: Any, ranks: int) -> None:
    from advisor.pipeline import plan

    before = _ran_on(cluster)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "SHARD_BYTES", 1)  # one rank per shard: a map task per rank
        in_process = _report(path, workers=1)
        pool = _report(path, workers=2)
        dask = _report(path, engine=cluster.scheduler_address)
    assert _ran_on(cluster) - before == ranks  # one task per rank, run by the Dask workers
    assert in_process == pool
    assert in_process == dask


@pytest.mark.dask
def test_kineto_cluster_same_report(kineto_cluster: Path, dask_cluster: Any) -> None:
    _same_three_ways(kineto_cluster, dask_cluster, KINETO_RANKS)


@pytest.mark.dask
def test_ascend_cluster_same_report(ascend_cluster: Path, dask_cluster: Any) -> None:
    _same_three_ways(ascend_cluster, dask_cluster, 8)


@pytest.mark.dask
def test_cli_engine(tmp_path: Path, dask_cluster: Any) -> None:
    """``advisor analyze --engine tcp://...`` (and ``dask://``, its other spelling) writes the report
    the in-process run writes."""
    runner = CliRunner()
    path = SAMPLES / "kineto_two_ranks"
    address = dask_cluster.scheduler_address
    outs = []
    for args in ([], ["--engine", address], ["--engine", address.replace("tcp://", "dask://")],
                 ["--engine", "local"]):
        out = tmp_path / f"r{len(outs)}.json"
        res = runner.invoke(main, ["analyze", str(path), *args, "--out", str(out)])
        assert res.exit_code in (0, 1), res.output
        outs.append(_strip(json.loads(out.read_text())))
    assert all(o == outs[0] for o in outs[1:])


def test_engine_addresses() -> None:
    assert scheduler_address("tcp://10.0.0.1:8786") == "tcp://10.0.0.1:8786"
    assert scheduler_address("dask://node-3:8786") == "tcp://node-3:8786"
    assert scheduler_address("tls://[::1]:8786") == "tls://[::1]:8786"
    for bad in ("http://x:1", "10.0.0.1:8786", "tcp://", "tcp://a b:1", ""):
        with pytest.raises(EngineError, match="not an engine address"):
            scheduler_address(bad)
    assert check_engine(None) is None and check_engine("local") == "local"
    assert not is_remote(None) and not is_remote("local") and is_remote("tcp://h:1")


def test_local_executor() -> None:
    with open_executor(None, None) as none, open_executor("local", 1) as one:
        assert none is None and one is None  # in-process
    with open_executor("local", 2) as pool:
        assert pool is not None
        assert pool.submit(abs, -3).result() == 3


def test_cli_engine_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    path = str(SAMPLES / "kineto_two_ranks")
    res = runner.invoke(main, ["analyze", path, "--engine", "10.0.0.1:8786"])
    assert res.exit_code == 2 and "--engine 10.0.0.1:8786: not an engine address" in res.output
    assert "Traceback" not in res.output
    monkeypatch.setitem(sys.modules, "distributed", None)  # as when the dask extra is not installed
    res = runner.invoke(main, ["analyze", path, "--engine", "tcp://127.0.0.1:8786"])
    assert res.exit_code == 2 and "Dask is not installed; pip install 'advisor[dask]'" in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.dask
def test_cli_engine_unreachable_and_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    _distributed()
    monkeypatch.setattr("advisor.pipeline.executors.CONNECT_TIMEOUT_S", 1.0)
    runner = CliRunner()
    path = str(SAMPLES / "kineto_two_ranks")
    res = runner.invoke(main, ["analyze", path, "--engine", "tcp://127.0.0.1:9"])  # the discard port: nobody
    assert res.exit_code == 2, res.output
    assert "--engine tcp://127.0.0.1:9: cannot reach the Dask scheduler" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(main, ["analyze", path, "--engine", "tcp://127.0.0.1:9", "--workers", "2"])
    assert res.exit_code == 2 and "--workers 2: sizes the local process pool" in res.output


def test_engine_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine local`` is the process pool, one worker per core unless ``--workers`` says."""
    from advisor.options import AnalyzeOptions

    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert AnalyzeOptions.build(tmp_path / "p", engine="local").load.workers == 6
    assert AnalyzeOptions.build(tmp_path / "p", engine="local", workers=3).load.workers == 3
    assert AnalyzeOptions.build(tmp_path / "p").load.workers is None


@pytest.mark.dask
def test_dask_tasks_run_in_the_callers_directory(tmp_path: Path, dask_cluster: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A Dask worker runs wherever it was started: a profile given by a relative path is read
    relative to the directory ``advisor`` runs in, as on the other engines."""
    monkeypatch.chdir(SAMPLES)
    with open_executor(dask_cluster.scheduler_address, None) as ex:
        assert ex is not None
        assert ex.submit(os.getcwd).result() == str(SAMPLES)
    runner = CliRunner()
    outs = []
    for args in ([], ["--engine", dask_cluster.scheduler_address]):
        out = tmp_path / f"r{len(outs)}.json"
        res = runner.invoke(main, ["analyze", "kineto_two_ranks", *args, "--out", str(out)])
        assert res.exit_code in (0, 1), res.output
        outs.append(_strip(json.loads(out.read_text())))
    assert outs[0] == outs[1]


def test_unguarded_script_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that ends before its first task because spawn re-ran a script without a ``__main__``
    guard is reported as that, not as a worker out of memory."""
    import types

    from advisor.pipeline.executors import lost_worker, unguarded_main

    script = tmp_path / "job.py"
    main_module = types.ModuleType("__main__")
    main_module.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main_module)
    script.write_text("from advisor.analyze import analyze\nanalyze('x')\n")
    assert unguarded_main() == str(script)
    msg = str(lost_worker("ranks 0-3"))
    assert "job.py has no 'if __name__ == \"__main__\":' guard" in msg and "\n" not in msg
    script.write_text("from advisor.analyze import analyze\nif __name__ == '__main__':\n    analyze('x')\n")
    assert unguarded_main() is None
    assert str(lost_worker("ranks 0-3")) == "ranks 0-3 ended abruptly (out of memory? --workers 1 reads in-process)"
    del main_module.__file__  # an interactive session: nothing to run again
    assert unguarded_main() is None


@pytest.mark.slow
def test_unguarded_script_fails_in_one_line(tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "job.py"
    script.write_text("from advisor.analyze import analyze\nfrom advisor.options import LoadOptions\n"
                      "from advisor.pipeline import plan\nplan.SHARD_BYTES = 1\n"
                      f"analyze({str(SAMPLES / 'kineto_two_ranks')!r}, options=LoadOptions(workers=2))\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert "job.py has no 'if __name__ == \"__main__\":' guard" in last, res.stderr[-2000:]


def test_dask_memory_limit_is_shared_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Dask engine each map gets ``--memory-limit`` divided by the tasks the cluster runs at once."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import contextmanager

    from advisor.config import Config
    from advisor.ingest.base import Unit
    from advisor.pipeline import map as pmap
    from advisor.pipeline import schedule
    from advisor.pipeline.executors import InDirExecutor, _slots

    class Client:
        def nthreads(self) -> dict[str, int]:
            return {"tcp://a:1": 2, "tcp://b:1": 2}

    assert _slots(Client()) == 4
    assert _slots(object()) == 1  # a client that cannot say
    limits: list[str | None] = []

    def fake(root: str, units: list[Unit], cfg: Config, **kw: Any) -> pmap.ShardResult:
        limits.append(kw["memory_limit"])
        return pmap.ShardResult(ranks=[u.rank for u in units], load_warnings=[])

    @contextmanager
    def executor(engine: Any, workers: Any, pool_from: int = 2) -> Any:
        with ThreadPoolExecutor(2) as ex:
            yield InDirExecutor(ex, os.getcwd(), slots=_slots(Client()))

    monkeypatch.setattr(schedule, "map_shard", fake)
    monkeypatch.setattr("advisor.pipeline.schedule.open_executor", executor)
    shards = [[Unit("kineto", [Path(f"r{r}.json")], Path("."), rank=r)] for r in range(3)]
    out = list(schedule.run_maps(".", shards, Config(), workers=2, engine="tcp://h:1", rank=None, step=None,
                           memory_limit="8GB", max_events=None, debug=False))
    assert [r.ranks for r in out] == [[0], [1], [2]]
    assert limits == ["2GB"] * 3


@pytest.mark.dask
def test_cli_engine_scheduler_without_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler that has no worker: a bounded wait (WORKER_WAIT_S), then one line and exit 2, not a hang."""
    distributed = _distributed()
    import time

    monkeypatch.setattr("advisor.pipeline.executors.WORKER_WAIT_S", 2.0)
    with distributed.LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None,
                                  silence_logs=40) as cluster:
        started = time.monotonic()
        res = CliRunner().invoke(main, ["analyze", str(SAMPLES / "kineto_two_ranks"), "--engine",
                                        cluster.scheduler_address])
        took = time.monotonic() - started
    assert res.exit_code == 2, res.output
    assert f"the Dask scheduler at {cluster.scheduler_address} has no workers (waited 2 s)" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert took < 30


@pytest.mark.dask
def test_tls_engine_takes_its_files_from_dasks_config(tmp_path: Path) -> None:
    """``tls://``: the client's Security comes from Dask's configuration, encryption required; a
    missing CA setting or file is one line naming what to set."""
    _distributed()
    import dask

    from advisor.pipeline.executors import EngineError, tls_security

    assert tls_security("tcp://h:1", "tcp://h:1") is None
    with dask.config.set({"distributed.comm.tls.ca-file": None}), pytest.raises(EngineError) as err:
        tls_security("tls://h:1", "tls://h:1")
    assert "DASK_DISTRIBUTED__COMM__TLS__CA_FILE" in str(err.value)
    missing = tmp_path / "nope.pem"
    with dask.config.set({"distributed.comm.tls.ca-file": str(missing)}), pytest.raises(EngineError) as err:
        tls_security("tls://h:1", "tls://h:1")
    assert f"distributed.comm.tls.ca-file {missing}: no such file" in str(err.value)
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    for f in (ca, cert, key):
        f.write_text("-")
    with dask.config.set({"distributed.comm.tls.ca-file": str(ca), "distributed.comm.tls.client.cert": str(cert),
                          "distributed.comm.tls.client.key": str(key)}):
        sec = tls_security("tls://h:1", "tls://h:1")
    assert (sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key) == (str(ca), str(cert), str(key))
    assert sec.require_encryption is True
