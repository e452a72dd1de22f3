"""The test project: one SQLite database ("default", a file: the live server's threads each open their own connection)
and, where this machine runs them, PostgreSQL ("postgresql") and MariaDB ("mariadb") from the engine catalogue, each
with a test database of this run's own. The views write to each alias (urls.py)."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idem_dialects.engines import Unavailable, get

if TYPE_CHECKING:  # not imported here: an upper-case name in this module is a Django setting
    from sqlalchemy.engine import URL

RUN = secrets.token_hex(4)
SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "django_site.urls"
STATIC_URL = "/static/"  # the live server serves static files from it
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # test users log in on every request

# With the example project's app (examples/django_postgres), whose code the Django docs page shows and runs.
sys.path.append(str(Path(__file__).resolve().parents[2] / "examples" / "django_postgres"))
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions", "rest_framework",
                  "idem_dialects.django", "django_site", "payments"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_site.auth.HeaderUserMiddleware",
    "idem_dialects.django.IdempotencyMiddleware",
]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "UNAUTHENTICATED_USER": None,
}
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend",
                           "django.contrib.auth.backends.RemoteUserBackend"]
# The middleware takes part only under /mw/ (the decorated views are elsewhere).
IDEMPOTENCY: dict[str, Any] = {"DATABASE": "default", "POLICY": {"paths": lambda path: path.startswith("/mw/")}}

UNAVAILABLE: dict[str, str] = {}  # alias -> why this machine has no such database
DATABASES: dict[str, Any] = {}


def _database(url: URL, django_engine: str, options: dict[str, Any]) -> dict[str, Any]:
    """The DATABASES entry of the database at `url` (pytest-django makes a test database of this run's own beside it
    for an alias of these settings)."""
    return {"ENGINE": django_engine, "NAME": url.database, "USER": url.username or "", "PASSWORD": url.password or "",
            "HOST": url.host or "", "PORT": str(url.port or ""), "OPTIONS": options,
            "TEST": {"NAME": f"idem_dj_{RUN}"}}


def postgresql_database(url: URL) -> dict[str, Any]:
    """The DATABASES entry of the PostgreSQL database at `url`."""
    return _database(url, "django.db.backends.postgresql", {})


def mariadb_database(url: URL) -> dict[str, Any]:
    """The DATABASES entry of the MariaDB database at `url`: Django's MySQL backend on PyMySQL, lent to it as MySQLdb
    for its import only (no global monkey-patching). Also a private server's, which a test adds as an alias of its
    own (tests/djangotests/test_django_limits.py)."""
    return _database(url, "django_site.pymysql_backend", {"charset": "utf8mb4"})


def _server(alias: str, engine: str, entry: Callable[[URL], dict[str, Any]]) -> None:
    try:
        url = get(engine).provide().url
    except Unavailable as exc:
        UNAVAILABLE[alias] = f"{engine}: {exc}"
        return
    DATABASES[alias] = entry(url)


if os.environ.get("IDEM_DJANGO_DATABASES"):  # a server process (gunicorn) on the test run's own databases
    DATABASES = json.loads(os.environ["IDEM_DJANGO_DATABASES"])
else:
    STATE = tempfile.mkdtemp(prefix=f"idem-django-{RUN}-")
    atexit.register(shutil.rmtree, STATE, True)
    DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(STATE, "app.sqlite3"),
                            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
                            "TEST": {"NAME": os.path.join(STATE, "test.sqlite3")}}
    # A second SQLite database: the other shard of the sharded-store test (Django's routers pick each key's alias).
    DATABASES["shard_b"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(STATE, "shard_b.sqlite3"),
                            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
                            "TEST": {"NAME": os.path.join(STATE, "test_shard_b.sqlite3")}}
    _server("postgresql", "postgresql", postgresql_database)
    _server("mariadb", "mariadb", mariadb_database)
