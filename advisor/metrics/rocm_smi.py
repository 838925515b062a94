"""``rocm-smi --csv`` output.

``rocm-smi --showuse --showpower --showtemp --showmemuse --csv``: a ``device`` column (``card0``)
then one column per reading with its unit in parentheses (``Temperature (Sensor edge) (C)``,
``Average Graphics Package Power (W)``, ``GPU use (%)``);
https://rocm.docs.amd.com/projects/rocm_smi_lib/en/latest/ (the CLI, ``rocm_smi.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

from advisor.metrics.common import ReadContext, Sample
from advisor.metrics.tabular import Table, csv_rows, first_line, notes, unit_alias
from advisor.metrics.vocab import ROCM_SMI, Alias

_PAREN_UNIT_RE = re.compile(r"\(([^()]*)\)\s*$")


def sniff(head: str) -> bool:
    cols = first_line(head)
    return bool(cols) and cols[0] == "device" and any(c in ROCM_SMI or "(" in c for c in cols[1:])


def read(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = csv_rows(text, path)
    t = Table(rc, "rocm-smi")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        canon = ROCM_SMI.get(name)
        m = _PAREN_UNIT_RE.search(name)
        hunit = m.group(1) if m else None
        if hunit is not None and hunit.lower() == "c":
            hunit = "C"
        if canon in ("clock_sm_mhz", "clock_mem_mhz"):  # value '(1900Mhz)': the unit is in the value
            return unit_alias(canon, unit or "MHz"), unit
        if canon == "mem_used_bytes" or canon == "mem_total_bytes":
            return (canon, 1.0), "B"
        return unit_alias(canon, hunit if hunit is not None else unit), hunit or unit

    out = t.read(rows, resolve)
    notes(rc, t, "rocm-smi")
    return out
