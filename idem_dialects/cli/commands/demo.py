"""The reference example: debits with key checkout-42 on an embedded SQLite database, step by step."""

from __future__ import annotations

import argparse
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, select, update
from sqlalchemy.engine import Connection

from ...errors import RequestMismatch
from ...store import IdempotencyStore
from ..database import reached
from . import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="database URL to run on instead of a temporary SQLite file")


def run(args: argparse.Namespace) -> int:
    # A prefix of its own on every run: on a database you name (--url), the demo creates and drops only its own
    # tables, never one that happens to share a fixed name.
    prefix = f"demo_{secrets.token_hex(4)}_"
    with tempfile.TemporaryDirectory(prefix="idem-demo-") as tmp:
        url = args.url or f"sqlite:///{Path(tmp) / 'demo.db'}"
        with reached(url, table_prefix=prefix) as store:  # a server that does not answer, told at once
            metadata = MetaData()
            accounts = Table(f"{prefix}account", metadata,
                             Column("id", Integer, primary_key=True, autoincrement=False),
                             Column("balance", Integer, nullable=False))
            try:
                store.create_tables()
                with store.engine.begin() as conn:
                    metadata.create_all(conn)
                _demo(store, accounts)
            finally:
                with store.engine.begin() as conn:
                    metadata.drop_all(conn, checkfirst=True)
                store.drop_tables()
    return EXIT_OK


def _demo(store: IdempotencyStore, accounts: Table) -> None:
    with store.engine.begin() as conn:
        conn.execute(accounts.insert().values(id=1, balance=1000))
    print(f"database: {store.engine.url.render_as_string()} (backend {store.backend.name})")
    print("1. account 1 opened with balance 1000")

    def debit(amount: int) -> Callable[[Connection], object]:
        def effect(conn: Connection) -> object:
            conn.execute(update(accounts).where(accounts.c.id == 1).values(balance=accounts.c.balance - amount))
            return {"balance": conn.execute(select(accounts.c.balance).where(accounts.c.id == 1)).scalar_one()}

        return effect

    def balance() -> int:
        with store.engine.connect() as conn:
            return int(conn.execute(select(accounts.c.balance).where(accounts.c.id == 1)).scalar_one())

    for step in (2, 3):
        result = store.run(scope="account:1", operation="debit:v1", key="checkout-42", request={"amount": 100},
                           effect=debit(100))
        tag = "replayed (Idempotent-Replayed: true)" if result.replayed else "applied"
        print(f"{step}. debit 100 with key checkout-42 -> {result.status} {result.response} [{tag}]")
    print(f"4. balance is {balance()}: the retry did not debit again")
    try:
        store.run(scope="account:1", operation="debit:v1", key="checkout-42", request={"amount": 101},
                  effect=debit(101))
    except RequestMismatch as exc:
        print(f"5. debit 101 with key checkout-42 -> 422 mismatch: {exc}")
    print(f"   balance is still {balance()}")

    for delivery in (1, 2):
        with store.transaction() as conn:
            if store.accept_message(conn, subscriber="balance-projection", message_id="msg-7", payload={"credit": 50}):
                conn.execute(update(accounts).where(accounts.c.id == 1).values(balance=accounts.c.balance + 50))
                outcome = "applied"
            else:
                outcome = "already processed, skipped"
        print(f"{5 + delivery}. message msg-7 (credit 50), delivery {delivery}: {outcome}")
    print(f"8. balance is {balance()}: the redelivered message credited once")
