"""Shared helpers for the renderer, gate and browser tests: sample discovery, crafted traces, CLI runs."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli_run import analyze_cli
from tests.conftest import ROOT, TRACES
from tests.conftest import sample_dirs as _samples

#: Operator names that try to break out of HTML, jinja, attributes, Markdown tables and lines.
EVIL_NAMES = (
    "<script>alert(1)</script>",
    "{{ 7*7 }}",
    '" onmouseover="x',
    "line1\nline2 | `tick` *b* [l](http://evil.example/x.png)",
)


def sample_dirs() -> list[Path]:
    """Every sample profile directory: sample_profiles/* (less copies of tests/data/kineto) and tests/data/kineto/*."""
    out: list[Path] = _samples()
    out += sorted(p for p in TRACES.iterdir() if p.is_dir() and any(p.glob("*.json*")))
    return out


def write_evil_trace(directory: Path) -> Path:
    """A small Kineto trace whose operators carry :data:`EVIL_NAMES` (on the critical path) and a slow dataloader."""
    directory.mkdir(parents=True, exist_ok=True)
    ev: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    t = 1000.0
    for step in range(1, 6):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t,
                   "dur": 4000.0, "args": {}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                   "pid": 1, "tid": 1, "ts": t + 5, "dur": 2500.0, "args": {}})
        x = t + 2600
        for i, name in enumerate(EVIL_NAMES):
            ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": x, "dur": 300.0 + 10 * i,
                       "args": {"External id": step * 10 + i}})
            x += 340
        t += 4100
    path = directory / "evil.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev, "deviceProperties": []}))
    return path


def write_cluster(directory: Path, ranks: int = 64, slow: int = 37) -> Path:
    """A ``ranks``-rank profile: copies of gloo_slow_rank's fast rank 0, with its straggler rank 1 as rank ``slow``."""
    directory.mkdir(parents=True, exist_ok=True)
    fast = json.loads(gzip.decompress((TRACES / "gloo_slow_rank" / "rank0.pt.trace.json.gz").read_bytes()))
    straggler = json.loads(gzip.decompress((TRACES / "gloo_slow_rank" / "rank1.pt.trace.json.gz").read_bytes()))
    for i in range(ranks):
        data = straggler if i == slow else fast
        data["distributedInfo"]["rank"] = i
        data["distributedInfo"]["world_size"] = ranks
        data["distributedInfo"]["pg_config"][0]["pg_size"] = ranks
        data["distributedInfo"]["pg_config"][0]["ranks"] = list(range(ranks))
        with gzip.open(directory / f"rank{i}.pt.trace.json.gz", "wt") as fh:
            json.dump(data, fh)
    return directory


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``advisor analyze ARGS`` in this process (:func:`tests.cli_run.cli`); ``run_cli_process`` runs
    ``python -m advisor.cli`` as CI calls it."""
    return analyze_cli(*args, cwd=cwd)


def run_cli_process(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m advisor.cli analyze ARGS`` as a subprocess (the way CI calls it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "advisor.cli", "analyze", *map(str, args)], check=False, cwd=cwd or ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
