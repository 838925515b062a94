"""Unsuitable software settings: debug logging, blocking launches, task queue off, mismatched versions.

## Why it matters
Hermes (Table 2) found environment configuration behind part of its CPU cases: high log levels,
debug switches left on in production, inconsistent driver / CANN versions across nodes. Debug
logging writes from the launch path of every operator; ``*_LAUNCH_BLOCKING=1`` makes every
launch synchronous; torch_npu with ``TASK_QUEUE_ENABLE=0`` launches operators on the Python
thread instead of its task-queue thread. Mismatched versions across ranks make some ranks
slower or change collective algorithms.

## How it is detected
From the ``meta`` table, which holds what the export recorded (torch_npu
``profiler_metadata.json`` ``ENV_VARIABLES`` as ``env.<NAME>``, ``profiler_info.json``
versions such as ``cann_version`` / ``torch_npu_version``). Checked:

* ``ASCEND_GLOBAL_LOG_LEVEL`` below ``min_log_level`` (0 debug, 1 info, 2 warning, 3 error);
* ``ASCEND_LAUNCH_BLOCKING`` / ``CUDA_LAUNCH_BLOCKING`` = 1;
* ``TASK_QUEUE_ENABLE`` = 0;
* debug switches: ``ASCEND_GLOBAL_EVENT_ENABLE`` = 1, ``ASCEND_SLOG_PRINT_TO_STDOUT`` = 1,
  ``NCCL_DEBUG`` / ``HCCL`` entry logging at INFO or TRACE, ``TORCH_DISTRIBUTED_DEBUG`` = DETAIL;
* every ``*version*`` key with different values on different ranks.

None of these has a cost the profile can measure, so findings carry no saving; severity is set
per setting (blocking launches high; debug / info logging, task queue off, version mismatch
medium; other debug switches low). Kineto traces record no environment: the rule is skipped
there (no ``meta`` rows) with that reason.

## What to do
Set ``ASCEND_GLOBAL_LOG_LEVEL=3``, unset ``*_LAUNCH_BLOCKING`` and debug switches outside
debugging, enable the task queue (``TASK_QUEUE_ENABLE=1`` or ``2``), and install the same
driver / firmware / CANN / framework versions on every node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU006."""

    min_log_level: int = knob(3, "ASCEND_GLOBAL_LOG_LEVEL below this is too verbose for training (3 = error)",
                              "Ascend CANN docs: 0 debug, 1 info, 2 warning, 3 error (default 3); Hermes Table 4 'reduce logging level'")


def _int(v: str) -> int | None:
    try:
        return int(str(v).strip())
    except ValueError:
        return None


def _level(v: str) -> int:
    """A log level as an int; unparsable / empty values count as the quiet default (no finding)."""
    n = _int(v)
    return 99 if n is None else n


def _on(v: str) -> bool:
    return str(v).strip().lower() in ("1", "true", "on", "yes")


# (variable, predicate(value, thresholds), severity, why)
CHECKS: tuple[tuple[str, Callable[[str, Thresholds], bool], Severity, str], ...] = (
    ("ASCEND_GLOBAL_LOG_LEVEL", lambda v, t: _level(v) < min(t.min_log_level, 2), Severity.MEDIUM,
     "debug / info logging writes from the launch path of every operator"),
    ("ASCEND_GLOBAL_LOG_LEVEL", lambda v, t: 2 <= _level(v) < t.min_log_level, Severity.LOW,
     "warning-level logging is more verbose than the recommended error level"),
    ("ASCEND_LAUNCH_BLOCKING", lambda v, t: _on(v), Severity.HIGH, "every operator launch waits for the device"),
    ("CUDA_LAUNCH_BLOCKING", lambda v, t: _on(v), Severity.HIGH, "every kernel launch waits for the device"),
    ("TASK_QUEUE_ENABLE", lambda v, t: str(v).strip() == "0", Severity.MEDIUM,
     "torch_npu launches operators on the Python thread instead of its task-queue thread"),
    ("ASCEND_GLOBAL_EVENT_ENABLE", lambda v, t: _on(v), Severity.LOW, "event logging is on"),
    ("ASCEND_SLOG_PRINT_TO_STDOUT", lambda v, t: _on(v), Severity.LOW, "CANN logs are printed to stdout"),
    ("HCCL_ENTRY_LOG_ENABLE", lambda v, t: _on(v), Severity.LOW, "HCCL logs every collective entry"),
    ("NCCL_DEBUG", lambda v, t: str(v).strip().upper() in ("INFO", "TRACE"), Severity.LOW, "NCCL debug logging is on"),
    ("TORCH_DISTRIBUTED_DEBUG", lambda v, t: str(v).strip().upper() == "DETAIL", Severity.MEDIUM,
     "DETAIL checks every collective's consistency across ranks (extra synchronisation)"),
)


@rule("CPU006", "cpu.environment-configuration", cause="cpu.environment_configuration",
      requires=("meta",), thresholds=Thresholds, scope="cluster")
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per (setting, value) with the ranks that have it, and per mismatched version key."""
    rows = ctx.query("SELECT rank, key, value FROM meta WHERE key IS NOT NULL AND value IS NOT NULL")
    env: dict[tuple[str, str], set[int]] = {}
    versions: dict[str, dict[str, set[int]]] = {}
    for r in rows:
        key, value, rank = str(r["key"]), str(r["value"]), r["rank"]
        ranks = set() if rank is None else {int(rank)}
        if key.startswith("env."):
            env.setdefault((key[4:], value), set()).update(ranks)
        if "version" in key.lower():
            versions.setdefault(key, {}).setdefault(value.strip(), set()).update(ranks)
    if not any(k.startswith("env.") for k in {str(r["key"]) for r in rows}):
        ctx.warn("no environment variables in the export's metadata: environment settings not checked")
    for (var, value), ranks in sorted(env.items()):
        for name, pred, sev, why in CHECKS:
            if name == var and pred(value, ctx.t):
                yield ctx.finding(
                    title=f"{var}={value} on {_ranks(ranks)}: {why}",
                    evidence={"variable": var, "value": value, "ranks_with_value": len(ranks),
                              "min_log_level": ctx.t.min_log_level if var == "ASCEND_GLOBAL_LOG_LEVEL" else None},
                    severity=sev, saving_basis="not measurable from the profile", ranks=ranks, ops=[var],
                )
    for key, values in sorted(versions.items()):
        if len(values) < 2:
            continue
        ordered = sorted(values.items(), key=lambda x: -len(x[1]))
        top = [{"value": v, "ranks": sorted(r)} for v, r in ordered]
        yield ctx.finding(
            title=f"{key} differs across ranks: " + "; ".join(f"{v} on {_ranks(r)}" for v, r in ordered[:4]),
            evidence={"key": key, "distinct_values": len(values), "values": " | ".join(sorted(values))},
            severity=Severity.MEDIUM, saving_basis="not measurable from the profile",
            ranks=set().union(*values.values()), ops=[key], top=top,
        )


def _ranks(ranks: set[int] | list[int]) -> str:
    r = sorted(ranks)
    if not r:
        return "all ranks"
    if len(r) == 1:
        return f"rank {r[0]}"
    return f"{len(r)} ranks ({', '.join(map(str, r[:6]))}{' …' if len(r) > 6 else ''})"
