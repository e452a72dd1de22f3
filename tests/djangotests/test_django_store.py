"""DjangoStore and the adapter's edges, in process: the store on Django's connection, settings errors, limits,
the management command and the migration's tables, on every engine."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import RequestFactory, override_settings
from django_common import new_key
from django_site.models import Payment
from sqlalchemy import create_engine
from stores_common import DONE, EFFECTS, Side, effects, store_script

from idem_dialects import Claimed, IdempotencyStore, RetryCause, default_encoder, dialects, engines
from idem_dialects.django import DjangoStore, get_store, idempotent
from idem_dialects.django.connection import engine_url
from idem_dialects.engines import provisioning

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#"


class Boom(Exception):
    pass


def count(alias: str) -> int:
    return Payment.objects.using(alias).count()


def test_the_engine_url_names_djangos_driver(alias: str) -> None:
    url = engine_url(connections[alias])
    module = type(connections[alias].connection).__module__.split(".")[0]
    assert url.password is None  # nothing connects through it
    assert url.get_dialect().import_dbapi().__name__.split(".")[0] == module
    assert type(get_store(alias).backend) is dialects.load(url.get_backend_name())


def test_run_shares_the_orm_transaction_and_rolls_back_with_it(alias: str) -> None:
    store = get_store(alias)
    key = new_key()

    def failing(conn: Any) -> Any:
        Payment.objects.using(alias).create(account="a", amount=1)
        raise Boom

    with pytest.raises(Boom):
        store.run(scope="s", operation="op", key=key, request={}, effect=failing)
    assert count(alias) == 0
    with store.transaction() as conn:
        assert isinstance(store.claim(conn, scope="s", operation="op", key=key, request={}), Claimed)
        conn.rollback()  # the transaction is Django's: SQLAlchemy's rollback is a no-op there
        transaction.set_rollback(True, using=alias)  # what rolls it back

    def paying(conn: Any) -> dict[str, int]:
        return {"id": Payment.objects.using(alias).create(account="a", amount=1).pk}

    first = store.run(scope="s", operation="op", key=key, request={}, effect=paying)
    again = store.run(scope="s", operation="op", key=key, request={}, effect=paying)
    assert again.replayed and again.response == first.response and count(alias) == 1


def test_inside_the_callers_atomic_block_errors_go_to_the_caller_unretried(alias: str) -> None:
    store = get_store(alias)
    transient = _transient()
    assert store.retry_cause(transient) is not None
    with transaction.atomic(using=alias):
        assert store.retry_cause(transient) is None  # the caller's transaction may be doomed: not ours to retry


def _transient() -> BaseException:
    from idem_dialects.errors import TransientError

    class Busy(TransientError):
        cause = RetryCause.BUSY

    return Busy("busy")


def test_a_django_store_is_a_store_and_bad_settings_say_what_to_do() -> None:
    # A store with IdempotencyStore's API, on an alias: no URL constructor to refuse (it is not a subclass of one).
    from idem_dialects.store import IdempotencyStore, SyncStore

    assert issubclass(DjangoStore, SyncStore) and not issubclass(DjangoStore, IdempotencyStore)
    assert not hasattr(DjangoStore, "from_url")
    for setting, message in [({"NOPE": 1}, "unknown key"), ({"DATABASE": "missing"}, "not in DATABASES"),
                             ({"POLICY": {"colour": "red"}}, "unknown idempotency policy option"),
                             ({"SCOPE": "no.such.callable"}, "cannot import"),
                             ({"POLICY": {"lease": 5}}, "lease must be a positive timedelta"),
                             ({"RETENTION": 5}, "RETENTION")]:
        with override_settings(IDEMPOTENCY=setting), pytest.raises(ImproperlyConfigured, match=message):
            get_store()


def view_request(body: bytes = b'{"amount": 1}', key: str | None = None) -> HttpRequest:
    return RequestFactory().post("/x", data=body, content_type="application/json",
                                 headers={"Idempotency-Key": f'"{key or new_key()}"', "X-Account": "acct"})


def test_limits_refuse_before_and_after_the_view(alias: str) -> None:
    scope = {"scope": lambda r: r.headers["X-Account"], "using": alias, "max_request_bytes": 64,
             "max_response_bytes": 64, "paths": None}  # every path: the settings' POLICY has /mw/ only

    @idempotent(**scope)
    def big(request: HttpRequest) -> HttpResponse:
        Payment.objects.using(alias).create(account="a", amount=1)
        return HttpResponse(b"x" * 65, status=201)

    @idempotent(**scope)
    def streamed(request: HttpRequest) -> StreamingHttpResponse:
        return StreamingHttpResponse(iter([b"ab", b"cd"]), status=201)

    too_big = big(view_request(b'{"amount": "' + b"1" * 100 + b'"}'))
    assert too_big.status_code == 413 and json.loads(too_big.content)["type"] == PROBLEM + "request-too-large"
    overflow = big(view_request())
    assert overflow.status_code == 500 and json.loads(overflow.content)["type"] == PROBLEM + "response-too-large"
    assert count(alias) == 0  # the view's write rolled back with the claim
    key = new_key()
    first, again = streamed(view_request(key=key)), streamed(view_request(key=key))
    assert b"".join(first.streaming_content) == b"abcd" == again.content  # type: ignore[attr-defined]
    assert again["Idempotent-Replayed"] == "true"


def test_lease_mode_inside_an_atomic_block_is_refused(alias: str) -> None:
    @idempotent(using=alias, scope=lambda r: "s", lease=timedelta(seconds=5), paths=None)
    def external(request: HttpRequest) -> HttpResponse:
        return HttpResponse(status=201)

    with transaction.atomic(using=alias), pytest.raises(ImproperlyConfigured, match="non_atomic_requests"):
        external(view_request())


def test_the_migration_made_the_tables_and_idem_purge_empties_them(alias: str) -> None:
    store = get_store(alias)
    key = new_key()
    store.run(scope="s", operation="op", key=key, request={}, effect=lambda conn: 1)
    out = StringIO()
    call_command("idem_purge", "--older-than", "0s", "--database", alias, stdout=out)
    assert out.getvalue().startswith("purged ") and f"on {alias!r}" in out.getvalue()
    assert not store.run(scope="s", operation="op", key=key, request={}, effect=lambda conn: 2).replayed
    with pytest.raises(CommandError, match="not a duration"):
        call_command("idem_purge", "--older-than", "soon", "--database", alias)


def test_idem_purge_defaults_to_the_configured_retention(alias: str) -> None:
    with override_settings(IDEMPOTENCY={"RETENTION": timedelta(hours=2)}):
        store = get_store(alias)
        assert store.retention == timedelta(hours=2)
        key = new_key()
        store.run(scope="s", operation="op", key=key, request={}, effect=lambda conn: 1)
        out = StringIO()
        call_command("idem_purge", "--database", alias, stdout=out)
        assert "older than 2:00:00" in out.getvalue()
        assert store.run(scope="s", operation="op", key=key, request={}, effect=lambda conn: 2).replayed  # kept
        assert store.stats().completed >= 1


def end_django_session(alias: str) -> None:
    """End, from another session, the server session of this thread's Django connection for `alias`."""
    backend = get_store(alias).backend
    provision = provisioning(backend.name)
    if provision.session_id_sql is None or provision.end_session_sql is None:
        pytest.skip(f"{type(backend).__name__}: no server session to end (embedded)")
    with connections[alias].cursor() as cursor:
        cursor.execute(provision.session_id_sql)
        session = int(cursor.fetchone()[0])
    server = engines.get(alias).provide()  # the aliases are named after their catalogue engines
    other = create_engine(server.url)
    try:
        with other.connect() as conn:
            conn.exec_driver_sql(provision.end_session_sql.format(id=session))
            conn.commit()
    finally:
        other.dispose()


def test_a_lost_connection_is_retried_on_a_new_one_and_the_effect_runs_once(alias: str) -> None:
    store = get_store(alias)
    store.run(scope="s", operation="op", key=new_key(), request={}, effect=lambda conn: 0)  # Django's connection open
    end_django_session(alias)
    before = store.retries[RetryCause.CONNECTION]
    runs: list[int] = []

    def paying(conn: Any) -> int:
        runs.append(1)
        return Payment.objects.using(alias).create(account="a", amount=1).pk

    result = store.run(scope="s", operation="op", key=new_key(), request={}, effect=paying)
    assert not result.replayed and runs == [1] and count(alias) == 1
    assert store.retries[RetryCause.CONNECTION] == before + 1  # Django's own error on the dead connection, classified


def test_the_test_settings_patch_no_driver_mariadb_urls_still_mean_pymysql() -> None:
    """Django's MySQL backend ran on PyMySQL without `pymysql.install_as_MySQLdb()`: no `MySQLdb` module is left in
    the process, so a `mariadb://` URL keeps its PyMySQL driver (not the mysqldb dialect on PyMySQL, which passes the
    deprecated `db` argument on every connect)."""
    import sys
    import warnings
    from importlib.util import find_spec

    from django.conf import settings

    from idem_dialects import IdempotencyStore
    from idem_dialects.url import target

    if "mariadb" not in settings.DATABASES:
        pytest.skip(settings.UNAVAILABLE.get("mariadb", "no mariadb database"))
    assert connections["mariadb"].vendor == "mysql"  # Django's MySQL backend is loaded
    assert "MySQLdb" not in sys.modules and find_spec("MySQLdb") is None
    url = engines.get("mariadb").provide().url.set(drivername="mariadb")
    assert target(url).driver == "pymysql"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyMySQL's "'db' is deprecated" among them
        with IdempotencyStore.from_url(url) as store, store.engine.connect():
            pass


def test_the_store_script_runs_through_django_as_through_an_idempotency_store(alias: str, tmp_path: Path) -> None:
    """The script every store type runs (tests/stores_common.py) gives DjangoStore's outcomes and effects exactly
    the plain IdempotencyStore's: a cell of docs/store-types.md's table."""
    outcomes, done = [], []
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'plain.db'}", encoder=default_encoder) as plain:
        plain.create_tables()
        DONE.create(plain.engine)
        outcomes.append(store_script(plain, Side(False), lambda n: f"tenant{n}"))
        with plain.engine.connect() as conn:
            done.append(effects(conn))
    store = DjangoStore(alias, table_prefix="script_", encoder=default_encoder)
    store.create_tables()
    with store.connection() as conn:
        DONE.create(conn, checkfirst=True)
    try:
        outcomes.append(store_script(store, Side(False), lambda n: f"tenant{n}"))
        with store.connection() as conn:
            done.append(effects(conn))
    finally:
        with store.connection() as conn:
            DONE.drop(conn, checkfirst=True)
        store.drop_tables()
    assert outcomes[0] == outcomes[1]
    assert done[0] == done[1] == EFFECTS
