"""Steps inferred where a trace has no step marker (advisor.ingest.step_inference).

The measure: traces with ``ProfilerStep#N`` markers are loaded as they are and again from a copy
with the markers stripped (:func:`strip_kineto`, :func:`strip_ascend_text`); the windows inferred
from the copy are compared with the marked windows. A boundary is a step start that follows
another step (the first step's start is the trace's start, not a boundary between steps); it
is right when it is within 1% of the rank's median marked step time of a marked boundary.
Numbers asserted come from the traces (their markers, their README), never from the inference.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advisor.engine.context import load_profile
from advisor.ingest.step_inference import infer_rank
from tests.conftest import report_json

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_profiles"
TRACES = ROOT / "tests" / "data" / "kineto"
REAL = ROOT / "tests" / "data" / "kineto_real"
MARK = re.compile(r"ProfilerStep#\d+")
TOL = 0.01  # of the step time
SHARE = 0.95  # of the boundaries within TOL


# --- stripping the markers (test helpers) -----------------------------------------------------


def strip_kineto(src: Path, dst: Path) -> Path:
    """Copy the Kineto traces of ``src`` (a folder or one file) to ``dst`` without their
    ``ProfilerStep#N`` events (host ranges and their GPU-side copies)."""
    dst.mkdir(parents=True, exist_ok=True)
    files = [src] if src.is_file() else sorted(p for p in src.iterdir() if ".json" in p.name)
    for f in files:
        opener: Any = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not MARK.fullmatch(str(e.get("name", "")))]
        with gzip.open(dst / (f.name if f.name.endswith(".gz") else f.name + ".gz"), "wt", encoding="utf-8") as fh:
            json.dump(doc, fh)
    return dst


def strip_ascend_text(src: Path, dst: Path) -> Path:
    """Copy a torch_npu text export without anything that numbers steps: the ``ProfilerStep#N``
    events of trace_view.json, step_trace_time.csv, kernel_details.csv's ``Step Id`` column, and
    communication.json's ``stepN`` keys (merged under one ``step``)."""
    shutil.copytree(src, dst)
    for f in dst.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"):
        doc = json.loads(f.read_text())
        evs = doc if isinstance(doc, list) else doc["traceEvents"]
        keep = [e for e in evs if not MARK.fullmatch(str(e.get("name", "")))]
        f.write_text(json.dumps(keep if isinstance(doc, list) else {**doc, "traceEvents": keep}))
    for f in dst.glob("*/ASCEND_PROFILER_OUTPUT/step_trace_time.csv"):
        f.unlink()
    for f in dst.glob("*/ASCEND_PROFILER_OUTPUT/kernel_details.csv"):
        rows = list(csv.reader(io.StringIO(f.read_text())))
        i = rows[0].index("Step Id")
        out = io.StringIO()
        csv.writer(out).writerows([r[:i] + r[i + 1:] for r in rows])
        f.write_text(out.getvalue())
    for f in dst.glob("*/ASCEND_PROFILER_OUTPUT/communication.json"):
        merged: dict[str, dict[str, Any]] = {}
        for ops_by_kind in json.loads(f.read_text()).values():
            for kind, ops in ops_by_kind.items():
                merged.setdefault(kind, {}).update(ops)
        f.write_text(json.dumps({"step": merged}))
    return dst


# --- the measure ------------------------------------------------------------------------------


def windows(con: Any, inferred: bool) -> dict[int, list[tuple[int, int]]]:
    rows = con.execute(
        f"SELECT rank, start_ns, end_ns FROM steps WHERE step >= 0 AND inferred = {str(inferred).lower()} "
        "ORDER BY rank, start_ns").fetchall()
    out: dict[int, list[tuple[int, int]]] = {}
    for r, s, e in rows:
        out.setdefault(int(r), []).append((int(s), int(e)))
    return out


def compare(marked: Any, stripped: Any) -> dict[str, Any]:
    """Per the module doc: the inferred boundaries within TOL of a marked one (and the reverse)."""
    truth, got = windows(marked, False), windows(stripped, True)
    hits = total = found = n_true = 0
    worst = 0.0
    for rank, t in truth.items():
        step = float(np.median([e - s for s, e in t]))
        tb = np.array([s for s, _ in t[1:]])
        gb = np.array([s for s, _ in got.get(rank, [])[1:]])
        for b in gb:
            off = float(np.min(np.abs(np.array([s for s, _ in t]) - b))) / step
            worst = max(worst, off)
            hits += off <= TOL
            total += 1
        for b in tb:
            found += bool(len(gb)) and float(np.min(np.abs(gb - b))) / step <= TOL
            n_true += 1
    return {"hits": hits, "total": total, "found": found, "n_true": n_true, "worst": worst,
            "steps": {r: len(v) for r, v in got.items()}, "true_steps": {r: len(v) for r, v in truth.items()}}


def check(marked_dir: Path, stripped_dir: Path) -> dict[str, Any]:
    marked, stripped = load_profile(marked_dir), load_profile(stripped_dir)
    res = compare(marked.con, stripped.con)
    assert res["total"] > 0, res
    assert res["hits"] >= SHARE * res["total"], res  # inferred boundaries at a marked one
    assert res["found"] >= SHARE * res["n_true"], res  # marked boundaries found
    assert res["steps"] == res["true_steps"], res
    assert any(w.code == "steps_inferred" for w in stripped.warnings)
    return res


# --- markers stripped: inferred boundaries at the marked ones ---------------------------------

COLLECTIVE_TRACES = [SAMPLES / "kineto_two_ranks", SAMPLES / "kineto_gloo_slow_rank"]  # NCCL kernels; gloo host
WITH_COLLECTIVES = [COLLECTIVE_TRACES[0], pytest.param(COLLECTIVE_TRACES[1], marks=pytest.mark.slow)]  # gloo: marked run
# no collectives: the quick suite runs a profiler pause and GC pauses; the rest is slow-marked
WITHOUT = [TRACES / n for n in ("cpu_multi_cycle", "cpu_python_gc")] + [
    pytest.param(TRACES / n, marks=pytest.mark.slow)
    for n in ("cpu_step_fluctuation", "cpu_healthy", "cpu_slow_dataloader", "cpu_contention", "cpu_dynamic_shapes", "cpu_host_sync",
              "cpu_unfused_transformer", "cpu_dispatch_bound")]


@pytest.mark.parametrize("path", WITH_COLLECTIVES + WITHOUT, ids=lambda p: getattr(p, "name", str(p)))
def test_markers_stripped_boundaries_within_one_percent(path: Path, tmp_path: Path) -> None:
    check(path, strip_kineto(path, tmp_path / path.name))


@pytest.mark.slow
def test_markers_stripped_resnet50(tmp_path: Path) -> None:
    path = SAMPLES / "kineto_resnet50_num_workers_0"
    check(path, strip_kineto(path, tmp_path / path.name))


def _bench_generator() -> Any:
    spec = importlib.util.spec_from_file_location("bench_kineto", ROOT / "benchmarks" / "bench_kineto.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Generator


@pytest.mark.slow
def test_generated_nccl_cluster_markers_stripped(tmp_path: Path) -> None:
    """benchmarks' generator: a step window of kineto_two_ranks repeated (NCCL collectives), 4 ranks."""
    gen_cls = _bench_generator()
    marked = tmp_path / "marked"
    marked.mkdir()
    gens = {r: gen_cls(SAMPLES / "kineto_two_ranks" / f"rank-{r}.json.gz") for r in (0, 1)}
    for r in range(4):
        gens[r % 2].write(marked / f"rank-{r}.json", 1, rank=r, world=4)  # 3 copies of the step
    res = check(marked, strip_kineto(marked, tmp_path / "stripped"))
    assert res["true_steps"] == {r: 3 for r in range(4)}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["baseline8", "faults8"])
def test_generated_ascend_cluster_markers_stripped(scenario: str, tmp_path: Path) -> None:
    """tests/ascend/gen_cluster.py's clusters (8 ranks, HCCL collectives; faults8: a slow rank, a
    slow step, AI_CPU operators...), text form, with every step number removed."""
    from tests.ascend.gen_cluster import generate

    facts = generate(scenario, tmp_path / "marked", "text")
    res = check(tmp_path / "marked", strip_ascend_text(tmp_path / "marked", tmp_path / "stripped"))
    assert res["true_steps"] == {r: len(facts.steps) for r in range(8)}


def test_collective_gaps_alone_miss_the_boundary() -> None:
    """Why the host operators place the boundary: even knowing which gap between collectives holds
    it (an oracle for the change-point detection), the end of the last collective before a marked
    boundary (LLMPrism: the end of the DP burst ends the step) is off by more than 1% of the step
    on most boundaries of the marked traces with collectives."""
    near = total = 0
    for path in COLLECTIVE_TRACES:
        con = load_profile(path).con
        for (rank,) in con.execute("SELECT DISTINCT rank FROM steps").fetchall():
            t = con.execute(f"SELECT start_ns, end_ns FROM steps WHERE rank = {rank} ORDER BY start_ns").fetchall()
            step = float(np.median([e - s for s, e in t]))
            dev = con.execute(f"SELECT bool_or(device) FROM events WHERE rank = {rank} AND kind = 'comm'").fetchone()[0]
            ends = np.array([r[0] for r in con.execute(
                f"SELECT start_ns + dur_ns FROM events WHERE rank = {rank} AND kind = 'comm' AND device = {dev}"
                " ORDER BY start_ns").fetchall()])
            starts = np.array([r[0] for r in con.execute(
                f"SELECT start_ns FROM events WHERE rank = {rank} AND kind = 'comm' AND device = {dev}"
                " ORDER BY start_ns").fetchall()])
            for s, _ in t[1:]:
                before = ends[starts < s]
                near += bool(len(before)) and abs(s - before.max()) <= TOL * step
                total += 1
    assert total >= 12 and near < SHARE * total


# --- no marker and nothing to infer: one window, a warning ------------------------------------


@pytest.mark.parametrize("path", [REAL / "kineto_b200_vllm_tp8_rank0", REAL / "kineto_mi300_sglang_prefilldecode"],
                         ids=lambda p: p.name)
def test_single_pass_without_markers_stays_one_window(path: Path) -> None:
    """README (kineto_real): a vLLM prefill and an SGLang prefill + decode, no ProfilerStep markers:
    not training loops; the whole trace stays one window and a warning says why."""
    ctx = load_profile(path)
    assert ctx.con.execute("SELECT step, inferred FROM steps").fetchall() == [(-1, False)]
    w = [w for w in ctx.warnings if w.code == "no_step_marker"]
    assert len(w) == 1 and "cannot be inferred" in w[0].message
    assert not any(w.code == "steps_inferred" for w in ctx.warnings)


def test_one_marked_step_stripped_is_not_cut(tmp_path: Path) -> None:
    """kineto_mi300_hf_bert_small holds one ProfilerStep (one inference pass): stripped, no steps."""
    ctx = load_profile(strip_kineto(REAL / "kineto_mi300_hf_bert_small", tmp_path / "bert"))
    assert ctx.con.execute("SELECT step, inferred FROM steps").fetchall() == [(-1, False)]
    assert any(w.code == "no_step_marker" for w in ctx.warnings)


def test_steps_that_differ_are_not_inferred(tmp_path: Path) -> None:
    """cpu_torch_recompile (README: a new compile, new operator names, every step): stripped, the
    operator sequence does not repeat; one window and the reason."""
    ctx = load_profile(strip_kineto(TRACES / "cpu_torch_recompile", tmp_path / "recompile"))
    assert ctx.con.execute("SELECT step FROM steps").fetchall() == [(-1,)]
    assert any(w.code == "no_step_marker" and "cannot be inferred" in w.message for w in ctx.warnings)


def _ops(names: list[str], t0: int = 0, gap: int = 10_000, dur: int = 50_000) -> tuple[np.ndarray, ...]:
    starts = np.arange(len(names), dtype=np.int64) * (dur + gap) + t0
    return np.array(names), starts, starts + dur


def test_irregular_sequence_gets_no_steps() -> None:
    rng = np.random.default_rng(7)
    names, s, e = _ops([f"aten::op{int(i)}" for i in rng.integers(0, 40, 600)])
    res = infer_rank(0, names, s, e, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert res.steps == [] and res.reason


def test_repeated_layers_of_one_pass_get_no_steps() -> None:
    """One forward pass: an embedding, 32 identical layers, a head. The layers repeat, but the
    operators framing them run once: not a loop."""
    names = ["embedding", "rotary"] + ["rms_norm", "qkv", "attention", "o_proj", "rms_norm", "mlp_up", "mlp_down"] * 32
    names += ["final_norm", "lm_head", "sample"]
    n, s, e = _ops(names)
    res = infer_rank(0, n, s, e, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert res.steps == []


def test_collectives_must_repeat_with_the_steps() -> None:
    """A loop of 6 iterations whose collectives all fall in the first two: not the same work."""
    body = ["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "aten::linear", "aten::relu",
            "autograd::engine::evaluate_function: AddmmBackward0", "Optimizer.step#SGD.step"]
    n, s, e = _ops(body * 6)
    period = int(s[5] - s[0])
    comm = np.array([s[0] + 1000, s[0] + period + 1000], dtype=np.int64)
    no = infer_rank(0, n, s, e, np.zeros(0, dtype=np.int64), comm)
    assert no.steps == [] and "collectives" in no.reason
    every = np.array([s[0] + k * period + 1000 for k in range(6)], dtype=np.int64)
    yes = infer_rank(0, n, s, e, np.zeros(0, dtype=np.int64), every)
    assert [a for _, a, _ in yes.steps] == [int(x) for x in s[::5]]


@pytest.mark.parametrize("where", ["end", "start"])
def test_an_operator_added_to_one_step_moves_no_boundary(where: str) -> None:
    """8 iterations of the same 6 operators; the 4th gets one more (a checkpoint at its end, or a
    warm-up op at its start): still 8 steps, each starting at its DataLoader batch."""
    body = ["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "aten::to", "aten::linear",
            "aten::cross_entropy_loss", "autograd::engine::evaluate_function: AddmmBackward0", "Optimizer.step#SGD.step"]
    seq: list[str] = []
    for k in range(8):
        step = list(body)
        if k == 3:
            step = step + ["checkpoint"] if where == "end" else [step[0], "warmup", *step[1:]]
        seq += step
    n, s, e = _ops(seq)
    res = infer_rank(0, n, s, e, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    firsts = [int(t) for t, name in zip(s, seq) if name == body[0]]
    assert [a for _, a, _ in res.steps] == firsts and len(firsts) == 8


# --- the report -------------------------------------------------------------------------------


def test_report_marks_inferred_steps(tmp_path: Path) -> None:
    from advisor.analyze import analyze

    stripped = analyze(strip_kineto(TRACES / "cpu_healthy", tmp_path / "healthy"))
    doc = report_json(stripped)
    assert doc["profile"]["steps_inferred"] is True
    assert len(doc["profile"]["steps"]) == 6  # README: 6 active steps (#2-#7)
    assert doc["breakdown"] and all(r["inferred"] is True for r in doc["breakdown"])
    assert any(w["code"] == "steps_inferred" and "confidence" in w["message"] for w in doc["warnings"])
    inferred = [r for r in doc["window_phases"] if r["kind"] == "inferred_steps"]
    assert [r["calls"] for r in inferred] == [6]
    assert float(re.search(r"confidence ([0-9.]+)", inferred[0]["names"]).group(1)) >= 0.8  # the acceptance bar
    from advisor.render import html, markdown
    from advisor.render.terminal import render_text

    assert "steps 0–5 (inferred)" in markdown.render(stripped)
    assert "(inferred)" in render_text(stripped).splitlines()[1]
    assert "steps 0–5 (inferred)" in html.render(stripped)
    marked_report = analyze(TRACES / "cpu_healthy")
    marked = report_json(marked_report)
    assert marked["profile"]["steps_inferred"] is False
    assert not any("inferred" in r for r in marked["breakdown"])
    assert "(inferred)" not in markdown.render(marked_report)


def test_step_option_selects_an_inferred_step(tmp_path: Path) -> None:
    from advisor.analyze import analyze

    doc = report_json(analyze(strip_kineto(TRACES / "cpu_healthy", tmp_path / "healthy"), step=3))
    assert [r["step"] for r in doc["breakdown"]] == [3]


# --- cost -------------------------------------------------------------------------------------


def test_inference_on_200k_operators() -> None:
    """200,000 top-level operators (500 a step, 400 steps): every step found (its cost is measured
    by benchmarks/, not here)."""
    body = [f"aten::op{i % 97}" for i in range(499)] + ["Optimizer.step#AdamW.step"]
    n, s, e = _ops(body * 400, t0=10**18)
    res = infer_rank(0, n, s, e, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert len(res.steps) == 400 and res.period == 500


# --- steps from the collectives where the operators do not repeat -----------------------------


def recommender_trace(folder: Path, n_steps: int = 12, seed: int = 3) -> Path:
    """A recommender-style CPU training trace written in Kineto's format, with ProfilerStep#N
    markers: per step, the loop's Python (300 µs idle on the main thread), a sparse part of 5-15
    lookups drawn at random from 6 operator names (the batch's sparse features), the sparse
    all-to-all, a fixed dense forward, the backward on the autograd thread (tid 2) ending in two
    gradient all-reduces, then the optimizer on the main thread. Steps differ in length
    (75-215 ms: the dense ops' length varies), and the operators do not repeat a period."""
    rng = np.random.default_rng(seed)
    ev: list[dict[str, Any]] = []

    def x(name: str, ts: float, dur: float, tid: int = 1) -> None:
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}})

    t = 1_000_000.0
    for k in range(n_steps):
        scale = float(rng.uniform(75, 215)) / 100.0  # the step's length in units of 100 ms
        start = t
        t += 300
        for _ in range(int(rng.integers(5, 16))):
            x(f"aten::sparse_op{int(rng.integers(0, 6))}", t, 400)
            t += 450
        x("c10d::alltoall_base_", t, 2000)
        t += 2100
        for name in ("aten::linear", "aten::relu", "aten::linear", "aten::sigmoid"):
            x(name, t, 10_000 * scale)
            t += 10_000 * scale + 50
        b = t
        for name in ("autograd::engine::evaluate_function: AddmmBackward0",
                     "autograd::engine::evaluate_function: ReluBackward0"):
            x(name, b, 20_000 * scale, tid=2)
            b += 20_000 * scale + 50
        x("c10d::allreduce_", b, 3000, tid=2)
        x("c10d::allreduce_", b + 3100, 1500, tid=2)
        t = b + 4700
        x("Optimizer.step#SGD.step", t, 1000)
        t += 1100
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": start,
                   "dur": t - start, "args": {}})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rank-0.pt.trace.json").write_text(json.dumps({
        "schemaVersion": 1, "traceEvents": ev, "distributedInfo": {"rank": 0, "world_size": 2}}))
    return folder


def test_collectives_give_the_steps_where_operators_do_not_repeat(tmp_path: Path) -> None:
    """Markers stripped from the recommender-style trace: the operators do not repeat a period, the
    sequence of collectives does (all-to-all, all-reduce, all-reduce); every marked boundary is found
    within 1 % of the median step."""
    marked = recommender_trace(tmp_path / "marked")
    stripped = strip_kineto(marked, tmp_path / "stripped")
    res = check(marked, stripped)
    assert res["steps"] == {0: 12} and res["worst"] <= TOL


def _loop(steps: list[list[str]], gap: int = 10_000, pause: int = 400_000, dur: int = 50_000) -> tuple[np.ndarray, ...]:
    """Operators of ``dur`` ns ``gap`` ns apart, each step's first one after an idle ``pause``."""
    names, starts, t = [], [], 0
    for ops in steps:
        t += pause
        for n in ops:
            names.append(n)
            starts.append(t)
            t += dur + gap
    s = np.array(starts, dtype=np.int64)
    return np.array(names), s, s + dur


NONE = np.zeros(0, dtype=np.int64)


def test_one_operator_called_over_and_over_gets_no_steps() -> None:
    """A micro-benchmark: 300 calls of one operator, no iteration structure (every call equals the next)."""
    n, s, e = _ops(["aten::mm"] * 300)
    res = infer_rank(0, n, s, e, NONE, NONE)
    assert res.steps == [] and "micro-benchmark" in res.reason


def test_names_whose_count_varies_per_step_give_no_steps() -> None:
    """12 iterations of 6 fixed operators then 2 slots each holding 'aten::index' or 'aten::gather' at
    random: the sequence matches 80 % or more one period later, both varying names run in most steps,
    but their count per step varies (0, 1 or 2): 2 of the 8 names (25 %) are not stable."""
    rng = np.random.default_rng(5)
    fixed = [f"aten::op{k}" for k in range(6)]
    steps = [fixed + [str(x) for x in rng.choice(["aten::index", "aten::gather"], 2)] for _ in range(12)]
    n, s, e = _loop(steps)
    codes = np.unique(n, return_inverse=True)[1]
    assert np.mean(codes[:-8] == codes[8:]) >= 0.8
    per_step = [st.count("aten::index") for st in steps]
    assert max(per_step.count(c) for c in set(per_step)) < 0.8 * 12
    res = infer_rank(0, n, s, e, NONE, NONE)
    assert res.steps == [] and "same number of times" in res.reason


def test_a_clean_loop_is_inferred_with_full_confidence() -> None:
    """10 iterations of the same 8 operators: every operator equals the one 8 later, every name runs
    once per step."""
    n, s, e = _loop([[f"aten::op{k}" for k in range(8)]] * 10)
    res = infer_rank(0, n, s, e, NONE, NONE)
    assert res.period == 8 and len(res.steps) == 10 and res.confidence == 1.0
