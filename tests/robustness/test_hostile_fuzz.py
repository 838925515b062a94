"""Hostile-input fuzz (issue 33): the bundled samples and the real Ascend ``.db`` copies with their
names, column names, table names and file names replaced by hostile strings (quotes, SQL, globs,
control characters, Rich / HTML / Markdown markup), each seed a different mix.

Each profile goes through ``advisor analyze`` in-process and must end with exit 0 (a report) or 2
(one ``advisor:`` error line), no traceback, no control character on stderr; the report is rendered
to the terminal, Markdown and HTML. Nothing planted may come back as a value:

* an identifier holding ``(SELECT 987654320 + 1 ...)``: if SQLite ever ran it, 987654321 shows up;
* a trace file named with a glob (``rank0_*``) beside a link ``rank0_zz...`` to a trace outside the
  profile whose names carry ``OUTSIDE_7731``: if a reader expanded the glob, those names show up;
* markup: no ``<script>``/``<img`` in the HTML or Markdown, no escape sequence in the terminal text.

The quick suite runs two seeds (a Kineto trace and a ``.db`` export); ``-m slow`` runs the rest.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, validate_report
from tests.robustness.corpus import ASCEND_KERNELS, healthy_doc, strict_json

DB_EXPORT = ROOT / "tests" / "data" / "ascend_real" / "ascend_pt_resnet_ddp_l1_db"
KERNELS_SAMPLE = ASCEND_KERNELS.parents[1]  # sample_profiles/ascend_pt_kernels

#: what an injected subquery would evaluate to; never written anywhere as such
INJECTED = "987654321"
SQL = 'x" + (SELECT 987654320 + 1 FROM sqlite_master LIMIT 1) + "x'
OUTSIDE = "OUTSIDE_7731"

HOSTILE = [
    SQL,
    "x' || (SELECT 987654320 + 1) || 'x",
    "a\"b", "a'b", "'); DROP TABLE TASK; --",
    "*", "r?n[0-9]**", "{a,b}", "~/x", "../../etc/passwd",
    "\x1b[31mred\x1b[0m\x07bell", "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\", "\u202eevil\u202c", "nul\x00x",
    "[link=http://evil.example]x[/link]", "[/oops]", "[bold red]",
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "\" onmouseover=\"x",
    "![t](http://evil.example/t.png)", "[x](javascript:alert(1))", "a|b|c", "`tick`", "**bold** _e_", "\n# heading",
    "{{ 7*7 }}", "${7*7}", "$(touch /tmp/advisor-pwn)", "\\", "",
]


def hostile(rng: random.Random) -> str:
    return rng.choice(HOSTILE) + rng.choice(["", "", str(rng.randint(0, 99))])


def file_safe(text: str) -> str:
    """``text`` as a file-name part (no slash, no NUL; everything else is allowed on POSIX)."""
    return text.replace("/", "_").replace("\x00", "_")[:80] or "_"


# -- the mutators: each builds a hostile profile under ``root`` and returns its path ------------------


def kineto_case(rng: random.Random, root: Path) -> Path:
    """The cpu_healthy trace: operator, category, process and thread names, and its file name, hostile;
    the file name is a glob half the time, with a sibling link matching it to a trace outside."""
    prof = root / "prof"
    prof.mkdir()
    doc = healthy_doc()
    for e in doc["traceEvents"]:
        if not isinstance(e, dict):
            continue
        if e.get("ph") == "X" and not str(e.get("name", "")).startswith("ProfilerStep#") and rng.random() < 0.3:
            e["name"] = hostile(rng)
        if e.get("ph") == "X" and rng.random() < 0.05:
            e["cat"] = hostile(rng)
        if e.get("ph") == "M" and isinstance(e.get("args"), dict) and "name" in e["args"] and rng.random() < 0.5:
            e["args"]["name"] = hostile(rng)
    if rng.random() < 0.5:
        name = f"rank0_{file_safe(rng.choice(['*', '?', '[a-z]*', '**']))}.pt.trace.json"
        outside = root / "outside"
        outside.mkdir()
        secret = healthy_doc()
        for e in secret["traceEvents"]:
            if isinstance(e, dict) and e.get("ph") == "X" and not str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = f"{OUTSIDE} {e.get('name')}"
        (outside / "secret.pt.trace.json").write_text(json.dumps(secret))
        (prof / "rank0_zz.pt.trace.json").symlink_to(outside / "secret.pt.trace.json")
    else:
        name = f"{file_safe(hostile(rng))}.pt.trace.json"
    data = json.dumps(doc).encode()
    if rng.random() < 0.5:
        name, data = name + ".gz", gzip.compress(data, 1)
    (prof / name).write_bytes(data)
    return prof


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def db_case(rng: random.Random, root: Path) -> Path:
    """The real ``.db`` export (2 ranks): strings of STRING_IDS (every name), a few column names and a
    table name of the profiler database replaced by hostile strings, SQL-injecting ones included."""
    prof = root / file_safe("prof_" + hostile(rng))
    shutil.copytree(DB_EXPORT, prof)
    for db in sorted(prof.glob("*/ASCEND_PROFILER_OUTPUT/*.db")):
        con = sqlite3.connect(db)
        try:
            con.execute("PRAGMA journal_mode=DELETE")  # everything in the one file: the reader opens it immutable
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                "AND name NOT LIKE 'sqlite_%'")]
            if "STRING_IDS" in tables:
                ids = [r[0] for r in con.execute("SELECT id FROM STRING_IDS")]
                for i in rng.sample(ids, k=min(len(ids), 200)):
                    con.execute("UPDATE STRING_IDS SET value = ? WHERE id = ?", (hostile(rng), i))
            for table in rng.sample(tables, k=min(len(tables), 4)):
                cols = [r[1] for r in con.execute(f"PRAGMA table_info({_q(table)})")]
                col = rng.choice(cols)
                new = rng.choice([SQL, hostile(rng).replace("\x00", "") or "_"])  # SQL text holds no NUL
                if new not in cols:
                    con.execute(f"ALTER TABLE {_q(table)} RENAME COLUMN {_q(col)} TO {_q(new)}")
            if rng.random() < 0.5:
                table = rng.choice(tables)
                new = hostile(rng).replace("\x00", "") or "_"
                if new not in tables and not new.lower().startswith("sqlite_"):
                    con.execute(f"ALTER TABLE {_q(table)} RENAME TO {_q(new)}")
            con.commit()
        finally:
            con.close()
        for extra in db.parent.glob(db.name + "-*"):
            extra.unlink()
    return prof


def csv_case(rng: random.Random, root: Path) -> Path:
    """The bundled Ascend text sample: kernel names and a few column names of ``kernel_details.csv`` hostile."""
    prof = root / "prof"
    shutil.copytree(KERNELS_SAMPLE, prof)
    path = next(prof.rglob("kernel_details.csv"))
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    header = rows[0]
    for j in rng.sample(range(len(header)), k=min(3, len(header))):
        header[j] = hostile(rng)
    name_col = header.index("Name") if "Name" in header else 0
    for r in rows[1:]:
        if r and rng.random() < 0.4:
            r[name_col] = hostile(rng)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.write_text(buf.getvalue().replace("\x00", ""), encoding="utf-8")
    return prof


MUTATORS: dict[str, Callable[[random.Random, Path], Path]] = {"kineto": kineto_case, "db": db_case, "csv": csv_case}


# -- the property -------------------------------------------------------------------------------------


def check_case(kind: str, seed: int) -> None:
    from click.testing import CliRunner

    from advisor.cli import main
    from advisor.render import html, markdown
    from advisor.render.terminal import render_text

    rng = random.Random(f"{kind}-{seed}")
    with tempfile.TemporaryDirectory(prefix="advisor-hostile-") as td:
        root = Path(td)
        prof = MUTATORS[kind](rng, root)
        out = root / "out" / "report.json"
        out.parent.mkdir()
        res = CliRunner().invoke(main, ["analyze", str(prof), "--format", "json", "--out", str(out)])
        try:
            err = res.stderr
        except ValueError:  # click < 8.2 mixes the streams
            err = res.output
        where = f"{kind} seed {seed}: exit {res.exit_code}; stderr {err[:600]!r}"
        assert res.exception is None or isinstance(res.exception, SystemExit), f"{where}: {res.exception!r}"
        assert res.exit_code in (0, 2), where
        assert "Traceback" not in err and "internal error" not in err, where
        lines = err.splitlines()
        assert all(line.startswith("advisor:") and line.isprintable() for line in lines), where
        if res.exit_code == 2:
            assert len([x for x in lines if not x.startswith("advisor: warning:")]) == 1, where
            assert INJECTED not in err and OUTSIDE not in err, where
            return
        text = out.read_text(encoding="utf-8")
        data: Any = strict_json(text)
        validate_report(data)
        assert INJECTED not in text, f"{where}: an injected subquery ran"
        assert OUTSIDE not in text, f"{where}: a trace outside the profile was read"
        term = render_text(data, verbose=True, width=160)
        assert "\x1b" not in term and "\x07" not in term and "\u202e" not in term, where
        page = html.render(data)
        assert "<script>alert" not in page and "<img src=x" not in page and "onmouseover=\"x" not in page, where
        md = markdown.render(data, full=True)
        assert "<script" not in md and "<img" not in md, where
        assert not re.search(r"(?<!\\)\]\((javascript:|http://evil)", md), f"{where}: a live Markdown link or image"


@pytest.mark.parametrize(("kind", "seed"), [("kineto", 1), pytest.param("db", 1, marks=pytest.mark.slow)])
def test_hostile_names_quick(kind: str, seed: int) -> None:
    check_case(kind, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 14))
@pytest.mark.parametrize("kind", sorted(MUTATORS))
def test_hostile_names(kind: str, seed: int) -> None:
    check_case(kind, seed)
