"""Bad and hostile input for the Ascend readers (issue 6): every case is built from the real samples,
loaded through ``load_profile``, and must end in a warning naming the file (the rest still loaded)
or a clean InputError, never an unhandled exception."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
import sys
from pathlib import Path

import pytest

from advisor.engine.context import load_profile
from advisor.ingest.base import InputError

SAMPLES = Path(__file__).resolve().parents[2] / "sample_profiles"
TRACE = Path(__file__).resolve().parents[1] / "data" / "ascend" / "ascend_pt_timeline" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
KD = SAMPLES / "ascend_pt_kernels" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"


def export(tmp_path: Path, files: dict[str, bytes | str], name: str = "host_1_20240102103151123_ascend_pt") -> Path:
    """An export folder with the given files under ASCEND_PROFILER_OUTPUT (or at its root for profiler_*.json)."""
    root = tmp_path / "prof" / name
    for fname, data in files.items():
        d = root if fname.startswith("profiler_") else root / "ASCEND_PROFILER_OUTPUT"
        d.mkdir(parents=True, exist_ok=True)
        (d / fname).write_bytes(data.encode() if isinstance(data, str) else data)
    return tmp_path / "prof"


def kd_rows() -> tuple[list[str], list[list[str]]]:
    with KD.open(newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def write_csv(header: list[str], rows: list[list[str]], delim: str = ",", eol: str = "\r\n") -> str:
    buf = io.StringIO()
    # Python 3.10 refuses a NUL cell unless an escapechar is set (3.11+ writes it as is)
    esc = {"escapechar": "\\"} if sys.version_info < (3, 11) else {}
    csv.writer(buf, delimiter=delim, lineterminator=eol, **esc).writerows([header, *rows])
    return buf.getvalue()


def codes(ctx) -> set[str]:
    return {w.code for w in ctx.warnings}


def test_kernel_details_crlf_tabs_na_and_non_numeric(tmp_path):
    header, rows = kd_rows()
    i_start, i_block = header.index("Start Time(us)"), header.index("Block Dim")
    rows = [list(r) for r in rows[:50]]
    for r in rows:
        r[i_start] += "\t"  # CANN's trailing tab (format doc §3.3)
    rows[3][i_block] = "lots"  # non-numeric cell -> NULL, row kept
    ctx = load_profile(export(tmp_path, {"kernel_details.csv": "\ufeff" + write_csv(header, rows)}))
    con = ctx.con
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 50
    assert con.execute("SELECT count(*) FROM kernels WHERE block_dim IS NULL").fetchone()[0] == 1
    first = rows[0][i_start].strip()
    whole, frac = first.split(".")
    assert con.execute("SELECT min(start_ns) FROM kernels WHERE name = ?", [rows[0][4]]).fetchone()[0] == int(
        whole
    ) * 1000 + int(frac.ljust(3, "0"))


def test_kernel_details_missing_and_extra_columns_and_tabs(tmp_path):
    header, rows = kd_rows()
    keep = [i for i, h in enumerate(header) if h not in ("Block Dim", "Input Formats")]
    h2 = [header[i] for i in keep] + ["Some New Metric"]
    r2 = [[r[i] for i in keep] + ["1.5"] for r in rows[:20]]
    r2[0] = r2[0][:-6]  # a short row: missing cells become NULL
    ctx = load_profile(export(tmp_path, {"kernel_details.csv": write_csv(h2, r2, delim="\t", eol="\n")}))
    con = ctx.con
    assert con.execute("SELECT count(*), count(block_dim) FROM kernels").fetchone() == (20, 0)
    pmu = con.execute("SELECT pmu FROM kernels WHERE pmu IS NOT NULL LIMIT 1").fetchone()[0]
    assert "Some New Metric" in json.loads(pmu)


def test_kernel_details_without_required_column_is_skipped(tmp_path):
    header, rows = kd_rows()
    i = header.index("Start Time(us)")
    h2 = header[:i] + header[i + 1 :]
    r2 = [r[:i] + r[i + 1 :] for r in rows[:5]]
    root = export(tmp_path, {"kernel_details.csv": write_csv(h2, r2), "trace_view.json": TRACE.read_bytes()})
    ctx = load_profile(root)
    bad = [w for w in ctx.warnings if w.path and w.path.endswith("kernel_details.csv")]
    assert bad and "Start Time(us)" in bad[0].message
    assert ctx.con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0  # from the timeline instead


@pytest.mark.parametrize(("extra", "why"), [(600, "columns in its header, more than the 512 read"),
                                             (20_000, "header line is longer than 64 KiB")])
def test_too_wide_kernel_details_is_one_warning(tmp_path, extra, why):
    """Issue 33: thousands of ``*_fops`` columns (one FLOPs sum term each) are refused up front
    with one line naming the file, not a DuckDB "Max expression depth" error; the rest loads."""
    header, rows = kd_rows()
    names = [f"x{i}_fops" for i in range(extra - len(header))]
    csv_text = write_csv(header + names, [r + ["1"] * len(names) for r in rows[:5]])
    root = export(tmp_path, {"kernel_details.csv": csv_text, "trace_view.json": TRACE.read_bytes()})
    ctx = load_profile(root)
    bad = [w for w in ctx.warnings if w.path and w.path.endswith("kernel_details.csv")]
    assert len(bad) == 1 and why in bad[0].message and "\n" not in bad[0].message
    assert ctx.con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0  # from the timeline instead


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_timeline_keeps_the_rest(tmp_path, cut):
    raw = TRACE.read_bytes()
    root = export(tmp_path, {"trace_view.json": raw[: int(len(raw) * cut)], "kernel_details.csv": KD.read_bytes()})
    ctx = load_profile(root)
    assert any(w.path and w.path.endswith("trace_view.json") for w in ctx.warnings)
    assert "partial_export" in codes(ctx)
    assert ctx.con.execute("SELECT count(*) FROM events WHERE device").fetchone()[0] == len(kd_rows()[1])


def test_hostile_event_values_are_dropped_with_a_warning(tmp_path):
    ev = json.loads(TRACE.read_text())
    xs = [e for e in ev if e["ph"] == "X"]
    xs[0]["ts"] = "1e300"
    xs[1]["ts"] = "NaN"
    xs[2]["dur"] = -5
    del xs[3]["ts"]
    xs[4]["name"] = "x" * 100_000
    xs[5]["args"] = ["not", "an", "object"]
    xs[6]["args"] = {"a": {"b": {"c": {"d": {"e": [[[[1]]]]}}}}}
    ev.append({"ph": "Z", "name": "unknown phase", "pid": 1, "tid": 1, "ts": "1.000"})
    ctx = load_profile(export(tmp_path, {"trace_view.json": json.dumps(ev)}))
    msgs = [w.message for w in ctx.warnings if w.code == "bad_events"]
    assert any("3 events without a usable ts/dur" in m for m in msgs), msgs
    assert any("negative duration" in m for m in msgs)
    n_x = sum(1 for e in ev if e["ph"] == "X")
    overlap = sum(1 for e in xs if e["pid"] == 4376751100)
    assert ctx.con.execute("SELECT count(*) FROM events").fetchone()[0] == n_x - overlap - 4
    # the 100,000-character name is cut to 4,096 and marked with its length and md5 prefix
    mark = "x" * 4096 + f"…[cut: 100000 chars, #{hashlib.md5(b'x' * 100_000).hexdigest()[:8]}]"
    assert ctx.con.execute("SELECT count(*) FROM events WHERE name = ?", [mark]).fetchone()[0] == 1
    assert ctx.con.execute("SELECT max(length(name)) FROM events").fetchone()[0] == len(mark)
    assert [w.path for w in ctx.warnings if w.code == "long_names"] == [
        str(tmp_path / "prof" / "host_1_20240102103151123_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")]


def test_long_names_cut_in_a_timeline(tmp_path):
    """A 10,000-character operator, category and thread name are cut at 4,096 characters."""
    ev = json.loads(TRACE.read_text())
    xs = [e for e in ev if e["ph"] == "X"]
    long = "op" * 5_000
    xs[0]["name"] = long
    xs[1]["cat"] = "c" * 10_000
    ev.append({"ph": "M", "name": "thread_name", "pid": xs[2]["pid"], "tid": xs[2]["tid"], "args": {"name": "t" * 10_000}})
    ctx = load_profile(export(tmp_path, {"trace_view.json": json.dumps(ev)}))
    want = long[:4096] + f"…[cut: 10000 chars, #{hashlib.md5(long.encode()).hexdigest()[:8]}]"
    assert ctx.con.execute("SELECT name FROM events WHERE length(name) > 4096").fetchall() == [(want,)]
    assert ctx.con.execute("SELECT max(length(cat)) FROM events").fetchone()[0] < 4200
    assert ctx.con.execute("SELECT thread_name FROM tracks WHERE length(thread_name) > 4096").fetchall() == [
        ("t" * 4096 + f"…[cut: 10000 chars, #{hashlib.md5(b't' * 10_000).hexdigest()[:8]}]",)]
    assert sum(w.code == "long_names" for w in ctx.warnings) == 1


def _capped_timeline(n: int) -> bytes:
    """``n`` trace events, then bytes that are not JSON, then a valid end: read to its end, the
    timeline is malformed; a read that stops after a few hundred events never sees the bad bytes."""
    ev = b",".join(
        json.dumps({"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": f"{1000 + i}.000", "dur": 0.5}).encode()
        for i in range(n)
    )
    return b"[" + ev + b",NOT JSON AT ALL," + ev + b"]"


def test_max_events_stops_the_timeline_read(tmp_path):
    root = export(tmp_path, {"trace_view.json": _capped_timeline(30_000)})
    with pytest.raises(InputError, match="not a readable"):  # read to its end, the file is refused as malformed
        load_profile(root)
    with pytest.raises(InputError, match=r"more than 300 events \(--max-events 300\): refused"):
        load_profile(root, max_events=300)


def test_max_events_in_a_batch_refuses_only_the_big_timeline(tmp_path):
    """Read together, the batch reaches its limit: each timeline is read again on its own."""
    big = export(tmp_path, {"trace_view.json": _capped_timeline(30_000)}, name="host_1_20240102103151123_ascend_pt")
    export(tmp_path, {"trace_view.json": TRACE.read_bytes()}, name="host_2_20240102103151124_ascend_pt")
    ctx = load_profile(big, max_events=300 + len(json.loads(TRACE.read_text())))
    assert any(w.code == "too_big" and "host_1" in (w.path or "") for w in ctx.warnings), ctx.warnings
    assert ctx.con.execute("SELECT count(*) FROM events").fetchone()[0] > 0


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x01\x02garbage\xff" * 50,
        b'{"traceEvents": []}',
        b"[",
        b"[]",
        '[{"ph": "X", "name": "é"}]'.encode("latin-1"),
    ],
    ids=["empty", "binary", "object", "open_bracket", "empty_array", "latin1"],
)
def test_broken_timeline_alone_gives_a_clean_error_or_warning(tmp_path, data):
    root = export(tmp_path, {"trace_view.json": data, "profiler_info_0.json": json.dumps({"rank_id": 0})})
    try:
        ctx = load_profile(root)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert ctx.warnings  # something was said about the file


def test_bom_and_crlf_timeline(tmp_path):
    text = TRACE.read_text().replace("\n", "\r\n")
    ctx = load_profile(export(tmp_path, {"trace_view.json": "\ufeff" + text}))
    ref = load_profile(SAMPLES / "ascend_pt_timeline")
    q = "SELECT kind, count(*), sum(dur_ns) FROM events GROUP BY kind ORDER BY kind"
    assert ctx.con.execute(q).fetchall() == ref.con.execute(q).fetchall()


def test_bad_communication_json_keeps_the_rest(tmp_path):
    root = export(
        tmp_path,
        {
            "trace_view.json": TRACE.read_bytes(),
            "communication.json": b'{"step1": {"collective": {"hcom_x@1": {"Communication Time Info": ',
            "communication_matrix.json": b'["not", "an", "object"]',
            "step_trace_time.csv": "Device_id,Step,Computing,Free\r\n0,1,abc,\t12.5\t\r\n",
        },
    )
    ctx = load_profile(root)
    paths = {w.path for w in ctx.warnings}
    assert any(p and p.endswith("communication.json") for p in paths)
    assert any(p and p.endswith("communication_matrix.json") for p in paths)
    assert ctx.con.execute("SELECT count(*) FROM events").fetchone()[0] > 0
    assert ctx.con.execute("SELECT step, computing_ns, free_ns FROM vendor_steps").fetchall() == [(1, None, 12_500)]


def test_corrupt_and_foreign_sqlite(tmp_path):
    good = tmp_path / "g.db"
    con = sqlite3.connect(good)
    con.execute("CREATE TABLE unrelated (a INTEGER)")
    con.commit()
    con.close()
    root = export(tmp_path, {"ascend_pytorch_profiler_3.db": good.read_bytes()})
    with pytest.raises(InputError):
        load_profile(root)
    root2 = export(tmp_path / "b", {"ascend_pytorch_profiler_3.db": b"SQLite format 3\x00" + b"\xff" * 5000})
    with pytest.raises(InputError) as exc:
        load_profile(root2)
    assert "\n" not in str(exc.value)


def test_two_exports_claiming_one_rank_keep_the_newest(tmp_path):
    info = json.dumps({"rank_id": 0})
    export(
        tmp_path,
        {"trace_view.json": TRACE.read_bytes(), "profiler_info_0.json": info},
        "h_1_20240102103151123_ascend_pt",
    )
    export(
        tmp_path,
        {"kernel_details.csv": KD.read_bytes(), "profiler_info_0.json": info},
        "h_2_20240103103151123_ascend_pt",
    )
    ctx = load_profile(tmp_path / "prof")
    assert ctx.ranks == [0]
    dup = [w for w in ctx.warnings if w.code == "duplicate_rank"]
    assert len(dup) == 1 and "h_1_" in dup[0].path
    assert ctx.sources == ["ascend_pt"]  # the skipped export's timeline is not read as another format either
    assert ctx.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == len(kd_rows()[1])


def test_nothing_recognisable(tmp_path):
    d = tmp_path / "prof" / "x_1_20240102103151123_ascend_pt"
    d.mkdir(parents=True)
    (d / "profiler_info_0.json").write_text(json.dumps({"rank_id": 0}))
    (tmp_path / "prof" / "notes.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError):
        load_profile(tmp_path / "prof")


def test_loose_files_recognised_by_content(tmp_path):
    (tmp_path / "anything.csv").write_bytes(KD.read_bytes())  # header has 'Accelerator Core'
    (tmp_path / "timeline.json").write_bytes(TRACE.read_bytes())  # a JSON array with Ascend process names
    ctx = load_profile(tmp_path)
    assert ctx.ranks == [0] and ctx.sources == ["ascend_pt"]
    assert ctx.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == len(kd_rows()[1])


@pytest.mark.slow
def test_csv_fuzz_never_crashes(tmp_path_factory):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    header, rows = kd_rows()
    cells = st.one_of(
        st.text(max_size=12), st.sampled_from(["N/A", "", "1e300", "nan", "-1", "\t3.5\t", '"1,2"', "\x00"])
    )

    @hypothesis.settings(max_examples=25, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.lists(st.lists(cells, min_size=0, max_size=len(header) + 3), min_size=1, max_size=8))
    def run(garbage):
        tmp = tmp_path_factory.mktemp("fuzz")
        text = write_csv(header, [list(r) for r in rows[:3]] + garbage)
        try:
            ctx = load_profile(export(tmp, {"kernel_details.csv": text}))
        except InputError:
            return
        n = ctx.con.execute("SELECT count(*) FROM kernels").fetchone()[0]
        assert 0 <= n <= 3 + len(garbage)

    run()
