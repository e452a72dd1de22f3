"""The account table every benchmark debits, its debit and its read, and what a request to it is sent as.

Its own module, importing SQLAlchemy alone: tools/ab_instructions.py loads this file into another checkout's
interpreter (whose library may predate the bench), so that both sides of its A/B run the bench's one workload.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, bindparam, select
from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

OPERATION = "debit:v1"
REQUEST = {"amount": 1}
INITIAL_BALANCE = 10**15  # enough for any run; debits are whole units


def scope(acct: int) -> str:
    """The scope a request to account `acct` is sent under: its records are counted per account."""
    return f"account:{acct}"


class Accounts:
    """The account table on a bench's table prefix, its debit (`amount` units off one account) and its read."""

    def __init__(self, prefix: str) -> None:
        self.metadata = MetaData()
        self.table = Table(f"{prefix}account", self.metadata,
                           Column("id", Integer, primary_key=True, autoincrement=False),
                           Column("balance", BigInteger, nullable=False))
        a = self.table.c
        self.debit = self.table.update().where(a.id == bindparam("acct")).values(
            balance=a.balance - bindparam("amount"))
        self.read = select(a.balance).where(a.id == bindparam("acct"))

    def create(self, conn: Connection, accounts: Iterable[int]) -> None:
        self.metadata.create_all(conn)
        conn.execute(self.table.insert(), [{"id": i, "balance": INITIAL_BALANCE} for i in accounts])

    def drop(self, conn: Connection) -> None:
        self.metadata.drop_all(conn)

    def apply(self, conn: Connection, acct: int, amount: int = 1) -> int:
        """The effect: debit `acct`, return its balance (in the caller's transaction)."""
        conn.execute(self.debit, {"acct": acct, "amount": amount})
        return int(conn.execute(self.read, {"acct": acct}).scalar_one())

    async def apply_async(self, conn: AsyncConnection, acct: int, amount: int = 1) -> int:
        """`apply` on an async connection."""
        await conn.execute(self.debit, {"acct": acct, "amount": amount})
        return int((await conn.execute(self.read, {"acct": acct})).scalar_one())

    def debits(self, conn: Connection, accounts: Sequence[int]) -> dict[int, int]:
        """Per account: the units debited so far."""
        a = self.table.c
        rows = conn.execute(select(a.id, a.balance).where(a.id.in_(accounts))).all()
        return {int(i): INITIAL_BALANCE - int(b) for i, b in rows}
