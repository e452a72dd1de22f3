"""The DBAPI drivers, one module each, as SQLAlchemy keeps one module per driver: what installs a driver, the system
libraries its native code loads, and its quirks the store must know (how it turns autocommit on, the BEGIN it sends
by itself, how it prepares statements, how an async driver runs a statement natively).

A backend lists its drivers (`Backend.drivers`); nothing here names an engine. Adding a driver is a module here
with a `Driver` (or a subclass overriding what differs), listed in its backend's `drivers` (docs: Development).
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from ..sqla import driver_connection
from ..steps import Shape

if TYPE_CHECKING:
    from sqlalchemy import Engine


E = TypeVar("E")  # an engine, sync or async: what `own_engine` makes


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


# unixODBC's driver manager: pyodbc (and aioodbc over it) link against it.
UNIXODBC = SystemLibrary("libodbc.so.2", "unixodbc", "unixODBC's driver manager, in the unixODBC package on any OS")
# GNU libltdl: Microsoft's ODBC Driver 18 (bundled by mssql-python) and unixODBC's installer library load it.
LIBLTDL = SystemLibrary("libltdl.so.7", "libltdl7",
                        "GNU libtool's runtime library: libltdl, or libtool-ltdl, on other OSes")


class Compiled(Protocol):
    """What an async driver reads of a statement compiled for it (`execution.plan.Plan`)."""

    @property
    def sql(self) -> str: ...

    @property
    def shape(self) -> Shape: ...

    @property
    def wants_description(self) -> bool:
        """The cursor's description is still needed (for the result processors, read once)."""


@dataclass(frozen=True)
class Driver:
    """One DBAPI driver, as a URL names it (``<backend>+<name>://``). Subclasses override the quirk hooks."""

    name: str  # SQLAlchemy's driver name
    module: str  # what `import` loads
    # What pip installs: this project's extra for the drivers it ships with, else the driver's distribution; None
    # for a module that comes with Python (sqlite3).
    package: str | None
    sync: bool = True  # create_engine can use it
    asynchronous: bool = False  # create_async_engine can use it (psycopg and oracledb serve both)
    libraries: tuple[SystemLibrary, ...] = ()
    # The store runs its statements on this sync driver's DBAPI cursor itself (`execution.sync`), compiled once,
    # rather than through SQLAlchemy's execution context: set for drivers the conformance suite passes with live.
    native: bool = False
    # Closing a connection whose server went away leaves its socket open until garbage collection (a
    # ResourceWarning then): the driver's leak, not the caller's.
    leaks_lost_sockets: bool = False
    # The connect_args that open its connections in autocommit mode (every statement commits alone), which the store
    # refuses: named in that error, and tried by the conformance suite. None: only as an attribute, if at all.
    autocommit_args: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    # An async driver's COMMIT goes on its own API (`commit`); False where SQLAlchemy's commit, which follows it when
    # the connection goes back, would send one all the same: the store leaves the COMMIT to that one.
    commits_natively: ClassVar[bool] = True

    # --- installation --------------------------------------------------------------------------------------------

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

    # --- quirks ------------------------------------------------------------------------------------------------

    def own_engine(self, create: Callable[..., E], options: dict[str, Any]) -> E:
        """A store's own engine (`from_url`): `create(**options)`, the caller's options and the backend's, plus what
        makes this driver cheaper where the caller said nothing."""
        return create(**options)

    def install(self, engine: Engine) -> None:
        """Engine listeners that make this driver behave as the others do (e.g. error classes PEP 249 expects)."""

    def without_prepared_statements(self, params: dict[str, Any]) -> None:
        """Adjust connect() keyword arguments so the driver keeps no prepared statement across transactions (behind
        a transaction-mode pooler a client's next transaction may run on another server session)."""

    def behind_pooler(self, dbapi_connection: Any, driver_connection: Any) -> bool | None:
        """Whether `dbapi_connection`, just opened without prepared statements (`driver_connection` is the driver's
        own object under it), reaches its server through a pooler that may move a client between server sessions;
        None if the driver cannot tell. Asked of an engine's first connection when its URL does not declare a pooler
        (`dialects.pooler`); left undefined for a driver that keeps nothing on a session."""
        return None

    def sent_size(self, value: bytes) -> int:
        """The bytes `value`, bound as a parameter, takes in the statement this driver sends: what a server's statement
        size limit (`Features.max_statement_bytes`) is compared with. A driver that sends parameters in a binary
        protocol sends it as it is; drivers that write parameters into the statement's text escape it or encode it
        as hex (override)."""
        return len(value)

    def autocommit_on(self, dbapi_connection: Any) -> bool | None:
        """Whether `dbapi_connection` commits every statement alone, where only the driver can tell without a round
        trip; None: ask SQLAlchemy's dialect."""
        return None

    async def execute(self, connection: Any, plan: Compiled, parameters: Any) -> Any:
        """Run one statement natively on an async driver's own connection (`connection` is SQLAlchemy's adapter of
        it, whose transaction this joins): `plan.sql` with `parameters`, answered (answer, description), the answer
        being the rowcount, the first row, every row, or None, as `plan.shape` asks, the description only while
        `plan.wants_description` (`read_async`; `execution.plan.read` for a PEP 249 cursor). Driver errors come out
        as SQLAlchemy's adapter raises them (its emulation of PEP 249's classes). Drivers without a native form raise
        NotImplementedError: the store runs their statements through SQLAlchemy instead."""
        raise NotImplementedError

    def begin_sync(self, dbapi_connection: Any) -> None:
        """Before the store's native statement on a sync DBAPI connection: begin the transaction the driver would begin
        by itself before that statement, where the driver has a cheaper way (its errors raised as the driver raises
        them). The default leaves it to the driver."""

    def open_sync(self, dbapi_connection: Any, plan: Compiled, parameters: Any) -> tuple[Any, Any] | None:
        """Run the store's native statement on a sync DBAPI connection together with the BEGIN of the transaction it
        opens, where the driver can send both at once: answered (answer, description) as `execution.plan.read`
        answers for a cursor (its errors raised as the driver raises them). None where it does not (a transaction
        begun already, say): the store then begins (`begin_sync`) and runs it on the DBAPI cursor. The default:
        None."""
        return None

    def commit_sync(self, dbapi_connection: Any) -> None:
        """Commit the store's transaction on a sync DBAPI connection the driver's cheaper way, before SQLAlchemy's
        commit, which then finds nothing to send (its errors raised as the driver raises them). The default leaves
        the COMMIT to SQLAlchemy."""

    @property
    def own_transactions_sync(self) -> bool:
        """This sync driver begins or commits the store's transactions its cheaper way (`begin_sync`, `open_sync`,
        `commit_sync`)."""
        own = type(self)
        return (own.begin_sync is not Driver.begin_sync or own.open_sync is not Driver.open_sync
                or own.commit_sync is not Driver.commit_sync)

    def commit(self, connection: Any) -> Awaitable[Any] | None:
        """What commits the transaction `execute` joined, natively (SQLAlchemy's adapter then finds nothing to
        commit), to await (the driver's own, no coroutine around it: the store raises its errors as the adapter
        does); None if there is nothing to commit. Here its own connection's `commit()`. A driver whose adapter sends
        the COMMIT anyway sets `commits_natively` False instead: the store then leaves the COMMIT to SQLAlchemy."""
        return driver_connection(connection).commit()  # type: ignore[no-any-return]

    def in_thread(self, connection: Any, work: Callable[[Any], Any]) -> asyncio.Future[Any] | None:
        """For an async driver that runs its connection on a thread of its own: `work(dbapi)` queued to that thread in
        one hop (`dbapi` the PEP 249 connection there), its value or error the awaitable's; None where the driver
        has no such thread (the store then sends a `Statements` step's statements one by one). The work runs to its
        end whatever happens to the awaiting task: `interrupt` asks it to stop early."""
        return None

    def interrupt(self, connection: Any) -> None:
        """Ask the statement `in_thread` work runs now, if any, to stop (from the event loop's thread)."""

    @property
    def threaded(self) -> bool:
        """This async driver runs its connection on a thread of its own, where `in_thread` sends work."""
        return type(self).in_thread is not Driver.in_thread

    @property
    def native_async(self) -> bool:
        """This async driver runs the store's statements on its own API (`execute`), without a greenlet per
        statement."""
        return type(self).execute is not Driver.execute


def hex_size(value: bytes) -> int:
    """`sent_size` for a driver that sends bytes as a hex text literal (``\\x`` and two digits a byte)."""
    return 2 * len(value) + 2


async def read_async(cursor: Any, plan: Compiled) -> tuple[Any, Any]:
    """An async DBAPI-like cursor's answer for `plan` (awaited fetches; see `Driver.execute`): as `read` for a PEP 249
    cursor, the description only while the plan still wants it (a psycopg cursor builds one per access)."""
    shape = plan.shape
    if shape is Shape.ROW or shape is Shape.ROWS:
        description = cursor.description if plan.wants_description else None
        return (await cursor.fetchone() if shape is Shape.ROW else await cursor.fetchall()), description
    return (cursor.rowcount if shape is Shape.ROWCOUNT else None), None
