"""Communication-library environment variables set to values known to slow collectives.

## Why it matters
HCCL and NCCL pick transports, algorithms and buffer sizes themselves; a leftover debugging
variable or a value copied from another cluster can force traffic through host memory or TCP,
split large collectives, or pin a poor algorithm. Hermes (§4.2.2, Table 3, *network
configuration*) checks HCCL environment variables among the network causes.

## How it is detected
The profile's metadata (``meta`` rows ``env.<NAME>``, e.g. written from ``profiler_metadata.json``)
is compared with a short table of documented settings (``CHECKS`` below, each with its source):
NCCL peer-to-peer / shared-memory / InfiniBand transports disabled, GPUDirect RDMA off, forced
NCCL protocol or algorithm, NCCL / HCCL buffers below their defaults, forced HCCL algorithm,
intra-server traffic forced onto RoCE, HCCL RDMA traffic class / service level off their defaults.
One finding lists every off value with the ranks that have it; its severity is the highest of the
matched checks (the effect cannot be timed from a profile). Without any ``env.*`` metadata the rule
says so and does nothing. It states no counterfactual to replay: what the recommended value changes
(another transport, algorithm or buffer size, chosen by the library) has no bandwidth or time the
profile records.

## What to do
Unset debugging and forcing variables, restore defaults unless a measured benchmark on this
cluster says otherwise, and make RDMA traffic class / service level match the switch
configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from advisor.engine.rule import NoThresholds, RuleContext, rule
from advisor.model import Finding, Severity

NCCL_ENV = "NCCL environment variables, docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
HCCL_ENV = "HCCL environment variables, hiascend.com CANN documentation"
MSTT_ENV = "msprof-analyze advisor environment_variable_info.yaml"


def _truthy(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "yes", "on")


def _num_below(limit: float) -> Callable[[str], bool]:
    def f(v: str) -> bool:
        try:
            return float(v.strip()) < limit
        except ValueError:
            return False
    return f


def _set(v: str) -> bool:
    return v.strip() != ""


def _not(expected: str) -> Callable[[str], bool]:
    return lambda v: v.strip() != "" and v.strip() != expected


@dataclass(frozen=True, slots=True)
class EnvCheck:
    """One documented setting: when the value is off, why it hurts, what to set, and where that is written."""

    name: str
    bad: Callable[[str], bool]
    why: str
    recommended: str
    severity: Severity
    source: str


CHECKS: tuple[EnvCheck, ...] = (
    EnvCheck("NCCL_P2P_DISABLE", _truthy, "disables NVLink / PCIe peer-to-peer: intra-node traffic goes through "
             "host memory", "unset", Severity.MEDIUM, NCCL_ENV),
    EnvCheck("NCCL_SHM_DISABLE", _truthy, "disables the shared-memory transport between processes of a node",
             "unset", Severity.LOW, NCCL_ENV),
    EnvCheck("NCCL_IB_DISABLE", _truthy, "disables InfiniBand / RoCE: inter-node traffic falls back to TCP sockets",
             "unset", Severity.MEDIUM, NCCL_ENV),
    EnvCheck("NCCL_NET_GDR_LEVEL", lambda v: v.strip().upper() in ("0", "LOC"),
             "disables GPUDirect RDMA: network transfers are staged through host memory", "unset", Severity.LOW,
             NCCL_ENV),
    EnvCheck("NCCL_PROTO", _set, "forces the protocol; NCCL discourages setting it except to work around a bug",
             "unset", Severity.LOW, NCCL_ENV),
    EnvCheck("NCCL_ALGO", _set, "forces the algorithm instead of NCCL's per-size tuning", "unset", Severity.LOW,
             NCCL_ENV),
    EnvCheck("NCCL_BUFFSIZE", _num_below(4 * 1024 * 1024), "buffer below the 4 MiB default: more, smaller steps",
             "unset (4194304)", Severity.LOW, NCCL_ENV),
    EnvCheck("HCCL_ALGO", _set, "forces the inter-server algorithm instead of HCCL's automatic choice",
             "unset", Severity.LOW, MSTT_ENV),
    EnvCheck("HCCL_BUFFSIZE", _num_below(200), "buffer below the 200 MB default: large collectives are split",
             "unset (200)", Severity.LOW, HCCL_ENV),
    EnvCheck("HCCL_INTRA_ROCE_ENABLE", _truthy, "sends intra-server traffic through the RoCE NIC instead of "
             "HCCS / PCIe", "unset (0)", Severity.MEDIUM, HCCL_ENV),
    EnvCheck("HCCL_RDMA_TC", _not("132"), "RoCE traffic class differs from the default 132 (DSCP 33); it must match "
             "the switch QoS configuration", "132, or the switch's DSCP × 4", Severity.LOW, MSTT_ENV),
    EnvCheck("HCCL_RDMA_SL", _not("4"), "RDMA service level differs from the default 4; it must equal the NIC's PFC "
             "priority", "4, or the PFC priority", Severity.LOW, MSTT_ENV),
)

SQL = """
SELECT rank, substr(key, 5) AS name, value FROM meta
WHERE key LIKE 'env.%' AND list_contains($names, substr(key, 5))
ORDER BY name, rank
"""


@rule("COM007", "comm.network-configuration", cause="comm.network_configuration", requires=("meta",),
      thresholds=NoThresholds, scope="cluster")
def check(ctx: RuleContext[NoThresholds]) -> Iterator[Finding]:
    """One finding listing the communication env variables set off their recommended values."""
    n_env = ctx.query("SELECT count(*) AS n FROM meta WHERE key LIKE 'env.%'")[0]["n"]
    if not n_env:
        ctx.warn("the profile's metadata holds no environment variables (env.*): HCCL / NCCL settings cannot be "
                 "checked")
        return
    by_name = {c.name: c for c in CHECKS}
    rows = ctx.query(SQL, {"names": list(by_name)})
    hits: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        c = by_name[r["name"]]
        value = "" if r["value"] is None else str(r["value"])
        if c.bad(value):
            hits.setdefault((c.name, value), []).append(-1 if r["rank"] is None else int(r["rank"]))
    if not hits:
        return
    checks = [by_name[n] for n, _ in hits]
    severity = max(c.severity for c in checks)
    ranks = sorted({r for rs in hits.values() for r in rs if r >= 0})
    names = list(dict.fromkeys(n for n, _ in hits))
    yield ctx.finding(
        title=f"{len(names)} communication setting(s) off their recommended values: "
              + ", ".join(f"{n}={v}" for n, v in list(hits)[:4]) + (" …" if len(hits) > 4 else ""),
        evidence={
            "settings_off": len(names),
            "env_variables_seen": int(n_env),
            **{f"env.{n}": v for n, v in hits},
        },
        severity=severity,
        saving_basis="not measurable from a profile: compare a run with the recommended values",
        replay={"estimated": False, "reason": "what the recommended values change (the transport, algorithm or "
                "buffer size the library then picks) has no bandwidth or time this profile records: no "
                "counterfactual to replay"},
        ranks=ranks,
        top=[{"variable": n, "value": v, "ranks": ", ".join(map(str, rs)) if rs != [-1] else "all",
              "why": by_name[n].why, "recommended": by_name[n].recommended, "severity": by_name[n].severity.label,
              "source": by_name[n].source}
             for (n, v), rs in hits.items()],
    )
