"""SQLite's test provisioning: a database file in a temp dir. SQLite is embedded: nothing to start, restart or cut.
Loaded only by the engine catalogue and the conformance suite."""

from __future__ import annotations

import shutil
import tempfile
from functools import partial
from pathlib import Path

from sqlalchemy import make_url
from sqlalchemy.engine import URL

from idem_dialects.dialects.sqlite import is_memory
from idem_dialects.engines.entry import CatalogueEntry, Provision, Server, described
from idem_dialects.engines.started import track


@described("embedded: stdlib sqlite3, a file in a temp dir")
def temp_file(entry: CatalogueEntry) -> Server:
    directory = tempfile.mkdtemp(prefix="idem-sqlite-")
    remove = track(f"SQLite file in {directory}", partial(shutil.rmtree, directory, ignore_errors=True),
                   refusable=False)
    return Server(entry.name, make_url(f"sqlite+pysqlite:///{Path(directory) / 'conformance.db'}"),
                  "embedded (stdlib sqlite3, file in a temp dir)", remove)



class SQLiteProvision(Provision):
    embedded = True

    @classmethod
    def database_files(cls, url: URL) -> tuple[str, ...]:
        if is_memory(url) or url.query.get("uri") or not url.database:
            return ()
        return tuple(url.database + suffix for suffix in ("", "-wal", "-shm", "-journal"))
