"""The store's tables (records and processed messages, named from IDEMPOTENCY['TABLE_PREFIX']) on the database being
migrated, with each engine's exact key types, as `IdempotencyStore.create_tables()` makes them."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def create_tables(apps: Any, schema_editor: Any) -> None:
    from idem_dialects.django.conf import get_store

    get_store(schema_editor.connection.alias).create_tables()


def drop_tables(apps: Any, schema_editor: Any) -> None:
    from idem_dialects.django.conf import get_store

    get_store(schema_editor.connection.alias).drop_tables()


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    # Not atomic: where DDL commits implicitly (MySQL, MariaDB), a savepoint around it would be gone at its release.
    operations = [migrations.RunPython(create_tables, drop_tables, atomic=False, elidable=False)]
