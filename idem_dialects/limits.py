"""Bounds on the durations, sizes and statuses a caller passes, checked before any SQL (docs: Inputs).

Without them a huge lease or retention window overflows the driver or the database's date range (raw
OverflowError / DataError, or a silent no-op on SQLite), and a huge batch size overflows a LIMIT parameter. One
bound is the server's, checked after the effect but before its response is sent: the statement size it takes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from .errors import InvalidPayload, ResponseTooLarge
from .features import Features

MAX_LEASE = timedelta(days=365)  # a lease holds a key against every retry: a year is already far beyond any effect
MAX_RETENTION = timedelta(days=36_525)  # purge(older_than=...): 100 years, inside every engine's date range
MAX_BATCH_SIZE = 1_000_000  # rows per purge transaction
# The share of its time a purge spends inside its batches by default (`purge(pace=...)`): after a batch that took t
# seconds it waits t (1/pace - 1), so the database works for traffic at least the rest of the time. Measured
# (docs/operations/purge.md): on a 2-core machine, claims running beside an unpaced purge kept 40-55% of their rate.
DEFAULT_PACE = 0.5
# How long a completed record is kept for replays by default: a client retrying for longer than a day is rare, and the
# IETF Idempotency-Key draft's example window is 24 hours.
DEFAULT_RETENTION = timedelta(hours=24)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:(\d+)([smhdw]))+")


def parse_duration(text: str) -> timedelta:
    """'24h', '90m', '7d', '1h30m' -> timedelta (the purge commands' --older-than); ValueError otherwise."""
    if not _DURATION.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not a duration like 24h, 90m, 7d or 1h30m")
    return timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([smhdw])", text)))


def lease_seconds(lease: object) -> float | None:
    """The lease in seconds (None: an atomic claim), or InvalidPayload naming the bounds."""
    if lease is None:
        return None
    if not isinstance(lease, timedelta) or not timedelta(0) < lease <= MAX_LEASE:
        raise InvalidPayload("lease", f"must be a timedelta above 0 and at most {MAX_LEASE.days} days, got {lease!r}")
    return lease.total_seconds()


def check_retention(window: object, field: str = "retention") -> timedelta:
    """A retention window (the store's `retention`, `purge`'s `older_than`)."""
    if not isinstance(window, timedelta) or not timedelta(0) <= window <= MAX_RETENTION:
        raise InvalidPayload(field, f"must be a timedelta from 0 to {MAX_RETENTION.days} days (100 years),"
                                    f" got {window!r}")
    return window


def check_batch_size(batch_size: object) -> int:
    return _int_within("batch_size", batch_size, 1, MAX_BATCH_SIZE, f"an int from 1 to {MAX_BATCH_SIZE:,}")


def check_pace(pace: object) -> float:
    """`purge(pace=...)`: the share of its time a purge spends in batches, above 0 and at most 1 (no pauses)."""
    if isinstance(pace, bool) or not isinstance(pace, (int, float)) or not 0 < pace <= 1:
        raise InvalidPayload("pace", f"must be a number above 0 and at most 1, got {pace!r}")
    return float(pace)


def check_status(status: object) -> int:
    """The HTTP status stored with a response (`run`'s `status`, a `Reply`'s, `complete`'s)."""
    return _int_within("status", status, 100, 599, "an int HTTP status 100-599")


# The bytes of a completion that are not its response: the UPDATE's text (table names of 20-character prefixes), the
# identity (at most 1,700 bytes of UTF-8, doubled at most by a driver's escaping), the claim token and the status.
STATEMENT_MARGIN = 8 * 1024
# No driver sends a bytes parameter as more than twice its length and a few bytes of quoting (hex digits, escapes).
_MAX_GROWTH_SLACK = 64


def check_response_size(body: bytes, features: Features, backend: str, sent_size: Callable[[bytes], int]) -> None:
    """ResponseTooLarge, before the completion is sent, for a stored response `body` that the server would refuse
    in one statement (`Features.max_statement_bytes`) as the driver sends it (`sent_size`): the server would fail
    the statement or drop the connection (MySQL/MariaDB), and a retry would run the effect again to the same end."""
    limit = features.max_statement_bytes
    if limit is None or 2 * len(body) + _MAX_GROWTH_SLACK + STATEMENT_MARGIN <= limit:
        return  # the common case: no need to count what a driver escapes
    size = sent_size(body)
    if size + STATEMENT_MARGIN > limit:
        raise ResponseTooLarge(backend, size, max(limit - STATEMENT_MARGIN, 0),
                               features.statement_limit or f"{limit:,} bytes per statement")


# What an atomic `run` does on meeting another caller's claim of its key not yet committed (see `run`).
OnInFlight = Literal["wait", "conflict"]
ON_IN_FLIGHT: tuple[OnInFlight, ...] = ("wait", "conflict")


def check_on_in_flight(value: object) -> bool:
    """`run`'s `on_in_flight` (and the HTTP policy's): True if a duplicate waits for the first request, False if it
    is answered in flight at once."""
    if value not in ON_IN_FLIGHT:
        raise InvalidPayload("on_in_flight", f"must be 'wait' or 'conflict', got {value!r}")
    return value == "wait"


def _int_within(field: str, value: object, low: int, high: int, expected: str) -> int:
    # bool is an int subclass, but True is never a deliberate batch size or status; an IntEnum (HTTPStatus) is one.
    # A plain int, the usual value, is told by its type alone (no call).
    if (type(value) is not int and (isinstance(value, bool) or not isinstance(value, int))) or not low <= value <= high:
        raise InvalidPayload(field, f"must be {expected}, got {value!r}")
    return value
