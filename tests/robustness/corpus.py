"""Corpus of malformed and hostile profiles, built at test time from the real samples.

Nothing big is committed: every case is written by a ``build`` function into a fresh directory
(pytest's ``tmp_path``) from the real traces in ``tests/data/kineto`` and ``sample_profiles``.
Each :class:`Case` says what the advisor must do with it:

``error``
    exit 2, one ``advisor: ...`` line on stderr that names the file or path (``names``) and, if
    given, matches ``problem``; no report is written.
``partial``
    exit 0; the good part is analysed (``ranks``) and the bad file is listed in the JSON report's
    ``warnings`` (code, message, path containing ``names``). With ``or_analysed`` it is also fine
    when the file was read after all (its rank is in the report) instead of being warned about.
``ok``
    exit 0 and the report satisfies ``ranks`` / ``sources`` / ``steps_like``.
``escaped``
    exit 0; the hostile strings reach the JSON report as data and show as text in HTML and Markdown.
``tolerated``
    exit 0 or 2, whichever, as long as the universal checks hold (no traceback, no internal error,
    one-line stderr, strict JSON, bounded memory and time, nothing written outside ``--out``).

:func:`run_cli` runs ``python -m advisor.cli`` in a subprocess with an empty CWD, HOME and TMPDIR,
a timeout and a measurement of the child's peak RSS. ``tests/robustness/test_corpus.py`` runs every
case; ``scripts/fuzz_long.py`` adds the crashes it finds under ``tests/robustness/found/``.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "kineto"
SAMPLES = ROOT / "sample_profiles"
FOUND = Path(__file__).resolve().parent / "found"

HEALTHY = TRACES / "cpu_healthy" / "cpu_healthy.pt.trace.json.gz"
GLOO_RANK0 = TRACES / "gloo_slow_rank" / "rank0.pt.trace.json.gz"
GLOO_RANK1 = TRACES / "gloo_slow_rank" / "rank1.pt.trace.json.gz"
TWO_RANKS_1 = SAMPLES / "kineto_two_ranks" / "rank-1.json.gz"
ASCEND_KERNELS = SAMPLES / "ascend_pt_kernels" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
ASCEND_DIR = "node1_437675_20240102103151123_ascend_pt"

# Op names on the critical path of cpu_healthy's focus step, renamed to hostile strings.
HOSTILE_NAMES = {
    "aten::linear": "<script>alert(1)</script>",
    "autograd::engine::evaluate_function: AddmmBackward0": "{{ 7*7 }}",
    "aten::add_": '" onmouseover="x',
    "aten::relu": "relu\nsecond line\r\x1b[31mred\x07\x00nul",
    "autograd::engine::evaluate_function: ReluBackward0": "{% for x in range(3) %}loop{% endfor %}${7*7}",
}
HOSTILE_FILE = "<img src=x onerror=alert(1)>.pt.trace.json"
HOSTILE_DIR = "prof_<svg onload=alert(1)>"
CTRL_FILE = "bad\nname\x1b[31m\x07.pt.trace.json"  # newline, ESC, BEL in a file name

RSS_CAP_MB = 2048
GZIP_BOMB_BYTES = 4 * 2**30 + 2**20  # 4 GiB of spaces inside one JSON string (~4 MB compressed)


# -- the real traces, loaded once ---------------------------------------------------------------


@cache
def _doc_text(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return fh.read()


def healthy_doc() -> dict[str, Any]:
    """A fresh (mutable) copy of the cpu_healthy trace."""
    return json.loads(_doc_text(HEALTHY))


@cache
def healthy_steps() -> tuple[int, ...]:
    """ProfilerStep numbers of the unmodified cpu_healthy trace (what a reordered copy must give)."""
    out = set()
    for e in healthy_doc()["traceEvents"]:
        n = e.get("name", "")
        if e.get("ph") == "X" and n.startswith("ProfilerStep#"):
            out.add(int(n.split("#", 1)[1]))
    return tuple(sorted(out))


def x_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The complete ('X') events of a trace that are ordinary operators (not the step markers)."""
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and not str(e.get("name", "")).startswith("ProfilerStep#")]


def dump(doc: Any, **kw: Any) -> bytes:
    return json.dumps(doc, **kw).encode("utf-8")


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def good_rank0(d: Path) -> Path:
    """The healthy trace as rank 0 (the part of a partial profile that must still be analysed)."""
    d.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(HEALTHY, d / "rank0.pt.trace.json.gz"))


def with_good(bad: Callable[[Path], Any]) -> Callable[[Path], Path]:
    """Build ``root/prof`` with a good rank 0 plus whatever ``bad(prof)`` writes."""

    def build(root: Path) -> Path:
        prof = root / "prof"
        good_rank0(prof)
        bad(prof)
        return prof

    return build


def alone(bad: Callable[[Path], Any]) -> Callable[[Path], Path]:
    """Build ``root/prof`` holding only the bad file(s)."""

    def build(root: Path) -> Path:
        prof = root / "prof"
        prof.mkdir()
        bad(prof)
        return prof

    return build


def rand_bytes(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


# -- malformed Kineto files (each writes rank1.pt.trace.json[.gz] into a directory) ---------------

R1 = "rank1.pt.trace.json"


def f_truncated_json(d: Path) -> None:
    text = _doc_text(HEALTHY).encode()
    write(d / R1, text[: len(text) // 2])


def f_truncated_gzip(d: Path) -> None:
    data = HEALTHY.read_bytes()
    write(d / (R1 + ".gz"), data[: int(len(data) * 0.6)])


def f_plain_named_gz(d: Path) -> None:
    write(d / (R1 + ".gz"), _doc_text(HEALTHY))


def f_garbage_named_gz(d: Path) -> None:
    write(d / (R1 + ".gz"), rand_bytes(50_000, 2))


def f_gzip_magic_then_garbage(d: Path) -> None:
    write(d / (R1 + ".gz"), b"\x1f\x8b\x08\x00" + rand_bytes(50_000, 3))


def f_binary_garbage(d: Path) -> None:
    write(d / R1, rand_bytes(100_000, 4))


def f_empty(d: Path) -> None:
    write(d / R1, b"")


def f_empty_gzip(d: Path) -> None:
    write(d / (R1 + ".gz"), gzip.compress(b""))


def f_whitespace_only(d: Path) -> None:
    write(d / R1, b" \n\t\r\n" * 100)


def f_bom(d: Path) -> None:
    write(d / R1, b"\xef\xbb\xbf" + _doc_text(HEALTHY).encode())


def f_top_array(d: Path) -> None:  # the Chrome "JSON array format": a bare list of events
    write(d / R1, dump(healthy_doc()["traceEvents"]))


def f_top_scalar(d: Path) -> None:
    write(d / R1, b"42")


def f_top_null(d: Path) -> None:
    write(d / R1, b"null")


def f_top_string(d: Path) -> None:
    write(d / R1, b'"traceEvents"')


def f_two_objects(d: Path) -> None:  # two documents concatenated (a crashed writer appended a second)
    t = _doc_text(HEALTHY)
    write(d / R1, t + "\n" + t)


def f_events_missing(d: Path) -> None:
    doc = healthy_doc()
    del doc["traceEvents"]
    write(d / R1, dump(doc))


def f_events_empty(d: Path) -> None:
    doc = healthy_doc()
    doc["traceEvents"] = []
    write(d / R1, dump(doc))


def f_events_object(d: Path) -> None:
    doc = healthy_doc()
    doc["traceEvents"] = {"0": doc["traceEvents"][0]}
    write(d / R1, dump(doc))


def f_events_string(d: Path) -> None:
    doc = healthy_doc()
    doc["traceEvents"] = "not a list"
    write(d / R1, dump(doc))


def f_events_scalars(d: Path) -> None:  # a list, but of non-objects
    doc = healthy_doc()
    doc["traceEvents"] = [1, "two", None, [3], True] + doc["traceEvents"]
    write(d / R1, dump(doc))


def f_missing_ts_dur(d: Path) -> None:
    doc = healthy_doc()
    for i, e in enumerate(x_events(doc)):
        if i % 10 == 0:
            e.pop("ts", None)
        elif i % 10 == 1:
            e.pop("dur", None)
        elif i % 10 == 2:
            e["ts"] = None
    write(d / R1, dump(doc))


def f_negative_dur(d: Path) -> None:
    doc = healthy_doc()
    for i, e in enumerate(x_events(doc)):
        if i % 7 == 0:
            e["dur"] = -abs(e["dur"]) - 1
    write(d / R1, dump(doc))


def f_nan_inf_dur(d: Path) -> None:  # bare NaN / Infinity tokens, as Python's json.dumps writes them
    doc = healthy_doc()
    vals = [float("nan"), float("inf"), float("-inf")]
    for i, e in enumerate(x_events(doc)):
        if i % 9 == 0:
            e["dur"] = vals[(i // 9) % 3]
        elif i % 9 == 1:
            e["ts"] = vals[(i // 9) % 3]
    write(d / R1, dump(doc, allow_nan=True))


def f_nan_strings(d: Path) -> None:
    doc = healthy_doc()
    vals = ["NaN", "Infinity", "-inf", "nan", "", "1e999"]
    for i, e in enumerate(x_events(doc)):
        if i % 9 == 0:
            e["dur"] = vals[(i // 9) % len(vals)]
    write(d / R1, dump(doc))


def f_ts_strings(d: Path) -> None:  # as Ascend's timeline writes them
    doc = healthy_doc()
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = f"{e['ts']:.3f}"
        if "dur" in e:
            e["dur"] = str(e["dur"])
    write(d / R1, dump(doc))


def f_huge_numbers(d: Path) -> None:
    doc = healthy_doc()
    for i, e in enumerate(x_events(doc)):
        if i % 11 == 0:
            e["ts"] = 1e300
        elif i % 11 == 1:
            e["dur"] = 1e300
        elif i % 11 == 2:
            e["dur"] = 10**40  # an integer no 64-bit type holds
        elif i % 11 == 3:
            e["ts"] = -1e300
        elif i % 11 == 4:
            e["pid"] = 10**30
            e["tid"] = -(10**30)
        elif i % 11 == 5:
            e["dur"] = 5e-324
    write(d / R1, dump(doc))


def f_unsorted(d: Path) -> None:
    doc = healthy_doc()
    random.Random(5).shuffle(doc["traceEvents"])
    write(d / R1, dump(doc))


def f_duplicated(d: Path) -> None:
    doc = healthy_doc()
    doc["traceEvents"] = doc["traceEvents"] + copy.deepcopy(doc["traceEvents"])
    write(d / R1, dump(doc))


def f_unknown_phases(d: Path) -> None:
    doc = healthy_doc()
    phases = ["Z", "", None, 5, "XX", "x", {"ph": "X"}, ["X"]]
    extra = [dict(e, ph=phases[i % len(phases)]) for i, e in enumerate(x_events(doc)[:200])]
    doc["traceEvents"] += extra
    write(d / R1, dump(doc))


def f_wrong_types(d: Path) -> None:
    doc = healthy_doc()
    bad = [("name", 123), ("name", None), ("name", ["a"]), ("cat", {"c": 1}), ("pid", {"p": 1}), ("tid", [1, 2]),
           ("args", [1, 2]), ("args", "str"), ("args", None), ("ts", True), ("dur", [1]), ("dur", {"v": 1})]
    for i, e in enumerate(x_events(doc)):
        if i % 5 == 0:
            k, v = bad[(i // 5) % len(bad)]
            e[k] = v
    doc["distributedInfo"] = "not an object"
    doc["deviceProperties"] = {"name": 5}
    doc["baseTimeNanoseconds"] = "soon"
    write(d / R1, dump(doc))


def _nested_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def f_deep_args(d: Path, depth: int = 10_000) -> None:
    text = _doc_text(HEALTHY)
    marker = '"args": {'
    i = text.index(marker, text.index('"cat": "cpu_op"'))
    deep = '"args": {"deep": ' + _nested_object(depth) + ", "
    write(d / R1, text[:i] + deep + text[i + len(marker):])


def f_deep_arrays(d: Path, depth: int = 200_000) -> None:
    text = _doc_text(HEALTHY)
    marker = '"args": {'
    i = text.index(marker, text.index('"cat": "cpu_op"'))
    deep = '"args": {"deep": ' + "[" * depth + "]" * depth + ", "
    write(d / R1, text[:i] + deep + text[i + len(marker):])


def f_long_names(d: Path) -> None:
    doc = healthy_doc()
    long = "aten::" + "N" * 100_000
    for e in x_events(doc):
        if e.get("name") == "aten::linear":  # 24 events, on the critical path
            e["name"] = long
    fat = next(e for e in x_events(doc) if isinstance(e.get("args"), dict))
    fat["args"]["Input Dims"] = [[1] * 20_000]
    fat["args"]["Call stack"] = "frame;" * 20_000
    doc["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "T" * 100_000}})
    write(d / R1, dump(doc))


def f_fat_args(d: Path) -> None:
    """About 10 MB of JSON: every operator carries a 2,500-element shape list (memory per input byte)."""
    doc = healthy_doc()
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and isinstance(e.get("args"), dict):
            e["args"]["Input Dims"] = [[1] * 2500]
    write(d / R1, dump(doc))


def f_non_utf8(d: Path) -> None:
    raw = _doc_text(HEALTHY).encode()
    raw = raw.replace(b'"aten::linear"', b'"aten::lin\xff\xfe\xc3(ear"').replace(b'"aten::relu"', b'"aten::\xed\xa0\x80relu"')
    write(d / R1, raw)


def f_lone_surrogates(d: Path) -> None:  # valid JSON escapes that are not valid Unicode scalar values
    text = _doc_text(HEALTHY)
    text = text.replace('"aten::linear"', '"aten::lin\\ud800ear"').replace('"aten::relu"', '"\\udfffrelu\\u0000"')
    write(d / R1, text)


def f_latin1(d: Path) -> None:  # a whole file in another encoding
    doc = healthy_doc()
    for e in x_events(doc):
        if e.get("name") == "aten::linear":
            e["name"] = "aten::lïnéar"
    write(d / R1, json.dumps(doc, ensure_ascii=False).encode("latin-1"))


def f_utf16(d: Path) -> None:
    write(d / R1, _doc_text(HEALTHY).encode("utf-16"))


def f_gzip_bomb(cache: Path) -> Callable[[Path], None]:
    def bad(d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        os.link(gzip_bomb(cache), d / (R1 + ".gz"))

    return bad


# -- gzip bomb ----------------------------------------------------------------------------------


def gzip_bomb(cache: Path, size: int = GZIP_BOMB_BYTES) -> Path:
    """A valid gzip of a Kineto-looking JSON whose one event name is ``size`` spaces.

    Built streaming with zlib in about a second: after a full flush the deflate state is reset,
    so every 1 MiB block of spaces compresses to the same bytes, which are written ``size/1MiB``
    times. Memory use is a few MB; the file is about ``size / 1000`` bytes.
    """
    path = cache / f"bomb_{size}.pt.trace.json.gz"
    if path.exists():
        return path
    chunk = 1 << 20
    n = max(2, size // chunk)
    prefix = b'{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "name": "'
    suffix = b'", "ts": 1.0, "dur": 1.0}]}'
    block = b" " * chunk
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = co.compress(prefix) + co.flush(zlib.Z_FULL_FLUSH)
    b1 = co.compress(block) + co.flush(zlib.Z_FULL_FLUSH)
    b2 = co.compress(block) + co.flush(zlib.Z_FULL_FLUSH)
    tail = co.compress(suffix) + co.flush(zlib.Z_FINISH)
    crc = zlib.crc32(prefix)
    for _ in range(n):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(suffix, crc)
    total = len(prefix) + n * chunk + len(suffix)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # gzip header, no name, no mtime
        fh.write(head)
        fh.write(b1)
        for _ in range(n - 1):
            fh.write(b2)  # equal to b1 (checked below); written n times in all
        fh.write(tail)
        fh.write(crc.to_bytes(4, "little"))
        fh.write((total % 2**32).to_bytes(4, "little"))
    if b1 != b2:  # zlib behaved unexpectedly: the repeated block is not position independent
        tmp.unlink()
        raise RuntimeError("gzip bomb: deflate blocks differ after a full flush")
    os.replace(tmp, path)
    return path


# -- Ascend (torch_npu) kernel_details.csv variants ------------------------------------------------


def _kernels_text() -> str:
    return ASCEND_KERNELS.read_text(encoding="utf-8")


def ascend_export(d: Path, csv: bytes | str, name: str = ASCEND_DIR) -> Path:
    out = d / name / "ASCEND_PROFILER_OUTPUT"
    write(out / "kernel_details.csv", csv)
    return d / name


def _csv_rows() -> list[list[str]]:
    import csv
    import io

    return list(csv.reader(io.StringIO(_kernels_text())))


def _csv_text(rows: list[list[str]], delimiter: str = ",", lineterminator: str = "\n") -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator=lineterminator)
    w.writerows(rows)
    return buf.getvalue()


def csv_good(d: Path) -> None:
    ascend_export(d, _kernels_text())


def csv_missing_column(d: Path) -> None:
    rows = _csv_rows()
    i = rows[0].index("Duration(us)")
    ascend_export(d, _csv_text([r[:i] + r[i + 1:] for r in rows]))


def csv_missing_start(d: Path) -> None:
    rows = _csv_rows()
    i = rows[0].index("Start Time(us)")
    ascend_export(d, _csv_text([r[:i] + r[i + 1:] for r in rows]))


def csv_extra_columns(d: Path) -> None:
    rows = _csv_rows()
    rows = [r + (["Extra A", "Extra,B", "Duration(us)"] if i == 0 else ["x", "1,2", "oops"]) for i, r in enumerate(rows)]
    ascend_export(d, _csv_text(rows))


def csv_ragged(d: Path) -> None:
    rows = _csv_rows()
    for i in range(5, len(rows), 17):
        rows[i] = rows[i][: len(rows[i]) // 2]
    for i in range(9, len(rows), 23):
        rows[i] = rows[i] + ["surplus", "cells"]
    ascend_export(d, _csv_text(rows))


def csv_ragged_nul(d: Path) -> None:
    """Ragged rows, and a NUL inside one operator name: Python 3.10's csv module refuses NULs
    (3.11+ reads them); the ragged rows must be reported either way."""
    rows = _csv_rows()
    for i in range(5, len(rows), 17):
        rows[i] = rows[i][: len(rows[i]) // 2]
    rows[3][0] = "nul" + "\x01" + "name"  # placeholder: csv.writer on 3.10 refuses a NUL cell
    ascend_export(d, _csv_text(rows).replace("\x01", "\x00"))


def csv_semicolon(d: Path) -> None:
    ascend_export(d, _csv_text(_csv_rows(), delimiter=";"))


def csv_tab(d: Path) -> None:
    ascend_export(d, _csv_text(_csv_rows(), delimiter="\t"))


def csv_crlf(d: Path) -> None:
    ascend_export(d, _csv_text(_csv_rows(), lineterminator="\r\n"))


def csv_bom(d: Path) -> None:
    ascend_export(d, b"\xef\xbb\xbf" + _kernels_text().encode())


def csv_non_numeric(d: Path) -> None:
    rows = _csv_rows()
    h = rows[0]
    di, si = h.index("Duration(us)"), h.index("Start Time(us)")
    junk = ["abc", "1,234.5", "", "N/A", "NaN", "inf", "-5", "1e300", "0x10", "  7 "]
    for n, i in enumerate(range(1, len(rows), 7)):
        rows[i][di] = junk[n % len(junk)]
    for n, i in enumerate(range(3, len(rows), 13)):
        rows[i][si] = junk[(n + 3) % len(junk)]
    ascend_export(d, _csv_text(rows))


def csv_header_only(d: Path) -> None:
    ascend_export(d, _csv_text(_csv_rows()[:1]))


def csv_empty(d: Path) -> None:
    ascend_export(d, b"")


def csv_binary(d: Path) -> None:
    ascend_export(d, rand_bytes(20_000, 6))


def csv_non_utf8(d: Path) -> None:
    raw = _kernels_text().encode().replace(b"ZerosLike46", b"Zeros\xff\xfeLike46", 1)
    ascend_export(d, raw)


def csv_quotes_newlines(d: Path) -> None:
    rows = _csv_rows()
    rows[1][rows[0].index("Name")] = 'multi\nline "quoted", name'
    rows[2][rows[0].index("Name")] = "<script>alert(1)</script>"
    ascend_export(d, _csv_text(rows))


def ascend_corrupt_db(d: Path) -> None:
    prof = ascend_export(d, _kernels_text())
    db = prof / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
    write(db, b"SQLite format 3\x00" + rand_bytes(8192, 7))


def ascend_db_only(d: Path) -> None:
    db = d / ASCEND_DIR / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
    write(db, b"SQLite format 3\x00" + rand_bytes(8192, 8))


def ascend_db_not_sqlite(d: Path) -> None:
    prof = ascend_export(d, _kernels_text())
    write(prof / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db", _doc_text(HEALTHY))


# -- multi-file situations ------------------------------------------------------------------------


def same_rank_twice(root: Path) -> Path:
    prof = root / "prof"
    prof.mkdir()
    shutil.copyfile(GLOO_RANK0, prof / "rank0.pt.trace.json.gz")
    shutil.copyfile(GLOO_RANK0, prof / "copy_of_rank0.pt.trace.json.gz")  # distributedInfo says rank 0 too
    shutil.copyfile(GLOO_RANK1, prof / "rank1.pt.trace.json.gz")
    return prof


def different_runs(root: Path) -> Path:
    prof = root / "prof"
    prof.mkdir()
    shutil.copyfile(GLOO_RANK0, prof / "rank0.pt.trace.json.gz")  # gloo, world size 2, CPU
    shutil.copyfile(TWO_RANKS_1, prof / "rank1.pt.trace.json.gz")  # nccl, world size 128, GPU, another job
    return prof


def mixed_sources(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    csv_good(prof)
    return prof


def nothing_recognisable(root: Path) -> Path:
    prof = root / "prof"
    write(prof / "README.txt", "notes")
    write(prof / "config.json", '{"lr": 0.1, "batch": 32}')
    write(prof / "events.json", '[{"not": "a trace"}]')
    write(prof / "image.png", b"\x89PNG\r\n\x1a\n" + rand_bytes(1000))
    write(prof / "sub" / "data.csv", "a,b\n1,2\n")
    return prof


def empty_dir(root: Path) -> Path:
    (root / "prof").mkdir()
    return root / "prof"


def only_empty_subdirs(root: Path) -> Path:
    (root / "prof" / "a" / "b").mkdir(parents=True)
    return root / "prof"


def missing_path(root: Path) -> Path:
    return root / "does_not_exist"


def missing_ctrl_path(root: Path) -> Path:
    return root / "no\nsuch\x1b[2Jdir"


def lone_file(root: Path) -> Path:  # a single file as the argument
    p = root / "bad.pt.trace.json"
    f = root / "x"
    f.mkdir()
    f_truncated_json(f)
    os.rename(f / R1, p)
    f.rmdir()
    return p


def ctrl_name_alone(root: Path) -> Path:
    prof = root / "prof"
    f_truncated_json(prof)
    os.rename(prof / R1, prof / CTRL_FILE)
    return prof


def ctrl_name_with_good(root: Path) -> Path:
    prof = ctrl_name_alone(root)
    good_rank0(prof)
    return prof


def many_files(root: Path) -> Path:  # 3000 tiny non-trace files next to a good trace
    prof = root / "prof"
    good_rank0(prof)
    junk = prof / "junk"
    junk.mkdir()
    for i in range(3000):
        (junk / f"f{i}.txt").write_bytes(b"x")
    return prof


def deep_dirs(root: Path) -> Path:  # a very deep directory tree (no recursion limit, no ENAMETOOLONG crash)
    prof = root / "prof"
    good_rank0(prof)
    d = prof
    for _ in range(60):
        d = d / ("d" * 60)
        try:
            d.mkdir()
        except OSError:
            break
    return prof


# -- special files and links ------------------------------------------------------------------------


def fifo_as_arg(root: Path) -> Path:
    p = root / "trace.pt.trace.json"
    os.mkfifo(p)
    return p


def dev_zero_as_arg(root: Path) -> Path:
    return Path("/dev/zero")


def socket_in_dir(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    try:
        os.chdir(prof)  # AF_UNIX paths are limited to ~108 bytes: bind a relative name
        s.bind(R1)
    finally:
        os.chdir(cwd)
        s.close()
    return prof


def link_loop_dir(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    os.symlink(".", prof / "loop")
    (prof / "sub").mkdir()
    os.symlink("..", prof / "sub" / "up")
    return prof


def link_loop_file(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    os.symlink("b.pt.trace.json", prof / "a.pt.trace.json")
    os.symlink("a.pt.trace.json", prof / "b.pt.trace.json")
    os.symlink(R1, prof / R1)  # a link to itself
    return prof


def dangling_link(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    os.symlink("gone.pt.trace.json", prof / R1)
    return prof


def _secret_trace(d: Path) -> Path:
    doc = healthy_doc()
    for e in x_events(doc):
        if e.get("cat") == "cpu_op":
            e["name"] = "SECRET_OUTSIDE_OP"
    doc["distributedInfo"] = {"rank": 1, "world_size": 2, "backend": "SECRET_BACKEND"}
    d.mkdir(parents=True, exist_ok=True)
    return write(d / "secret.pt.trace.json", dump(doc))


def link_out_file(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    secret = _secret_trace(root / "outside")
    os.symlink(os.path.relpath(secret, prof), prof / R1)
    return prof


def link_out_dir(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    _secret_trace(root / "outside")
    os.symlink("../outside", prof / "more_ranks")
    return prof


def link_out_abs(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    secret = _secret_trace(root / "outside")
    os.symlink(secret.resolve(), prof / R1)
    return prof


def link_to_dev_zero(root: Path) -> Path:
    prof = root / "prof"
    good_rank0(prof)
    os.symlink("/dev/zero", prof / R1)
    os.symlink("/dev/urandom", prof / "rank2.pt.trace.json.gz")
    return prof


def link_inside(root: Path) -> Path:  # a link that stays inside the profile is fine to follow
    prof = root / "prof"
    good_rank0(prof)
    real = prof / "real"
    real.mkdir()
    shutil.copyfile(GLOO_RANK1, real / "rank1.pt.trace.json.gz")
    os.symlink("real", prof / "alias")
    return prof


def hostile_names(root: Path) -> Path:
    prof = root / HOSTILE_DIR
    doc = healthy_doc()
    for e in doc["traceEvents"]:
        if e.get("name") in HOSTILE_NAMES:
            e["name"] = HOSTILE_NAMES[e["name"]]
        if isinstance(e.get("args"), dict) and "Input Dims" in e["args"]:
            e["args"]["Input type"] = ["<b>bold</b>", "{{ config }}"]
    doc["distributedInfo"] = {"rank": 0, "world_size": 1, "backend": "<i>gloo</i>"}
    write(prof / "rank0.pt.trace.json", dump(doc))
    f_truncated_json(prof)
    os.rename(prof / R1, prof / HOSTILE_FILE)
    return prof


# -- the corpus -------------------------------------------------------------------------------------


@dataclass
class Case:
    """One malformed or hostile profile and what the advisor must do with it."""

    id: str
    build: Callable[[Path], Path]  # writes under the given directory, returns the PROFILE argument
    expect: str  # error | partial | ok | escaped | tolerated
    names: tuple[str, ...] = ()  # error: the stderr line names one of these; partial: a warning path contains one
    problem: str | None = None  # error: regex the stderr line matches (case-insensitive)
    codes: tuple[str, ...] = ()  # partial: the warning about ``names`` has one of these codes (empty: any)
    ranks: tuple[int, ...] | None = None  # ranks the report must contain
    exact_ranks: bool = False  # ... and no others
    sources: tuple[str, ...] = ()  # sources the report must list
    message_re: str | None = None  # partial: a profile-wide warning (no path) whose message matches also does
    or_analysed: tuple[int, ...] = ()  # partial: instead of a warning, these ranks may be in the report
    steps_like_healthy: bool = False  # rank 1's steps equal those of the untouched cpu_healthy trace
    absent: tuple[str, ...] = ()  # strings that must appear nowhere in the report or on stderr
    formats: tuple[str, ...] = ("json",)
    args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # ascend | html | md
    timeout: float = 60.0
    max_rss_mb: int = RSS_CAP_MB
    note: str = ""
    cache_build: Callable[[Path], Callable[[Path], Path]] | None = None  # build that needs the session cache dir
    extra: dict[str, Any] = field(default_factory=dict)


def _p(id: str, bad: Callable[[Path], Any], *, codes: tuple[str, ...] = (), or_analysed: tuple[int, ...] = (),
       name: str = R1, **kw: Any) -> Case:
    """A good rank 0 plus one bad file: partial, the bad file named in the warnings."""
    return Case(id, with_good(bad), "partial", names=(name,), codes=codes, ranks=(0,), or_analysed=or_analysed, **kw)


def _e(id: str, bad: Callable[[Path], Any], *, name: str = R1, problem: str | None = None, **kw: Any) -> Case:
    """Only the bad file: error naming it."""
    return Case(id, alone(bad), "error", names=(name,), problem=problem, **kw)


def _a(id: str, bad: Callable[[Path], Any], **kw: Any) -> Case:
    """A good rank 0 plus a file with bad events: exit 0 and rank 1 still analysed."""
    return Case(id, with_good(bad), kw.pop("expect", "ok"), ranks=(0, 1), **kw)


GZ = R1 + ".gz"

CASES: list[Case] = [
    # whole-file damage: the rest of the profile is analysed, the file is named in the warnings
    _p("truncated_json", f_truncated_json),
    _p("truncated_gzip", f_truncated_gzip, name=GZ),
    _p("plain_json_named_gz", f_plain_named_gz, name=GZ, or_analysed=(1,)),
    _p("garbage_named_gz", f_garbage_named_gz, name=GZ),
    _p("gzip_magic_then_garbage", f_gzip_magic_then_garbage, name=GZ),
    _p("binary_garbage", f_binary_garbage),
    _p("empty_file", f_empty, codes=("empty_file",)),
    _p("empty_gzip", f_empty_gzip, name=GZ),
    _p("whitespace_only", f_whitespace_only),
    _p("utf8_bom", f_bom, or_analysed=(1,)),
    _p("utf16", f_utf16, or_analysed=(1,)),
    _p("latin1_encoding", f_latin1, or_analysed=(1,)),
    _p("top_level_array", f_top_array, or_analysed=(1,), note="Chrome's JSON array format"),
    _p("top_level_number", f_top_scalar),
    _p("top_level_null", f_top_null),
    _p("top_level_string", f_top_string),
    _p("two_documents", f_two_objects, or_analysed=(1,)),
    _p("traceEvents_missing", f_events_missing),
    _p("traceEvents_empty", f_events_empty),
    _p("traceEvents_object", f_events_object),
    _p("traceEvents_string", f_events_string),
    _p("traceEvents_scalars", f_events_scalars, or_analysed=(1,)),
    # the same damage with nothing else to analyse: one-line error naming the file
    _e("alone_truncated_json", f_truncated_json, problem=r"json|trace|read|truncat"),
    _e("alone_truncated_gzip", f_truncated_gzip, name=GZ, problem=r"gzip|truncat|read"),
    _e("alone_garbage_named_gz", f_garbage_named_gz, name=GZ),
    _e("alone_binary_garbage", f_binary_garbage),
    _e("alone_empty_file", f_empty, problem="empty"),
    _e("alone_top_level_number", f_top_scalar),
    _e("alone_traceEvents_missing", f_events_missing),
    _e("alone_traceEvents_string", f_events_string),
    Case("lone_file_argument", lone_file, "error", names=("bad.pt.trace.json",)),
    # bad events inside a usable file: the file is still analysed; dropped events are reported
    _a("events_without_ts_dur", f_missing_ts_dur, expect="partial", names=(R1,), codes=("bad_events",)),
    _a("negative_durations", f_negative_dur, expect="partial", names=(R1,), codes=("bad_events",)),
    Case("nan_infinity_tokens", with_good(f_nan_inf_dur), "partial", names=(R1,), ranks=(0,),
         note="bare NaN/Infinity tokens (Python's json.dumps default); the events are dropped or the file skipped"),
    _a("nan_infinity_strings", f_nan_strings, expect="partial", names=(R1,)),
    _a("timestamps_as_strings", f_ts_strings, steps_like_healthy=True),
    Case("huge_numbers_1e300", with_good(f_huge_numbers), "partial", names=(R1,), ranks=(0,), or_analysed=(1,)),
    _a("unsorted_events", f_unsorted, steps_like_healthy=True),
    _a("duplicated_events", f_duplicated),
    _a("unknown_phases", f_unknown_phases, steps_like_healthy=True),
    _a("wrong_field_types", f_wrong_types),
    _p("deep_args_10k", f_deep_args, or_analysed=(1,)),
    _p("deep_arrays_200k", f_deep_arrays, or_analysed=(1,)),
    _a("names_100kb", f_long_names),
    _a("fat_args_10mb", f_fat_args, max_rss_mb=640,
       note="~10 MB of JSON; the cap is 300 MB for the process plus 30x the uncompressed input"),
    _p("non_utf8_bytes", f_non_utf8, or_analysed=(1,)),
    _p("lone_surrogates_nul", f_lone_surrogates, or_analysed=(1,)),
    # several files
    Case("same_rank_twice", same_rank_twice, "partial", names=("rank0.pt.trace.json.gz",), ranks=(0, 1),
         note="two files carry distributedInfo rank 0: say so instead of merging them silently"),
    Case("ranks_from_different_runs", different_runs, "error", names=("rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"),
         problem=r"2 runs in one directory.*--run N", note="world size 2 / gloo vs 128 / nccl: two runs, refused"),
    Case("kineto_and_ascend_mixed", mixed_sources, "partial", names=("rank0.pt.trace.json.gz",), codes=("source_unused",),
         ranks=(0,), sources=("ascend_pt",), needs=("ascend",), note="both are analysed, or one is named in a warning"),
    Case("nothing_recognisable", nothing_recognisable, "error", names=("prof",), problem="recognis"),
    Case("empty_directory", empty_dir, "error", names=("prof",), problem="empty|no trace"),
    Case("only_empty_subdirectories", only_empty_subdirs, "error", names=("prof",)),
    Case("missing_path", missing_path, "error", names=("does_not_exist",), problem="no such"),
    Case("missing_path_control_chars", missing_ctrl_path, "error", names=("dir",)),
    Case("many_junk_files", many_files, "ok", ranks=(0,)),
    Case("deep_directory_tree", deep_dirs, "ok", ranks=(0,)),
    Case("max_events_exceeded", with_good(lambda d: None), "error", names=("rank0.pt.trace.json.gz",),
         problem="max-events", args=("--max-events", "10")),
    # special files and links: skipped, never opened, never followed out of the profile
    _p("fifo_in_directory", lambda d: os.mkfifo(d / R1), codes=("special_file",), timeout=30),
    Case("fifo_as_argument", fifo_as_arg, "error", names=("trace.pt.trace.json",), timeout=30),
    Case("dev_zero_as_argument", dev_zero_as_arg, "error", names=("/dev/zero",), timeout=30),
    Case("socket_in_directory", socket_in_dir, "partial", names=(R1,), codes=("special_file",), ranks=(0,), timeout=30),
    Case("symlink_loop_dir", link_loop_dir, "partial", names=("loop", "up"), ranks=(0,), exact_ranks=True, timeout=30),
    Case("symlink_loop_file", link_loop_file, "partial", names=("a.pt.trace.json", "b.pt.trace.json", R1), ranks=(0,),
         exact_ranks=True, timeout=30),
    Case("dangling_link", dangling_link, "partial", names=(R1,), codes=("dangling_link",), ranks=(0,), exact_ranks=True),
    Case("symlink_out_file", link_out_file, "partial", names=(R1,), codes=("link_outside",), ranks=(0,), exact_ranks=True,
         absent=("SECRET_OUTSIDE_OP", "SECRET_BACKEND")),
    Case("symlink_out_dir", link_out_dir, "partial", names=("more_ranks",), codes=("link_outside",), ranks=(0,),
         exact_ranks=True, absent=("SECRET_OUTSIDE_OP", "SECRET_BACKEND")),
    Case("symlink_out_absolute", link_out_abs, "partial", names=(R1,), codes=("link_outside",), ranks=(0,),
         exact_ranks=True, absent=("SECRET_OUTSIDE_OP", "SECRET_BACKEND")),
    Case("symlink_to_dev_zero", link_to_dev_zero, "partial", names=(R1,), ranks=(0,), exact_ranks=True, timeout=30),
    Case("symlink_inside_followed", link_inside, "ok", ranks=(0, 1)),
    # control characters in file names: still one line
    Case("control_chars_in_file_name", ctrl_name_alone, "error", names=("[31m",)),
    Case("control_chars_in_file_name_partial", ctrl_name_with_good, "partial", names=(CTRL_FILE,), ranks=(0,)),
    # hostile strings: data, never markup or template
    Case("hostile_strings_escaped", hostile_names, "escaped", formats=("json", "html", "md"), ranks=(0,),
         names=(HOSTILE_FILE,)),
    Case("hostile_control_chars_in_reports", hostile_names, "escaped", formats=("json", "html", "md"), ranks=(0,),
         names=(HOSTILE_FILE,), extra={"controls": True},
         note="NUL, ESC, BEL, CR from op names must not reach HTML/Markdown raw"),
    # Ascend kernel_details.csv variants (X_ascend_pt/ASCEND_PROFILER_OUTPUT/)
    Case("ascend_csv_good", alone(csv_good), "ok", sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_csv_missing_duration", alone(csv_missing_column), "error", names=("kernel_details.csv",),
         needs=("ascend",)),
    Case("ascend_csv_missing_start", alone(csv_missing_start), "error", names=("kernel_details.csv",), needs=("ascend",)),
    Case("ascend_csv_extra_columns", alone(csv_extra_columns), "ok", sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_csv_ragged_rows", alone(csv_ragged), "partial", names=("kernel_details.csv",), sources=("ascend_pt",),
         needs=("ascend",)),
    Case("ascend_csv_ragged_rows_nul", alone(csv_ragged_nul), "partial", names=("kernel_details.csv",),
         sources=("ascend_pt",), needs=("ascend",), note="ragged rows reported although a cell holds a NUL"),
    Case("ascend_csv_semicolon", alone(csv_semicolon), "tolerated", names=("kernel_details.csv",), needs=("ascend",)),
    Case("ascend_csv_tab", alone(csv_tab), "tolerated", names=("kernel_details.csv",), needs=("ascend",)),
    Case("ascend_csv_crlf", alone(csv_crlf), "ok", sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_csv_bom", alone(csv_bom), "ok", sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_csv_non_numeric", alone(csv_non_numeric), "partial", names=("kernel_details.csv",),
         sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_csv_header_only", alone(csv_header_only), "error", names=("kernel_details.csv",), needs=("ascend",)),
    Case("ascend_csv_empty", alone(csv_empty), "error", names=("kernel_details.csv",), needs=("ascend",)),
    Case("ascend_csv_binary", alone(csv_binary), "error", names=("kernel_details.csv",), needs=("ascend",)),
    Case("ascend_csv_non_utf8", alone(csv_non_utf8), "tolerated", names=("kernel_details.csv",), needs=("ascend",)),
    Case("ascend_csv_quotes_newlines", alone(csv_quotes_newlines), "ok", sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_corrupt_db", alone(ascend_corrupt_db), "partial", names=("ascend_pytorch_profiler_0.db",),
         sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_db_not_sqlite", alone(ascend_db_not_sqlite), "partial", names=("ascend_pytorch_profiler_0.db",),
         sources=("ascend_pt",), needs=("ascend",)),
    Case("ascend_corrupt_db_only", alone(ascend_db_only), "error", names=("ascend_pytorch_profiler_0.db", "ascend_pt"),
         needs=("ascend",)),
]

# the gzip bomb needs the session cache (built once, hard-linked into each case)
BOMB_CASES: list[Case] = [
    Case("gzip_bomb_alone", alone(lambda d: None), "tolerated", names=(GZ,), timeout=120,
         cache_build=lambda cache: alone(f_gzip_bomb(cache)),
         note="4 GiB of spaces in one JSON string, ~4 MB on disk: refused or streamed, never loaded whole"),
    Case("gzip_bomb_with_good", with_good(lambda d: None), "partial", names=(GZ,), ranks=(0,), or_analysed=(1,),
         timeout=120, cache_build=lambda cache: with_good(f_gzip_bomb(cache))),
]


def found_cases() -> list[Case]:
    """Crashes saved by ``scripts/fuzz_long.py`` under ``tests/robustness/found/<id>/``.

    Each holds ``case.json`` (``{"expect": "tolerated", "profile": "<relative path>", "note": ...}``)
    and the profile itself; the profile is copied into the test's directory before the run.
    """
    out = []
    if not FOUND.is_dir():
        return out
    for d in sorted(p for p in FOUND.iterdir() if (p / "case.json").is_file()):
        spec = json.loads((d / "case.json").read_text())

        def build(root: Path, d: Path = d, spec: dict[str, Any] = spec) -> Path:
            dst = root / "found"
            shutil.copytree(d, dst, symlinks=True)
            return dst / spec.get("profile", "profile")

        out.append(Case(f"found_{d.name}", build, spec.get("expect", "tolerated"), names=tuple(spec.get("names", ())),
                        note=spec.get("note", ""), timeout=float(spec.get("timeout", 60))))
    return out


def all_cases() -> list[Case]:
    return CASES + BOMB_CASES + found_cases()


# -- running the CLI --------------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    peak_rss_mb: float
    timed_out: bool
    command: list[str]


def run_cli(args: list[str], *, cwd: Path, env_dirs: dict[str, Path], timeout: float) -> Run:
    """Run ``python -m advisor.cli ARGS`` in ``cwd`` with HOME/TMPDIR pointed at ``env_dirs``.

    The child runs in its own session so a hang can be killed with its children. Its peak RSS is
    its own ``VmHWM``, polled while it runs: ``wait4``'s ``ru_maxrss`` is at least the *parent's*
    high-water mark (Linux keeps it across the spawn's exec), i.e. whatever pytest peaked at
    earlier. ``ru_maxrss`` is only the fallback for a child too short-lived to be polled.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONWARNINGS", None)
    for k in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        env.pop(k, None)
    for k, v in env_dirs.items():
        env[k] = str(v)
    cmd = [sys.executable, "-m", "advisor.cli", *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    import threading

    bufs: dict[str, bytes] = {}

    def reader(name: str, stream: Any) -> None:
        bufs[name] = stream.read()

    threads = [threading.Thread(target=reader, args=(n, s), daemon=True) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for t in threads:
        t.start()
    timed_out = False
    status = None
    rusage = None
    hwm_kb = 0
    while True:
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{proc.pid}/status", encoding="ascii") as fh:
            hwm_kb = max(hwm_kb, int(fh.read().split("VmHWM:")[1].split()[0]))
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.monotonic() - t0 > timeout:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group (start_new_session)
            except ProcessLookupError:
                pass
            pid, status, rusage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join(10)
    return Run(
        returncode=None if timed_out else proc.returncode,
        stdout=bufs.get("out", b"").decode("utf-8", "replace"),
        stderr=bufs.get("err", b"").decode("utf-8", "replace"),
        seconds=time.monotonic() - t0,
        peak_rss_mb=(hwm_kb or (rusage.ru_maxrss if rusage else 0)) / 1024.0,
        timed_out=timed_out,
        command=cmd,
    )


def snapshot(path: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry below ``path`` (links not followed): type, size, mtime. For before/after checks."""
    out: dict[str, tuple[Any, ...]] = {}
    if not os.path.isdir(path):
        return out
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            kind = stat.S_IFMT(st.st_mode)
            out[os.path.relpath(p, path)] = (kind, st.st_size if stat.S_ISREG(st.st_mode) else 0, st.st_mtime_ns)
    return out


def strict_json(text: str) -> Any:
    """Parse JSON, refusing NaN / Infinity / -Infinity (reports must be strict JSON)."""

    def bad_constant(name: str) -> Any:
        raise ValueError(f"non-strict JSON constant {name} in the report")

    return json.loads(text, parse_constant=bad_constant)
