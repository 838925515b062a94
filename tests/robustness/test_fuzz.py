"""Property-based fuzzing of the parsers through the CLI entry point (issue 6).

Hypothesis generates Kineto-like trace documents (plausible step timelines mixed with events whose
fields are missing or of the wrong type, odd top-level objects, NaN/Infinity, byte-level damage,
gzip or not) and Ascend ``kernel_details.csv`` tables (real rows with damaged cells, ragged rows).
Each profile goes through ``advisor analyze`` in-process (click's CliRunner) and must end with
exit 0 or 2, one-line ``advisor:`` messages on stderr, no ``internal error`` (an exception the tool
did not expect) and, on exit 0, a strict-JSON report valid against the contract schema.

CI runs a few examples (``ADVISOR_FUZZ_EXAMPLES``, default 30 per target); ``scripts/fuzz_long.py``
runs the same targets for minutes and saves what fails under ``tests/robustness/found/``.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.robustness.corpus import ASCEND_DIR, ASCEND_KERNELS, HEALTHY, strict_json

EXAMPLES = int(os.environ.get("ADVISOR_FUZZ_EXAMPLES", "30"))
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# The inputs of the failing runs, newest last (scripts/fuzz_long.py saves the last one: after
# shrinking, Hypothesis replays the minimal failing example, so that is the one recorded last).
FAILURES: list[dict[str, bytes]] = []

# -- strategies --------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e300, -1e300, 5e-324, 1e-7, 2**63, 2**64, "", "NaN", "1.5", "abc", "0x10", "1e999"]),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

PHASES = ["X", "X", "X", "B", "E", "i", "I", "M", "s", "f", "C", "b", "e", "Z", ""]
CATS = ["cpu_op", "user_annotation", "python_function", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime",
        "cuda_driver", "gpu_user_annotation", "ac2g", "Trace", "Operator", "Kernel", "Runtime", "Memcpy", "fwdbwd", ""]
NAMES = ["aten::mm", "aten::addmm", "aten::copy_", "aten::to", "aten::item", "aten::_local_scalar_dense",
         "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "Optimizer.step#SGD.step",
         "cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
         "nccl:all_reduce", "gloo:all_reduce", "record_param_comms", "Memcpy HtoD (Pageable -> Device)",
         "void at::native::vectorized_elementwise_kernel<4>", "process_name", "thread_name", "{{ 7*7 }}",
         "<script>alert(1)</script>", "a\nb\x1b[0m", ""]
ARG_KEYS = ["correlation", "External id", "external id", "bytes", "stream", "Input Dims", "Input type", "flops",
            "Call stack", "name", "In msg nelems", "dtype", "Process Group Name", "Group size", "device"]


@st.composite
def timeline(draw: Any) -> list[dict[str, Any]]:
    """A plausible trace: a few ProfilerStep windows with operators (host and device) inside."""
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    t = draw(st.floats(min_value=0, max_value=1e13, allow_nan=False))
    for step in range(draw(st.integers(min_value=0, max_value=4))):
        length = draw(st.floats(min_value=1, max_value=1e6, allow_nan=False))
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + draw(st.integers(0, 3))}",
                       "pid": 1, "tid": 1, "ts": t, "dur": length, "args": {}})
        for _ in range(draw(st.integers(min_value=0, max_value=6))):
            off = draw(st.floats(min_value=0, max_value=length, allow_nan=False))
            dur = draw(st.floats(min_value=0, max_value=length, allow_nan=False))
            cat = draw(st.sampled_from(CATS))
            args = {k: draw(st.one_of(st.integers(-5, 10**6), st.text(max_size=10), json_values))
                    for k in draw(st.lists(st.sampled_from(ARG_KEYS), max_size=3, unique=True))}
            events.append({"ph": "X", "cat": cat, "name": draw(st.sampled_from(NAMES)),
                           "pid": draw(st.sampled_from([1, 0, 7, "1", "gpu"])), "tid": draw(st.sampled_from([1, 2, 7, "stream 7"])),
                           "ts": t + off, "dur": dur, "args": args})
        t += length + draw(st.floats(min_value=0, max_value=1e4, allow_nan=False))
    return events


@st.composite
def broken_event(draw: Any) -> Any:
    """An event with some fields missing or of any JSON type, or not an object at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    ev: dict[str, Any] = {
        "ph": draw(st.sampled_from(PHASES)),
        "cat": draw(st.sampled_from(CATS)),
        "name": draw(st.sampled_from(NAMES) | st.text(max_size=20)),
        "pid": draw(st.integers(0, 3)),
        "tid": draw(st.integers(0, 3)),
        "ts": draw(st.floats(min_value=0, max_value=1e7)),
        "dur": draw(st.floats(min_value=0, max_value=1e5)),
        "args": {},
    }
    for key in draw(st.lists(st.sampled_from(sorted(ev)), max_size=4, unique=True)):
        if draw(st.booleans()):
            del ev[key]
        else:
            ev[key] = draw(json_values)
    if draw(st.booleans()):
        ev[draw(st.text(max_size=6))] = draw(json_values)
    return ev


@st.composite
def kineto_document(draw: Any) -> Any:
    if draw(st.integers(0, 14)) == 0:
        return draw(json_values)  # not an object at all
    events = draw(timeline()) + draw(st.lists(broken_event(), max_size=8))
    events = draw(st.permutations(events)) if draw(st.booleans()) else events
    doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events}
    optional = {
        "deviceProperties": st.one_of(st.just([]), st.just([{"name": "GPU", "totalGlobalMem": 1}]), json_values),
        "distributedInfo": st.one_of(
            st.fixed_dictionaries({"rank": st.integers(-2, 3), "world_size": st.integers(-1, 4), "backend": st.sampled_from(["nccl", "gloo", ""])}),
            json_values),
        "baseTimeNanoseconds": st.one_of(st.integers(0, 2**63), st.sampled_from(["1790857026000000000", "x", 1e300]), json_values),
        "displayTimeUnit": st.one_of(st.sampled_from(["ms", "ns"]), json_values),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        doc[key] = draw(optional[key])
    if draw(st.integers(0, 9)) == 0:
        doc["traceEvents"] = draw(json_values)
    if draw(st.integers(0, 9)) == 0:
        del doc["schemaVersion"]
    return doc


@st.composite
def damaged_bytes(draw: Any, data: bytes) -> bytes:
    """Byte-level damage: truncation, insertion, overwrite, BOM (or none)."""
    how = draw(st.sampled_from(["none", "none", "none", "truncate", "insert", "overwrite", "bom"]))
    if how == "none" or not data:
        return data
    i = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:i]
    if how == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    if how == "overwrite":
        b = draw(st.binary(min_size=1, max_size=8))
        return data[:i] + b + data[i + len(b):]
    return b"\xef\xbb\xbf" + data


@st.composite
def kineto_files(draw: Any) -> dict[str, bytes]:
    """One or two trace files of a profile directory: name -> bytes."""
    files: dict[str, bytes] = {}
    names = ["rank0.pt.trace.json", "rank1.pt.trace.json", "worker0.123456789012.pt.trace.json", "trace.json"]
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)):
        data = json.dumps(draw(kineto_document()), allow_nan=True).encode("utf-8", "surrogatepass")
        data = draw(damaged_bytes(data))
        if draw(st.booleans()):
            data = gzip.compress(data, compresslevel=1)
            data = draw(damaged_bytes(data)) if draw(st.integers(0, 2)) == 0 else data
            name += ".gz"
        files[name] = data
    return files


@st.composite
def damaged_real_trace(draw: Any) -> dict[str, bytes]:
    """The real cpu_healthy trace with byte-level damage (exercises the full pipeline)."""
    raw = gzip.decompress(HEALTHY.read_bytes())
    data = draw(damaged_bytes(raw))
    if data == raw:
        i = draw(st.integers(0, len(raw) - 1))
        data = raw[:i] + draw(st.binary(min_size=1, max_size=4)) + raw[i + 1:]
    return {"rank0.pt.trace.json": data}


def _kernel_rows() -> list[list[str]]:
    return list(csv.reader(io.StringIO(ASCEND_KERNELS.read_text(encoding="utf-8"))))


CELL_JUNK = st.one_of(st.sampled_from(["", "N/A", "abc", "NaN", "inf", "-1", "1e300", "0x1F", "1,5", '"', "\n", "\r\n"]),
                      st.text(max_size=12), st.integers(-(2**70), 2**70).map(str),
                      st.floats(allow_nan=True, allow_infinity=True).map(repr))


@st.composite
def ascend_csv(draw: Any) -> dict[str, bytes]:
    """kernel_details.csv: the real header (maybe damaged) and real rows with damaged cells."""
    rows = _kernel_rows()
    header, body = rows[0], rows[1:]
    picked = [list(body[i]) for i in draw(st.lists(st.integers(0, len(body) - 1), min_size=0, max_size=25))]
    for r in picked:
        for _ in range(draw(st.integers(0, 3))):
            j = draw(st.integers(0, len(r) - 1))
            r[j] = draw(CELL_JUNK)
        cut = draw(st.sampled_from(["keep"] * 8 + ["short", "long"]))
        if cut == "short":
            del r[draw(st.integers(0, len(r) - 1)):]
        elif cut == "long":
            r.extend(draw(st.lists(CELL_JUNK, min_size=1, max_size=3)))
    header = list(header)
    if draw(st.integers(0, 5)) == 0:
        header.pop(draw(st.integers(0, len(header) - 1)))
    if draw(st.integers(0, 5)) == 0:
        header.append(draw(st.text(max_size=10)))
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=draw(st.sampled_from([",", ",", ",", ";", "\t"])),
                   lineterminator=draw(st.sampled_from(["\n", "\r\n"])),
                   # Python 3.10 refuses a NUL cell unless an escapechar is set (3.11+ writes it as is)
                   **({"escapechar": "\\"} if sys.version_info < (3, 11) else {}))
    w.writerows([header, *picked])
    data = draw(damaged_bytes(buf.getvalue().encode("utf-8", "surrogatepass")))
    return {f"{ASCEND_DIR}/ASCEND_PROFILER_OUTPUT/kernel_details.csv": data}


# -- the property ------------------------------------------------------------------------------------


def write_profile(root: Path, files: dict[str, bytes]) -> Path:
    prof = root / "profile"
    prof.mkdir()
    for name, data in files.items():
        p = prof / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return prof


def run_in_process(profile: Path, out: Path, fmt: str = "json") -> tuple[int, str, BaseException | None]:
    """``advisor analyze PROFILE --format FMT --out OUT`` through click's CliRunner: (exit code, stderr, exception)."""
    from click.testing import CliRunner

    from advisor.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["analyze", str(profile), "--format", fmt, "--out", str(out)])
    exc = result.exception if result.exception is not None and not isinstance(result.exception, SystemExit) else None
    try:
        err = result.stderr
    except ValueError:  # click < 8.2 mixes the streams
        err = result.output
    return result.exit_code, err, exc


def check_profile(files: dict[str, bytes]) -> None:
    """The property: the CLI handles the profile without an unexpected exception and writes strict JSON."""
    with tempfile.TemporaryDirectory(prefix="advisor-fuzz-") as td:
        root = Path(td)
        prof = write_profile(root, files)
        out = root / "out" / "report.json"
        out.parent.mkdir()
        try:
            code, err, exc = run_in_process(prof, out)
            assert exc is None, f"exception escaped the CLI: {type(exc).__name__}: {exc}"
            assert code in (0, 2), f"exit code {code}; stderr: {err[:500]}"
            assert "Traceback" not in err, err[:2000]
            assert "internal error" not in err, err[:2000]
            for line in err.splitlines():
                assert line.startswith("advisor:"), f"stderr line {line[:200]!r}"
                assert line.isprintable(), f"control characters in stderr line {line[:200]!r}"
            if code == 0:
                from tests.conftest import validate_report

                validate_report(strict_json(out.read_text(encoding="utf-8")))
            else:
                assert not out.exists(), "exit 2 but a report was written"
            leftovers = sorted(p.name for p in out.parent.iterdir() if p != out)
            assert not leftovers, f"files left beside the report: {leftovers}"
        except AssertionError:
            FAILURES.append(dict(files))
            raise


def _has_ascend() -> bool:
    try:
        return importlib.util.find_spec("advisor.ingest.ascend") is not None
    except ModuleNotFoundError:
        return False


# target name -> strategy of {relative path: bytes}; scripts/fuzz_long.py runs the same ones
TARGETS = {
    "kineto": kineto_files(),
    "kineto_real_damaged": damaged_real_trace(),
    "ascend_csv": ascend_csv(),
}


@pytest.mark.slow
@FUZZ_SETTINGS
@given(files=kineto_files())
def test_fuzz_kineto_documents(files: dict[str, bytes]) -> None:
    check_profile(files)


@pytest.mark.slow
@settings(FUZZ_SETTINGS, max_examples=max(3, EXAMPLES // 3))
@given(files=damaged_real_trace())
def test_fuzz_real_trace_damaged(files: dict[str, bytes]) -> None:
    check_profile(files)


@pytest.mark.slow
@pytest.mark.skipif(not _has_ascend(), reason="the Ascend reader (advisor/ingest/ascend.py) is not there yet")
@FUZZ_SETTINGS
@given(files=ascend_csv())
def test_fuzz_ascend_kernel_details(files: dict[str, bytes]) -> None:
    check_profile(files)
