#!/usr/bin/env python3
"""Run the robustness fuzzers for longer than CI does and keep what they find.

    python scripts/fuzz_long.py --minutes 30                 # all targets, time split evenly
    python scripts/fuzz_long.py --minutes 10 --target kineto  # one target
    python scripts/fuzz_long.py --list

Targets are the Hypothesis strategies of ``tests/robustness/test_fuzz.py`` (``TARGETS``), checked by
the same property (``check_profile``: exit 0 or 2, no internal error, one-line stderr, strict JSON).
The script runs batches of ``--batch`` examples with fresh random seeds until the time is up. When a
batch fails, Hypothesis shrinks the input; the minimal failing profile is saved as a corpus case

    tests/robustness/found/<target>-<sha1>/case.json     {"expect": "tolerated", "profile": "profile", ...}
    tests/robustness/found/<target>-<sha1>/profile/...   the files

which ``tests/robustness/test_corpus.py`` then runs on every test run (through the CLI subprocess,
with the memory, time and no-writes checks). Fix the bug, keep the case. Exit status: 0 when
nothing was found, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def save_case(target: str, files: dict[str, bytes], error: str) -> Path | None:
    from tests.robustness.corpus import FOUND

    h = hashlib.sha1()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    dest = FOUND / f"{target}-{h.hexdigest()[:10]}"
    if dest.exists():
        return None
    prof = dest / "profile"
    for name, data in files.items():
        p = prof / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    first = next((ln for ln in error.splitlines() if ln.strip()), "")[:300]
    (dest / "case.json").write_text(json.dumps({
        "expect": "tolerated",
        "profile": "profile",
        "note": f"found by scripts/fuzz_long.py ({target}) on {time.strftime('%Y-%m-%d')}: {first}",
        "timeout": 60,
    }, indent=2) + "\n")
    return dest


def run_target(target: str, seconds: float, batch: int) -> int:
    from hypothesis import HealthCheck, given, settings

    from tests.robustness import test_fuzz

    strategy = test_fuzz.TARGETS[target]
    found = 0
    deadline = time.monotonic() + seconds
    batches = examples = 0
    while time.monotonic() < deadline:
        test_fuzz.FAILURES.clear()

        @settings(max_examples=batch, deadline=None, database=None, print_blob=False,
                  suppress_health_check=list(HealthCheck))
        @given(files=strategy)
        def prop(files: dict[str, bytes]) -> None:
            test_fuzz.check_profile(files)

        try:
            prop()
        except Exception as exc:  # noqa: BLE001 - a failing property, whatever it raised
            error = "".join(traceback.format_exception_only(type(exc), exc))
            if test_fuzz.FAILURES:
                dest = save_case(target, test_fuzz.FAILURES[-1], error)
                if dest is not None:
                    found += 1
                    print(f"[{target}] FOUND: {dest.relative_to(ROOT)}\n    {error.strip()[:500]}", flush=True)
            else:
                print(f"[{target}] error outside the property: {error.strip()[:500]}", flush=True)
                return found + 1
        batches += 1
        examples += batch
        print(f"[{target}] {examples} examples, {found} found, {max(0, deadline - time.monotonic()):.0f}s left", flush=True)
    return found


def main() -> int:
    from tests.robustness.test_fuzz import TARGETS, _has_ascend

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="total time budget (default 10)")
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="fuzz only these targets")
    ap.add_argument("--batch", type=int, default=200, help="examples per Hypothesis run (default 200)")
    ap.add_argument("--list", action="store_true", help="list the targets and exit")
    args = ap.parse_args()
    if args.list:
        print("\n".join(sorted(TARGETS)))
        return 0
    targets = args.target or sorted(TARGETS)
    if "ascend_csv" in targets and not _has_ascend():
        print("skipping ascend_csv: advisor/ingest/ascend.py is not there yet", file=sys.stderr)
        targets = [t for t in targets if t != "ascend_csv"]
    os.environ.setdefault("ADVISOR_FUZZ_EXAMPLES", str(args.batch))
    per_target = args.minutes * 60 / max(1, len(targets))
    found = sum(run_target(t, per_target, args.batch) for t in targets)
    print(f"done: {found} new failing input(s) saved under tests/robustness/found/")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
