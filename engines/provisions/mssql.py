"""SQL Server's test provisioning: its testcontainers recipe with an installed ODBC driver. No wire faults (the fault
proxy does not read TDS). Loaded only by the engine catalogue and the conformance suite (`entry.PROVISIONS`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from idem_dialects.engines.containers import PASSWORD, host_port, started, testcontainers_module
from idem_dialects.engines.entry import Provision, Unavailable, require_driver


def odbc_driver_query() -> dict[str, str]:
    """URL query naming an installed SQL Server ODBC driver: Microsoft's ODBC 18 if present, else FreeTDS."""
    require_driver("mssql", "pyodbc")
    import pyodbc

    installed = list(pyodbc.drivers())
    for name in ("ODBC Driver 18 for SQL Server", "ODBC Driver 17 for SQL Server"):
        if name in installed:
            return {"driver": name, "TrustServerCertificate": "yes"}
    if "FreeTDS" in installed:
        return {"driver": "FreeTDS", "TDS_Version": "7.4"}
    raise Unavailable(
        "no SQL Server ODBC driver is installed (apt-get install tdsodbc unixodbc, or Microsoft's msodbcsql18);"
        f" pyodbc sees {installed or 'none'}"
    )


class MSSQLProvision(Provision):
    default_port = 1433

    @classmethod
    def container(cls, image: str, backend: str) -> tuple[Any, URL]:
        query = odbc_driver_query()
        with testcontainers_module():
            from testcontainers.community.mssql import SqlServerContainer
        running = started(SqlServerContainer(image, password=PASSWORD, dialect="mssql+pyodbc", dbname="master"),
                          image)
        host, port = host_port(running, 1433)
        return running, URL.create("mssql+pyodbc", "sa", PASSWORD, host, port, "master", query=query)
