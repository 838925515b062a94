#!/usr/bin/env python
"""Many-rank benchmark: advisor on 1 and 2 workers against the bare DuckDB floor and HTA, side by side.

    python benchmarks/bench_scale.py                                   # every case (about an hour here)
    python benchmarks/bench_scale.py --cases 128x9.6MB --kinds dense --forms gz,json
    python benchmarks/bench_scale.py --cases 256x1.9MB,1024x1.9MB --kinds sparse --skip-hta
    python benchmarks/bench_scale.py --cases "" --ascend 64,256        # the Ascend clusters only

Kineto clusters (``--cases RANKSxSIZE``, SIZE the JSON of one rank before compression) are built from
real samples by ``bench_kineto.Generator``: ``dense`` ranks copy a step window of
``sample_profiles/kineto_two_ranks`` (GPU kernels, NCCL; three steps at least, ~2.4 MB), ``sparse``
ones the CPU-only ``sample_profiles/kineto_cpu_healthy`` (~75 KB a step). Each cluster is written
uncompressed (``json``) and gzipped (``gz``, the same bytes, level 6), cached under ``benchmarks/data/``.
Ascend torch_npu clusters (``--ascend N,...``) come from ``tests/ascend/gen_cluster.py``, text and
``.db`` forms.

For each cluster, one tool at a time, each a subprocess:

* advisor: ``advisor analyze DIR --format json --out ... --workers W`` for each ``--workers`` (1:
  in-process; 2: the main process and one spawned worker mapping shards side by side); its CPU time
  (user + system, workers included) is logged beside the wall time;
* floor: one process reading each rank's files one after another, bare: Kineto a DuckDB ``read_json``
  of the events with advisor's column types into a table, dropped after each rank; Ascend DuckDB
  ``read_csv`` of each CSV file, ``read_json_objects`` of each JSON file (parsed and checked, one row
  an element of a top-level array), and every row of every table of each SQLite
  file fetched with ``sqlite3`` (the floor of any reader of these files);
* HTA 0.5.0 (``TraceAnalysis`` + ``get_temporal_breakdown``, Kineto dense only: it needs GPU kernels),
  in its own environment (``tests/hta_env.py``), stopped after ``--hta-timeout``.

Wall time around the subprocess; peak memory = the highest summed RSS of the whole process tree,
workers included (``bench_kineto.run_measured``). The table gives ratios: ``w1/w2`` (the map's
scaling from 1 to 2 workers), ``adv/floor`` (the better of the advisor runs against the floor) and
``HTA/adv``; below it, for clusters of one kind and rank size at two rank counts, how their peak
memories compare, and a 16-core estimate from the 1- and 2-worker times (Amdahl: the part that
halved with the second worker is spread over 16).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_kineto import (
    CPU_SAMPLE,
    DATA,
    HTA_SCRIPT,
    SAMPLE_DIR,
    Generator,
    _compile_sources,
    _parse_size,
    run_measured,
)

SCALE_VERSION = 1  # bump when the cases' layout changes (invalidates the cache)

KINETO_FLOOR = r"""
import sys, duckdb, os
from advisor.ingest.kineto import COLUMNS
files = sys.argv[1:]
con = duckdb.connect(":memory:", config={"temp_directory": ""})
con.execute("SET preserve_insertion_order = false")
rows = 0
for f in files:  # one rank after another
    mos = int(min(max(os.path.getsize(f) * (12 if f.endswith(".gz") else 1.05) + (1 << 20), 1 << 24), (1 << 32) - 2))
    con.execute(f"CREATE TABLE ev AS SELECT unnest(traceEvents, recursive := true) FROM "
                f"read_json(?, columns={COLUMNS}, format='auto', maximum_object_size={mos})", [f])
    rows += con.execute("SELECT count(*) FROM ev").fetchone()[0]
    con.execute("DROP TABLE ev")
print(rows)
"""

ASCEND_FLOOR = r"""
import sys, duckdb, os, sqlite3
con = duckdb.connect(":memory:", config={"temp_directory": ""})
con.execute("SET preserve_insertion_order = false")
rows = 0
for d in sys.argv[1:]:  # one rank's directory after another
    for base, _dirs, names in sorted(os.walk(d)):
        for name in sorted(names):
            f = os.path.join(base, name)
            if name.endswith(".csv"):
                con.execute("CREATE TABLE t AS SELECT * FROM read_csv(?)", [f])
            elif name.endswith(".json"):
                mos = int(min(max(os.path.getsize(f) * 1.05 + (1 << 20), 1 << 24), (1 << 32) - 2))
                con.execute(f"CREATE TABLE t AS SELECT * FROM read_json_objects(?, format='auto', "
                            f"maximum_object_size={mos})", [f])
            elif name.endswith(".db"):
                db = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
                for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                    rows += len(db.execute(f'SELECT * FROM "{table}"').fetchall())
                db.close()
                continue
            else:
                continue
            rows += con.execute("SELECT count(*) FROM t").fetchone()[0]
            con.execute("DROP TABLE t")
print(rows)
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def _parse_case(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\S+)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a case: {text!r} (RANKSxSIZE, e.g. 128x9.6MB)")
    return int(m.group(1)), _parse_size(m.group(2))


def _cached(d: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    stamp = d / "params.json"
    if stamp.is_file():
        try:
            saved: dict[str, Any] = json.loads(stamp.read_text())
        except ValueError:
            return None
        if saved.get("key") == key:
            return saved
    return None


def build_kineto(ranks: int, size: int, kind: str) -> dict[str, Any]:
    """The cluster's uncompressed and gzipped forms (``<dir>/json``, ``<dir>/gz``), built once."""
    d = DATA / f"scale_{kind}_{ranks}x{size}"
    key = {"v": SCALE_VERSION, "ranks": ranks, "bytes": size, "kind": kind}
    info = _cached(d, key)
    if info is not None:
        return info | {"dir": d}
    shutil.rmtree(d, ignore_errors=True)
    (d / "json").mkdir(parents=True)
    (d / "gz").mkdir()
    t = time.perf_counter()
    log(f"generating {d.name} ...")
    gens = [Generator(SAMPLE_DIR / f"rank-{r}.json.gz") for r in (0, 1)] if kind == "dense" else [Generator(CPU_SAMPLE)]
    json_bytes = gz_bytes = events = 0
    for r in range(ranks):
        plain = d / "json" / f"rank-{r}.pt.trace.json"
        res = gens[r % len(gens)].write(plain, size, rank=r, world=ranks)
        with plain.open("rb") as src, gzip.open(d / "gz" / f"rank-{r}.pt.trace.json.gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        json_bytes += res["bytes"]
        events += res["events"]
        gz_bytes += (d / "gz" / f"rank-{r}.pt.trace.json.gz").stat().st_size
    info = {"key": key, "json_bytes": json_bytes, "gz_bytes": gz_bytes, "events": events}
    (d / "params.json").write_text(json.dumps(info))
    log(f"  {json_bytes / 1e6:,.0f} MB of JSON ({gz_bytes / 1e6:,.0f} MB gzipped), {events:,} events "
        f"in {time.perf_counter() - t:.0f} s")
    return info | {"dir": d}


def build_ascend(ranks: int, form: str) -> dict[str, Any]:
    from tests.ascend.gen_cluster import Scenario, generate

    d = DATA / f"scale_ascend_{form}_{ranks}"
    # "gen": the generator's output for this scenario (2: small packets split inside each all-gather)
    key = {"v": SCALE_VERSION, "ranks": ranks, "form": form, "gen": 2}
    info = _cached(d, key)
    if info is not None:
        return info | {"dir": d}
    shutil.rmtree(d, ignore_errors=True)
    t = time.perf_counter()
    log(f"generating {d.name} ...")
    scn = Scenario(name=f"scale{ranks}", world=ranks, ranks_per_node=8, tp=2, steps=5, layers=8, fwd_kernels=8,
                   buckets=8, bwd_kernels=10, opt_kernels=6, slow_rank=min(5, ranks - 1), slow_step=3,
                   small_packets=True, aicpu=True, low_block_dim=True)
    generate(scn, d / "cluster", form)
    size = sum(p.stat().st_size for p in (d / "cluster").rglob("*") if p.is_file())
    info = {"key": key, "json_bytes": size, "gz_bytes": None, "events": None}
    (d / "params.json").write_text(json.dumps(info))
    log(f"  {size / 1e6:,.0f} MB in {time.perf_counter() - t:.0f} s")
    return info | {"dir": d}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_advisor(target: Path, workers: int, timeout: float) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="bench_scale_")) / "report.json"
    try:
        res = run_measured([sys.executable, "-m", "advisor.cli", "analyze", str(target), "--format", "json",
                            "--out", str(out), "--workers", str(workers)], timeout, _env())
        if res["rc"] in (0, 1) and out.is_file():  # 1: a finding reached --fail-on (not used here)
            res["rc"] = 0
            res["ranks"] = len(json.loads(out.read_text()).get("profile", {}).get("ranks", []) or [])
        return res
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def run_floor(script: str, args: list[str], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write("\n".join(args))
    try:  # the list of files or directories goes through a file: 1,024 paths make a long command line
        code = "import sys; sys.argv[1:] = open(sys.argv.pop(1)).read().split(chr(10)); " + f"exec({script!r})"
        return run_measured([sys.executable, "-c", code, fh.name], timeout, _env())
    finally:
        os.unlink(fh.name)


def run_hta(files: list[Path], timeout: float, python: str) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix="bench_scale_hta_"))
    for f in files:
        (d / f.name).symlink_to(f)
    try:
        return run_measured([python, "-c", HTA_SCRIPT, str(d)], timeout)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _ok(r: dict[str, Any] | None) -> bool:
    return r is not None and r["rc"] == 0 and not r["timed_out"]


def _s(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if r["timed_out"]:
        return f">{r['seconds']:.0f}"
    return f"{r['seconds']:.1f}" if r["rc"] == 0 else f"rc {r['rc']}"


def _ratio(a: float | None, b: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if a is None or b is None or b == 0 else fmt.format(a / b)


def _hta_python(args: argparse.Namespace) -> str:
    if args.skip_hta:
        return ""
    py = args.hta_python or ""
    if not py:
        from tests.hta_env import HtaUnavailable, hta_python

        try:
            py = str(hta_python())
        except HtaUnavailable as exc:
            log(f"HTA environment unavailable ({exc}); skipping HTA")
            return ""
    if subprocess.run([py, "-c", "import hta.trace_analysis"], capture_output=True, check=False).returncode != 0:
        log(f"HTA not importable by {py}; skipping it")
        return ""
    return py


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="128x9.6MB,256x1.9MB,1024x1.9MB",
                    help="Kineto clusters, RANKSxSIZE comma separated (SIZE: one rank's JSON before compression)")
    ap.add_argument("--kinds", default="dense,sparse", help="dense (kineto_two_ranks), sparse (kineto_cpu_healthy)")
    ap.add_argument("--forms", default="gz,json", help="gz (gzipped ranks), json (uncompressed)")
    ap.add_argument("--ascend", default="64,256", help="Ascend cluster sizes in ranks ('' for none)")
    ap.add_argument("--ascend-forms", default="text,db")
    ap.add_argument("--workers", default="1,2", help="advisor --workers values to measure")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--hta-python", help="python of an environment with HTA 0.5.0 (default: tests/hta_env.py's)")
    ap.add_argument("--hta-timeout", type=float, default=900.0)
    ap.add_argument("--hta-max-ranks", type=int, default=128, help="run HTA on clusters of at most this many ranks")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds before advisor / the floor are stopped")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    try:
        cases = [_parse_case(c) for c in args.cases.split(",") if c.strip()]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    kinds = [k for k in args.kinds.split(",") if k]
    forms = [f for f in args.forms.split(",") if f]
    hta_py = _hta_python(args)
    import duckdb

    machine = (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
               f"duckdb {duckdb.__version__}, load average {os.getloadavg()[0]:.1f} at the start")
    log(f"machine: {machine}")
    _compile_sources()

    plan: list[dict[str, Any]] = []
    for ranks, size in cases:
        for kind in kinds:
            info = build_kineto(ranks, size, kind)
            for form in forms:
                files = sorted((info["dir"] / form).glob("rank-*"), key=lambda p: int(p.name.split("-")[1].split(".")[0]))
                plan.append({"name": f"kineto {kind} {form}", "ranks": ranks, "size": size, "target": info["dir"] / form,
                             "json_bytes": info["json_bytes"], "disk_bytes": info["gz_bytes" if form == "gz" else "json_bytes"],
                             "floor": (KINETO_FLOOR, [str(f) for f in files]),
                             "hta": files if kind == "dense" and ranks <= args.hta_max_ranks else None})
    for n in [int(x) for x in args.ascend.split(",") if x.strip()]:
        for form in [f for f in args.ascend_forms.split(",") if f]:
            info = build_ascend(n, form)
            target = info["dir"] / "cluster"
            dirs = sorted(str(p) for p in target.iterdir() if p.is_dir())
            plan.append({"name": f"ascend {form}", "ranks": n, "size": info["json_bytes"] // n, "target": target,
                         "json_bytes": info["json_bytes"], "disk_bytes": info["json_bytes"],
                         "floor": (ASCEND_FLOOR, dirs), "hta": None})

    rows = []
    for case in plan:
        log(f"== {case['name']} {case['ranks']} ranks: {_mb(case['disk_bytes'])} MB on disk")
        row: dict[str, Any] = {"case": case, "advisor": {}}
        for w in workers:
            r = run_advisor(case["target"], w, args.timeout)
            log(f"   advisor --workers {w}: {_s(r)} s, {r.get('cpu', 0.0):.1f} CPU-s, peak {_mb(r['rss'])} MB"
                + ("" if _ok(r) else "\n" + r["stderr"][-600:]))
            row["advisor"][w] = r
        script, items = case["floor"]
        row["floor"] = run_floor(script, items, args.timeout)
        log(f"   floor: {_s(row['floor'])} s, peak {_mb(row['floor']['rss'])} MB"
            + ("" if _ok(row["floor"]) else "\n" + row["floor"]["stderr"][-600:]))
        row["hta"] = None
        if hta_py and case["hta"] is not None:
            row["hta"] = run_hta(case["hta"], args.hta_timeout, hta_py)
            log(f"   HTA: {_s(row['hta'])} s, peak {_mb(row['hta']['rss'])} MB")
        rows.append(row)

    print(f"\nmachine: {machine}")
    head = (f"{'case':<20} {'ranks':>5} {'MB/rank':>7} {'disk MB':>8} "
            + " ".join(f"{'w' + str(w) + ' s':>7} {'w' + str(w) + ' MB':>7}" for w in workers)
            + f" {'w1/w2':>6} {'floor s':>7} {'floor MB':>8} {'adv/floor':>9} {'HTA s':>6} {'HTA MB':>7} {'HTA/adv':>7}")
    print(head)
    out = []
    for row in rows:
        c, advs, fl, h = row["case"], row["advisor"], row["floor"], row["hta"]
        secs = {w: r["seconds"] for w, r in advs.items() if _ok(r)}
        best = min(secs.values()) if secs else None
        fl_s = fl["seconds"] if _ok(fl) else None
        h_s = h["seconds"] if h is not None and (_ok(h) or h["timed_out"]) else None
        line = (f"{c['name']:<20} {c['ranks']:>5} {c['json_bytes'] / c['ranks'] / 1e6:>7.2f} {_mb(c['disk_bytes']):>8} "
                + " ".join(f"{_s(advs[w]):>7} {_mb(advs[w]['rss']):>7}" for w in workers)
                + f" {_ratio(secs.get(1), secs.get(2)):>6} {_s(fl):>7} {_mb(fl['rss']):>8} {_ratio(best, fl_s):>9}"
                + f" {_s(h):>6} {('-' if h is None else _mb(h['rss'])):>7}"
                + f" {_ratio(h_s, best, '{:.1f}x') if h_s is not None else '-':>7}")
        print(line)
        out.append({"case": c["name"], "ranks": c["ranks"], "json_bytes": c["json_bytes"], "disk_bytes": c["disk_bytes"],
                    "advisor": {str(w): {"seconds": r["seconds"], "rss": r["rss"], "ok": _ok(r)} for w, r in advs.items()},
                    "floor": {"seconds": fl["seconds"], "rss": fl["rss"], "ok": _ok(fl)},
                    "hta": None if h is None else {"seconds": h["seconds"], "rss": h["rss"], "ok": _ok(h),
                                                   "timed_out": h["timed_out"]}})
    print()
    for row in rows:  # the map's scaling, projected to 16 cores
        secs = {w: r["seconds"] for w, r in row["advisor"].items() if _ok(r)}
        if 1 in secs and 2 in secs and secs[1] > secs[2]:
            par = 2 * (secs[1] - secs[2])
            ser = secs[1] - par
            print(f"{row['case']['name']:<20} {row['case']['ranks']:>5} ranks: {ser:.1f} s not sped up by the 2nd worker, "
                  f"{par:.1f} s that was; 16 cores: ~{ser + par / 16:.1f} s")
    by_shape: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        c = row["case"]
        by_shape.setdefault((c["name"], c["size"]), []).append(row)
    for (name, size), group in by_shape.items():
        if len(group) < 2:
            continue
        small, big = min(group, key=lambda r: r["case"]["ranks"]), max(group, key=lambda r: r["case"]["ranks"])
        for w in workers:
            a, b = small["advisor"].get(w), big["advisor"].get(w)
            if _ok(a) and _ok(b):
                print(f"{name:<20} {size / 1e6:.1f} MB/rank, --workers {w}: peak {_mb(a['rss'])} MB at "
                      f"{small['case']['ranks']} ranks, {_mb(b['rss'])} MB at {big['case']['ranks']} "
                      f"({(b['rss'] / a['rss'] - 1) * 100:+.0f} %)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "date": time.strftime("%Y-%m-%d %H:%M"), "rows": out},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
