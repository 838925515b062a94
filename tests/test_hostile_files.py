"""Hostile profiles (issue #33): file names that DuckDB would expand as globs read only
themselves, gzip bombs of every trace form are refused, ``--max-events`` stops the read,
long names are cut at load, and a folder of too many trace files is refused at once. Every
hostile input is built here, in ``tmp_path``."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from advisor.engine.context import load_profile
from advisor.ingest.base import NAME_MAX, InputError, duckdb_name, duckdb_path
from advisor.ingest.jsonstream import MIN_LIMIT

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000_000  # µs since the epoch


def events(name: str = "aten::mm", steps: int = 2, kernel: str = "k_mm") -> list[dict[str, Any]]:
    """Two steps, each with one operator, its launch and its kernel."""
    ev: list[dict[str, Any]] = []
    for s in range(steps):
        t = T0 + s * 10_000
        ev += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": 1, "tid": 1, "ts": t,
                "dur": 9_990, "args": {}},
               {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t + 10, "dur": 900,
                "args": {"External id": s}},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 20,
                "dur": 50, "args": {"correlation": s}},
               {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": t + 100, "dur": 8_000,
                "args": {"correlation": s, "stream": 7}}]
    return ev


def cli(*args: Any) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "advisor.cli", "analyze", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("advisor: ") and "warning" not in ln]
    assert len(errors) == 1, res.stderr
    return errors[0]


# -- file names DuckDB would expand ---------------------------------------------------------------

@pytest.mark.parametrize("reader", ["read_json", "read_text", "read_csv"])
def test_duckdb_path_reads_exactly_the_file(tmp_path: Path, reader: str) -> None:
    names = ["x*.json", "x?.json", "x[1].json", "x{a,b}.json", "x].json", "x**.json", "x[!a].json", "~x.json"]
    decoys = ["xa.json", "x1.json", "x.json", "xb.json", "xa,b.json"]
    for i, n in enumerate(names):
        (tmp_path / n).write_text(f'[{{"a": {i}}}]')
    for n in decoys:
        (tmp_path / n).write_text('[{"a": 99}]')
    con = duckdb.connect()
    for i, n in enumerate(names):
        p = tmp_path / n
        col = {"read_json": "a", "read_text": "content", "read_csv": "column0"}[reader]
        opts = ", header=false, delim='|'" if reader == "read_csv" else ""
        rows = con.execute(f"SELECT {col}, filename FROM {reader}($p, filename=true{opts})"
                           if reader != "read_text" else "SELECT content, filename FROM read_text($p)",
                           {"p": duckdb_path(p)}).fetchall()
        assert len(rows) == 1, (n, rows)
        assert rows[0][1] == duckdb_name(p)
        assert str(i) in str(rows[0][0])


def _padded_trace(evs: list[dict[str, Any]], pad: int) -> str:
    """A Kineto object whose events start ``pad`` bytes into the file (a big key before them)."""
    return json.dumps({"schemaVersion": 1, "deviceProperties": [{"name": "x" * pad}], "traceEvents": evs})


@pytest.mark.slow
def test_glob_named_trace_reads_no_file_outside(tmp_path: Path) -> None:
    """``rank0_*.json`` with its events beyond 4 MiB (the whole-file fallback read) and
    ``rank1_?.json`` in the bare-array form: sibling links ``rank0_secret.json`` /
    ``rank1_s.json`` to a trace outside the profile are not read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events("SECRET_OUTSIDE_OP")}))
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "rank0_*.json").write_text(_padded_trace(events("aten::mm"), 5 << 20))
    (prof / "rank1_?.json").write_text(json.dumps(events("aten::add")))
    os.symlink(outside / "secret.json", prof / "rank0_secret.json")
    os.symlink(outside / "secret.json", prof / "rank1_s.json")
    out = tmp_path / "r.json"
    res = cli(prof, "--format", "json", "--out", out)
    assert res.returncode in (0, 1), res.stderr
    assert "Traceback" not in res.stderr
    text = out.read_text()
    assert "SECRET_OUTSIDE_OP" not in text
    report = json.loads(text)
    assert report["profile"]["ranks"] == [0, 1]
    assert any(w["code"] == "link_outside" for w in report["warnings"])


def test_glob_named_trace_loads_its_own_events_once(tmp_path: Path) -> None:
    """The same in-process, the fallback read's trace named with a class and a star."""
    (tmp_path / "outside.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events("SECRET_OUTSIDE_OP")}))
    (tmp_path / "outside_array.json").write_text(json.dumps(events("SECRET_OUTSIDE_OP")))
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "rank0_[ab]*.json").write_text(_padded_trace(events("aten::mm"), 5 << 20))
    (prof / "rank1_?.json").write_text(json.dumps(events("aten::add")))
    os.symlink(tmp_path / "outside.json", prof / "rank0_a.json")
    os.symlink(tmp_path / "outside_array.json", prof / "rank1_x.json")
    ctx = load_profile(prof)
    assert sorted(ctx.con.execute("SELECT path, events FROM profile_files").fetchall()) == [
        (str(prof / "rank0_[ab]*.json"), 8), (str(prof / "rank1_?.json"), 8)]
    assert ctx.con.execute("SELECT count(*) FROM events WHERE name LIKE 'SECRET%'").fetchone() == (0,)
    assert sum(1 for w in ctx.warnings if w.code == "link_outside") >= 2


# -- memory ---------------------------------------------------------------------------------------

SMALL_LIMIT = 4 << 20  # the gzip bomb floor scaled down from MIN_LIMIT for the tests


def cli_scaled(*args: Any) -> subprocess.CompletedProcess[str]:
    """The CLI with the gzip bomb floor at :data:`SMALL_LIMIT` (the mechanism is the same)."""
    code = (f"import sys, advisor.ingest.jsonstream as j; j.MIN_LIMIT = {SMALL_LIMIT}; from advisor.cli import main; "
            "sys.argv = ['advisor', 'analyze', *sys.argv[1:]]; main()")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300,
                          check=False)


def _gzip_bomb(path: Path, head: bytes, total: int) -> None:
    """A gzip file of repeated members decompressing to ~``total`` bytes of events (~1/1000 of it on disk)."""
    member = _event_block(10_000)
    one = gzip.compress(member, compresslevel=9)
    with path.open("wb") as fh:
        fh.write(gzip.compress(head))
        for _ in range(total // len(member) + 1):
            fh.write(one)


def _event_block(n: int) -> bytes:
    e = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1},'
    return e * n


@pytest.mark.parametrize("form", ["array", pytest.param("object", marks=pytest.mark.slow)])
def test_gzip_bomb_refused_in_every_form(tmp_path: Path, form: str) -> None:
    prof = tmp_path / "prof"
    prof.mkdir()
    head = b"[" if form == "array" else b'{"schemaVersion": 1, "traceEvents": ['
    _gzip_bomb(prof / "rank0.json.gz", head, 2 * SMALL_LIMIT)
    assert (prof / "rank0.json.gz").stat().st_size * 100 < SMALL_LIMIT  # so the limit is the floor
    res = cli_scaled(prof, "--format", "json", "--out", tmp_path / "r.json")
    assert res.returncode == 2
    line = one_error_line(res)
    assert "rank0.json.gz" in line and "gzip bomb" in line
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_gzip_bomb_at_the_real_floor(tmp_path: Path) -> None:
    """The real floor (MIN_LIMIT): a bare-array bomb of ~300 KB expanding past it is refused."""
    prof = tmp_path / "prof"
    prof.mkdir()
    _gzip_bomb(prof / "rank0.json.gz", b"[", MIN_LIMIT + (16 << 20))
    res = cli(prof, "--format", "json", "--out", tmp_path / "r.json")
    assert res.returncode == 2 and "gzip bomb" in one_error_line(res)


def test_gzip_bomb_beside_a_good_trace_costs_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two files of a cluster (the batched read): the bomb is refused with a warning, the good rank analysed."""
    from advisor.ingest import jsonstream

    monkeypatch.setattr(jsonstream, "MIN_LIMIT", SMALL_LIMIT)
    _gzip_bomb(tmp_path / "rank0.json.gz", b"[", 2 * SMALL_LIMIT)
    with gzip.open(tmp_path / "rank1.json.gz", "wt") as fh:
        json.dump(events(), fh)
    ctx = load_profile(tmp_path)
    assert ctx.con.execute("SELECT path FROM profile_files WHERE events > 0").fetchall() == [
        (str(tmp_path / "rank1.json.gz"),)]
    assert any("gzip bomb" in w.message and (w.path or "").endswith("rank0.json.gz") for w in ctx.warnings)


def _capped_trace(path: Path, form: str) -> None:
    """~2.5 MB of events, then bytes that are not JSON, then valid events and a valid end: read to
    its end, the trace is malformed; a read that stops after a few hundred events never sees it."""
    good = _event_block(30_000)
    body = good + b"NOT JSON AT ALL," + good + b'{"ph": "M", "name": "end"}]'
    path.write_bytes((b"[" if form == "array" else b'{"schemaVersion": 1, "traceEvents": [') + body
                     + (b"" if form == "array" else b"}"))


@pytest.mark.parametrize("form", ["array", "object"])
def test_max_events_stops_the_read(tmp_path: Path, form: str) -> None:
    _capped_trace(tmp_path / "rank0.json", form)
    with pytest.raises(InputError, match="not a readable"):  # read to its end, the file is refused as malformed
        load_profile(tmp_path)
    with pytest.raises(InputError, match=r"more than 300 events \(--max-events 300\)"):
        load_profile(tmp_path, max_events=300)


@pytest.mark.slow
def test_max_events_through_the_cli(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    prof.mkdir()
    _capped_trace(prof / "rank0.json", "object")
    res = cli(prof, "--max-events", "300", "--format", "json", "--out", tmp_path / "b.json")
    assert res.returncode == 2
    line = one_error_line(res)
    assert "rank0.json" in line and "more than 300 events" in line


def test_max_events_in_a_batch_refuses_only_the_big_file(tmp_path: Path) -> None:
    _capped_trace(tmp_path / "rank0.json", "object")
    for r in (1, 2):
        (tmp_path / f"rank{r}.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events()}))
    ctx = load_profile(tmp_path, max_events=300)
    assert sorted(ctx.con.execute("SELECT path FROM profile_files WHERE events > 0").fetchall()) == [
        (str(tmp_path / "rank1.json"),), (str(tmp_path / "rank2.json"),)]
    assert any(w.code == "too_big" and (w.path or "").endswith("rank0.json") for w in ctx.warnings)


def _long_names_trace(path: Path) -> None:
    """Two 200 KB kernel names sharing their first 200,000 characters, in two steps each."""
    a, b = "k" * 200_000 + "A", "k" * 200_000 + "B"
    second = [dict(e, ts=e["ts"] + 20_000) for e in events(kernel=b)]
    for e in second:
        e["args"] = {k: v + 10 if k in ("correlation", "External id") else v for k, v in e["args"].items()}
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = "ProfilerStep#" + str(int(e["name"][13:]) + 2)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events(kernel=a) + second}))


def test_long_names_are_cut_at_load(tmp_path: Path) -> None:
    """The two names stay two, each cut to NAME_MAX characters and marked with its length and a
    hash; one warning counts them."""
    _long_names_trace(tmp_path / "rank0.json")
    ctx = load_profile(tmp_path)
    names = [r[0] for r in ctx.con.execute("SELECT DISTINCT name FROM events WHERE name LIKE 'kkk%'").fetchall()]
    assert len(names) == 2
    for n in names:
        assert n.startswith("k" * NAME_MAX + "…[cut: 200001 chars, #") and n.endswith("]")
        assert len(n) < NAME_MAX + 40
    cut = [w for w in ctx.warnings if w.code == "long_names"]
    assert len(cut) == 1 and cut[0].message.startswith("2 names longer than 4096 characters")


@pytest.mark.slow
def test_long_names_are_cut_in_the_json_report(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    prof.mkdir()
    _long_names_trace(prof / "rank0.json")
    out = tmp_path / "r.json"
    res = cli(prof, "--format", "json", "--out", out)
    assert res.returncode in (0, 1), res.stderr
    text = out.read_text()
    assert "k" * (NAME_MAX + 1) not in text and "k" * NAME_MAX + "…[cut: " in text
    assert any(w["code"] == "long_names" for w in json.loads(text)["warnings"])


# -- many files -----------------------------------------------------------------------------------

def test_too_many_trace_files_is_one_line_error(tmp_path: Path) -> None:
    """The cap is scaled down to 50 here (the real one: MAX_TRACE_FILES); the error comes before
    any file is read, names the folder and the count."""
    prof = tmp_path / "many"
    prof.mkdir()
    for i in range(60):
        (prof / f"t{i}.json").write_text(json.dumps(events()))
    code = ("import sys, advisor.ingest.kineto as k; k.MAX_TRACE_FILES = 50; from advisor.cli import main; "
            "sys.argv = ['advisor', 'analyze', sys.argv[1], '--format', 'json', '--out', sys.argv[2]]; main()")
    res = subprocess.run([sys.executable, "-c", code, str(prof), str(tmp_path / "r.json")], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 2
    line = one_error_line(res)
    assert str(prof) in line and "60 trace files" in line and "50" in line


def test_too_many_files_walked_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from advisor.ingest import base

    monkeypatch.setattr(base, "MAX_FILES", 20)
    for i in range(25):
        (tmp_path / f"f{i}.txt").write_text("x")
    with pytest.raises(InputError, match=r"more than 20 files"):
        load_profile(tmp_path)


def test_truncated_bare_array_gzip_is_one_error(tmp_path: Path) -> None:
    """A truncated bare-array gzip trace is one bad file, reported, not a traceback."""
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "rank0.json.gz").write_bytes(gzip.compress(json.dumps(events()).encode())[:-30])
    res = cli(prof, "--format", "json", "--out", tmp_path / "r.json")
    assert res.returncode == 2
    assert "rank0.json.gz" in one_error_line(res)
