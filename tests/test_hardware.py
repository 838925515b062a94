"""The hardware stage (advisor/stages/hardware.py): devices, steps, phases, Moneo-style metric
selection and divergence, the report's ``hardware`` field and its rendering.

Series come from tests/hardware_fixtures.py, whose levels per phase are stated there; every
expected figure below is worked out from those levels (noise is at most the stated share)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from advisor.analyze import analyze_context
from advisor.config import Config
from advisor.render import html, markdown, terminal
from advisor.render.markdown import MD_LIMIT
from advisor.stages import hardware
from advisor.testing import context_from_tables
from tests.conftest import report_json
from tests.hardware_fixtures import MS, T0, insert_series, job

# one worker runs this module: its module-scoped fixtures are built once
pytestmark = pytest.mark.xdist_group("hardware")


@pytest.fixture(scope="module")
def healthy_ctx() -> Any:
    return job()


@pytest.fixture(scope="module")
def healthy(healthy_ctx: Any) -> hardware.Hardware:
    return hardware.get(healthy_ctx)


@pytest.fixture(scope="module")
def healthy_report(healthy_ctx: Any) -> Any:
    return analyze_context(healthy_ctx, Config(select=["HW001", "HW004", "CMP005"]))


def test_distance_is_moneo_eq1_as_rms() -> None:
    # ((1-1)/4)^2 = 0, ((2-4)/4)^2 = 0.25 -> sqrt(0.25 / 2) = 0.353553
    assert hardware.distance(np.array([1.0, 2.0]), np.array([1.0, 4.0]), 4.0) == pytest.approx(0.353553, abs=1e-6)
    # cells missing in either series are left out
    assert hardware.distance(np.array([1.0, np.nan]), np.array([1.0, 4.0]), 4.0) == 0.0
    assert hardware.distance(np.array([np.nan]), np.array([1.0]), 4.0) is None


def test_selection_drops_constant_and_redundant(healthy: hardware.Hardware) -> None:
    by = {m["metric"]: m for m in healthy.metrics}
    # noise at most 0.5 % (std under 1 % of the maximum) or none: constant
    constant = {"power_limit_w", "mem_total_bytes", "ecc_errors", "mem_used_bytes", "clock_sm_mhz", "temp_gpu_c"}
    assert {m for m, r in by.items() if r["dropped"] == "constant"} == constant
    # dram_active is half of sm_active in every phase; rx equals tx: the same series once divided by the maximum
    assert {m: r["like"] for m, r in by.items() if r["dropped"] == "redundant"} == {
        "dram_active_pct": "sm_active_pct", "pcie_rx_bps": "pcie_tx_bps", "nvlink_rx_bps": "nvlink_tx_bps"}
    assert healthy.kept == ["util_gpu_pct", "sm_active_pct", "tensor_active_pct", "power_w", "pcie_tx_bps",
                            "nvlink_tx_bps"]


def test_devices_steps_and_phases(healthy: hardware.Hardware) -> None:
    assert list(healthy.devices["label"]) == [f"rank {r} (node0/GPU-{r})" for r in range(8)]
    assert healthy.phases_known
    util = healthy.series("util_gpu_pct")
    # 20 samples per step at (k + 0.5) / 20: 12 in the kernel (first 60 %), 6 in the collective, 2 idle
    counts = util[util["dev"] == "r0"].groupby("phase").size().to_dict()
    assert counts == {"compute": 120, "comm": 60, "idle": 20}
    assert sorted(util["step"].unique()) == list(range(1, 11))
    by = {m["metric"]: m for m in healthy.metrics}
    assert by["util_gpu_pct"]["by_phase"] == pytest.approx({"compute": 95.0, "comm": 90.0, "idle": 3.0}, rel=0.01)
    # per step: (12 x 95 + 6 x 90 + 2 x 3) / 20 = 84.3
    step = healthy.by_step[(healthy.by_step["metric"] == "util_gpu_pct") & (healthy.by_step["dev"] == "r2")]
    assert len(step) == 10
    assert step["mean"].to_numpy() == pytest.approx([84.3] * 10, rel=0.01)


def test_divergence_hand_example() -> None:
    """Four devices, one series, 128 samples 1 ms apart: devices 0-2 at 100 W for the first 64 samples
    and 200 W after; device 3 at 100 W throughout. Bins 0-31 hold only the first half, 32-63 only
    the second. Device 3 against its peers' median (100 then 200): half the bins differ by 100 of a
    200 W maximum -> sqrt(0.5 x 0.5^2) = 0.353553; devices 0-2 against theirs (two at 200, one at 100
    in the second half: median 200) -> 0."""
    ctx = context_from_tables({})
    rows = [(None, "power_w", T0 + i * MS, 100.0 if (i < 64 or d == 3) else 200.0, f"GPU-{d}", "n", "W", "csv")
            for d in range(4) for i in range(128)]
    insert_series(ctx, pd.DataFrame(rows, columns=["rank", "metric", "ts_ns", "value", "device", "node", "unit",
                                                   "source"]))
    hw = hardware.get(ctx)
    scores = dict(zip(hw.scores()["dev"], hw.scores()["distance"], strict=True))
    assert scores["d:n/GPU-3"] == pytest.approx(0.353553, abs=1e-6)
    assert [scores[f"d:n/GPU-{d}"] for d in range(3)] == [0.0, 0.0, 0.0]
    assert not hw.phases_known and set(hw.samples["step"]) == {-1}


def test_report_field_lines_and_schema(healthy_report: Any) -> None:
    d = report_json(healthy_report)
    hw = d["hardware"]
    assert hw["devices"] == 8 and hw["timeline"]["mode"] == "lines"
    assert [s["metric"] for s in hw["series"]] == hw["kept"]
    assert all(len(r["values"]) == hardware.LINE_POINTS for s in hw["series"] for r in s["rows"])
    assert [m["step"] for m in hw["timeline"]["steps"]] == list(range(1, 11))
    # the breakdown of every step: 60 % compute, 30 % communication alone, 10 % idle
    assert hw["timeline"]["steps"][0]["phases"] == pytest.approx(
        {"compute_only": 0.6, "overlapped": 0.0, "comm_only": 0.3, "host_only": 0.0, "free": 0.1})
    assert {x["metric"]: x["reason"] for x in hw["dropped"]}["ecc_errors"] == "constant"


def test_stage_report_is_bounded_for_1024_devices() -> None:
    from tests.hardware_fixtures import series

    ctx = context_from_tables({})
    insert_series(ctx, series(n_dev=1024, n_steps=2, spp=4, ranked=False, metrics=("util_gpu_pct", "power_w")))
    hw = hardware.report(hardware.get(ctx))
    assert hw is not None and hw["devices"] == 1024 and hw["timeline"]["mode"] == "heatmap"
    assert sum(len(r["values"]) for s in hw["series"] for r in s["rows"]) <= hardware.MAX_HEAT_CELLS


@pytest.mark.slow
def test_report_is_bounded_for_1024_devices() -> None:
    ctx = context_from_tables({})
    from tests.hardware_fixtures import series

    insert_series(ctx, series(n_dev=1024, n_steps=2, spp=10, ranked=False,
                              metrics=("util_gpu_pct", "sm_active_pct", "power_w", "nvlink_tx_bps", "pcie_tx_bps")))
    rep = analyze_context(ctx)
    d = report_json(rep)
    hw = d["hardware"]
    assert hw["devices"] == 1024 and hw["timeline"]["mode"] == "heatmap"
    cells = sum(len(r["values"]) for s in hw["series"] for r in s["rows"])
    assert cells <= hardware.MAX_HEAT_CELLS
    assert len(json.dumps(hw)) < 1_500_000
    page = html.render(rep)
    assert page.count('<image href="data:image/png;base64,') == len(hw["series"])
    assert len(markdown.render(rep)) <= MD_LIMIT


def test_profile_strings_are_escaped() -> None:
    ctx = context_from_tables({})
    evil = "<script>alert(1)</script>"
    rows = [(None, "power_w", T0 + i * MS, float(100 + (i % 7) * d), evil + str(d), "n|*x*", "W", "csv")
            for d in range(3) for i in range(50)]
    insert_series(ctx, pd.DataFrame(rows, columns=["rank", "metric", "ts_ns", "value", "device", "node", "unit",
                                                   "source"]))
    rep = analyze_context(ctx)
    page = html.render(rep)
    assert evil not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    md = markdown.render(rep)
    assert "<script>" not in md


def test_markdown_and_terminal_give_one_line_per_metric(healthy_report: Any) -> None:
    rep = healthy_report
    md = markdown.render(rep)
    part = md[md.index("## Hardware metrics"):]
    part = part[:part.index("###")]
    assert sum(1 for line in part.splitlines() if line.startswith("- ")) == 15
    text = terminal.render_text(rep, verbose=True, width=200)
    assert "Hardware metrics (8 devices, 6 of 15 kept)" in text
    assert "util_gpu_pct: mean" in text and "ecc_errors: mean 0" in text


def test_no_series_no_field() -> None:
    from tests.hardware_fixtures import events

    rep = analyze_context(context_from_tables(events(2, 2)))
    assert rep.hardware is None
    assert "hardware" not in report_json(rep)
    assert 'id="hardware"' not in html.render(rep)


def test_unit_formatting() -> None:
    assert hardware.fmt_value("mem_used_bytes", 999_999_999.99) == "1 GB"
    assert hardware.fmt_value("nvlink_tx_bps", 2.5e11) == "250 GB/s"
    assert hardware.fmt_value("util_gpu_pct", 84.25) == "84.2%"
    assert hardware.fmt_value("power_w", math.nan) == "-"


def test_dense_series_are_averaged_into_bounded_buckets() -> None:
    """50 steps x 100 samples = 5,000 per device, over the 4,000 bound: averaged over 4,000 time
    buckets; the mean stays (60 x 95 + 30 x 90 + 10 x 3) / 100 = 84.3 %."""
    from tests.hardware_fixtures import series

    ctx = context_from_tables({})
    insert_series(ctx, series(n_dev=2, n_steps=50, spp=100, ranked=False, metrics=("util_gpu_pct",)))
    hw = hardware.get(ctx)
    assert hw.samples.groupby("dev").size().max() <= hardware.MAX_PER_SERIES
    assert hw.metrics[0]["mean"] == pytest.approx(84.3, rel=0.005)
