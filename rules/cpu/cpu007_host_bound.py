"""The device idles while the host is busy: the host, not the device, sets the step time.

## Why it matters
An accelerator only computes what the host has queued. When the host spends longer issuing work
than the device spends running it (Python and framework overhead per operator, eager decoding of
tiny kernels, one launch call per kernel) or stops to wait (a blocking copy, ``cudaFree`` /
``hipFree`` calls of a caching allocator that has to return memory, an explicit synchronize),
the device runs dry and idles, in gaps of any length. A device busy 14 % of the step is limited
by its host whatever the kernels do; tuning kernels then saves nothing.

## How it is detected
Per step of each rank with device events: the device busy time is the union of its kernels,
copies, memsets and communication; the idle time is the rest of the step window. During each
idle instant, what the threads that drive the device (those whose runtime calls launch its tasks)
are doing is read from their innermost event: a sync call (``*Synchronize``, blocking copies such
as ``cudaMemcpy`` / ROCm's ``hipMemcpyWithStream``), an allocator call (``cudaMalloc`` /
``cudaFree``, ``hip*``), another runtime call (kernel launches), framework operators or Python
(overhead), data loading (left to IO001), or nothing recorded. It fires when the device idles at
least ``min_idle_share`` of the step (median over steps) and the host work above, data loading
excluded, covers at least ``min_host_share`` of the step. The cause is the host-device sync when
sync calls explain most of that idle time, else operator dispatch. Saving: the median per-step
idle time the host work covers (at most the step); an upper bound, as the host work itself
remains and only the device's wait for it can go.

## What to do
Launch-bound (many kernels under ``short_kernel_us``, most idle in launches, framework or Python):
capture the step in a CUDA / HIP graph or use ``torch.compile`` (mode ``reduce-overhead``), fuse
operators, run larger batches so each kernel does more work. Sync-bound: remove the blocking copy
or read (``non_blocking=True`` into pinned memory, keep values on the device). Allocator-bound:
stop the allocator from returning memory (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
fewer distinct tensor sizes, no ``torch.cuda.empty_cache()`` in the loop).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.engine.derived import enclosing_intervals
from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from rules.cpu._common import fmt_ms, step_table


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU007."""

    min_idle_share: float = knob(0.25, "median share of the step the device idles that fires the rule",
                                 "first principles: a device idle a quarter of the step is not kept fed")
    min_host_share: float = knob(0.10, "median share of the step the device idles while the host works (data loading "
                                       "excluded) that fires the rule",
                                 "CAUSES.md: 10 % of the step is the 'high' severity cut")
    short_kernel_us: float = knob(10.0, "a device kernel shorter than this finishes faster than a typical launch",
                                  "CUDA / ROCm launch calls take about 5-10 µs of host time each")
    top_n: int = knob(5, "host calls listed that the device waited on longest", "presentation")


# what a driving thread is doing, by its innermost event; lower codes win where two threads differ
SYNC, ALLOC, DATA, LAUNCH, FRAMEWORK = 0, 1, 2, 3, 4
CLASS_NAMES = {SYNC: "sync", ALLOC: "allocator", DATA: "data_loading", LAUNCH: "launch", FRAMEWORK: "framework_python"}
HOST_WORK = (SYNC, ALLOC, LAUNCH, FRAMEWORK)  # the classes whose time the device waits on the host for
ALLOC_RE = r"^(cuda|hip)(Malloc|Free|MallocHost|FreeHost|HostAlloc|HostFree)$|^cuMem(Alloc|Free)(_v2)?$"

RANKS_SQL = """
WITH win AS (SELECT s.rank, s.step, s.start_ns, s.end_ns FROM steps s JOIN breakdown b USING (rank, step)
             WHERE s.end_ns > s.start_ns),
busy AS (
    SELECT w.rank, w.step, coalesce(sum(least(w.end_ns, d.e) - greatest(w.start_ns, d.s)), 0) AS busy_ns
    FROM win w LEFT JOIN device_busy d ON d.rank = w.rank AND d.s < w.end_ns AND d.e > w.start_ns
    GROUP BY ALL
)
SELECT w.rank, median((w.end_ns - w.start_ns - b.busy_ns) / (w.end_ns - w.start_ns)) AS idle_share
FROM win w JOIN busy b USING (rank, step) GROUP BY w.rank
"""

# the host events of the threads that drive the device (those launching device tasks, else those making runtime
# calls, else all); Python
# frames (with_stack traces hold tens of thousands, nested deep) only as their union per thread, named "Python"
HOST_SQL = """
WITH calls AS (SELECT tid, corr FROM events WHERE rank = $rank AND NOT device AND kind IN ('runtime', 'sync')),
launchers AS (  -- threads whose runtime calls launched device tasks (a thread that only queries the device is not one)
    SELECT DISTINCT tid FROM calls
    WHERE corr IN (SELECT corr FROM events WHERE rank = $rank AND device AND corr IS NOT NULL)
),
drivers AS (SELECT tid FROM launchers UNION SELECT DISTINCT tid FROM calls WHERE NOT EXISTS (SELECT 1 FROM launchers)),
sel AS (
    SELECT tid, kind, name, start_ns AS s, start_ns + dur_ns AS e FROM events
    WHERE rank = $rank AND NOT device AND dur_ns > 0 AND start_ns < $hi AND start_ns + dur_ns > $lo
      AND kind IN ('sync', 'runtime', 'dataloader', 'host_op', 'python', 'comm', 'queue', 'other')
      AND (tid IN (SELECT tid FROM drivers) OR NOT EXISTS (SELECT 1 FROM drivers))
),
py AS (
    SELECT tid, s, e, max(e) OVER (PARTITION BY tid ORDER BY s, e DESC
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM sel WHERE kind = 'python'
),
py_isl AS (
    SELECT tid, min(s) AS s, max(e) AS e FROM (
        SELECT tid, s, e, sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
                          OVER (PARTITION BY tid ORDER BY s, e DESC ROWS UNBOUNDED PRECEDING) AS isl
        FROM py
    ) GROUP BY tid, isl
)
SELECT tid, s, e, name,
       CASE WHEN kind = 'sync' THEN 0
            WHEN kind = 'runtime' AND regexp_matches(name, $alloc_re) THEN 1
            WHEN kind = 'dataloader' THEN 2
            WHEN kind = 'runtime' THEN 3
            ELSE 4 END AS cls
FROM sel WHERE kind <> 'python'
UNION ALL
SELECT tid, s, e, 'Python' AS name, 4 AS cls FROM py_isl
ORDER BY tid, s, e DESC
"""

KERNEL_SQL = """
SELECT step, count(*) AS n, count(*) FILTER (WHERE dur_ns < $short_kernel_us * 1000) AS n_short
FROM events WHERE rank = $rank AND device AND kind = 'kernel' AND step IS NOT NULL GROUP BY step
"""


@rule("CPU007", "cpu.host-bound", cause="cpu.operator_dispatch", causes=("cpu.host_device_sync",),
      requires=("events", "steps", "breakdown"), thresholds=Thresholds, derived=("device_busy",))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose device waits on its host for a large part of the step."""
    dev_ranks = ctx.device_ranks
    if not dev_ranks:
        return
    bd = step_table(ctx)
    candidates = [int(r["rank"]) for r in ctx.query(RANKS_SQL)
                  if int(r["rank"]) in dev_ranks and r["idle_share"] is not None
                  and float(r["idle_share"]) >= ctx.t.min_idle_share]
    for rank in sorted(candidates):
        steps = ctx.df("SELECT step, start_ns, end_ns FROM steps WHERE rank = $rank AND end_ns > start_ns ORDER BY start_ns",
                       {"rank": rank})
        steps = steps[steps["step"].isin(bd.loc[bd["rank"] == rank, "step"])]
        if steps.empty:
            continue
        finding = _rank(ctx, rank, steps)
        if finding is not None:
            yield finding


def _idle(busy: pd.DataFrame, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The idle intervals (starts, ends) of window [a, b) given the device busy periods (sorted, disjoint)."""
    sel = busy[(busy["s"] < b) & (busy["e"] > a)]
    s = np.clip(sel["s"].to_numpy(np.int64), a, b)
    e = np.clip(sel["e"].to_numpy(np.int64), a, b)
    starts = np.concatenate([[a], e])
    ends = np.concatenate([s, [b]])
    keep = ends > starts
    return starts[keep], ends[keep]


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint union of intervals, sorted by start."""
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _rank(ctx: RuleContext[Thresholds], rank: int, steps: pd.DataFrame) -> Finding | None:
    lo, hi = int(steps["start_ns"].min()), int(steps["end_ns"].max())
    busy = ctx.df("SELECT s, e FROM device_busy WHERE rank = $rank AND s < $hi AND e > $lo ORDER BY s",
                  {"rank": rank, "lo": lo, "hi": hi})
    host = ctx.df(HOST_SQL, {"rank": rank, "lo": lo, "hi": hi, "alloc_re": ALLOC_RE})
    threads = sorted(set(host["tid"].astype(str)))
    thr = host["tid"].astype(str).map({t: i for i, t in enumerate(threads)}).to_numpy(np.int64)
    hs, he = host["s"].to_numpy(np.int64), host["e"].to_numpy(np.int64)
    cls = host["cls"].to_numpy(np.int64)
    # idle intervals of every step, then the elementary segments between any two boundaries (idle or host
    # event) inside them: one class per segment, from the innermost event of each driving thread
    idle_s, idle_e, idle_step = [], [], []
    w_s, w_e = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    step_ids = [int(x) for x in steps["step"]]
    for j in range(len(steps)):
        i_s, i_e = _idle(busy, int(w_s[j]), int(w_e[j]))
        idle_s.append(i_s)
        idle_e.append(i_e)
        idle_step.append(np.full(len(i_s), j, np.int64))
    i_s, i_e, i_j = np.concatenate(idle_s), np.concatenate(idle_e), np.concatenate(idle_step)
    order = np.argsort(i_s, kind="stable")
    i_s, i_e, i_j = i_s[order], i_e[order], i_j[order]
    n_steps = len(steps)
    per = np.zeros((n_steps, len(CLASS_NAMES)))
    wait: dict[str, float] = {}  # ns the device idled while each host call / operator was the innermost one
    blocking: set[str] = set()  # the names among them that are sync or allocator calls
    if len(i_s) and len(hs):
        pts = np.unique(np.concatenate([i_s, i_e, hs, he]))
        pts = pts[(pts >= lo) & (pts <= hi)]
        seg_s, seg_e = pts[:-1], pts[1:]
        k = np.searchsorted(i_s, seg_s, "right") - 1
        in_idle = (k >= 0) & (seg_e <= i_e[np.maximum(k, 0)])
        seg_s, seg_e, seg_j = seg_s[in_idle], seg_e[in_idle], i_j[k[in_idle]]
        best = np.full(len(seg_s), 99, np.int64)
        who = np.full(len(seg_s), -1, np.int64)
        for t in range(len(threads)):
            owner = enclosing_intervals(thr, hs, he, np.full(len(seg_s), t, np.int64), seg_s)
            c = np.where(owner >= 0, cls[np.maximum(owner, 0)], 99)
            better = c < best
            best = np.where(better, c, best)
            who = np.where(better, owner, who)
        # inside a data-loading span everything but a sync or allocator call is data loading (IO001's)
        dl = np.flatnonzero(cls == DATA)
        if len(dl):
            d_s, d_e = _union(hs[dl], he[dl])
            k = np.searchsorted(d_s, seg_s, "right") - 1
            in_dl = (k >= 0) & (seg_s < d_e[np.maximum(k, 0)])
            best = np.where(in_dl & (best > ALLOC), DATA, best)
        dur = (seg_e - seg_s).astype(float)
        for code in CLASS_NAMES:
            sel = best == code
            per[:, code] = np.bincount(seg_j[sel], weights=dur[sel], minlength=n_steps)
        calls = np.isin(best, HOST_WORK)
        names = host["name"].to_numpy()
        for i, c, d in zip(who[calls], best[calls], dur[calls], strict=True):
            nm = str(names[int(i)])
            wait[nm] = wait.get(nm, 0.0) + float(d)
            if c <= ALLOC:
                blocking.add(nm)
    idle_ns = np.bincount(i_j, weights=(i_e - i_s).astype(float), minlength=n_steps)
    rows = [{"step": step_ids[j], "step_ns": int(w_e[j] - w_s[j]), "idle_ns": float(idle_ns[j]),
             **{nm: float(per[j, code]) for code, nm in CLASS_NAMES.items()}}
            for j in range(n_steps)]
    df = pd.DataFrame(rows)
    df["host_ns"] = df[[CLASS_NAMES[c] for c in HOST_WORK]].sum(axis=1).clip(upper=df["step_ns"])
    idle_share = float((df["idle_ns"] / df["step_ns"]).median())
    host_share = float((df["host_ns"] / df["step_ns"]).median())
    if idle_share < ctx.t.min_idle_share or host_share < ctx.t.min_host_share:
        return None
    saving = float(df["host_ns"].median()) / 1000.0
    step_us = float(df["step_ns"].median()) / 1000.0
    n = len(df)
    by_class = {nm: round(float(df[nm].sum()) / 1000.0 / n, 1) for nm in CLASS_NAMES.values()}
    untraced = round(float((df["idle_ns"] - df[list(CLASS_NAMES.values())].sum(axis=1)).sum()) / 1000.0 / n, 1)
    work = {nm: by_class[nm] for nm in ("sync", "allocator", "launch", "framework_python")}
    main = max(work, key=lambda k: work[k])
    kern = ctx.df(KERNEL_SQL, {"rank": rank})
    kern = kern[kern["step"].isin(df["step"])]
    n_k, n_short = int(kern["n"].sum()), int(kern["n_short"].sum())
    short_share = n_short / n_k if n_k else 0.0
    cause = "cpu.host_device_sync" if main == "sync" else "cpu.operator_dispatch"
    reason = {
        "sync": "the host blocks in sync calls (blocking copies, synchronize) while the device has nothing queued",
        "allocator": "the host blocks in allocator calls (cudaMalloc / cudaFree, hipFree) that wait for the device",
        "launch": f"the host spends the time launching kernels ({short_share:.0%} of {n_k / n:.0f} kernels per step "
                  f"run under {ctx.t.short_kernel_us:g} µs)",
        "framework_python": f"the host runs Python and framework code between launches ({short_share:.0%} of "
                            f"{n_k / n:.0f} kernels per step run under {ctx.t.short_kernel_us:g} µs)",
    }[main]
    top_calls = sorted(wait.items(), key=lambda kv: -kv[1])[: ctx.t.top_n]
    busy_share = 1.0 - idle_share
    return ctx.finding(
        title=f"Rank {rank}'s device is busy {busy_share:.0%} of the step and waits on the host for "
        f"{fmt_ms(saving)} of {fmt_ms(step_us)} ({host_share:.0%}): {reason}",
        evidence={
            "device_busy_share": round(busy_share, 4), "device_idle_share": round(idle_share, 4),
            "min_idle_share": ctx.t.min_idle_share,
            "host_work_share": round(host_share, 4), "min_host_share": ctx.t.min_host_share,
            "device_idle_us_per_step": {**by_class, "nothing_recorded": untraced},
            "main_reason": main,
            "kernels_per_step": round(n_k / n, 1), "short_kernel_share": round(short_share, 4),
            "short_kernel_us": ctx.t.short_kernel_us,
            "driving_threads": len(set(host["tid"])) if len(host) else 0,
            "step_us_median": round(step_us, 1), "steps": n,
        },
        saving_us=min(saving, step_us), step_us=step_us, cause=cause,
        saving_basis="median per-step device idle time during which the threads driving the device were in sync, "
        "allocator, launch, framework or Python work (data loading excluded)",
        # ops: the blocking calls only, so that ranks bound the same way merge into one finding
        ranks=[rank], steps=[int(s) for s in df["step"]], ops=sorted(nm for nm, _ in top_calls if nm in blocking),
        top=[{"host_call": nm, "device_idle_us_per_step": round(d / 1000.0 / n, 1)} for nm, d in top_calls],
    )
