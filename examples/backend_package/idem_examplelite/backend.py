"""The backend of the engine `examplelite`, registered under the ``idem_dialects.backends`` entry-point group.

`examplelite` speaks SQLite (it is SQLite, under a dialect name of its own), so its backend starts from the closest
built-in one and declares what differs: here only its name, which the registry and the URL's scheme share. A backend
for an engine unlike any built-in one subclasses `idem_dialects.dialects.base.Backend` and defines the required
members (`name`, `drivers`, `classifier`, `now_plus`) and what its engine does differently (docs: Development).
"""

from __future__ import annotations

from idem_dialects.dialects.sqlite import SQLiteBackend


class ExampleLiteBackend(SQLiteBackend):
    name = "examplelite"
