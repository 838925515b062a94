"""Shared helpers of the computation rules: the device table, dtype classes, tensor sizes.

Not a rule module (the leading underscore keeps the registry from importing it as one).
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from advisor.engine.derived import register

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEVICES_FILE = Path(__file__).with_name("devices.toml")


@dataclass(frozen=True)
class Device:
    """One entry of devices.toml."""

    id: str
    peak_tflops: dict[str, float] = field(default_factory=dict)
    peak_gbps: float | None = None
    cores: int | None = None
    vector_cores: int | None = None
    nominal_mhz: float | None = None
    links_gbps: dict[str, float] = field(default_factory=dict)  # link kind -> peak per direction, 10^9 B/s
    memory_gb: float | None = None

    def peak_for(self, dtype_class: str | None) -> tuple[float | None, str | None]:
        """Peak TFLOP/s for a dtype class, falling back to the half-precision figure."""
        for key in (dtype_class, "fp16", "bf16", "fp32"):
            if key and key in self.peak_tflops:
                return float(self.peak_tflops[key]), key
        return None, None


@functools.lru_cache(maxsize=1)
def _table() -> tuple[tuple[tuple[re.Pattern[str], ...], Device], ...]:
    data = tomllib.loads(DEVICES_FILE.read_text(encoding="utf-8"))
    out = []
    for d in data.get("device", []):
        pats = tuple(re.compile(p, re.IGNORECASE) for p in d.get("match", []))
        dev = Device(
            id=d["id"],
            peak_tflops={k: float(v) for k, v in d.get("peak_tflops", {}).items()},
            peak_gbps=d.get("peak_gbps"),
            cores=d.get("cores"),
            vector_cores=d.get("vector_cores"),
            nominal_mhz=d.get("nominal_mhz"),
            links_gbps={k: float(v) for k, v in d.get("links_gbps", {}).items()},
            memory_gb=d.get("memory_gb"),
        )
        out.append((pats, dev))
    return tuple(out)


def match_device(name: str | None) -> Device | None:
    """The devices.toml entry whose pattern matches ``name`` first (None when unknown)."""
    if not name:
        return None
    for pats, dev in _table():
        if any(p.search(name) for p in pats):
            return dev
    return None


def rank_devices(ctx: Any) -> dict[int, tuple[str | None, Device | None]]:
    """Per rank with device events: (device_name as exported, matched table entry or None)."""
    rows = ctx.query("SELECT rank, device_name FROM ranks WHERE coalesce(has_device, true) ORDER BY rank")
    return {int(r["rank"]): (r["device_name"], match_device(r["device_name"])) for r in rows}


def device_label(name: str | None) -> str:
    """A device as named in a note: its exported name, or that the export names none."""
    return repr(name) if name else "(unnamed in the export)"


def meta_number(ctx: Any, rank: int, keys: tuple[str, ...]) -> float | None:
    """A numeric ``meta`` value for the rank (or profile-wide) under the first key present."""
    return meta_numbers(ctx, keys)(rank)


def meta_numbers(ctx: Any, keys: tuple[str, ...]) -> Callable[[int], float | None]:
    """:func:`meta_number` for any rank, from one query."""
    rows = ctx.query(
        "SELECT rank, key, value FROM meta WHERE key IN (SELECT unnest($keys)) ORDER BY rank NULLS LAST",
        {"keys": list(keys)},
    )

    def number(rank: int) -> float | None:
        by_key: dict[str, Any] = {}
        for r in rows:  # the rank's own values first, then profile-wide ones
            if r["rank"] == rank or r["rank"] is None:
                by_key.setdefault(r["key"], r["value"])
        for k in keys:
            try:
                return float(by_key[k])
            except (KeyError, TypeError, ValueError):
                continue
        return None

    return number


# --------------------------------------------------------------------------- dtypes
_DTYPE_CLASS = {
    # Ascend (kernel_details "Input Data Types")
    "float16": "fp16", "fp16": "fp16", "half": "fp16", "c10::half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "dt_bf16": "bf16", "c10::bfloat16": "bf16",
    "float": "fp32", "float32": "fp32", "fp32": "fp32", "hifloat32": "tf32", "tf32": "tf32",
    "double": "fp64", "float64": "fp64",
    "int8": "int8", "uint8": "int8", "signed char": "int8", "unsigned char": "int8",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8",
}
_DTYPE_BYTES = {
    "float16": 2, "fp16": 2, "half": 2, "c10::half": 2, "bf16": 2, "bfloat16": 2, "dt_bf16": 2,
    "c10::bfloat16": 2, "int16": 2, "uint16": 2, "short": 2, "short int": 2,
    "float": 4, "float32": 4, "fp32": 4, "hifloat32": 4, "int32": 4, "uint32": 4, "int": 4,
    "double": 8, "float64": 8, "int64": 8, "uint64": 8, "long": 8, "long int": 8, "long long": 8,
    "complex64": 8, "c10::complex<float>": 8, "complex128": 16, "c10::complex<double>": 16,
    "int8": 1, "uint8": 1, "bool": 1, "signed char": 1, "unsigned char": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}


def _norm_dtype(d: str) -> str:
    d = d.strip().strip('"').strip().lower()
    return d[3:] if d.startswith("dt_") and d != "dt_bf16" else d


def dtype_class(dtypes: str | None) -> str | None:
    """Compute class (fp16, bf16, fp32, ...) of the first floating-point input dtype."""
    for d in split_list(dtypes):
        c = _DTYPE_CLASS.get(_norm_dtype(d))
        if c:
            return c
    return None


def split_list(text: str | None) -> list[str]:
    """Split an exported list: Ascend ``a;b`` or Kineto JSON ``["a", "b"]``."""
    if text is None:
        return []
    s = str(text).strip()
    if s.startswith("["):
        try:
            val = json.loads(s)
            if isinstance(val, list):
                return [v if isinstance(v, str) else json.dumps(v) for v in val]
        except ValueError:
            pass
    s = s.strip('"')
    if not s or s.upper() in ("N/A", "NULL"):
        return []
    return s.split(";")


def _shapes(text: str | None) -> list[list[int] | None]:
    """Shapes from Ascend ``"4,1024;3"`` or Kineto ``[[4, 1024], [3]]``; None for an unparsable entry."""
    if text is None:
        return []
    s = str(text).strip()
    if s.startswith("["):
        try:
            val = json.loads(s)
        except ValueError:
            return []
        out: list[list[int] | None] = []
        for v in val if isinstance(val, list) else []:
            if isinstance(v, list) and all(isinstance(x, int) for x in v):
                out.append(list(v))
            else:
                out.append(None)  # tensor lists and non-tensor arguments
        return out
    s = s.strip('"')
    if not s or s.upper() in ("N/A", "NULL"):
        return []
    res: list[list[int] | None] = []
    for part in s.split(";"):
        part = part.strip()
        if not part:
            res.append([])  # a scalar tensor
            continue
        try:
            res.append([int(x) for x in part.split(",")])
        except ValueError:
            res.append(None)
    return res


def tensor_bytes(shapes: str | None, dtypes: str | None) -> float | None:
    """Bytes of the listed tensors (product of dims x element size); None when nothing is known."""
    shp = _shapes(shapes)
    dts = split_list(dtypes)
    total, known = 0.0, False
    for i, dims in enumerate(shp):
        if dims is None or i >= len(dts):
            continue
        size = _DTYPE_BYTES.get(_norm_dtype(dts[i]))
        if size is None:
            continue
        n = 1
        for x in dims:
            n *= max(int(x), 0)
        total += n * size
        known = True
    return total if known else None


# --------------------------------------------------------------------------- Kineto attribution
# Which host operators launched each device kernel of a Kineto trace. The kernel's launch is the
# runtime call with its correlation id; the operators are those open on the launching thread at
# the launch (start <= launch < end), found by :func:`advisor.engine.derived.enclosing_intervals`
# (the call stack, as HTA's call graph has it): the top-level one, and the innermost of the
# operators with FLOPs and of the conversions (each set searched on its own). The launch's
# "External id" is not used: real exports have it pointing at the launch's own correlation
# instead of an operator, or at a user annotation; the enclosing operators are there whatever
# the exporter did.
# the launching threads: every host thread with a runtime call, numbered (a kernel's launch is one)
_THREADS = """
CREATE OR REPLACE TEMP TABLE _kop_thread AS
SELECT rank, pid, tid, (row_number() OVER ())::INTEGER AS th
FROM (SELECT DISTINCT rank, pid, tid FROM events WHERE NOT device AND kind = 'runtime' AND start_ns IS NOT NULL)
"""
# each kernel with its launch (the runtime call with its correlation id) and the launching thread
_LAUNCHES = """
SELECT k.rank, k.step, k.corr, k.start_ns, k.dur_ns, t.th, r.start_ns AS launch_ns
FROM events k JOIN events r ON r.rank = k.rank AND r.corr = k.corr AND NOT r.device AND r.kind = 'runtime'
JOIN _kop_thread t ON t.rank = r.rank AND t.pid = r.pid AND t.tid = r.tid
WHERE k.device AND k.kind = 'kernel' AND k.corr IS NOT NULL AND r.start_ns IS NOT NULL
"""
# operators holding a format / dtype conversion (CMP004); clone and contiguous only when they copied a tensor
CONVERSION_OP_SQL = ("(name IN ('aten::_to_copy', 'aten::to') OR "
                     "(name IN ('aten::contiguous', 'aten::clone') AND coalesce(shapes, '') <> ''))")
_HOST_OP = "NOT device AND kind = 'host_op'"
# the operators with FLOPs and the conversions on launching threads, with what kernel_ops shows of them
_OPS = f"""
CREATE OR REPLACE TEMP TABLE _kop_ops AS
SELECT t.th, e.start_ns AS s, e.start_ns + e.dur_ns AS e, e.rowid AS oid, coalesce(flops > 0, false) AS has_flops,
       coalesce({CONVERSION_OP_SQL}, false) AS conv, e.name, e.flops, e.shapes, e.dtypes
FROM events e JOIN _kop_thread t ON t.rank = e.rank AND t.pid = e.pid AND t.tid = e.tid
WHERE {_HOST_OP} AND e.start_ns IS NOT NULL AND e.dur_ns > 0 AND (flops > 0 OR {CONVERSION_OP_SQL})
"""
# top-level operators do not overlap: the one holding a launch is found among them alone
_TOPS = """
SELECT t.th, h.start_ns AS s, h.start_ns + h.dur_ns AS e, h.oid FROM host_op_top h
JOIN _kop_thread t ON t.rank = h.rank AND t.pid = h.pid AND t.tid = h.tid
WHERE h.start_ns IS NOT NULL AND h.dur_ns > 0
"""
# the launches and what was found for them (``_kop_res``: numbers only) joined with the names
_ASSEMBLE = """
CREATE OR REPLACE TABLE {name} AS
SELECT r.rank::INTEGER AS rank, r.step::INTEGER AS step, r.corr, r.start_ns, r.dur_ns, t.pid, t.tid, r.launch_ns,
       r.top_oid, r.top_start_ns, r.top_dur_ns, r.fop_oid, r.fop_start_ns, r.fop_dur_ns, r.conv_oid,
       f.name AS fop_name, f.flops AS fop_flops, f.shapes AS fop_shapes, f.dtypes AS fop_dtypes,
       c.name AS conv_name, c.shapes AS conv_shapes
FROM _kop_res r JOIN _kop_thread t ON t.th = r.th
LEFT JOIN (SELECT oid, name, flops, shapes, dtypes FROM _kop_ops WHERE has_flops) f ON f.oid = r.fop_oid
LEFT JOIN (SELECT oid, name, shapes FROM _kop_ops WHERE conv) c ON c.oid = r.conv_oid
"""


# the table's columns when no device kernel has a correlation id (a CPU-only trace): no launch to attribute
_NO_LAUNCHES = """
CREATE OR REPLACE TABLE {name} AS
SELECT rank::INTEGER AS rank, step::INTEGER AS step, corr, start_ns, dur_ns, pid, tid, start_ns AS launch_ns,
       NULL::BIGINT AS top_oid, NULL::BIGINT AS top_start_ns, NULL::BIGINT AS top_dur_ns, NULL::BIGINT AS fop_oid,
       NULL::BIGINT AS fop_start_ns, NULL::BIGINT AS fop_dur_ns, NULL::BIGINT AS conv_oid, name AS fop_name,
       flops::DOUBLE AS fop_flops, shapes AS fop_shapes, dtypes AS fop_dtypes, name AS conv_name, shapes AS conv_shapes
FROM events WHERE false
"""


def _build_kernel_ops(con: Any, name: str) -> None:
    import numpy as np
    import pyarrow as pa

    from advisor.engine.derived import enclosing_intervals

    cur = con.cursor()
    if not cur.execute("SELECT 1 FROM events WHERE device AND kind = 'kernel' AND corr IS NOT NULL LIMIT 1").fetchone():
        cur.execute(_NO_LAUNCHES.format(name=name))
        return
    try:
        cur.execute(_THREADS)
        la = cur.execute(_LAUNCHES).fetchnumpy()
        lth, lt = np.ma.getdata(la["th"]), np.ma.getdata(la["launch_ns"])

        def nullable(a: Any) -> Any:
            if isinstance(a, np.ma.MaskedArray):
                return pa.array(np.ma.getdata(a.filled(0)).astype(np.int64), mask=np.ma.getmaskarray(a))
            return pa.array(a)

        cols: dict[str, Any] = {c: nullable(la[c]) for c in ("rank", "step", "corr", "start_ns", "dur_ns", "th", "launch_ns")}

        def owner(role: str, ops: dict[str, Any], times: bool) -> None:
            """The innermost of ``ops`` open on the launching thread at each launch."""
            th, s, e, oid = (np.ma.getdata(ops[c]) for c in ("th", "s", "e", "oid"))
            idx = enclosing_intervals(th, s, e, lth, lt)
            none = idx < 0
            at = idx[~none]

            def col(values: np.ndarray) -> Any:  # per launch; NULL where no operator was found
                out = np.zeros(len(idx), np.int64)
                out[~none] = values[at]
                return pa.array(out, mask=none)

            cols[f"{role}_oid"] = col(oid)
            if times:
                cols[f"{role}_start_ns"], cols[f"{role}_dur_ns"] = col(s), col(e - s)

        owner("top", cur.execute(_TOPS).fetchnumpy(), True)
        cur.execute(_OPS)
        ops = cur.execute("SELECT th, s, e, oid, has_flops, conv FROM _kop_ops").fetchnumpy()
        for role, flag, times in (("fop", "has_flops", True), ("conv", "conv", False)):
            keep = np.ma.getdata(ops[flag]).astype(bool)
            owner(role, {c: np.ma.getdata(ops[c])[keep] for c in ("th", "s", "e", "oid")}, times)
        cur.register("_kop_res", pa.table(cols))
        cur.execute(_ASSEMBLE.format(name=name))
        cur.unregister("_kop_res")
    finally:
        for t in ("_kop_ops", "_kop_thread"):
            cur.execute(f"DROP TABLE IF EXISTS {t}")


KERNEL_OPS = "kernel_ops"  # built once, before the first rule that declares it runs
register(
    KERNEL_OPS,
    "Kineto device kernels launched from a host thread (rank, step, corr, start_ns, dur_ns: the kernel's; pid, "
    "tid, launch_ns: its launch), each with host operators open on that thread at the launch, named by their "
    "events rowid (*_oid; an operator execution): the top-level one (top_oid, top_start_ns, top_dur_ns; a row of "
    "host_op_top), the innermost with FLOPs (fop_oid, fop_name, fop_start_ns, fop_dur_ns, fop_flops, fop_shapes, "
    "fop_dtypes) and the innermost format / dtype conversion (conv_oid, conv_name, conv_shapes); NULL where there "
    "is none",
    _build_kernel_ops,
    needs=("host_op_top",),
)


# below this share of a rank's kernel time tied to the operator that launched it, per-operator
# device times are mostly missing, and a rule reading kernel_ops says so
KERNEL_TIE_MIN = 0.5
_TIE_SQL = f"""
WITH k AS (SELECT rank, sum(dur_ns) AS all_ns FROM events WHERE device AND kind = 'kernel' GROUP BY rank),
     a AS (SELECT rank, sum(dur_ns) AS tied_ns FROM {KERNEL_OPS} WHERE top_oid IS NOT NULL GROUP BY rank)
SELECT k.rank, k.all_ns, coalesce(a.tied_ns, 0) AS tied_ns FROM k LEFT JOIN a USING (rank)
WHERE k.all_ns > 0 ORDER BY k.rank
"""


def kernel_tie_note(ctx: Any) -> str | None:
    """What to say when most kernel time of some rank could not be tied to a host operator (no
    runtime launch with the kernel's correlation id, or none inside an operator); None when it can."""
    def compute() -> str | None:
        low = [(int(r["rank"]), float(r["tied_ns"]) / float(r["all_ns"])) for r in ctx.query(_TIE_SQL)
               if float(r["tied_ns"]) < KERNEL_TIE_MIN * float(r["all_ns"])]
        note = None
        if low:
            ranks = ", ".join(str(r) for r, _ in low[:8]) + (" ..." if len(low) > 8 else "")
            note = (f"only {max(sh for _, sh in low):.0%} or less of the kernel time of rank(s) {ranks} is tied to the "
                    "host operator that launched it (kernel -> runtime launch with its correlation id -> operator "
                    "open on that thread): per-operator device times there are lower bounds (were runtime events "
                    "recorded?)")
        return note

    return cast("str | None", ctx.once("kernel_tie_note", compute))
