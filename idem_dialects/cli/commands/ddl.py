"""`idem-dialects ddl URL`: the CREATE statements for that engine, printed without connecting.

Offline on every backend: the statements are compiled by SQLAlchemy's own dialect for the URL (a mock engine), so
a DBA can review and apply them where the service's role may not create tables. A bare backend name
(``postgresql``, ``mssql``, ...) stands for ``NAME://``. Server-dependent choices use the backend's defaults.
"""

from __future__ import annotations

import argparse

from sqlalchemy.schema import ExecutableDDLElement

from ...schema import build_tables, check_prefix
from ...url import offline
from ..output import add_output, add_quiet, write


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL (or just the backend name: sqlite, postgresql,"
                                                   " mysql, mariadb, mssql, oracle); no connection is made")
    parser.add_argument("--table-prefix", default="idem_", help="table name prefix (default: idem_)")
    add_output(parser, "the statements")
    add_quiet(parser, "accepted as every report command does; ddl prints no progress")


def ddl(url_text: str, prefix: str = "idem_") -> list[str]:
    """The CREATE TABLE / CREATE INDEX statements for `url_text`, each ending with ';'."""
    statements: list[str] = []

    def collect(sql: ExecutableDDLElement, *args: object, **kwargs: object) -> None:
        statements.append(str(sql.compile(dialect=backend.engine.dialect)).strip() + ";")

    backend = offline(url_text, collect)
    build_tables(check_prefix(prefix), backend).metadata.create_all(backend.engine, checkfirst=False)
    return statements


def run(args: argparse.Namespace) -> int:
    write("\n\n".join(ddl(args.url, args.table_prefix)) + "\n", args.output)
    return 0
