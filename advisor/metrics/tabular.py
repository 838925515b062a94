"""CSV exports of GPU tools: ``nvidia-smi --query-gpu ... --format=csv``, ``rocm-smi --csv``,
``amd-smi metric|monitor --csv``, and a generic CSV (long: time, node, device, metric, value,
unit; or wide: a time column and one column per series).

Formats, as their documentation gives them:

* nvidia-smi: ``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,... --format=csv[,noheader][,nounits]``;
  the header names each field with its unit in brackets (``utilization.gpu [%]``), values carry
  the unit unless ``nounits`` (``45 %``), ``timestamp`` is local time without a zone
  (``2024/01/02 03:04:05.678``). ``nvidia-smi --help-query-gpu`` lists the fields; man page:
  https://docs.nvidia.com/deploy/nvidia-smi/index.html
* rocm-smi: ``rocm-smi --showuse --showpower --showtemp --showmemuse --csv``: a ``device`` column
  (``card0``) then one column per reading with its unit in parentheses
  (``Temperature (Sensor edge) (C)``, ``Average Graphics Package Power (W)``, ``GPU use (%)``);
  https://rocm.docs.amd.com/projects/rocm_smi_lib/en/latest/ (the CLI, ``rocm_smi.py``).
* amd-smi: ``amd-smi metric --csv`` / ``amd-smi monitor --csv``: a ``gpu`` column then the
  metric keys flattened with ``_`` (``usage_gfx_activity``, ``power_socket_power``,
  ``temperature_edge``, ``mem_usage_used_vram``); ``--watch`` adds a ``timestamp`` column;
  https://rocm.docs.amd.com/projects/amdsmi/en/latest/how-to/amdsmi-cli-tool.html
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from advisor.metrics.common import MetricsError, ReadContext, Sample, parse_number, parse_time
from advisor.metrics.vocab import AMD_SMI, CANONICAL, NVIDIA_SMI, ROCM_SMI, Alias, unit_factor

TIME_COLUMNS = ("timestamp", "time", "ts", "datetime", "date", "time_ns", "timestamp_ns", "ts_ns", "epoch")
NODE_COLUMNS = ("node", "host", "hostname", "instance", "nodename")
DEVICE_COLUMNS = ("device", "gpu", "index", "gpu_index", "device_id", "npu", "npu_id", "card")
# identity columns of the tools: text, no series
_IDENTITY = {"name", "uuid", "pci.bus_id", "pci.bus", "serial", "driver_version", "vbios_version", "gpu_bdf",
             "gpu_uuid", "card series", "card model", "card vendor", "card sku", "pstate", "model"}

_BRACKET_RE = re.compile(r"^(.*?)\s*\[([^\]]*)\]\s*$")
_PAREN_UNIT_RE = re.compile(r"\(([^()]*)\)\s*$")


def _rows(text: str, path: Path) -> list[list[str]]:
    try:
        rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(c.strip() for c in r)]
    except csv.Error as exc:
        raise MetricsError(f"not a readable CSV: {exc}") from None
    if len(rows) < 2:
        raise MetricsError("no data rows under the CSV header")
    return rows


def _first_line(head: str) -> list[str]:
    line = next((ln for ln in head.splitlines() if ln.strip()), "")
    return [c.strip().strip('"').lower() for c in line.split(",")]


def _field(col: str) -> tuple[str, str | None]:
    """``utilization.gpu [%]`` -> (``utilization.gpu``, ``%``)."""
    m = _BRACKET_RE.match(col.strip())
    return (m.group(1).strip().lower(), m.group(2).strip()) if m else (col.strip().lower(), None)


def _device(text: str) -> str | None:
    t = text.strip().strip('"')
    if not t:
        return None
    m = re.fullmatch(r"(?:card|gpu|nvidia|npu)?\s*(\d+)", t, re.IGNORECASE)
    return m.group(1) if m else t


class _Table:
    """Reads the rows of a CSV whose columns are mapped to series by ``resolve``."""

    def __init__(self, rc: ReadContext, source: str) -> None:
        self.rc, self.source = rc, source
        self.zone_less = False
        self.skipped: set[str] = set()

    def read(self, rows: list[list[str]], resolve: object) -> list[Sample]:
        header = [c.strip().strip('"') for c in rows[0]]
        low = [c.lower() for c in header]
        tcol = next((i for i, c in enumerate(low) if _field(c)[0] in TIME_COLUMNS), None)
        ncol = next((i for i, c in enumerate(low) if c in NODE_COLUMNS), None)
        dcol = next((i for i, c in enumerate(low) if _field(c)[0] in DEVICE_COLUMNS), None)
        out: list[Sample] = []
        for row in rows[1:]:
            if [c.strip().lower() for c in row] == low:  # a header repeated (nvidia-smi -l appends)
                continue
            ts = None
            if tcol is not None and tcol < len(row):
                ts, zl = parse_time(row[tcol], self.rc.tz_offset_s)
                self.zone_less |= zl
            node = row[ncol].strip() or None if ncol is not None and ncol < len(row) else None
            dev = _device(row[dcol]) if dcol is not None and dcol < len(row) else None
            for i, col in enumerate(header):
                if i in (tcol, ncol, dcol) or i >= len(row):
                    continue
                name, hunit = _field(col)
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


def _unit_alias(canon: str | None, unit: str | None) -> Alias | None:
    """(canonical, factor) for a value written in ``unit``; None when the unit is not understood."""
    if canon is None:
        return None
    if canon in ("throttle_reasons", "ecc_errors"):
        return canon, 1.0
    f = unit_factor(unit)
    return None if f is None else (canon, f)


# -- nvidia-smi ---------------------------------------------------------------------------------

def sniff_nvidia_smi(head: str) -> bool:
    cols = [_field(c)[0] for c in _first_line(head)]
    return any(c in NVIDIA_SMI for c in cols) or (
        any("." in c for c in cols) and any(c in ("timestamp", "index", "pci.bus_id", "uuid") for c in cols))


def read_nvidia_smi(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = _rows(text, path)
    if not any(_field(c)[0] in NVIDIA_SMI or "." in c for c in rows[0]):
        raise MetricsError("no nvidia-smi query fields in the header (--format=csv with a header is needed)")
    t = _Table(rc, "nvidia-smi")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        if unit is None and name.startswith("memory."):  # nvidia-smi reports memory in MiB
            unit = "MiB"
        return _unit_alias(NVIDIA_SMI.get(name), unit), unit

    out = t.read(rows, resolve)
    _notes(rc, t, "nvidia-smi")
    return out


# -- rocm-smi -----------------------------------------------------------------------------------

def sniff_rocm_smi(head: str) -> bool:
    cols = _first_line(head)
    return bool(cols) and cols[0] == "device" and any(c in ROCM_SMI or "(" in c for c in cols[1:])


def read_rocm_smi(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = _rows(text, path)
    t = _Table(rc, "rocm-smi")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        canon = ROCM_SMI.get(name)
        m = _PAREN_UNIT_RE.search(name)
        hunit = m.group(1) if m else None
        if hunit is not None and hunit.lower() == "c":
            hunit = "C"
        if canon in ("clock_sm_mhz", "clock_mem_mhz"):  # value '(1900Mhz)': the unit is in the value
            return _unit_alias(canon, unit or "MHz"), unit
        if canon == "mem_used_bytes" or canon == "mem_total_bytes":
            return (canon, 1.0), "B"
        return _unit_alias(canon, hunit if hunit is not None else unit), hunit or unit

    out = t.read(rows, resolve)
    _notes(rc, t, "rocm-smi")
    return out


# -- amd-smi ------------------------------------------------------------------------------------

def sniff_amd_smi(head: str) -> bool:
    cols = _first_line(head)
    return bool(cols) and cols[0] == "gpu" and any(c in AMD_SMI or "_" in c for c in cols[1:])


def read_amd_smi(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = _rows(text, path)
    t = _Table(rc, "amd-smi")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        alias = AMD_SMI.get(name)
        if alias is not None and unit is not None and alias[1] != 1.0:  # a value with its unit: convert by it
            f = unit_factor(unit)
            alias = None if f is None else (alias[0], f)
        return alias, unit

    out = t.read(rows, resolve)
    _notes(rc, t, "amd-smi")
    return out


# -- generic CSV --------------------------------------------------------------------------------

def sniff_csv(head: str) -> bool:
    cols = [_field(c)[0] for c in _first_line(head)]
    return len(cols) >= 2 and any(c in TIME_COLUMNS for c in cols)


def read_csv(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    rows = _rows(text, path)
    low = [_field(c)[0] for c in rows[0]]
    if "metric" in low and "value" in low:
        return _read_long(rows, low, rc)
    t = _Table(rc, "csv")

    def resolve(name: str, unit: str | None) -> tuple[Alias | None, str | None]:
        return ((name, 1.0) if name in CANONICAL else None), unit

    out = t.read(rows, resolve)
    _notes(rc, t, "csv")
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
        dev = _device(row[dcol]) if dcol is not None and dcol < len(row) else None
        unit = (row[ucol].strip() or None) if ucol is not None and ucol < len(row) else vunit
        key = name.lower()
        alias: Alias | None = (key, 1.0) if key in CANONICAL else None
        out.append(rc.sample(ts, node, dev, name, value, "csv", alias, unit))
    if zone_less:
        rc.notes.append("zone_less")
    return out


def _notes(rc: ReadContext, t: _Table, tool: str) -> None:
    if t.zone_less:
        rc.notes.append("zone_less")
    if t.skipped:
        rc.notes.append("text columns skipped (no number): " + ", ".join(sorted(t.skipped)[:10]))
