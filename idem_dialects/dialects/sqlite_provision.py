"""SQLite's test provisioning: a database file in a temp dir. SQLite is embedded: nothing to start, restart or cut
(`SQLiteBackend.embedded`), so the backend needs no `Provision` of its own. Loaded only by the engine catalogue."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sqlalchemy import make_url

from idem_dialects.engines.entry import CatalogueEntry, Server, described


@described("embedded: stdlib sqlite3, a file in a temp dir")
def temp_file(entry: CatalogueEntry) -> Server:
    directory = tempfile.TemporaryDirectory(prefix="idem-sqlite-")
    path = Path(directory.name) / "conformance.db"
    return Server(entry.name, make_url(f"sqlite+pysqlite:///{path}"),
                  "embedded (stdlib sqlite3, file in a temp dir)", directory.cleanup)

