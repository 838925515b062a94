"""Where the per-rank map runs: in-process, on a local process pool, or on a Dask cluster.

:func:`open_executor` turns the ``--engine`` address and ``--workers`` count into a
:class:`concurrent.futures.Executor` (or None: in-process). Map code submits top-level functions with
picklable arguments and gets values back; it never needs to know which engine runs them.

* no engine, or ``local``: a process pool of ``workers`` processes on this machine, started with
  ``spawn`` (DuckDB is not safe to fork once its threads run); None for one worker (in-process);
* ``tcp://HOST:PORT`` (also ``tls://``, and ``dask://HOST:PORT`` for ``tcp://``): the executor of a
  :class:`distributed.Client` connected to a running Dask scheduler that has, or gets within
  :data:`WORKER_WAIT_S`, a worker; its workers decide how many ranks are read at once. The cluster is
  trusted with this machine: results come back pickled, over plain TCP unless the address is
  ``tls://`` (its certificates from Dask's configuration, see :func:`tls_security`). Dask is an optional extra (``pip install 'advisor[dask]'``); the input files
  must then be at the same path on every worker (a shared filesystem).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, TypeVar

from advisor.ingest.base import InputError, Unit, one_line

T = TypeVar("T")

#: ``--engine`` value for the local process pool.
LOCAL = "local"

#: Seconds to wait for a Dask scheduler to answer before giving up.
CONNECT_TIMEOUT_S = 10.0

#: Seconds to wait for a Dask scheduler that has no worker to get one before giving up.
WORKER_WAIT_S = 30.0

#: Dask's configuration keys of the client's TLS files (environment: DASK_DISTRIBUTED__COMM__TLS__CA_FILE,
#: DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT, DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY).
TLS_KEYS = ("distributed.comm.tls.ca-file", "distributed.comm.tls.client.cert", "distributed.comm.tls.client.key")

_REMOTE = re.compile(r"(tcp|tls|dask)://([^\s/]+)")


def lost_worker_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a worker died under a task (killed for memory, crashed), which
    carry no exception of the task's own: a local pool's, and Dask's when it is installed."""
    errors: list[type[BaseException]] = [BrokenProcessPool]
    distributed = sys.modules.get("distributed")  # imported when a Dask engine ran the tasks
    killed = getattr(distributed, "KilledWorker", None)
    if isinstance(killed, type) and issubclass(killed, BaseException):
        errors.append(killed)
    return tuple(errors)


def unguarded_main() -> str | None:
    """The file of the program's ``__main__`` when its top level has no ``if __name__ ...`` test: a
    spawned worker runs that file again before its first task, and so would start the analysis
    again (where multiprocessing refuses, which ends the worker). None otherwise, or when it cannot say."""
    import ast

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and any(isinstance(n, ast.Name) and n.id == "__name__"
                                            for n in ast.walk(node.test)):
            return None
    return path


def lost_worker(what: str) -> InputError:
    """The error for a worker process that ended under its task (``what``: a phrase saying what it
    was reading): the script missing a ``__main__`` guard when that is the cause, else memory or a crash."""
    script = unguarded_main()
    if script is not None:
        return InputError(f"the worker processes could not start: {one_line(script, 300)} has no "
                          "'if __name__ == \"__main__\":' guard, which they need (spawn runs the script again in "
                          "each worker); put the script's code under one, or read in-process (processes=1, --workers 1)")
    return InputError(f"{what} ended abruptly (out of memory? --workers 1 reads in-process)")


def share_of(memory_limit: str | None, n_workers: int) -> str | None:
    """Each worker's DuckDB memory limit: an ``n_workers``-th of ``memory_limit`` (a number and
    a unit, as :func:`advisor.config.parse_memory_limit` returns it), so that the workers, which
    run side by side, stay within it together."""
    if memory_limit is None:
        return None
    m = re.fullmatch(r"([0-9.]+)(.*)", memory_limit)
    if m is None:
        return memory_limit
    return f"{float(m.group(1)) / n_workers:.6g}{m.group(2)}"


def portable(unit: Unit) -> Unit:
    """The unit as a worker gets it: its reader's notes that only make sense in this process
    (background copies of the event lists) are left out."""
    info = {k: v for k, v in unit.info.items() if not isinstance(v, Future)}
    return Unit(unit.source, list(unit.files), unit.root, unit.rank_hint, unit.rank_source, unit.world_size,
                unit.backend, unit.run_key, info, unit.rank)


class EngineError(InputError):
    """The engine named by ``--engine`` cannot be used (bad address, Dask missing, unreachable)."""


def is_remote(engine: str | None) -> bool:
    """Whether ``engine`` names a distributed engine (a Dask scheduler), not this machine."""
    return engine is not None and engine != LOCAL


def scheduler_address(engine: str) -> str:
    """The Dask scheduler address of ``engine`` (``dask://`` written as ``tcp://``); an
    :class:`EngineError` when ``engine`` is neither ``local`` nor such an address."""
    m = _REMOTE.fullmatch(engine.strip())
    if m is None:
        raise EngineError(f"--engine {one_line(engine, 200)}: not an engine address; use 'local' (the process pool) "
                          "or a Dask scheduler's address such as tcp://HOST:8786")
    scheme = "tcp" if m.group(1) == "dask" else m.group(1)
    return f"{scheme}://{m.group(2)}"


def check_engine(engine: str | None) -> str | None:
    """``engine`` checked before any profile is read: None, ``local``, or a scheduler address whose
    client library (Dask's ``distributed``) is installed; an :class:`EngineError` otherwise."""
    if engine is None or engine.strip() == LOCAL:
        return None if engine is None else LOCAL
    address = scheduler_address(engine)
    _distributed(engine)
    return address


def _distributed(engine: str) -> Any:
    try:
        import distributed
    except ImportError:
        raise EngineError(f"--engine {one_line(engine, 200)}: Dask is not installed; pip install 'advisor[dask]' "
                          "(or dask[distributed]) to run on a Dask cluster") from None
    return distributed


@contextmanager
def open_executor(engine: str | None, workers: int | None, *, pool_from: int = 2) -> Iterator[Executor | None]:
    """The executor that runs the map, closed (its workers stopped, or the client disconnected)
    when the block ends: a spawn process pool of ``workers`` processes for no engine or ``local``
    (None, in-process, for fewer than ``pool_from`` workers or none given), or a Dask client's
    executor for a scheduler address (``workers`` is then the cluster's business)."""
    if not is_remote(engine):
        if workers is None or workers < max(1, pool_from):
            yield None
            return
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool
        return
    assert engine is not None
    address = scheduler_address(engine)
    distributed = _distributed(engine)
    security = tls_security(engine, address)
    try:
        client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False, security=security)
    except (OSError, TimeoutError) as exc:
        raise EngineError(f"--engine {one_line(engine, 200)}: cannot reach the Dask scheduler at {address} "
                          f"({one_line(str(exc) or type(exc).__name__, 300)})") from None
    try:
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_S)
        except (OSError, TimeoutError):
            raise EngineError(f"--engine {one_line(engine, 200)}: the Dask scheduler at {address} has no workers "
                              f"(waited {WORKER_WAIT_S:g} s); start some with 'dask worker {address}'") from None
        yield InDirExecutor(client.get_executor(), os.getcwd(), slots=_slots(client))
    finally:
        client.close()


def tls_security(engine: str, address: str) -> Any:
    """The :class:`distributed.security.Security` of a ``tls://`` address, built from Dask's own
    configuration (:data:`TLS_KEYS`: a YAML file under ``~/.config/dask/`` or the ``DASK_…``
    environment variables), encryption required; None for ``tcp://``. A ``tls://`` address without
    a CA file configured is an :class:`EngineError`, as is a configured file that does not exist."""
    if not address.startswith("tls://"):
        return None
    import dask

    files = {key: dask.config.get(key, None) for key in TLS_KEYS}
    if not files[TLS_KEYS[0]]:
        raise EngineError(f"--engine {one_line(engine, 200)}: a tls:// scheduler needs the CA file (and the client's "
                          "certificate and key if the scheduler asks for them) in Dask's configuration: "
                          "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT, "
                          "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY (or distributed.comm.tls in ~/.config/dask/)")
    for key, path in files.items():
        if path and not os.path.isfile(str(path)):
            raise EngineError(f"--engine {one_line(engine, 200)}: {key} {one_line(str(path), 300)}: no such file")
    from distributed.security import Security

    return Security(  # type: ignore[no-untyped-call,unused-ignore]
        tls_ca_file=files[TLS_KEYS[0]], tls_client_cert=files[TLS_KEYS[1]] or None,
                    tls_client_key=files[TLS_KEYS[2]] or None, require_encryption=True)


def _slots(client: Any) -> int:
    """How many tasks the cluster of ``client`` runs at once: its workers' threads (1 when it cannot say)."""
    try:
        return max(1, sum(int(n) for n in client.nthreads().values()))
    except Exception:  # noqa: BLE001 -- a scheduler that cannot say: the limit is not shared out
        return 1


_CWD_LOCK = threading.Lock()


def run_in_dir(cwd: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` run with ``cwd`` as the working directory when this machine has it
    (a worker of a shared filesystem), so that paths relative to the caller's directory name the
    same files; one task at a time in a process changes it, and it is put back afterwards."""
    with _CWD_LOCK:
        before = os.getcwd()
        moved = cwd != before and os.path.isdir(cwd)
        if moved:
            os.chdir(cwd)
        try:
            return fn(*args, **kwargs)
        finally:
            if moved:
                os.chdir(before)


class InDirExecutor(Executor):
    """An executor whose tasks run in the submitting process's working directory (see
    :func:`run_in_dir`): a Dask worker was started wherever its machine started it."""

    def __init__(self, inner: Executor, cwd: str, slots: int = 1) -> None:
        self.inner = inner
        self.cwd = cwd
        self.slots = max(1, slots)  # tasks the cluster runs at once

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.inner.submit(run_in_dir, self.cwd, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            self.inner.shutdown(wait=wait, cancel_futures=True)
        else:  # Dask's executor takes ``wait`` only
            self.inner.shutdown(wait=wait)

