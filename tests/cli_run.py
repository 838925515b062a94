"""``advisor ...`` in this test process (click's CliRunner), shaped like a subprocess result.

A subprocess pays the interpreter start and the imports on every call (about a second here); most
CLI tests only need the command's exit code, its output and the files it writes, so they run it
in-process. What only a real process shows (a traceback reaching stderr, a terminal, signals,
the console entry point's own exit) is tested through ``python -m advisor.cli`` in the tests that
say so. An exception escaping ``main`` is appended to ``stderr`` as a traceback, as the
interpreter would print it, so a test that forbids tracebacks still sees one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.conftest import ROOT


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def cli(*args: str | Path, cwd: Path | None = None, env: Mapping[str, str | None] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``advisor ARGS`` in-process: (args, returncode, stdout, stderr), as ``subprocess.run`` gives them."""
    from click.testing import CliRunner

    from advisor.cli import main

    argv = [str(a) for a in args]
    with _cwd(cwd or ROOT):
        res = CliRunner().invoke(main, argv, env=dict(env) if env else None, input=input, catch_exceptions=True)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(["advisor", *argv], res.exit_code, res.stdout, stderr)


def analyze_cli(*args: str | Path, cwd: Path | None = None,
                env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """``advisor analyze ARGS`` in-process."""
    return cli("analyze", *args, cwd=cwd, env=env)
