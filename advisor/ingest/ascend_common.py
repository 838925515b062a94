"""Pieces shared by the Ascend readers (text and database forms): SQL snippets, names, metadata.

Everything here is independent of the file form. The conventions follow
``tests/data/ascend/ascend-formats.md`` (cited as "format doc §N").
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from pathlib import Path
from typing import Any

from advisor.ingest.base import LoadContext, ParseError, insert_rows, one_line
from advisor.kinds import Source

SOURCE_PT = Source.ASCEND_PT.value
SOURCE_MS = Source.ASCEND_MS.value

#: Text (JSON number or string, µs, any number of decimals) -> integer ns. Exact for up to three
#: decimals (format doc §22.3: never via float64, ``ts`` has ns precision at ~1.7e15 µs). DuckDB's
#: cast accepts surrounding blanks/tabs (CANN's trailing tab) and exponents; NaN, Infinity and
#: 1e300 give NULL. Kept deliberately small: expression binding cost matters per file. A DOUBLE
#: input must go through ``CAST(x AS VARCHAR)`` (shortest repr) first: DuckDB's DOUBLE -> DECIMAL
#: cast is not exact (1704161511422740.8 becomes ...740.736).
US_TO_NS = "TRY_CAST(TRY_CAST({x} AS DECIMAL(38,3)) * 1000 AS BIGINT)"
#: Milliseconds (communication files) -> ns. These are derived floats, so DOUBLE is fine.
MS_TO_NS = "TRY_CAST(round(TRY_CAST({x} AS DOUBLE) * 1e6) AS BIGINT)"
#: Communication "MB" is 10^6 bytes (format doc addendum: bandwidth = MB / ms is exact only in decimal units).
MB_TO_BYTES = "TRY_CAST(round(TRY_CAST({x} AS DOUBLE) * 1e6) AS BIGINT)"
#: Memory files use MiB (torch_npu divides bytes by 1024², format doc §3.2).
MIB_TO_BYTES = "TRY_CAST(round(TRY_CAST({x} AS DOUBLE) * 1048576) AS BIGINT)"

#: Communication operator type from its name (hcom_allReduce__445_2, HcclAllReduce, allreduce-top1 ...).
#: Unlike msprof-analyze's regex (format doc §8.4) reduceScatter stays 'reducescatter'.
OP_TYPE_SQL = """CASE
    WHEN regexp_matches(lower({n}), 'batch_?send_?recv') THEN 'sendrecv'
    WHEN regexp_matches(lower({n}), 'reduce_?scatter') THEN 'reducescatter'
    WHEN regexp_matches(lower({n}), 'all_?reduce') THEN 'allreduce'
    WHEN regexp_matches(lower({n}), 'all_?gather') THEN 'allgather'
    WHEN regexp_matches(lower({n}), 'all_?to_?all') THEN 'alltoall'
    WHEN lower({n}) LIKE '%broadcast%' THEN 'broadcast'
    WHEN lower({n}) LIKE '%send%' THEN 'send'
    WHEN regexp_matches(lower({n}), 'receive|recv') THEN 'recv'
    WHEN lower({n}) LIKE '%reduce%' THEN 'reduce'
    WHEN lower({n}) LIKE '%scatter%' THEN 'scatter'
    WHEN lower({n}) LIKE '%gather%' THEN 'gather'
    WHEN lower({n}) LIKE '%barrier%' THEN 'barrier'
    ELSE NULL END"""

#: Bytes per element of HCCL data types (ENUM_HCCL_DATA_TYPE names and the trace's ``data_type`` arg).
HCCL_DTYPE_BYTES_SQL = """CASE upper(coalesce({d}, ''))
    WHEN 'INT8' THEN 1 WHEN 'UINT8' THEN 1 WHEN 'INT16' THEN 2 WHEN 'UINT16' THEN 2
    WHEN 'INT32' THEN 4 WHEN 'UINT32' THEN 4 WHEN 'INT64' THEN 8 WHEN 'UINT64' THEN 8
    WHEN 'FP16' THEN 2 WHEN 'FLOAT16' THEN 2 WHEN 'BFP16' THEN 2 WHEN 'BF16' THEN 2 WHEN 'BFLOAT16' THEN 2
    WHEN 'FP32' THEN 4 WHEN 'FLOAT32' THEN 4 WHEN 'FLOAT' THEN 4 WHEN 'FP64' THEN 8 WHEN 'FLOAT64' THEN 8
    WHEN 'INT128' THEN 16 ELSE NULL END"""

#: Host calls that block on the device (AscendCL@aclrtSynchronizeStream, msprof-analyze looks it up by name).
SYNC_RE = r"(?i)synchroni[sz]e|^(AscendCL@)?aclrtMemcpy$"

#: Step number in communication keys: 'step12' -> 12, bare 'step' -> NULL (format doc §4.3).
STEP_KEY_SQL = "TRY_CAST(regexp_extract({k}, '^[Ss]tep\\s*(\\d+)$', 1) AS INTEGER)"

_NOT_NUMERIC = re.compile(r"[^0-9-]")


def sql_str(s: str) -> str:
    """A SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


def sql_ident(s: str) -> str:
    """A quoted SQL identifier (CSV headers contain spaces, parentheses and sometimes quotes)."""
    return '"' + s.replace('"', '""') + '"'


def group_hash(name: str) -> str:
    """The 64-bit group id CANN writes after '@' in communication keys (format doc §8.4).

    Two 32-bit polynomial hashes (primes 29 and 131) of the communicator name, packed as
    ``(h29 << 32) | h131`` and written in decimal.
    """
    h1 = h2 = 0
    for ch in name:
        h1 = (h1 * 29 + ord(ch)) & 0xFFFFFFFF
        h2 = (h2 * 131 + ord(ch)) & 0xFFFFFFFF
    return str((h1 << 32) | h2)


def short_error(exc: BaseException) -> str:
    """A one-line reason without DuckDB's error-class prefixes."""
    msg = one_line(str(exc), 200)
    for prefix in ("Invalid Input Error: ", "IO Error: ", "Conversion Error: ", "Binder Error: ", "Parser Error: "):
        msg = msg.replace(prefix, "")
    return msg


# -- warnings said once per profile ------------------------------------------------------------

_ONCE: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
_ONCE_LOCK = threading.Lock()


def warn_once(lctx: LoadContext, code: str, message: str, path: Path | str | None = None) -> None:
    """Warn once per load for messages that every rank of a cluster would repeat."""
    with _ONCE_LOCK:
        seen = _ONCE.setdefault(lctx, set())
        if (code, message) in seen:
            return
        seen.add((code, message))
    lctx.warn(code, message, path)


# -- small JSON files: profiler_info*, profiler_metadata ----------------------------------------

MAX_SMALL_JSON = 64 << 20


def read_small_json(path: Path) -> Any:
    """Parse a small JSON file (profiler_info, metadata); ParseError when unreadable."""
    try:
        size = path.stat().st_size
        if size > MAX_SMALL_JSON:
            raise ParseError(path, f"{size} bytes is too large for a metadata file; skipped", code="too_big")
        raw = path.read_bytes()
    except OSError as exc:
        raise ParseError(path, f"cannot read: {exc.strerror or exc}", code="unreadable") from None
    if not raw.strip():
        raise ParseError(path, "empty file; skipped", code="empty_file")
    try:
        return json.loads(raw.decode("utf-8-sig", errors="replace"), parse_constant=lambda _c: None)
    except (ValueError, RecursionError) as exc:
        raise ParseError(path, f"not valid JSON: {one_line(exc, 120)}", code="bad_json") from None


def to_int(v: Any) -> int | None:
    """An int from an int or a decimal string ('3'), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip() and not _NOT_NUMERIC.search(v.strip()):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def rank_from_info(doc: Any) -> int | None:
    """The rank written inside a profiler_info file (torch_npu ``rank_id``, MindSpore ``ms_profiler_info.rank_id``)."""
    if not isinstance(doc, dict):
        return None
    r = to_int(doc.get("rank_id"))
    if r is None and isinstance(doc.get("ms_profiler_info"), dict):
        r = to_int(doc["ms_profiler_info"].get("rank_id"))
    return r if r is not None and r >= 0 else None


def parallel_groups(doc: Any) -> list[dict[str, Any]]:
    """Groups from profiler_metadata ``parallel_group_info`` (dict or JSON string), normalised."""
    if not isinstance(doc, dict):
        return []
    pgi = doc.get("parallel_group_info")
    if isinstance(pgi, str):
        try:
            pgi = json.loads(pgi)
        except ValueError:
            return []
    if not isinstance(pgi, dict):
        return []
    out = []
    for comm_name, g in pgi.items():
        if not isinstance(g, dict):
            continue
        ranks = g.get("global_ranks")
        ranks = [r for r in (to_int(x) for x in ranks) if r is not None] if isinstance(ranks, list) else []
        out.append(
            {
                "comm_name": str(comm_name),
                "group_name": group_hash(str(comm_name)),
                "pg_name": None if g.get("group_name") is None else str(g.get("group_name")),
                "group_rank": to_int(g.get("group_rank")),
                "global_ranks": ranks,
            }
        )
    return out


def rank_from_metadata(doc: Any) -> tuple[int | None, int | None]:
    """(rank, world size) from profiler_metadata: the rank's index in the world group, if listed."""
    groups = parallel_groups(doc)
    world = None
    dist = doc.get("distributed_args") if isinstance(doc, dict) else None
    if isinstance(dist, str):
        try:
            dist = json.loads(dist)
        except ValueError:
            dist = None
    if isinstance(dist, dict):
        world = to_int(dist.get("world_size"))
    rank = None
    best = None
    for g in groups:
        gr, ranks = g["group_rank"], g["global_ranks"]
        if gr is None or not ranks or gr >= len(ranks):
            continue
        if best is None or len(ranks) > len(best["global_ranks"]):
            best = g
    if best is not None:
        rank = best["global_ranks"][best["group_rank"]]
        if world is None and sorted(best["global_ranks"]) == list(range(len(best["global_ranks"]))):
            world = len(best["global_ranks"])
    return rank, world


def _flatten(prefix: str, v: Any, out: list[tuple[str, str]], depth: int = 0) -> None:
    if depth > 6 or len(out) > 2000:
        return
    if isinstance(v, dict):
        for k, x in v.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), x, out, depth + 1)
    elif isinstance(v, list):
        out.append((prefix, json.dumps(v)[:2000]))
    elif v is not None:
        out.append((prefix, str(v)[:2000]))


def _obj(v: Any) -> dict[str, Any]:
    """``v`` when it is a JSON object, else an empty one."""
    return v if isinstance(v, dict) else {}


def info_meta(doc: Any) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Meta rows and ranks info from a profiler_info file (torch_npu or MindSpore, format doc §15)."""
    rows: list[tuple[str, str]] = []
    info: dict[str, Any] = {}
    if not isinstance(doc, dict):
        return rows, info
    for key in ("torch_npu_version", "cann_version", "ms_version", "jit_level", "rank_id"):
        if doc.get(key) is not None:
            rows.append((key, str(doc[key])[:200]))
    cfg = _obj(doc.get("config"))
    exp = _obj(cfg.get("experimental_config"))
    common = _obj(cfg.get("common_config"))
    params = _obj(doc.get("profiler_parameters"))
    level = exp.get("_profiler_level") or params.get("profiler_level")
    if level is not None:
        rows.append(("profiler_level", str(level)))
    aic = exp.get("_aic_metrics") or params.get("aic_metrics")
    if aic is not None:
        rows.append(("aic_metrics", str(aic)))
    acts = common.get("activities") or params.get("activities")
    if acts is not None:
        rows.append(("activities", json.dumps(acts) if not isinstance(acts, str) else acts))
    ms_info = _obj(doc.get("ms_profiler_info"))
    if ms_info.get("device_id") is not None:
        rows.append(("device_id", str(ms_info["device_id"])))
    flat: list[tuple[str, str]] = []
    for top in ("config", "profiler_parameters", "cann_profiler_info"):
        if top in doc:
            _flatten(f"profiler_info.{top}", doc[top], flat)
    rows.extend(flat)
    end = _obj(doc.get("end_info"))
    if end.get("collectionTimeEnd") is not None:
        rows.append(("collection_end_ns", str(end["collectionTimeEnd"])))
    return rows, info


def metadata_meta(doc: Any) -> tuple[list[tuple[str, str]], list[dict[str, Any]], dict[str, Any]]:
    """Meta rows, groups and ranks info from profiler_metadata.json (format doc §16)."""
    rows: list[tuple[str, str]] = []
    info: dict[str, Any] = {}
    if not isinstance(doc, dict):
        return rows, [], info
    for key, v in doc.items():
        if key == "ENV_VARIABLES":
            env = v
            if isinstance(env, str):
                try:
                    env = json.loads(env)
                except ValueError:
                    env = {}
            if isinstance(env, dict):
                rows.extend((f"env.{k}", "" if x is None else str(x)[:2000]) for k, x in env.items())
        elif key == "parallel_group_info":
            continue
        elif key == "distributed_args":
            d = v
            if isinstance(d, str):
                try:
                    d = json.loads(d)
                except ValueError:
                    d = {"value": d}
            _flatten("distributed_args", d, rows)
        else:
            rows.append((f"metadata.{key}", v if isinstance(v, str) else json.dumps(v)[:2000]))
    groups = parallel_groups(doc)
    _rank, world = rank_from_metadata(doc)
    if world:
        info["world_size"] = world
    return rows, groups, info


def insert_meta(cur: Any, rank: int, rows: list[tuple[str, str]]) -> None:
    """Insert meta rows (deduplicated by key, first wins)."""
    seen: set[str] = set()
    vals = []
    for k, v in rows:
        if k in seen:
            continue
        seen.add(k)
        vals.append((rank, k, v))
    if vals:
        insert_rows(cur, "meta", vals)


def insert_groups(cur: Any, rank: int, groups: list[dict[str, Any]]) -> None:
    """Insert comm_groups rows."""
    if groups:
        insert_rows(
            cur,
            "comm_groups",
            [
                (rank, g["group_name"], g["comm_name"], g["pg_name"], g["group_rank"], json.dumps(g["global_ranks"]))
                for g in groups
            ],
        )
