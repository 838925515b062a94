"""Cluster ingest benchmark: generated 64-rank torch_npu exports, text and .db form.

Run from the repository root::

    python benchmarks/bench_cluster.py [--ranks 64] [--steps 5] [--keep DIR]

For each form it generates an export (a few MB per rank, the real layout, see
``tests/ascend/gen_cluster.py``), then times ``advisor.engine.context.load_profile`` in a fresh
subprocess and prints ingest seconds, MB/s and the subprocess's peak RSS. It repeats the load
on the first quarter and half of the ranks to show how memory grows with the number of ranks:
the growth per rank should be about the size of that rank's canonical tables, not of its files.
Generated data lives in a temporary directory that is removed afterwards (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a child's own peak RSS: its VmHWM. ``ru_maxrss`` is not: Linux keeps the parent's high-water
# mark across the vfork + exec with which subprocess starts a child
PEAK = """
def peak_rss_mb():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
{PEAK}
from advisor.engine.context import load_profile
t0 = time.perf_counter()
ctx = load_profile(sys.argv[1])
dt = time.perf_counter() - t0
con = ctx.con
rows = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("events", "kernels", "comm_ops", "comm_tasks", "comm_matrix", "comm_bandwidth", "steps")}
mem = con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchone()[0]
tables_bytes = con.execute(
    "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'").fetchone()[0]
print(json.dumps({"seconds": dt, "ranks": len(ctx.ranks), "rows": rows, "warnings": len(ctx.warnings),
                  "peak_rss_mb": peak_rss_mb(),
                  "duckdb_mb": mem / 2**20, "tables_mb": tables_bytes / 2**20}))
"""

BASELINE = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
{PEAK}
import duckdb, pandas, pyarrow  # noqa: F401
import advisor.ingest, advisor.ingest.ascend  # noqa: F401
print(json.dumps({"peak_rss_mb": peak_rss_mb()}))
"""
CHILD = CHILD.replace("{PEAK}", PEAK)
BASELINE = BASELINE.replace("{PEAK}", PEAK)


def _run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _subset(src: Path, dst: Path, n: int) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for d in sorted(src.iterdir(), key=lambda p: int(next(p.glob("profiler_info_*.json")).stem.rsplit("_", 1)[1]))[:n]:
        # hard links: regular files to the reader (it does not follow symlinks out of the profile root)
        shutil.copytree(d, dst / d.name, copy_function=os.link)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--keep", type=Path, default=None, help="write the exports here and keep them")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.ascend.gen_cluster import Scenario, generate

    scn = Scenario(
        name=f"bench{args.ranks}",
        world=args.ranks,
        ranks_per_node=8,
        tp=2,
        steps=args.steps,
        layers=8,
        fwd_kernels=8,
        buckets=8,
        bwd_kernels=10,
        opt_kernels=6,
        slow_rank=min(5, args.ranks - 1),
        slow_step=args.steps // 2 + 1,
        misaligned_buckets=(1,),
        small_packets=True,
        aicpu=True,
        low_block_dim=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="advisor_bench_")) if args.keep is None else args.keep
    try:
        base = _run(BASELINE, str(ROOT))
        print(f"python + duckdb + advisor imported: peak RSS {base['peak_rss_mb']:.0f} MB")
        print(
            f"{'form':<5} {'ranks':>5} {'files MB':>9} {'MB/rank':>8} {'gen s':>6} {'ingest s':>9} {'MB/s':>7} "
            f"{'peak RSS MB':>12} {'RSS-base/rank':>14} {'tables MB':>10}"
        )
        for form in ("text", "db"):
            t0 = time.perf_counter()
            root = tmp / form
            generate(scn, root, form)
            gen_s = time.perf_counter() - t0
            sizes = []
            for n in sorted({max(1, args.ranks // 4), max(1, args.ranks // 2), args.ranks}):
                target = root if n == args.ranks else _subset(root, tmp / f"{form}_{n}", n)
                mb = _size(root) / 2**20 * n / args.ranks
                res = _run(CHILD, str(target), str(ROOT))
                assert res["ranks"] == n, res
                per_rank = (res["peak_rss_mb"] - base["peak_rss_mb"]) / n
                sizes.append((n, res))
                print(
                    f"{form:<5} {n:>5} {mb:>9.1f} {mb / n:>8.2f} {gen_s if n == args.ranks else 0:>6.1f} {res['seconds']:>9.2f} "
                    f"{mb / res['seconds']:>7.1f} {res['peak_rss_mb']:>12.0f} {per_rank:>14.2f} {res['tables_mb']:>10.1f}"
                )
            (n1, r1), (n2, r2) = sizes[0], sizes[-1]
            if n2 > n1:
                growth = (r2["peak_rss_mb"] - r1["peak_rss_mb"]) / (n2 - n1)
                tables = (r2["tables_mb"] - r1["tables_mb"]) / (n2 - n1)
                print(
                    f"      {form}: peak RSS grows {growth:.2f} MB per extra rank; canonical tables grow {tables:.2f} MB per rank "
                    f"(rows at {n2} ranks: {r2['rows']})"
                )
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
