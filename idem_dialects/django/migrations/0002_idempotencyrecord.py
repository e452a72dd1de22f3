"""The unmanaged model Django's database routers are asked about (models.py): no table, no SQL."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("idem_dialects", "0001_initial")]
    operations = [
        migrations.CreateModel(
            name="IdempotencyRecord",
            fields=[("scope", models.CharField(max_length=255, primary_key=True, serialize=False))],
            options={"db_table": "idem_records", "managed": False},
        ),
    ]
