"""Stream the ``traceEvents`` array of a Chrome-trace object to DuckDB as a top-level array.

DuckDB's JSON reader holds a whole top-level object in memory (a 500 MB trace peaks at ~4.5 GB),
but it streams the elements of a top-level array in bounded memory. A Kineto file is one object
whose ``traceEvents`` list holds every event, so this file-like object serves only the bytes of
that list — from its ``[`` to its closing ``]`` — decompressing gzip on the fly, and parses the
few header keys around it (``distributedInfo``, ``baseTimeNanoseconds`` …) itself.

The end of the list is found without parsing the events: the stream holds back its last
``TAIL`` bytes, and at end of file the closing ``]`` is the last ``]`` after which the rest of
the object parses as ``, "key": value … }``. When the layout is not recognised (no
``traceEvents`` key near the start, a truncated file, trailing keys that do not parse), the
caller falls back to DuckDB's whole-object reader, which then reports the precise error.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import threading
import zlib
from pathlib import Path
from typing import Any

HEAD = 4 << 20  # the traceEvents key must appear within the first 4 MiB
FIRST_READ = 64 << 10  # bytes read first to find it (Kineto's header keys before it: a few KiB)
TAIL = 1 << 20  # trailing header keys after the events fit in 1 MiB
TRAILER_MAX = 64 << 10  # header keys written after the events (traceName, baseTimeNanoseconds ...)
PROBE = 1 << 20  # bytes of the event list searched for the strings a caller asks about (a few thousand events)
CHUNK = 4 << 20  # bytes decompressed / handed to DuckDB per read
MAX_GZIP_RATIO = 100  # Kineto JSON compresses 10-20x; 100x leaves room and stops bombs (1000x+)
MIN_LIMIT = 256 << 20


def gzip_limit(size: int, max_ratio: int = MAX_GZIP_RATIO) -> int:
    """The most bytes a gzip file of ``size`` bytes may decompress to before it is refused."""
    return max(MIN_LIMIT, size * max_ratio)


def gzip_bomb(limit: int) -> ValueError:
    """The error of a gzip file that decompresses beyond ``limit`` bytes."""
    return ValueError(f"decompresses to more than {limit >> 20} MiB ({MAX_GZIP_RATIO}x its size, at least "
                      f"{MIN_LIMIT >> 20} MiB): refused as a possible gzip bomb")


def gunzip_guarded(path: Path, out: Any = None) -> bytes:
    """Decompress the gzip file ``path`` into the binary file ``out`` (None: only measure it),
    refusing it with ValueError (:func:`gzip_bomb`) as soon as it passes :func:`gzip_limit`;
    returns its first :data:`PROBE` bytes. Raises OSError / EOFError / zlib.error for a
    damaged file."""
    limit = gzip_limit(path.stat().st_size)
    total = 0
    first = b""
    with path.open("rb") as raw, gzip.GzipFile(fileobj=raw) as src:
        while chunk := src.read(CHUNK):
            total += len(chunk)
            if total > limit:
                raise gzip_bomb(limit)
            if len(first) < PROBE:
                first += chunk[:PROBE - len(first)]
            if out is not None:
                out.write(chunk)
    return first


class LayoutError(Exception):
    """The file is not laid out as ``{... "traceEvents": [ ... ] ...}``."""


class EventsStream(io.RawIOBase):
    """Raw, non-seekable stream of the ``traceEvents`` array's bytes."""

    def __init__(self, path: Path, max_ratio: int = MAX_GZIP_RATIO, probe: tuple[bytes, ...] = ()) -> None:
        super().__init__()
        self._raw = path.open("rb")
        magic = self._raw.read(2)
        self._raw.seek(0)
        gz = magic == b"\x1f\x8b"
        self._src: Any = gzip.GzipFile(fileobj=self._raw) if gz else self._raw
        size = path.stat().st_size
        # a gzip bomb is refused before it is expanded in memory (DuckDB buffers the stream)
        self._limit = gzip_limit(size, max_ratio) if gz else size + 1
        self._read_total = 0
        try:
            head = self._read_full(HEAD)
        except (OSError, EOFError, zlib.error) as exc:
            self.close()
            raise LayoutError(f"cannot read: {exc}") from None
        key = head.find(b'"traceEvents"')
        bracket = head.find(b"[", key) if key >= 0 else -1
        if key < 0 or bracket < 0 or head[key + 13 : bracket].strip() != b":":
            self.close()
            raise LayoutError("no traceEvents list near the start")
        self.head_bytes = head[:key]
        self.found = _probe(head, bracket, probe)
        self.trailer: dict[str, Any] = {}
        self._buf = bytearray(head[bracket:])
        self._eof = False
        self._done = False

    def _read_full(self, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = self._src.read(min(n, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def readable(self) -> bool:
        return True

    def _next_chunk(self) -> bytes:
        """The next bytes of the file (b'' at its end); ValueError beyond the gzip bomb limit."""
        chunk: bytes = self._src.read(CHUNK)
        self._read_total += len(chunk)
        if self._read_total > self._limit:
            raise gzip_bomb(self._limit)
        return chunk

    def _fill(self, want: int) -> None:
        while not self._eof and len(self._buf) < want + TAIL:
            chunk = self._next_chunk()
            if not chunk:
                self._eof = True
                self._finish()
                return
            self._buf += chunk

    def _finish(self) -> None:
        """At end of file: cut the buffer at the ``]`` that closes traceEvents (see :func:`find_close`)."""
        tail = bytes(self._buf[-TRAILER_MAX:]) if len(self._buf) > TRAILER_MAX else bytes(self._buf)
        base = len(self._buf) - len(tail)
        pos, self.trailer = find_close(tail)
        del self._buf[base + pos + 1 :]

    def readinto(self, b: Any) -> int:
        if self._done:
            return 0
        n = min(len(b), CHUNK)  # a raw stream may return less than asked: keeps our buffer bounded
        self._fill(n)
        avail = len(self._buf) if self._eof else max(0, len(self._buf) - TAIL)
        take = min(n, avail)
        if take == 0 and self._eof:
            self._done = True
            return 0
        b[:take] = self._buf[:take]
        del self._buf[:take]
        return take

    def copy_to(self, out: Any) -> None:
        """Write what is left of the list to the binary file ``out``: the bytes reading the
        stream to its end gives, without passing them through the stream's buffer (each chunk
        is written as it is read; only the last :data:`TRAILER_MAX` bytes, where the list's
        close is looked for, are held back). Raises as reading would (LayoutError, ValueError)."""
        held = [bytes(self._buf)]  # not yet written; the ones after the first hold >= TRAILER_MAX bytes
        held_len = len(held[0])
        self._buf = bytearray()
        while chunk := self._next_chunk():
            held.append(chunk)
            held_len += len(chunk)
            while len(held) > 1 and held_len - len(held[0]) >= TRAILER_MAX:
                held_len -= len(held[0])
                out.write(held.pop(0))
        rest = b"".join(held)
        tail = rest[-TRAILER_MAX:]
        pos, self.trailer = find_close(tail)
        out.write(rest[:len(rest) - len(tail) + pos + 1])
        self._eof = self._done = True

    def close(self) -> None:
        try:
            if self._src is not self._raw:
                self._src.close()
        finally:
            self._raw.close()
            super().close()


class SpilledEvents:
    """The ``traceEvents`` array of a big trace copied to a temporary file as a top-level array
    (``array``: a trace in the bare event-list form, copied whole).

    DuckDB keeps every byte it reads from a Python file object or a pipe in memory (a 500 MB
    trace cost 500 MB more), but reads a file path in bounded buffers, several threads at once.
    So the array is copied (gzip decompressed on the way) into the system temporary directory,
    read by path, and deleted when done. ``head_bytes`` / ``trailer`` as in :class:`EventsStream`;
    ``found``: the byte strings of ``probe`` that occur in the list's first bytes (:data:`PROBE`).
    Raises LayoutError (layout not recognised) or OSError (no room to write the copy).
    """

    def __init__(self, path: Path, tmp_dir: str | None = None, probe: tuple[bytes, ...] = (),
                 array: bool = False) -> None:
        import tempfile

        with path.open("rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        if gz and not array:
            stream = EventsStream(path, probe=probe)
        fd, name = tempfile.mkstemp(prefix="advisor-events-", suffix=".json", dir=tmp_dir)
        self.path = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                if array:  # the bare event-list form: the whole file (decompressed, under the bomb limit)
                    if gz:
                        first = gunzip_guarded(path, out)
                    else:
                        with path.open("rb") as fh:
                            first = fh.read(PROBE)
                            out.flush()
                            _copy_range(fh, out, 0, path.stat().st_size)
                    self.head_bytes, self.trailer = b"", {}
                    self.found = _probe(first, 0, probe)
                elif gz:  # decompressed on the way
                    with stream:
                        stream.copy_to(out)
                    self.head_bytes, self.trailer, self.found = stream.head_bytes, stream.trailer, stream.found
                else:  # the byte range of the list, copied by the kernel
                    self.head_bytes, self.trailer, self.found = self._copy_plain(path, out, probe)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _copy_plain(path: Path, out: Any, probe: tuple[bytes, ...]) -> tuple[bytes, dict[str, Any], frozenset[bytes]]:
        size = path.stat().st_size
        with path.open("rb") as fh:
            # the key is looked for in the first 64 KiB, then up to HEAD; of the list itself only
            # the PROBE bytes are read (a 10 MB trace: 1 MiB read into memory, not 4)
            head = fh.read(FIRST_READ)
            key = head.find(b'"traceEvents"')
            bracket = head.find(b"[", key) if key >= 0 else -1
            if bracket < 0 and len(head) == FIRST_READ:
                head += fh.read(HEAD - FIRST_READ)
                key = head.find(b'"traceEvents"')
                bracket = head.find(b"[", key) if key >= 0 else -1
            if key < 0 or bracket < 0 or head[key + 13 : bracket].strip() != b":":
                raise LayoutError("no traceEvents list near the start")
            if len(head) < min(bracket + PROBE, HEAD, size):
                head += fh.read(min(bracket + PROBE, HEAD) - len(head))
            tail_start = max(bracket, size - TRAILER_MAX)
            fh.seek(tail_start)
            pos, trailer = find_close(fh.read())
            out.flush()
            _copy_range(fh, out, bracket, tail_start + pos + 1)
        return head[:key], trailer, _probe(head, bracket, probe)

    def close(self) -> None:
        """Delete the copy."""
        try:
            self.path.unlink()
        except OSError:
            pass

    def __enter__(self) -> SpilledEvents:  # noqa: PYI034 - typing.Self needs Python 3.11; we support 3.10
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _probe(head: bytes, start: int, probe: tuple[bytes, ...]) -> frozenset[bytes]:
    """The byte strings of ``probe`` found in the :data:`PROBE` bytes of ``head`` from ``start`` on."""
    return frozenset(p for p in probe if head.find(p, start, start + PROBE) >= 0)


def find_close(tail: bytes) -> tuple[int, dict[str, Any]]:
    """Position in ``tail`` (the file's last bytes) of the ``]`` that closes traceEvents, and the
    keys written after it.

    That is the leftmost ``]`` after which the rest of the file parses exactly as ``}`` or
    ``, "key": value, ... }``; an inner ``]`` of the last event is followed by more of the event
    list, which never parses that way, and a later key's list (``"deviceProperties": []``) lies
    to the right of the true one. Only a ``]`` right after an object's ``}`` (the last event) or
    a ``[`` (an empty list) is tried. Raises LayoutError when there is none.

    The tail is decoded once, the candidates found by one regular expression (which also wants a
    ``}`` or a comma and a key after them), and each one's rest parsed in place, key by key,
    stopping at the first thing that does not fit: a 64 KiB tail holds hundreds of ``]`` (the
    last events' inner lists), and decoding and parsing the whole rest for each of them cost
    ~1.2 ms a file (1,024 ranks: 1.2 CPU-s).
    """
    text = tail.decode("utf-8", "surrogateescape")  # the structural characters are ASCII: same places
    best: tuple[int, dict[str, Any]] | None = None
    for m in _CANDIDATE.finditer(text):  # left to right: the first that fits is the leftmost
        keys = _trailer(text, m.end())
        if keys is not None:
            best = (m.end() - 1, keys)
            break
    if best is None:
        raise LayoutError("the traceEvents list is not closed (truncated file?)")
    pos, keys = best
    at = len(text[:pos].encode("utf-8", "surrogateescape"))
    try:
        tail[at:].decode("utf-8")
    except UnicodeDecodeError:
        raise LayoutError("the keys after the traceEvents list are not UTF-8") from None
    return at, keys


_WS = re.compile(r"[ \t\r\n]*")
# a ``]`` right after a ``}`` or ``[`` and followed by ``}`` or by a comma and a key (or ``}``):
# the only ones that can close the list; one pass over the tail instead of a test per ``]``
_CANDIDATE = re.compile(r'[}\[][ \t\r\n]*\](?=[ \t\r\n]*(?:\}|,[ \t\r\n]*["}]))')
_DECODER = json.JSONDecoder()


def _trailer(text: str, i: int) -> dict[str, Any] | None:
    """The keys of ``, "key": value, ... }`` (or of a lone ``}``) making up exactly ``text[i:]``
    with whitespace around; None when it is anything else."""
    def ws(i: int) -> int:  # the position after the whitespace at i
        m = _WS.match(text, i)
        return m.end() if m else i

    keys: dict[str, Any] = {}
    i = ws(i)
    while True:
        if text.startswith("}", i):
            return keys if ws(i + 1) == len(text) else None
        if not text.startswith(",", i):
            return None
        i = ws(i + 1)
        if text.startswith("}", i):  # a trailing comma, as the whole-object parse took it
            continue
        if not text.startswith('"', i):
            return None
        try:
            key, i = _DECODER.raw_decode(text, i)
            i = ws(i)
            if not text.startswith(":", i):
                return None
            value, i = _DECODER.raw_decode(text, ws(i + 1))
        except ValueError:
            return None
        keys[key] = value
        i = ws(i)


def _copy_range(src: Any, dst: Any, start: int, end: int) -> None:
    """Copy bytes [start, end) of one file to another, in the kernel where it can."""
    src.seek(start)
    left = end - start
    try:
        while left > 0:
            n = os.copy_file_range(src.fileno(), dst.fileno(), min(left, 1 << 30))
            if n <= 0:
                break
            left -= n
    except (AttributeError, OSError):
        pass  # not Linux, or a file system without it: copy through user space
    src.seek(end - left)
    while left > 0:
        chunk = src.read(min(left, CHUNK))
        if not chunk:
            raise LayoutError("the file shrank while being read")
        dst.write(chunk)
        left -= len(chunk)


def header_value(head: bytes, key: str) -> Any:
    """Decode the JSON value of a top-level ``key`` in the bytes before the events."""
    k = b'"' + key.encode() + b'"'
    pos = head.find(k)
    if pos < 0:
        return None
    colon = head.find(b":", pos + len(k))
    if colon < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(head[colon + 1 :].decode("utf-8", errors="replace").lstrip())
    except ValueError:
        return None
    return obj


# -- strings DuckDB's JSON reader refuses ------------------------------------------------------

# one JSON escape at a time, left to right: a surrogate pair (kept), a lone surrogate (replaced)
# or any other escape (kept; consuming it keeps ``\\ud800``, an escaped backslash followed by
# the text "ud800", as it is)
_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\.",
                     re.DOTALL)
ENCODING_ERROR = re.compile(r"UTF-8|utf-8|surrogate")  # what DuckDB says of such a string


_REPLACED = threading.local()  # invalid UTF-8 sequences replaced by the decoder in this thread


def _count_and_replace(exc: UnicodeError) -> tuple[str, int]:
    """Codecs error handler: U+FFFD for the invalid sequence, counted."""
    _REPLACED.n = getattr(_REPLACED, "n", 0) + 1
    return "\ufffd", exc.end  # type: ignore[attr-defined]


codecs.register_error("advisor-count-replace", _count_and_replace)


def sanitise_json(src: Path, out: Any) -> int:
    """Copy the JSON text of ``src`` (gzip decompressed) to the binary file ``out`` with every
    byte sequence that is not UTF-8 and every lone UTF-16 surrogate escape (``\\ud800`` without
    its low half, or a low half alone) replaced by U+FFFD; the number replaced.

    Escapes never span a ``}`` (that character is never part of one), so the text is worked on
    in pieces cut after their last ``}``; the decoder carries split UTF-8 sequences over itself.
    Raises ValueError for a gzip file beyond :func:`gzip_limit`.
    """
    escapes = 0

    def escape(m: re.Match[str]) -> str:
        nonlocal escapes
        if m.group(1) is None:
            return m.group(0)
        escapes += 1
        return "\\ufffd"

    _REPLACED.n = 0
    decoder = codecs.getincrementaldecoder("utf-8")("advisor-count-replace")
    limit = gzip_limit(src.stat().st_size)
    total = 0
    with src.open("rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        fh: Any = gzip.GzipFile(fileobj=raw) if gz else raw
        carry = ""
        while True:
            chunk = fh.read(CHUNK)
            total += len(chunk)
            if gz and total > limit:
                raise gzip_bomb(limit)
            text = carry + decoder.decode(chunk, not chunk)
            cut = text.rfind("}") + 1 if chunk else len(text)
            out.write(_ESCAPE.sub(escape, text[:cut]).encode("utf-8"))
            carry = text[cut:]
            if not chunk:
                break
    return escapes + int(_REPLACED.n)
