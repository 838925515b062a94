"""A Prometheus HTTP API answer to a range (or instant) query, saved as JSON: the form a TSDB
such as Moneo's keeps its series in.

``GET /api/v1/query_range`` answers ``{"status": "success", "data": {"resultType": "matrix",
"result": [{"metric": {"__name__": ..., <labels>}, "values": [[<unix s>, "<value>"], ...]}]}}``;
an instant query has ``"resultType": "vector"`` and one ``"value"`` per series.
https://prometheus.io/docs/prometheus/latest/querying/api/#range-queries
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.metrics.common import MetricsError, ReadContext, Sample, epoch_ns, parse_number
from advisor.metrics.dcgm import device_of, labels_of, node_of
from advisor.metrics.vocab import CANONICAL, DCGM_NAMES, Alias


def sniff(head: str) -> bool:
    return head.lstrip().startswith("{") and ('"resultType"' in head or ('"data"' in head and '"result"' in head))


def _alias(name: str) -> Alias | None:
    key = name.lower()
    if key in CANONICAL:
        return key, 1.0
    return DCGM_NAMES.get(key)


def read(text: str, path: Path, rc: ReadContext) -> list[Sample]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MetricsError(f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise MetricsError("no data.result list (a Prometheus /api/v1/query_range answer)")
    if doc.get("status") not in (None, "success"):
        raise MetricsError(f"the query failed: status {doc.get('status')!r}: {str(doc.get('error', ''))[:120]}")
    kind = data.get("resultType")
    if kind not in ("matrix", "vector"):
        raise MetricsError(f"resultType {kind!r}: only matrix (range query) and vector answers hold series")
    out: list[Sample] = []
    for series in data["result"]:
        if not isinstance(series, dict):
            continue
        metric: dict[str, Any] = series.get("metric") or {}
        name = str(metric.get("__name__") or "unnamed")
        labels = labels_of(",".join(f'{k}="{v}"' for k, v in metric.items() if isinstance(v, str)))
        points = series.get("values") if kind == "matrix" else [series.get("value")]
        for p in points or []:
            if not isinstance(p, list) or len(p) != 2:
                continue
            ts = epoch_ns(p[0]) if isinstance(p[0], int | float | str) else None
            value, _u = parse_number(str(p[1]))
            if value is None:
                continue
            out.append(rc.sample(ts, node_of(labels), device_of(labels), name, value, "prometheus", _alias(name)))
    if not out:
        raise MetricsError("no sample in data.result")
    return out
