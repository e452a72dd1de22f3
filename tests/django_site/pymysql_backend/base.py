"""Django's MySQL/MariaDB backend on PyMySQL, for the tests' databases only, without `pymysql.install_as_MySQLdb()`.

Django's backend imports ``MySQLdb`` (mysqlclient, which needs a C build). PyMySQL stands in for it during that import
only: once Django's modules hold their references, the name is removed again, so nothing else in the process finds a
``MySQLdb`` module (SQLAlchemy would then pick it for every ``mariadb://`` URL, through PyMySQL's deprecated ``db``
argument)."""

from __future__ import annotations

import sys

import pymysql

_lent = "MySQLdb" not in sys.modules
if _lent:
    sys.modules["MySQLdb"] = pymysql
try:
    from django.db.backends.mysql.base import DatabaseWrapper as MySQLDatabaseWrapper
finally:
    if _lent:  # MySQLdb and the submodules Django imported through it (MySQLdb.constants, MySQLdb.converters)
        for name in [n for n in sys.modules if n == "MySQLdb" or n.startswith("MySQLdb.")]:
            del sys.modules[name]


class DatabaseWrapper(MySQLDatabaseWrapper):
    """Django's own wrapper; only its import differs."""
