"""Text helpers shared by every layer (ingest, CLI, renderers)."""

from __future__ import annotations


def one_line(text: object, limit: int = 300) -> str:
    """Collapse a message to one printable line (file names may hold newlines or control chars)."""
    s = "".join(ch if ch.isprintable() else " " for ch in str(text))
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"
