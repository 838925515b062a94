"""One direction through the code (docs/style.md, "The path of a profile"): ``advisor.analyze`` is the
one orchestrator and nothing below imports it; each layer imports only those below it; no circle.
The renderers are functions of the Report alone.

The checks are static, over every import of every module of ``advisor`` (those inside functions
too, which Python and a run in one process never show): a pool's workers import what the main
process does not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "advisor"
RENDER = PACKAGE / "render"

#: importer (a module or package prefix) -> what it must not import: the layers of the path
LAYERS: dict[str, tuple[str, ...]] = {
    "advisor.ingest": ("advisor.engine", "advisor.pipeline", "advisor.analyze", "advisor.stages", "advisor.metrics"),
    "advisor.engine": ("advisor.pipeline", "advisor.analyze"),
    "advisor.stages": ("advisor.engine", "advisor.pipeline", "advisor.analyze"),
    "advisor.render": ("advisor.engine", "advisor.ingest", "advisor.pipeline", "advisor.analyze", "advisor.stages"),
    "advisor.metrics": ("advisor.ingest", "advisor.engine", "advisor.pipeline", "advisor.analyze"),
    "advisor.hw_vocab": ("advisor.ingest", "advisor.metrics", "advisor.engine", "advisor.pipeline", "advisor.analyze"),
    "advisor.options": ("advisor.analyze",),
    "advisor.gate": ("advisor.analyze",),
    "advisor.pipeline": ("advisor.analyze",),
}

#: the only modules that may import the orchestrator: those above it
ABOVE_ANALYZE = ("advisor.cli", "advisor.analyze")


def module_name(path: Path, root: Path = ROOT) -> str:
    """``advisor/ingest/__init__.py`` -> ``advisor.ingest``; ``advisor/cli.py`` -> ``advisor.cli``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (anywhere in its body), each resolved to the
    longest module name that exists (``from advisor.ingest import load`` -> ``advisor.ingest``;
    ``from advisor.pipeline import plan`` -> ``advisor.pipeline.plan``); relative imports resolved."""
    files = {module_name(p, root): p for p in package.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                subs = [f"{base}.{a.name}" for a in node.names]
                names = [n for n in subs if n in files] or [base]
                if len(names) < len(subs) and base not in names:
                    names.append(base)
            for n in names:
                target = resolve(n)
                if target and target != mod:
                    out.add(target)
        graph[mod] = out
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import against :data:`LAYERS`, and each import of the orchestrator from below it."""
    bad = []
    for mod, targets in sorted(graph.items()):
        for src, banned in LAYERS.items():
            if mod == src or mod.startswith(src + "."):
                bad += [f"{mod} imports {t}" for t in sorted(targets) if t.startswith(banned)]
        if mod not in ABOVE_ANALYZE and "advisor.analyze" in targets:
            bad.append(f"{mod} imports advisor.analyze (only {', '.join(ABOVE_ANALYZE[:-1])} sits above it)")
    return sorted(set(bad))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_runs_against_the_layers() -> None:
    bad = upward_imports(import_graph())
    assert not bad, "imports against the layers (docs/style.md):\n" + "\n".join(bad)


def test_no_import_circle() -> None:
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_checks_see_what_they_are_meant_to(tmp_path: Path) -> None:
    """A wrong import, at the top or inside a function, relative or absolute, is found, and so is a circle."""
    pkg = tmp_path / "advisor"
    for sub in ("ingest", "engine", "pipeline", "stages"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "analyze.py").write_text("from advisor.pipeline import plan\n")
    (pkg / "pipeline" / "plan.py").write_text("from advisor.ingest import base\n")
    (pkg / "ingest" / "base.py").write_text("def f():\n    from ..engine import context\n")
    (pkg / "engine" / "context.py").write_text("import advisor.stages.seq\n")
    (pkg / "stages" / "seq.py").write_text("def g():\n    from advisor.analyze import x\n")
    graph = import_graph(pkg, tmp_path)
    assert upward_imports(graph) == [
        "advisor.ingest.base imports advisor.engine.context",
        "advisor.stages.seq imports advisor.analyze",
        "advisor.stages.seq imports advisor.analyze (only advisor.cli sits above it)",
    ]
    assert circles(graph) == [["advisor.analyze", "advisor.engine.context", "advisor.ingest.base",
                               "advisor.pipeline.plan", "advisor.stages.seq"]]
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
