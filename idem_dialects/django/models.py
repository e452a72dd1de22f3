"""What Django's database routers are asked about when the store spans several databases (IDEMPOTENCY['SHARDS']):
``router.db_for_write(IdempotencyRecord, scope=...)``, as for any model, with the key's scope as a hint. Not a table
Django manages: the store creates its tables itself (the app's migration), with each engine's exact key types."""

from __future__ import annotations

from django.db import models


class IdempotencyRecord(models.Model):
    """The records, as routers see them; never queried (``managed = False``)."""

    scope: models.CharField[str, str] = models.CharField(max_length=255, primary_key=True)

    class Meta:
        managed = False
        db_table = "idem_records"
        app_label = "idem_dialects"
