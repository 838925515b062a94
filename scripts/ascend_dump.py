"""Dump every canonical table (sorted rows) for each Ascend input; compare two dumps.

    python scripts/ascend_dump.py dump OUT_DIR [DIR ...] # the repository's inputs, the generated
                                                        # 64-rank clusters, and the ascend* export
                                                        # folders inside each DIR given
    python scripts/ascend_dump.py diff BEFORE_DIR AFTER_DIR
    python scripts/ascend_dump.py digests DUMP_DIR      # rewrite tests/data/ascend/readers_digests.json

A regression guard for refactoring the Ascend readers: the tables must hold the same rows.
The digests file is what ``tests/ascend/test_readers_equivalence.py`` compares with; rewrite it
from a dump made with the code before a change when the change is meant to load other rows.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from advisor.schema import TABLES
from tests.ascend import gen_cluster
from tests.ascend.readers_dump import digests, dump, inputs, normalised_warning

DIGESTS = REPO / "tests" / "data" / "ascend" / "readers_digests.json"


def all_inputs(tmp: Path, extra: list[Path]) -> dict[str, Path]:
    gen = {
        f"{scn}_{form}": gen_cluster.generate(scn, tmp / f"{scn}_{form}", form).root
        for scn, form in (("faults8", "text"), ("faults8", "db"), ("mindspore4", "text"))
    }
    out = {name: build() for name, build in inputs(tmp, gen).items()}
    for scn, form in (("baseline8", "text"), ("cluster64", "text"), ("cluster64", "db")):
        out[f"gen_{scn}_{form}"] = gen_cluster.generate(scn, tmp / f"{scn}_{form}", form).root
    for d in extra:
        if not d.is_dir():
            sys.exit(f"ascend_dump: {d}: not a directory")
        for x in sorted(d.glob("ascend*")):
            out[f"extra_{d.name}_{x.name}"] = x
    return out


def main() -> None:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "dump":
        dest = Path(sys.argv[2])
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as t:
            for name, path in all_inputs(Path(t), [Path(a) for a in sys.argv[3:]]).items():
                d = dump(path)
                (dest / f"{name}.json").write_text(json.dumps({"digests": digests(d), "rows": d}, indent=0))
                print(name, sum(len(v) for v in d.values()), "rows")
    elif cmd == "diff":
        a, b = Path(sys.argv[2]), Path(sys.argv[3])
        bad = 0
        for fa in sorted(a.glob("*.json")):
            fb = b / fa.name
            if not fb.exists():
                print("missing", fa.name)
                bad += 1
                continue
            da, db = json.loads(fa.read_text())["rows"], json.loads(fb.read_text())["rows"]
            for d in (da, db):
                d["warnings"] = sorted(normalised_warning(w) for w in d.get("warnings", []))
            for t in sorted(set(da) | set(db)):
                ra, rb = da.get(t, []), db.get(t, [])
                if ra != rb:
                    bad += 1
                    sa, sb = set(ra), set(rb)
                    print(f"{fa.stem}.{t}: {len(ra)} -> {len(rb)} rows; -{len(sa - sb)} +{len(sb - sa)}")
                    for x in sorted(sa - sb)[:3]:
                        print("   -", x[:300])
                    for x in sorted(sb - sa)[:3]:
                        print("   +", x[:300])
        print("differences:", bad)
        sys.exit(1 if bad else 0)
    elif cmd == "digests":
        src = Path(sys.argv[2])
        with tempfile.TemporaryDirectory() as t:
            names = list(inputs(Path(t), {"faults8_text": Path(t), "faults8_db": Path(t), "mindspore4_text": Path(t)}))
        doc = {
            "about": "Row count and sha256 of the sorted rows of each canonical table (these columns) per "
            "Ascend input, from tests/ascend/readers_dump.py on the code before the readers refactor: a "
            "regression guard (the rows must stay the same), not figures checked against the data. "
            "Rewrite with scripts/ascend_dump.py when a change is meant to load other rows.",
            "columns": {n: list(t.column_names) for n, t in TABLES.items()},
            "inputs": {n: digests(json.loads((src / f"{n}.json").read_text())["rows"]) for n in names},
        }
        DIGESTS.write_text(json.dumps(doc, indent=1) + "\n")
        print("wrote", DIGESTS)
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
