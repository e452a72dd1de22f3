"""The two logical tables as SQLAlchemy Core. Backends choose the key, text and time column types."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Column, Index, Integer, MetaData, PrimaryKeyConstraint, Table

from .errors import IdemError

if TYPE_CHECKING:
    from .dialects.base import Backend

# Short enough that "<prefix>records_pk" fits a 30-byte identifier (Oracle before 12.2, and a safe floor elsewhere).
_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,19}")
KEY_COLUMNS = ("scope", "operation", "idem_key")
MESSAGE_KEY_COLUMNS = ("subscriber", "message_id")


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


def build_tables(prefix: str, backend: Backend, metadata: MetaData | None = None) -> Tables:
    """The tables for `backend`, in `metadata` (a new MetaData unless given: e.g. a service's own, for migrations)."""
    metadata = MetaData() if metadata is None else metadata
    key = backend.key_type
    # Keyword arguments a backend needs on every table (e.g. MySQL's ENGINE/CHARSET).
    records = Table(
        f"{prefix}records",
        metadata,
        Column("scope", key(), nullable=False),
        Column("operation", key(), nullable=False),
        Column("idem_key", key(), nullable=False),
        Column("fingerprint", backend.token_type(), nullable=False),
        Column("claim_token", backend.token_type(), nullable=False),
        Column("created_at", backend.timestamp_type(), nullable=False),
        Column("locked_until", backend.timestamp_type(), nullable=False),
        Column("completed_at", backend.timestamp_type(), nullable=True),
        Column("status", Integer, nullable=True),
        Column("response", backend.blob_type(), nullable=True),
        PrimaryKeyConstraint(*KEY_COLUMNS, name=backend.primary_key_name(f"{prefix}records_pk")),
        Index(f"{prefix}records_done_ix", "completed_at"),  # purge scans by age
        **backend.table_kwargs(),
    )
    messages = Table(
        f"{prefix}messages",
        metadata,
        Column("subscriber", key(), nullable=False),
        Column("message_id", key(), nullable=False),
        Column("fingerprint", backend.token_type(), nullable=True),
        Column("processed_at", backend.timestamp_type(), nullable=False),
        PrimaryKeyConstraint(*MESSAGE_KEY_COLUMNS, name=backend.primary_key_name(f"{prefix}messages_pk")),
        **backend.table_kwargs(),
    )
    return Tables(metadata, records, messages)

