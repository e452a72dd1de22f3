"""Bounds on the durations and sizes a caller passes, checked before any SQL (documented in README: Limits).

Without them a huge lease or retention window overflows the driver or the database's date range (raw
OverflowError / DataError, or a silent no-op on SQLite), and a huge batch size overflows a LIMIT parameter.
"""

from __future__ import annotations

from datetime import timedelta

from .errors import InvalidPayload

MAX_LEASE = timedelta(days=365)  # a lease holds a key against every retry: a year is already far beyond any effect
MAX_RETENTION = timedelta(days=36_525)  # purge(older_than=...): 100 years, inside every engine's date range
MAX_BATCH_SIZE = 1_000_000  # rows per purge transaction


def lease_seconds(lease: object) -> float | None:
    """The lease in seconds (None: an atomic claim), or InvalidPayload naming the bounds."""
    if lease is None:
        return None
    if not isinstance(lease, timedelta) or not timedelta(0) < lease <= MAX_LEASE:
        raise InvalidPayload("lease", f"must be a timedelta above 0 and at most {MAX_LEASE.days} days, got {lease!r}")
    return lease.total_seconds()


def check_older_than(older_than: object) -> timedelta:
    if not isinstance(older_than, timedelta) or not timedelta(0) <= older_than <= MAX_RETENTION:
        raise InvalidPayload("older_than", f"must be a timedelta from 0 to {MAX_RETENTION.days} days (100 years),"
                                           f" got {older_than!r}")
    return older_than


def check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidPayload("batch_size", f"must be an int from 1 to {MAX_BATCH_SIZE:,}, got {batch_size!r}")
    return batch_size
