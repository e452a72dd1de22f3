"""Wall time of a first-time request's statement shape beside the bare effect's, on raw psycopg (no SQLAlchemy, no
protocol), with BEGIN pipelined with the claim, and with BEGIN sent in the claim's round trip and COMMIT in the
completion's (a client-side binding cursor on an autocommit connection sends each pair as one simple query)
(BENCHMARKS.md, "What the missed targets need, measured").

    .venv/bin/python tools/prototypes/psycopg_round_trips.py ["host=... dbname=..."]

Creates tables prof_<random>_acct and prof_<random>_rec and drops them.
"""

import secrets
import statistics
import sys
import time
from collections.abc import Callable

import psycopg

N = 2000


def main(dsn: str) -> None:
    conn = psycopg.connect(dsn)
    p = f"prof_{secrets.token_hex(3)}_"
    with conn.transaction():
        conn.execute(f"CREATE TABLE {p}acct (id int PRIMARY KEY, balance bigint)")
        conn.execute(f"INSERT INTO {p}acct VALUES (1, 0)")
        conn.execute(f"CREATE TABLE {p}rec (k text PRIMARY KEY, tok text, resp bytea, done timestamptz)")
    claim = f"INSERT INTO {p}rec (k, tok) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING true"
    debit = f"UPDATE {p}acct SET balance = balance - 1 WHERE id = 1"
    balance = f"SELECT balance FROM {p}acct WHERE id = 1"
    complete = f"UPDATE {p}rec SET resp = %s, done = now() WHERE k = %s AND tok = %s"
    n = [0]

    def bare() -> None:
        cur = conn.cursor()
        cur.execute(debit)
        cur.execute(balance)
        cur.fetchone()
        conn.commit()

    def first(pipelined: bool) -> None:
        n[0] += 1
        key, cur = f"k{n[0]}", conn.cursor()
        if pipelined:
            with conn.pipeline():
                cur.execute(claim, (key, "t"), prepare=True)
                cur.fetchone()
        else:
            cur.execute(claim, (key, "t"), prepare=True)
            cur.fetchone()
        cur.execute(debit)
        cur.execute(balance)
        cur.fetchone()
        cur.execute(complete, (b"x", key, "t"), prepare=True)
        conn.commit()

    # The transaction's ends ride on its first and last statements: one simple query each, bound by psycopg on the
    # client (the extended protocol, which server-side binding uses, takes one statement per query).
    merged = psycopg.connect(dsn, autocommit=True, cursor_factory=psycopg.ClientCursor)

    def first_merged() -> None:
        n[0] += 1
        key, cur = f"k{n[0]}", merged.cursor()
        cur.execute(f"BEGIN; {claim}", (key, "t"))
        cur.nextset()
        cur.fetchone()
        cur.execute(debit)
        cur.execute(balance)
        cur.fetchone()
        cur.execute(f"{complete}; COMMIT", (b"x", key, "t"))
        assert cur.rowcount == 1

    shapes: dict[str, Callable[[], None]] = {"bare": bare, "first-time": lambda: first(False),
                                             "first-time, BEGIN+claim pipelined": lambda: first(True),
                                             "first-time, BEGIN/COMMIT merged": first_merged}
    wall: dict[str, list[float]] = {}
    for _ in range(5):
        for name, shape in shapes.items():
            started = time.perf_counter()
            for _ in range(N):
                shape()
            wall.setdefault(name, []).append((time.perf_counter() - started) / N * 1e6)
    bare_us = statistics.median(wall["bare"])
    for name, values in wall.items():
        print(f"{name:36} {statistics.median(values):7.1f} us wall, {bare_us / statistics.median(values):.3f}x bare")
    merged.close()
    with conn.transaction():
        conn.execute(f"DROP TABLE {p}acct")
        conn.execute(f"DROP TABLE {p}rec")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "host=127.0.0.1 port=5432 user=postgres dbname=test")
