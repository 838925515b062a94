"""What the CSV readers of GPU tools share: the CSV rows, header fields with their units, the
time / node / device columns, and the row-by-row reading of one sample per numeric cell."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from advisor.metrics.common import MetricsError, ReadContext, Sample, parse_number, parse_time
from advisor.metrics.vocab import Alias, unit_factor

TIME_COLUMNS = ("timestamp", "time", "ts", "datetime", "date", "time_ns", "timestamp_ns", "ts_ns", "epoch")
NODE_COLUMNS = ("node", "host", "hostname", "instance", "nodename")
DEVICE_COLUMNS = ("device", "gpu", "index", "gpu_index", "device_id", "npu", "npu_id", "card")
# identity columns of the tools: text, no series
_IDENTITY = {"name", "uuid", "pci.bus_id", "pci.bus", "serial", "driver_version", "vbios_version", "gpu_bdf",
             "gpu_uuid", "card series", "card model", "card vendor", "card sku", "pstate", "model"}

_BRACKET_RE = re.compile(r"^(.*?)\s*\[([^\]]*)\]\s*$")


def csv_rows(text: str, path: Path) -> list[list[str]]:
    try:
        rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(c.strip() for c in r)]
    except csv.Error as exc:
        raise MetricsError(f"not a readable CSV: {exc}") from None
    if len(rows) < 2:
        raise MetricsError("no data rows under the CSV header")
    return rows


def first_line(head: str) -> list[str]:
    line = next((ln for ln in head.splitlines() if ln.strip()), "")
    return [c.strip().strip('"').lower() for c in line.split(",")]


def field(col: str) -> tuple[str, str | None]:
    """``utilization.gpu [%]`` -> (``utilization.gpu``, ``%``)."""
    m = _BRACKET_RE.match(col.strip())
    return (m.group(1).strip().lower(), m.group(2).strip()) if m else (col.strip().lower(), None)


def device_of(text: str) -> str | None:
    t = text.strip().strip('"')
    if not t:
        return None
    m = re.fullmatch(r"(?:card|gpu|nvidia|npu)?\s*(\d+)", t, re.IGNORECASE)
    return m.group(1) if m else t


class Table:
    """Reads the rows of a CSV whose columns are mapped to series by ``resolve``."""

    def __init__(self, rc: ReadContext, source: str) -> None:
        self.rc, self.source = rc, source
        self.zone_less = False
        self.skipped: set[str] = set()

    def read(self, rows: list[list[str]], resolve: object) -> list[Sample]:
        header = [c.strip().strip('"') for c in rows[0]]
        low = [c.lower() for c in header]
        tcol = next((i for i, c in enumerate(low) if field(c)[0] in TIME_COLUMNS), None)
        ncol = next((i for i, c in enumerate(low) if c in NODE_COLUMNS), None)
        dcol = next((i for i, c in enumerate(low) if field(c)[0] in DEVICE_COLUMNS), None)
        out: list[Sample] = []
        for row in rows[1:]:
            if [c.strip().lower() for c in row] == low:  # a header repeated (nvidia-smi -l appends)
                continue
            ts = None
            if tcol is not None and tcol < len(row):
                ts, zl = parse_time(row[tcol], self.rc.tz_offset_s)
                self.zone_less |= zl
            node = row[ncol].strip() or None if ncol is not None and ncol < len(row) else None
            dev = device_of(row[dcol]) if dcol is not None and dcol < len(row) else None
            for i, col in enumerate(header):
                if i in (tcol, ncol, dcol) or i >= len(row):
                    continue
                name, hunit = field(col)
                if name in _IDENTITY:
                    continue
                value, vunit = parse_number(row[i])
                if value is None:
                    if row[i].strip() and row[i].strip().upper() not in ("N/A", "[N/A]", "NA"):
                        self.skipped.add(col)
                    continue
                alias, unit = resolve(name, hunit or vunit)  # type: ignore[operator]
                out.append(self.rc.sample(ts, node, dev, name, value, self.source, alias, unit))
        return out


def unit_alias(canon: str | None, unit: str | None) -> Alias | None:
    """(canonical, factor) for a value written in ``unit``; None when the unit is not understood."""
    if canon is None:
        return None
    if canon in ("throttle_reasons", "ecc_errors"):
        return canon, 1.0
    f = unit_factor(unit)
    return None if f is None else (canon, f)


def notes(rc: ReadContext, t: Table, tool: str) -> None:
    if t.zone_less:
        rc.notes.append("zone_less")
    if t.skipped:
        rc.notes.append("text columns skipped (no number): " + ", ".join(sorted(t.skipped)[:10]))
