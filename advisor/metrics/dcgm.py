"""DCGM: ``dcgmi dmon`` output and the DCGM exporter's Prometheus text.

* ``dcgmi dmon -e <field ids>`` prints a header ``#Entity  SMACT  SMOCC ...`` (the short column
  name of each field), a units line ``ID``, then one row per entity and sample:
  ``GPU 0  0.512  0.301 ...``; ``N/A`` where a field has no value. It prints no time: a row may
  be prefixed by one (``dcgmi dmon ... | ts '%Y-%m-%dT%H:%M:%.S%z'``), else its samples are kept
  without times. ``ts``'s default prefix (``Nov 27 16:05:01``) has no year: the trace's is taken.
  https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-dmon.html ;
  fields and their short names: ``dcgmi dmon -l`` and
  https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html
* dcgm-exporter serves ``DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="...",Hostname="node1",...} 45``
  lines (Prometheus text exposition format, an optional millisecond timestamp after the value):
  https://github.com/NVIDIA/dcgm-exporter and
  https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import re
from pathlib import Path

from advisor.metrics.common import (
    MetricsError,
    ReadContext,
    Sample,
    is_yearless,
    parse_number,
    parse_time,
    parse_yearless,
)
from advisor.metrics.vocab import DCGM_NAMES, DMON

_ENTITY_RE = re.compile(r"\b(GPU-CI|GPU-I|GPU|Switch|Link|CPU|Core)\s+(\S+)")


def _header(line: str) -> list[str] | None:
    """The column names of a ``#Entity`` header line, after any time prefix (``... | ts``)."""
    if "#" not in line:
        return None
    toks = line.split("#", 1)[1].split()
    return toks[1:] if toks and toks[0].lower() == "entity" else None


def sniff_dmon(head: str) -> bool:
    return any(_header(ln) is not None for ln in head.splitlines()[:20])


def read_dmon(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    cols: list[str] | None = None
    out: list[Sample] = []
    untimed = zone_less = yearless = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if "#" in line:
            cols = _header(line) or cols
            continue
        m = _ENTITY_RE.search(line)
        if cols is None or m is None:
            continue  # the units line ('ID'), messages
        kind, ident = m.group(1), m.group(2)
        values = line[m.end():].split()
        if len(values) < len(cols):
            continue
        prefix = line[:m.start()].strip().rstrip("|").strip()
        ts, zl = parse_time(prefix, rc.tz_offset_s)
        if ts is None and is_yearless(prefix):  # ts's default format: no year, no zone
            ts, zl, yearless = parse_yearless(prefix, rc.ref_ns, rc.tz_offset_s), True, True
        zone_less |= zl
        untimed |= ts is None
        dev = ident if kind == "GPU" else f"{kind} {ident}"
        for col, v in zip(cols, values, strict=False):
            value, _u = parse_number(v)
            if value is None:
                continue
            out.append(rc.sample(ts, None, dev, f"dcgm_{col}", value, "dcgm", DMON.get(col.lower())))
    if cols is None:
        raise MetricsError("no '#Entity' header line (dcgmi dmon output)")
    if not out:
        raise MetricsError("no sample rows under the '#Entity' header")
    if untimed:
        rc.notes.append("untimed")
    if zone_less:
        rc.notes.append("zone_less")
    if yearless:
        rc.notes.append("year_less")
    return out


_PROM_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

DEVICE_LABELS = ("gpu", "gpu_id", "minor_number", "device", "npu", "card", "id")
NODE_LABELS = ("hostname", "host", "node", "nodename", "instance")


def sniff_exposition(head: str) -> bool:
    lines = [ln for ln in head.splitlines()[:50] if ln.strip()]
    return any(_PROM_RE.match(ln.strip()) and "{" in ln for ln in lines if not ln.startswith("#")) and (
        any(ln.startswith(("# TYPE", "# HELP")) for ln in lines)
        or any(ln.upper().startswith("DCGM_FI_") for ln in lines))


def labels_of(body: str) -> dict[str, str]:
    return {k.lower(): v for k, v in _LABEL_RE.findall(body or "")}


def node_of(labels: dict[str, str]) -> str | None:
    for k in NODE_LABELS:
        if labels.get(k):
            v = labels[k]
            return v.rsplit(":", 1)[0] if k == "instance" and v.count(":") == 1 else v
    return None


def device_of(labels: dict[str, str]) -> str | None:
    for k in DEVICE_LABELS:
        if labels.get(k):
            v = labels[k]
            m = re.fullmatch(r"(?:nvidia|card|gpu|npu|davinci)?(\d+)", v, re.IGNORECASE)
            return m.group(1) if m else v
    return None


def read_exposition(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    out: list[Sample] = []
    untimed = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _PROM_RE.match(line)
        if m is None:
            continue
        name, body, val, ts_ms = m.group(1), m.group(3), m.group(4), m.group(5)
        value, _u = parse_number(val)
        if value is None:
            continue
        labels = labels_of(body or "")
        ts = parse_time(ts_ms)[0] if ts_ms else None
        untimed |= ts is None
        out.append(rc.sample(ts, node_of(labels), device_of(labels), name, value, "dcgm", DCGM_NAMES.get(name.lower())))
    if not out:
        raise MetricsError("no metric lines (Prometheus text format: NAME{labels} VALUE [TIMESTAMP])")
    if untimed:
        rc.notes.append("untimed")
    return out
