"""The HTML report in a real browser: headless Chromium (Debian ``chromium`` + ``chromium-driver``) via Selenium.

Loads the file from disk with the network cut off, checks that findings and charts are in the DOM, that no
request left the page, that an operator named ``<script>…</script>`` shows as text, and that a 64-rank report
is small and opens fast. Screenshots go to ``$ADVISOR_ARTIFACTS`` (default ``./artifacts``).

Skips when Chromium, chromedriver or the ``selenium`` package is missing, unless ``ADVISOR_REQUIRE_BROWSER=1``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, TRACES
from tests.render_helpers import EVIL_NAMES, run_cli, write_cluster, write_evil_trace

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = os.environ.get("ADVISOR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ADVISOR_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("ADVISOR_ARTIFACTS") or ROOT / "artifacts")


def _missing() -> str | None:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        return f"chromium not installed ({CHROMIUM}, {CHROMEDRIVER}): apt-get install -y chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "python package selenium not installed: pip install selenium"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    why = _missing()
    if why:
        if os.environ.get("ADVISOR_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile_dir = tempfile.mkdtemp(prefix="advisor-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000",
                 # belt and braces: even if something tried, no name resolves and no proxy answers
                 "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
                 f"--user-data-dir={profile_dir}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)  # no Selenium Manager download
    driver.set_page_load_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions",
                           {"offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0})
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)


def _open(driver, path: Path) -> float:
    t0 = time.perf_counter()
    driver.get(path.resolve().as_uri())
    # get() can hand back between two file:// documents while the new one still parses (seen on a
    # loaded machine): wait for the document itself to say it is complete
    deadline = t0 + 60
    while driver.execute_script("return document.readyState") != "complete":
        assert time.perf_counter() < deadline, f"{path.name} did not finish loading within 60 s"
        time.sleep(0.05)
    return time.perf_counter() - t0


def _no_requests(driver) -> None:
    entries = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert entries == [], f"the page fetched {entries}"
    assert driver.execute_script("return document.documentElement.getAttribute('data-js')") == "ready", \
        "the inline script did not run (CSP hash mismatch?)"


def _shot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(int(height) + 40, 8000))
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    assert path.stat().st_size > 10_000
    return path


def test_report_in_browser(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    out = tmp_path / "gloo.html"
    res = run_cli(TRACES / "gloo_slow_rank", "--format", "html", "--out", out, "--baseline", TRACES / "gloo_slow_rank")
    assert res.returncode == 0, res.stderr
    _open(browser, out)
    _no_requests(browser)
    assert browser.find_element(By.ID, "verdict").text.strip()
    cards = browser.find_elements(By.CSS_SELECTOR, "details.finding")
    assert len(cards) == len(browser.find_elements(By.CSS_SELECTOR, "#findings-table tbody tr")) >= 1
    for chart in ("chart-breakdown", "chart-ranks", "chart-series", "chart-cp-timeline", "chart-cp-ops"):
        svg = browser.find_element(By.CSS_SELECTOR, f"#{chart} svg")
        assert svg.size["width"] > 300 and svg.size["height"] > 40, chart
    assert browser.find_elements(By.ID, "baseline-diff")
    # the sort script works: clicking "saving" twice puts the smallest saving first
    header = browser.find_elements(By.CSS_SELECTOR, "#findings-table th")[3]
    header.click()
    header.click()
    assert header.get_attribute("data-dir") == "asc"
    _shot(browser, "report-gloo_slow_rank.png")


def test_script_names_are_text(browser, tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    prof = tmp_path / "evil"
    write_evil_trace(prof)
    out = tmp_path / "evil.html"
    assert run_cli(prof, "--format", "html", "--out", out).returncode == 0
    _open(browser, out)
    _no_requests(browser)
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert browser.execute_script("return document.scripts.length") == 1
    cells = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#critical-path-table td.name")]
    assert EVIL_NAMES[0] in cells and EVIL_NAMES[1] in cells and EVIL_NAMES[2] in cells
    assert browser.execute_script("return document.querySelectorAll('[onmouseover]').length") == 0
    _shot(browser, "report-escaping.png")


def test_64_rank_report_is_small_and_fast(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    prof = write_cluster(tmp_path / "cluster64", ranks=64, slow=37)
    out = tmp_path / "cluster64.html"
    res = run_cli(prof, "--format", "html", "--out", out)
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size < 5_000_000
    elapsed = _open(browser, out)  # cold: the first load of this file
    nav = browser.execute_script(
        "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime")
    assert elapsed < 2.0 and nav < 2000, (elapsed, nav)
    _no_requests(browser)
    rows = browser.find_elements(By.CSS_SELECTOR, "#chart-ranks g.rank-row")
    assert len(rows) == 64
    slow = browser.find_elements(By.CSS_SELECTOR, "#chart-ranks g.rank-row.slow")
    assert len(slow) == 1 and "rank 37" in slow[0].get_attribute("textContent")
    _shot(browser, "report-64-ranks.png")


def _assert_chart_drawn(driver, chart: str, mark: str) -> None:
    """The chart's SVG is rendered (non-empty box), labelled with aria-label, and has ``mark`` elements with area."""
    from selenium.webdriver.common.by import By

    svg = driver.find_element(By.CSS_SELECTOR, f"#{chart} svg")
    assert svg.get_attribute("role") == "img", chart
    assert (svg.get_attribute("aria-label") or "").strip(), chart
    assert svg.size["width"] > 100 and svg.size["height"] > 40, (chart, svg.size)
    boxes = driver.execute_script(
        "return Array.from(arguments[0].querySelectorAll(arguments[1])).map(e => e.getBBox())"
        ".filter(b => b.width > 0 || b.height > 0).length", svg, mark)
    assert boxes > 0, (chart, mark)


def test_every_chart_is_drawn_for_a_profile_with_its_data(browser, tmp_path: Path) -> None:
    """A generated Ascend cluster (communication_matrix.json) draws the communication matrix besides
    the breakdown, per-rank, step-time and critical-path charts; a Kineto GPU trace with FLOP counts
    draws the roofline. A chart whose data is absent is not in the page."""
    from selenium.webdriver.common.by import By

    from tests.test_html_charts import write_ascend_cluster, write_gpu_roofline_trace

    write_ascend_cluster(tmp_path / "cluster")
    write_gpu_roofline_trace(tmp_path / "gpu")
    expected = {
        "cluster": {"chart-breakdown": "rect", "chart-ranks": "rect", "chart-series": "polyline",
                    "chart-cp-timeline": "rect", "chart-cp-ops": "rect", "chart-comm": "rect"},
        "gpu": {"chart-breakdown": "rect", "chart-series": "polyline", "chart-cp-timeline": "rect",
                "chart-cp-ops": "rect", "chart-roofline": "circle"},
    }
    for name, charts in expected.items():
        out = tmp_path / f"{name}.html"
        res = run_cli(tmp_path / name, "--format", "html", "--out", out)
        assert res.returncode == 0, res.stderr
        _open(browser, out)
        _no_requests(browser)
        for chart, mark in charts.items():
            _assert_chart_drawn(browser, chart, mark)
        absent = {"chart-comm", "chart-roofline"} - set(charts)
        for chart in absent:
            assert not browser.find_elements(By.ID, chart), chart
        _shot(browser, f"report-charts-{name}.png")


def test_hardware_section_renders(browser, tmp_path: Path) -> None:
    """Series per device over the timeline (lines for 8 devices, a PNG heat map for 40), steps shaded,
    the breakdown's phases beneath; device names from the profile stay text."""
    import pandas as pd
    from selenium.webdriver.common.by import By

    from advisor.analyze import analyze_context
    from advisor.config import Config
    from advisor.render import html
    from advisor.testing import context_from_tables
    from tests.hardware_fixtures import insert_series, job, series

    rep = analyze_context(job(plants={"throttle": (3, 5)}), Config(select=["CMP005", "HW004"]))
    out = tmp_path / "hardware.html"
    out.write_text(html.render(rep), encoding="utf-8")
    _open(browser, out)
    _no_requests(browser)
    section = browser.find_element(By.ID, "hardware")
    assert "clock_sm_mhz" in section.text and "dropped: constant" in section.text
    for chart in (c.get_attribute("id") for c in browser.find_elements(By.CSS_SELECTOR, "#hardware figure.hw-chart")):
        _assert_chart_drawn(browser, chart, "polyline")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#hw-0 rect.hw-step")) == 10
    assert len(browser.find_elements(By.CSS_SELECTOR, "#hw-0 rect.ph-compute_only")) == 10
    _shot(browser, "report-hardware.png")

    ctx = context_from_tables({})
    df = series(n_dev=40, n_steps=2, spp=10, ranked=False, metrics=("util_gpu_pct", "power_w"))
    df["device"] = df["device"] + "<script>alert(1)</script>"
    insert_series(ctx, pd.DataFrame(df))
    heat = tmp_path / "hardware-heat.html"
    heat.write_text(html.render(analyze_context(ctx, Config(select=["HW004"]))), encoding="utf-8")
    _open(browser, heat)
    _no_requests(browser)
    assert browser.execute_script("return document.scripts.length") == 1
    for chart in (c.get_attribute("id") for c in browser.find_elements(By.CSS_SELECTOR, "#hardware figure.hw-chart")):
        _assert_chart_drawn(browser, chart, "image")
    _shot(browser, "report-hardware-heatmap.png")
def test_variability_section_renders(browser, tmp_path: Path) -> None:
    """The Variability section of an 8-rank job whose varying kernel is named like markup: the histogram and CDF
    are drawn, the contributor and prediction tables are filled, and the name is text."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    from tests.test_variability_cluster import STEPS, draw, write_cluster

    name = "<img src=x onerror=alert(1)>gemm"
    prof = write_cluster(tmp_path / "var8", draw(8, STEPS, 1), gemm_name=name)
    out = tmp_path / "var8.html"
    res = run_cli(prof, "--format", "html", "--out", out)
    assert res.returncode in (0, 1), res.stderr
    _open(browser, out)
    _no_requests(browser)
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    _assert_chart_drawn(browser, "chart-variability", "rect")
    _assert_chart_drawn(browser, "chart-variability", "polyline")
    cells = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#variability table.var-ops td.name")]
    assert cells and cells[0] == name
    assert len(browser.find_elements(By.CSS_SELECTOR, "#variability table.var-pred tbody tr")) == 4
    assert browser.execute_script("return document.querySelectorAll('#variability img').length") == 0
    _shot(browser, "report-variability.png")
def test_step_matrix_picture_renders(browser, tmp_path: Path) -> None:
    """A generated 16-rank pipeline job with a slow stage (tests/ascend/gen_cluster.py): the ranks x
    steps picture draws one cell per rank and step, the slow stage's cells in the warm colours, and
    the parallel-groups table lists every group."""
    import dataclasses

    from selenium.webdriver.common.by import By

    from tests.ascend.gen_cluster import SCENARIOS, generate

    facts = generate(dataclasses.replace(SCENARIOS["layout_dp4_tp2_pp2"], slow_stage=0), tmp_path / "pp")
    out = tmp_path / "pp.html"
    res = run_cli(tmp_path / "pp", "--format", "html", "--out", out)
    assert res.returncode in (0, 1), res.stderr
    _open(browser, out)
    _no_requests(browser)
    _assert_chart_drawn(browser, "chart-step-matrix", "rect")
    fills = [r.get_attribute("fill") for r in browser.find_elements(By.CSS_SELECTOR, "#chart-step-matrix svg rect")]
    assert len(fills) == 16 * len(facts.steps)
    warm = {"#fde0c5", "#fab27b", "#ef6f3a", "#b52a1c"}
    assert all(f in warm for f in fills[: 8 * len(facts.steps)])  # stage 0's rows come first
    assert not any(f in warm for f in fills[8 * len(facts.steps):])
    rows = browser.find_elements(By.CSS_SELECTOR, "#parallel-groups tbody tr")
    assert len(rows) == len(facts.groups)
    _shot(browser, "report-step-matrix.png")


def _long_strings_report(base: dict) -> dict:
    """``base`` (a JSON report) with an unbreakable 2,000-character string in every place a profile
    fills: the path, operator names, a finding's title, cause, evidence, operators and top rows, the
    critical path, the variability table, a warning."""
    import copy

    d = copy.deepcopy(base)
    word = "void_at::native::elementwise_kernel<" + "x" * 2000 + ">"
    d["profile"]["path"] = "/data/" + word
    for f in d["findings"]:
        f["title"] += " " + word
        f["cause"] = word
        f["evidence"]["long_note"] = word
        f["ops"] = [word, *(f.get("ops") or [])]
        for t in f.get("top") or []:
            t["name"] = word
    for op in (d.get("critical_path") or {}).get("ops") or []:
        op["name"] = word
    for op in (d.get("variability") or {}).get("ops") or []:
        op["name"] = word
    d["warnings"].append({"code": "long", "path": "/data/" + word, "message": word})
    return d


def test_the_page_never_scrolls_sideways(browser, tmp_path: Path) -> None:
    """At 1,400 and 820 px the page is no wider than the window: long evidence strings, demangled
    kernel names and paths wrap or scroll inside their own box (issue 32)."""
    import json

    from advisor.render import html

    sample = ROOT / "sample_profiles" / "kineto_gloo_slow_rank"
    src = tmp_path / "gloo.json"
    res = run_cli(sample, "--out", src)
    assert res.returncode == 0, res.stderr
    report = json.loads(src.read_text(encoding="utf-8"))
    pages = {"gloo": html.render(report), "long-names": html.render(_long_strings_report(report))}
    try:
        for name, text in pages.items():
            out = tmp_path / f"{name}.html"
            out.write_text(text, encoding="utf-8")
            for width in (1400, 820):
                browser.set_window_size(width, 1000)
                _open(browser, out)
                # every details element open, so what a click would show is measured too
                browser.execute_script("document.querySelectorAll('details').forEach(e => e.open = true)")
                wide, inner = browser.execute_script(
                    "return [document.documentElement.scrollWidth, window.innerWidth]")
                assert wide <= inner, f"{name} at {width} px: the page is {wide} px wide in a {inner} px window"
    finally:
        browser.set_window_size(1400, 1000)
