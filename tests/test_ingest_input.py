"""Input that does not surprise (issue #20): files without events take no rank, several runs in
one directory are not merged silently, every-file-bad errors name the files, one bad string
does not cost a trace, hostile operator names are escaped, symbolic links are said."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from advisor.engine.context import load_profile
from advisor.ingest.base import InputError

T0_US = 1_700_000_000_000_000  # 2023-11-14, µs since the epoch


def trace(rank: int | None = None, world: int | None = None, t0_us: int = T0_US, steps: int = 3,
          step_us: int = 10_000, names: tuple[str, ...] = ("aten::mm", "aten::add")) -> dict[str, Any]:
    """A small Kineto trace: ``steps`` ProfilerStep windows of ``step_us`` from ``t0_us``, each
    with one CPU operator, launch and kernel per name (kernel 800 µs, at +100 µs + 1 ms per name)."""
    ev: list[dict[str, Any]] = []
    for s in range(steps):
        t = t0_us + s * step_us
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": 1, "tid": 1,
                   "ts": t, "dur": step_us - 10, "args": {}})
        for i, n in enumerate(names):
            corr = s * 10 + i
            ev.append({"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": t + 10 + i * 1000,
                       "dur": 900, "args": {"External id": corr}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t + 20 + i * 1000, "dur": 50, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": f"k_{n}", "pid": 0, "tid": 7, "ts": t + 100 + i * 1000,
                       "dur": 800, "args": {"correlation": corr, "stream": 7}})
    doc: dict[str, Any] = {"schemaVersion": 1}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    doc["traceEvents"] = ev
    return doc


def write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def warned(ctx: Any, code: str) -> list[Any]:
    return [w for w in ctx.warnings if w.code == code]


# -- files without timed events ------------------------------------------------------------------

@pytest.mark.parametrize("empty", [
    {"schemaVersion": 1, "traceEvents": []},
    {"schemaVersion": 1, "deviceProperties": [{"name": "GPU"}]},
    {"schemaVersion": 1, "traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]},
])
def test_a_json_file_without_timed_events_takes_no_rank(tmp_path: Path, empty: dict[str, Any]) -> None:
    """``config.json`` sorts before ``trace.json``: numbered by order it took rank 0 and pushed
    the only real trace to rank 1. Now it is skipped by name and the trace is rank 0."""
    write(tmp_path / "config.json", empty)
    write(tmp_path / "trace.json", trace())
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0]
    assert ctx.con.execute("SELECT DISTINCT path FROM profile_files").fetchall() == [(str(tmp_path / "trace.json"),)]
    skipped = warned(ctx, "empty_trace")
    assert [w.path for w in skipped] == [str(tmp_path / "config.json")] and "no rank" in skipped[0].message
    assert not any(w.path and w.path.endswith("config.json") for w in warned(ctx, "rank_guessed"))


def test_a_gzip_file_with_an_empty_event_list_takes_no_rank(tmp_path: Path) -> None:
    write(tmp_path / "a.json.gz", {"schemaVersion": 1, "traceEvents": []})
    write(tmp_path / "b.json", trace())
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0]
    assert [w.path for w in warned(ctx, "empty_trace")] == [str(tmp_path / "a.json.gz")]


@pytest.mark.parametrize("name", ["big.json", "big.json.gz"])
def test_a_large_file_without_timed_events_takes_no_rank(tmp_path: Path, name: str) -> None:
    """Beyond the first 64 KiB the file is read on until a complete event shows: 3,000 metadata
    events and 2 begin / end ones (~270 KB) hold none, so the file takes no rank."""
    meta = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": f"thread {i} " + "x" * 40}}
            for i in range(3000)]
    be = [{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 1}, {"ph": "E", "name": "a", "pid": 1, "tid": 1, "ts": 2}]
    big = write(tmp_path / name, {"schemaVersion": 1, "traceEvents": meta + be})
    assert len(gzip.decompress(big.read_bytes()) if name.endswith(".gz") else big.read_bytes()) > 200_000
    write(tmp_path / "trace.json", trace())
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0]
    skipped = warned(ctx, "empty_trace")
    assert [w.path for w in skipped] == [str(big)] and "no rank" in skipped[0].message
    assert "begin / end" in skipped[0].message  # what the file holds instead


def test_a_large_trace_whose_first_complete_event_comes_late_keeps_its_rank(tmp_path: Path) -> None:
    """A complete event after 64 KiB of metadata: the file is a trace and keeps its rank."""
    doc = trace()
    doc["traceEvents"] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": "y" * 60}}
                          for i in range(2000)] + doc["traceEvents"]
    write(tmp_path / "rank-0.json", doc)
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0] and not warned(ctx, "empty_trace")


# -- every file bad ------------------------------------------------------------------------------

def test_when_every_file_is_bad_the_error_names_them(tmp_path: Path) -> None:
    for i in range(7):
        (tmp_path / f"rank-{i}.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    write(tmp_path / "empty.json", {"traceEvents": []})
    with pytest.raises(InputError) as exc:
        load_profile(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path))
    assert "8 files skipped" in msg
    # sorted by name, the first five named with their problem, the other three counted
    assert [n for n in ("empty.json", "rank-0.json", "rank-1.json", "rank-2.json", "rank-3.json") if n in msg] == [
        "empty.json", "rank-0.json", "rank-1.json", "rank-2.json", "rank-3.json"]
    assert "rank-4.json" not in msg and "and 3 more" in msg
    assert "no timed events" in msg and "not a readable Kineto trace" in msg


def test_files_without_a_rank_are_named_with_why_they_were_skipped(tmp_path: Path) -> None:
    """Their ranks were guessed by order before they failed: the error gives the failure."""
    (tmp_path / "a.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    (tmp_path / "b.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    with pytest.raises(InputError) as exc:
        load_profile(tmp_path)
    assert str(exc.value).count("(not a readable Kineto trace") == 2 and "by order" not in str(exc.value)


def test_one_bad_file_alone_is_named_with_its_problem(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    with pytest.raises(InputError, match=r"rank-0\.json: not a readable Kineto trace"):
        load_profile(tmp_path)


# -- bad strings ---------------------------------------------------------------------------------

def _bad_names(tmp_path: Path, how: str, name: str = "rank-0.json") -> tuple[Path, int]:
    """A trace (rank 0 of 2) whose first step's two CPU operator names are made invalid
    (``how``): lone surrogate escapes, or bytes that are not UTF-8; the number of bad sequences put in."""
    doc = trace(rank=0, world=2)
    doc["traceEvents"][1]["name"] = "BAD1"
    doc["traceEvents"][4]["name"] = "BAD2"
    text = json.dumps(doc).encode()
    if how == "surrogate":  # a lone high half, a lone low half; a valid pair and an escaped backslash stay
        text = text.replace(b"BAD1", b"\\ud800x").replace(b"BAD2", b"ok\\udc00")
        text = text.replace(b'"k_aten::mm"', b'"k\\ud83d\\ude00\\\\ud800"', 1)
        n = 2
    else:  # two bytes that start no UTF-8 sequence, a lead byte followed by ASCII
        text = text.replace(b"BAD1", b"a\xff\xfeb").replace(b"BAD2", b"\xc3(")
        n = 3
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return path, n


@pytest.mark.parametrize("how", ["surrogate", "bytes"])
@pytest.mark.parametrize("name", ["rank-0.json", "rank-0.json.gz"])
def test_a_bad_operator_name_costs_the_name_not_the_trace(tmp_path: Path, how: str, name: str) -> None:
    path, n = _bad_names(tmp_path, how, name)
    ctx = load_profile(path)
    # every event of the trace is there: 3 steps x (1 marker + 2 x 3 events)
    assert ctx.con.execute("SELECT count(*) FROM events").fetchall() == [(21,)]
    names = {r[0] for r in ctx.con.execute("SELECT DISTINCT name FROM events WHERE kind = 'host_op'").fetchall()}
    bad = sorted(names - {"aten::mm", "aten::add"})  # the first step's two names; the later steps' are good
    if how == "surrogate":
        assert bad == sorted(["\ufffdx", "ok\ufffd"])
        kernels = {r[0] for r in ctx.con.execute("SELECT DISTINCT name FROM events WHERE kind = 'kernel'").fetchall()}
        assert "k\U0001f600\\ud800" in kernels  # the pair decoded, the escaped backslash kept
    else:
        assert bad == sorted(["a\ufffd\ufffdb", "\ufffd("])
    (w,) = warned(ctx, "bad_strings")
    assert w.path == str(path) and w.message.startswith(f"{n} invalid UTF-8")


def test_bad_strings_in_one_file_of_a_batch_leave_the_others_untouched(tmp_path: Path) -> None:
    _bad_names(tmp_path, "bytes", "rank-0.json")
    write(tmp_path / "rank-1.json", trace(rank=1, world=2))
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0, 1]
    assert ctx.con.execute("SELECT rank, count(*) FROM events GROUP BY rank ORDER BY rank").fetchall() == [
        (0, 21), (1, 21)]
    assert [w.path for w in warned(ctx, "bad_strings")] == [str(tmp_path / "rank-0.json")]


def test_a_trace_with_no_bad_string_gets_no_such_warning(tmp_path: Path) -> None:
    ctx = load_profile(write(tmp_path / "rank-0.json", trace(rank=0, world=1)))
    assert not warned(ctx, "bad_strings")


# -- symbolic links ------------------------------------------------------------------------------

def _linked(tmp_path: Path) -> Path:
    """``prof/`` holds only links to two rank files and to their directory kept elsewhere."""
    real = tmp_path / "real"
    write(real / "rank-0.json", trace(rank=0, world=2))
    write(real / "rank-1.json", trace(rank=1, world=2))
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "rank-0.json").symlink_to(real / "rank-0.json")
    (prof / "rank-1.json").symlink_to(real / "rank-1.json")
    (prof / "all").symlink_to(real, target_is_directory=True)
    return prof


def test_a_directory_of_links_says_how_many_were_skipped_and_why(tmp_path: Path) -> None:
    prof = _linked(tmp_path)
    with pytest.raises(InputError) as exc:
        load_profile(prof)
    msg = str(exc.value)
    assert msg.startswith(f"{prof}: empty directory") and "3 symbolic links pointing outside it skipped" in msg
    assert "--follow-symlinks" in msg and "\n" not in msg


def test_links_are_followed_on_request_each_file_read_once(tmp_path: Path) -> None:
    prof = _linked(tmp_path)
    (prof / "loop").symlink_to(prof, target_is_directory=True)  # inside: followed, reached twice, skipped
    ctx = load_profile(prof, follow_symlinks=True)
    assert ctx.ranks == [0, 1]
    assert ctx.con.execute("SELECT count(*) FROM profile_files").fetchall() == [(2,)]
    assert sorted(Path(w.path).name for w in warned(ctx, "link_twice")) == ["rank-0.json", "rank-1.json"]
    assert [w.path for w in warned(ctx, "link_loop")] == [str(prof / "loop")]
    assert not warned(ctx, "link_outside")


def test_links_beside_real_traces_are_counted_in_a_warning(tmp_path: Path) -> None:
    prof = _linked(tmp_path)
    write(prof / "rank-2.json", trace(rank=2, world=3))
    (prof / "rank-0.json").unlink()
    (prof / "rank-1.json").unlink()
    (prof / "all").unlink()
    write(prof / "rank-0.json", trace(rank=0, world=3))
    write(prof / "rank-1.json", trace(rank=1, world=3))
    (prof / "other").symlink_to(tmp_path / "real", target_is_directory=True)
    ctx = load_profile(prof)
    assert ctx.ranks == [0, 1, 2]
    summary = [w for w in warned(ctx, "link_outside") if w.path == str(prof)]
    assert len(summary) == 1 and summary[0].message.startswith("1 symbolic link pointing outside")


def test_cli_follow_symlinks(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from advisor import cli
    from tests.conftest import validate_report

    prof = _linked(tmp_path)
    res = CliRunner().invoke(cli.main, ["analyze", str(prof), "--format", "json"])
    assert res.exit_code == 2 and "3 symbolic links pointing outside it skipped" in res.output
    res = CliRunner().invoke(cli.main, ["analyze", str(prof), "--format", "json", "--follow-symlinks"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    validate_report(report)
    assert report["profile"]["ranks"] == [0, 1]


# -- hostile operator names in an Ascend export ------------------------------------------------

PAYLOADS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "</svg><script>")
SAMPLE_PROFILES = Path(__file__).resolve().parents[1] / "sample_profiles"


def _heaviest(totals: dict[str, float], n: int) -> list[str]:
    return [name for name, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:n]]


def _hostile_timeline(tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of the torch_npu timeline sample whose heaviest CANN operator and two heaviest
    device operators ('Ascend Hardware' process; by total duration in the trace) carry the
    payloads as their names; the names replaced."""
    src = SAMPLE_PROFILES / "ascend_pt_timeline" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json.gz"
    events = json.loads(gzip.decompress(src.read_bytes()))
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    heavy = []
    for lane, n in (("CANN", 1), ("Ascend Hardware", 2)):
        totals: dict[str, float] = {}
        for e in events:
            if e.get("ph") == "X" and process.get(e["pid"]) == lane:
                totals[e["name"]] = totals.get(e["name"], 0.0) + float(e.get("dur", 0))
        heavy += _heaviest(totals, n)
    for e in events:
        if e.get("name") in heavy:
            e["name"] = PAYLOADS[heavy.index(e["name"])]
    root = tmp_path / "host_1_20231109113342123_ascend_pt"
    write(root / "ASCEND_PROFILER_OUTPUT" / "trace_view.json.gz", events)
    return root, heavy


def _hostile_kernels(tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of the torch_npu kernel table sample whose three heaviest kernels (by total
    Duration(us)) carry the payloads as their Name."""
    import csv
    import io

    src = SAMPLE_PROFILES / "ascend_pt_kernels" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    rows = list(csv.reader(io.StringIO(src.read_text())))
    name_col, dur_col = rows[0].index("Name"), rows[0].index("Duration(us)")
    totals: dict[str, float] = {}
    for r in rows[1:]:
        totals[r[name_col]] = totals.get(r[name_col], 0.0) + float(r[dur_col])
    heavy = _heaviest(totals, len(PAYLOADS))
    for r in rows[1:]:
        if r[name_col] in heavy:
            r[name_col] = PAYLOADS[heavy.index(r[name_col])]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    root = tmp_path / "host_1_20231109113342123_ascend_pt"
    (root / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (root / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").write_text(out.getvalue())
    return root, heavy


@pytest.mark.parametrize("make", [pytest.param(_hostile_timeline, marks=pytest.mark.slow), _hostile_kernels],
                         ids=["timeline", "kernel_details"])
def test_hostile_ascend_operator_names_are_escaped_in_html(tmp_path: Path, make: Any) -> None:
    from markupsafe import escape

    from advisor.analyze import analyze
    from advisor.render.html import render
    from tests.conftest import report_json

    root, heavy = make(tmp_path)
    report = analyze(root)
    data = report_json(report)
    shown = json.dumps(data)
    html = render(report)
    for payload, original in zip(PAYLOADS, heavy, strict=True):
        assert json.dumps(payload)[1:-1] in shown, f"{original} replaced by {payload!r} is not in the report"
        assert payload not in html
        assert str(escape(payload)) in html, f"{payload!r} (was {original}) is not shown escaped"
    assert "<script>alert" not in html and "<img" not in html and "</svg><script>" not in html


# -- several runs in one directory ---------------------------------------------------------------

DAY_US = 86_400 * 10**6


def _paths(ctx: Any) -> list[str]:
    return [r[0] for r in ctx.con.execute("SELECT path FROM profile_files ORDER BY path").fetchall()]


def test_split_runs_by_world_size_and_overlap() -> None:
    from advisor.ingest.runs import Span, split_runs

    def s(label: str, rank: int, world: int | None, start: int, end: int) -> Span:
        return Span(label, rank, world, start, end)

    # cycles of one run: rank files follow each other in time, one world size: one run
    cycles = [s("c/r0.1", 0, 2, 0, 10), s("c/r1.1", 1, 2, 1, 11), s("c/r0.2", 0, 2, 20, 30), s("c/r1.2", 1, 2, 21, 31)]
    assert [[x.label for x in r] for r in split_runs(cycles)] == [["c/r0.1", "c/r0.2", "c/r1.1", "c/r1.2"]]
    # two world sizes: two runs, ordered by start
    two = [s("b/r0", 0, 1, 5, 9), s("a/r0", 0, 2, 10, 20), s("a/r1", 1, 2, 10, 20)]
    assert [[x.label for x in r] for r in split_runs(two)] == [["b/r0"], ["a/r0", "a/r1"]]
    # a trace naming no world size joins the one world size named
    assert len(split_runs([s("a/r0", 0, 2, 0, 10), s("a/r1", 1, None, 0, 10)])) == 1
    # same ranks over overlapping times: two runs, each rank file with the run of its directory
    concurrent = [s("a/r0", 0, 2, 0, 10), s("b/r0", 0, 2, 1, 12), s("b/r1", 1, 2, 2, 12), s("a/r1", 1, 2, 3, 10)]
    assert [[x.label for x in r] for r in split_runs(concurrent)] == [["a/r0", "a/r1"], ["b/r0", "b/r1"]]


def _two_world_sizes(root: Path) -> Path:
    write(root / "a" / "rank-0.json", trace(rank=0, world=2))
    write(root / "a" / "rank-1.json", trace(rank=1, world=2))
    write(root / "b" / "rank-0.json", trace(rank=0, world=1, t0_us=T0_US + DAY_US))
    return root


def _concurrent(root: Path) -> Path:
    """Two runs of world size 2 profiled at the same time (two jobs): a/ with 10 ms steps, b/ with 12 ms."""
    for r in (0, 1):
        write(root / "a" / f"rank-{r}.json", trace(rank=r, world=2))
        write(root / "b" / f"rank-{r}.json", trace(rank=r, world=2, t0_us=T0_US + 5_000, step_us=12_000))
    return root


@pytest.mark.parametrize("make", [_two_world_sizes, _concurrent], ids=["world_sizes", "same_ranks_overlapping"])
def test_two_runs_are_refused_listing_each_runs_files(tmp_path: Path, make: Any) -> None:
    root = make(tmp_path)
    with pytest.raises(InputError) as exc:
        load_profile(root)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{root}: 2 runs in one directory")
    run1, run2 = msg.split("; run 2 ")
    assert "run 1 (world size 2, 2 ranks, from 2023-11-14 22:13:20 UTC): a/rank-0.json, a/rank-1.json" in run1
    assert "b/rank-0.json" in run2 and "--run N" in run2


def test_run_n_picks_one_run(tmp_path: Path) -> None:
    root = _concurrent(tmp_path / "c")
    ctx = load_profile(root, run=2)
    assert _paths(ctx) == [str(root / "b" / "rank-0.json"), str(root / "b" / "rank-1.json")]
    assert ctx.ranks == [0, 1]
    # b/'s steps: ProfilerStep windows 12 ms apart, each 11.99 ms long
    assert ctx.con.execute("SELECT DISTINCT end_ns - start_ns FROM steps WHERE step < 3").fetchall() == [(12_000_000,)]
    assert not warned(ctx, "duplicate_rank")
    (chosen,) = warned(ctx, "run_chosen")
    assert chosen.message.startswith("run 2 of the 2 runs")
    ctx = load_profile(_two_world_sizes(tmp_path / "w"), run=2)
    assert _paths(ctx) == [str(tmp_path / "w" / "b" / "rank-0.json")]
    with pytest.raises(InputError, match=r"--run 3: the directory holds 2 runs"):
        load_profile(root, run=3)


def test_profiler_cycles_of_one_run_stay_merged(tmp_path: Path) -> None:
    """Two cycles per rank, one world size: one run, four files, two ranks, no warning about runs."""
    for r in (0, 1):
        write(tmp_path / f"rank-{r}.cycle1.json", trace(rank=r, world=2))
        write(tmp_path / f"rank-{r}.cycle2.json", trace(rank=r, world=2, t0_us=T0_US + 60 * 10**6))
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0, 1] and len(_paths(ctx)) == 4
    assert not [w for w in ctx.warnings if w.code in ("other_run", "duplicate_rank", "run_chosen")]
    with pytest.raises(InputError, match=r"--run 2: the profile holds one run only"):
        load_profile(tmp_path, run=2)
    assert len(_paths(load_profile(tmp_path, run=1))) == 4


def test_a_trace_from_another_run_among_the_rank_files_is_named(tmp_path: Path) -> None:
    """old/rank-1.json: same world size, three days before the others: merged as today, and named."""
    write(tmp_path / "rank-0.json", trace(rank=0, world=2))
    write(tmp_path / "rank-1.json", trace(rank=1, world=2))
    write(tmp_path / "old" / "rank-1.json", trace(rank=1, world=2, t0_us=T0_US - 3 * DAY_US))
    ctx = load_profile(tmp_path)
    (w,) = warned(ctx, "other_run")
    assert w.path == str(tmp_path / "old" / "rank-1.json") and "2023-11-11 22:13:20 UTC" in w.message


def test_a_copy_of_a_rank_file_is_still_dropped_not_a_second_run(tmp_path: Path) -> None:
    write(tmp_path / "rank-0.json", trace(rank=0, world=2))
    write(tmp_path / "rank-1.json", trace(rank=1, world=2))
    write(tmp_path / "copy" / "rank-0.json", trace(rank=0, world=2))
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0, 1] and len(_paths(ctx)) == 2
    assert len(warned(ctx, "duplicate_rank")) == 1


@pytest.mark.slow
def test_cli_refuses_two_runs_with_exit_2_and_run_picks_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from advisor import cli
    from tests.conftest import validate_report

    root = _two_world_sizes(tmp_path)
    res = CliRunner().invoke(cli.main, ["analyze", str(root), "--format", "json"])
    assert res.exit_code == 2 and "2 runs in one directory" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli.main, ["analyze", str(root), "--format", "json", "--run", "1"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    validate_report(report)
    assert report["profile"]["ranks"] == [0, 1] and report["profile"]["world_size"] == 2
    # --run is the profile's: a baseline of one run is read whole
    base = write(tmp_path / "base" / "rank-0.json", trace(rank=0, world=1)).parent
    res = CliRunner().invoke(cli.main, ["analyze", str(root), "--format", "json", "--run", "2", "--baseline", str(base)])
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["profile"]["ranks"] == [0]


# -- Kineto and Ascend in one directory ----------------------------------------------------------

def test_kineto_beside_an_ascend_export_is_named_when_not_used(tmp_path: Path) -> None:
    import shutil

    export = tmp_path / "host_1_20231109113342123_ascend_pt"
    shutil.copytree(SAMPLE_PROFILES / "ascend_pt_kernels", export)
    write(tmp_path / "rank-0.json", trace(rank=0, world=1))
    ctx = load_profile(tmp_path)
    assert ctx.sources == ["ascend_pt"] and ctx.ranks == [0]
    (w,) = warned(ctx, "source_unused")
    assert w.path == str(tmp_path / "rank-0.json") and w.message.startswith("Kineto trace not analysed")
    # two Kineto ranks outnumber the one Ascend export: they are analysed, the export is named
    write(tmp_path / "rank-1.json", trace(rank=1, world=2))
    write(tmp_path / "rank-0.json", trace(rank=0, world=2))
    ctx = load_profile(tmp_path)
    assert ctx.sources == ["kineto"] and ctx.ranks == [0, 1]
    (w,) = warned(ctx, "source_unused")
    assert w.path == str(export) and w.message.startswith("Ascend trace not analysed")


def test_a_small_deeply_nested_file_is_judged_by_the_scan_not_the_claim(tmp_path: Path) -> None:
    """Python's JSON parser gives up on 20,000 nested lists (RecursionError): the claim leaves the
    file to the reader, which reads or refuses it with a warning; rank 0 is analysed."""
    write(tmp_path / "rank-0.json", trace(rank=0, world=2))
    (tmp_path / "rank-1.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "args": {"a": '
                                          + "[" * 20_000 + "]" * 20_000 + "}}]}")
    ctx = load_profile(tmp_path)
    assert 0 in ctx.ranks
