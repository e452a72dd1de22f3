"""The integration's configuration: ``settings.IDEMPOTENCY``, read once and checked, with one store per database alias.

    IDEMPOTENCY = {
        "DATABASE": "default",                   # the alias the views write to (their ORM writes share its transaction)
        "TABLE_PREFIX": "idem_",
        "SCOPE": "idem_dialects.django.user_scope",   # callable(request) -> owner, or its dotted path
        "POLICY": {"methods": ["POST", "PATCH"]},     # IdempotencyPolicy's other keyword arguments
        "RETRY": None,                           # an idem_dialects.RetryPolicy
        "RETENTION": timedelta(hours=24),        # how long completed records replay; what idem_purge deletes after
        "SHARDS": None,                          # several aliases: each scope's keys on the one Django's routers pick
    }

With SHARDS (a list of database aliases), the store is a ShardedStore over one DjangoStore per alias, and the alias
for a key is ``django.db.router.db_for_write(IdempotencyRecord, scope=scope)``: your DATABASE_ROUTERS decide, as they
do for the models whose rows the view writes (route both by the tenant, so the record commits with them).

Every key is optional. Callables in it (SCOPE, and POLICY's ``operation`` when it is one) receive the Django request
(the DRF ``Request`` when the decorator sits on a DRF view), never the WSGI environ.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from ..errors import ConfigurationError, IdemError
from ..http.policy import HttpRequest, IdempotencyPolicy
from ..limits import check_retention
from ..retention import DEFAULT_RETENTION
from ..retry import RetryPolicy
from ..sharding.sync import ShardedStore
from .connection import DjangoStore

SETTING = "IDEMPOTENCY"
_KEYS = ("DATABASE", "TABLE_PREFIX", "SCOPE", "POLICY", "RETRY", "RETENTION", "SHARDS")
_POLICY_KEYS = frozenset(f.name for f in fields(IdempotencyPolicy) if f.init) - {"scope"}

Scope = Callable[[Any], object]


def user_scope(request: Any) -> str | None:
    """The default scope: the authenticated user (``request.user``), None (a 401 problem) for an anonymous one."""
    try:
        user = request.user
    except AttributeError:
        raise ImproperlyConfigured(
            "request.user is not set: put idem_dialects.django.IdempotencyMiddleware after"
            " django.contrib.auth.middleware.AuthenticationMiddleware in MIDDLEWARE (or set IDEMPOTENCY['SCOPE'])"
        ) from None
    if user is None or not user.is_authenticated:
        return None
    return f"user:{user.pk}"


@dataclass(frozen=True)
class Config:
    database: str = "default"
    table_prefix: str = "idem_"
    scope: Scope = user_scope
    policy: Mapping[str, Any] = field(default_factory=dict)
    retry: RetryPolicy | None = None
    retention: timedelta = DEFAULT_RETENTION
    shards: tuple[str, ...] = ()

    def make_policy(self, scope: Scope | str | None = None, **overrides: Any) -> IdempotencyPolicy:
        """The policy of POLICY with `overrides`; `scope` (or SCOPE) and a callable `operation` take the Django
        request."""
        options = {**self.policy, **overrides}
        unknown = sorted(set(options) - _POLICY_KEYS)
        if unknown:
            raise ImproperlyConfigured(f"unknown idempotency policy option(s) {', '.join(unknown)}; the options are"
                                       f" {', '.join(sorted(_POLICY_KEYS))}")
        operation = options.get("operation")
        if callable(operation):
            options["operation"] = _on_native(operation)
        if not options.get("global_scope"):
            options["scope"] = _on_native(_callable(scope or self.scope, "SCOPE"))
        try:
            return IdempotencyPolicy(**options)
        except (ConfigurationError, TypeError) as exc:
            raise ImproperlyConfigured(f"{SETTING}: {exc}") from exc


def _on_native(fn: Callable[[Any], Any]) -> Callable[[HttpRequest], Any]:
    def call(req: HttpRequest) -> Any:
        return fn(req.native)

    return call


def _callable(value: object, name: str) -> Scope:
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(f"{SETTING}['{name}']: cannot import {value!r} ({exc})") from exc
    if not callable(value):
        raise ImproperlyConfigured(f"{SETTING}['{name}'] must be a callable(request) or its dotted path,"
                                   f" got {type(value).__name__}")
    return value


def _read() -> Config:
    raw = getattr(settings, SETTING, None) or {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"settings.{SETTING} must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ImproperlyConfigured(f"unknown key(s) {', '.join(unknown)} in settings.{SETTING}; the keys are"
                                   f" {', '.join(_KEYS)}")
    given: dict[str, Any] = {k.lower(): tuple(v) if k == "SHARDS" else v for k, v in raw.items() if v is not None}
    config = Config(**given)
    unknown_shards = [alias for alias in config.shards if alias not in settings.DATABASES]
    if unknown_shards:
        raise ImproperlyConfigured(f"settings.{SETTING}['SHARDS'] names {', '.join(map(repr, unknown_shards))}, not"
                                   f" in DATABASES ({', '.join(settings.DATABASES)})")
    if config.database not in settings.DATABASES:
        raise ImproperlyConfigured(f"settings.{SETTING}['DATABASE'] is {config.database!r}, which is not in"
                                   f" DATABASES ({', '.join(settings.DATABASES)})")
    if not isinstance(config.policy, Mapping):
        raise ImproperlyConfigured(f"settings.{SETTING}['POLICY'] must be a dict of IdempotencyPolicy options")
    if config.retry is not None and not isinstance(config.retry, RetryPolicy):
        raise ImproperlyConfigured(f"settings.{SETTING}['RETRY'] must be an idem_dialects.RetryPolicy")
    try:
        check_retention(config.retention)
    except IdemError as exc:
        raise ImproperlyConfigured(f"settings.{SETTING}['RETENTION']: {exc}") from exc
    config.make_policy()  # every problem of the policy now, not at the first request
    return config


_lock = threading.Lock()
_config: Config | None = None
_stores: dict[tuple[str, str], DjangoStore] = {}


def get_config() -> Config:
    global _config
    with _lock:
        if _config is None:
            _config = _read()
        return _config


def get_store(using: str | None = None) -> DjangoStore | ShardedStore:
    """The store for the alias `using` (default: IDEMPOTENCY['DATABASE']), made once per alias; with SHARDS and no
    `using`, the ShardedStore over every shard's, Django's routers choosing each key's alias."""
    config = get_config()
    if config.shards and using is None:
        return ShardedStore({alias: get_alias_store(alias) for alias in config.shards}, router_chooser)
    return get_alias_store(using or config.database)


def router_chooser(scope: str) -> str:
    """The shard of a scope: what Django's database routers answer for the records' model, given the scope."""
    from django.db import router

    from .models import IdempotencyRecord

    return str(router.db_for_write(IdempotencyRecord, scope=scope))


def get_alias_store(alias: str) -> DjangoStore:
    """The DjangoStore of one database alias, made once."""
    config = get_config()
    with _lock:
        store = _stores.get((alias, config.table_prefix))
        if store is None:
            store = _stores[alias, config.table_prefix] = DjangoStore(
                alias, table_prefix=config.table_prefix, retry=config.retry, retention=config.retention)
        return store


def _reset(*, setting: str, **kwargs: Any) -> None:
    """Settings changed (override_settings in tests): read them again, and stores for changed DATABASES anew."""
    global _config
    if setting in (SETTING, "DATABASES"):
        with _lock:
            _config = None
            _stores.clear()


setting_changed.connect(_reset)
