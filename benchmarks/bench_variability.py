#!/usr/bin/env python
"""Cost of the variability analyses next to the load, on generated Kineto clusters.

    python benchmarks/bench_variability.py --ranks 256 1024 --steps 20

The clusters come from ``tests/test_variability_cluster.py`` (one trace per rank: a GEMM, an
elementwise kernel and an AllReduce per step). For each size: the load and the inter-operator
stages (``build_context``), then the ``op_step_stats`` table and the variability model timed
apart, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    from advisor import variability
    from advisor.analyze import build_context
    from tests.test_variability_cluster import draw, write_cluster

    for n in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            prof = write_cluster(Path(tmp) / f"c{n}", draw(n, args.steps, 1))
            t0 = time.perf_counter()
            ctx = build_context(prof)
            t1 = time.perf_counter()
            ctx.ensure_derived(["op_step_stats"])
            t2 = time.perf_counter()
            v = variability.compute(ctx.breakdown, ctx.df)
            t3 = time.perf_counter()
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            assert v is not None and v["ranks"] == n
            print(f"{n} ranks x {args.steps} steps: load + stages {t1 - t0:.2f} s, op_step_stats {t2 - t1:.3f} s, "
                  f"variability {t3 - t2:.3f} s ({(t3 - t1) / (t1 - t0):.1%} of the load), peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
