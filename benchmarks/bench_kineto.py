#!/usr/bin/env python
"""Benchmark ``advisor analyze`` on large Kineto inputs against HTA and a bare DuckDB read_json.

    python benchmarks/bench_kineto.py                       # 500MB, 2GB, 32 ranks x 10MB
    python benchmarks/bench_kineto.py --sizes 500MB --ranks 32 --skip-hta
    python benchmarks/bench_kineto.py --sizes 500MB --ranks 0          # no multi-rank case

Inputs are built deterministically from a real sample (``sample_profiles/kineto_two_ranks``,
current Kineto schema): one profiler step window of a rank is repeated with timestamps shifted
by the step length, fresh correlation / external ids (and flow ids) per copy and renumbered
``ProfilerStep#N`` markers. Files are written as a stream of pre-rendered event templates (no
big Python list), uncompressed, and cached under ``benchmarks/data/`` (gitignored).

advisor's sources are byte-compiled first (as an installed package is), then for each input,
each tool runs as a subprocess, one after the other (never concurrently):

* advisor: ``python -m advisor.cli analyze INPUT --format json --out ...`` (the whole job);
* HTA:     ``TraceAnalysis(trace_dir=...)`` + ``get_temporal_breakdown()`` (load + breakdown),
           with a timeout (default 15 min) after which it is reported as "did not finish"; it runs
           in HTA's own virtual environment (HTA 0.5.0 needs pandas 2.x): ``--hta-python``, by
           default the one the HTA tests use (``tests/hta_env.py``, built on first use);
* duckdb:  a bare ``read_json`` of the same bytes with advisor's column types, unnested into
           a table (the floor for any DuckDB-based reader).

This VM's run-to-run spread is +-0.3 s, as large as a whole second of the 32-rank case: inputs
under 1 GiB run advisor and the bare DuckDB load ``--repeat`` times each (default 3), alternating,
and the table gives the median wall time (every run is logged) and the highest peak RSS. HTA
runs ``--hta-repeat`` times (default once), each run right after an advisor run; with several,
HTA/adv is the median of those pairs' ratios: the machine's speed drifts over minutes, and a
pair run back to back sees the same drift. Bigger inputs run every tool once.

Wall time is measured around the subprocess. Peak RSS is the larger of the main process's own
high-water mark (``VmHWM``, exact however short the peak) and the highest summed RSS of the
process tree (polled every 0.1 s with psutil; HTA forks parser processes for several ranks).
``os.wait4``'s ``ru_maxrss`` is not used while either can be read: Linux carries the parent's
high-water mark across the vfork + exec that starts the child, so it may be this script's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data"
SAMPLE_DIR = ROOT / "sample_profiles" / "kineto_two_ranks"
# --rank-sample cpu: many small ranks from a small CPU-only trace bundled with the project
CPU_SAMPLE = ROOT / "sample_profiles" / "kineto_cpu_healthy" / "cpu_healthy.pt.trace.json.gz"
GEN_VERSION = 1  # bump when the generator changes (invalidates the cache)

TARGETS = {
    "hta_speedup": 10.0,  # advisor at least 10x faster than HTA (500 MB, 32 ranks)
    "duckdb_ratio": 2.0,  # advisor within 2x of a bare DuckDB read_json
    "seconds_2gb": 60.0,  # 2 GB single rank under 60 s
    "rss_ratio": 2.0,  # peak RSS under 2x the uncompressed input
}


# ----------------------------------------------------------------------------- generation
def _parse_size(text: str) -> int:
    """'500MB', '2GB', '10KB' or a number of bytes; argparse.ArgumentTypeError otherwise."""
    t = text.strip().upper()
    try:
        for suffix, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10), ("B", 1)):
            if t.endswith(suffix):
                return int(float(t[: -len(suffix)]) * mult)
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500MB, 2GB; '' for none)") from None


def _label(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.0f}GB"
    return f"{n / (1 << 20):.0f}MB" if n >= 1 << 20 else f"{n / (1 << 10):.0f}KB"


def _compile_event(e: dict, t0: int, step0: int) -> tuple[str, float, tuple[int, ...], tuple[int, ...]]:
    """Render one event as a str.format template: {t} = ts, {iN} = id N shifted, {sN} = step."""
    import re

    e = json.loads(json.dumps(e))
    ts_rel = float(e["ts"]) - t0
    e["ts"] = "\x00TS\x00"
    args = e.get("args")
    ids: list[int] = []
    if isinstance(args, dict):
        for key in ("correlation", "External id"):
            v = args.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
                args[key] = f"\x00I{int(v)}\x00"
                ids.append(int(v))
    if isinstance(e.get("id"), (int, float)) and not isinstance(e.get("id"), bool):
        ids.append(int(e["id"]))
        e["id"] = f"\x00I{int(e['id'])}\x00"
    steps: list[int] = []
    name = str(e.get("name", ""))
    m = re.fullmatch(r"ProfilerStep#(\d+)", name)
    if m:
        steps.append(int(m.group(1)) - step0)
        e["name"] = f"ProfilerStep#\x00S{int(m.group(1)) - step0}\x00"
    text = json.dumps(e, separators=(",", ":"))
    text = text.replace("{", "{{").replace("}", "}}")
    text = text.replace('"\\u0000TS\\u0000"', "{t}")
    text = re.sub(r'"\\u0000I(\d+)\\u0000"', lambda mm: "{i" + mm.group(1) + "}", text)
    text = re.sub(r"\\u0000S(\d+)\\u0000", lambda mm: "{s" + mm.group(1) + "}", text)
    return text, ts_rel, tuple(sorted(set(ids))), tuple(sorted(set(steps)))


class Generator:
    """Deterministic big traces from one step window of a real rank file."""

    def __init__(self, sample: Path):
        with gzip.open(sample, "rt") as fh:
            doc = json.load(fh)
        events = doc["traceEvents"]
        marks = sorted(
            (e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
            key=lambda e: e["ts"],
        )
        if len(marks) < 2:
            raise SystemExit(f"{sample}: need two ProfilerStep markers to cut a step window")
        self.sample = sample
        self.step0 = int(marks[0]["name"].split("#")[1])
        self.t0 = int(marks[0]["ts"])
        self.period = int(marks[1]["ts"]) - self.t0  # µs: copies tile the timeline
        self.header = {k: v for k, v in doc.items() if k != "traceEvents"}
        self.meta = [json.dumps(e, separators=(",", ":")) for e in events if e.get("ph") == "M"]
        window = [
            e
            for e in events
            if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float)) and self.t0 <= e["ts"] < self.t0 + self.period
        ]
        self.items = [_compile_event(e, self.t0, self.step0) for e in window]
        all_ids = [i for _, _, ids, _ in self.items for i in ids]
        self.id_min = min(all_ids) if all_ids else 0
        self.id_span = (max(all_ids) - self.id_min + 1) if all_ids else 1
        self.events_per_copy = len(self.items)

    def _copy_text(self, k: int) -> str:
        shift = k * self.period
        id_off = k * self.id_span
        out = []
        for fmt, ts_rel, ids, steps in self.items:
            kw: dict[str, object] = {"t": _num(self.t0 + shift + ts_rel)}
            for i in ids:
                kw[f"i{i}"] = i + id_off
            for s in steps:
                kw[f"s{s}"] = self.step0 + k + s
            out.append(fmt.format(**kw))
        return ",\n".join(out)

    def write(self, path: Path, target_bytes: int, rank: int | None = None, world: int | None = None) -> dict:
        header = dict(self.header)
        if rank is not None:
            header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
        head = json.dumps(header)[:-1]  # '"rank": 0' keeps the space HTA's rank regex needs
        tmp = path.with_suffix(path.suffix + ".part")
        copies = 0
        written = 0
        with tmp.open("w", encoding="utf-8", buffering=1 << 22) as fh:
            fh.write(head + ', "traceEvents": [\n')
            fh.write(",\n".join(self.meta))
            written = fh.tell()
            while written < target_bytes or copies < 3:  # at least 3 steps (HTA drops the last)
                fh.write(",\n")
                fh.write(self._copy_text(copies))
                copies += 1
                written = fh.tell()
            fh.write("\n]}\n")
        tmp.replace(path)
        return {"bytes": path.stat().st_size, "steps": copies, "events": copies * self.events_per_copy + len(self.meta)}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def build_inputs(sizes: list[int], ranks: int, rank_bytes: int, log, rank_sample: str = "two_ranks") -> list[dict]:
    """Create (or reuse) the benchmark inputs; returns one dict per case. ``rank_sample``: the
    multi-rank case's ranks copy kineto_two_ranks (GPU, NCCL: at least ~2.4 MB a rank) or
    (``cpu``) the bundled CPU-only trace (~75 KB a step: many small ranks)."""
    DATA.mkdir(parents=True, exist_ok=True)
    cases = []
    gens: dict[int, Generator] = {}

    def gen(r: int) -> Generator:
        src = SAMPLE_DIR / f"rank-{r % 2}.json.gz"
        if r % 2 not in gens:
            gens[r % 2] = Generator(src)
        return gens[r % 2]

    if rank_sample == "cpu":
        cpu_gen = Generator(CPU_SAMPLE)

        def rank_gen(r: int) -> Generator:
            return cpu_gen
    else:
        rank_gen = gen

    def cached(d: Path, key: dict) -> dict | None:
        stamp = d / "params.json"
        if stamp.is_file():
            try:
                saved = json.loads(stamp.read_text())
            except ValueError:
                return None
            if saved.get("key") == key:
                return saved
        return None

    for size in sizes:
        d = DATA / f"single_{_label(size)}"
        key = {"v": GEN_VERSION, "bytes": size, "sample": "kineto_two_ranks/rank-0"}
        info = cached(d, key)
        if info is None:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            t = time.perf_counter()
            log(f"generating {d.name} ...")
            res = gen(0).write(d / "rank-0.pt.trace.json", size, rank=0, world=1)
            info = {"key": key, **res}
            (d / "params.json").write_text(json.dumps(info))
            log(f"  {res['bytes'] / 1e6:.0f} MB, {res['events']:,} events, {res['steps']} steps in {time.perf_counter() - t:.1f} s")
        cases.append({"name": f"1 rank x {_label(size)}", "dir": d, "bytes": info["bytes"], "events": info["events"], "ranks": 1, "size": size})
    if ranks > 0:
        d = DATA / (f"ranks_{ranks}x{_label(rank_bytes)}" + ("" if rank_sample == "two_ranks" else f"_{rank_sample}"))
        key = {"v": GEN_VERSION, "ranks": ranks, "bytes": rank_bytes,
               "sample": "kineto_two_ranks" if rank_sample == "two_ranks" else str(CPU_SAMPLE.relative_to(ROOT))}
        info = cached(d, key)
        if info is None:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            t = time.perf_counter()
            log(f"generating {d.name} ...")
            tot_b = tot_e = 0
            for r in range(ranks):
                res = rank_gen(r).write(d / f"rank-{r}.pt.trace.json", rank_bytes, rank=r, world=ranks)
                tot_b += res["bytes"]
                tot_e += res["events"]
            info = {"key": key, "bytes": tot_b, "events": tot_e}
            (d / "params.json").write_text(json.dumps(info))
            log(f"  {tot_b / 1e6:.0f} MB, {tot_e:,} events in {time.perf_counter() - t:.1f} s")
        cases.append({"name": f"{ranks} ranks x {_label(rank_bytes)}" + ("" if rank_sample == "two_ranks" else f" {rank_sample}"), "dir": d, "bytes": info["bytes"], "events": info["events"], "ranks": ranks, "size": rank_bytes})
    return cases


# ----------------------------------------------------------------------------- measuring
def _compile_sources() -> None:
    """Byte-compile advisor's sources, as ``pip install`` does for an installed package (and as
    HTA's are in site-packages): an editable checkout under ``PYTHONDONTWRITEBYTECODE`` (set on
    some CI machines) would otherwise compile ~80 modules in every timed run (~0.1 CPU-s)."""
    import compileall

    for d in ("advisor", "rules"):
        compileall.compile_dir(str(ROOT / d), quiet=1)


def _vm_hwm(pid: int) -> int:
    """The peak RSS (bytes) of process ``pid`` so far (``VmHWM``; 0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_measured(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run ``cmd``; return wall seconds, peak RSS (bytes), exit code, timed_out, stderr tail."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        psutil = None
    err = tempfile.TemporaryFile()  # noqa: SIM115 - closed below, after wait4
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT, start_new_session=True)
    peak, hwm = [0], [0]  # summed RSS of the process tree, and the main process's own high-water mark
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            hwm[0] = max(hwm[0], _vm_hwm(proc.pid))
            if psutil is not None:
                tree(psutil)
            stop.wait(0.1)

    def tree(psutil: Any) -> None:
        try:
            p = psutil.Process(proc.pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.Error:
            return
        rss = 0
        for q in procs:
            try:
                rss += q.memory_info().rss
            except psutil.Error:
                pass
        peak[0] = max(peak[0], rss)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    timed_out = False

    def kill() -> None:
        nonlocal timed_out
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    timer.cancel()
    stop.set()
    th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    tail = err.read().decode(errors="replace")[-2000:]
    err.close()
    return {
        "seconds": wall,
        "cpu": usage.ru_utime + usage.ru_stime,  # user + system of the process and the children it waited for
        # ru_maxrss only when nothing could be polled: Linux carries the parent's high-water mark
        # across the vfork + exec that starts the child, so it may be this script's own peak
        "rss": max(peak[0], hwm[0]) or usage.ru_maxrss * 1024,
        "rc": proc.returncode,
        "timed_out": timed_out,
        "stderr": tail,
    }


HTA_SCRIPT = r"""
import sys, logging, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
logging.getLogger("hta").setLevel(logging.ERROR)
a = TraceAnalysis(trace_dir=sys.argv[1])
df = a.get_temporal_breakdown(visualize=False)
print(df.to_string())
"""

DUCKDB_SCRIPT = r"""
import sys, duckdb, glob, os
from advisor.ingest.kineto import COLUMNS
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.json")))
threads = int(sys.argv[2])
con = duckdb.connect(":memory:", config={"temp_directory": ""})
if threads:
    con.execute(f"SET threads = {threads}")
con.execute("SET preserve_insertion_order = false")
size = max(os.path.getsize(f) for f in files)
mos = int(min(max(size * 1.05 + (1 << 20), 1 << 24), (1 << 32) - 2))
con.execute(
    f"CREATE TABLE ev AS SELECT unnest(traceEvents, recursive := true) FROM "
    f"read_json($files, columns={COLUMNS}, format='auto', maximum_object_size={mos})",
    {"files": files},
)
print(con.execute("SELECT count(*) FROM ev").fetchone()[0])
"""


def _median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (lower median for an even count), carrying the highest
    peak RSS of all runs; a failed run counts as the slowest."""
    ranked = sorted(runs, key=lambda r: (r["rc"] != 0 or r["timed_out"], r["seconds"]))
    med = dict(ranked[(len(ranked) - 1) // 2])
    med["rss"] = max(r["rss"] for r in runs)
    med["runs"] = [round(r["seconds"], 3) for r in runs]
    return med


def run_advisor(case: dict, timeout: float, extra: list[str] | None = None) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench_adv_")) / "report.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    target = case["dir"] / "rank-0.pt.trace.json" if case["ranks"] == 1 else case["dir"]
    res = run_measured([sys.executable, "-m", "advisor.cli", "analyze", str(target), "--format", "json", "--out", str(out), *(extra or [])], timeout, env)
    if res["rc"] == 0 and out.is_file():
        rep = json.loads(out.read_text())
        res["steps"] = len(rep.get("breakdown", []))
        res["parse_seconds"] = rep.get("profile", {}).get("parse_seconds")
    shutil.rmtree(out.parent, ignore_errors=True)
    return res


def run_hta(case: dict, timeout: float, python: str) -> dict:
    # HTA wants a directory; each case already is one (params.json is not *.json.gz-or-trace... it is
    # *.json, so give HTA a directory of symlinks to the trace files only)
    d = Path(tempfile.mkdtemp(prefix="bench_hta_"))
    for f in sorted(case["dir"].glob("rank-*.json")):
        (d / f.name).symlink_to(f)
    try:
        return run_measured([python, "-c", HTA_SCRIPT, str(d)], timeout)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_duckdb(case: dict, timeout: float, threads: int) -> dict:
    d = Path(tempfile.mkdtemp(prefix="bench_duck_"))
    for f in sorted(case["dir"].glob("rank-*.json")):
        (d / f.name).symlink_to(f)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        return run_measured([sys.executable, "-c", DUCKDB_SCRIPT, str(d), str(threads)], timeout, env)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------- report
def _fmt_s(r: dict | None) -> str:
    if r is None:
        return "skipped"
    if r["timed_out"]:
        return f"did not finish (>{r['seconds']:.0f} s)"
    if r["rc"] != 0:
        return f"failed (rc {r['rc']})"
    return f"{r['seconds']:.1f} s"


def _done(r: dict) -> bool:
    return r["rc"] == 0 and not r["timed_out"]


def _mb(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="500MB,2GB", help="single-rank input sizes, comma separated (e.g. 500MB,2GB)")
    ap.add_argument("--ranks", type=int, default=32, help="ranks of the multi-rank case (0: skip it)")
    ap.add_argument("--rank-size", default="10MB", help="size of each rank file in the multi-rank case")
    ap.add_argument("--rank-sample", choices=("two_ranks", "cpu"), default="two_ranks",
                    help="what the multi-rank case's ranks copy: kineto_two_ranks (GPU / NCCL, >= ~2.4 MB a rank) "
                         "or the bundled CPU-only trace (many small ranks)")
    ap.add_argument("--skip-hta", action="store_true", help="do not run HTA")
    ap.add_argument("--hta-python", help="python of an environment with HTA 0.5.0 (default: the HTA tests' own, "
                                         "built on first use by tests/hta_env.py)")
    ap.add_argument("--skip-duckdb", action="store_true", help="do not run the bare DuckDB load")
    ap.add_argument("--hta-timeout", type=float, default=900.0, help="seconds before HTA is stopped (default 15 min)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds before advisor / duckdb are stopped")
    ap.add_argument("--advisor-args", default="", help="extra arguments for advisor analyze, e.g. '--skip CMP003'")
    ap.add_argument("--duckdb-threads", type=int, default=0, help="threads for the bare DuckDB load (0: DuckDB default)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of advisor and of the bare DuckDB load per input under 1 GiB (median reported)")
    ap.add_argument("--hta-repeat", type=int, default=1,
                    help="HTA runs per input under 1 GiB (at most --repeat), each right after an advisor run; with "
                         "several, HTA/adv is the median of those pairs' ratios")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.advisor_args:
        log(f"advisor analyze extra arguments: {args.advisor_args}")
    if not SAMPLE_DIR.is_dir():
        log(f"sample not found: {SAMPLE_DIR}")
        return 2
    try:
        sizes = [_parse_size(s) for s in args.sizes.split(",") if s.strip()]
        rank_size = _parse_size(args.rank_size)
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    cases = build_inputs(sizes, args.ranks, rank_size, log, args.rank_sample)
    have_hta = False
    hta_py = args.hta_python or ""
    if not args.skip_hta:
        if not hta_py:
            sys.path.insert(0, str(ROOT))
            from tests.hta_env import HtaUnavailable, hta_python

            try:
                hta_py = str(hta_python())
            except HtaUnavailable as exc:
                log(f"HTA environment unavailable ({exc}); skipping HTA")
        if hta_py:
            probe = subprocess.run([hta_py, "-c", "import hta.trace_analysis"], capture_output=True, check=False)
            have_hta = probe.returncode == 0
            if not have_hta:
                log(f"HTA not importable by {hta_py} (pip install holistictraceanalysis==0.5.0 pandas==2.2.3 psutil "
                    "there); skipping it")

    import duckdb

    log(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, duckdb {duckdb.__version__}")
    _compile_sources()
    results = []
    for case in cases:
        log(f"== {case['name']}: {_mb(case['bytes'])}, {case['events']:,} events")
        small = case["bytes"] < 1 << 30
        runs = max(1, args.repeat) if small else 1
        hta_runs = (min(max(1, args.hta_repeat), runs) if small else 1) if have_hta else 0
        advs, ducks, htas, pairs = [], [], [], []
        for i in range(runs):  # alternating: the tools see the same drift of the machine
            adv = run_advisor(case, args.timeout, shlex.split(args.advisor_args))
            log(f"   advisor {_fmt_s(adv)}  peak RSS {_mb(adv['rss'])}" + ("" if adv["rc"] == 0 else "\n" + adv["stderr"][-800:]))
            advs.append(adv)
            duck = None if args.skip_duckdb else run_duckdb(case, args.timeout, args.duckdb_threads)
            if duck:
                log(f"   duckdb  {_fmt_s(duck)}  peak RSS {_mb(duck['rss'])}" + ("" if duck["rc"] == 0 or duck["timed_out"] else "\n" + duck["stderr"][-800:]))
                ducks.append(duck)
            if i < hta_runs:  # right after the advisor run it is compared with
                hta = run_hta(case, args.hta_timeout, hta_py)
                log(f"   HTA     {_fmt_s(hta)}  peak RSS {_mb(hta['rss'])}" + ("" if hta["rc"] == 0 or hta["timed_out"] else "\n" + hta["stderr"][-800:]))
                htas.append(hta)
                if _done(adv) and (_done(hta) or hta["timed_out"]):
                    pairs.append(hta["seconds"] / adv["seconds"])
        adv, duck = _median_run(advs), (_median_run(ducks) if ducks else None)
        hta = _median_run(htas) if htas else None
        if runs > 1:
            log(f"   median of {runs}: advisor {_fmt_s(adv)}" + (f", duckdb {_fmt_s(duck)}" if duck else "")
                + (f"; HTA/advisor of each pair: {', '.join(f'{p:.1f}x' for p in pairs)}" if len(pairs) > 1 else ""))
        results.append({"case": case, "advisor": adv, "duckdb": duck, "hta": hta, "pairs": pairs})

    # --- table
    print()
    print(f"{'input':<20} {'size':>9} {'advisor':>9} {'MB/s':>7} {'RSS':>9} {'RSS/in':>7} "
          f"{'duckdb':>9} {'adv/duck':>8} {'HTA':>24} {'HTA RSS':>9} {'HTA/adv':>8}")
    rows = []
    for r in results:
        c, a, d, h = r["case"], r["advisor"], r["duckdb"], r["hta"]
        ok = a["rc"] == 0 and not a["timed_out"]
        mbps = c["bytes"] / (1 << 20) / a["seconds"] if ok else float("nan")
        rss_ratio = a["rss"] / c["bytes"]
        d_ok = d is not None and d["rc"] == 0 and not d["timed_out"]
        adv_duck = a["seconds"] / d["seconds"] if (ok and d_ok) else None
        h_done = h is not None and h["rc"] == 0 and not h["timed_out"]
        speed = (h["seconds"] / a["seconds"]) if (ok and h is not None and (h_done or h["timed_out"])) else None
        if ok and len(r["pairs"]) > 1:  # the median of the ratios of runs made side by side, not of two medians
            speed = statistics.median(r["pairs"])
        speed_txt = "-" if speed is None else (f">{speed:.0f}x" if h["timed_out"] else f"{speed:.1f}x")
        print(f"{c['name']:<20} {_mb(c['bytes']):>9} {_fmt_s(a):>9} {mbps:>7.1f} {_mb(a['rss']):>9} {rss_ratio:>6.2f}x "
              f"{_fmt_s(d):>9} {('-' if adv_duck is None else f'{adv_duck:.2f}x'):>8} {_fmt_s(h):>24} "
              f"{('-' if h is None else _mb(h['rss'])):>9} {speed_txt:>8}")
        checks = {"rss_under_2x_input": rss_ratio < TARGETS["rss_ratio"]}
        if adv_duck is not None:
            checks["within_2x_duckdb"] = adv_duck <= TARGETS["duckdb_ratio"]
        if speed is not None and (c["ranks"] > 1 or c["size"] <= 600 << 20):
            checks["10x_faster_than_hta"] = speed >= TARGETS["hta_speedup"]
        if c["ranks"] == 1 and c["size"] >= 2 << 30:
            checks["under_60s"] = ok and a["seconds"] < TARGETS["seconds_2gb"]
        rows.append({
            "input": c["name"], "bytes": c["bytes"], "events": c["events"],
            "advisor_s": a["seconds"] if ok else None, "advisor_runs_s": a.get("runs"), "advisor_rss": a["rss"],
            "advisor_mb_s": mbps if ok else None, "duckdb_runs_s": d.get("runs") if d else None,
            "advisor_parse_s": a.get("parse_seconds"),
            "duckdb_s": d["seconds"] if d_ok else None, "duckdb_rss": d["rss"] if d else None,
            "hta_s": h["seconds"] if h_done else None, "hta_timed_out": bool(h and h["timed_out"]),
            "hta_rss": h["rss"] if h else None, "hta_runs_s": h.get("runs") if h else None,
            "hta_speedup_pairs": [round(p, 2) for p in r["pairs"]], "hta_speedup": speed, "advisor_over_duckdb": adv_duck, "targets": checks,
        })
    print()
    for row in rows:
        marks = ", ".join(f"{k} {'PASS' if v else 'MISS'}" for k, v in row["targets"].items())
        print(f"{row['input']:<20} targets: {marks}")
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.node(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
