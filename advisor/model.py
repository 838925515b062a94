"""Plain data passed between the engine and the renderers: findings, warnings, the report."""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA_ID = "advisor.report/v1"


def clean(value: Any) -> Any:
    """Make a value strict-JSON safe: NaN/Infinity -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if hasattr(value, "item"):  # numpy / pandas scalar
        try:
            return clean(value.item())
        except (ValueError, TypeError):
            pass
    return str(value)


class Severity(enum.IntEnum):
    """Finding severity; ordered so that ``max()`` and comparisons work."""

    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @property
    def label(self) -> str:
        """Lower-case name used in reports and on the command line."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        """Parse a severity name (case-insensitive)."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}; use one of {', '.join(s.label for s in cls)}") from None


# Share of the step saved -> severity (CAUSES.md): critical >= 20 %, high >= 10 %, medium >= 3 %, low > 0.
SEVERITY_CUTOFFS: tuple[tuple[float, Severity], ...] = (
    (0.20, Severity.CRITICAL),
    (0.10, Severity.HIGH),
    (0.03, Severity.MEDIUM),
)


def severity_for_fraction(fraction: float | None) -> Severity:
    """Map an estimated saving (share of the step, 0..1) to a severity, as CAUSES.md defines."""
    if fraction is None or fraction <= 0:
        return Severity.INFO
    for cutoff, sev in SEVERITY_CUTOFFS:
        if fraction >= cutoff:
            return sev
    return Severity.LOW


BOTTLENECK_OF_PREFIX = {
    "parallel": "parallel",
    "io": "io",
    "cpu": "cpu",
    "compute": "computation",
    "comm": "communication",
    "cluster": "cluster",
    "memory": "memory",
}


def bottleneck_of(cause: str) -> str:
    """The report's ``bottleneck`` for a cause id (``comm.x`` -> ``communication``)."""
    prefix = cause.split(".", 1)[0]
    return BOTTLENECK_OF_PREFIX.get(prefix, prefix)


@dataclass(frozen=True, slots=True)
class Optimization:
    """One optimization from the cause map."""

    id: str
    title: str
    how: str = ""


@dataclass(frozen=True, slots=True)
class Warning_:
    """An input problem met, or an analysis that could not run, and why."""

    code: str
    message: str
    path: str | None = None

    def to_json(self) -> dict[str, str]:
        """JSON form (contract: code, message, optional path)."""
        out = {"code": self.code, "message": self.message}
        if self.path is not None:
            out["path"] = self.path
        return out


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosed bottleneck cause, with the numbers it was decided on."""

    rule: str
    cause: str
    severity: Severity
    title: str
    evidence: Mapping[str, Any]
    ranks: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    ops: tuple[str, ...] = ()
    estimated_saving_us: float | None = None
    saving_fraction: float | None = None
    saving_basis: str = ""
    detail: str = ""
    optimizations: tuple[Optimization, ...] = ()
    top: tuple[Mapping[str, Any], ...] = ()
    explains: tuple[str, ...] = ()
    # the chain of findings (advisor.engine.chain): the findings that explain this one (ids), whether
    # nothing explains it (a root cause), and the root it traces back to (the one with the largest saving)
    explained_by: tuple[str, ...] = ()
    root: bool = True
    root_id: str | None = None
    uid: str = ""  # set when two findings of one report would share an id
    # the what-if replay of the rule's counterfactual (advisor.stages.replay.summary): the replayed saving
    # with its assumption and how well the step reproduced, or why no saving is estimated; None when the
    # rule states no counterfactual
    replay: Mapping[str, Any] | None = None
    # where --rank narrowed the report: "cluster-wide" for a finding about more ranks than the
    # chosen one (or none in particular), whose figures are not narrowed; "" otherwise
    scope: str = ""

    @property
    def bottleneck(self) -> str:
        """Bottleneck class (contract vocabulary)."""
        return bottleneck_of(self.cause)

    @property
    def id(self) -> str:
        """Stable id: hash of rule and what is affected, so diffs across runs line up."""
        if self.uid:
            return self.uid
        key = f"{self.rule}|{self.cause}|{self.ranks}|{self.ops[:5]}"
        return self.rule + "-" + hashlib.sha1(key.encode()).hexdigest()[:8]


@dataclass(slots=True)
class Profile:
    """A loaded profile (:func:`advisor.ingest.load`): the canonical tables in a DuckDB connection
    (``con``), where they were read from (``path``, the ``sources``' kinds), the ranks, the input
    problems met, and the time the load took."""

    con: Any
    path: str
    sources: list[str]
    ranks: list[int]
    warnings: list[Warning_] = field(default_factory=list)
    parse_seconds: float = 0.0


@dataclass(slots=True)
class RuleOutcome:
    """What happened to one rule in a run."""

    rule: str
    status: str  # "ran" | "skipped" | "error" | "not_selected"
    reason: str = ""
    findings: int = 0
    seconds: float = 0.0
    #: False for a skipped rule that cannot apply to this profile (a cluster rule on one rank, a
    #: device rule on a CPU-only trace, an Ascend-export table on a Kineto trace): it does not
    #: reduce the report's confidence, as a rule that applies but lacks data does
    applicable: bool = True


@dataclass(frozen=True, slots=True)
class Report:
    """Everything the renderers need. Built by :func:`advisor.analyze.analyze`; the gate returns a
    copy with its outcome (:meth:`advisor.gate.GateResult.apply`). Its JSON form is
    :func:`advisor.render.json.report_dict`."""

    tool_version: str
    profile: dict[str, Any]
    breakdown: list[dict[str, Any]]
    critical_path: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    warnings: list[Warning_] = field(default_factory=list)
    rules: list[RuleOutcome] = field(default_factory=list)
    step_times: list[dict[str, Any]] = field(default_factory=list)
    #: the chain's account (:func:`advisor.engine.chain.summary`): roots, verdict, total saving
    savings: dict[str, Any] | None = None
    #: one row per communication link (src, dst, bytes, time_us, bandwidth_gbps, ...), when the profile has them
    comm_matrix: list[dict[str, Any]] | None = None
    #: the CI gate's outcome (status, checks, messages), when a gate option was given (:mod:`advisor.gate`)
    gate: dict[str, Any] | None = None
    #: step time per phase and findings against ``--baseline`` (:func:`advisor.gate.baseline_diff`)
    baseline_diff: dict[str, Any] | None = None
    #: ``advisor explain`` text (Markdown) of each rule that has a finding here, for the renderers
    rule_docs: dict[str, str] = field(default_factory=dict)
    #: hardware metric series (:func:`advisor.stages.hardware.report`): per metric a summary, the
    #: metrics kept and dropped, diverging devices, per-device series for the chart
    hardware: dict[str, Any] | None = None
    #: step-time variability (:mod:`advisor.stages.variability`): distributions, contributors, scale prediction
    variability: dict[str, Any] | None = None
    #: the job's parallel groups and their kind (:func:`advisor.stages.groups.reconstruct`), when it communicates
    parallel_groups: dict[str, Any] | None = None
    #: ranks x steps slowdown picture (:func:`advisor.stages.groups.step_matrix`), with two ranks or more
    step_matrix: dict[str, Any] | None = None
    #: what the profile window holds besides the steady state (``window_phases``: one-time set-up, graph
    #: capture, steps left out, ranks whose device timeline is not modelled or not recorded, inferred steps), one row each
    window_phases: list[dict[str, Any]] = field(default_factory=list)
    #: the rule configuration used (:meth:`advisor.config.Config.summary`): config file, thresholds changed
    config: dict[str, Any] | None = None

    @property
    def total_saving_us(self) -> float | None:
        """What fixing the root causes could save per step (see :attr:`savings`)."""
        return None if self.savings is None else self.savings.get("total_saving_us")
