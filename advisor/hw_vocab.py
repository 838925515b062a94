"""Canonical hardware metric names, their units, and each source's names for them.

A series lands in ``hw_metrics`` under a canonical name (the unit is part of the name:
``_pct`` 0-100, ``_bps`` bytes per second, ``_bytes``, ``_mhz``, ``_w``, ``_c``) or, when no
canonical name fits, under its source name lower-cased with the prefix ``src:`` (and the load
lists it in a warning). Each source maps its field names to ``(canonical name, factor)``: the
source's value times ``factor`` is the canonical value (a ratio 0..1 times 100 is a percentage,
MiB times 2**20 bytes ...).

Both the export readers (:mod:`advisor.ingest`: Kineto counters, Ascend series) and the ``--metrics``
readers (:mod:`advisor.metrics`) name their series with it; it imports neither.
"""

from __future__ import annotations

MIB = float(1 << 20)
KIB = 1024.0

#: canonical metric -> unit written in ``hw_metrics.unit``
CANONICAL: dict[str, str] = {
    "util_gpu_pct": "%",
    "sm_active_pct": "%",
    "sm_occupancy_pct": "%",
    "tensor_active_pct": "%",
    "dram_active_pct": "%",
    "aicore_util_pct": "%",
    "aivector_util_pct": "%",
    "cube_util_pct": "%",
    "clock_sm_mhz": "MHz",
    "clock_mem_mhz": "MHz",
    "aicore_freq_mhz": "MHz",
    "power_w": "W",
    "power_limit_w": "W",
    "temp_gpu_c": "C",
    "temp_mem_c": "C",
    "mem_used_bytes": "B",
    "mem_total_bytes": "B",
    "hbm_read_bps": "B/s",
    "hbm_write_bps": "B/s",
    "hbm_bw_bps": "B/s",
    "llc_read_bps": "B/s",
    "llc_write_bps": "B/s",
    "ddr_bw_bps": "B/s",
    "pcie_tx_bps": "B/s",
    "pcie_rx_bps": "B/s",
    "nvlink_tx_bps": "B/s",
    "nvlink_rx_bps": "B/s",
    "hccs_tx_bps": "B/s",
    "hccs_rx_bps": "B/s",
    "nic_tx_bps": "B/s",
    "nic_rx_bps": "B/s",
    "roce_tx_bps": "B/s",
    "roce_rx_bps": "B/s",
    "xgmi_bw_bps": "B/s",
    "throttle_reasons": "bitmask",
    "ecc_errors": "count",
}

SOURCES = ("kineto-counter", "ascend-text", "ascend-db", "dcgm", "nvidia-smi", "rocm-smi", "amd-smi", "prometheus",
           "npu-smi", "csv")

Alias = tuple[str, float]

# DCGM fields by id, with the short column name ``dcgmi dmon`` prints and the DCGM exporter's
# ``DCGM_FI_*`` name (DCGM field reference:
# https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html). The
# profiling fields (1001-1012) are ratios 0..1 (activity) or bytes per second (PCIe / NVLink).
DCGM_FIELDS: tuple[tuple[int, str, str, str, float], ...] = (
    # id, dmon column, DCGM_FI_ name, canonical, factor
    (100, "SMCLK", "DCGM_FI_DEV_SM_CLOCK", "clock_sm_mhz", 1.0),
    (101, "MMCLK", "DCGM_FI_DEV_MEM_CLOCK", "clock_mem_mhz", 1.0),
    (112, "DVCCTR", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttle_reasons", 1.0),
    (140, "MMTMP", "DCGM_FI_DEV_MEMORY_TEMP", "temp_mem_c", 1.0),
    (150, "TMPTR", "DCGM_FI_DEV_GPU_TEMP", "temp_gpu_c", 1.0),
    (155, "POWER", "DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0),
    (160, "PMLMT", "DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", 1.0),
    (203, "GPUTL", "DCGM_FI_DEV_GPU_UTIL", "util_gpu_pct", 1.0),
    (250, "FBTTL", "DCGM_FI_DEV_FB_TOTAL", "mem_total_bytes", MIB),
    (252, "FBUSD", "DCGM_FI_DEV_FB_USED", "mem_used_bytes", MIB),
    (311, "DBETL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_errors", 1.0),
    (1002, "SMACT", "DCGM_FI_PROF_SM_ACTIVE", "sm_active_pct", 100.0),
    (1003, "SMOCC", "DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy_pct", 100.0),
    (1004, "TENSO", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active_pct", 100.0),
    (1005, "DRAMA", "DCGM_FI_PROF_DRAM_ACTIVE", "dram_active_pct", 100.0),
    (1009, "PCITX", "DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bps", 1.0),
    (1010, "PCIRX", "DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bps", 1.0),
    (1011, "NVLTX", "DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bps", 1.0),
    (1012, "NVLRX", "DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bps", 1.0),
)
# newer DCGM renames the throttle field "clocks event reasons"
_DCGM_EXTRA: dict[str, Alias] = {
    "dcgm_fi_dev_clocks_event_reasons": ("throttle_reasons", 1.0),
}

#: ``dcgmi dmon`` column (lower case) -> canonical
DMON: dict[str, Alias] = {short.lower(): (canon, f) for _i, short, _n, canon, f in DCGM_FIELDS}
#: DCGM exporter / Prometheus metric name (lower case) -> canonical. Moneo's own DCGM exporter
#: publishes ``dcgm_<field tag>`` gauges (github.com/Azure/Moneo, src/worker/exporters/nvidia_exporter.py).
DCGM_NAMES: dict[str, Alias] = {
    **{name.lower(): (canon, f) for _i, _s, name, canon, f in DCGM_FIELDS},
    **_DCGM_EXTRA,
    "dcgm_sm_clock": ("clock_sm_mhz", 1.0),
    "dcgm_memory_clock": ("clock_mem_mhz", 1.0),
    "dcgm_gpu_temp": ("temp_gpu_c", 1.0),
    "dcgm_memory_temp": ("temp_mem_c", 1.0),
    "dcgm_power_usage": ("power_w", 1.0),
    "dcgm_gpu_utilization": ("util_gpu_pct", 1.0),
    "dcgm_sm_active": ("sm_active_pct", 100.0),
    "dcgm_sm_occupancy": ("sm_occupancy_pct", 100.0),
    "dcgm_tensor_active": ("tensor_active_pct", 100.0),
    "dcgm_dram_active": ("dram_active_pct", 100.0),
    "dcgm_pcie_tx_bytes": ("pcie_tx_bps", 1.0),
    "dcgm_pcie_rx_bytes": ("pcie_rx_bps", 1.0),
    "dcgm_nvlink_tx_bytes": ("nvlink_tx_bps", 1.0),
    "dcgm_nvlink_rx_bytes": ("nvlink_rx_bps", 1.0),
    "dcgm_clock_throttle_reasons": ("throttle_reasons", 1.0),
    "dcgm_ecc_dbe_volatile_total": ("ecc_errors", 1.0),
}

#: ``nvidia-smi --query-gpu`` field (lower case, without the ``[unit]`` of the CSV header) ->
#: canonical; the unit comes from the header or the value (``--format=csv`` writes both;
#: ``nounits`` drops them) and is converted by :func:`unit_factor`.
NVIDIA_SMI: dict[str, str] = {
    "utilization.gpu": "util_gpu_pct",
    "clocks.sm": "clock_sm_mhz",
    "clocks.current.sm": "clock_sm_mhz",
    "clocks.mem": "clock_mem_mhz",
    "clocks.current.memory": "clock_mem_mhz",
    "power.draw": "power_w",
    "power.draw.instant": "power_w",
    "power.limit": "power_limit_w",
    "enforced.power.limit": "power_limit_w",
    "temperature.gpu": "temp_gpu_c",
    "temperature.memory": "temp_mem_c",
    "memory.used": "mem_used_bytes",
    "memory.total": "mem_total_bytes",
    "clocks_throttle_reasons.active": "throttle_reasons",
    "clocks_event_reasons.active": "throttle_reasons",
    "ecc.errors.uncorrected.volatile.total": "ecc_errors",
}

#: ``rocm-smi --csv`` column (lower case) -> canonical; units from the ``(unit)`` in the header
#: or the value (``(1900Mhz)``)
ROCM_SMI: dict[str, str] = {
    "gpu use (%)": "util_gpu_pct",
    "temperature (sensor edge) (c)": "temp_gpu_c",
    "temperature (sensor memory) (c)": "temp_mem_c",
    "average graphics package power (w)": "power_w",
    "current socket graphics package power (w)": "power_w",
    "max graphics package power (w)": "power_limit_w",
    "sclk clock speed:": "clock_sm_mhz",
    "mclk clock speed:": "clock_mem_mhz",
    "vram total memory (b)": "mem_total_bytes",
    "vram total used memory (b)": "mem_used_bytes",
}

#: ``amd-smi metric --csv`` / ``amd-smi monitor --csv`` column (lower case) -> (canonical,
#: factor): amd-smi reports power in W, clocks in MHz, temperatures in C, memory in MB (MiB)
#: and activity in %
AMD_SMI: dict[str, Alias] = {
    "gfx_usage": ("util_gpu_pct", 1.0),
    "usage_gfx_activity": ("util_gpu_pct", 1.0),
    "usage_gfx_usage": ("util_gpu_pct", 1.0),
    "gfx": ("util_gpu_pct", 1.0),
    "average_socket_power": ("power_w", 1.0),
    "power_socket_power": ("power_w", 1.0),
    "power_usage": ("power_w", 1.0),
    "socket_power": ("power_w", 1.0),
    "power_power_limit": ("power_limit_w", 1.0),
    "temperature_edge": ("temp_gpu_c", 1.0),
    "edge_temperature": ("temp_gpu_c", 1.0),
    "temperature_mem": ("temp_mem_c", 1.0),
    "memory_temperature": ("temp_mem_c", 1.0),
    "gfx_clk": ("clock_sm_mhz", 1.0),
    "clock_gfx_0_clk": ("clock_sm_mhz", 1.0),
    "mem_clock": ("clock_mem_mhz", 1.0),
    "clock_mem_0_clk": ("clock_mem_mhz", 1.0),
    "mem_usage_used_vram": ("mem_used_bytes", MIB),
    "vram_used": ("mem_used_bytes", MIB),
    "mem_usage_total_vram": ("mem_total_bytes", MIB),
    "vram_total": ("mem_total_bytes", MIB),
    "xgmi_bw": ("xgmi_bw_bps", 1.0),
}

#: ``npu-smi info watch`` column (lower case, unit in parentheses) -> canonical
NPU_SMI: dict[str, Alias] = {
    "pwr(w)": ("power_w", 1.0),
    "temp(c)": ("temp_gpu_c", 1.0),
    "ai core(%)": ("aicore_util_pct", 1.0),
    "aicore(%)": ("aicore_util_pct", 1.0),
    "ai vector(%)": ("aivector_util_pct", 1.0),
    "ai cube(%)": ("cube_util_pct", 1.0),
}

# unit text (lower case, as CSV headers and values write it) -> factor to the canonical unit
_UNIT_FACTORS: dict[str, float] = {
    "%": 1.0, "w": 1.0, "mhz": 1.0, "c": 1.0, "°c": 1.0,
    "b": 1.0, "bytes": 1.0, "kib": KIB, "kb": KIB, "mib": MIB, "mb": MIB, "gib": float(1 << 30), "gb": float(1 << 30),
    "b/s": 1.0, "kb/s": KIB, "mb/s": MIB, "gb/s": float(1 << 30),
}


def unit_factor(unit: str | None) -> float | None:
    """The factor that turns a value in ``unit`` into the canonical unit, None when unknown."""
    if unit is None:
        return 1.0
    return _UNIT_FACTORS.get(unit.strip().lower())


def src_name(name: str) -> str:
    """The ``src:`` name of a series with no canonical name: its source name, lower-cased."""
    return "src:" + " ".join(name.strip().lower().split())


def unit_of(metric: str) -> str | None:
    """The unit of a canonical metric (None for a ``src:`` series)."""
    return CANONICAL.get(metric)
