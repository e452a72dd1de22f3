"""No output of the CLI contains a URL's password (issue 47): every subcommand that takes a URL, every option that
takes one, whether the URL is refused as malformed, its server is unreachable or refuses the password. The password
is a distinctive string searched for in stdout and stderr. And a broker that refuses the relay's password (RabbitMQ
here) makes `relay --once` exit non-zero, naming authentication."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from idem_dialects import IdempotencyStore

PASSWORD = "S3cret-pw-47"
DB = f"postgresql+psycopg://app:{PASSWORD}@127.0.0.1:1/test"  # nothing listens on port 1: refused at once
MARIADB = f"mariadb+pymysql://root:{PASSWORD}@127.0.0.1:3306/test"  # the machine's MariaDB refuses the password
AMQP = f"amqp://guest:{PASSWORD}@127.0.0.1:1/"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idem_dialects.cli", *args], capture_output=True, text=True,
                          timeout=300)


CASES = {
    "check": ["check", DB, "--quiet"],
    "check, a refused password": ["check", MARIADB, "--quiet"],
    "init": ["init", MARIADB],
    "ddl": ["ddl", DB],
    "purge": ["purge", DB, "--older-than", "24h"],
    "stats": ["stats", DB],
    "demo --url": ["demo", "--url", MARIADB],
    "bench": ["bench", DB, "--requests", "5", "--repetitions", "1"],
    "matrix --url": ["matrix", "--url", f"pg={DB}", "--quiet"],
    "relay": ["relay", MARIADB, "--route", f"orders={AMQP}", "--once"],
    "relay --route without a destination": ["relay", "sqlite://", "--route", AMQP, "--once"],
    "relay --route without a destination, with a query": ["relay", "sqlite://", "--route", f"{AMQP}?exchange=x"],
    "relay --route to an unknown scheme": ["relay", "sqlite://", "--route", f"o=ftp://u:{PASSWORD}@h/"],
    "relay --stats": ["relay", MARIADB, "--stats"],
    "a malformed URL": ["check", f"postgresql+psycopg://app:{PASSWORD}@127.0.0.1:notaport/test"],
    "an unknown backend": ["ddl", f"nosuch://app:{PASSWORD}@h/db"],
}


@pytest.mark.parametrize("args", list(CASES.values()), ids=list(CASES))
def test_no_output_contains_a_urls_password(args: list[str]) -> None:
    done = cli(*args)
    assert done.returncode != 0 or args[0] == "ddl", done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert PASSWORD not in done.stdout + done.stderr, done.stdout + done.stderr


def test_a_broker_refusing_the_relays_password_makes_relay_once_fail_naming_authentication(tmp_path: Path) -> None:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError as exc:
        pytest.skip(f"no RabbitMQ at 127.0.0.1:5672: {exc}")
    pytest.importorskip("aio_pika", reason="aio-pika (the [rabbitmq] extra) is not installed")
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    with IdempotencyStore.from_url(url) as store:
        store.create_tables()
        store.run(scope="s", operation="op", key="k", request={},
                  effect=lambda conn: store.add_command(conn, "orders", {"n": 1}))
    done = cli("relay", url, "--route", f"orders=amqp://guest:{PASSWORD}@127.0.0.1:5672/", "--once")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "authentication" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    with IdempotencyStore.from_url(url) as store:
        stats = store.drive(store.outbox.stats())
    assert stats.pending == 1 and stats.dead == 0  # given back untried: the command waits for the right password
