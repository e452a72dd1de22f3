"""MariaDB Connector/Python (``mariadb+mariadbconnector://``)."""

from __future__ import annotations

from . import Driver

DRIVER = Driver("mariadbconnector", "mariadb", "mariadb")
