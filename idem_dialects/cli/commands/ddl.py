"""`idem-dialects ddl URL`: the CREATE statements for that engine, printed without connecting.

Offline on every backend: the statements are compiled by SQLAlchemy's own dialect for the URL (a mock engine), so
a DBA can review and apply them where the service's role may not create tables. A bare backend name
(``postgresql``, ``mssql``, ...) stands for ``NAME://``. Server-dependent choices use the backend's defaults.
"""

from __future__ import annotations

import argparse

from sqlalchemy import create_mock_engine
from sqlalchemy.schema import ExecutableDDLElement

from ... import dialects
from ...guard import parse_url
from ...schema import build_tables, check_prefix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL (or just the backend name: sqlite, postgresql,"
                                                   " mysql, mariadb, mssql, oracle); no connection is made")
    parser.add_argument("--table-prefix", default="idem_", help="table name prefix (default: idem_)")


def ddl(url_text: str, prefix: str = "idem_") -> list[str]:
    """The CREATE TABLE / CREATE INDEX statements for `url_text`, each ending with ';'."""
    url = parse_url(url_text if "://" in url_text else f"{url_text}://")
    backend_cls = dialects.load(url.get_backend_name())
    url = backend_cls.resolve_url(url)
    statements: list[str] = []

    def collect(sql: ExecutableDDLElement, *args: object, **kwargs: object) -> None:
        statements.append(str(sql.compile(dialect=mock.dialect)).strip() + ";")

    mock = create_mock_engine(url, collect)
    tables = build_tables(check_prefix(prefix), backend_cls(mock))  # type: ignore[arg-type]
    tables.metadata.create_all(mock, checkfirst=False)
    return statements


def run(args: argparse.Namespace) -> int:
    print("\n\n".join(ddl(args.url, args.table_prefix)))
    return 0
