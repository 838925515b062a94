"""Canonical-row fixtures for CPU007 (host-bound device) and CMP006's kernels built for few SMs:
facts planted by construction.

Each builder returns ``{table: [rows]}`` for :func:`advisor.testing.context_from_tables`; times are
integer ns, three ``ProfilerStep#N`` markers of 10 ms tile the timeline. The planted magnitudes are
written next to each builder and asserted in ``tests/rules/cases/CPU007.toml`` / ``CMP006.toml``.
"""

from __future__ import annotations

from tests.rules.fixtures_cpu import BASE, DEV, MS, STEP_NS, US, Rows, _ev, _steps


def launch_bound() -> Rows:
    """Per step: 100 host operators of 80 µs every 90 µs from 0.5 ms; inside each, a 10 µs
    ``cudaLaunchKernel`` at +60 µs whose 5 µs kernel runs at +72 µs.

    Per step: device busy 100 x 5 = 500 µs (5 %); idle 9500 µs, of which launch 100 x 10 = 1000 µs,
    framework 100 x (80 - 10 - 5) = 6500 µs, nothing recorded 500 + 99 x 10 + 510 = 2000 µs.
    Host work = 7500 µs = 75 % of the step; every kernel is under 10 µs.
    """
    ev = _steps(3)
    corr = 0
    for s in range(3):
        t0 = BASE + s * STEP_NS + MS // 2
        for k in range(100):
            corr += 1
            t = t0 + k * 90 * US
            ev.append(_ev("host_op", "aten::add", t, 80 * US))
            ev.append(_ev("runtime", "cudaLaunchKernel", t + 60 * US, 10 * US, corr=corr))
            ev.append(_ev("kernel", "tiny_add_kernel", t + 72 * US, 5 * US, DEV, corr=corr))
    return {"events": ev}


def sync_bound() -> Rows:
    """Per step: a 4 ms kernel at 0.1 ms, then ``aten::copy_`` 4.15-9.25 ms holding a blocking
    ``cudaMemcpy`` 4.2-9.2 ms while the device has nothing queued, then a 0.6 ms kernel at 9.3 ms;
    launches 0.05-0.09 ms and 9.26-9.29 ms.

    Per step: idle 100 + 5200 + 100 = 5400 µs; host work: sync 5000, framework 50 + 50, launch
    40 + 30 = 5170 µs (51.7 %), mostly the sync.
    """
    ev = _steps(3)
    corr = 0
    for s in range(3):
        b = BASE + s * STEP_NS
        corr += 2
        ev.append(_ev("runtime", "cudaLaunchKernel", b + 50 * US, 40 * US, corr=corr - 1))
        ev.append(_ev("kernel", "big_gemm_kernel", b + 100 * US, 4 * MS, DEV, corr=corr - 1))
        ev.append(_ev("host_op", "aten::copy_", b + 4150 * US, 5100 * US))
        ev.append(_ev("sync", "cudaMemcpy", b + 4200 * US, 5 * MS))
        ev.append(_ev("runtime", "cudaLaunchKernel", b + 9260 * US, 30 * US, corr=corr))
        ev.append(_ev("kernel", "big_gemm_kernel", b + 9300 * US, 600 * US, DEV, corr=corr))
    return {"events": ev}


def gpu_small_grid_by_design() -> Rows:
    """Like ``fixtures_compute.gpu_small_grid`` (A100, 108 SMs), but the 40-block kernel is DeepEP's
    expert-parallel dispatch and a persistent matmul uses 108 blocks: kernels built to use few cores."""
    from tests.rules.fixtures_compute import gpu_small_grid

    tables = gpu_small_grid()
    for e in tables["events"]:
        if e.get("name") == "void small_grid_kernel<float>(float*)":
            e["name"] = "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)"
        elif e.get("name") == "void big_grid_kernel<float>(float*)":
            e["name"], e["block_dim"] = "matmul_kernel_persistent", 20
    return tables


def slow_rank_all_to_all() -> Rows:
    """``fixtures_comm.slow_rank_kineto_nccl`` with the all-reduce replaced by an all-to-all run as NCCL
    ``SendRecv`` kernels (comm_ops type ``alltoall``, as the Kineto reader types them under a host
    all-to-all): rank 0 lasts 12 ms, rank 1 arrives 9 ms later and lasts 3 ms; R_wait = 9 / 15 = 0.6."""
    from tests.rules.fixtures_comm import slow_rank_kineto_nccl

    rows = slow_rank_kineto_nccl()
    name = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    for op in rows["comm_ops"]:
        op["name"], op["op_type"] = name, "alltoall"
    for e in rows["events"]:
        if e["kind"] == "comm":
            e["name"] = name
    return rows
