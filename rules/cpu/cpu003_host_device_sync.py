"""The host blocks on the device: ``.item()``, ``nonzero``, ``.tolist()``, explicit synchronize, SyncBatchNorm.

## Why it matters
Launches are asynchronous: the host normally runs ahead and the device always has queued work.
A call that needs a device value on the host (``tensor.item()``, ``.tolist()``, ``torch.nonzero``
and boolean-mask indexing whose output size depends on the data, ``cudaStreamSynchronize`` /
``aclrtSynchronizeStream``, SyncBatchNorm's statistics exchange, a device-to-host copy) makes
the host wait until the device has drained its queue; afterwards the device idles until the host
has launched new work. Hermes (§4.2.2, Table 2 "synchronous operations"; its case study found
18 syncs, the two slowest costing 24 ms of a step) detects them and shows their call stack.

## How it is detected
Sync points are host events named ``aten::item``, ``aten::_local_scalar_dense``,
``aten::nonzero``, ``aten::is_nonzero``, anything with ``SyncBatchNorm`` or
``batch_norm_gather_stats``, any ``*Synchronize*`` runtime call (kind ``sync``), and Python calls
``<built-in method item|tolist|nonzero of Tensor ...>`` (not those of numpy objects, which read no
device value); nested ones (``aten::item`` inside the Python ``item`` call, ``_local_scalar_dense``
inside ``aten::item``) count once, and so do sync points that overlap in time on different threads
of one rank (``aten::item`` on the Python thread, ``aclrtSynchronizeStream`` / ``aclrtMemcpy`` on the
runtime's): one blocking sync, one count, its time the union of their spans. Device-side
``Memcpy DtoH`` copies into pageable memory are sync points too (a copy into pinned memory can run
asynchronously), as are blocking runtime copies (``cudaMemcpy``, ROCm's ``hipMemcpyWithStream``). The call stack comes from ``events.stack`` when the
export has it, else from the enclosing Python frames (``with_stack=True``). The finding names the
user's source line of the costliest kind (``train.py:42 (train_step)``): the innermost frame of that
stack outside the framework (``torch/``, ``torch_npu/``, MindSpore), the standard library
(``threading.py``) and installed packages (``site-packages``). Kineto's Python tracer writes each
frame with the line where it saw the function run (its first line for a call made while profiling).

*With a device*: for each sync point, the device idle time from its end to the next device
work (less any data loading in between, which IO001 reports), each idle gap counted once. A sync
point blocks only if the device ran work during it (the host waited for that work to finish): one
during which the device was busy less than ``min_wait_us`` (e.g. a harness's
``torch.cuda.synchronize()`` before the model launched anything) waited on nothing, and the idle
after it is the host's own time to its next launch (CPU007's), so it is counted in the evidence
(``non_blocking_syncs``) but not as blocking and given no saving. Sync points outside every step
window (a profiling harness's closing synchronize after the last step) are not judged, and one
after the device's last work in the window has no idle after it to blame. It
fires when that time per step is at least ``min_idle_share`` of the step; the saving is the mean
per-step idle time after sync points, each host sync point's at most the device busy time inside it:
without the wait the host reaches its next launch that much earlier, and the rest of the idle is
host work that stays (CPU007's). A device-side copy keeps its whole idle (it is the work waited for).
Where the what-if replay of the steps with the host not waiting at its sync points (a blocking call's
wait edge dropped) reproduces every step, the saving is the replayed one instead: it also counts the
launches that, issued earlier, run back to back.

*CPU-only*: there is no device queue to drain, so a sync point costs only its own few µs here
and the blocking time it would cause on an accelerator cannot be measured. The rule still counts
sync points per step and fires when there are at least ``min_per_step``, with severity *low*
and no saving (the count is certain, the cost is not), and says so in a warning. This keeps the
finding visible for code that will run on a device without claiming a measured cost.

*No device timeline the rule can read*: a rank whose host launched device work with no device
activity recorded, a CUPTI range-profiler capture (kernels replayed, none recorded) or an
accelerator's own unmodelled event category (``window_phases``) is not judged, and the rule says
why: it is not a CPU-only run, and the absence of device events says nothing about blocking.

## What to do
Keep values on the device: accumulate losses and metrics as tensors and read them every N
steps, avoid ``.item()`` / ``.tolist()`` / printing tensors inside the step, replace
``nonzero`` / boolean indexing with fixed-size ops (``torch.where``, masks), avoid explicit
synchronize calls, and use SyncBatchNorm only where the per-device batch is too small.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, SupportsInt, cast

import numpy as np
import pandas as pd

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.kinds import EdgeKind
from advisor.model import Finding, Severity
from rules.cpu._common import fmt_ms, outermost, python_stack_sql, skip_device_gaps, source_of, step_table


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU003."""

    min_idle_share: float = knob(0.01, "device idle after sync points, as a share of the step, that fires the rule (device traces)",
                                 "first principles: below 1 % of the step the syncs are not worth a finding; severity follows CAUSES.md")
    min_per_step: float = knob(1.0, "sync points per step that fire the rule on CPU-only traces",
                               "Hermes §4.2.2: synchronous operations in the training loop are a CPU cause; any one per step is avoidable")
    top_n: int = knob(5, "sync-point kinds listed with their call stacks", "presentation")
    stack_frames: int = knob(6, "innermost call-stack frames shown per sync point", "presentation")
    min_wait_us: float = knob(1.0, "device busy time inside a sync point below which it did not block (device traces)",
                              "first principles: with the device idle for the whole call the host waited on nothing; "
                              "1 µs absorbs host/device clock alignment")


#: the counterfactual (advisor.stages.replay): the host no longer waits at its sync points (values kept on
#: the device, copies made asynchronous); each blocking call's wait edge on the device task that released
#: it is dropped. A call that did not block has no such edge, so it saves nothing
COUNTERFACTUAL = (Change("drop_edges", Select(device=False), edge=EdgeKind.SYNC_WAIT),)
ASSUMPTION = "if the host did not wait for the device at its sync points (reads made asynchronous)"

HOST_SYNC_RE = (r"^aten::(item|_local_scalar_dense|nonzero|is_nonzero)$|SyncBatchNorm|batch_norm_gather_stats"
                r"|(?i:synchronize)")
PY_SYNC_RE = r"^<built-in method (item|tolist|nonzero) of "
# the same Python methods of host objects (numpy scalars and arrays, array.array) read no device value
PY_NOT_SYNC_RE = r"^<built-in method [a-z_]+ of (numpy\.|array\.|memoryview)"
DTOH_RE = r"(?i)dtoh|devicetohost|device to host|d2h"
# a copy into pinned host memory can be asynchronous (``non_blocking=True``, the fix this rule advises);
# one into pageable memory blocks the host until it is done
PINNED_RE = r"(?i)pinned"
ADDR_RE = r" at 0x[0-9a-fA-F]+"

SQL = f"""
WITH sync_names AS (  -- each distinct host event name classified once
    SELECT kind, name FROM event_names
    WHERE NOT device AND (kind = 'sync' OR (kind = 'python' AND regexp_matches(name, $py_sync_re)
                                             AND NOT regexp_matches(name, $py_not_sync_re))
                          OR (kind NOT IN ('python', 'step') AND regexp_matches(name, $host_sync_re)))
),
host_cand AS (
    SELECT e.rank, e.step, e.pid, e.tid, e.kind, regexp_replace(e.name, $addr_re, '') AS name, e.start_ns, e.dur_ns,
           e.stack
    FROM events e JOIN sync_names n ON e.kind = n.kind AND e.name IS NOT DISTINCT FROM n.name
    WHERE NOT e.device AND e.step IS NOT NULL
),
{outermost("host_pts", "host_cand")},
pts AS (
    SELECT rank, step, pid, tid, kind, name, start_ns, dur_ns, stack, false AS on_device FROM host_pts
    UNION ALL
    SELECT rank, step, pid, tid, kind, name, start_ns, dur_ns, stack, true FROM events
    WHERE device AND kind = 'memcpy' AND step IS NOT NULL
      AND name IN (SELECT name FROM event_names WHERE device AND kind = 'memcpy' AND regexp_matches(name, $dtoh_re)
                   AND NOT regexp_matches(name, $pinned_re))
),
pts_id AS MATERIALIZED (SELECT row_number() OVER (ORDER BY rank, start_ns, dur_ns, pid, tid, name) AS id, *, start_ns + dur_ns AS end_ns FROM pts),
cur AS (  -- the last device busy period started when the sync point ends (if any), and the next one's start
    SELECT p.id, b.e AS busy_until, b.s AS cur_s, b.next_s
    FROM pts_id p ASOF LEFT JOIN device_busy b ON p.rank = b.rank AND p.end_ns >= b.s
),
nxt AS (  -- the first busy period starting after the sync point ends: the one after cur, else the rank's first
    SELECT p.id, CASE WHEN c.cur_s IS NOT NULL THEN c.next_s WHEN p.end_ns IS NOT NULL THEN f.first_s END AS next_busy
    FROM pts_id p JOIN cur c USING (id)
    LEFT JOIN (SELECT rank, min(s) AS first_s FROM device_busy GROUP BY rank) f ON f.rank = p.rank
),
gap AS (
    SELECT p.*, CASE WHEN c.busy_until > p.end_ns OR n.next_busy IS NULL THEN 0 ELSE n.next_busy - p.end_ns END AS gap_ns,
           n.next_busy
    FROM pts_id p JOIN cur c USING (id) JOIN nxt n USING (id)
),
waited AS (  -- how long the host waited on device work: the device busy time inside the sync point's span
    SELECT p.id, coalesce(sum(CASE WHEN b.s IS NOT NULL THEN least(b.e, p.end_ns) - greatest(b.s, p.start_ns) END), 0)
           AS wait_ns
    FROM pts_id p LEFT JOIN device_busy b ON b.rank = p.rank AND b.s < p.end_ns AND b.e > p.start_ns
    GROUP BY p.id
),
dl AS (
    SELECT g.id, coalesce(sum(least(g.next_busy, d.start_ns + d.dur_ns) - greatest(g.end_ns, d.start_ns)), 0) AS dl_ns
    FROM gap g JOIN events d ON d.rank = g.rank AND d.kind = 'dataloader' AND NOT d.device
         AND d.start_ns < g.next_busy AND d.start_ns + d.dur_ns > g.end_ns
    WHERE g.gap_ns > 0 GROUP BY g.id
)
SELECT g.id, g.rank, g.step, g.pid, g.tid, g.kind, g.name, g.start_ns, g.end_ns, g.dur_ns, g.stack, g.on_device,
       g.next_busy, greatest(g.gap_ns - coalesce(dl.dl_ns, 0), 0) AS idle_ns, w.wait_ns
FROM gap g LEFT JOIN dl USING (id) JOIN waited w USING (id)
ORDER BY g.id
"""

@rule("CPU003", "cpu.host-device-sync", cause="cpu.host_device_sync",
      requires=("events", "steps", "breakdown"), thresholds=Thresholds,
      derived=("device_busy", "event_names"))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank with sync points in its steps."""
    df = ctx.df(SQL, {"addr_re": ADDR_RE, "py_sync_re": PY_SYNC_RE, "host_sync_re": HOST_SYNC_RE, "dtoh_re": DTOH_RE,
                      "py_not_sync_re": PY_NOT_SYNC_RE, "pinned_re": PINNED_RE})
    if df.empty:
        return
    # a sync point during which the device ran nothing did not block: the host waited on nothing, and the device
    # idle after it is the host's own time to the next launch (CPU007's), not the sync's
    df["raw_idle_ns"] = df["idle_ns"]
    # had the sync not blocked, the host would have reached its next launch at most its wait earlier: the idle
    # after it that the sync can be blamed for is bounded by that wait (the rest is host work that stays)
    # (a device-side copy is itself the device work the host waits for: its row keeps its idle)
    host_row = ~df["on_device"].astype(bool)
    gated = df["idle_ns"].clip(upper=df["wait_ns"]).where(df["wait_ns"] >= ctx.t.min_wait_us * 1000.0, 0)
    df["idle_ns"] = gated.where(host_row, df["idle_ns"])
    bd = step_table(ctx)
    dev_ranks = ctx.device_ranks
    quiet = _quiet_ranks(ctx, df, bd, dev_ranks) | skip_device_gaps(ctx, df["rank"].unique())
    bd_of = {int(cast(SupportsInt, r)): g for r, g in bd.groupby("rank")}
    for rank, g in df.groupby("rank"):
        rank = int(rank)
        steps_r = bd_of.get(rank)
        if steps_r is None or rank in quiet:
            continue
        n_steps = len(steps_r)
        step_us = float(steps_r["step_us"].mean())
        g = g[g["step"].isin(steps_r["step"])]
        host = blocking_syncs(g[~g["on_device"]], ctx.t.min_wait_us * 1000.0)
        n_idle_dev = int((host["wait_ns"] < ctx.t.min_wait_us * 1000.0).sum()) if rank in dev_ranks else 0
        per_step = len(host) / n_steps
        # each idle gap once (several sync points can precede the same device work)
        pts = pd.concat([host, g[g["on_device"]]])
        idle_us = float(pts.groupby("next_busy")["idle_ns"].max().sum()) / 1000.0 / n_steps if rank in dev_ranks else 0.0
        share = (idle_us / step_us if step_us else 0.0) if rank in dev_ranks else None
        if share is not None and share < ctx.t.min_idle_share or share is None and per_step < ctx.t.min_per_step:
            continue
        top = _top(ctx, pts, n_steps, rank in dev_ranks)
        evidence: dict[str, Any] = {
            "sync_points_per_step": round(per_step, 2),
            "dtoh_copies_per_step": round(int(g["on_device"].sum()) / n_steps, 2),
            "sync_time_us_per_step": round(float(host["dur_ns"].sum()) / 1000.0 / n_steps, 1),
            "non_blocking_syncs_per_step": round(n_idle_dev / n_steps, 2),
            "steps": n_steps, "step_us_mean": round(step_us, 1),
            "stack_recorded": any(t["stack"] for t in top),
        }
        names = [t["sync_point"] for t in top]
        source = top[0]["source"] if top else None  # where the user's code makes the costliest kind of sync
        if source:
            evidence["source"] = source
        at = f" at {source}" if source else ""
        if share is not None:
            if n_idle_dev:  # said in the evidence: the rule decided these, they are not undecided
                idle_names = ", ".join(sorted(set(host.loc[host["wait_ns"] < ctx.t.min_wait_us * 1000.0, "name"])))
                evidence["non_blocking_syncs"] = (f"{idle_names}: ran with the device idle, so the host waited on "
                                                  "nothing; not counted as blocking, no saving")
            blocking = (len(host) - n_idle_dev) / n_steps
            evidence |= {"device_idle_after_sync_us_per_step": round(idle_us, 1), "idle_share": round(share, 4),
                         "min_idle_share": ctx.t.min_idle_share}
            yield ctx.finding(
                title=f"Rank {rank} blocks on the device {blocking:.1f} times per step; the device then idles "
                f"{fmt_ms(idle_us)} per step ({share:.0%} of {fmt_ms(step_us)}), mostly after {names[0]}{at}",
                evidence=evidence, saving_us=idle_us, step_us=step_us,
                saving_basis="mean per-step device idle time from the end of each sync point to the next device work, "
                "each at most the time the host waited on the device inside the sync (data loading excluded, each "
                "gap once)",
                ranks=[rank], steps=sorted({int(s) for s in g["step"]}), ops=names, top=top,
                replay=ctx.what_if(rank, COUNTERFACTUAL, ASSUMPTION, steps=[int(x) for x in steps_r["step"]]),
            )
        else:
            evidence |= {"min_per_step": ctx.t.min_per_step}
            ctx.warn(f"rank {rank}: CPU-only trace, so the time the {per_step:.1f} sync points per step would block on an "
                     "accelerator cannot be measured; reported by count with severity low")
            yield ctx.finding(
                title=f"Rank {rank} reads device values on the host {per_step:.1f} times per step "
                f"({_summary(top)}){at}; each would block on an accelerator",
                evidence=evidence, severity=Severity.LOW,
                saving_basis="not measurable on a CPU-only trace: there is no device queue to drain",
                ranks=[rank], steps=sorted({int(s) for s in host["step"]}), ops=names, top=top,
                replay={"estimated": False, "assumption": ASSUMPTION,
                        "reason": "CPU-only trace: there is no device queue the host waited for"},
            )


def blocking_syncs(host: Any, min_wait_ns: float = 0.0) -> Any:
    """One row per blocking sync of one rank: host sync points that overlap in time, on any thread
    (``aten::item`` -> ``aclrtSynchronizeStream`` -> ``aclrtMemcpy``, the framework and the runtime
    often on different threads), are one wait. Each row is the earliest (then longest) event of its
    group, with the group's time span as ``dur_ns``, the longest device wait inside any of them as ``wait_ns``,
    and the device idle after the last of them ends, at most that wait (none when it is below ``min_wait_ns``)."""
    if host.empty:
        return host
    h = host.sort_values(["start_ns", "dur_ns"], ascending=[True, False])
    prev_end = h["end_ns"].cummax().shift()
    group = (prev_end.isna() | (h["start_ns"] >= prev_end)).cumsum()
    start = h.groupby(group)["start_ns"].min()
    last = h.loc[h.groupby(group)["end_ns"].idxmax()]  # the host is free when the last of them ends
    first = h.groupby(group).head(1)  # in start order, as the groups are numbered
    wait = h.groupby(group)["wait_ns"].max().to_numpy()
    raw = last["raw_idle_ns"] if "raw_idle_ns" in last else last["idle_ns"]
    idle = np.minimum(raw.to_numpy(), wait) * (wait >= min_wait_ns)
    return first.assign(dur_ns=last["end_ns"].to_numpy() - start.to_numpy(), end_ns=last["end_ns"].to_numpy(),
                        idle_ns=idle, wait_ns=wait, next_busy=last["next_busy"].to_numpy())


def _quiet_ranks(ctx: RuleContext[Thresholds], df: Any, bd: Any, dev_ranks: frozenset[int]) -> set[int]:
    """Ranks clearly below the thresholds, screened for all ranks at once (with slack: borderline ranks are judged
    one by one)."""
    inside = df.merge(bd[["rank", "step"]], on=["rank", "step"])
    idle = inside.groupby(["rank", "next_busy"])["idle_ns"].max().groupby(level="rank").sum()
    host = (~inside["on_device"].astype(bool)).groupby(inside["rank"]).sum()
    steps = bd.groupby("rank")["step_us"].agg(["size", "mean"])
    quiet = set()
    for rank, n, mean in zip(steps.index, steps["size"], steps["mean"], strict=True):
        if int(rank) in dev_ranks:
            value = float(idle.get(rank, 0.0)) / 1000.0 / n / mean if mean else 0.0
            limit = ctx.t.min_idle_share
        else:
            value, limit = float(host.get(rank, 0)) / n, ctx.t.min_per_step
        if value < limit - 1e-9 * max(1.0, abs(limit)):
            quiet.add(int(rank))
    return quiet


def _top(ctx: RuleContext[Thresholds], g: Any, n_steps: int, on_device: bool) -> list[dict[str, Any]]:
    """The sync-point kinds of one rank, most device idle time first, each with an example's call stack."""
    by_name = (g.groupby("name").agg(n=("id", "size"), total_us=("dur_ns", "sum"), idle_us=("idle_ns", "sum"),
                                     example=("id", "first"), max_us=("dur_ns", "max"))
               .sort_values(["idle_us", "n"], ascending=False))
    stacks = _stacks(ctx, g, [int(x) for x in by_name["example"].head(ctx.t.top_n)])
    return [{"sync_point": name, "count": int(r.n), "per_step": round(r.n / n_steps, 2),
             "total_us": round(r.total_us / 1000.0, 1), "max_us": round(r.max_us / 1000.0, 1),
             "device_idle_after_us": round(r.idle_us / 1000.0, 1) if on_device else None,
             "stack": stacks.get(int(r.example), ("", None))[0], "source": stacks.get(int(r.example), ("", None))[1]}
            for name, r in by_name.head(ctx.t.top_n).iterrows()]


def _summary(top: list[dict[str, Any]]) -> str:
    return ", ".join(f"{float(t['per_step']):g}x {t['sync_point']}" for t in top[:3])


def _stacks(ctx: RuleContext[Thresholds], g: object, ids: list[int]) -> dict[int, tuple[str, str | None]]:
    """Call stack per sync point id: events.stack when recorded, else the enclosing Python frames (innermost last),
    with the user's source line found in it (``file:line (function)``, framework and library frames skipped)."""
    sel = g[g["id"].isin(ids)]  # type: ignore[index]
    out: dict[int, tuple[str, str | None]] = {}
    for r in sel.itertuples():
        if isinstance(r.stack, str) and r.stack:
            out[int(r.id)] = ("\n".join(r.stack.replace(";", "\n").splitlines()[: ctx.t.stack_frames]),
                              source_of(r.stack, None))
    need = sel[~sel["id"].isin(list(out))]
    if len(need):
        rows = ctx.query_frames(python_stack_sql("_cpu003_targets"), {
            "_cpu003_targets": pd.DataFrame(need[["id", "rank", "pid", "tid", "start_ns", "end_ns"]])})
        for id_, frames in ((r["id"], r["frames"]) for r in rows):
            fr = [f for f in frames.split("\n") if f]
            fr = [f for f in fr if not f.startswith("<built-in method")] or fr
            out[int(id_)] = ("\n".join(fr[-ctx.t.stack_frames:]), source_of(None, frames))
    return out
