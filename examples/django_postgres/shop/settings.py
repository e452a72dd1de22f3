"""A small payments service: DRF, PostgreSQL, idempotency keys whose record commits with the payment row."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "rest_framework",
    "idem_dialects.django",  # the migration that creates the idempotency tables; manage.py idem_purge
    "payments",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}
# Where PostgreSQL is comes from libpq's own variables (PGHOST, PGPORT, PGUSER, PGPASSWORD), as for psql.
DATABASES = {
    "default": {"ENGINE": "django.db.backends.postgresql", "NAME": os.environ.get("PGDATABASE", "shop"),
                "CONN_MAX_AGE": 60},
}
# The views are decorated with @idempotent (after DRF's authentication, so the scope is the caller's user).
IDEMPOTENCY = {"DATABASE": "default", "POLICY": {"methods": ["POST"]}}
