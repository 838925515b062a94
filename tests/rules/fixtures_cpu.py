"""Canonical-row fixtures for the CPU rules (CPU001-CPU006): facts planted by construction.

Every builder returns ``{table: [rows]}`` for :func:`advisor.testing.context_from_tables`.
Times are integer ns; each step is a ``ProfilerStep#N`` host marker of ``STEP_NS`` and the
markers tile the timeline, so every step window is exactly ``STEP_NS`` long. The planted
magnitudes are written next to each builder and asserted in ``tests/rules/cases/CPU*.toml``.
"""

from __future__ import annotations

from typing import Any

US = 1_000
MS = 1_000_000
BASE = 1_700_000_000_000_000_000
STEP_NS = 10 * MS
HOST = {"pid": "100", "tid": "100", "device": False}
DEV = {"pid": "0", "tid": "7", "device": True, "stream": 7}

Rows = dict[str, list[dict[str, Any]]]


def _steps(n: int, first: int = 1) -> list[dict[str, Any]]:
    return [{"rank": 0, "kind": "step", "name": f"ProfilerStep#{first + i}", "start_ns": BASE + i * STEP_NS, "dur_ns": STEP_NS,
             "cat": "user_annotation", **HOST} for i in range(n)]


def _ev(kind: str, name: str, start_ns: int, dur_ns: int, where: dict[str, Any] = HOST, **extra: Any) -> dict[str, Any]:
    return {"rank": 0, "kind": kind, "name": name, "start_ns": start_ns, "dur_ns": dur_ns, **where, **extra}


def device_dispatch_bound() -> Rows:
    """3 steps of 10 ms; per step 400 kernels of 5 µs, 15 µs apart (gap), each launched by a 12 µs runtime call.

    Per step: short idle gaps = 399 x 15 µs = 5985 µs (59.85 % of the step); kernel time 2000 µs,
    launch time 4800 µs (2.4x); every kernel is < 10 µs.
    """
    ev = _steps(3)
    corr = 0
    for s in range(3):
        t0 = BASE + s * STEP_NS + 100 * US
        for k in range(400):
            corr += 1
            start = t0 + k * 20 * US
            ev.append(_ev("runtime", "cudaLaunchKernel", start - 14 * US, 12 * US, corr=corr))
            ev.append(_ev("kernel", "tiny_elementwise_kernel", start, 5 * US, DEV, corr=corr))
    return {"events": ev}


def device_dispatch_healthy() -> Rows:
    """3 steps of 10 ms; per step 20 kernels of 400 µs with 2 µs gaps (38 µs of short gaps, 0.38 %)."""
    ev = _steps(3)
    corr = 0
    for s in range(3):
        t0 = BASE + s * STEP_NS + 100 * US
        for k in range(20):
            corr += 1
            start = t0 + k * 402 * US
            ev.append(_ev("runtime", "cudaLaunchKernel", start - 20 * US, 8 * US, corr=corr))
            ev.append(_ev("kernel", "big_gemm_kernel", start, 400 * US, DEV, corr=corr))
    return {"events": ev}


def device_host_sync() -> Rows:
    """3 steps of 10 ms. Per step: kernel 0.1-4.05 ms, ``Memcpy DtoH`` 4.05-4.10 ms, then the device idles until the
    next kernel at 6.2 ms (2.1 ms idle), kernel 6.2-9.9 ms.

    Host: ``aten::item`` 0.2-4.2 ms (with a recorded call stack) encloses ``aten::_local_scalar_dense`` and
    ``cudaStreamSynchronize`` (kind sync): one outermost sync point per step. Device idle after the sync
    points: 2.1 ms per step = 21 % of the step.
    """
    ev = _steps(3)
    for s in range(3):
        t = BASE + s * STEP_NS
        ev += [
            _ev("kernel", "fwd_kernel", t + 100 * US, 3950 * US, DEV),
            _ev("memcpy", "Memcpy DtoH (Device -> Pageable)", t + 4050 * US, 50 * US, DEV, bytes=4),
            _ev("kernel", "bwd_kernel", t + 6200 * US, 3700 * US, DEV),
            _ev("host_op", "aten::item", t + 200 * US, 4000 * US, stack="train.py(42): train_step\nutils.py(7): log_loss"),
            _ev("host_op", "aten::_local_scalar_dense", t + 210 * US, 3980 * US),
            _ev("sync", "cudaStreamSynchronize", t + 300 * US, 3850 * US),
        ]
    return {"events": ev}


def device_python_gc() -> Rows:
    """3 steps of 10 ms. Per step: kernel 0.1-5 ms, ``Python GC`` 1-2 ms (device busy) and 5-8 ms (device idle), kernel 8-9.9 ms.

    GC per step 4 ms (40 %), of which 3 ms with the device idle.
    """
    ev = _steps(3)
    for s in range(3):
        t = BASE + s * STEP_NS
        ev += [
            _ev("kernel", "k1", t + 100 * US, 4900 * US, DEV),
            _ev("kernel", "k2", t + 8 * MS, 1900 * US, DEV),
            _ev("python", "Python GC", t + 1 * MS, 1 * MS, cat="python_function"),
            _ev("python", "Python GC", t + 5 * MS, 3 * MS, cat="python_function"),
        ]
    return {"events": ev}


def ascend_compile() -> Rows:
    """4 steps of 10 ms on a device. Every step: ``AscendCL@aclopCompileAndExecute`` 1.0 ms enclosing
    ``AscendCL@opCompile`` 0.6 ms (same thread), then ``AscendCL@aclnnAdd`` launches. Step 1 also holds a
    5 ms warm-up compile.

    Steady steps 2-4: 1 outermost compile event and 1.0 ms of compile per step (10 % of the step).
    """
    ev = _steps(4)
    for s in range(4):
        t = BASE + s * STEP_NS
        ev += [
            _ev("runtime", "AscendCL@aclopCompileAndExecute", t + 100 * US, 1 * MS),
            _ev("runtime", "AscendCL@opCompile", t + 200 * US, 600 * US),
            _ev("runtime", "AscendCL@aclnnAdd", t + 1200 * US, 20 * US),
            _ev("kernel", "Add_AiCore", t + 1300 * US, 8 * MS, DEV),
        ]
    ev.append(_ev("runtime", "AscendCL@aclopCompileAndExecute", BASE + 2 * MS, 5 * MS, tid="101"))
    return {"events": ev}


def ascend_compile_warmup_only() -> Rows:
    """4 steps; a 5 ms compile only in the first step (warm-up), none later."""
    ev = _steps(4)
    for s in range(4):
        ev.append(_ev("kernel", "Add_AiCore", BASE + s * STEP_NS + 100 * US, 8 * MS, DEV))
    ev.append(_ev("runtime", "AscendCL@aclopCompileAndExecute", BASE + 2 * MS, 5 * MS))
    return {"events": ev}


def _meta_rows(env: dict[str, str], versions: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    rows = [{"rank": r, "key": f"env.{k}", "value": v} for r in versions for k, v in env.items()]
    rows += [{"rank": r, "key": k, "value": v} for r, kv in versions.items() for k, v in kv.items()]
    return rows


def env_misconfigured() -> Rows:
    """2 ranks: ASCEND_GLOBAL_LOG_LEVEL=1 (info), TASK_QUEUE_ENABLE=0, ASCEND_LAUNCH_BLOCKING=1 on both;
    cann_version 8.0.RC2 on rank 0 but 8.0.RC1 on rank 1; torch_npu_version equal."""
    ev = _steps(2) + [{**e, "rank": 1} for e in _steps(2)]
    meta = _meta_rows({"ASCEND_GLOBAL_LOG_LEVEL": "1", "TASK_QUEUE_ENABLE": "0", "ASCEND_LAUNCH_BLOCKING": "1",
                       "HCCL_RDMA_TC": "132"},
                      {0: {"cann_version": "8.0.RC2", "torch_npu_version": "2.1.0.post6"},
                       1: {"cann_version": "8.0.RC1", "torch_npu_version": "2.1.0.post6"}})
    return {"events": ev, "meta": meta}


def env_recommended() -> Rows:
    """2 ranks with the recommended values (log level 3, task queue 2, no blocking) and equal versions."""
    ev = _steps(2) + [{**e, "rank": 1} for e in _steps(2)]
    meta = _meta_rows({"ASCEND_GLOBAL_LOG_LEVEL": "3", "TASK_QUEUE_ENABLE": "2", "ASCEND_LAUNCH_BLOCKING": "0"},
                      {0: {"cann_version": "8.0.RC2"}, 1: {"cann_version": "8.0.RC2"}})
    return {"events": ev, "meta": meta}


def gen_ascend_baseline(out: Any) -> Any:
    """An Ascend cluster export from tests/ascend/gen_cluster.py (``baseline8``): recommended env values
    (ASCEND_GLOBAL_LOG_LEVEL=3, no launch blocking) and the same CANN / torch_npu versions on all 8 ranks."""
    from tests.ascend.gen_cluster import generate

    generate("baseline8", out)
    return out


def ascend_sync_across_threads() -> Rows:
    """3 steps of 10 ms on a device, as torch_npu exports a blocking ``.item()``: the framework's
    ``aten::item`` 0.2-4.2 ms on the Python thread (tid 100), the runtime's
    ``AscendCL@aclrtSynchronizeStream`` 0.3-4.15 ms and inside it ``AscendCL@aclrtMemcpy`` 4.0-4.1 ms on the
    runtime's thread (tid 200). Device: kernel 0.1-4.05 ms, idle until 6.2 ms, kernel 6.2-9.9 ms.

    One blocking sync per step (the three events overlap in time), lasting the union of their spans,
    0.2-4.2 ms = 4.0 ms; the device idles 6.2 - 4.2 = 2.0 ms after it (20 % of the step).
    """
    cann = {"pid": "100", "tid": "200", "device": False}
    ev = _steps(3)
    for s in range(3):
        t = BASE + s * STEP_NS
        ev += [
            _ev("kernel", "fwd_kernel", t + 100 * US, 3950 * US, DEV),
            _ev("kernel", "bwd_kernel", t + 6200 * US, 3700 * US, DEV),
            _ev("host_op", "aten::item", t + 200 * US, 4000 * US),
            _ev("sync", "AscendCL@aclrtSynchronizeStream", t + 300 * US, 3850 * US, cann),
            _ev("sync", "AscendCL@aclrtMemcpy", t + 4000 * US, 100 * US, cann),
        ]
    return {"events": ev}
