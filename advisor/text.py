"""Text helpers shared by every layer (ingest, CLI, renderers)."""

from __future__ import annotations


def one_line(text: object, limit: int = 300) -> str:
    """Collapse a message to one printable line (file names may hold newlines or control chars)."""
    s = "".join(ch if ch.isprintable() else " " for ch in str(text))
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
