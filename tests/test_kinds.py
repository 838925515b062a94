"""The shared vocabularies (advisor/kinds.py): members are their JSON values, and what the
critical-path stage and the ingest write stays inside them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.analyze import analyze
from advisor.config import Config
from advisor.kinds import INFERRED_EDGES, EdgeKind, SegmentKind, Source
from tests.conftest import report_json


def test_members_are_their_values_in_json_and_text() -> None:
    assert EdgeKind.HOST_ORDER == "host order"
    assert json.dumps({EdgeKind.LAUNCH: [SegmentKind.IDLE, Source.KINETO]}) == '{"launch": ["idle", "kineto"]}'
    assert str(EdgeKind.SYNC_WAIT) == "sync wait" and f"{SegmentKind.IO}" == "io" and f"{Source.ASCEND_MS:>10}" == " ascend_ms"
    assert EdgeKind("stream order") is EdgeKind.STREAM_ORDER
    assert Source.KINETO in ["kineto"]  # a report's plain strings compare with the members


def test_vocabularies_hold_what_the_report_uses() -> None:
    assert [k.value for k in SegmentKind] == ["compute", "communication", "host", "io", "other", "idle"]
    assert {s.value for s in Source} == {"ascend_pt", "ascend_ms", "kineto"}
    assert {s.family for s in Source} == {"Ascend", "Kineto"}
    assert {e.value for e in INFERRED_EDGES} == {"communication completion", "computation completion"}
    assert [e for e in EdgeKind if e.inferred] == [EdgeKind.COMMUNICATION_COMPLETION, EdgeKind.COMPUTATION_COMPLETION]


@pytest.mark.parametrize("name", ["kineto_two_ranks", "ascend_pt_timeline"])
def test_reports_use_only_the_shared_kinds(samples: Path, name: str) -> None:
    data = report_json(analyze(samples / name, Config()))
    cp = data["critical_path"]
    assert cp["edges"] and set(cp["edges"]) <= {e.value for e in EdgeKind}
    kinds = {s["kind"] for s in cp["segments"]} | set(cp["by_kind_us"]) | {o["kind"] for o in cp["ops"]}
    assert kinds and kinds <= {k.value for k in SegmentKind}
    assert set(data["profile"]["sources"]) <= {s.value for s in Source}
