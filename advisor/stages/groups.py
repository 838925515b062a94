"""Parallel groups of a job and their kind (data-, tensor-, pipeline-, expert-parallel), from who talks to whom.

LLMPrism §IV-B tells data- from pipeline-parallel communication by the sizes a pair of ranks
exchanges within one step: pipeline stages send one activation (or its gradient) of a fixed size
per micro-batch, so a pipeline pair sees **one distinct size per step**; data-parallel gradient
synchronisation is split into buckets of different sizes, so a data-parallel pair sees **many**.
The mode over the steps absorbs noisy steps, and data parallelism is transitive: when (u, v) and
(v, w) are DP pairs, so is (u, w) (connected components of the DP graph).

Here the communication operators of ``comm_ops`` carry their group (``group_name``), so the unit
is a group rather than a pair, and the operator type is known: a group whose operators are
point-to-point (send / recv) is a pipeline group, one of all-to-alls an expert-parallel group.
For the collectives the size rule decides data parallelism (more than one distinct size per rank
and step), and tensor parallelism is ours: a collective group that stays inside one node (every
member on one host, or its bytes moving only over intra-node transports: HCCS, SIO, SDMA, NVLink,
PCIe) and that runs inside the forward pass of every micro-step (at least ``TP_MIN_CALLS`` calls
per step, some of them in the first ``EARLY_POS`` of the step window), with few distinct sizes (the
activation of every layer has the same shape). A group holding every rank of a job that has other
groups is the ``world`` group. Groups named nowhere: the point-to-point pairs of ``comm_matrix``
(Kineto send / recv) are classed by the paper's rule itself, with the transitive refinement.

Where the export names the groups (Ascend ``profiler_metadata.json`` ``parallel_group_info``:
``comm_groups.pg_name`` dp / tp / pp ...; Kineto: a process-group name or description in
``comm_ops.group_name`` such as Megatron's ``TENSOR_MODEL_PARALLEL_GROUP``), the exported kind is
kept beside the inferred one and a disagreement is reported.

Pipeline stages: the ranks joined by the non-pipeline groups (data, tensor, expert), ordered by
their position inside the pipeline groups (the exported group-rank order where known).

Reads only the cluster's small tables (comm_ops, comm_groups, comm_bandwidth, comm_matrix, meta,
steps, ranks) and the breakdown, so it runs on a reduced cluster as well as on one database.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

KINDS = ("dp", "tp", "pp", "ep", "cp", "world", "unknown")
P2P_TYPES = ("send", "recv", "sendrecv", "isend", "irecv", "batchisendirecv", "receive")
A2A_TYPES = ("alltoall", "alltoallv")
INTRA_TRANSPORTS = ("HCCS", "SIO", "SDMA", "NVLINK", "PCIE", "SHM", "P2P", "LOCAL", "XGMI")
INTER_TRANSPORTS = ("RDMA", "ROCE", "NET", "IB", "TCP", "SOCKET")
#: a tensor-parallel group calls at least this many collectives per step (one per layer or more)
TP_MIN_CALLS = 2
#: ... some of them (share >= TP_MIN_EARLY_SHARE) start in this first part of the step (the forward pass)
EARLY_POS = 0.4
TP_MIN_EARLY_SHARE = 0.2
#: at most this many distinct sizes per step for tensor parallelism (activations of one shape)
TP_MAX_SIZES = 2

_TOKENS: tuple[tuple[str, frozenset[str]], ...] = (
    ("world", frozenset({"default", "world", "global"})),
    ("dp", frozenset({"dp", "data", "ddp", "fsdp", "zero"})),
    ("tp", frozenset({"tp", "tensor", "tmp"})),
    ("pp", frozenset({"pp", "pipeline", "pipe"})),
    ("ep", frozenset({"ep", "expert", "moe"})),
    ("cp", frozenset({"cp", "context"})),
)

OPS_SQL = f"""
WITH o AS (
    SELECT c.group_name AS g, c.rank, coalesce(c.step, -1) AS step, c.bytes, c.dur_ns,
           replace(lower(coalesce(c.op_type, '')), '_', '') AS t,
           (c.start_ns - s.start_ns) / nullif(s.end_ns - s.start_ns, 0) AS pos
    FROM comm_ops c LEFT JOIN steps s ON s.rank = c.rank AND s.step = coalesce(c.step, -1)
    WHERE c.group_name IS NOT NULL AND c.group_name <> ''
)
SELECT g, rank, step, count(*) AS n, count(DISTINCT bytes) AS sizes, sum(bytes) AS bytes, sum(dur_ns) AS dur_ns,
       count(*) FILTER (WHERE t IN {P2P_TYPES}) AS p2p, count(*) FILTER (WHERE t IN {A2A_TYPES}) AS a2a,
       count(*) FILTER (WHERE pos IS NOT NULL AND pos < {EARLY_POS}) AS early,
       count(*) FILTER (WHERE pos IS NOT NULL) AS placed
FROM o GROUP BY ALL ORDER BY g, rank, step
"""

TRANSPORT_SQL = """
SELECT group_name AS g, upper(transport) AS transport, sum(coalesce(bytes, 0)) AS bytes
FROM comm_bandwidth WHERE group_name IS NOT NULL AND transport IS NOT NULL GROUP BY ALL
"""

PAIRS_SQL = """
SELECT least(src_rank, dst_rank) AS a, greatest(src_rank, dst_rank) AS b, coalesce(step, -1) AS step,
       count(DISTINCT bytes) AS sizes, sum(bytes) AS bytes, count(*) AS n
FROM comm_matrix
WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank
  AND starts_with(lower(coalesce(transport, '')), 'kineto:')
GROUP BY ALL ORDER BY a, b, step
"""


def exported_kind(name: str | None) -> str | None:
    """The parallel kind a process-group name states (``dp``, ``TENSOR_MODEL_PARALLEL_GROUP``,
    ``default_group`` ...), None when it states none."""
    if not name:
        return None
    tokens = set(re.split(r"[^a-z0-9]+", str(name).lower()))
    for kind, words in _TOKENS:
        if tokens & words:
            return kind
    return None


def _mode(values: Iterable[int]) -> int:
    c = Counter(values)
    if not c:
        return 0
    top = max(c.values())
    return min(v for v, n in c.items() if n == top)  # ties: the smaller (the paper's PP side)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def _rows(cur: Any, sql: str) -> list[dict[str, Any]]:
    """The rows of ``sql`` run on ``cur`` (a cursor, or a connection its thread alone uses) as dicts."""
    try:
        res = cur.execute(sql)
    except Exception:  # noqa: BLE001 -- a context built from a few tables lacks this one: no rows
        return []
    cols = [d[0] for d in res.description]
    return [dict(zip(cols, r, strict=True)) for r in res.fetchall()]


def _nodes(cur: Any) -> tuple[dict[int, str], str | None]:
    """rank -> host name and where it comes from: the export's host names (Ascend device_info hostname,
    any ``*hostname`` key, a Kineto trace's top-level ``host_name``), else, when every rank knows how many devices its host has, the usual
    launch (one process per device, ranks filling the nodes in order: node = rank // devices)."""
    out: dict[int, str] = {}
    for r in _rows(cur, "SELECT rank, min(value) AS v FROM meta WHERE rank IS NOT NULL AND "
                        "(lower(key) LIKE '%hostname' OR lower(key) IN ('host', 'host_name', 'node')) GROUP BY rank"):
        if r["v"]:
            out[int(r["rank"])] = str(r["v"])
    if out:
        return out, "host names"
    counts = {int(r["rank"]): r["n"] for r in _rows(cur, "SELECT rank, device_count AS n FROM ranks WHERE rank IS NOT NULL")}
    if counts and all(n and int(n) > 0 for n in counts.values()):
        return {r: f"node{r // int(n)}" for r, n in counts.items()}, "device count (rank // devices per host)"
    return {}, None


class _UF:
    def __init__(self) -> None:
        self.p: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.p.setdefault(x, x)
        while self.p[x] != x:
            self.p[x] = self.p[self.p[x]]
            x = self.p[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)

    def groups(self) -> list[list[int]]:
        out: dict[int, list[int]] = {}
        for x in self.p:
            out.setdefault(self.find(x), []).append(x)
        return sorted(sorted(v) for v in out.values())


def _classify(ev: dict[str, Any], n_members: int, world: int, n_groups: int) -> tuple[str, str]:
    """(kind, basis) of one group from its evidence."""
    if ev["p2p_share"] >= 0.5:
        return "pp", (f"point-to-point operators ({ev['p2p_share']:.0%} of its calls); "
                      f"{ev['sizes_per_step']} distinct size(s) per step (LLMPrism: one size = pipeline)")
    if ev["a2a_share"] >= 0.5:
        return "ep", f"all-to-all operators ({ev['a2a_share']:.0%} of its calls)"
    if n_members >= world > 2 and n_groups > 1:
        return "world", f"holds all {world} ranks beside smaller groups"
    intra = ev["inter_node"] is False
    if (intra and ev["calls_per_step"] >= TP_MIN_CALLS and ev["early_share"] >= TP_MIN_EARLY_SHARE
            and ev["sizes_per_step"] <= TP_MAX_SIZES):
        return "tp", (f"collectives inside one node, {ev['calls_per_step']:g} calls per step, "
                      f"{ev['early_share']:.0%} in the forward part of the step, "
                      f"{ev['sizes_per_step']} distinct size(s) per step")
    if ev["sizes_per_step"] > 1:
        return "dp", (f"{ev['sizes_per_step']} distinct sizes per step "
                      "(LLMPrism: many sizes = data-parallel gradient buckets)")
    if ev["calls_per_step"] > 0:
        return "dp", ("collectives of one size per step outside the forward part "
                      "(one gradient bucket; the size rule alone cannot tell)")
    return "unknown", "no operator in any step"


def reconstruct(con: Any) -> dict[str, Any] | None:
    """The ``parallel_groups`` report field: one entry per group (name, exported name and kind, inferred
    kind and its basis and evidence, members), the layout (how many groups of each kind and their
    size), the pipeline stages, and the disagreements with the export. None without communication."""
    cur = con.cursor()
    try:
        return _reconstruct(cur)
    finally:
        cur.close()


def _reconstruct(cur: Any) -> dict[str, Any] | None:
    rows = _rows(cur, OPS_SQL)
    if not rows:  # no named group: the point-to-point pairs alone can give groups
        pairs = _rows(cur, PAIRS_SQL)
        return _finish([], "names", pairs, *_nodes(cur)) if pairs else None
    world_ranks = sorted({int(r["rank"]) for r in _rows(cur, "SELECT DISTINCT rank FROM ranks WHERE rank IS NOT NULL")})
    exported = _rows(cur, "SELECT group_name, rank, pg_name, comm_name, global_ranks FROM comm_groups")
    nodes, nodes_from = _nodes(cur)
    transports: dict[str, dict[str, int]] = {}
    for t in _rows(cur, TRANSPORT_SQL):
        transports.setdefault(str(t["g"]), {})[str(t["transport"])] = int(t["bytes"] or 0)
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(str(r["g"]), []).append(r)
    exp_by: dict[str, dict[str, Any]] = {}
    for e in exported:
        d = exp_by.setdefault(str(e["group_name"]), {"pg": Counter(), "members": None, "order": None})
        if e["pg_name"]:
            d["pg"][str(e["pg_name"])] += 1
        if e["global_ranks"] and d["order"] is None:
            try:
                order = [int(x) for x in json.loads(str(e["global_ranks"]))]
            except (ValueError, TypeError):
                order = []
            if order:
                d["order"], d["members"] = order, sorted(order)
    all_ranks = sorted(set(world_ranks) | {int(r["rank"]) for r in rows})
    world = len(all_ranks)
    groups: list[dict[str, Any]] = []
    multi = [g for g, rs in by_group.items() if len({int(r["rank"]) for r in rs}) >= 2
             or len((exp_by.get(g) or {}).get("members") or []) >= 2]
    for g in sorted(by_group):
        rs = by_group[g]
        seen = sorted({int(r["rank"]) for r in rs})
        exp = exp_by.get(g)
        members = (exp or {}).get("members") or seen
        if len(members) < 2:
            continue
        per_step: dict[int, list[dict[str, Any]]] = {}
        for r in rs:
            per_step.setdefault(int(r["step"]), []).append(r)
        n_all = sum(int(r["n"]) for r in rs)
        placed = sum(int(r["placed"]) for r in rs)
        tr = transports.get(g, {})
        inter_b = sum(v for k, v in tr.items() if k in INTER_TRANSPORTS)
        intra_b = sum(v for k, v in tr.items() if k in INTRA_TRANSPORTS)
        hosts = {nodes[m] for m in members if m in nodes}
        all_placed = bool(hosts) and all(m in nodes for m in members)
        inter_node: bool | None = None
        if nodes_from == "host names" and all_placed:  # the export's host names, then the transports, then a guess
            inter_node = len(hosts) > 1
        elif inter_b > 0 or intra_b > 0:
            inter_node = inter_b > 0
        elif all_placed:
            inter_node = len(hosts) > 1
        ev = {
            "sizes_per_step": _mode(int(r["sizes"]) for r in rs),
            "calls_per_step": _median([_median([float(r["n"]) for r in v]) for v in per_step.values()]),
            "bytes_per_step": int(_median([_median([float(r["bytes"] or 0) for r in v]) for v in per_step.values()])),
            "comm_us_per_step": round(_median([_median([float(r["dur_ns"] or 0) for r in v])
                                               for v in per_step.values()]) / 1000.0, 3),
            "p2p_share": round(sum(int(r["p2p"]) for r in rs) / n_all, 3) if n_all else 0.0,
            "a2a_share": round(sum(int(r["a2a"]) for r in rs) / n_all, 3) if n_all else 0.0,
            "early_share": round(sum(int(r["early"]) for r in rs) / placed, 3) if placed else 0.0,
            "inter_node": inter_node,
            "hosts": len(hosts) or None,
            "node_basis": ("host names" if nodes_from == "host names" and all_placed else "transports"
                           if inter_b > 0 or intra_b > 0 else nodes_from if all_placed else None),
            "steps": len(per_step),
        }
        kind, basis = _classify(ev, len(members), world, len(multi))
        pg = (exp or {}).get("pg") or Counter()
        exp_name = pg.most_common(1)[0][0] if pg else None
        ek = exported_kind(exp_name) if exp_name else exported_kind(g)
        groups.append({
            "name": g[:80],
            "exported_name": None if exp_name is None else exp_name[:80],
            "exported_kind": ek,
            "kind": kind,
            "agrees": None if ek is None or kind == "unknown" else ek == kind,
            "basis": basis,
            "members": members,
            "size": len(members),
            "members_seen": len(seen),
            "order": (exp or {}).get("order") or members,
            "evidence": ev,
        })
    pairs = [] if any(g["kind"] == "pp" for g in groups) else _rows(cur, PAIRS_SQL)
    return _finish(groups, "names", pairs, nodes, nodes_from)


def _finish(groups: list[dict[str, Any]], source: str, pairs: list[dict[str, Any]], nodes: dict[int, str],
            nodes_from: str | None = None) -> dict[str, Any] | None:
    """The ``parallel_groups`` field from the groups named by the operators and the point-to-point
    ``pairs`` (read when no named group is a pipeline group); None without any group."""
    if pairs:
        pair_groups = _pair_groups(pairs)
        if pair_groups:
            source = "names+pairs" if groups else "pairs"
            groups.extend(pair_groups)
    if not groups:
        return None
    mismatches = [
        f"group {g['name']} ({g['exported_name'] or g['name']}): exported as {g['exported_kind']}, "
        f"its communication says {g['kind']} ({g['basis']})"
        for g in groups if g["agrees"] is False
    ]
    stages = pipeline_stages(groups)
    layout: dict[str, Any] = {}
    for k in KINDS:
        sizes = sorted({g["size"] for g in groups if g["kind"] == k})
        if sizes:
            layout[k] = {"groups": sum(1 for g in groups if g["kind"] == k), "sizes": sizes}
    for grp in groups:
        grp.pop("order", None)
    groups.sort(key=lambda g: (KINDS.index(g["kind"]), g["members"][0], g["name"]))
    return {
        "source": source,
        "groups": groups,
        "layout": layout,
        "stages": stages,
        "mismatches": mismatches,
        "nodes_known": bool(nodes),
        "nodes_from": nodes_from,
    }


def _pair_groups(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LLMPrism Alg. 2 on point-to-point pairs: the mode over steps of the distinct sizes a pair
    exchanges per step; one size -> pipeline pair, more -> data-parallel pair; data-parallel pairs
    joined transitively (connected components)."""
    by_pair: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for p in pairs:
        by_pair.setdefault((int(p["a"]), int(p["b"])), []).append(p)
    dp, pp = _UF(), _UF()
    info: dict[tuple[int, int], int] = {}
    for (a, b), rs in by_pair.items():
        m = _mode(int(r["sizes"]) for r in rs)
        info[(a, b)] = m
        (pp if m <= 1 else dp).union(a, b)
    dp_sets = dp.groups()
    dp_of = {r: i for i, s in enumerate(dp_sets) for r in s}
    out: list[dict[str, Any]] = []
    for i, s in enumerate(dp_sets):
        out.append(_pair_group(f"pairs:dp{i}", s, "dp", "pairs exchanging many sizes per step, joined transitively",
                               [m for (a, b), m in info.items() if a in s and b in s]))
    for i, s in enumerate(pp.groups()):
        s2 = [r for r in s if not any(r in d and any(x in d for x in s if x != r) for d in dp_sets)]
        if len(s2) < 2 or any(dp_of.get(a) is not None and dp_of.get(a) == dp_of.get(b) for a in s2 for b in s2 if a < b):
            continue
        out.append(_pair_group(f"pairs:pp{i}", s2, "pp", "pairs exchanging one size per step",
                               [m for (a, b), m in info.items() if a in s2 and b in s2]))
    return out


def _pair_group(name: str, members: list[int], kind: str, basis: str, modes: list[int]) -> dict[str, Any]:
    return {
        "name": name, "exported_name": None, "exported_kind": None, "kind": kind, "agrees": None,
        "basis": f"LLMPrism pair rule: {basis}", "members": members, "size": len(members),
        "members_seen": len(members), "order": members,
        "evidence": {"sizes_per_step": _mode(modes), "pairs": len(modes)},
    }


def pipeline_stages(groups: list[dict[str, Any]]) -> list[list[int]]:
    """Ranks of each pipeline stage, first stage first; empty without pipeline groups.

    A stage is a connected set of ranks under the data-, tensor-, expert- and context-parallel groups;
    stages are ordered by the mean position of their ranks inside the pipeline groups."""
    pps = [g for g in groups if g["kind"] == "pp"]
    if not pps:
        return []
    uf = _UF()
    for g in groups:
        if g["kind"] in ("dp", "tp", "ep", "cp"):
            ms = g["members"]
            for m in ms:
                uf.union(ms[0], m)
    pos: dict[int, list[int]] = {}
    for g in pps:
        for i, r in enumerate(g.get("order") or g["members"]):
            uf.find(r)
            pos.setdefault(r, []).append(i)
    comps = [c for c in uf.groups() if any(r in pos for r in c)]
    if len(comps) < 2:
        return []

    def key(c: list[int]) -> tuple[float, int]:
        ps = [p for r in c for p in pos.get(r, [])]
        return (sum(ps) / len(ps), c[0])

    return sorted(comps, key=key)


_LOCK = threading.Lock()


def _no_comm(analysis: Any) -> bool:
    """Whether the analysis knows ``comm_ops`` and ``comm_matrix`` to hold no row (its cached counts),
    the only tables :func:`reconstruct` finds groups in."""
    try:
        return not analysis.rows("comm_ops") and not analysis.rows("comm_matrix")
    except Exception:  # noqa: BLE001 -- a context built from a few tables: reconstruct says
        return False


def of_context(analysis: Any) -> dict[str, Any] | None:
    """:func:`reconstruct` once per analysis (rules and the report share it)."""
    extras = analysis.extras
    with _LOCK:
        if "parallel_groups" not in extras:
            try:
                extras["parallel_groups"] = None if _no_comm(analysis) else reconstruct(analysis.con)
            except Exception as exc:  # noqa: BLE001 -- the analysis goes on without groups, and says so
                from advisor.model import Warning_

                extras["parallel_groups"] = None
                analysis.warnings.append(Warning_("parallel_groups", f"parallel groups not reconstructed: {exc}"))
        return extras["parallel_groups"]  # type: ignore[no-any-return]



# -- the timeline picture: ranks x steps ------------------------------------------------------------

#: rows of the picture at most; more ranks are aggregated by group
MAX_ROWS = 64
#: steps (columns) at most; the first ones are kept
MAX_STEPS = 120


def _span(rs: Sequence[int]) -> str:
    from advisor.text import spans

    return spans(sorted(rs))


def _partition(pg: dict[str, Any] | None, ranks: list[int], max_rows: int) -> tuple[str, list[list[int]]]:
    """Rows of the picture: one per rank, or, with more than ``max_rows`` ranks, one per group of the
    kind whose groups split the ranks into the most rows that still fit (pipeline stage, DP, TP, PP
    groups), else runs of consecutive ranks."""
    if len(ranks) <= max_rows:
        return "rank", [[r] for r in ranks]
    have = set(ranks)
    options: list[tuple[str, list[list[int]]]] = []
    if pg:
        if pg.get("stages"):
            options.append(("stage", [[r for r in st if r in have] for st in pg["stages"]]))
        for kind in ("tp", "dp", "pp", "ep"):
            sets = [[r for r in g["members"] if r in have] for g in pg["groups"] if g["kind"] == kind]
            options.append((kind, [s for s in sets if s]))
    best: tuple[str, list[list[int]]] | None = None
    for kind, sets in options:
        flat = [r for s in sets for r in s]
        if len(flat) != len(have) or set(flat) != have or not 1 < len(sets) <= max_rows:
            continue  # not a partition of the ranks, or too many rows
        if best is None or len(sets) > len(best[1]):
            best = (kind, sets)
    if best is not None:
        return best[0], sorted((sorted(s) for s in best[1]), key=lambda s: s[0])
    per = -(-len(ranks) // max_rows)
    return "ranks", [ranks[i:i + per] for i in range(0, len(ranks), per)]


def step_matrix(bd: Any, pg: dict[str, Any] | None, *, no_step: int = -1, max_rows: int = MAX_ROWS,
                max_steps: int = MAX_STEPS) -> dict[str, Any] | None:
    """The ``step_matrix`` report field: ranks x steps, each cell the rank's own time in that step (the
    step minus its not-overlapped communication: in synchronous training every rank's step time is the
    same, its own work is not) divided by the median over every cell, with the groups each row belongs
    to; rows aggregated by group (each cell the slowest member's) when there are more than ``max_rows``
    ranks. None with fewer than two ranks or no step."""
    if bd is None or bd.empty:
        return None
    bd = bd[bd["step"] != no_step]
    ranks = sorted({int(r) for r in bd["rank"]})
    steps_all = sorted({int(s) for s in bd["step"]})
    if len(ranks) < 2 or not steps_all:
        return None
    steps = steps_all[:max_steps]
    own: dict[tuple[int, int], float] = {}
    for r, s, st, co in zip(bd["rank"], bd["step"], bd["step_us"], bd["comm_only_us"], strict=True):
        if int(s) in steps:
            own[(int(r), int(s))] = max(float(st) - float(co), 0.0)
    med = _median(list(own.values()))
    if med <= 0:
        return None
    med_step = _median([float(x) for x in bd["step_us"]])
    stage_of = {r: i for i, st in enumerate((pg or {}).get("stages") or []) for r in st}
    marks: dict[int, list[str]] = {}
    for g in (pg or {}).get("groups") or []:
        if g["kind"] in ("dp", "tp", "pp", "ep"):
            same = [x for x in (pg or {}).get("groups", []) if x["kind"] == g["kind"]]
            for r in g["members"]:
                marks.setdefault(r, []).append(f"{g['kind']}{same.index(g)}")
    by, rows_sets = _partition(pg, ranks, max_rows)
    if by == "rank" and stage_of:
        rows_sets.sort(key=lambda s: (stage_of.get(s[0], -1), s[0]))
    rows = []
    worst: list[dict[str, Any]] = []
    for members in rows_sets:
        cells: list[float | None] = []
        for s in steps:
            vals = [(own[(r, s)], r) for r in members if (r, s) in own]
            if not vals:
                cells.append(None)
                continue
            v, r = max(vals)
            cells.append(round(v / med, 3))
            worst.append({"rank": r, "step": s, "slowdown": round(v / med, 3)})
        stages = sorted({stage_of[r] for r in members if r in stage_of})
        label = f"rank {members[0]}" if len(members) == 1 else f"{by} ranks {_span(members)}"
        row_marks = sorted({m for r in members for m in marks.get(r, [])}) if len(members) == 1 else []
        rows.append({
            "label": label,
            "ranks": _span(members),
            "stage": stages[0] if len(stages) == 1 else None,
            "groups": " ".join(row_marks),
            "cells": cells,
        })
    worst.sort(key=lambda w: (-w["slowdown"], w["rank"], w["step"]))
    return {
        "metric": "own_us",
        "basis": "the rank's own time in the step (step minus not-overlapped communication) / the median over "
                 "all cells; aggregated rows show their slowest member",
        "median_own_us": round(med, 3),
        "median_step_us": round(med_step, 3),
        "steps": steps,
        "steps_total": len(steps_all),
        "ranks": len(ranks),
        "aggregated_by": None if by == "rank" else by,
        "stages": len((pg or {}).get("stages") or []),
        "rows": rows,
        "max_slowdown": worst[0]["slowdown"] if worst else None,
        "worst": worst[:5],
    }

