"""The Django app: add ``"idem_dialects.django"`` to INSTALLED_APPS for the migration that creates the store's tables
and the ``idem_purge`` management command."""

from __future__ import annotations

from django.apps import AppConfig


class IdemDialectsConfig(AppConfig):
    name = "idem_dialects.django"
    label = "idem_dialects"
    verbose_name = "Idempotency keys (idem-dialects)"
