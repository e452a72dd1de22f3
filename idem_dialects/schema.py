"""The logical tables as SQLAlchemy Core: records, processed messages, and the outbox of commands the effects write
for other systems. Backends choose the key, text and time column types."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Column, Index, Integer, MetaData, PrimaryKeyConstraint, String, Table

from .errors import IdemError

if TYPE_CHECKING:
    from .dialects.base import Backend

# Short enough that "<prefix>records_pk" fits a 30-byte identifier (Oracle before 12.2, and a safe floor elsewhere).
_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,19}")
KEY_COLUMNS = ("scope", "operation", "idem_key")
MESSAGE_KEY_COLUMNS = ("subscriber", "message_id")
# The outbox's states: waiting to be published (or retried), published, given up on (dead-lettered).
PENDING, PUBLISHED, DEAD = 0, 1, 2
ERROR_LENGTH = 255  # what is kept of a failed publish's error (its type and first line, ASCII)


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise IdemError(
            f"table_prefix must be 1-20 characters of lower-case ASCII letters, digits and '_', starting with a letter;"
            f" got {prefix!r}"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class Tables:
    metadata: MetaData
    records: Table
    messages: Table
    outbox: Table
    # Generations (dialects/maintenance.py): the previous generation of records and the next one being prepared, in
    # a MetaData of their own, so `create_tables()` makes them only when asked (`generations=True`).
    previous: Table
    staging: Table

    @property
    def all(self) -> tuple[Table, ...]:
        """The store's tables (a generation's previous and next records tables aside)."""
        return (self.records, self.messages, self.outbox)


def build_tables(prefix: str, backend: Backend, metadata: MetaData | None = None) -> Tables:
    """The tables for `backend`, in `metadata` (a new MetaData unless given: e.g. a service's own, for migrations)."""
    metadata = MetaData() if metadata is None else metadata
    types = backend.columns

    def pk_name(name: str) -> str | None:
        return name if types.named_primary_key else None

    def records_table(name: str, into: MetaData) -> Table:
        return Table(
            name,
            into,
            Column("scope", types.key, nullable=False),
            Column("operation", types.key, nullable=False),
            Column("idem_key", types.key, nullable=False),
            Column("fingerprint", types.token, nullable=False),
            Column("claim_token", types.token, nullable=False),
            Column("created_at", types.timestamp, nullable=False),
            Column("locked_until", types.timestamp, nullable=False),
            Column("completed_at", types.timestamp, nullable=True),
            Column("status", Integer, nullable=True),
            Column("response", types.blob, nullable=True),
            PrimaryKeyConstraint(*KEY_COLUMNS, name=pk_name(f"{name}_pk")),
            # purge scans by age; claims not completed (in flight, stuck) are its NULLs: what stats counts exactly
            Index(f"{name}_done_ix", "completed_at"),
            **types.table_options,  # keyword arguments a backend needs on every table (e.g. MySQL's ENGINE/CHARSET)
        )

    records = records_table(f"{prefix}records", metadata)
    messages = Table(
        f"{prefix}messages",
        metadata,
        Column("subscriber", types.key, nullable=False),
        Column("message_id", types.key, nullable=False),
        Column("fingerprint", types.token, nullable=True),
        Column("processed_at", types.timestamp, nullable=False),
        PrimaryKeyConstraint(*MESSAGE_KEY_COLUMNS, name=pk_name(f"{prefix}messages_pk")),
        **types.table_options,
    )
    # One row per command an effect wrote for another system, in the effect's transaction; a relay publishes it.
    # `available_at`: when a pending command is next due (a relay's lease or a retry's backoff pushes it on); for a
    # published or dead one, when it became so (retention's clock). Commands of one scope are published in the order
    # (created_at, seq, command_id) by relays that keep order.
    outbox = Table(
        f"{prefix}outbox",
        metadata,
        Column("command_id", types.token, nullable=False),
        Column("scope", types.key, nullable=False),
        Column("operation", types.key, nullable=False),
        Column("idem_key", types.key, nullable=False),
        Column("seq", Integer, nullable=False),
        Column("destination", types.key, nullable=False),
        Column("payload", types.blob, nullable=False),
        Column("headers", types.blob, nullable=False),
        Column("state", Integer, nullable=False),
        Column("attempts", Integer, nullable=False),
        Column("created_at", types.timestamp, nullable=False),
        Column("available_at", types.timestamp, nullable=False),
        Column("claim_token", types.token, nullable=True),
        Column("last_error", String(ERROR_LENGTH), nullable=True),
        PrimaryKeyConstraint("command_id", name=pk_name(f"{prefix}outbox_pk")),
        Index(f"{prefix}outbox_due_ix", "state", "available_at"),  # relays' claims; retention of published ones
        Index(f"{prefix}outbox_scope_ix", "scope", "state", "created_at"),  # the head of a scope's queue
        **types.table_options,
    )
    rotation = MetaData()
    return Tables(metadata, records, messages, outbox, records_table(f"{prefix}records_prev", rotation),
                  records_table(f"{prefix}records_next", rotation))

