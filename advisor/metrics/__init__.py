"""Hardware metric series: read what monitoring tools export (``--metrics FILE``) into
``hw_metrics``, next to the series the profiler exports hold (Kineto counters, Ascend system lanes).

One canonical table for all (:mod:`advisor.metrics.vocab`): time on the trace's clock, node,
device, metric, value, unit, source. Each file's form is told by its content (:data:`READERS`,
sniffed in order; the extension only breaks a tie), its devices are mapped to ranks where the
trace says which device each rank used (:func:`map_ranks`), and what could not be read, kept
under a source name, or does not overlap the trace in time is said in one warning each. A file
that cannot be read at all is a warning too: the trace is analysed as without it.
"""

from __future__ import annotations

import gzip
import io
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.metrics import amd_smi, csv_generic, dcgm, npu_smi, nvidia_smi, prometheus, rocm_smi
from advisor.metrics.common import MetricsError, ReadContext, Sample, parse_tz_offset

Warn = Callable[..., None]
MAX_BYTES = 512 << 20  # a monitoring export larger than this is refused (read whole into memory)


@dataclass(frozen=True)
class Reader:
    """One input form: its name (the ``source`` of its rows unless the reader says otherwise),
    a content test on the file's first KiB and the reader."""

    name: str
    sniff: Callable[[str], bool]
    read: Callable[[str, Path, ReadContext], list[Sample]]
    extensions: tuple[str, ...] = ()


#: the forms, in the order their content is tested (the generic CSV last)
READERS: tuple[Reader, ...] = (
    Reader("prometheus", prometheus.sniff, prometheus.read, (".json",)),
    Reader("dcgm", dcgm.sniff_dmon, dcgm.read_dmon, (".txt", ".log")),
    Reader("dcgm-exporter", dcgm.sniff_exposition, dcgm.read_exposition, (".prom", ".txt")),
    Reader("npu-smi", npu_smi.sniff, npu_smi.read, (".txt", ".log")),
    Reader("npu-smi-info", npu_smi.sniff_info, npu_smi.read_info, (".txt", ".log")),
    Reader("nvidia-smi", nvidia_smi.sniff, nvidia_smi.read, (".csv",)),
    Reader("rocm-smi", rocm_smi.sniff, rocm_smi.read, (".csv",)),
    Reader("amd-smi", amd_smi.sniff, amd_smi.read, (".csv",)),
    Reader("csv", csv_generic.sniff, csv_generic.read, (".csv",)),
)


def _text(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise MetricsError(f"larger than {MAX_BYTES >> 20} MiB; refused")
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                raise MetricsError(f"decompresses to more than {MAX_BYTES >> 20} MiB; refused")
    except FileNotFoundError:
        raise MetricsError("no such file") from None
    except IsADirectoryError:
        raise MetricsError("a directory, not a file") from None
    except (OSError, zlib.error) as exc:
        raise MetricsError(f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except EOFError:
        raise MetricsError("truncated gzip") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MetricsError("not text (UTF-8)") from None


def reader_for(text: str, path: Path) -> Reader:
    """The reader whose content test the file passes (by extension among several); raises
    MetricsError naming the forms known when none does."""
    head = text[:8192]
    fits = [r for r in READERS if r.sniff(head)]
    if not fits:
        raise MetricsError("not a known metrics form (DCGM dmon or exporter, nvidia-smi / rocm-smi / amd-smi CSV, "
                           "Prometheus query_range JSON, npu-smi watch, or a CSV with a time column)")
    by_ext = [r for r in fits if path.suffix.lower() in r.extensions]
    return (by_ext or fits)[0]


def read_file(path: Path, tz_offset_s: float = 0.0, ref_ns: int | None = None) -> tuple[str, list[Sample], ReadContext]:
    """One metrics file: (form, samples, context with what was kept / noted). ``ref_ns``: the
    trace's start, which gives the year of times written without one. Raises MetricsError."""
    text = _text(path)
    reader = reader_for(text, path)
    rc = ReadContext(tz_offset_s=tz_offset_s, ref_ns=ref_ns)
    try:
        samples = reader.read(text, path, rc)
    except MetricsError:
        raise
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise MetricsError(f"malformed {reader.name} output: {type(exc).__name__}: {exc}") from None
    if not samples:
        raise MetricsError(f"no samples ({reader.name} form)")
    return reader.name, samples, rc


def load_metrics(con: Any, paths: list[Path] | tuple[Path, ...], warn: Warn, tz_offset: str | float | None = None) -> int:
    """Read each metrics file into ``hw_metrics`` (ranks mapped by :func:`map_ranks`); a file that
    cannot be read is one warning naming it. Returns the rows added."""
    offset = parse_tz_offset(tz_offset) if isinstance(tz_offset, str) else float(tz_offset or 0.0)
    span = trace_span(con)
    dev_rank = rank_devices(con)
    hosts = rank_hosts(con)
    ranks = [r[0] for r in con.execute("SELECT DISTINCT rank FROM ranks ORDER BY rank").fetchall()]
    added = 0
    for path in paths:
        p = Path(path)
        try:
            form, samples, rc = read_file(p, offset, span[0] if span else None)
        except MetricsError as exc:
            warn("bad_metrics", f"metrics file not read: {exc}", p)
            continue
        rows = map_ranks(samples, ranks, dev_rank, hosts)
        _file_warnings(p, form, samples, rows, rc, warn)
        if not _overlaps(p, form, samples, rc, span, offset, warn):
            continue
        from advisor.schema import insert_rows

        insert_rows(con, "hw_metrics", rows)
        added += len(rows)
    return added


#: How far a zone-less file's clock is searched for the offset that aligns it: the zones of the
#: world, UTC-12:00 to UTC+14:00, in half-hour steps (the usual cause is local time read as UTC).
_TZ_STEP_S = 1800
_TZ_RANGE_S = (-12 * 3600, 14 * 3600)


def aligning_offset(lo: int, hi: int, span: tuple[int, int], offset_s: float) -> float | None:
    """The ``--metrics-tz-offset`` (seconds east of UTC) under which samples read at [lo, hi]
    (epoch ns, read with ``offset_s``) overlap the trace's ``span`` most; whole hours before half
    hours, the nearer before the farther. None when no offset in the world's range aligns them."""
    t0, t1 = span
    best: tuple[tuple[float, bool, float], float] | None = None
    for total in range(_TZ_RANGE_S[0], _TZ_RANGE_S[1] + 1, _TZ_STEP_S):
        shift = round((total - offset_s) * 1e9)  # a larger offset reads the same text earlier
        covered = min(hi - shift, t1) - max(lo - shift, t0)
        if covered < 0 or (covered == 0 and hi > lo):
            continue
        key = (float(covered), total % 3600 == 0, -abs(total - offset_s))
        if best is None or key > best[0]:
            best = (key, float(total))
    return None if best is None else best[1]


def format_offset(seconds: float) -> str:
    """Seconds east of UTC as ``+HH:MM``."""
    m = round(abs(seconds) / 60)
    return f"{'-' if seconds < 0 else '+'}{m // 60:02d}:{m % 60:02d}"


def _overlaps(path: Path, form: str, samples: list[Sample], rc: ReadContext, span: tuple[int, int] | None,
              offset: float, warn: Warn) -> bool:
    """Whether the file's samples may be used: False (and a warning saying which offset would align
    it) when its times do not overlap the trace at all; a partial overlap is a warning."""
    times = [s.ts_ns for s in samples if s.ts_ns is not None]
    if not times or span is None:
        return True
    lo, hi = min(times), max(times)
    t0, t1 = span
    zone_less = "zone_less" in rc.notes
    zone = ""
    if zone_less:
        zone = (f"; its times carry no zone and were read as UTC{'' if not offset else f'{offset / 3600:+g} h'} "
                "(--metrics-tz-offset gives the local offset)")
    if hi < t0 or lo > t1:
        where = (f"they end {_dur(t0 - hi)} before the trace starts" if hi < t0
                 else f"they start {_dur(lo - t1)} after the trace ends")
        fix = ""
        if zone_less:
            better = aligning_offset(lo, hi, span, offset)
            fix = (f"; --metrics-tz-offset {format_offset(better)} would align it" if better is not None else
                   "; no UTC offset aligns it: another run's file, or another clock")
        else:
            fix = "; its times carry a zone: another run's file, or a clock that differs from the trace's"
        warn("metrics_no_overlap", f"{form}: its samples (spanning {_dur(hi - lo)}) do not overlap the trace: "
             f"{where}; the file is ignored" + zone + fix, path)
        return False
    covered = min(hi, t1) - max(lo, t0)
    if hi > lo and t1 > t0 and covered < 0.995 * (t1 - t0):
        warn("metrics_partial_overlap", f"{form}: its samples cover {100.0 * covered / (t1 - t0):.0f} % of the "
             f"trace's time span ({_dur(covered)} of {_dur(t1 - t0)})" + zone, path)
    return True


def finish_load(con: Any, warn: Warn, paths: list[Path] | tuple[Path, ...] = (),
                tz_offset: str | float | None = None, where: str | None = None) -> None:
    """After a profile's load: read the ``--metrics`` files, and name in one warning the series of
    the profile's own exports kept under their source names (``where``: the profile's path)."""
    try:
        kept = con.execute(
            """SELECT source, list(DISTINCT metric ORDER BY metric) FROM hw_metrics
               WHERE starts_with(metric, 'src:') GROUP BY source ORDER BY source"""
        ).fetchall()
    except Exception:  # noqa: BLE001 - no hw_metrics table (a partial context): nothing to say
        kept = []
    for source, names in kept:
        warn("metrics_kept", f"{source}: {len(names)} hardware series with no canonical name kept under their source "
             "names: " + ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else ""), where)
    if paths:
        load_metrics(con, paths, warn, tz_offset)


def _file_warnings(path: Path, form: str, samples: list[Sample], rows: list[tuple[Any, ...]], rc: ReadContext,
                   warn: Warn) -> None:
    if rc.kept:
        names = sorted(rc.kept)
        warn("metrics_kept", f"{form}: {len(names)} series with no canonical name kept under their source names: "
             + ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else ""), path)
    for note in rc.notes:
        if note.startswith("text columns"):
            warn("metrics_kept", f"{form}: {note}", path)
    if "year_less" in rc.notes:
        ref = next((s.ts_ns for s in samples if s.ts_ns is not None), None)
        year = f"the trace's year ({time.gmtime(ref / 1e9).tm_year}) taken" if ref is not None else \
            "no trace time to take the year from: kept without times"
        warn("metrics_year_less", f"{form}: its times carry no year (ts's default format); {year} "
             "(prefix with ts '%Y-%m-%dT%H:%M:%.S%z' to write it)", path)
    if "untimed" in rc.notes:
        warn("metrics_untimed", f"{form}: rows without a time (the tool prints none; prefix each line with one) kept "
             "without times: they cannot be aligned with the trace", path)
    with_device = [r for r in rows if r[4] is not None]
    unmapped = sum(1 for r in with_device if r[0] is None)
    if unmapped:
        devices = sorted({str(r[4]) for r in with_device if r[0] is None})
        warn("metrics_unmapped", f"{form}: {unmapped} of {len(with_device)} samples name a device the trace does not "
             f"map to a rank ({', '.join(devices[:8])}); kept with rank NULL", path)


def _dur(ns: int) -> str:
    s = abs(ns) / 1e9
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    if s >= 1:
        return f"{s:.1f} s"
    return f"{s * 1e3:.1f} ms"


def trace_span(con: Any) -> tuple[int, int] | None:
    """The trace's time span (first event start, last event end, epoch ns), None when unknown."""
    for sql in ("SELECT min(start_ns), max(start_ns + dur_ns) FROM events",
                "SELECT min(start_ns), max(end_ns) FROM steps"):
        try:
            row = con.execute(sql).fetchone()
        except Exception:  # noqa: BLE001, S112 - a table or column the profile lacks: try the next
            continue
        if row and row[0] is not None and row[1] is not None:
            return int(row[0]), int(row[1])
    return None


def rank_devices(con: Any) -> dict[int, int]:
    """rank -> the device index it ran on, where the trace says: the device lanes of a Kineto
    trace have the GPU index as process id; Ascend ranks name their NPU in ``hw_metrics``."""
    out: dict[int, int] = {}
    queries = (
        """SELECT rank, min(TRY_CAST(pid AS INTEGER)) FROM tracks WHERE device AND TRY_CAST(pid AS INTEGER)
           BETWEEN 0 AND 1023 GROUP BY rank HAVING count(DISTINCT pid) = 1""",
        # the same, as the per-rank map hands it to the cluster reduce (which holds no tracks)
        "SELECT rank, device FROM rank_device_index",
        """SELECT rank, min(TRY_CAST(device AS INTEGER)) FROM hw_metrics WHERE rank IS NOT NULL
           AND source LIKE 'ascend-%' GROUP BY rank HAVING count(DISTINCT device) = 1
           UNION ALL
           SELECT rank, min(TRY_CAST(value AS INTEGER)) FROM meta WHERE key = 'device_id' AND rank IS NOT NULL
           GROUP BY rank HAVING count(DISTINCT value) = 1""",
    )
    for sql in queries:
        try:
            rows = con.execute(sql).fetchall()
        except Exception:  # noqa: BLE001, S112 - a context without this table: the next source
            continue
        out.update({int(r): int(d) for r, d in rows if r is not None and d is not None})
    return out


def rank_hosts(con: Any) -> dict[int, str]:
    """rank -> host name, where the profile records it (Ascend's HOST_INFO: meta ``host.name``)."""
    try:
        rows = con.execute(
            """SELECT rank, min(value) FROM meta WHERE key IN ('host.name', 'hostname', 'host_name')
               AND rank IS NOT NULL AND coalesce(value, '') <> '' GROUP BY rank"""
        ).fetchall()
    except Exception:  # noqa: BLE001 - no meta table: no host known
        return {}
    return {int(r): str(h) for r, h in rows}


def _short(host: str) -> str:
    return host.split(".", 1)[0].lower()


def map_ranks(samples: list[Sample], ranks: list[int], dev_rank: dict[int, int],
              hosts: dict[int, str] | None = None) -> list[tuple[Any, ...]]:
    """``hw_metrics`` rows of ``samples``, each with the rank whose device it measured.

    A device index is a local rank on its node. A node the profile names as a rank's host: the
    rank on that host that ran on the device, else (no device known there) the host's ranks in
    order, the device index being the local rank. One node (or none named): the rank that ran on
    that device (from the trace), else the rank of that number when every rank's device is unknown.
    Several nodes: nodes in name order hold consecutive ranks, ``rank = node_index * devices_per_node
    + device``, taken only when that covers the ranks exactly; else the rank stays NULL."""
    host_ranks: dict[str, list[int]] = defaultdict(list)
    for r, h in sorted((hosts or {}).items()):
        host_ranks[_short(h)].append(r)
    nodes = sorted({s.node for s in samples if s.node})
    devs: dict[str | None, set[int]] = defaultdict(set)
    for s in samples:
        d = _index(s.device)
        if d is not None:
            devs[s.node].add(d)
    rank_set = set(ranks)
    by_dev: dict[int, list[int]] = defaultdict(list)
    for r, d in dev_rank.items():
        by_dev[d].append(r)
    per_node = max((max(v) + 1 for v in devs.values() if v), default=0)
    multi = len(nodes) > 1 and per_node > 0 and len(nodes) * per_node == len(rank_set) and (
        rank_set == set(range(len(rank_set))))
    cache: dict[tuple[str | None, str | None], int | None] = {}

    def rank_of(node: str | None, device: str | None) -> int | None:
        d = _index(device)
        if d is None:
            return None
        on_host = host_ranks.get(_short(node)) if node else None
        if on_host:
            owners = [r for r in on_host if dev_rank.get(r) == d]
            if owners or any(r in dev_rank for r in on_host):
                return owners[0] if len(owners) == 1 else None
            return on_host[d] if d < len(on_host) else None
        if multi:
            r = nodes.index(node) * per_node + d if node in nodes else None
            return r if r in rank_set and dev_rank.get(r, d) == d else None
        if len(nodes) > 1:
            return None
        if dev_rank:
            owners = by_dev.get(d, [])
            return owners[0] if len(owners) == 1 else None
        return d if d in rank_set else None

    out = []
    for s in samples:
        key = (s.node, s.device)
        if key not in cache:
            cache[key] = rank_of(*key)
        out.append((cache[key], s.metric, s.ts_ns, s.value, s.device, s.node, s.unit, s.source))
    return out


def _index(device: str | None) -> int | None:
    if device is None:
        return None
    try:
        return int(device)
    except ValueError:
        return None


__all__ = ["READERS", "MetricsError", "Sample", "load_metrics", "map_ranks", "read_file", "reader_for"]
