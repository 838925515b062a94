"""CLU003 names what the slow steps run that the others do not, and the period of periodic spikes.

Planted traces: ``tests/rules/fixtures_spikes.py`` (numbers by construction) and the torch-recorded traces of
``tests/data/kineto`` (numbers from their README, measured on the raw JSON).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.analyze import analyze
from advisor.config import Config
from tests.conftest import ROOT, report_json
from tests.rules import fixtures_spikes

KINETO = ROOT / "tests" / "data" / "kineto"


def _clu003(path: Path) -> list[dict[str, Any]]:
    data = report_json(analyze(path, Config(select=["CLU003"])))
    return [f for f in data["findings"] if f["rule"] == "CLU003"]


def test_periodic_checkpoint_gives_the_period_and_names_the_checkpoint(tmp_path: Path) -> None:
    (f,) = _clu003(fixtures_spikes.periodic_checkpoint(tmp_path))
    ev = f["evidence"]
    assert f["steps"] == [10, 20, 30]
    assert (ev["pattern"], ev["period_steps"]) == ("periodic", 10)
    assert f["detail"].startswith("Every 10 steps (10, 20, 30): these steps run save_checkpoint (900.0 ms) "
                                  "that the other steps do not.")
    assert f["title"].endswith("; these steps run save_checkpoint (900.0 ms) that the other steps do not")
    # the 4 copies of 20 ms run only in those steps too, but inside save_checkpoint: not named separately
    assert ev["slow_steps_extra"] == "save_checkpoint 900.0 ms per slow step, in no other step"
    assert ev["slow_steps_extra_us"] == 900_000.0
    # the excess is the checkpoint plus 0.1 ms of gap and the step's own jitter, so it explains nearly all of it
    assert 0.95 <= ev["slow_steps_extra_share"] <= 1.0


def test_two_spikes_are_not_a_period_but_still_named(tmp_path: Path) -> None:
    (f,) = _clu003(fixtures_spikes.two_checkpoints(tmp_path))
    assert f["steps"] == [10, 20]
    assert f["evidence"]["pattern"] == "recurring" and f["evidence"]["period_steps"] is None
    assert "every" not in f["detail"].lower()
    assert "these steps run save_checkpoint (900.0 ms) that the other steps do not" in f["title"]


def test_steady_loop_stays_quiet(tmp_path: Path) -> None:
    assert _clu003(fixtures_spikes.steady(tmp_path)) == []


def test_recorded_checkpoint_step_names_the_checkpoint() -> None:
    # README: `checkpoint` record_function only in #8, 219.0 ms; the 16 detach ops inside it are nested
    (f,) = _clu003(KINETO / "cpu_step_fluctuation")
    assert f["steps"] == [8]
    assert "this step runs checkpoint (219.0 ms) that the other steps do not" in f["title"]
    assert 218_500 <= f["evidence"]["slow_steps_extra_us"] <= 219_500
    assert "detach" not in f["evidence"]["slow_steps_extra"]


def test_recorded_full_gc_steps_name_the_gc() -> None:
    # README: 57 young collections (1.7-2.0 ms) in every step, plus one full collection of 133.2, 136.7, 135.8 and
    # 138.2 ms in #2, #4, #6, #9: Python GC runs in every step but about 136 ms longer in the slow ones
    (f,) = _clu003(KINETO / "cpu_python_gc")
    extra = f["evidence"]["slow_steps_extra"]
    assert extra.startswith("Python GC ") and "in the others" in extra
    assert 134_000 <= f["evidence"]["slow_steps_extra_us"] <= 138_500
    assert "Python GC takes" in f["title"]


def test_contention_steps_name_slower_operators_not_extra_ones() -> None:
    # README: in #5-#7 the same work runs 3.2-3.8x slower (addmm + mm 57.55, 53.92, 51.51 ms vs 14.97-16.37 ms):
    # nothing runs only there; the operators that take longer explain at least the matmul growth (38.6 ms)
    (f,) = _clu003(KINETO / "cpu_contention")
    assert f["steps"] == [5, 6, 7]
    assert "in no other step" not in f["evidence"]["slow_steps_extra"]
    assert f["evidence"]["slow_steps_extra_us"] >= 38_000
