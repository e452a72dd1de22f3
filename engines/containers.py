"""testcontainers: the last resort to provide an engine, when a Docker engine answers. Each backend's provisioning
module says how to start its container (`Provision.container`) with the helpers here."""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .entry import CatalogueEntry, Provider, Server, Unavailable, described, provisioning
from .started import track

PASSWORD = "Idem-dialects-1"  # meets SQL Server's complexity rule; containers are throwaway and local
_docker_checked: dict[str | None, str | None] = {}


def image_var(name: str) -> str:
    """The environment variable that overrides an engine's container image: IDEM_IMAGE_<NAME>."""
    return "IDEM_IMAGE_" + name.upper().replace("-", "_").replace(".", "_")


def _unix_socket_problem(host: str) -> str | None:
    """Why a ``unix://`` Docker host cannot be connected to (None if it can, or if it is not a unix socket)."""
    if not host.startswith("unix://"):
        return None
    path = host.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(path)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
    return None


def _ping() -> str | None:
    """Why the Docker engine of the environment does not answer a ping (2 s at most), or None if it does."""
    import docker  # imported by docker_reachable's check first

    try:
        client = docker.from_env(timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # the SDK wraps socket, HTTP and TLS failures in assorted types
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return text if len(text) <= 160 else text[:157] + "..."
    return None


def docker_reachable() -> None:
    """Raise Unavailable unless testcontainers is installed and a Docker engine answers a ping (2 s at most)."""
    try:
        with warnings.catch_warnings():  # platformdirs/testcontainers warn about unset XDG dirs on import
            warnings.simplefilter("ignore")
            import docker  # noqa: F401  # only when a container provider is tried
            import testcontainers  # noqa: F401
    except ImportError:
        raise Unavailable("testcontainers is not installed (pip install 'idem-dialects[containers]')") from None
    cache_key = os.environ.get("DOCKER_HOST")
    if cache_key is None and not Path("/var/run/docker.sock").exists():
        raise Unavailable("Docker engine not reachable for testcontainers (DOCKER_HOST is unset and there is no"
                          " /var/run/docker.sock)")
    if cache_key not in _docker_checked:
        # A failed connect through the Docker SDK leaks its socket: try a unix socket ourselves first.
        _docker_checked[cache_key] = _unix_socket_problem(cache_key or "unix:///var/run/docker.sock") or _ping()
    problem = _docker_checked[cache_key]
    if problem is not None:
        raise Unavailable(f"Docker engine not reachable for testcontainers ({problem})")


@contextmanager
def testcontainers_module() -> Iterator[None]:
    """Around an import of a testcontainers database module: its absence is a reason, not a crash."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    except ImportError as exc:
        raise Unavailable(f"this testcontainers lacks {exc.name or 'a module'} (pip install -U"
                          " 'idem-dialects[containers]')") from None


def started(container: Any, image: str) -> Any:
    """`container.start()`, or Unavailable saying why it did not start (the container stopped again)."""
    try:
        return container.start()
    except Exception as exc:
        try:
            container.stop()
        except Exception:  # the start failure is the error worth reporting
            pass
        raise Unavailable(f"container {image} failed to start: {exc}") from exc


def host_port(container: Any, port: int) -> tuple[str, int]:
    return str(container.get_container_host_ip()), int(container.get_exposed_port(port))


def container(image: str) -> Provider:
    """A testcontainers container of `image` (IDEM_IMAGE_<NAME> overrides it), if Docker answers."""

    def provide(entry: CatalogueEntry) -> Server:
        chosen = os.environ.get(image_var(entry.name)) or image
        docker_reachable()
        running, url = provisioning(entry.backend).container(chosen, entry.backend)
        stop = track(f"container {chosen}", running.stop)
        return Server(entry.name, url, f"testcontainers container {chosen}", stop)

    provide.image = image  # type: ignore[attr-defined]  # read by `how_to_enable` to say what Docker would run
    return described(f"a testcontainers container of {image} (needs Docker)", on_request=True)(provide)
