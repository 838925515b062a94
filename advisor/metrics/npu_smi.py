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
