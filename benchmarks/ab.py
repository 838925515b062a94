#!/usr/bin/env python
"""Paired A/B timing of ``advisor analyze`` between two versions of the code, on one input.

    python benchmarks/ab.py benchmarks/data/ranks_32x10MB                   # HEAD vs the work tree
    python benchmarks/ab.py INPUT --base 78f4665 --head HEAD --pairs 20
    python benchmarks/ab.py INPUT --env-b "OPENBLAS_NUM_THREADS=2"          # same code, other setting

Why pairs: this VM's speed drifts by up to +-30 % over minutes, and runs of the same code spread
by +-25 %, so two medians taken one after the other compare two machines. Here each pair runs A
and B back to back (the order alternating from pair to pair), and what is reported is the median
of the pairs' differences (B - A) in wall time and in CPU time (user + system of the process),
with a bootstrap 95 % interval of that median and how many pairs B won. Two arms running the same
code differed by up to 0.1 s wall / 0.25 CPU-s in the median of 10 pairs on 32 ranks x 10 MB: an
effect below ~5 % wants some 30 pairs.

A version other than the work tree is checked out with ``git worktree`` into a temporary folder
(removed at the end) and its sources are byte-compiled, as an installed package's are. Each run is
``python -m advisor.cli analyze INPUT --format json`` started in that version's folder (its
``advisor`` and ``rules`` come first on the path). The JSON reports of the first pair are compared
with their timings left out: the script says whether the two versions report the same.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MIN_PAIRS_FOR_INTERVAL = 8  # a bootstrap of fewer pairs says little: 3 pairs of the same code "agreed" on -0.1 s
WORKTREE = "worktree"  # --head default: the files as they are now, uncommitted changes included


def checkout(rev: str, tmp: Path, arm: str) -> Path:
    """A folder holding ``rev`` for ``arm`` (the work tree itself for :data:`WORKTREE`), byte-compiled."""
    if rev == WORKTREE:
        where = ROOT
    else:
        where = tmp / arm  # one per arm: both may name the same revision
        res = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), rev],
                             capture_output=True, text=True, check=False)
        if res.returncode:
            raise SystemExit(f"ab.py: cannot check out {rev!r}: {res.stderr.strip()[-300:]}")
    for d in ("advisor", "rules"):
        compileall.compile_dir(str(where / d), quiet=1)
    return where


def run_once(where: Path, target: str, out: Path, env: dict[str, str], extra: list[str]) -> dict[str, float]:
    """One ``advisor analyze`` run: wall seconds, CPU seconds (user + system), peak RSS (MB)."""
    cmd = [sys.executable, "-m", "advisor.cli", "analyze", target, "--format", "json", "--out", str(out), *extra]
    with tempfile.TemporaryFile() as err_file:  # not a pipe: a full pipe would block the run
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=err_file)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        err_file.seek(0)
        err = err_file.read().decode(errors="replace")
    if proc.returncode not in (0, 1):  # 1: a gate; the report is still written
        raise SystemExit(f"advisor failed in {where}: {err.strip()[-800:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024}


def without_timings(report: dict[str, Any]) -> dict[str, Any]:
    """The report less what differs from run to run: the seconds taken."""
    rep = json.loads(json.dumps(report))
    for key in ("parse_seconds", "analyze_seconds"):
        rep.get("profile", {}).pop(key, None)
    for rule in rep.get("rules", []):
        rule.pop("seconds", None)
    return rep


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two JSON values first differ (a JSON-path-like string), None when equal."""
    if type(a) is not type(b):
        return path or "$"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}[] (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else (path or "$")


def median_interval(diffs: list[float], rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Bootstrap 95 % interval of the median of ``diffs``."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds) - 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="trace file or directory to analyse")
    ap.add_argument("--base", default="HEAD", help="version A: a git revision, or 'worktree' (default HEAD)")
    ap.add_argument("--head", default=WORKTREE, help="version B: a git revision, or 'worktree' (the default)")
    ap.add_argument("--pairs", type=int, default=12, help="pairs of runs (default 12)")
    ap.add_argument("--env-a", default="", help="environment settings for A, e.g. 'K=V K2=V2'")
    ap.add_argument("--env-b", default="", help="environment settings for B")
    ap.add_argument("--advisor-args", default="", help="extra arguments for advisor analyze (both arms)")
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    target = str(Path(args.input).resolve())
    if not Path(target).exists():
        ap.error(f"{args.input}: no such file or directory")
    extra = shlex.split(args.advisor_args)

    def env_of(spec: str) -> dict[str, str]:
        env = dict(os.environ)
        for item in shlex.split(spec):
            key, sep, value = item.partition("=")
            if not sep:
                ap.error(f"not KEY=VALUE: {item!r}")
            env[key] = value
        return env

    tmp = Path(tempfile.mkdtemp(prefix="advisor_ab_"))
    made: list[Path] = []
    try:
        arms = {}
        for name, rev, spec in (("A", args.base, args.env_a), ("B", args.head, args.env_b)):
            where = checkout(rev, tmp, name)
            if where != ROOT:
                made.append(where)
            arms[name] = (where, env_of(spec), rev)
        runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
        reports: dict[str, Any] = {}
        for i in range(args.pairs):
            for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
                where, env, _rev = arms[name]
                out = tmp / f"report_{name}.json"
                r = run_once(where, target, out, env, extra)
                runs[name].append(r)
                if name not in reports:
                    reports[name] = without_timings(json.loads(out.read_text()))
            a, b = runs["A"][-1], runs["B"][-1]
            print(f"pair {i + 1:>2}: A {a['wall']:.3f} s {a['cpu']:.2f} CPU-s   B {b['wall']:.3f} s {b['cpu']:.2f} CPU-s",
                  file=sys.stderr, flush=True)
    finally:
        for where in made:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"A = {arms['A'][2]} {args.env_a}".rstrip() + f";  B = {arms['B'][2]} {args.env_b}".rstrip()
          + f";  {args.pairs} pairs on {args.input}")
    for name in ("A", "B"):
        rs = runs[name]
        print(f"  {name}: wall median {statistics.median(r['wall'] for r in rs):.3f} s, "
              f"CPU median {statistics.median(r['cpu'] for r in rs):.2f} s, peak RSS max {max(r['rss'] for r in rs):,.0f} MB")
    for key, unit in (("wall", "s"), ("cpu", "CPU-s")):
        diffs = [b[key] - a[key] for a, b in zip(runs["A"], runs["B"], strict=True)]
        wins = sum(d < 0 for d in diffs)
        if len(diffs) >= MIN_PAIRS_FOR_INTERVAL:
            lo, hi = median_interval(diffs)
            interval = f"95 % interval {lo:+.3f} .. {hi:+.3f}"
        else:
            interval = f"no interval under {MIN_PAIRS_FOR_INTERVAL} pairs"
        print(f"  B - A {key}: median {statistics.median(diffs):+.3f} {unit} ({interval}); "
              f"B faster in {wins} of {len(diffs)} pairs")
    where = first_difference(reports["A"], reports["B"])
    print("  reports: identical (timings aside)" if where is None else f"  reports differ, first at {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
