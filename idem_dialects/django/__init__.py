"""Django: the idempotency record in the same transaction as the ORM's writes, the scope from ``request.user``.

    INSTALLED_APPS = [..., "idem_dialects.django"]          # the migration creating the tables, idem_purge
    MIDDLEWARE = [..., "django.contrib.auth.middleware.AuthenticationMiddleware",
                  "idem_dialects.django.IdempotencyMiddleware"]          # and/or @idempotent() on views
    IDEMPOTENCY = {"DATABASE": "default", "POLICY": {"methods": ["POST"]}}

Every statement of the protocol runs on Django's own connection for the database alias, inside Django's
``transaction.atomic`` (see `connection.py`); the HTTP semantics are the ones of `idem_dialects.http`.
Importing this module imports Django; ``import idem_dialects`` does not.
"""

from __future__ import annotations

from .conf import get_store, user_scope
from .connection import DjangoStore
from .views import IdempotencyMiddleware, idempotent

__all__ = ["DjangoStore", "IdempotencyMiddleware", "get_store", "idempotent", "user_scope"]
