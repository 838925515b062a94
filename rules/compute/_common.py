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
from typing import Any

from advisor.engine.derived import register, sql_table

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
# Device kernels of a Kineto trace with the innermost host operator whose interval holds the
# launch (runtime event with the same correlation id, on the same thread). Columns: rank, step,
# kernel, start_ns, dur_ns, op_name, op_start_ns, op_dur_ns, op_flops, shapes, dtypes, pid, tid.
_KK = """
kk AS (
    SELECT k.rank, k.step, k.name AS kernel, k.start_ns, k.dur_ns, k.corr, r.pid, r.tid, r.start_ns AS launch_ns,
           r.ext_id AS launch_ext
    FROM events k JOIN events r ON r.rank = k.rank AND r.corr = k.corr AND NOT r.device AND r.kind = 'runtime'
    WHERE k.device AND k.kind = 'kernel' AND k.corr IS NOT NULL
)"""
# the launching operator: the launch call carries its operator's External id (hash join) ...
_KOP_BY_EXT = """
    SELECT kk.* EXCLUDE (launch_ext), o.name AS op_name, o.start_ns AS op_start_ns, o.dur_ns AS op_dur_ns,
           o.flops AS op_flops, o.shapes, o.dtypes, 1 AS depth_rank
    FROM kk JOIN events o ON o.rank = kk.rank AND o.ext_id = kk.launch_ext AND NOT o.device AND o.kind = 'host_op'"""
# ... only launches without one fall back to the enclosing operators on the thread, innermost first
_KOP_ENCLOSING = """
    SELECT * EXCLUDE (rn), rn AS depth_rank FROM (
        SELECT kk.* EXCLUDE (launch_ext), o.name AS op_name, o.start_ns AS op_start_ns, o.dur_ns AS op_dur_ns,
               o.flops AS op_flops, o.shapes, o.dtypes,
               row_number() OVER (PARTITION BY kk.rank, kk.corr ORDER BY o.dur_ns, o.start_ns DESC) AS rn
        FROM kk JOIN events o ON o.rank = kk.rank AND o.step IS NOT DISTINCT FROM kk.step AND o.pid = kk.pid
             AND o.tid = kk.tid AND NOT o.device AND o.kind = 'host_op'
             AND o.start_ns <= kk.launch_ns AND o.start_ns + o.dur_ns >= kk.launch_ns
        WHERE kk.launch_ext IS NULL
    )"""
KINETO_KERNEL_OPS = f"{_KK},\nkop AS ({_KOP_BY_EXT}\n    UNION ALL{_KOP_ENCLOSING}\n)"

KERNEL_OPS = "kernel_ops"  # the rows of kop above as a shared table, built once when a rule reads it
_KERNEL_OPS_COLS = " SELECT rank, step, corr, dur_ns, pid, tid, op_name, op_start_ns, op_dur_ns, shapes FROM kop"
# kop without its fallback branch, for traces whose every launch carries an External id: kk is then read
# once, so DuckDB inlines it and builds its hash tables on the launches instead of on all host operators
_KINETO_KERNEL_OPS_BY_EXT = f"{_KK},\nkop AS ({_KOP_BY_EXT}\n)"
_kernel_ops_all = sql_table("WITH " + KINETO_KERNEL_OPS + _KERNEL_OPS_COLS)
_kernel_ops_by_ext = sql_table("WITH " + _KINETO_KERNEL_OPS_BY_EXT + _KERNEL_OPS_COLS)


def _build_kernel_ops(con: Any, name: str) -> None:
    # the fallback branch only joins launches without an External id: skip it when there are none
    no_ext = con.cursor().execute(
        "SELECT count(*) FROM events WHERE NOT device AND kind = 'runtime' AND corr IS NOT NULL AND ext_id IS NULL"
    ).fetchone()[0]
    (_kernel_ops_all if no_ext else _kernel_ops_by_ext)(con, name)


register(
    KERNEL_OPS,
    "Kineto device kernels with the host operator that launched them (the rows of KINETO_KERNEL_OPS' kop): "
    "rank, step, corr, dur_ns (the kernel's), pid, tid, op_name, op_start_ns, op_dur_ns, shapes",
    _build_kernel_ops,
)
