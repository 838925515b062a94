"""A virtual environment of its own for Meta's HolisticTraceAnalysis (HTA), the independent
implementation that tests/test_hta_crosscheck.py and benchmarks/bench_kineto.py compare advisor with.

HTA 0.5.0 needs pandas 2.x and pulls ~110 packages (jupyterlab among them); installed into the
project's environment it would downgrade the pandas that advisor runs on. So HTA lives in a
separate venv, built on first use and reused afterwards, and runs there in a subprocess
(``tests/hta_probe.py``); advisor keeps running in the project's environment.

Where: ``$ADVISOR_HTA_VENV`` if set, else ``$XDG_CACHE_HOME/advisor-tests/hta-venv`` (default
``~/.cache/advisor-tests/hta-venv``). Building it needs the package index (pip); a venv is
only used once a marker file records that its install and an ``import hta`` succeeded with
these exact pins.

    python -m tests.hta_env            # build (or find) it and print its python
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

# HTA imports psutil without declaring it
PINS = ("holistictraceanalysis==0.5.0", "pandas==2.2.3", "psutil")
MARKER = ".advisor-hta-ok"
PROBE = Path(__file__).resolve().with_name("hta_probe.py")


class HtaUnavailable(RuntimeError):
    """The HTA environment could not be found or built (the message says why, in one line)."""


def venv_dir() -> Path:
    """Where the HTA venv lives (see the module docstring)."""
    if os.environ.get("ADVISOR_HTA_VENV"):
        return Path(os.environ["ADVISOR_HTA_VENV"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "advisor-tests" / "hta-venv"


def _python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _ready(venv: Path) -> bool:
    marker = venv / MARKER
    return marker.is_file() and marker.read_text().split() == list(PINS) and _python(venv).exists()


def _base_python() -> str:
    """The interpreter the venv is made from: the base installation of the running one."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if Path(base).exists() else sys.executable


def hta_python(build: bool = True, timeout: float = 1800.0) -> Path:
    """The python of a ready HTA venv, building it first when absent (unless ``build`` is false)."""
    venv = venv_dir()
    if _ready(venv):
        return _python(venv)
    if not build:
        raise HtaUnavailable(f"no HTA environment at {venv} (build it: python -m tests.hta_env)")
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        lock = open(venv.parent / f"{venv.name}.lock", "w")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise HtaUnavailable(f"cannot create {venv}: {exc}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building it
        if _ready(venv):
            return _python(venv)
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one (no marker)
        steps = [
            [_base_python(), "-m", "venv", str(venv)],
            [str(_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS],
            [str(_python(venv)), "-c", "import hta.trace_analysis, psutil"],
        ]
        for cmd in steps:
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                shutil.rmtree(venv, ignore_errors=True)
                raise HtaUnavailable(f"building {venv}: {' '.join(cmd[:4])}: {exc}") from None
            if res.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
                raise HtaUnavailable(f"building {venv}: {' '.join(cmd[:4])} failed: {tail[0]}")
        (venv / MARKER).write_text("\n".join(PINS) + "\n")  # written last: the venv is complete
    if not _ready(venv):
        raise HtaUnavailable(f"{venv} was built but is not usable")
    return _python(venv)


if __name__ == "__main__":
    try:
        print(hta_python())
    except HtaUnavailable as exc:
        print(f"hta_env: {exc}", file=sys.stderr)
        sys.exit(1)
