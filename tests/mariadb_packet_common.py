"""A private MariaDB server whose max_allowed_packet a test sets, for the tests of a response between the server's
limit and the policy's (issue 47): tests/http/test_http_mariadb_limits.py and tests/djangotests/test_django_limits.py.
A test module takes the fixtures with ``from mariadb_packet_common import *`` (`__all__`: the fixtures only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from idem_dialects.engines import Unavailable, provisioning

pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'idem-dialects[mysql]')")

__all__ = ["packet", "private_mariadb"]
KIB = 1024
# The server's max_allowed_packet: what it is lowered to, what it starts at; and a response between them: over LOW
# as any driver sends it (its bytes, hex or escaped), under HIGH and under the policy's limit.
LOW, HIGH = 512 * KIB, 4096 * KIB
BODY = 768 * KIB


@pytest.fixture(scope="module")
def private_mariadb() -> Iterator[URL]:
    """A private MariaDB server (never the machine's): its global max_allowed_packet is the module's to change
    (`packet`). Skipped, saying why, where none can start."""
    try:
        server = provisioning("mariadb").private_server("mariadb")
    except Unavailable as exc:
        pytest.skip(f"no private MariaDB server: {exc}")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def packet(private_mariadb: URL) -> Iterator[Callable[[int], None]]:
    """Set the private server's global max_allowed_packet (each new session takes it); put back at the end."""
    admin = create_engine(private_mariadb, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        before = int(conn.exec_driver_sql("SELECT @@GLOBAL.max_allowed_packet").scalar_one())

    def set_packet(size: int) -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"SET GLOBAL max_allowed_packet = {int(size)}")

    try:
        yield set_packet
    finally:
        set_packet(before)
        admin.dispose()
