"""Real HTTP servers as processes for the HTTP tests: gunicorn and uvicorn with several workers; the async store an
in-process ASGI app serves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from idem_dialects.engines.local import ports_free, stop_process
from idem_dialects.engines.started import track

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(command: list[str], cwd: Path, env: dict[str, str], log: Path, ready: Callable[[str], bool],
           timeout: float = 60) -> Iterator[str]:
    """Run `command` (which listens on the port in env["PORT"]) until `ready(log text)` holds and the port answers;
    yield its base URL; stop it by its pid when the block ends. Its output goes to `log`."""
    port = env["PORT"]
    ports_free([int(port)])
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, **env}, stdout=out, stderr=out)
    stopped = track(f"{Path(command[0]).name} on port {port}", lambda: stop_process(proc), refusable=False)
    try:
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_text(errors="replace")
            if ready(text):
                try:
                    with socket.create_connection(("127.0.0.1", int(port)), timeout=1):
                        break
                except OSError:
                    pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (exit {proc.poll()}):\n{text[-3000:]}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited while serving:\n{log.read_text(errors='replace')[-3000:]}")
    finally:
        stopped()


def gunicorn(app: str, cwd: Path, env: dict[str, str], log: Path, workers: int = 4) -> list[str]:
    """The gunicorn command line; `env` gets its PORT."""
    env["PORT"] = str(free_port())
    return [str(BIN / "gunicorn"), app, "-w", str(workers), "-b", f"127.0.0.1:{env['PORT']}", "--chdir", str(cwd),
            "--graceful-timeout", "5", "--timeout", "120"]


def uvicorn(app: str, cwd: Path, env: dict[str, str], workers: int = 4) -> list[str]:
    env["PORT"] = str(free_port())
    return [str(BIN / "uvicorn"), app, "--app-dir", str(cwd), "--workers", str(workers), "--host", "127.0.0.1",
            "--port", env["PORT"], "--log-level", "info"]


def async_store(db: Any) -> tuple[Any, Callable[[Any], Any]]:
    """The async store on the tables of `db` (tests/http/conftest.py's Database), and an app lifespan that disposes
    of its engine in the server's own loop."""
    from idem_dialects import AsyncIdempotencyStore

    store = AsyncIdempotencyStore.from_url(db.async_url, table_prefix=db.prefix + "idem_")

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.engine.dispose()

    return store, lifespan
