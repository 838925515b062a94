"""Counter events (``"ph": "C"``) of Kineto traces -> ``hw_metrics`` (source ``kineto-counter``).

A Chrome-trace counter event names a counter and gives one or more series values in its
``args`` (``{"name": "GPU Utilization", "ph": "C", "ts": ..., "pid": 0, "args": {"value": 42}}``;
Trace Event Format, "Counter Events":
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). The Kineto reader
keeps them through its scan as metadata rows marked by :data:`COUNTER_SQL` (their arguments as
JSON where the scan read them as JSON); :func:`insert_counters` turns them into samples. A series
whose counter or argument is named by a canonical metric (``sm_active_pct``, ``power_w`` ...) takes
that name; the others are kept as ``src:<counter>/<argument>``. The pid of a counter on a device
lane is the device index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.hw_vocab import CANONICAL, src_name

MARK = "\x01"
#: SQL (inside the Kineto scan, where ``c_args`` is the JSON text of a counter's args or NULL):
#: the ``x_extra`` of a counter row
COUNTER_SQL = "chr(1) || coalesce(c_args, '')"


def _series(name: str, key: str) -> tuple[str, str | None]:
    for cand in (key, name):
        c = cand.strip().lower()
        if c in CANONICAL:
            return c, CANONICAL[c]
    label = name if key in ("value", name, "") else f"{name}/{key}"
    return src_name(label), None


def _numbers(args: Any) -> list[tuple[str, float]]:
    if not isinstance(args, dict):
        return []
    out = []
    for k, v in args.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            try:
                v = float(v)
            except (TypeError, ValueError):
                continue
        out.append((str(k), float(v)))
    return out


def _device(pid: Any) -> str | None:
    try:
        p = int(pid)
    except (TypeError, ValueError):
        return None
    return str(p) if 0 <= p < 1024 else None


def insert_counters(cur: Any, part: str, files: list[tuple[int, int, Path]]) -> None:
    """``hw_metrics`` rows from the counter rows of the Kineto part ``part`` (columns file_id,
    rank, name, pid, start_ns, x_extra); ``files``: (file id, rank, path) of the files kept.
    Files whose counters lost their arguments in the scan (read as a typed STRUCT) are read once
    more for their counter events only."""
    from advisor.ingest.base import insert_columns

    keep = {fid: (rank, path) for fid, rank, path in files}
    got = cur.execute(
        f"""SELECT file_id, rank, name, pid, start_ns, x_extra FROM {part}
            WHERE kind = 'meta' AND starts_with(x_extra, chr(1))"""
    ).fetchall()
    if not got:
        return
    rows: list[tuple[Any, ...]] = []
    rescan: dict[int, int] = {}  # file -> first counter time in the part (ns, on the trace's clock)
    for fid, rank, name, pid, start_ns, extra in got:
        if fid not in keep or start_ns is None:
            continue
        text = extra[1:]
        if not text:
            rescan[fid] = min(rescan.get(fid, start_ns), start_ns)
            continue
        try:
            args = json.loads(text)
        except ValueError:
            continue
        for key, value in _numbers(args):
            metric, unit = _series(name or "", key)
            rows.append((rank, metric, int(start_ns), value, _device(pid), None, unit, "kineto-counter"))
    for fid, first_ns in rescan.items():
        rank, path = keep[fid]
        rows.extend(_rescan(cur, rank, path, first_ns))
    if rows:
        insert_columns(cur, "hw_metrics", rows)


def _us_ns(us: float) -> int:
    """µs (a double) -> ns, the whole µs and the fraction scaled apart (epoch ns exceed a double's precision)."""
    whole = int(us // 1)
    return whole * 1000 + round((us - whole) * 1000)


def _rescan(cur: Any, rank: int, path: Path, first_ns: int) -> list[tuple[Any, ...]]:
    """The counter events of one trace, read with their arguments as JSON; times placed so that
    the first counter lands where the main scan put it (``first_ns``: base time and shifts applied)."""
    from advisor.ingest.base import duckdb_path, is_gzip
    from advisor.ingest.jsonstream import LayoutError, SpilledEvents

    spill = None
    try:
        try:
            spill = SpilledEvents(path)
        except LayoutError:  # the bare event-list form: read as it is, a gzip one from a copy (bomb limit)
            spill = SpilledEvents(path, array=True) if is_gzip(path) else None
        src = duckdb_path(path if spill is None else spill.path)
        etype = "STRUCT(ph VARCHAR, name VARCHAR, pid VARCHAR, ts VARCHAR, args JSON)"
        got = cur.execute(
            f"""SELECT e.name, e.pid, TRY_CAST(e.ts AS DOUBLE) AS ts, CAST(e.args AS VARCHAR) FROM (
                  SELECT t.json AS e FROM read_json($p, format='array', records=false,
                                                    columns={{'json': '{etype}'}})  t)
                WHERE e.ph = 'C' AND TRY_CAST(e.ts AS DOUBLE) IS NOT NULL""",
            {"p": src},
        ).fetchall()
    except Exception:  # noqa: BLE001 - the counters are extra: a trace whose second read fails keeps its events
        return []
    finally:
        if spill is not None:
            spill.close()
    if not got:
        return []
    offset = first_ns - _us_ns(min(r[2] for r in got))
    rows = []
    for name, pid, ts, text in got:
        try:
            args = json.loads(text) if text else None
        except ValueError:
            continue
        for key, value in _numbers(args):
            metric, unit = _series(name or "", key)
            rows.append((rank, metric, _us_ns(ts) + offset, value, _device(pid), None, unit, "kineto-counter"))
    return rows
