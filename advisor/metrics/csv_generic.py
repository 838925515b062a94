"""A generic CSV of hardware series: long (``time, node, device, metric, value[, unit]``, one sample a
row) or wide (a time column and one column per series, named by its canonical metric or kept under
its own name).
"""

from __future__ import annotations

from pathlib import Path

from advisor.metrics.common import ReadContext, Sample, parse_number, parse_time
from advisor.metrics.tabular import (
    DEVICE_COLUMNS,
    NODE_COLUMNS,
    TIME_COLUMNS,
    Table,
    csv_rows,
    device_of,
    field,
    first_line,
    notes,
)
from advisor.metrics.vocab import CANONICAL, Alias


def sniff(head: str) -> bool:
    cols = [field(c)[0] for c in first_line(head)]
    return len(cols) >= 2 and any(c in TIME_COLUMNS for c in cols)


def read(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = csv_rows(text, path)
    low = [field(c)[0] for c in rows[0]]
    if "metric" in low and "value" in low:
        return _read_long(rows, low, rc)
    t = Table(rc, "csv")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        return ((name, 1.0) if name in CANONICAL else None), unit

    out = t.read(rows, resolve)
    notes(rc, t, "csv")
    return out


def _read_long(rows: list[list[str]], low: list[str], rc: ReadContext) -> list[Sample]:
    """time, node, device, metric, value[, unit]: one sample a row; a canonical metric is taken in
    its canonical unit, another one kept with the file's unit."""
    ix = {c: i for i, c in enumerate(low)}
    tcol = next((ix[c] for c in TIME_COLUMNS if c in ix), None)
    ncol = next((ix[c] for c in NODE_COLUMNS if c in ix), None)
    dcol = next((ix[c] for c in DEVICE_COLUMNS if c in ix), None)
    ucol = ix.get("unit")
    out: list[Sample] = []
    zone_less = False
    for row in rows[1:]:
        if len(row) <= max(ix["metric"], ix["value"]):
            continue
        value, vunit = parse_number(row[ix["value"]])
        name = row[ix["metric"]].strip()
        if value is None or not name:
            continue
        ts = None
        if tcol is not None and tcol < len(row):
            ts, zl = parse_time(row[tcol], rc.tz_offset_s)
            zone_less |= zl
        node = row[ncol].strip() or None if ncol is not None and ncol < len(row) else None
        dev = device_of(row[dcol]) if dcol is not None and dcol < len(row) else None
        unit = (row[ucol].strip() or None) if ucol is not None and ucol < len(row) else vunit
        key = name.lower()
        alias: Alias | None = (key, 1.0) if key in CANONICAL else None
        out.append(rc.sample(ts, node, dev, name, value, "csv", alias, unit))
    if zone_less:
        rc.notes.append("zone_less")
    return out
