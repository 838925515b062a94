"""Canonical-row fixtures for the computation rules (CMP*).

Two kinds:

* ``ascend_pt_kernels*``: the real ``kernel_details.csv`` of sample_profiles/ascend_pt_kernels,
  mapped row by row to canonical ``kernels`` rows (and one device event per row, plus the
  ``ProfilerStep#1`` host range its ``Step Id`` column names), as the Ascend reader will once it
  lands. The CSV does not name the chip: ``Ascend910B2`` is inferred from the CSV itself - cube
  operators run with Block Dim 24 and vector operators with 48 (24 cube / 48 vector cores), and
  ``aic_total_cycles / aicore_time(us) / 24`` = 1.85 GHz (MatMul91: 64 689 637 / 1456.97 / 24).
* small synthetic profiles whose planted magnitudes are stated next to each function; every
  asserted number in tests/rules/cases/CMP*.toml is computed by hand from them.
"""

from __future__ import annotations

import csv
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.conftest import SAMPLES

KERNELS_CSV = SAMPLES / "ascend_pt_kernels" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"

BASE_COLUMNS = {
    "Step Id", "Device_id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "Accelerator Core",
    "Start Time(us)", "Duration(us)", "Wait Time(us)", "Block Dim", "Block Num", "Mix Block Dim", "Mix Block Num",
    "HF32 Eligible", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
    "Output Formats", "Context ID",
}


def _ns(us: str) -> int:
    return int(Decimal(us.strip()) * 1000)


def _na(v: str | None) -> str | None:
    v = (v or "").strip()
    return None if v in ("", "N/A") else v


def _int(v: str | None) -> int | None:
    v = _na(v)
    try:
        return None if v is None else int(float(v))
    except ValueError:
        return None


def _csv_rows(path: Path = KERNELS_CSV) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _kernel_row(r: dict[str, str], rank: int) -> dict[str, Any]:
    pmu = {}
    for k, v in r.items():
        if k in BASE_COLUMNS or _na(v) is None:
            continue
        try:
            pmu[k] = float(v)
        except ValueError:
            pmu[k] = v
    return {
        "rank": rank,
        "name": r["Name"],
        "op_type": r["Type"],
        "core_type": r["Accelerator Core"],
        "start_ns": _ns(r["Start Time(us)"]),
        "dur_ns": _ns(r["Duration(us)"]),
        "wait_ns": _ns(r["Wait Time(us)"]) if _na(r.get("Wait Time(us)")) else None,
        "block_dim": _int(r.get("Block Dim")),
        "mix_block_dim": _int(r.get("Mix Block Dim")),
        "input_shapes": _na(r.get("Input Shapes")),
        "input_dtypes": _na(r.get("Input Data Types")),
        "input_formats": _na(r.get("Input Formats")),
        "output_shapes": _na(r.get("Output Shapes")),
        "output_dtypes": _na(r.get("Output Data Types")),
        "output_formats": _na(r.get("Output Formats")),
        "pmu": json.dumps(pmu) if pmu else None,
    }


def _ascend_tables(rows: list[dict[str, str]], device_name: str | None, rank: int = 0) -> dict[str, list[dict[str, Any]]]:
    kernels = [_kernel_row(r, rank) for r in rows]
    events = [
        {
            "rank": rank,
            "kind": "comm" if k["core_type"] == "HCCL" else "kernel",
            "name": k["name"],
            "cat": k["core_type"],
            "pid": "npu",
            "tid": "stream",
            "device": True,
            "start_ns": k["start_ns"],
            "dur_ns": k["dur_ns"],
        }
        for k in kernels
    ]
    start = min(k["start_ns"] for k in kernels)
    end = max(k["start_ns"] + k["dur_ns"] for k in kernels)
    # the CSV's Step Id column: every row is in step 1 (the torch_npu device-extended step range)
    events.append({"rank": rank, "kind": "step", "name": "ProfilerStep#1", "cat": "cpu_op", "pid": "host",
                   "tid": "main", "device": False, "start_ns": start, "dur_ns": end - start})
    return {
        "events": events,
        "kernels": kernels,
        "ranks": [{"rank": rank, "source": "ascend_pt", "device_name": device_name, "has_device": True,
                   "rank_source": "test", "files": str(KERNELS_CSV)}],
    }


def ascend_pt_kernels() -> dict[str, list[dict[str, Any]]]:
    """The real sample as canonical rows, on an Ascend910B2 (inferred, see module doc)."""
    return _ascend_tables(_csv_rows(), "Ascend910B2")


def ascend_pt_kernels_unknown_device() -> dict[str, list[dict[str, Any]]]:
    """The real sample with a device name the table does not know (the rules must not guess)."""
    return _ascend_tables(_csv_rows(), "SomeNPU-X")


# --------------------------------------------------------------------------- Kineto GPU, synthetic
MS = 1_000_000  # ns


def _kineto_step_ops(step: int, t0: int, ops: list[tuple[str, float, str, str, int]], corr0: int,
                     rank: int = 0) -> list[dict[str, Any]]:
    """Host op + cudaLaunchKernel + kernel per entry (name, flops, shapes, dtypes, kernel_ns), back to back.

    The step marker spans all the ops; each op's kernel runs right after its launch.
    """
    ev: list[dict[str, Any]] = []
    t = t0
    for i, (name, flops, shapes, dtypes, kdur) in enumerate(ops):
        corr = corr0 + i
        ev.append({"rank": rank, "kind": "host_op", "name": name, "cat": "cpu_op", "pid": "1", "tid": "1",
                   "start_ns": t, "dur_ns": 20_000, "flops": flops or None, "shapes": shapes, "dtypes": dtypes})
        ev.append({"rank": rank, "kind": "runtime", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "pid": "1",
                   "tid": "1", "start_ns": t + 5_000, "dur_ns": 5_000, "corr": corr})
        ev.append({"rank": rank, "kind": "kernel", "name": f"kernel_{name}", "cat": "kernel", "pid": "0",
                   "tid": "7", "device": True, "stream": 7, "start_ns": t + 15_000, "dur_ns": kdur, "corr": corr})
        t += 15_000 + kdur + 10_000
    ev.insert(0, {"rank": rank, "kind": "step", "name": f"ProfilerStep#{step}", "cat": "cpu_op", "pid": "1",
                  "tid": "1", "start_ns": t0, "dur_ns": t - t0})
    return ev


# Planted (per step, 2 steps, NVIDIA A100-SXM4-80GB: 312 TFLOP/s fp16, 2039 GB/s, ridge 153 FLOP/B):
#   aten::mm  8192^3 fp16, 2*8192^3 = 1.0995e12 FLOP in 4.0 ms  -> 274.9 TFLOP/s = 88.1 % of peak: compute-bound
#   aten::add 2^26 float + 2^26 float = 536.9 MB inputs in 0.3 ms -> 1789.6 GB/s = 87.8 % of peak: memory-bound
#   aten::addmm 8192^3 fp16 (+ bias), 1.0995e12 FLOP in 20.0 ms -> 55.0 TFLOP/s = 17.6 % of peak: underutilised;
#             time at the 0.8 threshold = 1.0995e12 / (0.8 * 312e12) = 4.405 ms -> saving 15.595 ms per step
MM = ("aten::mm", 2 * 8192**3, "[[8192, 8192], [8192, 8192]]", '["c10::Half", "c10::Half"]')
ADD = ("aten::add", float(2**26), "[[67108864], [67108864], []]", '["float", "float", "Scalar"]')
ADDMM = ("aten::addmm", 2 * 8192**3, "[[8192], [8192, 8192], [8192, 8192]]", '["c10::Half", "c10::Half", "c10::Half"]')


def _kineto_gpu(device_name: str | None, ops: list[tuple[str, float, str, str, int]]) -> dict[str, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    t0 = 100 * MS
    for s in (1, 2):  # back to back: each step is exactly its ops (sum of 15 us + kernel + 10 us)
        step_events = _kineto_step_ops(s, t0, ops, corr0=s * 100)
        t0 += step_events[0]["dur_ns"]
        events += step_events
    return {
        "events": events,
        "ranks": [{"rank": 0, "source": "kineto", "device_name": device_name, "has_device": True,
                   "rank_source": "test", "files": ""}],
    }


def kineto_gpu_roofline() -> dict[str, list[dict[str, Any]]]:
    """Compute-, memory-bound and underutilised operators on an A100 (numbers above)."""
    return _kineto_gpu("NVIDIA A100-SXM4-80GB",
                       [(*MM, 4 * MS), (*ADD, 300_000), (*ADDMM, 20 * MS)])


def kineto_gpu_roofline_bound_only() -> dict[str, list[dict[str, Any]]]:
    """Only operators near their roof: nothing worth more than a low-severity note."""
    return _kineto_gpu("NVIDIA A100-SXM4-80GB", [(*MM, 4 * MS), (*ADD, 300_000)])


def kineto_gpu_roofline_unknown_device() -> dict[str, list[dict[str, Any]]]:
    """The underutilised profile on a device the table does not know."""
    return _kineto_gpu("Mystery Accelerator 9000", [(*MM, 4 * MS), (*ADD, 300_000), (*ADDMM, 20 * MS)])


def kineto_gpu_casts_with_geometry() -> dict[str, list[dict[str, Any]]]:
    """The casts profile with each kernel's launch grid on its event (``events.block_dim``, as the
    Kineto reader writes it), plus GPU rows in ``kernels`` (a tool of our own or an older advisor
    may have written them): still the Kineto path, not Ascend's."""
    tables = kineto_gpu_casts()
    for e in tables["events"]:
        if e.get("device") and e.get("kind") == "kernel":
            e["block_dim"] = 1024
    tables["kernels"] = [
        {"rank": e["rank"], "step": e.get("step"), "name": e["name"], "core_type": "GPU", "start_ns": e["start_ns"],
         "dur_ns": e["dur_ns"], "block_dim": 1024, "pmu": '{"grid": [32, 32, 1], "block": [256, 1, 1]}'}
        for e in tables["events"] if e.get("device") and e.get("kind") == "kernel"
    ]
    assert tables["kernels"]
    return tables


def ascend_pt_kernels_no_aicpu() -> dict[str, list[dict[str, Any]]]:
    """The real sample without its 7 AI_CPU rows (the AI CPU control)."""
    return _ascend_tables([r for r in _csv_rows() if r["Accelerator Core"] != "AI_CPU"], "Ascend910B2")


# --------------------------------------------------------------------------- synthetic device kernels
def _device_steps(rank: int, device_name: str, kernels_per_step: list[dict[str, Any]], steps: int = 2,
                  source: str = "ascend_pt") -> dict[str, list[dict[str, Any]]]:
    """Back-to-back steps; each step = its kernels in sequence, 10 us apart, both as events and kernels rows."""
    events: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    t = 1_000 * MS
    for s in range(1, steps + 1):
        t0 = t
        for k in kernels_per_step:
            row = {"rank": rank, "start_ns": t, **k}
            kernels.append(row)
            events.append({"rank": rank, "kind": "kernel", "name": k["name"], "cat": k.get("core_type", ""),
                           "pid": "npu", "tid": "stream", "device": True, "start_ns": t, "dur_ns": k["dur_ns"]})
            t += k["dur_ns"] + 10_000
        events.append({"rank": rank, "kind": "step", "name": f"ProfilerStep#{s}", "cat": "cpu_op", "pid": "host",
                       "tid": "main", "device": False, "start_ns": t0, "dur_ns": t - t0})
    return {"events": events, "kernels": kernels,
            "ranks": [{"rank": rank, "source": source, "device_name": device_name, "has_device": True,
                       "rank_source": "test", "files": ""}]}


def _merge(*parts: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        for k, v in p.items():
            out.setdefault(k, []).extend(v)
    return out


# Planted (Ascend910B2, 24 AI Cores / 48 vector cores), per step:
#   MatMulX  AI_CORE        block dim 24, 2000 us  (full chip)
#   AddX     AI_VECTOR_CORE block dim 8,   500 us  -> idle share 1 - 8/48 = 5/6 -> 416.67 us
#   MulX     AI_VECTOR_CORE block dim 48,  300 us  (full)
#   SmallX   AI_VECTOR_CORE block dim 2,    15 us  (below the 20 us floor: ignored)
# step = 2000 + 500 + 300 + 15 + 4 x 10 = 2855 us -> saving share 416.67 / 2855 = 14.6 % (high)
_BLOCK_DIM_KERNELS = [
    {"name": "MatMulX", "op_type": "MatMul", "core_type": "AI_CORE", "dur_ns": 2_000_000, "block_dim": 24},
    {"name": "AddX", "op_type": "Add", "core_type": "AI_VECTOR_CORE", "dur_ns": 500_000, "block_dim": 8},
    {"name": "MulX", "op_type": "Mul", "core_type": "AI_VECTOR_CORE", "dur_ns": 300_000, "block_dim": 48},
    {"name": "SmallX", "op_type": "Sub", "core_type": "AI_VECTOR_CORE", "dur_ns": 15_000, "block_dim": 2},
]


def ascend_low_block_dim() -> dict[str, list[dict[str, Any]]]:
    """A vector kernel on 8 of 48 vector cores (numbers above)."""
    return _device_steps(0, "Ascend910B2", _BLOCK_DIM_KERNELS)


def ascend_low_block_dim_unknown_device() -> dict[str, list[dict[str, Any]]]:
    """Same kernels on a device the table does not know: warn, no finding."""
    return _device_steps(0, "SomeNPU-X", _BLOCK_DIM_KERNELS)


# GPU analogue (NVIDIA A100-SXM4-80GB, 108 SMs), per step: a 1000 us kernel with a 40-block grid
# (idle share 1 - 40/108 = 0.6296 -> 629.6 us) and a 500 us kernel with 216 blocks (2 per SM).
def gpu_small_grid() -> dict[str, list[dict[str, Any]]]:
    """Kineto kernels with their launch grid on the event (``events.block_dim`` = grid blocks, as
    the Kineto reader writes it); no ``kernels`` rows."""
    ks = [
        {"name": "void small_grid_kernel<float>(float*)", "dur_ns": 1_000_000, "block_dim": 40},
        {"name": "void big_grid_kernel<float>(float*)", "dur_ns": 500_000, "block_dim": 216},
    ]
    tables = _device_steps(0, "NVIDIA A100-SXM4-80GB", ks, source="kineto")
    for e in tables["events"]:
        if e["kind"] == "kernel":
            e["block_dim"] = next(k["block_dim"] for k in ks if k["name"] == e["name"])
    tables["kernels"] = []
    return tables


def gpu_small_grid_blocks_per_sm() -> dict[str, list[dict[str, Any]]]:
    """``kernels`` rows that give the grid only as ``blocks per SM`` in ``pmu`` (block_dim NULL)."""
    ks = [
        {"name": "void small_grid_kernel<float>(float*)", "core_type": "CUDA", "dur_ns": 1_000_000,
         "pmu": json.dumps({"grid": [40, 1, 1], "block": [256, 1, 1], "blocks per SM": 40 / 108})},
        {"name": "void big_grid_kernel<float>(float*)", "core_type": "CUDA", "dur_ns": 500_000,
         "pmu": json.dumps({"grid": [216, 1, 1], "block": [256, 1, 1], "blocks per SM": 2.0})},
    ]
    return _device_steps(0, "NVIDIA A100-SXM4-80GB", ks, source="kineto")


# Frequency (Ascend910B2, nominal 1850 MHz): rank 0 samples 1850 MHz, rank 1 samples 1500 MHz
# (drop 1 - 1500/1850 = 18.92 %); each step has 10 ms of kernels -> saving 1.892 ms per step.
def _freq(rank1_mhz: float) -> dict[str, list[dict[str, Any]]]:
    ks = [{"name": "MatMulX", "op_type": "MatMul", "core_type": "AI_CORE", "dur_ns": 10 * MS, "block_dim": 24}]
    tables = _merge(_device_steps(0, "Ascend910B2", ks), _device_steps(1, "Ascend910B2", ks))
    tables["hw_metrics"] = [
        {"rank": r, "metric": "aicore_freq_mhz", "ts_ns": 1_000 * MS + i * MS, "value": mhz}
        for r, mhz in ((0, 1850.0), (1, rank1_mhz)) for i in range(20)
    ]
    return tables


def ascend_frequency_drop() -> dict[str, list[dict[str, Any]]]:
    """Rank 1 at 1500 MHz of a nominal 1850."""
    return _freq(1500.0)


def ascend_frequency_small_dip() -> dict[str, list[dict[str, Any]]]:
    """Rank 1 at 1800 MHz: 2.7 % below nominal, within the 5 % tolerance."""
    return _freq(1800.0)


# Kineto GPU casts: per step aten::mm (4 ms kernel) and aten::_to_copy float -> half (1 ms kernel):
# conversion share of kernel time = 1 / (4 + 1) = 0.20, 1000 us per step.
def kineto_gpu_casts() -> dict[str, list[dict[str, Any]]]:
    """A dtype cast taking a fifth of the device kernel time."""
    cast = ("aten::_to_copy", 0.0, "[[8192, 8192], [], [], [], [], [], []]", '["float", "", "", "", "", "", ""]')
    return _kineto_gpu("NVIDIA A100-SXM4-80GB", [(*MM, 4 * MS), (*cast, 1 * MS)])
