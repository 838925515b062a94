"""Text helpers shared by every layer (ingest, CLI, renderers)."""

from __future__ import annotations

import re

#: What a terminal, a browser or an editor acts on rather than shows: C0 controls but tab and
#: newline, CR, DEL, C1 controls, and the bidirectional embeddings, overrides, isolates and marks
#: that reorder a line (Trojan Source); line and paragraph separators count as newlines.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NEWLINES = {"\r\n": "\n", "\r": "\n", "\u2028": "\n", "\u2029": "\n"}


def printable(text: object, mark: str = "\ufffd") -> str:
    r"""``text`` with nothing a terminal, a browser or a Markdown viewer would act on: CR and Unicode
    line separators made newlines, every other control or bidirectional-formatting character
    replaced by ``mark``. An escape sequence is left inert and visible (``\x1b[31m`` shows as
    ``\ufffd[31m``), so a name stays recognisable. Tabs and newlines stay (the renderers decide
    where a line may break). Every string a profile or a report supplies goes through this before
    any renderer shows it."""
    s = str(text)
    if not _CONTROL.search(s):
        return s
    s = re.sub("\r\n?|[\u2028\u2029]", lambda m: _NEWLINES[m.group(0)], s)
    return _CONTROL.sub(mark, s)


def one_line(text: object, limit: int = 300) -> str:
    """Collapse a message to one printable line (file names may hold newlines or control chars)."""
    s = "".join(ch if ch.isprintable() else " " for ch in printable(text, " "))
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def spans(items: list[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``0-3, 7, 9-10`` (at most 8 runs, then how many in all)."""
    vals = sorted(set(items))
    runs: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        runs.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(runs[:8]) + (f", ... ({len(vals)} in all)" if len(runs) > 8 else "")
