"""Per-rank copies of one finding are merged on clusters; distinct findings are kept."""

from __future__ import annotations

from advisor.engine.merge import merge_per_rank
from advisor.model import Finding, Severity


def f(rank: int, saving: float, ops: tuple[str, ...] = ("Add",), rule: str = "CMP002") -> Finding:
    return Finding(rule=rule, cause="compute.aicpu_operator", severity=Severity.LOW, title=f"Rank {rank}: slow op",
                   evidence={"us": saving}, ranks=(rank,), steps=(1,), ops=ops, estimated_saving_us=saving)


def test_merges_three_or_more_ranks_keeping_the_worst() -> None:
    out = merge_per_rank([f(0, 1.0), f(1, 5.0), f(2, 2.0), f(3, 1.0, ops=("Mul",))])
    merged = [x for x in out if len(x.ranks) > 1]
    assert len(out) == 2 and len(merged) == 1
    m = merged[0]
    assert m.ranks == (0, 1, 2) and m.estimated_saving_us == 5.0
    assert m.title.startswith("Ranks 0–2:") and "worst: rank 1" in m.title
    assert m.evidence["ranks_affected"] == 3 and m.evidence["worst_rank"] == 1


def test_two_ranks_are_left_alone() -> None:
    assert len(merge_per_rank([f(0, 1.0), f(1, 2.0)])) == 2


def titled(rank: int, saving: float, title: str) -> Finding:
    return Finding(rule="CPU007", cause="cpu.operator_dispatch", severity=Severity.HIGH, title=title.format(rank=rank),
                   evidence={}, ranks=(rank,), steps=(1,), ops=(), estimated_saving_us=saving)


def test_merged_titles_read_for_every_rank_title_form() -> None:
    def merged(title: str) -> str:
        (m,) = merge_per_rank([titled(r, s, title) for r, s in ((0, 1.0), (1, 3.0), (2, 2.0))])
        return m.title

    # "Rank N: ..." and "Rank N verb ...": the rest is said of every rank, the worst named at the end
    assert merged("Rank {rank}: slow op") == "Ranks 0–2: slow op (worst: rank 1)"
    assert merged("Rank {rank} blocks on the device") == "Ranks 0–2: blocks on the device (worst: rank 1)"
    # a possessive keeps its rank: the figures are the worst rank's
    assert merged("Rank {rank}'s device is busy 40% of the step") == \
        "Ranks 0–2: rank 1's device is busy 40% of the step (worst)"
    # a title not led by its rank lists the others after it
    assert merged("Slow op on rank {rank}") == "Slow op on rank 1 (and 2 more ranks: 0–2)"
