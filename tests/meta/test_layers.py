"""One direction through the code: the renderers are functions of the Report alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RENDER = Path(__file__).resolve().parents[2] / "advisor" / "render"
#: what a renderer must not reach: the analysis, the loaders, the rule registry and the rules
FORBIDDEN = ("advisor.engine", "advisor.ingest", "advisor.analyze", "advisor.stages", "rules")


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("path", sorted(RENDER.glob("*.py")), ids=lambda p: p.name)
def test_renderer_imports_nothing_of_the_analysis(path: Path) -> None:
    bad = [m for m in _imports(path) if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert not bad, f"{path.name} imports {bad}"


def test_loading_a_profile_needs_no_engine() -> None:
    """``advisor.ingest.load`` gives a Profile value; importing and running the loader brings in
    nothing of the engine, the stages, the analysis or the rules (the analysis builds its context)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from advisor.ingest import load\n"
            "from advisor.model import Profile\n"
            "p = load(sys.argv[1])\n"
            "assert isinstance(p, Profile) and p.ranks == [0, 1] and p.sources == ['kineto'], p\n"
            "bad = [m for m in sys.modules if m.startswith(('advisor.engine', 'advisor.stages', 'advisor.analyze',"
            " 'rules'))]\n"
            "assert not bad, bad\n")
    trace = Path(__file__).resolve().parents[1] / "data" / "kineto" / "gloo_slow_rank"
    res = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
