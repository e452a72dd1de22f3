"""``manage.py idem_purge [--older-than 24h]``: delete idempotency records completed longer ago than that (default:
IDEMPOTENCY['RETENTION']), and processed messages and published outbox commands as old, in batches of one
transaction each; a live in-flight claim is never touched."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from idem_dialects.django.conf import get_config, get_store
from idem_dialects.errors import IdemError
from idem_dialects.limits import DEFAULT_PACE, parse_duration


class Command(BaseCommand):
    help = "Delete idempotency records completed longer ago than --older-than (default: the retention), in batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", metavar="DURATION",
                            help="delete records completed longer ago than this (e.g. 24h, 7d, 1h30m; default:"
                                 " IDEMPOTENCY['RETENTION'], else 24h)")
        parser.add_argument("--batch-size", type=int, default=1000, metavar="N",
                            help="rows per transaction (default 1000)")
        parser.add_argument("--pace", type=float, default=DEFAULT_PACE, metavar="SHARE",
                            help=f"the share of its time purge spends deleting, pausing between batches (above 0, at"
                                 f" most 1: no pauses; default {DEFAULT_PACE})")
        parser.add_argument("--database", default=None,
                            help="the database alias (default: IDEMPOTENCY['DATABASE'], else 'default')")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            older_than = None if options["older_than"] is None else parse_duration(options["older_than"])
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}") from None
        config = get_config()
        # With SHARDS and no --database: every shard's database in turn.
        alias = options["database"] or (None if config.shards else config.database)
        done: dict[str, int] = {}

        def progress(table: str, deleted: int) -> None:
            done[table] = done.get(table, 0) + deleted
            if options["verbosity"] > 1:
                self.stderr.write(f"  {table}: {done[table]} deleted")

        try:
            total = get_store(alias).purge(older_than, options["batch_size"], progress, pace=options["pace"])
        except IdemError as exc:  # bad input or configuration: what failed and how to fix it, no traceback
            raise CommandError(str(exc)) from exc
        per_table = ", ".join(f"{table}: {n}" for table, n in done.items())
        window = older_than if older_than is not None else config.retention
        where = repr(alias) if alias is not None else ", ".join(map(repr, config.shards))
        self.stdout.write(f"purged {total} rows older than {window} on {where} ({per_table})")
