"""Synthetic jobs with hardware metric series for the hardware stage and rules (tests/test_hardware*.py).

A job: ``n_dev`` ranks, one device each (NVIDIA A100-SXM4-80GB: devices.toml gives nominal
1410 MHz, NVLink 300 GB/s and PCIe 31.5 GB/s per direction, 80 GB), ``n_steps`` steps of
``step_ms`` each. Every step on every rank: one kernel over its first 60 %, one collective over
the next 30 %, the last 10 % idle. Each series is sampled ``spp`` times per step, at the middle of
equal slices (so a sample never falls on a phase boundary); its value is the phase's level below
times ``1 + u``, ``u`` uniform in [-noise, +noise] (seeded per rank). ``plants`` change one
device (see :func:`series`); every figure the tests assert is computed from these levels.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd

from advisor.engine.context import AnalysisContext
from advisor.testing import context_from_tables

MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000  # epoch ns
DEVICE = "NVIDIA A100-SXM4-80GB"
COMPUTE, COMM = 0.6, 0.9  # phase bounds as shares of the step

# level per phase (compute, comm, idle) and relative noise
HEALTHY: dict[str, tuple[tuple[float, float, float], float]] = {
    "util_gpu_pct": ((95.0, 90.0, 3.0), 0.01),
    "sm_active_pct": ((75.0, 20.0, 1.0), 0.01),
    "dram_active_pct": ((37.5, 10.0, 0.5), 0.01),  # half of sm_active: redundant with it
    "tensor_active_pct": ((40.0, 0.5, 0.2), 0.01),
    "clock_sm_mhz": ((1410.0, 1410.0, 1410.0), 0.002),
    "temp_gpu_c": ((62.0, 62.0, 62.0), 0.005),
    "power_w": ((330.0, 250.0, 90.0), 0.01),
    "power_limit_w": ((400.0, 400.0, 400.0), 0.0),
    "mem_used_bytes": ((50e9, 50e9, 50e9), 0.001),
    "mem_total_bytes": ((80e9, 80e9, 80e9), 0.0),
    "nvlink_tx_bps": ((0.5e9, 120e9, 0.5e9), 0.02),
    "nvlink_rx_bps": ((0.5e9, 120e9, 0.5e9), 0.02),
    "pcie_tx_bps": ((1.5e9, 3e9, 0.2e9), 0.02),
    "pcie_rx_bps": ((1.5e9, 3e9, 0.2e9), 0.02),
    "ecc_errors": ((0.0, 0.0, 0.0), 0.0),
}


def phase_of(frac: float) -> int:
    """0 compute, 1 comm, 2 idle for a position inside the step (share of the step)."""
    return 0 if frac < COMPUTE else 1 if frac < COMM else 2


def series(n_dev: int = 8, n_steps: int = 10, step_ms: float = 100.0, spp: int = 20,
           plants: dict[str, Any] | None = None, ranked: bool = True,
           metrics: tuple[str, ...] | None = None) -> pd.DataFrame:
    """hw_metrics rows (a DataFrame in the canonical column order).

    ``plants``: ``throttle`` = (device, first step): clock 1100 MHz, temperature 90 °C, power at its
    400 W cap from that step on; ``saturate`` = device: NVLink tx 295 GB/s while communicating;
    ``underfill`` = device: SM activity 15 %, tensor 5 % while computing; ``diverge`` = device:
    PCIe traffic 4x; ``leak`` = device: memory 50 GB + 1 GB per step after the first, no noise;
    ``nvlink_off`` = device: NVLink 0.01 GB/s, PCIe 20 GB/s while communicating.
    ``ranked``: samples carry their rank, else only ``node`` / ``device``.
    """
    plants = plants or {}
    rows: list[tuple[Any, ...]] = []
    step_ns = int(step_ms * MS)
    for d in range(n_dev):
        rng = random.Random(1000 + d)
        for name, (levels, noise) in HEALTHY.items():
            if metrics is not None and name not in metrics:
                continue
            for s in range(n_steps):
                for k in range(spp):
                    frac = (k + 0.5) / spp
                    ph = phase_of(frac)
                    v = levels[ph]
                    nz = noise
                    thr = plants.get("throttle")
                    if thr and thr[0] == d and s + 1 >= thr[1]:
                        v = {"clock_sm_mhz": 1100.0, "temp_gpu_c": 90.0, "power_w": 400.0}.get(name, v)
                    if plants.get("saturate") == d and name == "nvlink_tx_bps" and ph == 1:
                        v = 295e9
                    if plants.get("underfill") in (d, "all") and ph == 0:
                        v = {"sm_active_pct": 15.0, "dram_active_pct": 7.5, "tensor_active_pct": 5.0}.get(name, v)
                    if plants.get("diverge") == d and name.startswith("pcie_"):
                        v *= 4
                    if plants.get("leak") == d and name == "mem_used_bytes":
                        v, nz = 50e9 + 1e9 * s, 0.0
                    if plants.get("nvlink_off") == d:
                        if name.startswith("nvlink_"):
                            v = 0.01e9
                        elif name.startswith("pcie_") and ph == 1:
                            v = 20e9
                    v *= 1 + rng.uniform(-nz, nz)
                    ts = T0 + s * step_ns + int(frac * step_ns)
                    rows.append((d if ranked else None, name, ts, v, f"GPU-{d}", f"node{d // 8}", None, "dcgm"))
    return pd.DataFrame(rows, columns=["rank", "metric", "ts_ns", "value", "device", "node", "unit", "source"])


def events(n_dev: int = 8, n_steps: int = 10, step_ms: float = 100.0,
           slow: tuple[int, float] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Step markers, one kernel and one collective per step per rank (see the module doc).

    ``slow`` = (rank, factor): that rank's kernel lasts ``factor`` times longer and its collective
    ends with the others' (they wait for it inside theirs)."""
    ev: list[dict[str, Any]] = []
    step_ns = int(step_ms * MS)
    for r in range(n_dev):
        kernel = int(COMPUTE * step_ns * (slow[1] if slow and slow[0] == r else 1.0))
        for s in range(n_steps):
            t = T0 + s * step_ns
            ev.append({"rank": r, "kind": "step", "name": f"ProfilerStep#{s + 1}", "device": False, "pid": "host",
                       "tid": "main", "start_ns": t, "dur_ns": step_ns})
            ev.append({"rank": r, "kind": "kernel", "name": "gemm_kernel", "device": True, "pid": "0", "tid": "7",
                       "start_ns": t, "dur_ns": kernel})
            ev.append({"rank": r, "kind": "comm", "name": "ncclDevKernel_AllReduce", "device": True, "pid": "0",
                       "tid": "20", "start_ns": t + kernel, "dur_ns": int(COMM * step_ns) - kernel})
    ranks = [{"rank": r, "source": "kineto", "device_name": DEVICE, "has_device": True, "rank_source": "test",
              "files": ""} for r in range(n_dev)]
    return {"events": ev, "ranks": ranks}


def insert_series(ctx: AnalysisContext, df: pd.DataFrame) -> None:
    """Bulk-insert hw_metrics rows into a built context."""
    cur = ctx.con.cursor()
    cur.register("_hw_df", df)
    cur.execute("INSERT INTO hw_metrics (rank, metric, ts_ns, value, device, node, unit, source) "
                "SELECT rank, metric, ts_ns, value, device, node, unit, source FROM _hw_df")
    cur.unregister("_hw_df")


def job(n_dev: int = 8, n_steps: int = 10, step_ms: float = 100.0, spp: int = 20, plants: dict[str, Any] | None = None,
        with_events: bool = True, ranked: bool = True, slow: tuple[int, float] | None = None) -> AnalysisContext:
    """A context with the job's events (unless ``with_events`` is false) and its series."""
    tables = events(n_dev, n_steps, step_ms, slow) if with_events else {}
    ctx = context_from_tables(tables)
    insert_series(ctx, series(n_dev, n_steps, step_ms, spp, plants, ranked))
    return ctx


# ---- canonical rows for the rule case files (tests/rules/cases/HW*.toml, CMP005.toml): 4 ranks, 4 steps,
# 10 samples per step (6 while computing, 3 while communicating, 1 idle), only the series a rule reads
_BUSY = ("util_gpu_pct", "sm_active_pct", "tensor_active_pct")
_LINKS = ("nvlink_tx_bps", "nvlink_rx_bps", "pcie_tx_bps", "pcie_rx_bps")
_CLOCK = ("clock_sm_mhz", "temp_gpu_c", "power_w", "power_limit_w")
_MEM = ("mem_used_bytes", "mem_total_bytes")


def tables(plants: dict[str, Any] | None = None, metrics: tuple[str, ...] = _BUSY, n_dev: int = 4,
           n_steps: int = 4) -> dict[str, list[dict[str, Any]]]:
    """Events and hw_metrics rows of a small job (see :func:`series`)."""
    out = events(n_dev, n_steps)
    df = series(n_dev, n_steps, 100.0, 10, plants, metrics=metrics)
    out["hw_metrics"] = [{k: (None if (v is None or (isinstance(v, float) and math.isnan(v))) else v) for k, v in r.items()}
                         for r in df.to_dict("records")]
    return out


def busy_healthy() -> dict[str, list[dict[str, Any]]]:
    """util 95 % / SM activity 75 % while computing: 0.79 of busy."""
    return tables()


def busy_underfilled() -> dict[str, list[dict[str, Any]]]:
    """Rank 1: util 95 %, SM activity 15 % while computing (0.158 of busy)."""
    return tables({"underfill": 1})


def links_healthy() -> dict[str, list[dict[str, Any]]]:
    """NVLink 120 of 300 GB/s while communicating, PCIe 3 GB/s."""
    return tables(metrics=_LINKS)


def links_saturated() -> dict[str, list[dict[str, Any]]]:
    """Rank 2: NVLink tx 295 of 300 GB/s while communicating."""
    return tables({"saturate": 2}, metrics=_LINKS)


def links_nvlink_off() -> dict[str, list[dict[str, Any]]]:
    """Rank 3: NVLink 0.01 GB/s, PCIe 20 GB/s while communicating."""
    return tables({"nvlink_off": 3}, metrics=_LINKS)


def diverging() -> dict[str, list[dict[str, Any]]]:
    """Rank 2: PCIe traffic four times its peers' (step times equal)."""
    return tables({"diverge": 2}, metrics=("util_gpu_pct", "pcie_tx_bps"))


def diverging_healthy() -> dict[str, list[dict[str, Any]]]:
    """Every device alike."""
    return tables(metrics=("util_gpu_pct", "pcie_tx_bps"))


def memory_leak() -> dict[str, list[dict[str, Any]]]:
    """Rank 1: 50, 51, 52, 53 GB in steps 1-4 of 80 GB: runs out at step 4 + (80 - 53) = 31."""
    return tables({"leak": 1}, metrics=_MEM)


def memory_steady() -> dict[str, list[dict[str, Any]]]:
    """50 GB +- 0.1 % noise on every device."""
    return tables(metrics=_MEM)


def clock_throttled() -> dict[str, list[dict[str, Any]]]:
    """Rank 2 from step 3: 1100 MHz of a nominal 1410 (drop 1 - 1100/1410 = 0.2199), 90 °C, 400 W of a 400 W cap."""
    return tables({"throttle": (2, 3)}, metrics=_CLOCK)


def clock_healthy() -> dict[str, list[dict[str, Any]]]:
    """1410 MHz +- 0.2 %, 62 °C, 330 W of 400 while computing."""
    return tables(metrics=_CLOCK)


def memory_leak_no_total() -> dict[str, list[dict[str, Any]]]:
    """As :func:`memory_leak` without mem_total_bytes: the device's 80 GB come from devices.toml."""
    return tables({"leak": 1}, metrics=("mem_used_bytes",))
