"""One registry of every server this process started (engines, private brokers, a test's HTTP server), and one
handler that stops them, newest first, when the process ends: at exit (a normal end, or SIGINT's KeyboardInterrupt,
which pytest and the CLI report as an interruption) or at once on SIGTERM or SIGHUP, which then end the process as
the signal would have. A run that is cancelled or timed out leaves no server holding a port and no data directory
in the temp dir.

A provider registers a server with `track` as soon as it has something to clean up (a temp dir, a process) and
hands out the stop `track` returns: it runs once, and forgets the server. A run that must use no database or broker
server (the test suite's SQLite-only command) says why with `refuse`: `track` then cleans up and raises Unavailable
with that reason, which a test turns into a skip, and so does a provider of a server already running
(`refused()`), so the run is the same whether the machine runs servers or not. The handlers are installed on the first
registration (in the main thread; a signal handler set by someone else runs after ours; an ignored signal stays
ignored). A forked child inherits the registry but never stops its parent's servers.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from .entry import Unavailable

SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # SIGINT raises KeyboardInterrupt: the process ends, and atexit stops them
_log = logging.getLogger(__name__)


class Started:
    """A registered server: `stop()` stops it once (later calls do nothing) and takes it out of the registry."""

    def __init__(self, what: str, stop: Callable[[], None]) -> None:
        self.what, self._stop, self._done = what, stop, False

    def __call__(self) -> None:
        if self._done:
            return
        try:
            self._stop()
        finally:
            self._done = True
            _forget(self)

    def __repr__(self) -> str:
        return f"<started {self.what}>"


_refusal: str | None = None


def refuse(reason: str | None) -> None:
    """Refuse every server from now on, for `reason` (None: accept them again)."""
    global _refusal
    _refusal = reason


def refused() -> None:
    """Unavailable, with the reason, while servers are refused."""
    if _refusal is not None:
        raise Unavailable(_refusal)


def refusal() -> str | None:
    """Why servers are refused (None: they are not): for a caller that reaches a server outside the catalogue."""
    return _refusal


_lock = threading.RLock()  # reentrant: a signal handler may run in the main thread while it holds the lock
_running: list[Started] = []
_owner = os.getpid()
_previous: dict[int, Any] = {}
_stopping = False


def track(what: str, stop: Callable[[], None], *, refusable: bool = True) -> Started:
    """Register a server (`what` names it in a log line if its stop fails) and return its stop, to call instead of
    `stop`. Unavailable (after `stop`) while servers are refused, unless it is not `refusable` (what a run using no
    database or broker server still makes: a temp dir, a test's own HTTP server)."""
    if refusable and _refusal is not None:
        stop()
        refused()
    entry = Started(what, stop)
    with _lock:
        _running.append(entry)
    _install()
    return entry


@contextmanager
def temp_dir(prefix: str) -> Iterator[str]:
    """A temp dir, removed when the block ends, or with the servers when the process is stopped first."""
    path = tempfile.mkdtemp(prefix=prefix)
    remove = track(f"temp dir {path}", functools.partial(shutil.rmtree, path, ignore_errors=True), refusable=False)
    try:
        yield path
    finally:
        remove()


def running() -> list[str]:
    """What is registered now, oldest first."""
    with _lock:
        return [entry.what for entry in _running]


def _forget(entry: Started) -> None:
    with _lock:
        if entry in _running:
            _running.remove(entry)


def stop_all() -> None:
    """Stop every registered server: each stop begins newest first, all of them at once (each stops its own processes
    in its own order; together they take as long as the slowest, which matters when something kills this process
    soon after a signal: pytest-xdist ends a worker whose controller went away within 15 s). A stop that fails is
    logged and the others still run."""
    global _stopping
    if os.getpid() != _owner or _stopping:
        return
    _stopping = True
    main = threading.current_thread() is threading.main_thread()
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # a second Ctrl-C: stop them anyway
    try:
        with _lock:
            entries = _running[::-1]
        threads = [threading.Thread(target=_stop, args=(entry,), name=f"stop {entry.what}") for entry in entries]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        _stopping = False
        if main:
            signal.signal(signal.SIGINT, interrupt if interrupt is not None else signal.SIG_DFL)


def _stop(entry: Started) -> None:
    try:
        entry()
    except BaseException as exc:  # one server's failure must not leave the others running
        _forget(entry)
        _log.warning("stopping %s failed: %s", entry.what, exc)


def _handle(sig: int, frame: FrameType | None) -> None:
    if os.getpid() != _owner or _stopping:  # a forked child; or a second signal while the first one's stop runs
        return
    stop_all()
    previous = _previous.get(sig, signal.SIG_DFL)
    if callable(previous):
        previous(sig, frame)
    elif previous == signal.SIG_DFL:  # end as the signal would have ended us (exit status 128 + sig)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


_installed = False


def _install() -> None:
    global _installed, _owner
    if _installed or threading.current_thread() is not threading.main_thread():
        return  # a registration from another thread: the next one from the main thread installs them
    _installed, _owner = True, os.getpid()
    atexit.register(stop_all)
    for sig in SIGNALS:
        previous = signal.getsignal(sig)
        if previous == signal.SIG_IGN:  # nohup, or a parent that wants us to ignore it: so do we
            continue
        _previous[sig] = previous
        signal.signal(sig, _handle)
