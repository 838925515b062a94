"""Where the rule configuration comes from, and every report saying so: an ``advisor.toml`` picked up
from the working directory is a warning and named in each format; one inside the profile directory
is never picked up (a profile is untrusted: its own config could skip every rule)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from advisor.render import html, markdown
from advisor.render.terminal import render_text
from tests.cli_run import cli
from tests.conftest import TRACES, validate_report

SLOW_DL = TRACES / "cpu_slow_dataloader"
# the trace's README: the data loader takes 73-76 % of each step, so IO001 fires at its default threshold
SILENCING = '[rules]\nskip = ["CPU004"]\n[thresholds.IO001]\nmin_share = 0.95\n'


def run(profile: Path, cwd: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    p = cli("analyze", profile, "--format", "json", "--out", out, *args, cwd=cwd)
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    validate_report(data)
    return p, data


def test_a_config_picked_up_from_the_working_directory_is_a_warning_and_named(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "advisor.toml").write_text(SILENCING)
    p, data = run(SLOW_DL, work, tmp_path / "r.json")
    assert "IO001" not in {f["rule"] for f in data["findings"]}  # the file was applied
    cfg = data["config"]
    assert cfg["file"] == str((work / "advisor.toml").resolve()) and cfg["implicit"] is True
    assert cfg["thresholds"] == {"IO001.min_share": 0.95} and cfg["rules"] == {"skip": ["CPU004"]}
    assert [w["code"] for w in data["warnings"]][:1] == ["config_implicit"]
    warning = [line for line in p.stderr.splitlines() if "advisor.toml" in line]
    assert len(warning) == 1 and "picked up from the working directory" in warning[0]
    assert "IO001.min_share=0.95" in warning[0]
    for text in (render_text(data, width=200), markdown.render(data).replace("\\", ""), html.render(data)):
        assert "advisor.toml" in text and "picked up from the working directory" in text
        assert "IO001.min_share=0.95" in text


def test_a_profiles_own_config_is_never_picked_up(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    shutil.copytree(SLOW_DL, prof)
    (prof / "advisor.toml").write_text(SILENCING)
    (prof / "sub").mkdir()
    shutil.copy(prof / "advisor.toml", prof / "sub" / "advisor.toml")
    _p, data = run(prof, prof / "sub", tmp_path / "r.json")  # the working directory anywhere inside the profile
    assert "IO001" in {f["rule"] for f in data["findings"]}  # the defaults decided
    assert data["config"]["file"] is None and data["config"]["thresholds"] == {}
    refused = [w for w in data["warnings"] if w["code"] == "config_in_profile"]
    assert len(refused) == 1 and "never picked up" in refused[0]["message"]
    assert refused[0]["path"] == str(prof / "sub" / "advisor.toml")
    assert "Config:" not in render_text(data, width=200)  # nothing was configured


def test_an_explicit_config_and_set_are_named_without_a_warning(tmp_path: Path) -> None:
    conf = tmp_path / "mine.toml"
    conf.write_text('[thresholds.IO001]\nmin_share = 0.95\n')
    _p, data = run(SLOW_DL, tmp_path, tmp_path / "r.json", "--config", str(conf), "--set", "CPU004.min_share=0.99")
    cfg = data["config"]
    assert cfg["file"] == str(conf.resolve()) and cfg["implicit"] is False
    assert cfg["set"] == {"CPU004.min_share": "0.99"}
    assert not [w for w in data["warnings"] if w["code"].startswith("config_")]
    line = markdown.render(data).replace("\\", "")  # without Markdown's escapes
    assert "mine.toml — sets IO001.min_share=0.95" in line
    assert "--set CPU004.min_share=0.99" in render_text(data, width=200)
