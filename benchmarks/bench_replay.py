#!/usr/bin/env python
"""The what-if replay's share of an analysis: CPU time in the replay against the whole run's.

    python benchmarks/bench_replay.py                          # 128 ranks x 9.6 MB, dense, gzipped
    python benchmarks/bench_replay.py --cases 32x2MB,128x9.6MB --form json
    python benchmarks/bench_replay.py --cases "" --ascend 64   # a generated torch_npu cluster

The inputs are ``bench_scale.py``'s (built once, cached under ``benchmarks/data/``). Each case is
analysed in this process (``--workers 1``: the maps run here, so every replay is timed), with a timer
around each entry into the replay: the rules' what-if replays (``RuleContext.what_if`` and
``replay_steps``, graphs built on the way), the straggler replays across ranks, and the "fix these"
combinations. The figure is CPU time (``time.thread_time`` of the thread that replays, against the
process's ``time.process_time``, DuckDB's own threads included), so the rules running side by side
in threads do not count twice. Issue #30's goal: the replay at most 20 % of the analysis.
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_scale import _parse_case, build_ascend, build_kineto, log

#: the replay's entry points: (module, owner attribute or None for a function, name)
ENTRIES = (
    ("advisor.engine.rule", "RuleContext", "what_if"),
    ("advisor.engine.rule", "RuleContext", "replay_steps"),
    ("advisor.engine.rule", "RuleContext", "straggler_replay"),
    ("advisor.engine.rule", "RuleContext", "joined_straggler_replay"),
    ("advisor.engine.combined", None, "replay_combinations"),
    ("advisor.engine.combined", None, "of_done"),
)


class Timers:
    """CPU seconds spent inside the entry points, the outermost entry of each thread only."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._depth = threading.local()

    def wrap(self, name: str, func: Any) -> Any:
        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            t = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                self._depth.n = depth
                if depth == 0:
                    with self._lock:
                        self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - t
                        self.calls[name] = self.calls.get(name, 0) + 1
        return timed

    def install(self) -> None:
        import importlib

        for mod_name, owner, name in ENTRIES:
            mod = importlib.import_module(mod_name)
            target = getattr(mod, owner) if owner else mod
            setattr(target, name, self.wrap(name, getattr(target, name)))


def measure(path: Path, timers: Timers) -> dict[str, Any]:
    from advisor.analyze import analyze
    from advisor.options import LoadOptions

    timers.cpu.clear()
    timers.calls.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    report = analyze(path, options=LoadOptions(workers=1))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    replayed = sum(1 for f in report.findings if (f.replay or {}).get("estimated"))
    return {"wall": wall, "cpu": cpu, "replay": sum(timers.cpu.values()), "parts": dict(timers.cpu),
            "calls": dict(timers.calls), "findings": len(report.findings), "replayed": replayed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="128x9.6MB", help="Kineto clusters RANKSxSIZE, comma-separated ('' for none)")
    ap.add_argument("--kind", default="dense", choices=("dense", "sparse"))
    ap.add_argument("--form", default="gz", choices=("gz", "json"))
    ap.add_argument("--ascend", default="", help="generated torch_npu clusters: rank counts, comma-separated")
    args = ap.parse_args(argv)
    targets: list[tuple[str, Path]] = []
    for text in filter(None, (c.strip() for c in args.cases.split(","))):
        ranks, size = _parse_case(text)
        info = build_kineto(ranks, size, args.kind)
        targets.append((f"kineto {args.kind} {args.form} {ranks}x{size / 1e6:.1f}MB", Path(info["dir"]) / args.form))
    for text in filter(None, (c.strip() for c in args.ascend.split(","))):
        info = build_ascend(int(text), "text")
        targets.append((f"ascend text {text} ranks", Path(info["dir"]) / "cluster"))
    timers = Timers()
    timers.install()
    print(f"{'case':<32} {'wall s':>7} {'CPU s':>7} {'replay CPU s':>13} {'share':>6}  findings (replayed)")
    for label, path in targets:
        log(f"analysing {label} ...")
        r = measure(path, timers)
        print(f"{label:<32} {r['wall']:7.1f} {r['cpu']:7.1f} {r['replay']:13.2f} {r['replay'] / r['cpu']:6.1%}  "
              f"{r['findings']} ({r['replayed']})")
        for name, s in sorted(r["parts"].items(), key=lambda x: -x[1]):
            print(f"    {name:<30} {s:7.2f} CPU-s in {r['calls'][name]} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
