"""Every canonical table an Ascend input loads into, as sorted text rows (a refactor's regression guard).

Rows are written as text with the input's root replaced by ``<root>`` and each ``file_id``
replaced by its file's path, so a dump does not depend on where the input lies or on the order
in which file ids were handed out. :func:`digests` reduces a dump to (row count, sha256) per
table; ``scripts/ascend_dump.py`` writes whole dumps for comparing by eye.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.schema import TABLES

_FILE_ID_TABLES = ("events", "kernels", "comm_ops", "profile_files")
#: Ids the reader makes up (from a staging row's number: they depend on the order files were
#: scanned in) start here; they are renumbered by first use in the sorted rows.
_SYNTHETIC = 1 << 62
_ID_COLUMNS = ("corr", "ext_id", "wait_corr")


def _cell(v: Any, root: str) -> str:
    s = repr(v)
    return s.replace(root, "<root>")


def dump(path: Path, columns: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """{table: sorted rows as text} for every canonical table (or the ``columns`` of the tables
    given), plus ``warnings`` (the load's problems)."""
    from advisor.ingest import load
    from advisor.metrics import finish_load
    from advisor.model import Warning_
    from advisor.text import one_line

    prof = load(path)
    # the analysis's next step over the loaded tables: the exports' series kept under their own names
    finish_load(prof.con, lambda code, message, p=None: prof.warnings.append(
        Warning_(code, one_line(message, 500), None if p is None else str(p))), (), None, str(path))
    root = str(Path(path).resolve())
    con = prof.con
    paths = dict(con.execute("SELECT file_id, path FROM profile_files").fetchall())
    out: dict[str, list[str]] = {}
    wanted = columns if columns is not None else {n: list(t.column_names) for n, t in TABLES.items()}
    for name, cols in wanted.items():
        if name == "warnings":
            continue
        rows = con.execute(f"SELECT {', '.join(cols)} FROM {name}").fetchall()
        fi = cols.index("file_id") if name in _FILE_ID_TABLES and "file_id" in cols else None
        ids = [i for i, c in enumerate(cols) if c in _ID_COLUMNS] if name == "events" else []
        keyed = []
        for r in rows:
            vals = list(r)
            if fi is not None:
                vals[fi] = paths.get(vals[fi], vals[fi])
            masked = ["#" if i in ids and isinstance(v, int) and v >= _SYNTHETIC else v for i, v in enumerate(vals)]
            keyed.append(("\t".join(_cell(v, root) for v in masked), vals))
        keyed.sort(key=lambda kv: kv[0])
        renum: dict[tuple[Any, int], int] = {}
        lines = []
        for _, vals in keyed:
            for i in ids:
                v = vals[i]
                if isinstance(v, int) and v >= _SYNTHETIC:
                    vals[i] = f"id{renum.setdefault((vals[0], v), len(renum))}"
            lines.append("\t".join(_cell(v, root) for v in vals))
        out[name] = sorted(lines)
    out["warnings"] = sorted(
        f"{w.code}\t{w.message}\t{w.path}".replace(root, "<root>") for w in prof.warnings
    )
    con.close()
    return out


def normalised_warning(line: str) -> str:
    """A warning without what depends on the input's location: a message cut to its length limit
    (ending in '…') is kept up to the first path it quotes (where the cut falls depends on it)."""
    code, message, path = line.split("\t")
    if message.endswith("…"):
        message = message.replace("<root>", "/").split("/", 1)[0] + "…"
    return f"{code}\t{message}\t{path}"


def digests(d: dict[str, list[str]]) -> dict[str, list[Any]]:
    """{table: [row count, sha256 of the sorted rows]}."""
    d = {**d, "warnings": sorted(normalised_warning(w) for w in d.get("warnings", []))}
    return {k: [len(v), hashlib.sha256("\n".join(v).encode()).hexdigest()] for k, v in sorted(d.items())}


# -- the inputs ---------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _variant(base: Path, dest: Path, drop: tuple[str, ...] = (), garble: tuple[str, ...] = (), every: int = 1) -> Path:
    """A copy of ``base`` without the files named in ``drop`` and with every ``every``-th file named
    in ``garble`` (sorted by path) replaced by bytes no reader accepts."""
    shutil.copytree(base, dest)
    for p in sorted(dest.rglob("*")):
        if p.name in drop:
            p.unlink()
    for i, p in enumerate(sorted(q for q in dest.rglob("*") if q.name in garble)):
        if i % every == 0:
            p.write_text('[{"ph": "X", broken' if p.suffix == ".json" else "garbage\n")
    return dest


def _ms_db(db_export: Path, dest: Path) -> Path:
    """A lone MindSpore-named profiler database (flavour and rank from the file name)."""
    out = dest / "x" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    shutil.copy(next(db_export.rglob("ascend_pytorch_profiler_*.db")), out / "ascend_mindspore_profiler_3.db")
    return dest


def inputs(tmp: Path, generated: dict[str, Path]) -> dict[str, Callable[[], Path]]:
    """The repository's Ascend inputs, by name, each built on demand. ``generated`` holds the
    generator's ``faults8`` text and db clusters (key ``faults8_text`` / ``faults8_db``)."""
    samples, data = REPO / "sample_profiles", REPO / "tests" / "data"
    text, db = generated["faults8_text"], generated["faults8_db"]
    return {
        "sample_ascend_pt_kernels": lambda: samples / "ascend_pt_kernels",
        "sample_ascend_pt_timeline": lambda: samples / "ascend_pt_timeline",
        "real_ascend_pt_resnet_ddp_l1_db": lambda: data / "ascend_real" / "ascend_pt_resnet_ddp_l1_db",
        "real_ascend_pt_resnet_ddp_l1_text": lambda: data / "ascend_real" / "ascend_pt_resnet_ddp_l1_text",
        "data_ascend_pt_timeline": lambda: data / "ascend" / "ascend_pt_timeline",
        "gen_faults8_text": lambda: text,
        "gen_faults8_db": lambda: db,
        "gen_mindspore4_text": lambda: generated["mindspore4_text"],
        # partial exports take the fallback paths: kernels from the timeline, device events from
        # kernel_details.csv, comm_ops from the timeline or the kernel table
        "var_no_trace": lambda: _variant(text, tmp / "var_no_trace", drop=("trace_view.json",)),
        "var_no_kernels": lambda: _variant(text, tmp / "var_no_kernels", drop=("kernel_details.csv",)),
        "var_no_comm": lambda: _variant(
            text, tmp / "var_no_comm", drop=("communication.json", "communication_matrix.json")
        ),
        "var_no_trace_no_comm": lambda: _variant(
            text, tmp / "var_no_trace_no_comm", drop=("trace_view.json", "communication.json")
        ),
        "var_no_metadata": lambda: _variant(text, tmp / "var_no_metadata", drop=("profiler_metadata.json",)),
        "var_bad_kernels": lambda: _variant(text, tmp / "var_bad_kernels", garble=("kernel_details.csv",)),
        "var_bad_trace": lambda: _variant(text, tmp / "var_bad_trace", garble=("trace_view.json",), every=2),
        "var_ms_db": lambda: _ms_db(db, tmp / "var_ms_db"),
    }
