"""The cause registry (advisor/causes.py): rules/causes.toml loads into one validated type, and
every kind of mistake in it (or in a cause a rule adds) is an error naming the problem."""

from __future__ import annotations

import pytest

import advisor.causes as causes_mod
from advisor.causes import Applies, Cause, CauseError, CauseRegistry, add_causes, registry
from advisor.engine import chain
from advisor.model import Optimization

GOOD = """
[causes."io.a"]
meaning = "a"
explains = ["io.b"]
optimizations = [{ id = "x", title = "X", how = "do x" }]

[causes."io.b"]
meaning = "b"
optimizations = [
  { id = "y", title = "Y", platforms = ["ascend"] },
  { id = "y", title = "Y elsewhere", platforms = ["gpu", "cpu"], only_if_ops = "(?i)^aten::" },
]
"""


def test_the_shipped_map_loads_with_its_chain_data() -> None:
    reg = registry()
    assert isinstance(reg, CauseRegistry)
    assert "parallel.poor_overlap" in reg
    assert reg["parallel.poor_overlap"].explains == ("cluster.slow_rank", "cluster.step_fluctuation")
    assert chain.explains_map() == {cid: reg[cid].explains for cid in reg}


def test_a_good_map_parses_into_frozen_causes() -> None:
    reg = CauseRegistry.from_toml(GOOD)
    assert list(reg) == ["io.a", "io.b"] and len(reg) == 2
    a, b = reg["io.a"], reg["io.b"]
    assert a.optimizations == (Optimization("x", "X", "do x"),) and a.explains == ("io.b",)
    assert b.applies == (Applies(("ascend",)), Applies(("gpu", "cpu"), "(?i)^aten::"))
    assert reg.get("io.c") is None
    with pytest.raises(AttributeError):
        a.meaning = "changed"  # type: ignore[misc]


@pytest.mark.parametrize(("text", "message"), [
    ('[causes."io.a"]\nmeaning = "a"\ncolour = "red"\n', r"cause 'io.a': unknown keys \['colour'\]"),
    ('[causes."io.a"]\noptimizations = [{ id = "x", title = "X", url = "u" }]\n', r"unknown keys \['url'\]"),
    ('[causes."IO.Slow"]\nmeaning = "a"\n', "not of the form bottleneck.name"),
    ('[causes."slow"]\nmeaning = "a"\n', "not of the form bottleneck.name"),
    ('[causes."io.a"]\nexplains = ["io.nowhere"]\n', r"io.a: explains unknown causes \['io.nowhere'\]"),
    ('[causes."io.a"]\noptimizations = [{ id = "x", title = "X", platforms = ["tpu"] }]\n',
     r"unknown platforms \['tpu'\]"),
    ('[causes."io.a"]\noptimizations = [{ id = "x", title = "X" }, { id = "x", title = "X again" }]\n',
     "'x' appears twice"),
    (('[causes."io.a"]\noptimizations = [{ id = "x", title = "X", platforms = ["gpu"] },'
     ' { id = "x", title = "X2", platforms = ["cuda"] }]\n'), "'x' appears twice"),
    ('[causes."io.a"]\noptimizations = [{ id = "x", title = "X", only_if_ops = "(" }]\n', "not a regular expression"),
    ('[causes."io.a"]\noptimizations = [{ title = "X" }]\n', "needs an id and a title"),
    ('[causes."io.a"]\nexplains = "io.b"\n', "explains must be a list of strings"),
    ('[other]\nx = 1\n', r"expected only a \[causes\] table"),
    ('[causes."io.a"]\nmeaning = "a"\n[causes."io.a"]\nmeaning = "b"\n', "not valid TOML"),
])
def test_validation_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(CauseError, match=message) as err:
        CauseRegistry.from_toml(text, "my.toml")
    assert str(err.value).startswith("my.toml: ")


def test_duplicate_ids_are_rejected_when_causes_are_added() -> None:
    reg = CauseRegistry.from_toml(GOOD)
    with pytest.raises(CauseError, match="duplicate cause id 'io.a'"):
        reg.with_causes(Cause("io.a", "again", ()))


def test_a_rule_adds_a_cause_through_the_same_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(causes_mod, "_LOADED", CauseRegistry.from_toml(GOOD))
    add_causes(Cause("io.c", "c", (Optimization("z", "Z"),), explains=("io.a",)))
    assert registry()["io.c"].explains == ("io.a",)
    assert causes_mod.optimizations_for("io.c") == (Optimization("z", "Z"),)
    assert chain.explains_map()["io.c"] == ("io.a",)
    with pytest.raises(CauseError, match="explains unknown causes"):
        add_causes(Cause("io.d", "d", (), explains=("io.zzz",)))
    with pytest.raises(CauseError, match="bottleneck.name"):
        add_causes(Cause("d", "d", ()))
    assert "io.d" not in registry()  # a rejected addition leaves the registry as it was
