"""The message brokers the consumer adapters are proved on: where each one is found (a URL from the environment,
``IDEM_BROKER_<NAME>``, else the machine's service on its standard port), why one is unavailable, and a private
broker process on a free loopback port for faults that stop and restart the broker (the machine's own services are
never touched). The same shape as the engine catalogue, for brokers.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import urlsplit

from .entry import Unavailable
from .local import free_ports, group_members, kill_group, log_tail, ports_free, wait_until
from .started import refused, track

_START_TIMEOUT = 60.0


@dataclass(frozen=True)
class BrokerSpec:
    """One broker: its service's URL, the client package its adapter needs, and how the service is started."""

    name: str
    title: str
    default_url: str
    client: str  # the module the adapter imports
    extra: str  # pip install 'idem-dialects[<extra>]'
    start_hint: str  # how the machine's service is started when it is down
    binary: str  # the server binary a private broker runs

    @property
    def env_var(self) -> str:
        return f"IDEM_BROKER_{self.name.upper()}"

    def url(self) -> str:
        return os.environ.get(self.env_var) or self.default_url

    def unavailable(self) -> str | None:
        """Why the adapter cannot be proved here (its client missing, nothing listening), or None."""
        if find_spec(self.client) is None:
            return f"{self.client} is not installed (pip install 'idem-dialects[{self.extra}]')"
        try:
            refused()
        except Unavailable as exc:
            return str(exc)
        parts = urlsplit(self.url())
        host, port = parts.hostname or "127.0.0.1", parts.port
        try:
            socket.create_connection((host, port or 0), timeout=1.0).close()
        except OSError as exc:
            return (f"no {self.title} at {host}:{port} ({exc.strerror or exc}); set {self.env_var}, or start it:"
                    f" {self.start_hint}")
        return None

    def private(self) -> PrivateBroker:
        """Start a broker of this kind of our own, in a temp dir on a free port (Unavailable if it cannot)."""
        if shutil.which(self.binary) is None:
            raise Unavailable(f"{self.binary} is not installed here: no private {self.title} can be started")
        return _PRIVATE[self.name](self)


BROKERS: dict[str, BrokerSpec] = {spec.name: spec for spec in (
    BrokerSpec("rabbitmq", "RabbitMQ", "amqp://guest:guest@127.0.0.1:5672/", "aio_pika", "rabbitmq",
               "rabbitmq-server -detached", "rabbitmq-server"),
    BrokerSpec("nats", "NATS JetStream", "nats://127.0.0.1:4222", "nats", "nats",
               "nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server", "nats-server"),
    BrokerSpec("redis", "Redis", "redis://127.0.0.1:6379/0", "redis", "redis",
               "redis-server --daemonize yes --bind 127.0.0.1 --port 6379", "redis-server"),
)}


def first_unavailable(names: list[str]) -> str | None:
    """Why the first of these brokers that cannot be reached is unavailable (its title first), or None: what a command
    needing them all checks before it starts anything."""
    for name in names:
        why = BROKERS[name].unavailable()
        if why:
            return f"{BROKERS[name].title} is unavailable: {why}"
    return None


class PrivateBroker:
    """A broker process of our own: `url` reaches it, `restart` stops it (cleanly, or with `kill=True` as a crash)
    and starts it again on the same port and data, `stop` ends it and removes its data."""

    def __init__(self, spec: BrokerSpec, port: int, args: list[str], ready: Callable[[], bool],
                 env: dict[str, str] | None = None, url: str | None = None) -> None:
        self.spec, self.port, self._args, self._ready, self._env = spec, port, args, ready, env
        self.url = url or urlsplit(spec.default_url)._replace(netloc=_netloc(spec.default_url, port)).geturl()
        self._proc: subprocess.Popen[bytes] | None = None
        self.directory = Path(tempfile.mkdtemp(prefix=f"idem-{spec.name}-"))
        self._stopped = track(f"private {spec.title} in {self.directory}", self._remove)

    @property
    def log(self) -> Path:
        return self.directory / "broker.log"

    def start(self) -> None:
        ports_free([self.port])
        args = [a.replace("{dir}", str(self.directory)) for a in self._args]
        env = {**os.environ, **{k: v.replace("{dir}", str(self.directory)) for k, v in (self._env or {}).items()}}
        with open(self.log, "ab") as out:
            self._proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, env=env)
        wait_until(self._ready, _START_TIMEOUT, f"private {self.spec.title}", self._alive)

    def halt(self, kill: bool = False) -> None:
        """Stop the broker's whole process group: SIGTERM (a clean shutdown) or, with `kill`, SIGKILL."""
        proc = self._proc
        if proc is None:
            return
        for sig in ((signal.SIGKILL,) if kill else (signal.SIGTERM, signal.SIGKILL)):
            if proc.poll() is not None:
                break
            kill_group(proc, sig)
            try:
                proc.wait(30)
                break
            except subprocess.TimeoutExpired:
                continue
        # The group may outlive its leader (RabbitMQ's shell wrapper exits before the Erlang VM it started).
        for _ in range(100):
            if not group_members(proc):
                return
            time.sleep(0.1)
        kill_group(proc)

    def restart(self, kill: bool = False) -> None:
        self.halt(kill)
        self.start()

    def stop(self) -> None:
        self._stopped()

    def _remove(self) -> None:
        self.halt()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _alive(self) -> str | None:
        if self._proc is None or self._proc.poll() is None:
            return None
        return f"exited with {self._proc.returncode}: {log_tail(self.log)}"

    def __enter__(self) -> PrivateBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _netloc(url: str, port: int) -> str:
    parts = urlsplit(url)
    auth = f"{parts.username}:{parts.password}@" if parts.username else ""
    return f"{auth}{parts.hostname}:{port}"


def _greets(port: int, send: bytes, expect: bytes) -> Callable[[], bool]:
    """Ready once the broker answers `send` with bytes starting with `expect` (its protocol is up, not only the
    listening socket)."""

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            if send:
                sock.sendall(send)
            return sock.recv(16).startswith(expect)

    return ready


def _redis(spec: BrokerSpec) -> PrivateBroker:
    # Append-only with fsync on every write: a stream and its consumer groups survive a restart, even a crash.
    (port,) = free_ports(1)
    broker = PrivateBroker(spec, port, [
        spec.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", "{dir}", "--save", "",
        "--appendonly", "yes", "--appendfsync", "always"], _greets(port, b"PING\r\n", b"+PONG"))
    return _started(broker)


def _nats(spec: BrokerSpec) -> PrivateBroker:
    (port,) = free_ports(1)
    broker = PrivateBroker(spec, port, [spec.binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", "{dir}/js"],
                           _greets(port, b"", b"INFO"))
    return _started(broker)


def _rabbitmq(spec: BrokerSpec) -> PrivateBroker:
    """A second RabbitMQ node (its own name, ports, data and config; no plugins) beside the machine's service."""
    port, dist = free_ports(2)
    binary = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the wrapper in /usr/sbin would switch to the service's user
    if not Path(binary).exists():
        raise Unavailable(f"{binary} is missing: no private RabbitMQ node can be started")
    env = {"HOME": "{dir}", "RABBITMQ_CONF_ENV_FILE": "{dir}/rabbitmq-env.conf",
           "RABBITMQ_NODENAME": f"idem{port}@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
           "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(dist),
           "RABBITMQ_MNESIA_BASE": "{dir}/mnesia", "RABBITMQ_LOG_BASE": "{dir}/log",
           "RABBITMQ_CONFIG_FILE": "{dir}/rabbitmq", "RABBITMQ_ENABLED_PLUGINS_FILE": "{dir}/enabled_plugins",
           "RABBITMQ_PID_FILE": "{dir}/rabbitmq.pid", "ERL_EPMD_ADDRESS": "127.0.0.1"}
    broker = PrivateBroker(spec, port, [binary], _greets(port, b"AMQP\x00\x00\x09\x01", b"\x01"), env)
    (broker.directory / "rabbitmq-env.conf").write_text("")
    (broker.directory / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{port}\n")
    (broker.directory / "enabled_plugins").write_text("[].\n")
    return _started(broker)


def _started(broker: PrivateBroker) -> PrivateBroker:
    try:
        broker.start()
    except BaseException:
        broker.stop()
        raise
    return broker


_PRIVATE: dict[str, Callable[[BrokerSpec], PrivateBroker]] = {"redis": _redis, "nats": _nats, "rabbitmq": _rabbitmq}
