"""``npu-smi info watch`` output (Huawei Ascend).

``npu-smi info watch [-i <npu id>] [-c <chip id>] [-d <seconds>]`` prints a header, ``NpuID(Idx)  ChipId(Idx)  Pwr(W)  Temp(C)  AI Core(%)  AI Cpu(%)
Ctrl Cpu(%) Memory(%)  Memory BW(%)`` (each name ends with its unit in parentheses; one space
may separate two) (newer drivers drop ``ChipId(Idx)`` and add
``NPU Util(%)``, ``AI Cube(%)``), then one whitespace-separated row per device and sample. It
prints no time: a row may be prefixed by one (``... | ts``), else its samples are kept without
times. Documented in the Ascend npu-smi command reference ("info watch"), hiascend.com
(e.g. https://www.hiascend.com/document/detail/en/canncommercial/ , npu-smi reference).
"""

from __future__ import annotations

import re
from pathlib import Path

from advisor.metrics.common import MetricsError, ReadContext, Sample, parse_number, parse_time
from advisor.metrics.vocab import NPU_SMI


def sniff(head: str) -> bool:
    return any(ln.strip().startswith("NpuID") or re.search(r"\bNpuID(\(Idx\))?\s{2,}", ln)
               for ln in head.splitlines()[:20])


def read(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    cols: list[str] | None = None
    out: list[Sample] = []
    untimed = zone_less = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        m = re.search(r"NpuID", line)
        if m is not None:
            # every column name ends with its unit or index in parentheses: "AI Core(%)", "NpuID(Idx)"
            cols = [c.strip() for c in re.findall(r"\S[^()]*?\([^()]*\)", line[m.start():])]
            continue
        if cols is None:
            continue
        toks = line.split()
        n = len(cols)
        if len(toks) < n:
            continue
        ts, zl = parse_time(" ".join(toks[:-n]).rstrip("|").strip(), rc.tz_offset_s)
        zone_less |= zl
        untimed |= ts is None
        vals = dict(zip(cols, toks[-n:], strict=True))
        npu = vals.get(cols[0], "")
        chip = next((v for k, v in vals.items() if k.lower().startswith("chipid")), "0")
        dev = npu if chip in ("0", "") else f"{npu}-{chip}"
        for col, v in vals.items():
            if col == cols[0] or col.lower().startswith("chipid"):
                continue
            value, _u = parse_number(v)
            if value is None:
                continue
            unit = m2.group(1) if (m2 := re.search(r"\(([^()]*)\)$", col)) else None
            out.append(rc.sample(ts, None, dev, f"npu_smi_{col}", value, "npu-smi", NPU_SMI.get(col.lower()), unit))
    if cols is None:
        raise MetricsError("no 'NpuID' header line (npu-smi info watch output)")
    if not out:
        raise MetricsError("no sample rows under the 'NpuID' header")
    if untimed:
        rc.notes.append("untimed")
    if zone_less:
        rc.notes.append("zone_less")
    return out


# -- ``npu-smi info -t <type> -i <id>``: one "key : value" line per reading --------------------------
# ``npu-smi info -t usages -i 0`` prints ``NPU ID : 0``, ``Chip Count : 1``, then ``HBM Capacity(MB) : 65536``,
# ``HBM Usage Rate(%) : 3``, ``Aicore Usage Rate(%) : 0``, ``Aivector Usage Rate(%) : 0`` ... and ``Chip ID : 0``
# (npu-smi reference, "info -t usages":
# https://www.hiascend.com/document/detail/zh/Atlas%20200I%20A2/24.1.RC3/re/npu/npusmi_020.html); ``-t power``,
# ``-t temp`` print ``Power(W)`` / ``Temperature(C)`` lines of the same form. A line holding only a time (a
# ``date`` printed by the loop that ran it) times the readings that follow.

_KV_RE = re.compile(r"^\s*([^:]+?)\s*:\s*(\S.*?)\s*$")
_INFO: dict[str, tuple[str, float]] = {
    "aicore usage rate(%)": ("aicore_util_pct", 1.0),
    "aivector usage rate(%)": ("aivector_util_pct", 1.0),
    "hbm capacity(mb)": ("mem_total_bytes", float(1 << 20)),
    "power(w)": ("power_w", 1.0),
    "npu real-time power(w)": ("power_w", 1.0),
    "temperature(c)": ("temp_gpu_c", 1.0),
    "npu temperature(c)": ("temp_gpu_c", 1.0),
}
_IDS = ("npu id", "chip id", "chip count", "chip logic id")


def sniff_info(head: str) -> bool:
    return any(re.match(r"^\s*NPU ID\s*:\s*\d+\s*$", ln) for ln in head.splitlines()[:40])


def read_info(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    out: list[Sample] = []
    npu: str | None = None
    ts: int | None = None
    untimed = zone_less = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        t, zl = parse_time(line, rc.tz_offset_s)
        if t is not None:
            ts = t
            zone_less |= zl
            continue
        m = _KV_RE.match(line)
        if m is None:
            continue
        key, val = m.group(1), m.group(2)
        low = key.lower()
        if low == "npu id":
            npu = val.strip()
            continue
        if low in _IDS or npu is None:
            continue
        value, _u = parse_number(val)
        if value is None:
            continue
        unit = m2.group(1) if (m2 := re.search(r"\(([^()]*)\)$", key)) else None
        untimed |= ts is None
        out.append(rc.sample(ts, None, npu, f"npu_smi_{key}", value, "npu-smi", _INFO.get(low), unit))
    if not out:
        raise MetricsError("no readings under an 'NPU ID : n' line (npu-smi info -t output)")
    if untimed:
        rc.notes.append("untimed")
    if zone_less:
        rc.notes.append("zone_less")
    return out
