"""Generic operator chains that have a fused or hardware-affine replacement (RMSNorm, RoPE, SwiGLU, attention, permute + copy, per-parameter optimizer ops).

## Why it matters
A chain of small generic operators reads and writes the same tensor several times and pays a
launch per operator, where one fused or hardware-affine operator does the work in one pass.
Hermes counts "operators with suboptimal hardware affinity" and missing fusion among the main
reasons for underutilised computation (§4.2.2, appendix C: FastGeLU, fused LayerNorm), and its
advisor matches such patterns to fused APIs.

## How it is detected
Operators are turned into tokens by generic name patterns - framework operators on Kineto
(``aten::pow``, ``aten::rsqrt``, ``aten::softmax``, ``aten::permute`` ...) and operator types on
Ascend (``Pow``, ``Rsqrt``, ``SoftmaxV2``, ``Transpose``, ``ConcatD`` ...) - and the token
sequence of each (rank, step, thread or device) is searched for these chains, allowing up to
``max_gap`` unrelated operators between two links:

* **RMSNorm**: pow/square -> mean -> (add) -> rsqrt -> mul;
* **RoPE** (rotate-half): neg -> cat -> mul;
* **SwiGLU**: silu/swish -> mul, or sigmoid -> mul -> mul;
* **attention**: matmul -> (scale / mask / dropout) -> softmax -> (dropout) -> matmul;
* **permute + copy**: permute/transpose -> contiguous copy (Kineto), a Transpose task next to a
  matmul (Ascend: the matmul can read the transposed layout itself);
* **GELU** (Ascend): ``Gelu`` where ``FastGelu`` exists;
* **per-parameter optimizer**: at least ``min_optimizer_ops`` per step of per-tensor optimizer
  updates (``aten::add_``/``mul_``/``addcdiv_``/``addcmul_``/``lerp_``/``sqrt`` inside
  ``Optimizer.step``, or Ascend ``ApplyAdam*`` tasks) and no multi-tensor (``_foreach_*`` /
  ``_fused_*``) operator.

Time of an operator: its device time (Ascend tasks; Kineto kernels attributed to the top-level
host operator open on the launching thread when the kernel's runtime launch ran), or its host time on CPU-only traces. The saving of a chain
is its time minus its longest operator (what remains if the chain becomes one operator of that
cost); for the optimizer pattern it is the device idle time between the per-parameter tasks
(``wait``) on Ascend, else the host time of the per-tensor operators. Per step, upper bounds.
The rule fires when a pattern's saving reaches ``min_saving_share`` of the step.

## What to do
Use the fused API: ``torch.nn.functional.rms_norm`` / ``torch_npu.npu_rms_norm``, ``npu_rotary_mul``
or a fused RoPE kernel, ``npu_swiglu`` / fused SwiGLU, ``scaled_dot_product_attention`` /
FlashAttention (``npu_fusion_attention``), FastGelu, the matmul's transpose flags instead of an
explicit permute + contiguous, and ``foreach=True`` / ``fused=True`` optimizers
(``torch_npu.optim.NpuFused*``). ``torch.compile`` fuses many of these chains automatically.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.causes import for_platform
from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from rules.compute._common import KERNEL_OPS, kernel_tie_note


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CMP003."""

    max_gap: int = knob(2, "unrelated operators allowed between two links of a chain")
    min_optimizer_ops: int = knob(
        16, "per-parameter optimizer operators per step that make the optimizer pattern",
        "first principles: a handful of parameter groups is normal; dozens of per-tensor updates is a per-parameter loop",
    )
    min_saving_share: float = knob(
        0.0, "report a pattern only when its estimated saving is at least this share of the step (0 = every match; "
        "severity still follows the saving)",
    )
    patterns: str = knob("all", "comma-separated patterns to look for: rms_norm, rope, swiglu, swiglu_sigmoid, "
                         "attention, permute_copy, transpose_matmul, gelu, optimizer; 'all' for every one")
    top_n: int = knob(10, "matches listed per finding")


# name -> token. Kineto names are matched without the 'aten::' prefix; Ascend by op type.
TOKEN_SQL = """CASE
    WHEN {x} IN ('pow', 'square') THEN 'pow'
    WHEN {x} IN ('mean', 'reducemean', 'reducemeand') THEN 'mean'
    WHEN {x} IN ('rsqrt') THEN 'rsqrt'
    WHEN {x} IN ('mul', 'muls') THEN 'mul'
    WHEN {x} IN ('add', 'adds', 'addv2') THEN 'add'
    WHEN {x} IN ('div', 'realdiv', 'divs') THEN 'div'
    WHEN {x} IN ('neg') THEN 'neg'
    WHEN {x} IN ('cat', 'concat', 'concatd', 'concatv2', 'concatv2d') THEN 'cat'
    WHEN {x} IN ('silu', 'swish') THEN 'silu'
    WHEN {x} IN ('sigmoid') THEN 'sigmoid'
    WHEN {x} IN ('softmax', '_softmax', 'softmaxv2', 'scaledmaskedsoftmax', 'softmaxv2withdropoutdomaskv3d') THEN 'softmax'
    WHEN {x} IN ('dropout', 'native_dropout', 'dropoutdomask', 'dropoutdomaskv3', 'dropoutgenmask') THEN 'drop'
    WHEN {x} IN ('matmul', 'mm', 'bmm', 'addmm', 'baddbmm', 'linear', 'matmulv2', 'matmulv3', 'batchmatmul',
               'batchmatmulv2', 'batchmatmulv3') THEN 'mm'
    WHEN {x} IN ('permute', 'transpose', 'swapaxes', 'transposed') THEN 'perm'
    WHEN {x} IN ('contiguous', 'asstrided', 'viewcopy') THEN 'copy'
    WHEN {x} IN ('gelu') THEN 'gelu'
    WHEN {x} IN ('add_', 'mul_', 'addcdiv_', 'addcmul_', 'lerp_', 'sqrt', 'div_', 'applyadam', 'applyadamw',
               'applyadamd', 'applyadamwv2', 'applymomentum', 'applyadamwd') THEN 'optel'
    WHEN {x} LIKE '_foreach_%' OR {x} LIKE '_fused_%' OR {x} LIKE 'npufused%' THEN 'multi'
    ELSE '_'
END"""

TOKEN_ENUM = "ENUM(" + ", ".join(f"'{t}'" for t in dict.fromkeys([*re.findall(r"THEN '(\w+)'", TOKEN_SQL), "_"])) + ")"

ASCEND_SQL = f"""
SELECT rank, step, 'device' AS lane, start_ns, dur_ns, coalesce(wait_ns, 0) AS wait_ns, name,
       {TOKEN_SQL.format(x='lower(coalesce(op_type, name))')} AS tok
FROM kernels
WHERE dur_ns >= 0 AND upper(coalesce(core_type, '')) NOT IN ('HCCL', 'COMMUNICATION') AND step IS NOT NULL
ORDER BY rank, step, start_ns
"""

# Kineto: the top-level host operators of each thread (an operator nested in another one is part
# of it: aten::sum inside aten::mean, autograd's backward ops inside their evaluate_function
# wrapper), without pure view / metadata operators. Time = device time of all kernels launched
# inside the operator, or its host duration on CPU-only ranks.
VIEW_OPS = (
    "('view', 'reshape', '_unsafe_view', 'as_strided', 'expand', 'expand_as', 'select', 'unbind', 'slice', "
    "'narrow', 'split', 'chunk', 'unsqueeze', 'squeeze', 't', 'detach', 'alias', 'resolve_conj', 'resolve_neg', "
    "'view_as', 'flatten', 'unflatten', 'split_with_sizes', 'empty', 'empty_like', 'empty_strided', 'lift_fresh')"
)
KINETO_SQL = f"""
WITH incl AS (  -- device time of the kernels launched inside each top-level operator
    SELECT top_oid AS oid, sum(dur_ns) AS dev_ns FROM {KERNEL_OPS} WHERE top_oid IS NOT NULL GROUP BY top_oid
),
dev AS (SELECT rank, bool_or(device) AS has_dev FROM events GROUP BY rank),
names AS (  -- each distinct operator name with its token, once (pure view / metadata operators left out)
    SELECT name, tok FROM (
        SELECT name, short, {TOKEN_SQL.format(x="short")} AS tok
        FROM (SELECT DISTINCT name, lower(regexp_replace(name, '^aten::', '')) AS short FROM event_names
              WHERE kind = 'host_op' AND NOT device))
    WHERE short NOT IN {VIEW_OPS}
),
ops AS (  -- top-level operators (an operator nested in another one is part of it)
    SELECT h.*, n.tok
    FROM host_op_top h JOIN names n USING (name)
    WHERE h.step IS NOT NULL
),
lanes AS (  -- each thread ('pid:tid') numbered in the order of that text
    SELECT k, dense_rank() OVER (ORDER BY k) AS lane
    FROM (SELECT DISTINCT pid || ':' || tid AS k FROM host_op_top) WHERE k IS NOT NULL
)
-- lane: the thread's number (NULL where pid or tid is unknown); tok as an ENUM (a pandas
-- category): no Python string per operator
SELECT o.rank, o.step, l.lane, o.start_ns,
       (CASE WHEN d.has_dev THEN coalesce(w.dev_ns, 0) ELSE o.dur_ns END)::DOUBLE AS dur_ns, 0 AS wait_ns,
       CASE WHEN o.tok <> '_' THEN o.name END AS name,  -- only chain links are named in findings
       CAST(o.tok AS {TOKEN_ENUM}) AS tok,
       -- host times (exact integers, NULL-free): a per-tensor update counts inside Optimizer.step only
       coalesce(o.start_ns, 0) AS host_s, coalesce(o.start_ns + o.dur_ns, 0) AS host_e,
       o.start_ns IS NOT NULL AND o.dur_ns IS NOT NULL AS timed
FROM ops o JOIN dev d USING (rank)
LEFT JOIN incl w ON w.oid = o.oid
LEFT JOIN lanes l ON l.k = o.pid || ':' || o.tid
ORDER BY o.rank, o.step, lane, o.start_ns
"""
# the Optimizer.step annotations a per-tensor update operator must run inside (Kineto)
OPTIMIZER_SQL = """
SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM events
WHERE NOT device AND kind = 'annotation' AND name LIKE 'Optimizer.step#%' AND start_ns IS NOT NULL AND dur_ns IS NOT NULL
"""


def inside_windows(rank: np.ndarray, s: np.ndarray, e: np.ndarray, w_rank: np.ndarray, w_s: np.ndarray,
                   w_e: np.ndarray) -> np.ndarray:
    """Whether each interval (rank, s, e) lies inside some window of its rank (w.s <= s and
    e <= w.e): among the windows started up to s, the latest end reaches e (no pair compared)."""
    out = np.zeros(len(s), dtype=bool)
    for r in np.unique(rank):
        mine = np.flatnonzero(rank == r)
        win = np.flatnonzero(w_rank == r)
        if not len(win):
            continue
        order = win[np.argsort(w_s[win], kind="stable")]
        reach = np.maximum.accumulate(w_e[order])
        j = np.searchsorted(w_s[order], s[mine], "right") - 1
        out[mine] = (j >= 0) & (reach[np.maximum(j, 0)] >= e[mine])
    return out


def _optimizer_inside(ctx: RuleContext[Any], ops: Any, tok: np.ndarray) -> None:
    """Per-tensor update operators (token ``optel``) outside every Optimizer.step become '_' in ``tok``."""
    opt = np.flatnonzero(tok == "optel")
    if not len(opt):
        return
    known = ops["timed"][opt].astype(bool)
    w = ctx.query(OPTIMIZER_SQL)
    inside = np.zeros(len(opt), dtype=bool)
    if known.any() and w:
        k = opt[known]
        inside[known] = inside_windows(
            ops["rank"][k].astype(np.int64), ops["host_s"][k].astype(np.int64), ops["host_e"][k].astype(np.int64),
            np.array([r["rank"] for r in w], np.int64), np.array([r["s"] for r in w], np.int64),
            np.array([r["e"] for r in w], np.int64))
    tok[opt[~inside]] = "_"

# Whether any operator name can give a token at all (each distinct name tested once): without one
# no chain and no optimizer pattern can match, and the per-operator sequences need not be read.
ASCEND_TOKENS_SQL = f"""
SELECT count(*) AS n FROM kernel_names WHERE {TOKEN_SQL.format(x='lower(coalesce(op_type, name))')} <> '_'
"""
KINETO_TOKENS_SQL = f"""
SELECT count(*) AS n FROM (SELECT DISTINCT lower(regexp_replace(name, '^aten::', '')) AS x FROM event_names
                           WHERE kind = 'host_op' AND NOT device)
WHERE {TOKEN_SQL.format(x='x')} <> '_'
"""

# chain patterns: token lists, with optional links marked '?'
PATTERNS: dict[str, tuple[str, list[str], str]] = {
    "rms_norm": ("unfused RMSNorm (pow -> mean -> rsqrt -> mul)", ["pow", "mean", "add?", "rsqrt", "mul"],
                 "torch.nn.functional.rms_norm / torch_npu.npu_rms_norm / a fused RMSNorm kernel"),
    "rope": ("unfused rotary embedding (neg -> cat -> mul)", ["neg", "cat", "mul"],
             "torch_npu.npu_rotary_mul / a fused RoPE kernel"),
    "swiglu": ("unfused SwiGLU (silu -> mul)", ["silu", "mul"], "torch_npu.npu_swiglu / a fused SwiGLU kernel"),
    "swiglu_sigmoid": ("unfused SwiGLU (sigmoid -> mul -> mul)", ["sigmoid", "mul", "mul"],
                       "torch_npu.npu_swiglu / a fused SwiGLU kernel"),
    "attention": ("unfused attention (matmul -> softmax -> matmul)", ["mm", "softmax", "drop?", "mm"],
                  "scaled_dot_product_attention / FlashAttention (torch_npu.npu_fusion_attention)"),
    "permute_copy": ("permute/transpose followed by a contiguous copy", ["perm", "copy"],
                     "no .contiguous() copy: let the consumer read the strided layout (matmul transpose flags)"),
    "transpose_matmul": ("Transpose task feeding a matmul", ["perm", "mm"],
                         "the matmul's transpose flags (adj_x / adj_y) instead of an explicit Transpose"),
    "gelu": ("Gelu where FastGelu exists", ["gelu"], "FastGelu (torch_npu.fast_gelu / npu_fast_gelu)"),
}
ASCEND_ONLY = {"gelu", "transpose_matmul"}
KINETO_ONLY = {"permute_copy"}


def _regex(links: list[str], gap: int) -> re.Pattern[str]:
    """The chain as a regular expression over the ``tok#i `` text of a sequence."""
    g = rf"(?:\S+ ){{0,{gap}}}"
    parts = []
    for i, link in enumerate(links):
        opt = link.endswith("?")
        tok = rf"{link.rstrip('?')}#\d+ "
        piece = (g if i else "") + tok
        parts.append(f"(?:{piece})?" if opt else piece)
    return re.compile("".join(parts))


def _optimizer_stats(rank: np.ndarray, tok: np.ndarray, dur: np.ndarray,
                     wait: np.ndarray) -> dict[int, dict[str, float]]:
    """Per rank with per-parameter or multi-tensor optimizer operators: their count, time and wait."""
    out: dict[int, dict[str, float]] = {}
    opt = tok == "optel"
    for r in np.unique(rank[opt]):
        mine = opt & (rank == r)
        out[int(r)] = {"ops": float(mine.sum()), "time_ns": float(np.nansum(dur[mine])),
                       "wait_ns": float(np.nansum(wait[mine])), "multi": 0.0}
    multi = tok == "multi"
    for r in np.unique(rank[multi]):
        out.setdefault(int(r), {"ops": 0.0, "time_ns": 0.0, "wait_ns": 0.0, "multi": 0.0})["multi"] = float(
            (multi & (rank == r)).sum())
    return out


@rule("CMP003", "compute.affinity-api", cause="compute.affinity_api", requires=("events", "steps"),
      thresholds=Thresholds, derived=("event_names", "host_op_top", "kernel_names", KERNEL_OPS))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank and pattern whose estimated saving is worth reporting."""
    ascend = bool(ctx.vendor_kernels)
    wanted = {p.strip() for p in ctx.t.patterns.split(",") if p.strip()}
    if "all" in wanted:
        wanted = {*PATTERNS, "optimizer"}
    if not ctx.query(ASCEND_TOKENS_SQL if ascend else KINETO_TOKENS_SQL)[0]["n"]:
        return
    ops = ctx.arrays(ASCEND_SQL if ascend else KINETO_SQL, codes=("tok", "name", "lane"))
    tok_all = np.array(ops.names["tok"], dtype=object)[ops["tok"]]
    if not ascend:
        _optimizer_inside(ctx, ops, tok_all)
        if note := kernel_tie_note(ctx):
            ctx.warn(note)
    if not len(tok_all):
        return
    rank_all, step_all, lane = ops["rank"], ops["step"], ops["lane"]
    has_step = step_all >= 0
    pairs = np.unique(np.stack([rank_all[has_step], step_all[has_step]]), axis=1)
    n_steps = dict(zip(*np.unique(pairs[0], return_counts=True), strict=True))
    # matches[(rank, pattern)] -> list of (step, names, total_ns, saving_ns)
    matches: dict[tuple[int, str], list[dict[str, Any]]] = {}
    patterns = [(key, _regex(links, ctx.t.max_gap)) for key, (_label, links, _fix) in PATTERNS.items()
                if key in wanted and not (ascend and key in KINETO_ONLY) and not (not ascend and key in ASCEND_ONLY)]
    # the operator sequence of each (rank, step, lane), in order of appearance (the rows come ordered by them;
    # an operator of an unknown thread is in none)
    name_all = np.array(ops.names["name"], dtype=object)[ops["name"]]
    dur_all = np.asarray(ops["dur_ns"], dtype=float)
    rows = np.flatnonzero(np.array([v is not None for v in ops.names["lane"]], dtype=bool)[lane])
    new = (np.diff(rank_all[rows]) != 0) | (np.diff(step_all[rows]) != 0) | (np.diff(lane[rows]) != 0)
    linked = (tok_all != "_") & (dur_all != 0)  # a link that took time (NaN counts: it is not known to be 0)
    for idx in np.split(rows, np.flatnonzero(new) + 1):
        if not len(idx) or not linked[idx].any():
            continue  # no chain link that took time in this sequence: no match can count
        rank, step = rank_all[idx[0]], step_all[idx[0]]
        toks, durs, names = tok_all[idx].tolist(), dur_all[idx].tolist(), name_all[idx].tolist()
        text = "".join(map("{}#{} ".format, toks, range(len(toks))))
        for key, pattern in patterns:
            for m in pattern.finditer(text):
                idx_m = [int(x) for x in re.findall(r"#(\d+)", m.group(0))]
                chain = [i for i in idx_m if toks[i] != "_"]
                times = [durs[i] for i in chain]
                if not sum(times):
                    continue  # nothing ran (e.g. .contiguous() on a tensor that already was): no cost to remove
                saving = sum(times) - max(times) if len(chain) > 1 else 0.0
                if key == "gelu":
                    saving = 0.0  # no measured FastGelu speed-up to apply; reported with its time only
                matches.setdefault((int(rank), key), []).append(
                    {"step": int(step), "ops": [names[i] for i in chain], "time_ns": sum(times), "saving_ns": saving})
    opt_stats = _optimizer_stats(rank_all[rows], tok_all[rows], dur_all[rows],
                                 np.asarray(ops["wait_ns"], dtype=float)[rows])
    platform = ctx.platform
    for (rank, key), ms in sorted(matches.items()):
        label, _links, fix = PATTERNS[key]
        fix = for_platform(fix, platform)
        steps = max(1, int(n_steps.get(rank, 1)))
        saving_us = sum(m["saving_ns"] for m in ms) / 1e3 / steps
        step_us = ctx.step_us(rank)
        if key != "gelu" and (not step_us or saving_us < ctx.t.min_saving_share * step_us):
            continue
        time_us = sum(m["time_ns"] for m in ms) / 1e3 / steps
        ms.sort(key=lambda m: -m["saving_ns"])
        yield ctx.finding(
            title=(f"Rank {rank}: {len(ms) / steps:.0f} {label} per step, {time_us:.0f} µs of operator time; "
                   f"use {fix.split(' / ')[0]}"),
            evidence={"pattern": key, "matches_per_step": round(len(ms) / steps, 2),
                      "chain_us_per_step": round(time_us, 2), "max_gap": ctx.t.max_gap, "steps": steps,
                      "data": "kernels" if ascend else "kineto"},
            saving_us=saving_us if key != "gelu" else None,
            step_us=step_us,
            severity=None if key != "gelu" else Severity.LOW,
            saving_basis="per step, each chain's time minus its longest operator (the chain as one operator of that "
            "cost)",
            ranks=[rank],
            ops=list(dict.fromkeys(o for m in ms for o in m["ops"]))[: ctx.t.top_n],
            detail=f"Fused replacement: {fix}.",
            top=[{"step": m["step"], "ops": " -> ".join(m["ops"]), "time_us": round(m["time_ns"] / 1e3, 2),
                  "saving_us": round(m["saving_ns"] / 1e3, 2)} for m in ms[: ctx.t.top_n]],
        )
    for rank, st in sorted(opt_stats.items()):
        steps = max(1, int(n_steps.get(rank, 1)))
        per_step = st["ops"] / steps
        if "optimizer" not in wanted or per_step < ctx.t.min_optimizer_ops or st["multi"] > 0:
            continue
        saving_ns = st["wait_ns"] if ascend else st["time_ns"]
        step_us = ctx.step_us(rank)
        yield ctx.finding(
            title=(f"Rank {rank}: {per_step:.0f} per-parameter optimizer operators per step and no multi-tensor "
                   f"(foreach / fused) optimizer"),
            evidence={"pattern": "per_parameter_optimizer", "optimizer_ops_per_step": round(per_step, 1),
                      "min_optimizer_ops": ctx.t.min_optimizer_ops,
                      "optimizer_us_per_step": round(st["time_ns"] / 1e3 / steps, 2),
                      "idle_between_us_per_step": round(st["wait_ns"] / 1e3 / steps, 2) if ascend else None,
                      "steps": steps, "data": "kernels" if ascend else "kineto"},
            saving_us=saving_ns / 1e3 / steps,
            step_us=step_us,
            saving_basis=("per step, the device idle time before each per-parameter optimizer task (Wait Time), which "
                          "one multi-tensor operator removes" if ascend else
                          "per step, the time of the per-tensor optimizer operators (upper bound of what a foreach / "
                          "fused optimizer replaces)"),
            ranks=[rank],
            detail="Use foreach=True / fused=True optimizers (torch.optim)"
            + (", torch_npu.optim.NpuFused* on Ascend." if platform in (None, "ascend") else "."),
        )
