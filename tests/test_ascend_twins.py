"""Ascend twins: a torch_npu cluster generated (tests/ascend/gen_cluster.py) with one planted fault, and
the same cluster (same seed, layout and kernel durations) with the fault switched off.

On every twin the saving the advisor predicts for the planted cause (its what-if replay where the
rule states a counterfactual and the steps reproduce, else the rule's own estimate) is within 30 %
of the step change the fix measures, the planted cause is the verdict on the fault side, and the
fixed side raises nothing of medium or more for that cause (issue #30). The measured change is the
generator's own figure, apart from the advisor: the mean over steps of the cluster's step on its
simulated timeline (``Facts.step_span_us``: from the step's start, the same on every rank, to the
next step's start) with the fault less without it.

The healthy side of every twin loads its batch in 100 µs (``loader_us``): the generator's default of
1.3 ms is 15-18 % of these steps, a data-loading cost of its own that the advisor rightly reports.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from advisor.analyze import analyze
from advisor.config import Config
from advisor.model import Report, Severity
from tests.ascend.gen_cluster import Facts, Scenario, generate
from tests.test_twins import best, planted

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ascend_twins")]

WITHIN = 0.30
HEALTHY: dict[str, Any] = {"world": 8, "ranks_per_node": 8, "loader_us": 100.0}

class Twin:
    """One twin: the healthy layout, the fault's scenario fields, the planted cause, the config."""

    def __init__(self, fault: dict[str, Any], cause: str, *, layout: dict[str, Any] | None = None,
                 sets: tuple[str, ...] = (), xfail: dict[str, str] | None = None, form: str = "text") -> None:
        self.base = {**HEALTHY, **(layout or {})}
        self.fault, self.cause, self.sets, self.form = fault, cause, sets, form
        self.xfail = xfail or {}  # test ("saving", "verdict") -> why this twin fails it

    def scenario(self, side: str) -> Scenario:
        return Scenario(name=side, **self.base, **(self.fault if side == "fault" else {}))

    def config(self) -> Config:
        cfg = Config()
        for s in self.sets:
            cfg.add_set(s)
        return cfg


#: twin -> the fault planted (gen_cluster.Scenario fields) and the cause it plants (docs/CAUSES.md)
TWINS: dict[str, Twin] = {
    "slow_rank": Twin({"slow_rank": 3}, "cluster.slow_rank"),
    "slow_rank_db": Twin({"slow_rank": 3}, "cluster.slow_rank", form="db"),
    "slow_rank_step": Twin({"slow_rank_step": (3, 2)}, "cluster.slow_rank_step"),
    "loader_stall_step": Twin({"slow_step": 3}, "io.slow_data_processing"),
    "slow_link": Twin({"slow_link": (0, 2)}, "cluster.slow_link"),
    "slow_link_db": Twin({"slow_link": (0, 2)}, "cluster.slow_link", form="db"),
    # ranks 0-3 and 4-7 on two nodes: the DP rings cross them over RDMA
    "rdma_retransmission": Twin({"rdma_retrans": (2, 1)}, "comm.rdma_retransmission", layout={"ranks_per_node": 4}),
    # misaligned HCCS chunks at half the link's bandwidth (the generator's default factor, 1, costs nothing)
    "byte_alignment": Twin({"misaligned_buckets": (1, 3), "misaligned_factor": 2.0}, "comm.byte_alignment"),
    "aicpu_operators": Twin({"aicpu": True}, "compute.aicpu_operator"),
    # the export names no device: the AI Core count is the generator's (N_AI_CORES)
    "low_block_dim": Twin({"low_block_dim": True}, "compute.low_block_dim", sets=("CMP006.cores=24",)),
    # four DP groups of four ranks on one node (CLU004 compares at least three groups)
    "slow_group": Twin({"slow_group": 0}, "cluster.slow_group", layout={"world": 16, "ranks_per_node": 16, "tp": 4}),
    # the TP all-gathers send their 4 MB per rank as 64 KB messages, each paying the generator's fixed message
    # latency; the next layer waits for its all-gather (on both sides), so the all-gathers are on the step
    "small_packets": Twin({"small_packets": True}, "comm.small_packet", layout={"tp_waits": True}),
}

_built: dict[tuple[str, str], tuple[Facts, Report]] = {}


@pytest.fixture(scope="module")
def twins_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ascend_twins")


def side(root: Path, twin: str, which: str) -> tuple[Facts, Report]:
    """The generated cluster of one side of a twin and the advisor's report on it (built once)."""
    key = (twin, which)
    if key not in _built:
        t = TWINS[twin]
        facts = generate(t.scenario(which), root / twin / which, t.form)
        _built[key] = (facts, analyze(facts.root, t.config()))
    return _built[key]


def measured_change(root: Path, twin: str) -> tuple[float, float, float]:
    """(mean cluster step with the fault, mean fixed, their difference), µs, from the generator's timeline."""
    a, b = (statistics.mean(side(root, twin, s)[0].step_span_us.values()) for s in ("fault", "fixed"))
    return a, b, a - b




def _params(test: str) -> list[Any]:
    return [pytest.param(t, id=t, marks=[pytest.mark.xfail(strict=True, reason=tw.xfail[test])] if test in tw.xfail
                         else []) for t, tw in TWINS.items()]


def test_the_fault_changes_nothing_else() -> None:
    """Both sides draw the same kernel durations: the twins differ only by the fault."""
    import tests.ascend.gen_cluster as g

    for t in TWINS.values():
        a, b = (g.Cluster(t.scenario(s)) for s in ("fault", "fixed"))
        assert (a.fwd_durs, a.bwd_durs, a.opt_durs) == (b.fwd_durs, b.bwd_durs, b.opt_durs)


@pytest.mark.parametrize("twin", _params("saving"))
def test_predicted_saving_is_the_measured_change(twins_dir: Path, twin: str) -> None:
    cause = TWINS[twin].cause
    _, _, change = measured_change(twins_dir, twin)
    f = best(side(twins_dir, twin, "fault")[1], cause)
    assert f is not None, f"{twin}: no {cause} finding on the fault side"
    saving = f.estimated_saving_us
    assert saving is not None, f"{twin}: {f.rule} predicts no saving"
    assert abs(saving - change) <= WITHIN * abs(change), (twin, f.rule, saving, change)


@pytest.mark.parametrize("twin", _params("verdict"))
def test_the_planted_cause_is_the_verdict(twins_dir: Path, twin: str) -> None:
    rep = side(twins_dir, twin, "fault")[1]
    assert rep.savings is not None
    verdict = next((f for f in rep.findings if f.id == rep.savings.get("verdict")), None)
    assert verdict is not None and verdict.cause == TWINS[twin].cause, (twin, verdict and (verdict.rule, verdict.cause))


@pytest.mark.parametrize("twin", list(TWINS))
def test_the_fixed_side_raises_nothing_for_the_cause(twins_dir: Path, twin: str) -> None:
    loud = [f for f in planted(side(twins_dir, twin, "fixed")[1], TWINS[twin].cause) if f.severity >= Severity.MEDIUM]
    assert not loud, [(f.rule, f.severity.label, f.estimated_saving_us) for f in loud]


@pytest.mark.parametrize("twin", ["slow_rank", "slow_link"])
def test_text_and_db_forms_predict_the_same(twins_dir: Path, twin: str) -> None:
    """The .db export of the same cluster gives the planted cause the same predicted saving."""
    cause = TWINS[twin].cause
    text, db = (best(side(twins_dir, t, "fault")[1], cause) for t in (twin, f"{twin}_db"))
    assert text is not None and db is not None
    assert text.estimated_saving_us == pytest.approx(db.estimated_saving_us, rel=1e-3)


def table(root: Path) -> str:
    """The benchmarks/README.md table (``python -m tests.test_ascend_twins``)."""
    rows = ["| twin | planted cause | rule | predicted saving | measured change | predicted / measured |",
            "|---|---|---|---:|---:|---:|"]
    for twin, t in TWINS.items():
        with_fault, fixed, change = measured_change(root, twin)
        f = best(side(root, twin, "fault")[1], t.cause)
        saving = f.estimated_saving_us if f else None
        ratio = f"{saving / change:.2f}" if saving is not None and change else "-"
        rows.append(f"| {twin} | {t.cause} | {f.rule if f else '-'} | "
                    f"{'-' if saving is None else f'{saving / 1000:.2f} ms'} | "
                    f"{change / 1000:.2f} ms ({with_fault / 1000:.2f} → {fixed / 1000:.2f}) | {ratio} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(table(Path(d)))
