"""What every part of a store shares: the backend chosen from the engine, the tables, validation before any SQL,
the retry budget and its classification, telemetry, and the schema's lifecycle. The protocol's flows live in
`claims.py` (claim, complete, run), `inbox.py` (processed messages) and `retention.py` (purge, stats); the loops that
execute them in `store.py` and `aio.py`.
"""

from __future__ import annotations

import threading
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.schema import Table

from . import dialects
from .dialects.base import Backend, configured_isolation
from .dialects.options import budget_warning
from .errors import ConfigurationError, IdemWarning, MissingTables, RetryCause, UnsupportedIsolation
from .features import Features
from .fingerprint import Encoder, fingerprint, payload_fingerprint
from .guard import guard
from .keys import MAX_IDENTITY_BYTES, check_identifier, check_identity_size
from .limits import DEFAULT_RETENTION, check_response_size, check_retention, lease_seconds
from .outcomes import Claimed
from .retry import RetryPolicy, retrying
from .schema import Tables, build_tables, check_prefix
from .steps import Begin, Flow, catalog, transaction
from .telemetry import MeterProvider, Telemetry, TracerProvider

T = TypeVar("T")
NO_PAYLOAD: Any = object()
# A statement that keeps meeting something in flux (a CREATE racing another, a claim changing under us) this many
# times in a row is contention to back off from, not a loop to spin in.
ROUNDS = 5
_READY = "idem_dialects.ready"  # in a pooled connection's info: its driver does not commit every statement alone


@dataclass(frozen=True, slots=True)
class Request:
    """A request validated and fingerprinted once, before any SQL, however many attempts it takes."""

    scope: str
    operation: str
    key: str
    fingerprint: str
    lease: float | None
    # One claim token for every attempt of one run: a leased retry that finds this token on an in-flight record
    # knows the claim is its own (its COMMIT went through, the reply was lost) and carries on as the owner.
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def ident(self) -> dict[str, str]:
        return {"scope": self.scope, "operation": self.operation, "idem_key": self.key}

    def claimed(self, *, taken_over: bool = False) -> Claimed:
        return Claimed(self.scope, self.operation, self.key, self.fingerprint, self.token, self.lease is not None,
                       taken_over)


def check_isolation(backend: Backend, level: str | None) -> None:
    """Refuse, before any SQL, an isolation level the backend does not guarantee the protocol under."""
    if level is not None and level not in backend.features.isolation_levels:
        raise UnsupportedIsolation(backend.name, level, backend.features.isolation_levels)


class Core:
    """The backend, the tables, validation and retries of one store.

    `own_transactions`: the store begins its transactions itself, so a claim that opens one may begin it the
    backend's cheaper way (`Begin.CLAIM`); False where another framework begins them (Django's atomic blocks).
    `retry_filter`: what the backend is shown of an error before it classifies it for a retry (None: not retried),
    for a store whose transactions can be nested in its caller's."""

    def __init__(self, engine: Engine, table_prefix: str, retry: RetryPolicy | None, encoder: Encoder | None,
                 retention: timedelta = DEFAULT_RETENTION, *, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None, own_transactions: bool = True,
                 retry_filter: Callable[[BaseException], BaseException | None] | None = None) -> None:
        self.engine = engine
        self.encoder = encoder  # turns values that are not plain JSON (Decimal, datetime, ...) into JSON
        self.table_prefix = check_prefix(table_prefix)
        self.retry = retry or RetryPolicy()
        self.backend: Backend = dialects.load(engine.url.get_backend_name())(engine)
        self._driver = dialects.driver(type(self.backend), engine.dialect.driver)
        warning = budget_warning(self.retry.total, self.backend.features.failover_window)
        if warning is not None:
            warnings.warn(warning, IdemWarning, stacklevel=4)
        check_isolation(self.backend, configured_isolation(engine))
        self.tables: Tables = build_tables(self.table_prefix, self.backend)
        guard(engine, self.backend, tuple(t.name for t in self.tables.all))
        # The portable identity limit, or the backend's own if lower (checked before any SQL).
        self.identity_limit = min(MAX_IDENTITY_BYTES, self.backend.features.max_identity_bytes or MAX_IDENTITY_BYTES)
        self.retries: Counter[str] = Counter()  # retries absorbed, by cause, since the store was made
        self._retries_lock = threading.Lock()
        self.retention = check_retention(retention)  # what `purge` deletes when not told, and `stats` counts
        self.telemetry = Telemetry(self.backend.db_system_name, self.backend.db_namespace(),
                                   tracer_provider=tracer_provider, meter_provider=meter_provider)
        self.own_transactions = own_transactions
        self.retry_filter = retry_filter
        self.refined = False
        # A loop that runs a claim or a completion whole where the connection lives (the async SQLite store) asks
        # for them as one `Statements` step; every other loop steps their statements itself, a generator less.
        self.statement_steps = False
        self._sent_size = len if self._driver is None else self._driver.sent_size
        # The previous generation of records (dialects/maintenance.py), found when the store first meets the server:
        # claims read it before they insert. None: this database keeps one table, purged row by row.
        self.previous: Table | None = None

    @property
    def features(self) -> Features:
        return self.backend.features

    # --- validation, before any SQL ----------------------------------------------------------------------------

    def request(self, scope: object, operation: object, key: object, request: object,
                lease: timedelta | None) -> Request:
        fields = {"scope": check_identifier("scope", scope), "operation": check_identifier("operation", operation),
                  "key": check_identifier("key", key)}
        check_identity_size(fields, self.identity_limit)  # one limit on every engine
        return Request(fields["scope"], fields["operation"], fields["key"],
                       fingerprint(request, encoder=self.encoder), lease_seconds(lease))

    def message(self, subscriber: object, message_id: object, payload: Any) -> tuple[dict[str, str], str | None]:
        """A message's identity and payload fingerprint, validated before any SQL."""
        ident = {"subscriber": check_identifier("subscriber", subscriber),
                 "message_id": check_identifier("message_id", message_id)}
        check_identity_size(ident, self.identity_limit)
        return ident, None if payload is NO_PAYLOAD else payload_fingerprint(payload, self.encoder)

    def check_response(self, body: bytes) -> None:
        """ResponseTooLarge for a stored response the server would refuse in one statement (as the driver sends it),
        before anything is sent: never a failed statement or dropped connection that `run` would retry."""
        check_response_size(body, self.features, self.backend.name, self._sent_size)

    def checked(self, conn: Connection) -> None:
        """A caller's connection for the step-by-step API: its isolation level allowed, and its driver's setting
        read again (the caller may have changed it on this connection)."""
        check_isolation(self.backend, configured_isolation(conn))
        conn.info.pop(_READY, None)
        self.ready(conn)

    def ready(self, conn: Connection) -> None:
        """A connection about to run the store's statements: refused, before any of them, if its driver commits every
        statement alone (connect_args={"autocommit": True}, sqlite3's isolation_level=None, ...: a failing effect
        would leave its claim behind and run again). No round trip."""
        # Read once per pooled DB-API connection: its driver's settings are made when it connects, and the pool
        # undoes what SQLAlchemy changes on a checkout (a caller's connection is read again: `checked`).
        info = conn.info
        if _READY not in info:
            setting = self.backend.autocommit_setting(conn)
            if setting is not None:
                raise UnsupportedIsolation(self.backend.name, "AUTOCOMMIT", self.features.isolation_levels, setting)
            info[_READY] = True

    def refine(self) -> Flow[None]:
        """The features refined from the live server, once per store (a benign race: every caller computes the
        same), in the transaction that first needs them."""
        if not self.refined:
            refined = yield from self.backend.refine_features(self.backend.features)
            if not self.backend.features.session_state:  # learned meanwhile: a pooler was found (pooler.py)
                refined = refined.replace(session_state=False)
            self.backend.features = refined
            if self.backend.maintenance.generations():
                name = self.tables.previous.name
                found = yield from catalog(lambda c: inspect(c).has_table(name))
                self.previous = self.tables.previous if found else None
            self.refined = True

    def begin(self, begin: Begin) -> Flow[None]:
        """What a transaction the store opens runs first: the backend's BEGIN (where the store begins its own
        transactions), and the features refined once."""
        if self.own_transactions:
            yield from self.backend.begin(begin)
        yield from self.refine()

    def scope(self, scope: object) -> None:
        """A routing scope given to a store on one database: checked as every scope is (a sharded store routes by
        it), then not needed."""
        if scope is not None:
            check_identifier("scope", scope)

    # --- retries -------------------------------------------------------------------------------------------------

    def retrying(self, attempt: Callable[[], Flow[T]], policy: RetryPolicy | None = None) -> Flow[T]:
        """`attempt()` re-run on the backend's retryable errors within the retry budget, counted in `retries`."""
        return retrying(policy or self.retry, self.retry_cause, attempt, self.count_retry)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why a flow may run its attempt again after `exc` (None: it propagates): the backend's classification."""
        if self.retry_filter is not None:
            shown = self.retry_filter(exc)
            if shown is None:
                return None
            exc = shown
        if isinstance(exc, MissingTables) and self.previous is not None and (
                {self.tables.records.name, self.previous.name} & set(exc.tables)):
            # Where DDL is not transactional (MySQL, MariaDB), a rotation renames the current table away and the
            # next one into its name, under LOCK TABLES: a statement that waited for it can find no table between
            # the two renames. The tables exist (the store found them): the next attempt finds the new one.
            return RetryCause.ROTATION
        return self.backend.errors.retry_cause(exc)

    def count_retry(self, cause: str) -> None:
        """One retry absorbed (`retries`), for a flow that retries on this store's behalf (a sharded store's)."""
        with self._retries_lock:
            self.retries[cause] += 1
        self.telemetry.retry(cause)

    # --- the schema ----------------------------------------------------------------------------------------------

    def create_tables(self, generations: bool = False) -> Flow[None]:
        """Create the tables (and indexes) that do not exist yet; with `generations`, the previous generation's table
        too (where the backend rotates generations). Safe from many processes at once (workers starting together):
        busy errors are retried like `run`'s, and a CREATE that lost the race to another creator (an "already exists"
        error the backend recognises) is run again, its check then finding what the other made."""
        wanted = [*self.tables.metadata.sorted_tables, *([self.tables.previous] if generations else [])]

        def create(conn: Connection) -> None:
            if generations and not self.backend.maintenance.generations():  # features refined by now (Galera?)
                raise ConfigurationError(f"{self.backend.name}: this backend (or server) keeps no generations; its"
                                         " purge deletes row by row (docs: Retention and purge)")
            for table in wanted:
                table.create(conn, checkfirst=True)

        for round_no in range(ROUNDS):
            try:
                yield from self.retrying(lambda: transaction(catalog(create)))
                if generations:
                    self.previous = self.tables.previous
                return
            except DBAPIError as exc:
                if round_no == ROUNDS - 1 or not self.backend.errors.is_already_created(exc):
                    raise

    def drop_tables(self) -> Flow[None]:
        def drop(conn: Connection) -> None:
            for table in (self.tables.previous, self.tables.staging):
                table.drop(conn, checkfirst=True)
            self.tables.metadata.drop_all(conn, checkfirst=True)

        yield from transaction(catalog(drop))
        self.previous = None

