"""benchmarks/bench_scale.py: its case syntax and its floors (one process reading each rank's
files one after another) read every record of the files (the timing itself is a benchmark)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "benchmarks" / "bench_scale.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return mod


def test_cases(bench: Any) -> None:
    assert bench._parse_case("128x9.6MB") == (128, int(9.6 * (1 << 20)))
    assert bench._parse_case(" 1024 X 2MB ") == (1024, 2 << 20)
    with pytest.raises(Exception, match="not a case"):
        bench._parse_case("128")


def _floor(bench: Any, script: str, items: list[str]) -> int:
    code = "import sys; sys.argv[1:] = open(sys.argv.pop(1)).read().split(chr(10)); " + f"exec({script!r})"
    listing = Path(items[0]).parent / "list.txt"
    listing.write_text("\n".join(items))
    res = subprocess.run([sys.executable, "-c", code, str(listing)], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return int(res.stdout.strip())


def test_kineto_floor_reads_every_event(bench: Any, tmp_path: Path) -> None:
    src = ROOT / "sample_profiles" / "kineto_two_ranks"
    files = [tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json"]
    shutil.copy(src / "rank-0.json.gz", files[0])
    files[1].write_bytes(gzip.decompress((src / "rank-1.json.gz").read_bytes()))
    expected = sum(len(json.loads(gzip.decompress((src / f"rank-{r}.json.gz").read_bytes()))["traceEvents"])
                   for r in (0, 1))
    assert _floor(bench, bench.KINETO_FLOOR, [str(f) for f in files]) == expected


def test_ascend_floor_reads_every_row(bench: Any, tmp_path: Path) -> None:
    import csv
    import sqlite3

    from tests.ascend import gen_cluster

    expected = 0
    dirs = []
    for form in ("text", "db"):
        gen_cluster.generate("faults8", tmp_path / form, form)
        rank_dirs = sorted(p for p in (tmp_path / form).iterdir() if p.is_dir())[:2]
        dirs += [str(d) for d in rank_dirs]
        for f in (f for d in rank_dirs for f in d.rglob("*") if f.is_file()):
            if f.suffix == ".csv":
                with f.open(newline="") as fh:
                    expected += sum(1 for _ in csv.reader(fh)) - 1
            elif f.suffix == ".json":
                doc = json.loads(f.read_text())
                expected += len(doc) if isinstance(doc, list) else 1
            elif f.suffix == ".db":
                con = sqlite3.connect(f)
                for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                    expected += con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
                con.close()
    assert _floor(bench, bench.ASCEND_FLOOR, dirs) == expected
