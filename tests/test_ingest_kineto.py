"""Kineto ingest: every number here is recomputed from the raw JSON with the stdlib, not pasted."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from advisor.engine.context import load_profile
from advisor.ingest.base import InputError
from tests.conftest import SAMPLES, TRACES, slow


def raw_events(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def step_numbers(doc: dict) -> set[int]:
    return {
        int(m.group(1))
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and (m := re.match(r"ProfilerStep#(\d+)", str(e.get("name", "")))) and e.get("cat") != "gpu_user_annotation"
    }


@pytest.mark.parametrize("sample", [slow("kineto_resnet50_num_workers_0", id="kineto_resnet50_num_workers_0"), "kineto_two_ranks"])
def test_every_timed_event_is_loaded_per_category(sample: str, samples: Path) -> None:
    files = sorted((samples / sample).glob("*.json.gz"))
    ctx = load_profile(samples / sample)
    for f in files:
        doc = raw_events(f)
        want = Counter(
            e.get("cat") for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).lower() not in ("trace",)
        )
        got = dict(
            ctx.con.execute(
                "SELECT e.cat, count(*) FROM events e JOIN profile_files p USING (file_id) WHERE p.path = ? GROUP BY 1",
                [str(f)],
            ).fetchall()
        )
        assert got == dict(want)


@pytest.mark.slow  # the resnet50 sample's whole load; its analysis in the quick suite reads the same schema
def test_old_schema_kinds_and_steps(samples: Path) -> None:
    path = samples / "kineto_resnet50_num_workers_0"
    doc = raw_events(next(path.glob("*.gz")))
    ctx = load_profile(path)
    kinds = dict(ctx.con.execute("SELECT kind, count(*) FROM events GROUP BY 1").fetchall())
    raw = Counter(e.get("cat") for e in doc["traceEvents"] if e.get("ph") == "X")
    assert kinds["kernel"] == raw["Kernel"]  # no NCCL kernels in a single-GPU job
    assert kinds["memcpy"] == raw["Memcpy"] and kinds["memset"] == raw["Memset"]
    assert kinds["runtime"] + kinds.get("sync", 0) == raw["Runtime"]
    steps = [r[0] for r in ctx.con.execute("SELECT step FROM steps ORDER BY step").fetchall()]
    assert steps == sorted(step_numbers(doc)) == [5, 6, 7, 8, 9, 10]
    # rank from the file name (worker0), no distributedInfo in this trace
    assert ctx.ranks == [0]
    assert ctx.has_device


def _window_begin(doc: dict, m: dict) -> int:
    """Where a step's window starts (ns), from the raw trace: at its marker, later by how long the
    first device task it launched waited, after its launch, for the task before it on its stream."""
    dev = sorted((e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                  and "correlation" in e.get("args", {})), key=lambda e: e["ts"])
    first_task: dict[int, dict] = {}
    for e in dev:
        first_task.setdefault(e["args"]["correlation"], e)
    calls = sorted((e for e in doc["traceEvents"] if e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and m["ts"] <= e["ts"] < m["ts"] + m["dur"]
                    and e.get("args", {}).get("correlation") in first_task), key=lambda e: e["ts"])
    if not calls:
        return round(m["ts"] * 1000)
    task = first_task[calls[0]["args"]["correlation"]]
    before = [e for e in dev if (e["pid"], e["tid"]) == (task["pid"], task["tid"]) and e["ts"] < task["ts"]]
    prev_end = before[-1]["ts"] + before[-1]["dur"] if before else calls[0]["ts"]
    wait = max(min(task["ts"], prev_end) - calls[0]["ts"], 0)
    return round(m["ts"] * 1000) + round(wait * 1000)


def test_ranks_from_distributed_info_and_windows(samples: Path) -> None:
    ctx = load_profile(samples / "kineto_two_ranks")
    assert ctx.ranks == [0, 1]
    rows = ctx.con.execute("SELECT rank, world_size, backend, rank_source FROM ranks ORDER BY rank").fetchall()
    assert rows == [(0, 128, "nccl", "distributedInfo"), (1, 128, "nccl", "distributedInfo")]
    for rank in (0, 1):
        doc = raw_events(samples / "kineto_two_ranks" / f"rank-{rank}.json.gz")
        marks = sorted(
            (e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation" and e.get("ph") == "X"),
            key=lambda e: e["ts"],
        )
        win = ctx.con.execute("SELECT step, start_ns, end_ns FROM steps WHERE rank = ? ORDER BY step", [rank]).fetchall()
        assert [w[0] for w in win] == [int(m["name"].split("#")[1]) for m in marks]
        # consecutive steps tile the timeline: step N ends where step N+1 starts
        assert win[0][1] == _window_begin(doc, marks[0])
        assert win[0][2] == win[1][1] == _window_begin(doc, marks[1])


def test_cpu_only_trace_has_no_device_and_relative_timestamps() -> None:
    path = TRACES / "cpu_healthy"
    f = next(path.glob("*.gz"))
    doc = raw_events(f)
    ctx = load_profile(path)
    assert not ctx.has_device
    base = int(doc["baseTimeNanoseconds"])
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace" and isinstance(e.get("ts"), (int, float)))
    got = ctx.con.execute("SELECT min(start_ns) FROM events").fetchall()[0][0]
    assert abs(got - (base + first * 1000)) < 1000  # within 1 µs (float ts precision)


def test_multi_cycle_files_merge_into_one_rank() -> None:
    path = TRACES / "cpu_multi_cycle"
    files = sorted(path.glob("*.gz"))
    assert len(files) == 2
    want = set()
    for f in files:
        want |= step_numbers(raw_events(f))
    ctx = load_profile(path)
    assert ctx.ranks == [0]
    steps = {r[0] for r in ctx.con.execute("SELECT step FROM steps").fetchall()}
    assert steps == want == {2, 3, 6, 7}
    # the last step of the first cycle does not stretch over the gap to the next cycle
    (w3,) = ctx.con.execute("SELECT end_ns - host_end_ns FROM steps WHERE step = 3").fetchall()[0]
    assert w3 < 50_000_000


def test_no_step_marker_steps_are_inferred_with_warning() -> None:
    """README: 5 training iterations, no prof.step(); the one-window case: tests/test_step_inference.py."""
    ctx = load_profile(TRACES / "cpu_no_step_marker")
    assert ctx.con.execute("SELECT count(*), bool_and(inferred) FROM steps WHERE step >= 0").fetchall() == [(5, True)]
    assert any(w.code == "steps_inferred" for w in ctx.warnings)


def test_gloo_ranks_and_host_collectives() -> None:
    ctx = load_profile(TRACES / "gloo_slow_rank")
    assert ctx.ranks == [0, 1]
    doc = raw_events(TRACES / "gloo_slow_rank" / "rank0.pt.trace.json.gz")
    n_gloo = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:"))
    got = ctx.con.execute("SELECT count(*) FROM events WHERE rank = 0 AND kind = 'comm' AND name LIKE 'gloo:%'").fetchall()[0][0]
    assert got == n_gloo > 0


def test_single_file_path(samples: Path) -> None:
    ctx = load_profile(samples / "kineto_two_ranks" / "rank-1.json.gz")
    assert ctx.ranks == [1]


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_profile(tmp_path / "missing")
    with pytest.raises(InputError, match="empty directory"):
        load_profile(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match="no recognisable trace"):
        load_profile(tmp_path)


def test_bad_rank_file_is_skipped_with_warning(tmp_path: Path, samples: Path) -> None:
    import shutil

    shutil.copy(samples / "kineto_two_ranks" / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    (tmp_path / "rank-1.json").write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": 1')
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0]
    assert any(w.path and w.path.endswith("rank-1.json") for w in ctx.warnings)


TABLE_QUERIES = {
    "events": "SELECT * EXCLUDE (file_id) FROM events ORDER BY ALL",
    "steps": "SELECT * FROM steps ORDER BY ALL",
    "tracks": "SELECT * FROM tracks ORDER BY ALL",
    "kernels": "SELECT * EXCLUDE (file_id) FROM kernels ORDER BY ALL",
    "comm_ops": "SELECT * EXCLUDE (file_id) FROM comm_ops ORDER BY ALL",
    "profile_files": "SELECT rank, path, source, events FROM profile_files ORDER BY ALL",
}
MULTI_FILE = [SAMPLES / "kineto_two_ranks", TRACES / "cpu_multi_cycle", TRACES / "gloo_slow_rank", TRACES / "gloo_pipeline_bubble"]
# the quick suite reads the first (GPU, two ranks); the marked run every one
MULTI_FILE_PARAMS = [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if i >= 1 else []) for i, p in enumerate(MULTI_FILE)]


def _tables(path: Path) -> dict[str, list]:
    ctx = load_profile(path)
    out = {name: ctx.con.execute(q).fetchall() for name, q in TABLE_QUERIES.items()}
    out["warnings"] = sorted((w.code, w.message) for w in ctx.warnings)
    return out


@pytest.mark.parametrize("path", MULTI_FILE_PARAMS)
def test_one_scan_for_many_files_equals_one_by_one(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small files of a directory are read in one scan; reading them one by one gives the same tables."""
    from advisor.ingest import kineto

    calls = []
    real = kineto._load_batch
    monkeypatch.setattr(kineto, "_load_batch", lambda *a: calls.append(1) or real(*a))
    batched = _tables(path)
    assert calls, "the directory was not read in one scan"
    monkeypatch.delattr(kineto, "load_many")
    assert _tables(path) == batched


@pytest.mark.parametrize("path", [*MULTI_FILE_PARAMS, slow(SAMPLES / "kineto_resnet50_num_workers_0", id="kineto_resnet50_num_workers_0"),
                                  pytest.param(TRACES / "cpu_no_step_marker", id="cpu_no_step_marker")])
def test_steps_assigned_on_insert_match_an_asof_join(path: Path) -> None:
    """Every device event's step is the window with the latest start at or before it, if it starts
    before that window ends; every host event's the same with the host windows (from a marker's
    start to the next one's, the last to the later of its end and its window's end)."""
    con = load_profile(path).con
    diff = con.execute(
        """SELECT count(*), count(*) FILTER (WHERE e.step IS DISTINCT FROM
                     CASE WHEN s.step IS NOT NULL AND e.start_ns < s.end_ns THEN s.step END)
        FROM events e ASOF LEFT JOIN steps s ON e.rank = s.rank AND e.start_ns >= s.start_ns
        WHERE e.device"""
    ).fetchall()[0]
    assert diff[1] == 0
    n = diff[0]
    diff = con.execute(
        """WITH h AS (SELECT rank, step, host_start_ns AS start_ns,
                             least(greatest(host_end_ns, end_ns),
                                   coalesce(lead(host_start_ns) OVER (PARTITION BY rank ORDER BY host_start_ns), end_ns))
                                 AS end_ns FROM steps)
        SELECT count(*), count(*) FILTER (WHERE e.step IS DISTINCT FROM
                     CASE WHEN s.step IS NOT NULL AND e.start_ns < s.end_ns THEN s.step END)
        FROM events e ASOF LEFT JOIN h s ON e.rank = s.rank AND e.start_ns >= s.start_ns
        WHERE NOT e.device"""
    ).fetchall()[0]
    assert n + diff[0] > 0 and diff[1] == 0
    for table in ("kernels", "comm_ops"):
        bad = con.execute(
            f"""SELECT count(*) FROM {table} t LEFT JOIN steps s
                ON t.rank = s.rank AND t.start_ns >= s.start_ns AND t.start_ns < s.end_ns
            WHERE t.step IS DISTINCT FROM s.step"""
        ).fetchall()[0][0]
        assert bad == 0, table


def test_batch_with_a_broken_file_falls_back_to_one_by_one(tmp_path: Path, samples: Path) -> None:
    """A malformed file fails the shared scan: the others are still read (one by one), the bad one is named."""
    import shutil

    for f in (samples / "kineto_two_ranks").iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "rank-7.json").write_text('{"distributedInfo": {"rank": 7}, "traceEvents": [{"ph": "X", "ts": 1, "dur": ')
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0, 1]
    assert any(w.path and w.path.endswith("rank-7.json") for w in ctx.warnings)


@pytest.mark.parametrize("path", [pytest.param(SAMPLES / "kineto_two_ranks", id="kineto_two_ranks"),
                                  slow(SAMPLES / "kineto_resnet50_num_workers_0", id="kineto_resnet50_num_workers_0")])
def test_whole_object_reader_gives_the_same_tables(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Event lists are read from a spilled copy; where that fails the whole-object reader gives the same tables."""
    from advisor.ingest import kineto
    from advisor.ingest.jsonstream import LayoutError

    spilled = _tables(path)

    def refuse(*_a: object, **_k: object) -> None:
        raise LayoutError("test: not laid out as expected")

    monkeypatch.setattr(kineto, "SpilledEvents", refuse)
    assert _tables(path) == spilled


def test_base_time_after_the_events_is_found_in_one_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace whose baseTimeNanoseconds follows traceEvents: its relative timestamps still get the base."""
    from advisor.ingest import kineto

    doc = raw_events(next((TRACES / "cpu_healthy").glob("*.json.gz")))
    base = int(doc["baseTimeNanoseconds"])
    for rank in (0, 1):
        moved = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
                 "traceEvents": doc["traceEvents"], "baseTimeNanoseconds": base}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(moved))
    from decimal import Decimal

    first_ts = min(Decimal(str(e["ts"])) for e in doc["traceEvents"]
                   if e.get("ph") == "X" and str(e.get("cat", "")).lower() not in ("trace", "ac2g", "flow"))
    batched = _tables(tmp_path)
    starts = [r[0] for r in load_profile(tmp_path).con.execute("SELECT min(start_ns) FROM events GROUP BY rank").fetchall()]
    assert starts == [base + int(first_ts * 1000)] * 2
    monkeypatch.delattr(kineto, "load_many")
    assert _tables(tmp_path) == batched
    from advisor.ingest.jsonstream import LayoutError

    def refuse(*_a: object, **_k: object) -> None:
        raise LayoutError("test: not laid out as expected")

    monkeypatch.setattr(kineto, "SpilledEvents", refuse)  # header read from the head, base found later
    assert _tables(tmp_path) == batched


def test_release_memory_is_best_effort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Purging freed memory works where DuckDB's allocator exposes it and is a no-op elsewhere."""
    import ctypes

    from advisor.ingest import base

    monkeypatch.setattr(base, "_PURGE", None)
    base.release_memory()  # this wheel: found or not, no error
    monkeypatch.setattr(base, "_PURGE", None)

    def no_library(*_a: object, **_k: object) -> None:
        raise OSError("no such library")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    base.release_memory()
    assert base._PURGE is False
    base.release_memory()  # remembered: not looked up again


def test_parts_compressed_as_appended_give_the_same_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files read one by one each hand over a part; big inputs compress them as they are appended: same tables."""
    from advisor import ingest
    from advisor.ingest import kineto

    path = TRACES / "gloo_slow_rank"
    monkeypatch.delattr(kineto, "load_many")
    plain = _tables(path)
    monkeypatch.setattr(ingest, "COMPRESS_EVERY_ROWS", 1)
    assert _tables(path) == plain


@pytest.mark.parametrize("batched", [pytest.param(True, id="one_scan"), slow(False, id="one_by_one")])
def test_a_copy_of_a_rank_file_is_dropped(tmp_path: Path, samples: Path, batched: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two files claiming one rank for the same time range: one is used, the other named in a warning."""
    import shutil

    from advisor.ingest import kineto

    src = samples / "kineto_two_ranks"
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(src / "rank-0.json.gz", tmp_path / "copy-of-rank-0.json.gz")
    if not batched:
        monkeypatch.delattr(kineto, "load_many")
    got = _tables(tmp_path)
    want = _tables(src)
    dup = [w for w in got.pop("warnings") if w[0] == "duplicate_rank"]
    assert len(dup) == 1 and "rank 0" in dup[0][1]
    want.pop("warnings")
    assert {k: v for k, v in got.items() if k != "profile_files"} == {k: v for k, v in want.items() if k != "profile_files"}
    assert [r[2:] for r in got["profile_files"]] == [r[2:] for r in want["profile_files"]]  # (source, events): paths differ


@pytest.mark.parametrize("path", MULTI_FILE_PARAMS)
def test_events_adopted_from_a_part_keep_the_schema_types(path: Path) -> None:
    """A directory read in one scan hands its table over as ``events`` itself: same columns and types as the schema."""
    import duckdb

    from advisor.schema import create_all

    fresh = duckdb.connect()
    create_all(fresh)  # the schema's own table, its types as DuckDB spells them (kind: the ENUM's values)
    con = load_profile(path).con
    assert [tuple(r[:2]) for r in con.execute("DESCRIBE events").fetchall()] == \
        [tuple(r[:2]) for r in fresh.execute("DESCRIBE events").fetchall()]


@pytest.mark.parametrize("path", [*MULTI_FILE_PARAMS, pytest.param(TRACES / "cpu_healthy", id="cpu_healthy")])
def test_args_read_as_a_struct_equal_the_json_path(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader types ``args`` as a STRUCT where no lower-case key spelling is seen; the JSON
    path (every field extracted from the args text) gives the same tables."""
    from advisor.ingest import kineto

    scans = []
    real = kineto._events_sql
    monkeypatch.setattr(kineto, "_events_sql", lambda u, struct=False, numeric=False: scans.append(struct) or real(u, struct, numeric))
    as_struct = _tables(path)
    assert scans and all(scans)
    scans.clear()
    monkeypatch.setattr(kineto, "LOWER_CASE_KEYS", (b'"ph"',))  # found in every file: the JSON path
    assert _tables(path) == as_struct
    assert scans and not any(scans)


@pytest.mark.slow
def test_old_schema_spellings_are_read_by_the_json_path(samples: Path) -> None:
    """The old schema writes ``"Input dims"`` / ``"external id"``: those files are read with the JSON
    path, so their shapes and external ids are kept (counted here from the raw JSON)."""
    path = samples / "kineto_resnet50_num_workers_0" / "worker0.pt.trace.json.gz"
    doc = raw_events(path)
    dims = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and "Input dims" in (e.get("args") or {}))
    ext = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("dur") is not None
              and ({"External id", "external id"} & set(e.get("args") or {})))
    con = load_profile(path).con
    assert dims > 0 and con.execute("SELECT count(*) FROM events WHERE shapes IS NOT NULL").fetchone()[0] == dims
    assert ext > 0 and con.execute("SELECT count(*) FROM events WHERE ext_id IS NOT NULL").fetchone()[0] == ext


def test_args_that_do_not_fit_the_struct_fall_back_to_the_json_path(tmp_path: Path, samples: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An event whose args is not an object fails the STRUCT scan: the files are read again with the
    JSON path, and every event (the odd one too) is kept with its fields."""
    import shutil

    for f in (samples / "kineto_two_ranks").iterdir():
        shutil.copy(f, tmp_path / f.name)
    want = _tables(tmp_path)
    odd = {"ph": "X", "cat": "cpu_op", "name": "odd_args", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": [1, 2]}
    (tmp_path / "rank-2.json").write_text(json.dumps({"distributedInfo": {"rank": 2}, "traceEvents": [
        odd, {**odd, "name": "ok_args", "ts": 3, "args": {"External id": 77, "correlation": 78}}]}))
    from advisor.ingest import kineto

    scans = []
    real = kineto._events_sql
    monkeypatch.setattr(kineto, "_events_sql", lambda u, struct=False, numeric=False: scans.append(struct) or real(u, struct, numeric))
    got = _tables(tmp_path)
    assert scans[:2] == [True, False]  # the STRUCT scan failed, the JSON one read the batch
    assert not [w for w in got["warnings"] if "rank-2" in w[1]]
    assert [r for r in got["events"] if r[0] < 2] == want["events"]
    con = load_profile(tmp_path).con
    assert con.execute("SELECT name, ext_id, corr FROM events WHERE rank = 2 ORDER BY name").fetchall() == \
        [("odd_args", None, None), ("ok_args", 77, 78)]


def test_a_failed_group_of_a_batch_leaves_the_other_group_loaded_once(tmp_path: Path, samples: Path) -> None:
    """A batch is scanned in two groups (args as STRUCT, and the JSON path for lower-case key
    spellings); when the second group's scan fails its file is read on its own and reported, and
    the first group's files are in the tables once (found by fuzzing: the retry used to read them
    again over their own part)."""
    import shutil

    for f in (samples / "kineto_two_ranks").iterdir():
        shutil.copy(f, tmp_path / f.name)
    want = _tables(tmp_path)
    # laid out as a trace (its event list is copied for the scan), invalid JSON inside the list
    (tmp_path / "rank-5.json").write_text(
        '{"distributedInfo": {"rank": 5}, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1, '
        '"args": {"external id": 1}}, {"ph": "X", "ts": 2, "dur": tru}]}')
    got = _tables(tmp_path)
    got.pop("warnings")
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0, 1]
    assert any(w.path and w.path.endswith("rank-5.json") for w in ctx.warnings)
    want.pop("warnings")
    assert {k: v for k, v in got.items() if k != "profile_files"} == {k: v for k, v in want.items() if k != "profile_files"}


def test_a_base_time_out_of_range_is_ignored_with_a_warning(tmp_path: Path) -> None:
    """baseTimeNanoseconds beyond what ns columns hold (fuzzing: 1e+300) is ignored, named in a warning."""
    doc = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
                            "ts": 0.0, "dur": 1.0, "args": {}}], "baseTimeNanoseconds": 1e300}
    (tmp_path / "t.pt.trace.json").write_text(json.dumps(doc))
    ctx = load_profile(tmp_path)
    assert ctx.con.execute("SELECT start_ns, dur_ns FROM events").fetchall() == [(0, 1000)]
    assert any("baseTimeNanoseconds" in w.message and "ignored" in w.message for w in ctx.warnings)


def _one_rank_trace(tmp_path: Path, events: list[dict], name: str = "rank-0.json") -> Path:
    (tmp_path / name).write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    return tmp_path


def test_times_read_as_numbers_keep_every_ns_the_double_holds(tmp_path: Path) -> None:
    """Absolute µs with a fraction (~1.7e15: beyond what ``round(ts * 1000)`` in a double keeps)
    give the ns the parsed number holds: .25 and .5 are exact in a double, so the ns are too."""
    ev = {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "args": {}}
    path = _one_rank_trace(tmp_path, [{**ev, "ts": 1682725897235145.25, "dur": 2.5},
                                      {**ev, "name": "b", "ts": 1682725897235146, "dur": 1}])
    got = load_profile(path).con.execute("SELECT name, start_ns, dur_ns FROM events ORDER BY name").fetchall()
    assert got == [("a", 1682725897235145250, 2500), ("b", 1682725897235146000, 1000)]


def test_times_as_text_fall_back_to_the_tolerant_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ts / dur written as a JSON string fails the numeric scan; the tolerant one (times as
    text) reads the file: numeric strings are kept, others dropped with a warning."""
    from advisor.ingest import kineto

    scans = []
    real = kineto._events_sql
    monkeypatch.setattr(kineto, "_events_sql", lambda u, struct=False, numeric=False: scans.append(numeric) or real(u, struct, numeric))
    ev = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "args": {}}
    path = _one_rank_trace(tmp_path, [{**ev, "name": "a", "ts": "12.5", "dur": 3}, {**ev, "name": "b", "ts": 20, "dur": "x"},
                                      {**ev, "name": "c", "ts": 30, "dur": 1}])
    ctx = load_profile(path)
    assert scans[:2] == [True, False]
    assert ctx.con.execute("SELECT name, start_ns, dur_ns FROM events ORDER BY name").fetchall() == \
        [("a", 12500, 3000), ("c", 30000, 1000)]
    assert any("1 events without a usable ts/dur" in w.message for w in ctx.warnings)


def test_insert_and_update_rows_in_chunks_equal_executemany() -> None:
    """The one-statement bulk INSERT / UPDATE helpers write what executemany wrote, NULLs and
    chunk boundaries included."""
    import duckdb

    from advisor.ingest.base import insert_rows, update_rows

    rows = [(1, None, "a"), (2, 5, None), (3, 6, "c'd"), (4, None, None), (5, 7, "e")]
    ups = [(10, 2), (None, 3), (30, 5), (40, 99)]
    got, want = duckdb.connect(), duckdb.connect()
    for con in (got, want):
        con.execute("CREATE TABLE t (k INTEGER, n BIGINT, s VARCHAR)")
    insert_rows(got, "t", rows, chunk=2)
    update_rows(got, "t", "n = v.value", "k", ups, chunk=3)
    want.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    want.executemany("UPDATE t SET n = ? WHERE k = ?", ups)
    q = "SELECT * FROM t ORDER BY k"
    assert got.execute(q).fetchall() == want.execute(q).fetchall()


def test_events_at_absurd_times_are_dropped_with_a_warning_and_spoil_nothing(tmp_path: Path) -> None:
    """Events ~280 years before the epoch (their distance to the step windows does not fit a BIGINT
    of ns: found by fuzzing an Ascend export; the old code rejected the whole file) are dropped with
    a warning, and the rest of the file loads."""
    ev = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "args": {}}
    mark = {**ev, "cat": "user_annotation"}
    path = _one_rank_trace(tmp_path, [
        {**mark, "name": "ProfilerStep#1", "ts": 1682725897235145, "dur": 100},
        {**mark, "name": "ProfilerStep#2", "ts": 1682725897235245, "dur": 100},
        {**ev, "name": "a", "ts": 1682725897235150, "dur": 10},
        {**ev, "name": "far", "ts": -8.9e15, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "far_kernel", "pid": 0, "tid": 7, "ts": -8.9e15, "dur": 1,
         "args": {"grid": [1, 1, 1]}},  # kernels are assigned their step by an outer join: every row's key is computed
    ])
    ctx = load_profile(path)
    assert ctx.con.execute("SELECT name, step FROM events WHERE kind IN ('host_op', 'kernel') ORDER BY name").fetchall() == \
        [("a", 1)]
    assert [w.message for w in ctx.warnings if w.code == "bad_events"] == \
        ["2 events with a time or duration beyond ±146 years of the epoch were dropped"]


def test_an_event_whose_end_does_not_fit_is_dropped_not_an_internal_error(tmp_path: Path) -> None:
    """ts + dur beyond what a BIGINT of ns holds (8e15 µs + 2e15 µs) stopped the breakdown with an
    overflow; the event is dropped with a warning and the step is analysed."""
    ev = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "args": {}}
    path = _one_rank_trace(tmp_path, [
        {**ev, "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1682725897235145, "dur": 100},
        {**ev, "name": "a", "ts": 1682725897235150, "dur": 10},
        {**ev, "name": "big", "ts": 8e15, "dur": 2e15},
    ])
    from advisor.analyze import analyze

    rep = analyze(path)
    assert [(r["rank"], r["step"], r["step_us"]) for r in rep.breakdown] == [(0, 1, 100.0)]
    assert any(w.code == "bad_events" and "beyond ±146 years" in w.message for w in rep.warnings)


def test_step_windows_spanning_beyond_bigint_still_assign_steps() -> None:
    """Vendor step windows are not bounded like events: a window at -7.5e18 ns beside one at
    1.7e18 ns (a fuzzed Ascend export) spans more than a BIGINT. The lookup buckets such a span in
    HUGEINT, and an event outside every window gets no bucket instead of an overflow."""
    import duckdb

    from advisor.ingest.steps import drop_window_lookup, step_of, window_lookup
    from advisor.schema import TABLES

    con = duckdb.connect()
    con.execute(TABLES["steps"].ddl())
    con.execute("INSERT INTO steps VALUES (0, 1, -7500000000000000000, -7499999999999999000, NULL, NULL, false), "
                "(0, 2, 1700000000000000000, 1700000000000001000, NULL, NULL, false)")
    con.execute("CREATE TABLE ev (rank INTEGER, start_ns BIGINT)")
    con.execute("INSERT INTO ev VALUES (0, -7499999999999999500), (0, 1700000000000000500), (0, 4000000000000000000), "
                "(0, -9000000000000000000)")
    win = window_lookup(con, "w")
    got = con.execute(f"SELECT t.start_ns, {step_of('t.start_ns')} FROM ev t {win.join} ORDER BY 1").fetchall()
    drop_window_lookup(con, "w")
    assert got == [(-9000000000000000000, None), (-7499999999999999500, 1), (1700000000000000500, 2),
                   (4000000000000000000, None)]


@pytest.mark.parametrize("layout", ["shared_span", "two_runs_a_day_apart", "one_long_rank"])
def test_window_lookup_stays_small_with_many_ranks_and_matches_an_asof_join(layout: str) -> None:
    """300 ranks x 6 windows: the lookup lists ~5 rows per window (each rank's windows under its
    own share of the buckets, not all ranks' windows over one rank's span: ~1,800 x 4 per rank),
    and every event gets the step an ASOF join gives, also when the ranks do not share a span."""
    import duckdb

    from advisor.ingest.steps import drop_window_lookup, step_of, window_lookup
    from advisor.schema import TABLES

    con = duckdb.connect()
    con.execute(TABLES["steps"].ddl())
    ranks, steps, step_ns = 300, 6, 1_000_000
    day = 86_400 * 10**9
    shift = {"shared_span": "r * 7", "two_runs_a_day_apart": f"CASE WHEN r >= 150 THEN {day} ELSE 0 END + r * 7",
             "one_long_rank": f"CASE WHEN r = 0 AND s = 5 THEN {day} ELSE 0 END + r * 7"}[layout]
    con.execute(f"""INSERT INTO steps SELECT r, s, {shift} + s * {step_ns}, {shift} + (s + 1) * {step_ns} - 1000, NULL, NULL,
                    false FROM range({ranks}) a(r), range({steps}) b(s)""")
    con.execute(f"""CREATE TABLE ev AS SELECT s.rank, s.start_ns + o * 997 - 5000 AS start_ns
                    FROM steps s, range(0, {step_ns // 997 + 10}, 37) c(o)""")
    win = window_lookup(con, "w")
    rows = con.execute("SELECT count(*) FROM w").fetchall()[0][0]
    got = con.execute(f"SELECT t.rank, t.start_ns, {step_of('t.start_ns')} AS step FROM ev t {win.join}").df()
    drop_window_lookup(con, "w")
    want = con.execute(f"""SELECT e.rank, e.start_ns, {step_of('e.start_ns')} AS step
                           FROM ev e ASOF LEFT JOIN steps s ON e.rank = s.rank AND e.start_ns >= s.start_ns""").df()
    merged = got.merge(want, on=["rank", "start_ns"], suffixes=("", "_asof"))
    assert len(merged) == len(want) == len(got) > ranks * steps * 20
    assert (merged["step"].fillna(-9) == merged["step_asof"].fillna(-9)).all()
    assert merged["step"].isna().any() and merged["step"].notna().any()
    assert rows <= 6 * ranks * steps + 64 * ranks, rows


@pytest.mark.parametrize("lower_case_keys", [False, True], ids=["args_struct", "args_json"])
def test_kernel_launch_grid_is_the_events_block_dim_and_feeds_cmp006(tmp_path: Path, lower_case_keys: bool) -> None:
    """A kernel's ``grid`` arg becomes its ``events.block_dim`` (product of the dims) in both ways
    of reading args, NCCL kernels included, other events NULL; CMP006 compares it with the SM count
    of the named device (A100: 108 SMs in rules/compute/devices.toml): 40 blocks on 108 SMs for
    1000 us per step -> 1000 x (1 - 40/108) = 629.63 us of saving."""
    host = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "args": {}}
    kern = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7}
    events = []
    for s in (1, 2):
        t0 = 1682725897000000 + s * 10_000
        events += [
            {**host, "cat": "user_annotation", "name": f"ProfilerStep#{s}", "ts": t0, "dur": 5000},
            {**kern, "name": "small_grid_kernel", "ts": t0 + 100, "dur": 1000, "args": {"grid": [20, 2, 1]}},
            {**kern, "name": "big_grid_kernel", "ts": t0 + 1200, "dur": 500, "args": {"grid": [216, 1, 1]}},
            {**kern, "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "ts": t0 + 1800, "dur": 100,
             "args": {"grid": [2, 1, 1]}},
            {**host, "name": "aten::mm", "ts": t0 + 50, "dur": 20},
        ]
    if lower_case_keys:  # the old schema's spelling sends args through the JSON path
        events[-1]["args"] = {"Input dims": [[2, 2]]}
    (tmp_path / "rank-0.json").write_text(json.dumps({
        "distributedInfo": {"rank": 0}, "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": events}))
    ctx = load_profile(tmp_path)
    got = ctx.con.execute("SELECT DISTINCT kind, name, block_dim FROM events WHERE kind <> 'step' ORDER BY name").fetchall()
    assert got == [("host_op", "aten::mm", None), ("kernel", "big_grid_kernel", 216),
                   ("comm", "ncclKernel_AllReduce_RING_LL_Sum_float", 2), ("kernel", "small_grid_kernel", 40)]
    assert ctx.con.execute("SELECT count(*) FROM kernels").fetchall() == [(0,)]  # no second copy of the kernel rows
    from advisor.analyze import analyze_context
    from advisor.config import Config

    rep = analyze_context(ctx, Config())
    found = [f for f in rep.findings if f.rule == "CMP006"]
    assert len(found) == 1
    ev = found[0].evidence
    assert (ev["top_block_dim"], ev["top_core_count"], ev["kernels"], ev["steps"]) == (40, 108, 2, 2)
    assert found[0].estimated_saving_us == pytest.approx(1000 * (1 - 40 / 108), abs=0.01)


@pytest.mark.parametrize("case", ["good", "one_truncated", "all_truncated", "setup_fails"])
def test_event_list_copies_started_early_are_all_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         case: str) -> None:
    """The copies of the event lists that the Kineto reader starts while the database is set up
    (prefetch) are taken by the batched scan, or deleted when the load ends however it ends: a
    file the scan cannot read (read again on its own), no readable file at all, or a failure
    before any scan (only the loader's clean-up can delete the copies then)."""
    import shutil
    import tempfile

    from advisor.ingest import kineto

    spill_dir = tmp_path / "tmp"
    spill_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill_dir))
    started = []
    real = kineto.prefetch
    monkeypatch.setattr(kineto, "prefetch", lambda units: started.append(len(units)) or real(units))
    prof = tmp_path / "prof"
    prof.mkdir()
    for r in (0, 1):
        text = gzip.decompress((SAMPLES / "kineto_two_ranks" / f"rank-{r}.json.gz").read_bytes())
        if case == "all_truncated" or (case == "one_truncated" and r == 1):
            text = text[: len(text) // 2]  # cut inside the event list: the copy is refused or the scan fails
        (prof / f"rank-{r}.json").write_bytes(text)
    if case == "setup_fails":
        from advisor import ingest

        def broken(**_kw: object) -> None:
            raise RuntimeError("no database")

        monkeypatch.setattr(ingest, "connect", broken)
        with pytest.raises(RuntimeError):
            load_profile(prof)
    elif case == "all_truncated":
        with pytest.raises(InputError):
            load_profile(prof)
    else:
        ctx = load_profile(prof)
        assert ctx.ranks == ([0, 1] if case == "good" else [0])
    assert started
    assert list(spill_dir.iterdir()) == []
    shutil.rmtree(prof)


def test_event_list_copies_are_deleted_beside_the_load_once_scanned(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched scan's copies are deleted by a thread of their own once the scan has read
    them (unlinking frees their pages: ~1 ms per 10 MB the loader no longer waits for), before
    the part is compressed and worked on, and none is left when the load returns."""
    import tempfile
    import threading

    from advisor.ingest import jsonstream, kineto

    spill_dir = tmp_path / "tmp"
    spill_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill_dir))
    deleted: list[tuple[str, str]] = []  # (thread, stage of the load)
    stage = ["scan"]
    handed_over = threading.Event()
    real_close, real_close_all, real_compress = jsonstream.SpilledEvents.close, kineto._close_all, kineto._compress

    def close(self: jsonstream.SpilledEvents) -> None:
        if self.path.exists():
            deleted.append((threading.current_thread().name, stage[0]))
        real_close(self)

    def close_all(spills: list) -> None:
        real_close_all(spills)
        handed_over.set()

    def compress(cur: object) -> None:
        handed_over.wait(10)  # deleting after the compression (or on this thread) would time out here
        stage[0] = "compress"
        real_compress(cur)

    monkeypatch.setattr(jsonstream.SpilledEvents, "close", close)
    monkeypatch.setattr(kineto, "_close_all", close_all)
    monkeypatch.setattr(kineto, "_compress", compress)
    prof = tmp_path / "prof"
    prof.mkdir()
    for r in (0, 1):
        (prof / f"rank-{r}.json").write_bytes(gzip.decompress((SAMPLES / "kineto_two_ranks" / f"rank-{r}.json.gz").read_bytes()))
    assert load_profile(prof).ranks == [0, 1]
    assert len(deleted) == 2
    assert all(t.startswith("advisor-unlink") and s == "scan" for t, s in deleted), deleted
    assert list(spill_dir.iterdir()) == []


@pytest.mark.parametrize("odd_args", [{"correlation": "not a number", "External id": 5},
                                      slow({"External id": 2**70, "correlation": 6}, id="huge_ext"),
                                      slow({"grid": 5, "External id": 7}, id="grid_not_list"),
                                      slow({"flops": "many", "correlation": 8}, id="text_flops")],
                         ids=["text_corr", "huge_ext", "grid_not_list", "text_flops"])
def test_numeric_args_the_struct_cannot_take_fall_back_to_the_json_path(tmp_path: Path, samples: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       odd_args: dict) -> None:
    """The STRUCT scan types correlation, External id, bytes, stream, flops, nelems and grid as
    numbers; a value it cannot take fails that scan, and the JSON path reads the batch: that
    value is NULL (TRY_CAST), the event's other fields and every other file are kept."""
    import shutil

    for f in (samples / "kineto_two_ranks").iterdir():
        shutil.copy(f, tmp_path / f.name)
    want = _tables(tmp_path)
    odd = {"ph": "X", "cat": "kernel", "name": "odd_args", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": odd_args}
    (tmp_path / "rank-2.json").write_text(json.dumps({"distributedInfo": {"rank": 2}, "traceEvents": [odd]}))
    from advisor.ingest import kineto

    scans = []
    real = kineto._events_sql
    monkeypatch.setattr(kineto, "_events_sql", lambda u, struct=False, numeric=False: scans.append(struct) or real(u, struct, numeric))
    got = _tables(tmp_path)
    assert scans[:2] == [True, False]  # the STRUCT scan failed, the JSON one read the batch
    assert [r for r in got["events"] if r[0] < 2] == want["events"]
    row = load_profile(tmp_path).con.execute(
        "SELECT corr, ext_id, flops, block_dim FROM events WHERE rank = 2").fetchall()
    column = {"correlation": 0, "External id": 1, "flops": 2, "grid": 3}
    for key, value in odd_args.items():
        ok = key != "grid" and isinstance(value, int) and value < 2**63  # a grid that is no list has no blocks
        assert row[0][column[key]] == (value if ok else None), key


@pytest.mark.slow
def test_batches_are_planned_on_the_uncompressed_size_not_the_object_limit(tmp_path: Path) -> None:
    """Small rank files share one scan up to ~1 GiB of uncompressed events: 300 files of 1 MiB
    are one batch (the 16 MiB floor of DuckDB's object limit once made them five); a gzip file
    counts its trailer's size; a file over the streaming size is left to the one-by-one reader."""
    from advisor.ingest import kineto
    from advisor.ingest.base import Unit

    def unit(p: Path) -> Unit:
        return Unit("kineto", [p], p, run_key=str(p), info={"form": "object"})

    body = b'{"traceEvents": [' + b" " * (1 << 20) + b"]}"
    small = []
    for i in range(300):
        p = tmp_path / f"rank-{i}.json"
        p.write_bytes(body)
        small.append(unit(p))
    batches = kineto._batches(small)
    assert [len(b) for b in batches] == [300]
    assert all(size == len(body) for b in batches for _i, _u, size in b)

    gz = tmp_path / "big.json.gz"
    gz.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (300 << 20) + b"]}", compresslevel=1))
    assert kineto._estimated_size(gz) == (300 << 20) + 19  # the trailer's size, not 20x the compressed one
    many = small + [unit(gz)]
    assert [len(b) for b in kineto._batches(many)] == [300]  # over STREAM_ABOVE_BYTES: read on its own

    # 1 GiB per batch: 1,100 files of 1 MiB make two
    sized = small * 4
    assert [len(b) for b in kineto._batches(sized[:1100])] == [1023, 77]


@pytest.mark.parametrize("batched", [pytest.param(True, id="True"), slow(False, id="False")])
def test_distributed_info_after_the_events_gives_rank_world_size_and_backend(tmp_path: Path, batched: bool,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace rewritten with its keys reordered carries distributedInfo after traceEvents: the rank
    (file names without one), world size and backend come from that trailing object; a gzip file's
    end is not read ahead (ranks then from the file order, with the usual warning)."""
    from advisor.analyze import analyze
    from advisor.ingest import kineto

    if not batched:
        monkeypatch.setattr(kineto, "load_many", lambda units, lctx: {})
    for name, r in (("host-a", 7), ("host-b", 3)):
        ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
               "ts": 1000.0 * s, "dur": 900.0, "args": {}} for s in range(3)]
        ev += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": i * 0.2 + r, "dur": 0.1,
                "args": {}} for i in range(2000)]  # beyond the first 64 KiB that claim() reads
        (tmp_path / f"{name}.pt.trace.json").write_text(
            json.dumps({"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 8}}))
    report = analyze(tmp_path)
    assert report.profile["ranks"] == [3, 7]
    assert report.profile["world_size"] == 8
    assert not any(w.code == "rank_guessed" for w in report.warnings)
    ctx = load_profile(tmp_path)
    assert ctx.con.execute("SELECT DISTINCT backend, rank_source FROM ranks").fetchall() == [("nccl", "distributedInfo")]
    for name in ("host-a", "host-b"):
        f = tmp_path / f"{name}.pt.trace.json"
        (tmp_path / f"{name}.pt.trace.json.gz").write_bytes(gzip.compress(f.read_bytes()))
        f.unlink()
    gz = analyze(tmp_path)
    assert gz.profile["ranks"] == [0, 1] and gz.profile["world_size"] == 8
    assert any(w.code == "rank_guessed" for w in gz.warnings)
    # read with the events, the trailing rank is checked against the order's: both differ, and say so
    late = sorted((w.path.rsplit("/", 1)[-1], w.message) for w in gz.warnings if w.code == "rank_mismatch")
    assert [p for p, _ in late] == ["host-a.pt.trace.json.gz", "host-b.pt.trace.json.gz"]
    assert "as rank 0 (from the order of the files), but the distributedInfo after its events names rank 7" in late[0][1]
    assert "names rank 3" in late[1][1]


def test_a_trace_of_begin_end_pairs_is_refused_saying_so(tmp_path: Path) -> None:
    """The Chrome format's 'B' / 'E' pairs (never written by Kineto) are not read: a trace made of
    them is refused with that reason, not as an empty trace; beside a good rank it is skipped."""
    ev = []
    for s in range(3):
        ev += [{"ph": "B", "name": f"ProfilerStep#{s}", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": s * 1100},
               {"ph": "E", "pid": 1, "tid": 1, "ts": s * 1100 + 1000}]
    (tmp_path / "rank-1.json").write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(InputError, match=r"only begin / end \('B' / 'E'\) pairs"):
        load_profile(tmp_path / "rank-1.json")
    (tmp_path / "rank-0.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}))
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0]
    assert any("'B' / 'E'" in w.message and w.path and w.path.endswith("rank-1.json") for w in ctx.warnings)
    (tmp_path / "rank-1.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(InputError, match="no timed events"):
        load_profile(tmp_path / "rank-1.json")


def test_begin_end_events_beside_complete_ones_are_counted_in_a_warning(tmp_path: Path) -> None:
    """A trace mixing complete ('X') events with 'B' / 'E' pairs (from a tool that post-processed
    a Kineto export, say): the complete events are read, and the 4 begin / end events that are
    not are counted in a warning naming the file instead of vanishing without a word."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 50},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 10},
          {"ph": "B", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 20},
          {"ph": "E", "pid": 1, "tid": 1, "ts": 30},
          {"ph": "B", "cat": "cpu_op", "name": "process_name", "pid": 1, "tid": 2, "ts": 20, "args": {"name": "x"}},
          {"ph": "E", "pid": 1, "tid": 2, "ts": 30},
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]
    path = _one_rank_trace(tmp_path, ev)
    ctx = load_profile(path)
    assert ctx.con.execute("SELECT name FROM events ORDER BY start_ns").fetchall() == [("ProfilerStep#0",), ("aten::mm",)]
    assert ctx.con.execute("SELECT tid, thread_name, process_name FROM tracks ORDER BY tid").fetchall() == [("1", "main", None)]
    warned = [w for w in ctx.warnings if "begin / end" in w.message]
    assert len(warned) == 1 and warned[0].message.startswith("4 begin / end") and warned[0].path.endswith("rank-0.json")
    ev = [e for e in ev if e["ph"] != "B" and e["ph"] != "E"]
    assert not any("begin / end" in w.message for w in load_profile(_one_rank_trace(tmp_path, ev)).warnings)


@pytest.mark.parametrize(("cat", "kind", "device"), [
    ("xpu_runtime", "runtime", False), ("xpu_driver", "runtime", False), ("cuda_driver", "runtime", False),
    ("privateuse1_runtime", "runtime", False), ("mtia_runtime", "runtime", False), ("hip_runtime", "runtime", False),
    ("privateuse1_driver", "other", False),  # device execution on some backends, host calls on others: not guessed
])
def test_runtime_categories_of_kineto_backends(tmp_path: Path, cat: str, kind: str, device: bool) -> None:
    """Kineto's host-side runtime / driver categories (libkineto ActivityType names) are launches."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 50, "args": {}},
          {"ph": "X", "cat": cat, "name": "zeCommandListAppendLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
           "args": {"correlation": 7}}]
    ctx = load_profile(_one_rank_trace(tmp_path, ev))
    assert ctx.con.execute("SELECT kind::VARCHAR, device, corr FROM events WHERE cat = ?", [cat]).fetchall() == [(kind, device, 7)]


def _cuda_sync_trace(tmp_path: Path) -> Path:
    """One step of one GPU rank as libkineto writes it with ``enable_cuda_sync_events``: kernel A
    on stream 7, then cudaEventRecord (correlation 4), cudaStreamWaitEvent (5) and B's launch (6)
    on the host; B on stream 20 waited for A; a collective on stream 30 ended inside that wait.
    The wait's ``cuda_sync`` record sits on the waiting stream's row with the recording stream and
    the record's correlation; a Context Sync record has neither, and an Event Sync whose record
    Kineto did not see has -1 for both."""
    rt = {"ph": "X", "cat": "cuda_runtime", "pid": 1, "tid": 1}
    k = {"ph": "X", "cat": "kernel", "pid": 0}

    def sync(name: str, ts: float, stream: int, corr: int, wait: tuple[int, int] | None) -> dict:
        args: dict = {"cuda_sync_kind": name}
        if wait is not None:
            args.update({"wait_on_stream": wait[0], "wait_on_cuda_event_record_corr_id": wait[1], "wait_on_cuda_event_id": 3})
        args.update({"stream": stream, "correlation": corr, "device": 0, "context": 1})
        return {"ph": "X", "cat": "cuda_sync", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": 1, "args": args}

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {**rt, "name": "cudaLaunchKernel", "ts": 10, "dur": 5, "args": {"cbid": 211, "correlation": 1}},
        {**rt, "name": "cudaLaunchKernel", "ts": 30, "dur": 5, "args": {"cbid": 211, "correlation": 2}},
        {**rt, "name": "cudaEventRecord", "ts": 40, "dur": 2, "args": {"cbid": 135, "correlation": 4}},
        {**rt, "name": "cudaStreamWaitEvent", "ts": 50, "dur": 2, "args": {"cbid": 147, "correlation": 5}},
        {**rt, "name": "cudaLaunchKernel", "ts": 60, "dur": 5, "args": {"cbid": 211, "correlation": 6}},
        {**k, "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "tid": 30, "ts": 20, "dur": 582,
         "args": {"device": 0, "stream": 30, "correlation": 1}},
        {**k, "name": "A", "tid": 7, "ts": 40, "dur": 560, "args": {"device": 0, "stream": 7, "correlation": 2}},
        {**k, "name": "B", "tid": 20, "ts": 605, "dur": 295, "args": {"device": 0, "stream": 20, "correlation": 6}},
        sync("Stream Wait Event", 50, 20, 5, (7, 4)),
        sync("Context Sync", 70, -1, 8, None),
        sync("Event Sync", 80, -1, 9, (-1, -1)),
    ]
    return _one_rank_trace(tmp_path, events)


@pytest.mark.parametrize("struct", [True, False], ids=["struct", "json_path"])
def test_cuda_sync_waits_are_read_and_followed(tmp_path: Path, struct: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded stream wait keeps its recording stream and record correlation (-1: NULL), by
    either reader; the critical path then runs B <- 5 µs 'waiting for computation' <- A, past the
    collective that ended later inside B's wait."""
    from advisor.analyze import analyze
    from advisor.ingest import kineto

    if not struct:
        monkeypatch.setattr(kineto, "LOWER_CASE_KEYS", (b'"ph"',))  # found in every file: the JSON path
    path = _cuda_sync_trace(tmp_path)
    rows = load_profile(path).con.execute(
        "SELECT name, kind, device, stream, corr, wait_stream, wait_corr FROM events WHERE cat = 'cuda_sync' ORDER BY corr"
    ).fetchall()
    assert rows == [("Stream Wait Event", "sync", True, 20, 5, 7, 4), ("Context Sync", "sync", True, -1, 8, None, None),
                    ("Event Sync", "sync", True, -1, 9, None, None)]
    ops = {o["name"]: o for o in analyze(path).critical_path["ops"]}
    assert ops["idle (waiting for computation)"]["total_us"] == pytest.approx(5.0)
    assert ops["A"]["total_us"] == pytest.approx(560.0)
    assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL" not in ops
