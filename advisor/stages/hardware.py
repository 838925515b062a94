"""Hardware metric series per device, step and step phase (Moneo-style metric selection).

Input: the canonical ``hw_metrics`` table (one row per sample: rank or device/node, canonical
metric name, time on the trace's clock, value). The stage computes, once per analysis
(:func:`get`):

* **per device**: a device is its rank where the sample names one, else its ``node`` / ``device``
  as the source names them;
* **per step**: each sample falls in the step window of its rank (``steps``), or, without a rank,
  in the job-wide window of the step (median start and end over the ranks);
* **per phase**: on a rank with device events, a sample taken while a device communication runs
  is ``comm``, while only device computation (kernels, copies) runs ``compute``, else ``idle`` -
  the classes of the breakdown (:mod:`advisor.stages.breakdown`) at the sample's instant;
* **metric selection** (Moneo §II-B): a metric whose values hardly vary (standard deviation under
  ``CONSTANT_TOL`` of its largest magnitude) is dropped as constant; of two metrics whose series
  are close (Moneo's Eq. 1: Euclidean distance of the series, each divided by its metric's
  maximum, here as a root mean square over the time bins so the figure does not grow with the
  number of samples) under ``REDUNDANT_TOL``, the first in canonical order is kept and the other
  dropped as redundant. The selection shapes the report; the rules read every series;
* **divergence**: per kept metric, each device's binned series against the peers' median series,
  the same normalised distance; a device's score is its largest distance over the metrics.

Cluster-level parts (selection, divergence, the report's series) read only ``hw_metrics``,
``steps`` and the breakdown; the phase of a sample reads the rank's own device events.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from advisor.schema import NO_STEP, OWN_TABLES_SQL
from advisor.units import fmt_value, unit_of

# Moneo's variance filter: a series whose standard deviation is below this share of its largest
# magnitude carries no information
CONSTANT_TOL = 0.01
# Moneo's normalised Euclidean distance (as a root mean square) under which two metrics are one
REDUNDANT_TOL = 0.05
# samples per series beyond which the stage averages a series over time buckets
MAX_PER_SERIES = 4000
# devices the redundancy test compares (evenly spread over the device list)
SELECT_DEVICES = 64
# time bins over the profile for the distance computations
BINS = 64
# devices up to which the report carries one line per device; beyond, a heat map per metric
MAX_LINE_DEVICES = 16
LINE_POINTS = 120
# the report's heat maps hold at most this many cells in all (1,024 devices x a few metrics)
MAX_HEAT_CELLS = 60_000
MAX_CHART_METRICS = 12
PHASES = ("compute", "comm", "idle")
# below this many devices a device's peers' median leaves the device out
LEAVE_ONE_OUT = 16

#: canonical metric names (coordination C4) in the order metric selection prefers them
CANONICAL = (
    "util_gpu_pct", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct",
    "aicore_util_pct", "aivector_util_pct", "cube_util_pct", "clock_sm_mhz", "clock_mem_mhz", "aicore_freq_mhz",
    "power_w", "power_limit_w", "temp_gpu_c", "temp_mem_c", "mem_used_bytes", "mem_total_bytes",
    "hbm_read_bps", "hbm_write_bps", "hbm_bw_bps", "llc_read_bps", "llc_write_bps", "ddr_bw_bps",
    "pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps", "hccs_tx_bps", "hccs_rx_bps",
    "nic_tx_bps", "nic_rx_bps", "roce_tx_bps", "roce_rx_bps", "xgmi_bw_bps", "throttle_reasons", "ecc_errors",
)
_ORDER = {m: i for i, m in enumerate(CANONICAL)}

@dataclass
class Hardware:
    """What the stage computed (see the module doc). Frames are empty when the profile has no series."""

    samples: pd.DataFrame  # dev, dev_i (position in devices), rank, metric, ts_ns, value, step, phase
    devices: pd.DataFrame  # dev, label, rank, node, device
    metrics: list[dict[str, Any]]  # one summary per metric (kept / dropped and why)
    by_step: pd.DataFrame  # dev, rank, metric, step, mean, p95, min, max, n
    by_phase: pd.DataFrame  # dev, rank, metric, phase, mean, n
    bins: dict[str, np.ndarray]  # metric -> devices x BINS bin means (NaN where no sample)
    divergence: pd.DataFrame  # dev, metric, distance (per kept metric)
    windows: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["step", "start_ns", "end_ns"]))
    t0_ns: int = 0
    t1_ns: int = 0
    phases_known: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """No usable sample."""
        return self.samples.empty

    @property
    def kept(self) -> list[str]:
        """Metrics kept by the selection."""
        return [m["metric"] for m in self.metrics if m["kept"]]

    def series(self, metric: str) -> pd.DataFrame:
        """Every sample of one metric (dev, rank, ts_ns, value, step, phase)."""
        return self.samples[self.samples["metric"] == metric]

    @functools.cached_property
    def _labels(self) -> dict[str, str]:
        return {str(d): str(lb) for d, lb in zip(self.devices["dev"], self.devices["label"], strict=True)}

    @functools.cached_property
    def _ranks(self) -> dict[str, int | None]:
        return {str(d): None if pd.isna(r) else int(r) for d, r in zip(self.devices["dev"], self.devices["rank"],
                                                                        strict=True)}

    def label(self, dev: str) -> str:
        """How a finding names a device."""
        return self._labels.get(dev, dev)

    def rank_of(self, dev: str) -> int | None:
        """The rank of a device (None when the source could not map it)."""
        return self._ranks.get(dev)

    def in_phase(self, metric: str, phase: str) -> tuple[pd.DataFrame, str]:
        """The samples of ``metric`` taken in ``phase``, per device: where the device has none there (no
        device events, or a sparse series sampled only when its value changes), its samples inside steps,
        else all of them; and the basis, as a finding states it."""
        s = self.series(metric)
        if s.empty:
            return s, "no samples"
        in_ph = s["phase"] == phase
        in_step = s["step"] != NO_STEP
        has_ph = in_ph.groupby(s["dev"]).transform("any")
        has_step = in_step.groupby(s["dev"]).transform("any")
        keep = np.where(has_ph, in_ph, np.where(has_step, in_step, True))
        out = s[keep]
        if bool(has_ph.all()):
            return out, f"{phase} phase"
        if not bool(has_ph.any()):
            return out, "whole steps (phases unknown)" if bool(has_step.all()) else "whole profile"
        return out, f"{phase} phase where sampled there, else whole steps"

    def scores(self) -> pd.DataFrame:
        """Per device its largest distance to the peers' median over the kept metrics, and which metric."""
        if self.divergence.empty:
            return pd.DataFrame(columns=["dev", "metric", "distance"])
        d = self.divergence.sort_values(["dev", "distance", "metric"], ascending=[True, False, True])
        return d.groupby("dev", sort=True).head(1).reset_index(drop=True)


_LOCK = threading.Lock()


def get(analysis: Any) -> Hardware:
    """The stage's result for an analysis context, computed once (the rules run in threads)."""
    with _LOCK:
        hw = analysis.extras.get("hardware_stage")
        if hw is None:
            hw = compute(analysis.con, analysis.breakdown)
            analysis.extras["hardware_stage"] = hw
        return hw  # type: ignore[no-any-return]


def _empty() -> Hardware:
    cols = ["dev", "dev_i", "rank", "metric", "ts_ns", "value", "step", "phase"]
    return Hardware(pd.DataFrame(columns=cols), pd.DataFrame(columns=["dev", "label", "rank", "node", "device"]), [],
                    pd.DataFrame(columns=["dev", "rank", "metric", "step", "mean", "p95", "min", "max", "n"]),
                    pd.DataFrame(columns=["dev", "rank", "metric", "phase", "mean", "n"]), {},
                    pd.DataFrame(columns=["dev", "metric", "distance"]))


_DEV_SQL = ("CASE WHEN rank IS NOT NULL THEN 'r' || CAST(rank AS VARCHAR) "
            "ELSE 'd:' || node || '/' || device END")


def _load(con: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every usable sample (dev, rank, metric, ts_ns, value) and the device table (dev, label, rank,
    node, device; a rank is its own device). A series with more than :data:`MAX_PER_SERIES` samples
    is averaged over that many equal time buckets of the profile (the stage's memory stays bounded
    whatever the rate)."""
    cols = {r[0] for r in con.cursor().execute(
        f"SELECT column_name FROM duckdb_columns() WHERE table_name = 'hw_metrics' AND {OWN_TABLES_SQL}")
            .fetchall()}
    node = "coalesce(node, '')" if "node" in cols else "''"
    device = "coalesce(device, '')" if "device" in cols else "''"
    base = (f"SELECT rank, {node} AS node, {device} AS device, lower(metric) AS metric, ts_ns, value FROM hw_metrics "
            "WHERE value IS NOT NULL AND isfinite(value) AND ts_ns IS NOT NULL AND metric IS NOT NULL")
    keyed = f"SELECT {_DEV_SQL} AS dev, * FROM ({base})"
    cur = con.cursor()
    most = cur.execute(f"SELECT max(n) FROM (SELECT count(*) AS n FROM ({base}) GROUP BY ALL)").fetchone()
    if most and most[0] and int(most[0]) > MAX_PER_SERIES:
        sql = f"""WITH h AS ({keyed}), b AS (SELECT min(ts_ns) AS t0, max(ts_ns) - min(ts_ns) + 1 AS span FROM h)
        SELECT dev, rank, metric, min(ts_ns) AS ts_ns, avg(value) AS value FROM h, b
        GROUP BY dev, rank, metric, floor((ts_ns - t0) * {MAX_PER_SERIES}.0 / span)"""
    else:
        sql = f"SELECT dev, rank, metric, ts_ns, value FROM ({keyed})"
    df: pd.DataFrame = cur.execute(sql).df()
    devs: pd.DataFrame = cur.execute(
        f"""SELECT dev, any_value(rank) AS rank, any_value(node) AS node, any_value(device) AS device
        FROM ({keyed}) GROUP BY dev ORDER BY any_value(rank) NULLS LAST, any_value(node), any_value(device)""").df()

    def label(r: Any) -> str:
        where = "/".join(str(x) for x in (r["node"], r["device"]) if x)
        if pd.notna(r["rank"]):
            return f"rank {int(r['rank'])}" + (f" ({where})" if where else "")
        return where or "device ?"

    devs["label"] = [label(r) for _, r in devs.iterrows()]
    return df, devs[["dev", "label", "rank", "node", "device"]]


def _assign_steps(con: Any, df: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Each sample's step: its rank's window, else the job-wide window (median bounds over ranks);
    and the job-wide windows."""
    steps = con.cursor().execute(
        "SELECT rank, step, start_ns, end_ns FROM steps WHERE step <> ? ORDER BY rank, start_ns", [NO_STEP]).df()
    out = np.full(len(df), NO_STEP, dtype=np.int64)
    if steps.empty:
        return out, pd.DataFrame(columns=["step", "start_ns", "end_ns"])
    job = steps.groupby("step").agg(start_ns=("start_ns", "median"), end_ns=("end_ns", "median")).reset_index()
    job = job.sort_values("start_ns").reset_index(drop=True)

    def place(ts: np.ndarray, win: pd.DataFrame) -> np.ndarray:
        starts = win["start_ns"].to_numpy(dtype=np.float64)
        ends = win["end_ns"].to_numpy(dtype=np.float64)
        idx = np.searchsorted(starts, ts, side="right") - 1
        ok = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)])
        return np.where(ok, win["step"].to_numpy()[np.clip(idx, 0, None)], NO_STEP)

    ts_all = df["ts_ns"].to_numpy(dtype=np.float64)
    ranks = df["rank"]
    done = np.zeros(len(df), dtype=bool)
    for rank, win in steps.groupby("rank"):
        sel = (ranks == rank).fillna(False).to_numpy(dtype=bool)  # a device mapped to no rank: NA
        if sel.any():
            out[sel] = place(ts_all[sel], win)
            done |= sel
    rest = ~done
    if rest.any():
        out[rest] = place(ts_all[rest], job)
    return out, job


def _covered(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each instant of ``t`` lies inside one of the intervals [start, end)."""
    if not len(starts):
        return np.zeros(len(t), dtype=bool)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    reach = np.maximum.accumulate(ends[order])
    idx = np.searchsorted(s, t, side="right") - 1
    return (idx >= 0) & (reach[np.clip(idx, 0, None)] > t)


def _assign_phases(con: Any, df: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """Each sample's phase (compute / comm / idle) from its rank's device events; '' where unknown."""
    out = np.full(len(df), "", dtype=object)
    ranks = sorted({int(r) for r in df["rank"].dropna().unique()})
    if not ranks:
        return out, False
    ev = None
    for sql in (
        """SELECT rank, kind = 'comm' AS comm, start_ns, start_ns + dur_ns AS end_ns FROM events
           WHERE device AND kind IN ('kernel', 'comm', 'memcpy', 'memset') AND dur_ns > 0
             AND rank IN (SELECT unnest(?))""",
        # the cluster reduce holds no events: the busy periods the per-rank map merged from them
        "SELECT rank, comm, start_ns, end_ns FROM device_phase_islands WHERE rank IN (SELECT unnest(?))",
    ):
        try:
            ev = con.cursor().execute(sql, [ranks]).df()
            break
        except Exception:  # noqa: BLE001, S112 -- a context without this table: the next source
            continue
    if ev is None:  # neither: phases unknown
        return out, False
    if ev.empty:
        return out, False
    ts_all = df["ts_ns"].to_numpy(dtype=np.float64)
    rank_col = df["rank"]
    known = False
    for rank, g in ev.groupby("rank"):
        sel = (rank_col == rank).fillna(False).to_numpy(dtype=bool)  # a device mapped to no rank: NA
        if not sel.any():
            continue
        t = ts_all[sel]
        comm = g[g["comm"]]
        comp = g[~g["comm"]]
        in_comm = _covered(comm["start_ns"].to_numpy(np.float64), comm["end_ns"].to_numpy(np.float64), t)
        in_comp = _covered(comp["start_ns"].to_numpy(np.float64), comp["end_ns"].to_numpy(np.float64), t)
        out[sel] = np.where(in_comm, "comm", np.where(in_comp, "compute", "idle"))
        known = True
    return out, known


def _bin_matrix(df: pd.DataFrame, devs: list[str], t0: int, t1: int, nbins: int) -> np.ndarray:
    """devices x nbins mean of the samples of one metric (NaN where a bin has none)."""
    span = max(1, t1 - t0 + 1)
    b = np.minimum(nbins - 1, ((df["ts_ns"].to_numpy(np.float64) - t0) * nbins / span).astype(np.int64))
    if "dev_i" in df:
        di = df["dev_i"].to_numpy()
    else:
        pos = {d: i for i, d in enumerate(devs)}
        di = df["dev"].map(pos).to_numpy()
    sums = np.zeros((len(devs), nbins))
    counts = np.zeros((len(devs), nbins))
    np.add.at(sums, (di, b), df["value"].to_numpy(np.float64))
    np.add.at(counts, (di, b), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def distance(a: np.ndarray, b: np.ndarray, scale: float) -> float | None:
    """Moneo's normalised Euclidean distance as a root mean square over the cells both series have."""
    ok = ~(np.isnan(a) | np.isnan(b))
    if not ok.any() or scale <= 0:
        return None
    return float(np.sqrt(np.mean(((a[ok] - b[ok]) / scale) ** 2)))


def _select(samples: pd.DataFrame, bins: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Per metric its summary and whether metric selection keeps it (see the module doc)."""
    out: list[dict[str, Any]] = []
    kept: list[tuple[str, np.ndarray]] = []
    groups = {str(m): g for m, g in samples.groupby("metric", sort=False)}
    names = sorted(groups, key=lambda m: (_ORDER.get(m, len(_ORDER)), m))
    n_dev = len(next(iter(bins.values()))) if bins else 0
    # the redundancy test compares at most SELECT_DEVICES devices, evenly spread (hundreds of metrics
    # x 1,024 devices would be a quadratic cost for the same answer)
    rows = np.unique(np.linspace(0, max(0, n_dev - 1), min(n_dev, SELECT_DEVICES)).astype(int)) if n_dev else None
    for m in names:
        g = groups[m]
        v = g["value"].to_numpy(np.float64)
        peak = float(np.max(np.abs(v))) if len(v) else 0.0
        rel_std = float(np.std(v) / peak) if peak > 0 else 0.0
        rec: dict[str, Any] = {
            "metric": m, "unit": unit_of(m), "devices": int(g["dev"].nunique()), "samples": len(v),
            "mean": float(np.mean(v)), "p95": float(np.percentile(v, 95)), "min": float(np.min(v)),
            "max": float(np.max(v)), "rel_std": round(rel_std, 4), "kept": True, "dropped": None, "like": None,
        }
        if rel_std < CONSTANT_TOL:
            rec.update(kept=False, dropped="constant")
        else:
            mat = bins[m][rows] / peak
            for other, omat in kept:
                dist = distance(mat, omat, 1.0)
                if dist is not None and dist < REDUNDANT_TOL:
                    rec.update(kept=False, dropped="redundant", like=other, distance=round(dist, 4))
                    break
            if rec["kept"]:
                kept.append((m, mat))
        out.append(rec)
    return out


def compute(con: Any, breakdown: pd.DataFrame | None = None) -> Hardware:
    """The stage over the canonical tables on ``con`` (see the module doc)."""
    try:
        df, devs = _load(con)
    except Exception:  # noqa: BLE001 -- no hw_metrics table at all
        return _empty()
    if df.empty:
        return _empty()
    dev_list = [str(d) for d in devs["dev"]]
    df["dev_i"] = pd.Categorical(df["dev"], categories=dev_list).codes
    df["step"], windows = _assign_steps(con, df)
    phases, known = _assign_phases(con, df)
    df["phase"] = phases
    samples = df[["dev", "dev_i", "rank", "metric", "ts_ns", "value", "step", "phase"]].reset_index(drop=True)
    t0, t1 = int(samples["ts_ns"].min()), int(samples["ts_ns"].max())
    bins = {str(m): _bin_matrix(g, dev_list, t0, t1, BINS) for m, g in samples.groupby("metric", sort=True)}
    metrics = _select(samples, bins)

    in_step = samples[samples["step"] != NO_STEP]
    if in_step.empty:
        by_step = _empty().by_step
    else:
        grp = in_step.groupby(["dev", "metric", "step"], sort=True)["value"]
        by_step = grp.agg(mean="mean", min="min", max="max", n="count").reset_index()
        by_step["p95"] = grp.quantile(0.95).to_numpy()
        by_step = by_step.merge(devs[["dev", "rank"]], on="dev", how="left")
    with_phase = samples[samples["phase"] != ""]
    by_phase = (with_phase.groupby(["dev", "metric", "phase"], sort=True)["value"].agg(mean="mean", n="count")
                .reset_index().merge(devs[["dev", "rank"]], on="dev", how="left")
                if not with_phase.empty else _empty().by_phase)
    phase_means = with_phase.groupby(["metric", "phase"])["value"].mean().to_dict() if len(with_phase) else {}
    for rec in metrics:
        rec["by_phase"] = {p: float(phase_means[(rec["metric"], p)]) for p in PHASES
                           if (rec["metric"], p) in phase_means}

    div_rows = []
    if len(dev_list) >= 3:
        for rec in metrics:
            if not rec["kept"]:
                continue
            mat = bins[rec["metric"]]
            scale = max(abs(rec["max"]), abs(rec["min"]))
            with warnings.catch_warnings():  # a bin no device sampled has no median
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(mat, axis=0)
            for i, dev in enumerate(dev_list):
                peers = med
                if len(dev_list) < LEAVE_ONE_OUT:  # among few devices one would pull the median towards itself
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        peers = np.nanmedian(np.delete(mat, i, axis=0), axis=0)
                dist = distance(mat[i], peers, scale)
                if dist is not None:
                    div_rows.append({"dev": dev, "metric": rec["metric"], "distance": dist})
    divergence = pd.DataFrame(div_rows, columns=["dev", "metric", "distance"])
    return Hardware(samples=samples, devices=devs, metrics=metrics, by_step=by_step, by_phase=by_phase, bins=bins,
                    divergence=divergence, windows=windows, t0_ns=t0, t1_ns=t1, phases_known=known)


# --------------------------------------------------------------------------------- report
def summary_line(rec: dict[str, Any]) -> str:
    """One line per metric: its spread over devices and samples, per phase where known, the selection."""
    m = rec["metric"]
    parts = [(f"{m}: mean {fmt_value(m, rec['mean'])}, p95 {fmt_value(m, rec['p95'])}, "
             f"range {fmt_value(m, rec['min'])} - {fmt_value(m, rec['max'])} over {rec['devices']} device"
             f"{'' if rec['devices'] == 1 else 's'}")]
    bp = rec.get("by_phase") or {}
    if bp:
        parts.append("; " + ", ".join(f"{p} {fmt_value(m, v)}" for p, v in bp.items()))
    if rec["dropped"] == "constant":
        parts.append(" (dropped: constant)")
    elif rec["dropped"] == "redundant":
        parts.append(f" (dropped: redundant with {rec['like']})")
    return "".join(parts)


def _round(v: float) -> float | None:
    if not math.isfinite(v):
        return None
    return float(f"{v:.4g}")


def report(hw: Hardware, breakdown: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """The report's ``hardware`` field: per metric a one-line summary, the kept and dropped lists,
    the most diverging devices, and per-device series downsampled for the chart (a heat map when
    there are more than :data:`MAX_LINE_DEVICES` devices), bounded in size whatever the device count."""
    if hw.empty:
        return None
    devs = list(hw.devices["dev"])
    labels = dict(zip(hw.devices["dev"], hw.devices["label"], strict=True))
    metrics = []
    for rec in hw.metrics:
        metrics.append({
            "metric": rec["metric"], "unit": rec["unit"], "devices": rec["devices"], "samples": rec["samples"],
            "mean": _round(rec["mean"]), "p95": _round(rec["p95"]), "min": _round(rec["min"]),
            "max": _round(rec["max"]), "kept": rec["kept"], "dropped": rec["dropped"], "like": rec["like"],
            "by_phase": {k: _round(v) for k, v in (rec.get("by_phase") or {}).items()},
            "summary": summary_line(rec),
        })
    scores = hw.scores().sort_values("distance", ascending=False).head(10)
    diverging = [{"device": labels.get(r["dev"], r["dev"]), "rank": hw.rank_of(r["dev"]), "metric": r["metric"],
                  "distance": round(float(r["distance"]), 4)} for _, r in scores.iterrows()]
    shown = [m for m in hw.kept][:MAX_CHART_METRICS]
    mode = "lines" if len(devs) <= MAX_LINE_DEVICES else "heatmap"
    nb = LINE_POINTS if mode == "lines" else max(8, min(BINS, MAX_HEAT_CELLS // max(1, len(devs) * max(1, len(shown)))))
    t0, t1 = hw.t0_ns, hw.t1_ns
    span_ms = max(1e-6, (t1 - t0) / 1e6)
    charts = []
    for m in shown:
        g = hw.series(m)
        # no more bins than a device has samples, so a sparse series is not drawn as gaps
        per_dev = int(g.groupby("dev").size().max()) if len(g) else 1
        mat = _bin_matrix(g, devs, t0, t1, max(1, min(nb, per_dev)))
        lo, hi = float(np.nanmin(mat)), float(np.nanmax(mat))
        rows = [{"device": labels[d], "values": [None if np.isnan(x) else _round(float(x)) for x in mat[i]]}
                for i, d in enumerate(devs) if not np.all(np.isnan(mat[i]))]
        charts.append({"metric": m, "unit": unit_of(m), "lo": _round(lo), "hi": _round(hi), "rows": rows})
    return {
        "devices": len(devs),
        "samples": len(hw.samples),
        "phases_known": hw.phases_known,
        "metrics": metrics,
        "kept": hw.kept,
        "dropped": [{"metric": r["metric"], "reason": r["dropped"], "like": r["like"]} for r in hw.metrics
                    if not r["kept"]],
        "diverging": diverging,
        "timeline": {"t0_ns": t0, "span_ms": round(span_ms, 3), "bins": nb, "mode": mode,
                     "steps": _step_marks(hw, breakdown, t0)},
        "series": charts,
    }


def _step_marks(hw: Hardware, breakdown: pd.DataFrame | None, t0: int) -> list[dict[str, Any]]:
    """Job-wide step windows relative to the first sample (ms) with the breakdown's phase shares
    (summed over ranks)."""
    out = []
    classes = ("compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")
    bd = breakdown if breakdown is not None and not breakdown.empty else None
    for _, r in hw.windows.head(512).iterrows():
        step = int(r["step"])
        mark: dict[str, Any] = {"step": step, "start_ms": round((float(r["start_ns"]) - t0) / 1e6, 3),
                                "end_ms": round((float(r["end_ns"]) - t0) / 1e6, 3)}
        if bd is not None and "step_us" in bd:
            rows = bd[bd["step"] == step]
            tot = float(rows["step_us"].sum()) if len(rows) else 0.0
            if tot > 0:
                mark["phases"] = {c[:-3]: round(float(rows[c].sum()) / tot, 4) for c in classes if c in rows}
        out.append(mark)
    return out
