"""The traceEvents streamer serves exactly the event list, whatever surrounds it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from advisor.ingest.jsonstream import EventsStream, LayoutError, SpilledEvents

EVENTS = [{"ph": "X", "name": "a]", "ts": 1, "dur": 2, "args": {"Input Dims": [[1], [2]], "x": "], \"k\": 1}"}},
          {"ph": "X", "name": "b", "ts": 3, "dur": 1, "args": {"l": [[]]}}]


@pytest.mark.parametrize(
    "doc",
    [
        {"schemaVersion": 1, "traceEvents": EVENTS},
        {"traceEvents": EVENTS, "deviceProperties": [{"name": "x", "ids": [1, 2]}], "traceName": "t]"},
        {"distributedInfo": {"rank": 3, "pg_config": [{"ranks": [0, 1]}]}, "traceEvents": EVENTS, "baseTimeNanoseconds": 5},
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_stream_yields_the_event_list(tmp_path: Path, doc: dict, gz: bool) -> None:
    text = json.dumps(doc, indent=1).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    s = EventsStream(path)
    body = b"".join(iter(lambda: s.read(7), b""))
    assert json.loads(body) == EVENTS
    after = {k: v for k, v in doc.items() if list(doc).index(k) > list(doc).index("traceEvents")}
    assert s.trailer == after
    with SpilledEvents(path, tmp_dir=str(tmp_path)) as spilled:  # the copy read by path (plain: a byte-range copy)
        assert json.loads(spilled.path.read_bytes()) == EVENTS
        assert spilled.trailer == after
        assert b'"traceEvents"' not in spilled.head_bytes and (b"schemaVersion" in spilled.head_bytes) == ("schemaVersion" in doc)
    assert not spilled.path.exists()


def test_truncated_and_other_layouts(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ph": "X"}, {"ph"')
    s = EventsStream(p)
    with pytest.raises(LayoutError):
        while s.read(1 << 20):
            pass
    with pytest.raises(LayoutError):
        SpilledEvents(p, tmp_dir=str(tmp_path))
    p.write_text('{"events": []}')
    with pytest.raises(LayoutError):
        EventsStream(p)
    with pytest.raises(LayoutError):
        SpilledEvents(p, tmp_dir=str(tmp_path))
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.json"]  # no copy left behind


@pytest.mark.parametrize("sample", [pytest.param("kineto_resnet50_num_workers_0", marks=pytest.mark.slow), "kineto_two_ranks"])
def test_streamed_and_whole_object_reads_agree(sample: str, samples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Big files go through the streaming reader; forcing it on the samples gives the same tables."""
    from advisor.engine.context import load_profile
    from advisor.ingest import kineto

    query = "SELECT * EXCLUDE (file_id) FROM events ORDER BY ALL"  # file ids follow load order (threads)
    whole = load_profile(samples / sample).con.execute(query).fetchall()
    monkeypatch.setattr(kineto, "STREAM_ABOVE_BYTES", 0)
    streamed_ctx = load_profile(samples / sample)
    assert not streamed_ctx.warnings
    assert streamed_ctx.con.execute(query).fetchall() == whole


def test_spilled_events_are_read_by_path_and_removed(tmp_path: Path, samples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Big files: the events list is copied to a temporary file, read by path, then deleted."""
    import tempfile

    from advisor.engine.context import load_profile
    from advisor.ingest import kineto
    from advisor.ingest.jsonstream import SpilledEvents

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    made = []
    monkeypatch.setattr(kineto, "SpilledEvents", lambda p, **k: made.append(p) or SpilledEvents(p, **k))
    monkeypatch.setattr(kineto, "STREAM_ABOVE_BYTES", 0)
    ctx = load_profile(samples / "kineto_two_ranks")
    assert len(made) == 2 and ctx.ranks == [0, 1]
    assert list(tmp.iterdir()) == []


def test_empty_event_list_with_keys_after_it(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": [ \n ], "deviceProperties": [], "traceName": "x"}')
    with SpilledEvents(p, tmp_dir=str(tmp_path)) as spilled:
        assert json.loads(spilled.path.read_bytes()) == []
        assert spilled.trailer == {"deviceProperties": [], "traceName": "x"}


def test_spilled_events_probe_looks_at_the_first_bytes_of_the_list(tmp_path: Path) -> None:
    """``found`` holds the probed strings present in the event list's first PROBE bytes, not later ones."""
    from advisor.ingest.jsonstream import PROBE

    early = {"ph": "X", "name": "a", "args": {"external id": 1}}
    filler = {"ph": "X", "name": "f" * 100, "args": {"External id": 2}}
    late = {"ph": "X", "name": "b", "args": {"Input dims": [[1]]}}
    n = PROBE // len(json.dumps(filler)) + 10
    body = json.dumps({"schemaVersion": 1, "traceEvents": [early] + [filler] * n + [late]}).encode()
    for name, data in (("t.json", body), ("t.json.gz", gzip.compress(body))):
        (tmp_path / name).write_bytes(data)
        with SpilledEvents(tmp_path / name, probe=(b'"external id"', b'"Input dims"', b'"nowhere"')) as sp:
            assert sp.found == {b'"external id"'}


@pytest.mark.parametrize("bracket_at", [100, 65535 - 3, 65535, 65536, 65536 + 8, 200 << 10, 3 << 20])
def test_spilled_copy_of_a_plain_file_wherever_the_list_starts(tmp_path: Path, bracket_at: int) -> None:
    """A plain file's list is found and probed the same whether its ``[`` lies in the first
    bytes read, at their last byte or the next one, with the key across their end, or a few
    MiB in (a large deviceProperties before it); the probe covers the list's first PROBE bytes."""
    from advisor.ingest.jsonstream import FIRST_READ, PROBE

    assert FIRST_READ == 65536  # the positions above are placed around it
    early = {"ph": "X", "name": "a", "args": {"external id": 1}}
    filler = {"ph": "X", "name": "f" * 100, "args": {"External id": 2}}
    late = {"ph": "X", "name": "b", "args": {"Input dims": [[1]]}}
    events = [early] + [filler] * (PROBE // len(json.dumps(filler)) + 10) + [late]
    before = '{"deviceProperties": [{"name": "%s"}], "traceEvents": '
    pad = "x" * max(0, bracket_at - len(before % ""))
    text = (before % pad).encode() + json.dumps(events).encode() + b', "traceName": "t"}'
    assert text.index(b"[", text.index(b'"traceEvents"')) == max(bracket_at, len(before % ""))
    p = tmp_path / "t.json"
    p.write_bytes(text)
    with SpilledEvents(p, tmp_dir=str(tmp_path), probe=(b'"external id"', b'"Input dims"')) as sp:
        assert json.loads(sp.path.read_bytes()) == events
        assert sp.found == {b'"external id"'}
        assert sp.trailer == {"traceName": "t"}
        assert json.loads(sp.head_bytes + b'"x": 0}')["deviceProperties"] == [{"name": pad}]


def test_find_close_on_generated_tails() -> None:
    """The close found is the list's own, with the keys after it, over generated documents: events
    whose strings and inner lists hold ``]``, ``}``, commas and non-ASCII text, trailers with empty
    lists, nested objects, strings that look like JSON and whitespace of every kind."""
    import random

    from advisor.ingest.jsonstream import TRAILER_MAX, find_close

    rnd = random.Random(7)
    words = ["]", "}", "], \"k\": 1}", "[]", ",", "é", "漢字", "\\\\", "\"", "x", " ", "\n", "{\"a\": [1]}"]

    def value(depth: int) -> object:
        r = rnd.random()
        if depth > 2 or r < 0.3:
            return rnd.choice([1, 2.5, None, True, "".join(rnd.choices(words, k=rnd.randint(0, 4)))])
        if r < 0.65:
            return [value(depth + 1) for _ in range(rnd.randint(0, 3))]
        return {"".join(rnd.choices(words, k=2)): value(depth + 1) for _ in range(rnd.randint(0, 3))}

    for _ in range(300):
        events = [{"ph": "X", "name": "".join(rnd.choices(words, k=3)), "args": {"l": value(0)}}
                  for _ in range(rnd.randint(0, 30))]
        trailer = {f"k{j}{rnd.choice(words)}": value(0) for j in range(rnd.randint(0, 4))}
        indent = rnd.choice([None, 1, 2])
        body = json.dumps(events, indent=indent, ensure_ascii=rnd.random() < 0.5)
        after = json.dumps(trailer, indent=indent, ensure_ascii=False)[1:]  # '"k": ... }' or '}'
        sep = rnd.choice(["", " ", "\n", "\r\n  "])
        rest = sep + ("}" if not trailer else ", " + after.lstrip())
        text = ('{"traceEvents": ' + body + rest).encode()
        close = len(('{"traceEvents": ' + body).encode()) - 1
        tail_start = max(0, len(text) - TRAILER_MAX)
        pos, keys = find_close(text[tail_start:])
        assert (tail_start + pos, keys) == (close, trailer)


def test_sanitise_json_replaces_bad_strings_the_same_across_chunk_boundaries(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Lone surrogate escapes and bytes that are not UTF-8 become U+FFFD, counted; valid pairs,
    escaped backslashes and multi-byte characters stay; pieces of 7 bytes (cutting escapes and
    UTF-8 sequences everywhere) give the same bytes as one piece."""
    import io

    from advisor.ingest import jsonstream

    event = (b'{"name": "a\\ud800b", "x": "\\ud83d\\ude00", "y": "\\\\ud800", "z": "\\udc00\\u00e9", '
             b'"w": "\xc3\xa9\xff\xe2\x82", "v": "\xe2\x82\xac"}')
    src = tmp_path / "t.json"
    src.write_bytes(b"[" + b", ".join([event] * 50) + b"]")
    whole = io.BytesIO()
    n_whole = jsonstream.sanitise_json(src, whole)
    monkeypatch.setattr(jsonstream, "CHUNK", 7)
    pieces = io.BytesIO()
    assert jsonstream.sanitise_json(src, pieces) == n_whole == 50 * 4  # \ud800, \udc00, \xff, \xe2\x82
    assert pieces.getvalue() == whole.getvalue()
    events = json.loads(whole.getvalue())
    assert events[0] == {"name": "a\ufffdb", "x": "\U0001f600", "y": "\\ud800", "z": "\ufffd\u00e9",
                         "w": "\u00e9\ufffd\ufffd", "v": "\u20ac"}


def test_sanitise_json_reads_gzip(tmp_path: Path) -> None:
    import gzip
    import io

    from advisor.ingest.jsonstream import sanitise_json

    src = tmp_path / "t.json.gz"
    src.write_bytes(gzip.compress(b'[{"name": "\\ud800"}]'))
    out = io.BytesIO()
    assert sanitise_json(src, out) == 1 and json.loads(out.getvalue()) == [{"name": "\ufffd"}]



@pytest.mark.parametrize("chunk", [7, 1000, 70_000, 4 << 20])
@pytest.mark.parametrize("n_events", [0, 3, 2_000])
def test_spilled_gzip_copy_is_what_the_stream_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_events: int,
                                                     chunk: int) -> None:
    """A gzip file's copy (written chunk by chunk, the last bytes held back to find the list's
    close) holds exactly the bytes the stream serves, whether the list is shorter than the
    held-back tail or many chunks long and wherever the chunks end (small chunks and head)."""
    from advisor.ingest import jsonstream

    events = [{"ph": "X", "name": f"op]{i}", "ts": i, "dur": 1, "args": {"l": [[i]], "s": "}]"}} for i in range(n_events)]
    doc = {"schemaVersion": 1, "traceEvents": events, "traceName": "t]", "deviceProperties": [{"ids": []}]}
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    monkeypatch.setattr(jsonstream, "CHUNK", chunk)
    monkeypatch.setattr(jsonstream, "HEAD", max(chunk, 100))
    s = EventsStream(path)
    served = b"".join(iter(lambda: s.read(1 << 16), b""))
    with SpilledEvents(path, tmp_dir=str(tmp_path)) as spilled:
        assert spilled.path.read_bytes() == served
        assert json.loads(served) == events
        assert spilled.trailer == s.trailer == {"traceName": "t]", "deviceProperties": [{"ids": []}]}
