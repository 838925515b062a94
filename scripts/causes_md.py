"""Write docs/CAUSES.md, the cause list the README and ``advisor explain`` cite, from the cause registry
(rules/causes.toml plus the causes rule modules add) and the rules that report each cause.

    python scripts/causes_md.py           # rewrite docs/CAUSES.md
    python scripts/causes_md.py --check   # exit 1 when docs/CAUSES.md is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "CAUSES.md"


def generate() -> str:
    """The text docs/CAUSES.md must hold."""
    from advisor.engine.registry import discover
    from advisor.render.docs import causes_markdown

    return causes_markdown(discover())


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        if not TARGET.is_file() or TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python scripts/causes_md.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
