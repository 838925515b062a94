"""The Ascend readers load the same rows as before they were declared as data.

A regression guard of that refactor, not a check of figures against the data: the stored digests
(``tests/data/ascend/readers_digests.json``: row count and sha256 of the sorted rows of every
canonical table, per input) were computed with the code before the refactor by
``scripts/ascend_dump.py`` (which also compares whole dumps, and covers the generated 64-rank
clusters and any other export folders it is given). Columns added to a table later are not part of
the digest; a change meant to load other rows rewrites the file with that script.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ascend import gen_cluster
from tests.ascend.readers_dump import REPO, digests, dump, inputs

DIGESTS = json.loads((REPO / "tests" / "data" / "ascend" / "readers_digests.json").read_text())
NAMES = sorted(DIGESTS["inputs"])
#: inputs that take more than a few seconds to load on a busy 2-core machine
#: (the quick suite keeps the samples, one generated cluster and a few variants of each form)
SLOW = {"gen_faults8_db", "gen_faults8_text", "real_ascend_pt_resnet_ddp_l1_db", "real_ascend_pt_resnet_ddp_l1_text",
        "var_bad_trace", "var_no_metadata", "var_bad_kernels", "var_no_kernels", "var_no_trace_no_comm"}
CASES = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in NAMES]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, faults8_text, faults8_db) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("readers_eq")
    ms4 = gen_cluster.generate("mindspore4", tmp / "ms4", "text").root
    gen = {"faults8_text": faults8_text.root, "faults8_db": faults8_db.root, "mindspore4_text": ms4}
    return dict(inputs(tmp / "variants", gen))


def test_digests_cover_every_input(built) -> None:
    assert set(built) == set(NAMES)


@pytest.mark.parametrize("name", CASES)
def test_tables_hold_the_same_rows(built, name: str) -> None:
    path = built[name]()
    assert isinstance(path, Path)
    got = digests(dump(path, DIGESTS["columns"]))
    want = DIGESTS["inputs"][name]
    changed = {t: (want[t][0], got.get(t, [0])[0]) for t in want if got.get(t) != want[t]}
    assert not changed, f"{name}: tables whose rows changed (rows before, after): {changed}"
