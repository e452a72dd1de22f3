"""Round trips counted on the wire, and latency added to each of them: a TCP proxy between a driver and its database
server, in a process of its own, so that its CPU time and its threads stay out of the measured process (the client
CPU figures and the interpreter's lock are the bench's alone).

A round trip is a burst of bytes from the client answered by a burst from the server. What the client sends before
the server's first byte back is one burst, however many messages it holds (a pipeline: Parse, Bind, Execute, Sync)
and however many reads it takes; a burst no reply answers (a connection's goodbye) is no round trip, and neither is
what the server sends unasked (its greeting). The proxy reads no protocol, so it counts every engine's drivers
alike, and what no cursor event sees is counted too: the BEGIN psycopg and asyncpg send on their own, a pool's reset,
a statement prepared before it runs. A client that sends the rest of a request only after the server has begun to
answer its first part pays the network twice, and is counted twice.

With `added_latency_ms`, each client burst waits that long before it is forwarded: every round trip pays it once,
as it would to a database that far away. The proxy records the time each burst actually waited (`Counts.delayed_s`),
so what was added is read from it, never inferred from a wall clock.

A database inside the client's own process (SQLite) has no wire: `no_wire` says so, and there is nothing to count.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from idem_dialects.engines.local import LoopbackProxy, connect_to

from .report import percentiles

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

Address = tuple[str, int] | str  # (host, port) or a Unix socket's path, as `Provision.server_address` gives it


@dataclass(frozen=True)
class Counts:
    """What the proxy saw, since it started or (a difference) over a window."""

    round_trips: int = 0
    bursts: int = 0  # client bursts forwarded, each delayed by the added latency
    delayed_s: float = 0.0  # the time those bursts waited, measured around each wait
    connections: int = 0  # connections opened through the proxy

    def __sub__(self, other: Counts) -> Counts:
        return Counts(self.round_trips - other.round_trips, self.bursts - other.bursts,
                      self.delayed_s - other.delayed_s, self.connections - other.connections)


@dataclass
class Window:
    """What went over the wire while a `Wire.window()` block ran (set when the block ends)."""

    counts: Counts = field(default_factory=Counts)


class Wire:
    """The counting proxy's process: it forwards 127.0.0.1:`port` to `upstream`, adding `added_latency_ms` to each
    round trip. Read its counts with `counts()` or `window()`; `close()` (or the end of a with block) stops it, and
    so does the end of this process (it exits when its stdin closes)."""

    def __init__(self, upstream: Address, added_latency_ms: float = 0.0) -> None:
        if added_latency_ms < 0:
            raise ValueError("the added latency must be at least 0 ms")
        self.added_latency_ms = added_latency_ms
        spec = json.dumps({"upstream": upstream, "added_latency_ms": added_latency_ms})
        # stderr is inherited: a proxy that fails says why where the bench's own errors go.
        self._process = subprocess.Popen([sys.executable, "-c", f"from {__name__} import main; main()", spec],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._lock = threading.Lock()  # one question and its answer at a time on the pipes
        started = self._ask(None)
        self.port = int(started["port"])

    def _ask(self, question: str | None) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        with self._lock:
            if question is not None:
                stdin.write(question + "\n")
                stdin.flush()
            line = stdout.readline()
        if not line:
            raise RuntimeError(f"the counting proxy's process ended (exit status {self._process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def reach(self, url: URL) -> URL:
        """`url` (of the server this proxy forwards to) pointed at the proxy: the URL the fault proxy uses
        (`Provision.plaintext_url`), without TLS, as the servers measured here on loopback run."""
        from idem_dialects.engines.entry import provisioning

        return provisioning(url.get_backend_name()).plaintext_url(url, "127.0.0.1", self.port)

    def counts(self) -> Counts:
        """Everything counted since the proxy started, over every connection through it."""
        return Counts(**self._ask("counts"))

    @contextmanager
    def window(self) -> Iterator[Window]:
        """What goes over the wire while the block runs. Read after requests that have had their replies, the counts
        are complete: the proxy counts a reply before it forwards it."""
        found = Window()
        before = self.counts()
        yield found
        found.counts = self.counts() - before

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def no_wire(url: URL) -> str | None:
    """Why the database of `url` has no wire to count round trips on (it runs inside the client's process), or
    None."""
    from idem_dialects.engines.entry import provisioning

    if provisioning(url.get_backend_name()).embedded:
        return f"{url.get_backend_name()} runs inside the client's process: no wire, no round trips"
    return None


def through_proxy(url: URL, added_latency_ms: float = 0.0) -> Wire:
    """A counting proxy in front of the server of `url` (`no_wire(url)` must be None); `Wire.reach` points a URL of
    that server (through any of its drivers) at it."""
    from idem_dialects.engines.entry import provisioning

    return Wire(provisioning(url.get_backend_name()).server_address(url), added_latency_ms)


def figures(counts: Counts | None, latencies: Sequence[float] = (), seconds: float = 0.0,
            added_latency_ms: float = 0.0, loopback_per_s: float | None = None) -> dict[str, Any]:
    """A mode's figures from its pass through the counting proxy (`counts` None: no pass, no wire), as every report
    gives them: round trips per request and, with latency added, the pass's throughput beside `loopback_per_s`."""
    if counts is None:
        return {"round_trips_per_request": None}
    requests = max(1, len(latencies))
    found: dict[str, Any] = {"round_trips_per_request": round(counts.round_trips / requests, 2)}
    if added_latency_ms:
        per_s = requests / seconds
        found["added_latency"] = {
            "ms": added_latency_ms, "requests": requests, "throughput_per_s": round(per_s, 1),
            "ratio_to_loopback": round(per_s / loopback_per_s, 3) if loopback_per_s else None,
            "latency_ms": percentiles(latencies),
            # What each round trip actually waited (time.sleep waits at least the latency asked for, a little more).
            "added_ms_per_round_trip": round(counts.delayed_s * 1000 / max(1, counts.round_trips), 3)}
    return found


def progress(added_latency_ms: float, counted: dict[str, tuple[Counts | None, int]]) -> str:
    """The progress line of a pass through the counting proxy: round trips per request of each mode (its counts and
    requests)."""
    added = f", {added_latency_ms:g} ms added per round trip" if added_latency_ms else ""
    return f"on the wire{added}: " + ", ".join(
        f"{mode} {counts.round_trips / max(1, n):.2f} round trips"
        + (f" ({counts.connections} connections opened)" if counts.connections else "")
        for mode, (counts, n) in counted.items() if counts is not None)


def about(why_not: str | None, added_latency_ms: float) -> dict[str, Any]:
    """The report's `wire` entry: whether round trips were counted on the wire (else why not), and the latency
    added to each in that pass."""
    return {"counted": why_not is None, "why_not": why_not, "added_latency_ms": added_latency_ms}


# --- the proxy's own process ---------------------------------------------------------------------------------------


class _Tally:
    """The counts of every link, and the added latency each client burst waits."""

    def __init__(self, added_latency_ms: float) -> None:
        self.delay = added_latency_ms / 1000
        self.lock = threading.Lock()
        self.round_trips = self.bursts = self.connections = 0
        self.delayed_ns = 0

    def burst(self) -> None:
        """A client burst begins: wait the added latency (time.sleep waits at least that long), then count it."""
        waited = 0
        if self.delay:
            started = time.perf_counter_ns()
            time.sleep(self.delay)
            waited = time.perf_counter_ns() - started
        with self.lock:
            self.bursts += 1
            self.delayed_ns += waited

    def answered(self) -> None:
        with self.lock:
            self.round_trips += 1

    def connected(self) -> None:
        with self.lock:
            self.connections += 1

    def as_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"round_trips": self.round_trips, "bursts": self.bursts, "delayed_s": self.delayed_ns / 1e9,
                    "connections": self.connections}


class _CountingProxy(LoopbackProxy):
    def __init__(self, upstream: Address, tally: _Tally) -> None:
        self.upstream, self.tally = upstream, tally
        super().__init__("wire-accept")

    def _connect(self) -> socket.socket:
        return connect_to(self.upstream)

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        self.tally.connected()
        _Link(self, client, upstream).start()


class _Link:
    """One client connection and its server's: a thread each way. `awaiting` is set by a client burst before it is
    forwarded and cleared by the first reply after it, so a reply is never seen before the burst it answers."""

    def __init__(self, proxy: _CountingProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.lock = threading.Lock()
        self.awaiting = False

    def start(self) -> None:
        threading.Thread(target=self._upstream, daemon=True, name="wire-up").start()
        threading.Thread(target=self._downstream, daemon=True, name="wire-down").start()

    def _upstream(self) -> None:
        try:
            while data := self.client.recv(65536):
                with self.lock:
                    new, self.awaiting = not self.awaiting, True
                if new:
                    self.proxy.tally.burst()
                self.server.sendall(data)
        except OSError:
            pass
        finally:
            self.proxy._forget(self.client, self.server)

    def _downstream(self) -> None:
        try:
            while data := self.server.recv(65536):
                with self.lock:
                    answered, self.awaiting = self.awaiting, False
                if answered:
                    self.proxy.tally.answered()
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            self.proxy._forget(self.client, self.server)


def main() -> None:
    """The proxy's process (`Wire` starts it; its spec is the first argument): its port on stdout as a JSON line, then
    one JSON line of counts per line read on stdin, until stdin closes (the bench ended, one way or another). Ctrl-C
    reaches the whole process group: the bench's own handling of it ends this process, by closing its stdin."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = json.loads(sys.argv[1])
    upstream = spec["upstream"]
    tally = _Tally(float(spec["added_latency_ms"]))
    proxy = _CountingProxy(upstream if isinstance(upstream, str) else (upstream[0], int(upstream[1])), tally)
    print(json.dumps({"port": proxy.port}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(tally.as_dict()), flush=True)
    proxy.close()
