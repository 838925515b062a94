"""What every metrics reader shares: the sample row, time parsing and the reader's context."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation

from advisor.metrics.vocab import CANONICAL, Alias, src_name


class MetricsError(Exception):
    """A metrics file that cannot be read: the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one series: ``hw_metrics`` without the rank (decided after all are read)."""

    ts_ns: int | None
    node: str | None
    device: str | None
    metric: str
    value: float
    unit: str | None
    source: str


@dataclass
class ReadContext:
    """What a reader needs besides the text: the offset of zone-less local times, and where it
    notes the series it kept under their source names."""

    tz_offset_s: float = 0.0
    kept: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    #: the trace's start (epoch ns) when known: it gives the year of times written without one
    ref_ns: int | None = None

    def sample(self, ts_ns: int | None, node: str | None, device: str | None, name: str, value: float,
               source: str, alias: Alias | None, unit: str | None = None) -> Sample:
        """A sample of the series ``name``: canonical through ``alias`` (name, factor), else kept
        as ``src:<name>`` with ``unit``."""
        if alias is not None:
            canon, factor = alias
            return Sample(ts_ns, node, device, canon, value * factor, CANONICAL[canon], source)
        kept = src_name(name)
        self.kept.add(kept)
        return Sample(ts_ns, node, device, kept, value, unit, source)


# epoch numbers: the magnitude says the unit (seconds since 1973 .. 2286 have 9-10 digits)
_EPOCH_UNITS = ((1e17, 1), (1e14, 1_000), (1e11, 1_000_000), (1e8, 1_000_000_000))
_NUM_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_ISO_RE = re.compile(
    r"^(\d{4})[-/](\d{2})[-/](\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?\s*(Z|UTC|[+-]\d{2}:?\d{2})?$",
    re.IGNORECASE,
)


def epoch_ns(x: float | str) -> int | None:
    """An epoch time in s, ms, µs or ns (told apart by magnitude) as ns; None when not plausible.
    Scaled as a decimal: an epoch in ns exceeds a double's precision."""
    try:
        d = Decimal(str(x).strip())
    except InvalidOperation:
        return None
    if not d.is_finite() or d <= 0:
        return None
    for bound, scale in _EPOCH_UNITS:
        if d >= bound:
            return int((d * scale).to_integral_value())
    return None


def parse_time(text: str, tz_offset_s: float = 0.0) -> tuple[int | None, bool]:
    """A timestamp as epoch ns, and whether it was zone-less (a local time, read as UTC plus
    ``tz_offset_s``: the local time minus the offset is UTC). Epoch numbers in s/ms/µs/ns;
    ISO 8601 or ``YYYY/MM/DD HH:MM:SS.fff`` (nvidia-smi's ``timestamp``) with or without a zone."""
    t = text.strip().strip('"')
    if not t:
        return None, False
    if _NUM_RE.match(t):
        return epoch_ns(t), False
    m = _ISO_RE.match(t)
    if not m:
        return None, False
    y, mo, d, hh, mi, ss, frac, zone = m.groups()
    try:
        base = datetime(int(y), int(mo), int(d), int(hh), int(mi), int(ss), tzinfo=timezone.utc)
    except ValueError:
        return None, False
    ns = int(base.timestamp()) * 1_000_000_000 + (int((frac or "0").ljust(9, "0")[:9]))
    if zone is None:
        return ns - round(tz_offset_s * 1e9), True
    z = zone.upper()
    if z in ("Z", "UTC"):
        return ns, False
    sign = 1 if z[0] == "+" else -1
    digits = z[1:].replace(":", "")
    off = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return ns - sign * int(off.total_seconds()) * 1_000_000_000, False


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_YEARLESS_RE = re.compile(r"^([A-Za-z]{3})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?$")


def is_yearless(text: str) -> bool:
    """Whether ``text`` is a time without a year, as moreutils ``ts`` prints by default
    (``%b %d %H:%M:%S``, e.g. ``Nov 27 16:05:01``; ``%.S`` adds a fraction)."""
    m = _YEARLESS_RE.match(text.strip())
    return bool(m and m.group(1).lower() in _MONTHS)


def parse_yearless(text: str, ref_ns: int | None, tz_offset_s: float = 0.0) -> int | None:
    """A year-less local time (``Nov 27 16:05:01``) as epoch ns, in the year that puts it nearest
    to ``ref_ns`` (the trace's start: the year before or after at a new year); None without
    ``ref_ns`` or when not such a time. Zone-less: read as UTC plus ``tz_offset_s``."""
    m = _YEARLESS_RE.match(text.strip())
    if not m or ref_ns is None or m.group(1).lower() not in _MONTHS:
        return None
    mon, day, hh, mi, ss, frac = m.groups()
    year = datetime.fromtimestamp(ref_ns / 1e9, tz=timezone.utc).year
    best: int | None = None
    for y in (year - 1, year, year + 1):
        try:
            base = datetime(y, _MONTHS.index(mon.lower()) + 1, int(day), int(hh), int(mi), int(ss), tzinfo=timezone.utc)
        except ValueError:  # Feb 29 of another year
            continue
        ns = int(base.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0")[:9]) - round(tz_offset_s * 1e9)
        if best is None or abs(ns - ref_ns) < abs(best - ref_ns):
            best = ns
    return best


def parse_number(text: str) -> tuple[float | None, str | None]:
    """A value as CSV tools write it: ``45``, ``45 %``, ``250.00 W``, ``(1900Mhz)``, ``0x0004``
    (a bitmask) -> (number, unit text or None); (None, None) for N/A, blanks and text."""
    t = text.strip().strip('"').strip()
    if t.startswith("(") and t.endswith(")"):
        t = t[1:-1].strip()
    if not t or t.upper() in ("N/A", "[N/A]", "NA", "-", "NAN", "[NOT SUPPORTED]", "NOT SUPPORTED"):
        return None, None
    if t.lower().startswith("0x"):
        try:
            return float(int(t, 16)), None
        except ValueError:
            return None, None
    m = re.match(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z%°/]+)?$", t)
    if not m:
        return None, None
    v = float(m.group(1))
    if not math.isfinite(v):
        return None, None
    return v, m.group(2)


def parse_tz_offset(text: str) -> float:
    """``--metrics-tz-offset``: ``+08:00``, ``-0530``, ``+8`` or ``UTC`` -> seconds east of UTC."""
    t = text.strip().upper()
    if t in ("UTC", "Z", "0", "+0", "-0"):
        return 0.0
    m = re.match(r"^([+-])(\d{1,2})(?::?(\d{2}))?$", t)
    if not m:
        raise ValueError(f"{text!r} is not a UTC offset such as +08:00, -05:30 or UTC")
    hours, minutes = int(m.group(2)), int(m.group(3) or 0)
    if hours > 14 or minutes >= 60:
        raise ValueError(f"{text!r} is not a UTC offset (at most 14 hours)")
    return (1 if m.group(1) == "+" else -1) * (hours * 3600 + minutes * 60)
