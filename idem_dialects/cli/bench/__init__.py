"""What the protocol costs on one database: seed 000's debit workload, with and without idempotency, side by side.

Modes (each a slice of `requests` requests, interleaved per repetition so drift hits them all alike):

- ``bare``: the effect alone -- one transaction (begun by `store.transaction()`, the store's own transaction start,
  e.g. BEGIN IMMEDIATE on SQLite) running ``UPDATE account SET balance = balance - 1`` and ``SELECT balance``,
  re-run on retryable errors by the store's own bounded retry;
- ``first``: first-time requests through `IdempotencyStore.run` with the same effect;
- ``replay``: the keys `first` just completed, sent again (the effect must not run);
- ``contention``: the workers send overlapping keys (a share `duplicates` of the slice repeats a key another worker
  sends at the same moment);
- ``plpgsql_first`` / ``plpgsql_replay`` (PostgreSQL only): seed 000's hand-written ``debit_once`` function,
  one statement per request, created in a scratch schema -- the one-round-trip reference.

Exactly-once is checked after every slice, in the database: each account's debits equal the distinct keys sent to
it, and each scope holds exactly that many completed records. A mismatch raises `ExactlyOnceViolation`.

Modules: `plan` (configuration, which requests each worker sends), `workload` (the debit on one store),
`statements` (counting round trips), `runner` (threads, checks, profile, memory), `report` (the JSON report).
"""

from __future__ import annotations

from .plan import IDEM_MODES, MODES, PLPGSQL_MODES, Config, ExactlyOnceViolation, Slice, plan
from .report import RATIO_TARGETS, SCHEMA, SET_SCHEMA, combine, engine_info, machine_info, new_prefix, percentiles
from .runner import Bench
from .statements import StatementLog, implicit_begin, record_statements, reset_reaches_server, statement_kind
from .workload import Workload, plpgsql_ddl

__all__ = [
    "IDEM_MODES", "MODES", "PLPGSQL_MODES", "RATIO_TARGETS", "SCHEMA", "SET_SCHEMA", "Bench", "Config",
    "ExactlyOnceViolation", "Slice", "StatementLog", "Workload", "combine", "engine_info", "implicit_begin",
    "machine_info", "new_prefix", "percentiles", "plan", "plpgsql_ddl", "record_statements", "reset_reaches_server",
    "statement_kind",
]
