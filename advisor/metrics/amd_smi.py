"""``amd-smi metric --csv`` / ``amd-smi monitor --csv`` output.

``amd-smi metric --csv`` / ``amd-smi monitor --csv``: a ``gpu`` column then the metric keys
flattened with ``_`` (``usage_gfx_activity``, ``power_socket_power``, ``temperature_edge``,
``mem_usage_used_vram``); ``--watch`` adds a ``timestamp`` column;
https://rocm.docs.amd.com/projects/amdsmi/en/latest/how-to/amdsmi-cli-tool.html
"""

from __future__ import annotations

from pathlib import Path

from advisor.metrics.common import ReadContext, Sample
from advisor.metrics.tabular import Table, csv_rows, first_line, notes
from advisor.metrics.vocab import AMD_SMI, Alias, unit_factor


def sniff(head: str) -> bool:
    cols = first_line(head)
    return bool(cols) and cols[0] == "gpu" and any(c in AMD_SMI or "_" in c for c in cols[1:])


def read(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = csv_rows(text, path)
    t = Table(rc, "amd-smi")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        alias = AMD_SMI.get(name)
        if alias is not None and unit is not None and alias[1] != 1.0:  # a value with its unit: convert by it
            f = unit_factor(unit)
            alias = None if f is None else (alias[0], f)
        return alias, unit

    out = t.read(rows, resolve)
    notes(rc, t, "amd-smi")
    return out
