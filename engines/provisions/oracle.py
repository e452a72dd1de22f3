"""Oracle's test provisioning: its testcontainers recipe. No wire faults (the fault proxy does not read TNS). Loaded
only by the engine catalogue and the conformance suite (`entry.PROVISIONS`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from idem_dialects.engines.containers import PASSWORD, host_port, started, testcontainers_module
from idem_dialects.engines.entry import Provision, require_driver


class OracleProvision(Provision):
    default_port = 1521

    @classmethod
    def container(cls, image: str, backend: str) -> tuple[Any, URL]:
        require_driver("oracle", "oracledb")
        with testcontainers_module():
            from testcontainers.community.oracle import OracleDbContainer
        running = started(OracleDbContainer(image, oracle_password=PASSWORD), image)
        host, port = host_port(running, 1521)
        return running, URL.create("oracle+oracledb", "system", PASSWORD, host, port,
                                   query={"service_name": "FREEPDB1"})
