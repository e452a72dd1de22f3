"""The DBAPI drivers a backend knows: SQLAlchemy's name for each, what installs it, and the system libraries its
native code loads, so that a driver that cannot load says what to install (`Backend.install_hint`)."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any


@dataclass(frozen=True)
class SystemLibrary:
    """A shared library a driver loads at import or connect time, and the Debian package that brings it."""

    soname: str  # e.g. libodbc.so.2
    debian: str  # the Debian/Ubuntu package that brings it, e.g. unixodbc
    words: str  # what it is, for any OS: the project and the package name elsewhere

    def missing(self) -> bool:
        """True if the dynamic loader cannot find the library (asked the loader itself, as the driver will)."""
        try:
            ctypes.CDLL(self.soname)
        except OSError:
            return True
        return False

    def hint(self) -> str:
        return f"the system library {self.soname} ({self.words}; Debian/Ubuntu: apt-get install {self.debian})"


@dataclass(frozen=True)
class Driver:
    """One DBAPI driver of a backend, as a URL names it (``<backend>+<name>://``)."""

    name: str  # SQLAlchemy's driver name
    module: str  # what `import` loads
    # What pip installs: this project's extra for the drivers it ships with, else the driver's distribution; None
    # for a module that comes with Python (sqlite3).
    package: str | None
    sync: bool = True  # create_engine can use it
    asynchronous: bool = False  # create_async_engine can use it (psycopg and oracledb serve both)
    libraries: tuple[SystemLibrary, ...] = ()
    # The BEGIN the driver sends on its own (not through a cursor SQLAlchemy sees), said as a benchmark reports it.
    implicit_begin: str | None = None
    # Closing a connection whose server went away leaves its socket open until garbage collection (a
    # ResourceWarning then): the driver's leak, not the caller's.
    leaks_lost_sockets: bool = False
    # The connect_args that open its connections in autocommit mode (every statement commits alone), which the store
    # refuses: named in that error, and tried by the conformance suite. None: only as an attribute, if at all.
    autocommit_args: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)

    def installed(self) -> bool:
        """The driver's module is on the path (not imported: importing may load native libraries)."""
        try:
            return find_spec(self.module) is not None
        except ModuleNotFoundError:  # a dotted module whose parent package is absent
            return False

    def missing_libraries(self) -> list[SystemLibrary]:
        return [lib for lib in self.libraries if lib.missing()]

    def install_hint(self) -> str:
        """What to install so that this driver loads: the pip package unless it is installed, and any system library
        that is missing (a driver installed but missing a library needs only the library)."""
        missing = " and ".join(lib.hint() for lib in self.missing_libraries())
        if missing and self.installed():
            return f"install {missing}"
        hint = (f"pip install '{self.package}'" if self.package is not None else
                f"use a Python that includes the {self.module} module")
        return f"{hint}, and {missing}" if missing else hint

    def problem(self) -> str | None:
        """Why this driver cannot be used here (with what to install), or None if it can be imported."""
        if not self.installed():
            return f"the {self.name} driver is not installed ({self.install_hint()})"
        missing = self.missing_libraries()
        if missing:
            return f"the {self.name} driver cannot load: it needs {' and '.join(lib.hint() for lib in missing)}"
        return None


# unixODBC's driver manager: pyodbc (and aioodbc over it) link against it.
UNIXODBC = SystemLibrary("libodbc.so.2", "unixodbc", "unixODBC's driver manager, in the unixODBC package on any OS")
# GNU libltdl: Microsoft's ODBC Driver 18 (bundled by mssql-python) and unixODBC's installer library load it.
LIBLTDL = SystemLibrary("libltdl.so.7", "libltdl7",
                        "GNU libtool's runtime library: libltdl, or libtool-ltdl, on other OSes")
