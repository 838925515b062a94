"""The vocabulary of hardware series as the ``--metrics`` readers use it: canonical metric names,
their units and each source's names for them, defined in :mod:`advisor.hw_vocab` (the export
readers of :mod:`advisor.ingest` name their series with it too)."""

from __future__ import annotations

from advisor.hw_vocab import (
    AMD_SMI,
    CANONICAL,
    DCGM_FIELDS,
    DCGM_NAMES,
    DMON,
    KIB,
    MIB,
    NPU_SMI,
    NVIDIA_SMI,
    ROCM_SMI,
    SOURCES,
    Alias,
    src_name,
    unit_factor,
    unit_of,
)

__all__ = ["AMD_SMI", "CANONICAL", "DCGM_FIELDS", "DCGM_NAMES", "DMON", "KIB", "MIB", "NPU_SMI", "NVIDIA_SMI",
           "ROCM_SMI", "SOURCES", "Alias", "src_name", "unit_factor", "unit_of"]
