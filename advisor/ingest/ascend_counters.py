"""The hardware series inside Ascend exports -> ``hw_metrics`` (source ``ascend-text`` / ``ascend-db``).

Text export (``trace_view.json``): counter events (``ph: C``) on the CANN system lanes
``AI Core Freq``, ``HBM``, ``LLC``, ``NPU MEM``, ``DDR``, ``HCCS``, ``PCIe`` (also spelled ``PCle``),
``NIC``, ``RoCE``, ``Acc PMU``, ``Stars Soc Info``, ``QoS`` (format doc §5.8). Each event's name
says the instance and direction (``HBM 0/Read``, ``LLC 1 Read/Throughput``, ``APP/HBM``) and its
one argument the unit (``Read(MB/s)``, ``KB``, ``Hit Rate(%)``, ``MHz``).

``.db`` export: the tables ``AICORE_FREQ``, ``HBM``, ``LLC``, ``NPU_MEM``, ``NPU_MODULE_MEM``,
``DDR``, ``HCCS``, ``PCIE``, ``NIC``, ``ROCE``, ``ACC_PMU``, ``SOC_BANDWIDTH_LEVEL`` (format doc §17.2),
each with ``deviceId`` and ``timestampNs``.

Units, as CANN's exporter writes them (msprof analysis source, github.com/kali20gakki/msprof,
``analysis/csrc/viewer/database/finals/*_processor.cpp``, and its text/db cross-check, which scales
the timeline's MB/s by 1024*1024 and its hit rate by 100 to compare with the database): the
database holds bytes/s (HBM ``bandwidth``, LLC ``throughput``, HCCS, PCIe, DDR), bytes (NPU_MEM,
NPU_MODULE_MEM) and the LLC hit rate in %; the timeline holds MB/s (MiB/s), KB (KiB) and the hit
rate as a ratio 0..1 under the label ``Hit Rate(%)``. Bandwidth of several instances (HBM stacks,
LLC slices) at one time is summed into the device's series; the PCIe series sums the posted,
non-posted and completion traffic of a direction. Series with no canonical name (hit rates, level
counters, per-module memory ...) are kept as ``src:`` series.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections import defaultdict
from typing import Any

from advisor.hw_vocab import CANONICAL, KIB, MIB, src_name
from advisor.sqlite_safe import SafeSqlite, quote_ident

Row = tuple[Any, ...]  # hw_metrics row: rank, metric, ts_ns, value, device, node, unit, source

_SUMMED = ("hbm_read_bps", "hbm_write_bps", "llc_read_bps", "llc_write_bps", "pcie_tx_bps", "pcie_rx_bps",
           "ddr_bw_bps")


class _Rows:
    """Collects one source's rows; instances of a summed series at one time add up."""

    def __init__(self, rank: int, source: str) -> None:
        self.rank, self.source = rank, source
        self.sums: dict[tuple[str, int, str | None], float] = defaultdict(float)
        self.rows: list[Row] = []

    def add(self, metric: str, ts: int | None, value: float | None, device: str | None = None,
            unit: str | None = None) -> None:
        if ts is None or value is None:
            return
        if metric in _SUMMED:
            self.sums[(metric, ts, device)] += value
            if metric.startswith("hbm_"):
                self.sums[("hbm_bw_bps", ts, device)] += value
            return
        u = CANONICAL.get(metric, unit)
        self.rows.append((self.rank, metric, int(ts), float(value), device, None, u, self.source))

    def done(self) -> list[Row]:
        out = list(self.rows)
        for (metric, ts, device), v in sorted(self.sums.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")):
            out.append((self.rank, metric, ts, v, device, None, "B/s", self.source))
        return out


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# -- text: trace_view.json counter lanes ---------------------------------------------------------

_HBM = re.compile(r"^HBM\s*(\d+)?/(Read|Write)$", re.IGNORECASE)
_LLC = re.compile(r"^LLC\s*(\d+)?\s*(Read|Write)/(Throughput|Hit Rate)$", re.IGNORECASE)
_DIR = re.compile(r"(Read|Write|Tx|Rx)", re.IGNORECASE)
_UNIT_IN_KEY = re.compile(r"\(([^()]*)\)\s*$")


def text_rows(rank: int, pname: str, name: str, key: str, value: Any, ts: int | None, out: _Rows) -> None:
    """One argument of one counter event of the lane ``pname``."""
    v = _num(value)
    if v is None or ts is None or key.lower().endswith("id"):
        return
    lane = pname.strip().lower()
    m = _UNIT_IN_KEY.search(key)
    unit = m.group(1) if m else (key if key in ("KB", "MHz") else None)
    if lane == "ai core freq":
        out.add("aicore_freq_mhz", ts, v)
    elif lane == "hbm" and (h := _HBM.match(name.strip())):
        out.add(f"hbm_{h.group(2).lower()}_bps", ts, v * MIB)
    elif lane == "llc" and (c := _LLC.match(name.strip())):
        mode = c.group(2).lower()
        if c.group(3).lower() == "throughput":
            out.add(f"llc_{mode}_bps", ts, v * MIB)
        else:  # written as a ratio under the label 'Hit Rate(%)'
            out.add(src_name(f"llc {c.group(1) or ''} {mode}/hit rate"), ts, v * 100.0, unit="%")
    elif lane == "npu mem" and unit == "KB":
        if name.strip().lower() == "device/hbm":
            out.add("mem_used_bytes", ts, v * KIB)
        elif not name.strip().lower().endswith("/memory"):  # '<x>/Memory' is DDR + HBM
            out.add(src_name(f"npu mem/{name}"), ts, v * KIB, unit="B")
    elif lane == "hccs" and (d := _DIR.search(key)) and (unit or "").lower() == "mb/s":
        out.add(f"hccs_{d.group(1).lower()}_bps", ts, v * MIB)
    elif lane in ("pcie", "pcle") and key in ("Tx", "Rx") and "latency" not in name.lower():
        out.add(f"pcie_{key.lower()}_bps", ts, v * MIB)
    elif lane == "ddr" and (d := _DIR.search(key)) and (unit or "").lower() == "mb/s":
        out.add("ddr_bw_bps", ts, v * MIB)
    else:
        label = name if key in ("value", name) else f"{name}/{key}"
        out.add(src_name(f"{pname}/{label}"), ts, v, unit=unit)


_TEXT_LANES = ("AI Core Freq", "HBM", "LLC", "NPU MEM", "DDR", "HCCS", "PCIe", "PCle", "NIC", "RoCE", "Acc PMU",
               "Stars Soc Info", "Stars Chip Trans", "QoS", "SIO")


def insert_text_series(cur: Any, tv: str, lanes: str) -> None:
    """``hw_metrics`` rows from the staged timeline ``tv`` (columns fno, rank, pid, ph, name, ts_ns,
    mhz, cargs: the JSON arguments of counter events) and its lanes (fno, pid, pname)."""
    from advisor.ingest.base import insert_columns

    names = "(" + ", ".join("'" + n.replace("'", "''") + "'" for n in _TEXT_LANES) + ")"
    got = cur.execute(
        f"""SELECT t.rank, l.pname, t.name, t.ts_ns, k.key, k.value
            FROM {tv} t JOIN {lanes} l USING (fno, pid), json_each(t.cargs) k
            WHERE t.ph = 'C' AND t.cargs IS NOT NULL AND l.pname IN {names}
            UNION ALL
            SELECT t.rank, l.pname, t.name, t.ts_ns, 'MHz', t.mhz
            FROM {tv} t JOIN {lanes} l USING (fno, pid)
            WHERE l.pname = 'AI Core Freq' AND t.ph IN ('X', 'i', 'I') AND t.mhz IS NOT NULL"""
    ).fetchall()
    by_rank: dict[int, _Rows] = {}
    for rank, pname, name, ts, key, value in got:
        out = by_rank.setdefault(rank, _Rows(rank, "ascend-text"))
        if isinstance(value, str):
            value = value.strip('"')
        text_rows(rank, pname or "", name or "", key or "", value, ts, out)
    rows = [r for out in by_rank.values() for r in out.done()]
    if rows:
        insert_columns(cur, "hw_metrics", rows)


# -- .db: the system sample tables ---------------------------------------------------------------

def _cols(db: SafeSqlite, table: str) -> dict[str, str]:
    try:
        return {c.lower(): c for c in db.columns(table)}
    except sqlite3.Error:
        return {}


def _strings(db: SafeSqlite, table: str, key: str = "id", value: str = "value") -> dict[int, str]:
    cols = _cols(db, table)
    k, v = cols.get(key.lower()), cols.get(value.lower()) or cols.get("name")
    if not k or not v:
        return {}
    try:
        rows = db.query(f"SELECT {quote_ident(k)}, {quote_ident(v)} FROM {quote_ident(table)}", [table])
        return {int(a): str(b) for a, b in rows if a is not None}
    except (sqlite3.Error, ValueError, TypeError):
        return {}


def _select(db: SafeSqlite, table: str, *names: str) -> list[tuple[Any, ...]]:
    """Rows of ``table`` with the columns ``names`` (case-insensitive; a missing one reads NULL),
    plus deviceId and timestampNs first. Every column name is quoted: it comes from the file."""
    cols = _cols(db, table)
    if not cols or "timestampns" not in cols:
        return []
    exprs = [quote_ident(cols["deviceid"]) if "deviceid" in cols else "NULL",
             f"CAST({quote_ident(cols['timestampns'])} AS INTEGER)"]
    exprs += [quote_ident(cols[n.lower()]) if n.lower() in cols else "NULL" for n in names]
    try:
        return db.query(f'SELECT {", ".join(exprs)} FROM {quote_ident(table)}', [table])
    except sqlite3.Error:
        return []


def db_rows(db: SafeSqlite, rank: int) -> list[Row]:
    """``hw_metrics`` rows of one rank's ``ascend_pytorch_profiler_*.db`` (or msprof db), opened by
    :class:`advisor.sqlite_safe.SafeSqlite` (only its real tables are read)."""
    sid = _strings(db, tb) if (tb := db.table("STRING_IDS")) else {}
    out = _Rows(rank, "ascend-db")

    def dev(d: Any) -> str | None:
        return None if d is None else str(d)

    def t(name: str) -> str | None:
        return db.table(name)

    if tb := t("AICORE_FREQ"):
        for d, ts, f in _select(db, tb, "freq"):
            out.add("aicore_freq_mhz", ts, _num(f), dev(d))
    if tb := t("HBM"):
        for d, ts, bw, typ in _select(db, tb, "bandwidth", "type"):
            mode = sid.get(typ, str(typ)).lower() if typ is not None else ""
            if mode in ("read", "write"):
                out.add(f"hbm_{mode}_bps", ts, _num(bw), dev(d))
    if tb := t("LLC"):
        for d, ts, llc, mode_id, hit, thr in _select(db, tb, "llcId", "mode", "hitRate", "throughput"):
            mode = sid.get(mode_id, str(mode_id)).lower() if mode_id is not None else ""
            if mode in ("read", "write"):
                out.add(f"llc_{mode}_bps", ts, _num(thr), dev(d))
                out.add(src_name(f"llc {llc} {mode}/hit rate"), ts, _num(hit), dev(d), "%")
    if tb := t("NPU_MEM"):
        for d, ts, typ, hbm, ddr in _select(db, tb, "type", "hbm", "ddr"):
            kind = sid.get(typ, str(typ)).lower() if typ is not None else "?"
            if kind == "device":
                out.add("mem_used_bytes", ts, _num(hbm), dev(d))
            else:
                out.add(src_name(f"npu mem/{kind}/hbm"), ts, _num(hbm), dev(d), "B")
            out.add(src_name(f"npu mem/{kind}/ddr"), ts, _num(ddr), dev(d), "B")
    if tb := t("NPU_MODULE_MEM"):
        modules = _strings(db, em, "id", "name") if (em := db.table("ENUM_MODULE")) else {}
        rows = _select(db, tb, "moduleId", "totalReserved")
        used = {m for _d, _ts, m, v in rows if _num(v)}
        for d, ts, m, v in rows:
            if m in used:  # the modules that reserved memory at some time
                out.add(src_name(f"npu module mem/{modules.get(m, m)}"), ts, _num(v), dev(d), "B")
    if tb := t("DDR"):
        rw = [c for c in _cols(db, tb).values() if re.search("read|write", c, re.IGNORECASE)]
        for d, ts, *vals in _select(db, tb, *rw):
            out.add("ddr_bw_bps", ts, sum(_num(v) or 0.0 for v in vals), dev(d))
    if tb := t("HCCS"):
        for d, ts, tx, rx in _select(db, tb, "txThroughput", "rxThroughput"):
            out.add("hccs_tx_bps", ts, _num(tx), dev(d))
            out.add("hccs_rx_bps", ts, _num(rx), dev(d))
    if tb := t("PCIE"):
        for d, ts, *v in _select(db, tb, "txPostAvg", "txNonpostAvg", "txCplAvg", "rxPostAvg", "rxNonpostAvg",
                                 "rxCplAvg"):
            nums = [_num(x) for x in v]
            if any(x is not None for x in nums[:3]):
                out.add("pcie_tx_bps", ts, sum(x or 0.0 for x in nums[:3]), dev(d))
            if any(x is not None for x in nums[3:]):
                out.add("pcie_rx_bps", ts, sum(x or 0.0 for x in nums[3:]), dev(d))
    for name, prefix in (("NIC", "nic"), ("ROCE", "roce")):
        if tb := t(name):
            for d, ts, tx, rx in _select(db, tb, "txByteRate", "rxByteRate"):
                out.add(f"{prefix}_tx_bps", ts, _num(tx), dev(d))
                out.add(f"{prefix}_rx_bps", ts, _num(rx), dev(d))
    levels: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("ACC_PMU", ("readBwLevel", "writeBwLevel", "readOstLevel", "writeOstLevel")),
        ("SOC_BANDWIDTH_LEVEL", ("l2BufferBwLevel", "mataBwLevel")))
    for name, lcols in levels:
        if tb := t(name):
            for d, ts, *vals in _select(db, tb, *lcols):
                for c, v in zip(lcols, vals, strict=True):
                    out.add(src_name(f"{name.lower()}/{c}"), ts, _num(v), dev(d), "level")
    return out.done()


def insert_db_series(cur: Any, db: SafeSqlite, rank: int) -> None:
    """``hw_metrics`` rows from one rank's database ``db``."""
    from advisor.ingest.base import insert_columns

    try:
        rows = db_rows(db, rank)
    except sqlite3.Error:
        return
    if rows:
        insert_columns(cur, "hw_metrics", rows)
