"""``nvidia-smi --query-gpu=... --format=csv`` output.

``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,... --format=csv[,noheader][,nounits]``;
the header names each field with its unit in brackets (``utilization.gpu [%]``), values carry the
unit unless ``nounits`` (``45 %``), ``timestamp`` is local time without a zone (``2024/01/02
03:04:05.678``). ``nvidia-smi --help-query-gpu`` lists the fields; man page:
https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

from __future__ import annotations

from pathlib import Path

from advisor.metrics.common import MetricsError, ReadContext, Sample
from advisor.metrics.tabular import Table, csv_rows, field, first_line, notes, unit_alias
from advisor.metrics.vocab import NVIDIA_SMI, Alias


def sniff(head: str) -> bool:
    cols = [field(c)[0] for c in first_line(head)]
    return any(c in NVIDIA_SMI for c in cols) or (
        any("." in c for c in cols) and any(c in ("timestamp", "index", "pci.bus_id", "uuid") for c in cols))


def read(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = csv_rows(text, path)
    if not any(field(c)[0] in NVIDIA_SMI or "." in c for c in rows[0]):
        raise MetricsError("no nvidia-smi query fields in the header (--format=csv with a header is needed)")
    t = Table(rc, "nvidia-smi")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        if unit is None and name.startswith("memory."):  # nvidia-smi reports memory in MiB
            unit = "MiB"
        return unit_alias(NVIDIA_SMI.get(name), unit), unit

    out = t.read(rows, resolve)
    notes(rc, t, "nvidia-smi")
    return out
