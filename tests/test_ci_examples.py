"""The CI examples in ``docs/examples/`` run the way a runner runs them.

A small parser reads the GitHub Actions workflow's steps (``name``, ``if``, ``shell``, ``env``,
``run``); each ``run:`` block runs with bash in a temporary copy of the repository's layout, with
the shell options the runner uses (``shell: bash`` is ``bash --noprofile --norc -eo pipefail``,
the default ``bash -e``), ``${{ ... }}`` expressions replaced, and ``advisor``, ``pip`` and ``gh``
on PATH (``pip`` does nothing, ``gh`` records the comment body it is given).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "docs" / "examples" / "github-actions.yml"
GITHUB_LIMIT = 65_536  # characters GitHub accepts in a comment body

EXPRESSIONS = {
    "github.server_url": "https://github.com",
    "github.repository": "octo/repo",
    "github.run_id": "42",
    "github.token": "not-a-token",
    "github.event.pull_request.number": "7",
    "github.event_name": "pull_request",
}


def parse_steps(text: str) -> list[dict]:
    """The steps of the workflow's single job: each a dict of its keys, ``env`` a dict, ``run`` the
    block's text dedented as the runner sees it."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "steps:")
    indent = None
    steps: list[dict] = []
    i = at + 1
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        lead = len(line) - len(line.lstrip())
        if indent is None:
            indent = lead
        if lead < indent:
            break
        if lead == indent and line.lstrip().startswith("- "):
            steps.append({})
            line = " " * (lead + 2) + line.lstrip()[2:]
        key_indent = indent + 2
        m = re.match(r"^( *)([A-Za-z_-]+):\s*(.*)$", line)
        assert m and len(m.group(1)) == key_indent, f"unexpected line {i + 1}: {line!r}"
        key, value = m.group(2), m.group(3)
        i += 1
        if value in ("|", ""):  # a block: every following line indented deeper
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > key_indent):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            depth = min(len(b) - len(b.lstrip()) for b in block if b.strip())
            block = [b[depth:] for b in block]
            if value == "|":
                steps[-1][key] = "\n".join(block) + "\n"
            else:
                steps[-1][key] = {k.strip(): v.strip() for k, v in (b.split(":", 1) for b in block if b.strip())}
        else:
            steps[-1][key] = value
    return steps


def expand(text: str) -> str:
    return re.sub(r"\$\{\{\s*([^}]+?)\s*\}\}", lambda m: EXPRESSIONS[m.group(1)], text)


def shim(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_workflow(work: Path, advisor: str) -> tuple[int, Path]:
    """Run the workflow's steps in ``work``; return the exit code of the analyze step and the
    comment body that ``gh`` was given."""
    bin_dir = work / ".bin"
    bin_dir.mkdir()
    shim(bin_dir, "advisor", advisor)
    shim(bin_dir, "pip", "exit 0\n")
    posted = work / ".posted.md"
    shim(bin_dir, "gh", f'while [ $# -gt 0 ]; do [ "$1" = --body-file ] && cp "$2" "{posted}"; shift; done\n')
    failed = False
    gate_rc = None
    for step in parse_steps(WORKFLOW.read_text(encoding="utf-8")):
        if "run" not in step:
            continue
        cond = step.get("if", "")
        if failed and "always()" not in cond:
            continue
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        env.update({k: expand(v) for k, v in (step.get("env") or {}).items()})
        script = work / ".step.sh"
        script.write_text(expand(step["run"]))
        shell = (["bash", "--noprofile", "--norc", "-eo", "pipefail"] if step.get("shell") == "bash"
                 else ["bash", "-e"])
        rc = subprocess.run([*shell, str(script)], check=False, cwd=work, env=env, timeout=600).returncode
        if step.get("id") == "gate":
            gate_rc = rc
        failed = failed or rc != 0
    assert gate_rc is not None, "the workflow has no step with id: gate"
    return gate_rc, posted


def fake_advisor(verdict_chars: int) -> str:
    """An ``advisor`` that writes every ``--out`` file at 20,000 characters, prints a long verdict,
    and fails the gate for a profile named ``red*``."""
    return f"""
dir=$2; shift 2
while [ $# -gt 0 ]; do
  if [ "$1" = --out ]; then head -c 20000 /dev/zero | tr '\\0' x > "$2"; shift; fi
  shift
done
echo "Verdict: $(head -c {verdict_chars} /dev/zero | tr '\\0' v)"
case $(basename "$dir") in red*) echo "advisor: gate: 1 finding(s) at or above critical" >&2; exit 1;; esac
exit 0
"""


def profiles(work: Path, names: list[str]) -> None:
    for name in names:
        (work / "sample_profiles" / name).mkdir(parents=True)


def check_bounded(work: Path, count: int) -> None:
    names = [f"green{i:03d}" for i in range(count - 1)] + ["red"]
    profiles(work, names)
    rc, posted = run_workflow(work, fake_advisor(5000))
    assert rc == 1
    body = posted.read_text(encoding="utf-8")
    assert len(body) < GITHUB_LIMIT
    assert f"{count} profile(s), 1 not passing" in body
    assert "https://github.com/octo/repo/actions/runs/42" in body
    assert all((work / "reports" / f"{n}.html").exists() for n in names)  # the artefact keeps every report


def test_comment_is_bounded(tmp_path: Path) -> None:
    """15 profiles with 20,000-character reports (300,000 together) and 5,000-character verdicts:
    the comment stays under GitHub's limit, names the count and links the run; a red profile
    makes the step exit 1."""
    check_bounded(tmp_path, 15)


@pytest.mark.slow
def test_comment_is_bounded_whatever_the_number_of_profiles(tmp_path: Path) -> None:
    """300 profiles: the verdict lines alone (300 characters each) pass 60,000 bytes and are cut."""
    check_bounded(tmp_path, 300)


def test_green_and_red_lines(tmp_path: Path) -> None:
    profiles(tmp_path, ["green", "red"])
    rc, posted = run_workflow(tmp_path, fake_advisor(50))
    assert rc == 1
    lines = [line for line in posted.read_text(encoding="utf-8").splitlines() if line.startswith("- ")]
    assert len(lines) == 2
    assert lines[0].startswith("- ✅ pass `green`: Verdict: v")
    assert lines[1].startswith("- ❌ gate failed `red`: Verdict: v") and "at or above critical" in lines[1]


def test_all_green_exits_zero(tmp_path: Path) -> None:
    profiles(tmp_path, ["a", "b"])
    rc, posted = run_workflow(tmp_path, fake_advisor(50))
    assert rc == 0
    assert "2 profile(s), 0 not passing" in posted.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize(("samples", "expected"), [
    (["kineto_cpu_healthy"], 0),
    (["kineto_cpu_healthy", "kineto_cpu_slow_dataloader"], 1),
])
def test_real_samples(tmp_path: Path, samples: list[str], expected: int) -> None:
    """The bundled samples with the real ``advisor``: kineto_cpu_healthy passes the example's gate
    (no finding, step about 20 ms against 500 ms); kineto_cpu_slow_dataloader fails it (IO001, critical)."""
    for name in samples:
        shutil.copytree(ROOT / "sample_profiles" / name, tmp_path / "sample_profiles" / name)
    advisor = f'PYTHONPATH="{ROOT}" exec "{sys.executable}" -m advisor.cli "$@"\n'
    rc, posted = run_workflow(tmp_path, advisor)
    assert rc == expected
    body = posted.read_text(encoding="utf-8")
    assert len(body) < GITHUB_LIMIT
    assert "- ✅ pass `kineto_cpu_healthy`: Verdict: No rule fired" in body
    if expected:
        assert "- ❌ gate failed `kineto_cpu_slow_dataloader`: Verdict: CRITICAL" in body
        assert "IO001" in body


GITLAB = ROOT / "docs" / "examples" / "gitlab-ci.yml"


def gitlab_script(text: str) -> str:
    """The job's ``script:`` items joined as the runner runs them: one shell session, in order
    (a ``- |`` item is its block, dedented; comment lines are skipped)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "script:")
    item_indent = len(lines[at + 1]) - len(lines[at + 1].lstrip())
    items: list[str] = []
    i = at + 1
    while i < len(lines):
        line = lines[i]
        lead = len(line) - len(line.lstrip())
        if line.strip() and lead < item_indent:
            break
        body = line.strip()
        i += 1
        if not body.startswith("- ") or lead != item_indent:
            continue
        if body == "- |":
            block = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > item_indent):
                block.append(lines[i])
                i += 1
            depth = min(len(b) - len(b.lstrip()) for b in block if b.strip())
            items.append("\n".join(b[depth:] for b in block))
        else:
            items.append(body[2:])
    return "\n".join(items) + "\n"


@pytest.mark.parametrize(("names", "expected"), [(["green"], 0), (["green", "red"], 1)])
def test_gitlab_job(tmp_path: Path, names: list[str], expected: int) -> None:
    """The GitLab job keeps every report as an artefact (no comment, so no size limit) and exits
    with the gate's code."""
    profiles(tmp_path, names)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim(bin_dir, "advisor", fake_advisor(50))
    shim(bin_dir, "pip", "exit 0\n")
    script = tmp_path / ".job.sh"
    script.write_text(gitlab_script(GITLAB.read_text(encoding="utf-8")))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    rc = subprocess.run(["bash", "-eo", "pipefail", str(script)], check=False, cwd=tmp_path, env=env,
                        timeout=120).returncode
    assert rc == expected
    assert all((tmp_path / "reports" / f"{n}.html").exists() for n in names)
