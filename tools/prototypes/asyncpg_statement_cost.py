"""Client CPU of one statement and of a replay-shaped transaction through SQLAlchemy's asyncpg adapter, beside the
same through the asyncpg connection under it (BENCHMARKS.md, "What the missed targets need, measured").

    .venv/bin/python tools/prototypes/asyncpg_statement_cost.py [postgresql+asyncpg://...]

Creates a table prof_<random>_t and drops it.
"""

import asyncio
import secrets
import statistics
import sys
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

N = 3000


async def main(url: str) -> None:
    engine = create_async_engine(url)
    table = f"prof_{secrets.token_hex(3)}_t"
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE TABLE {table} (k text PRIMARY KEY, fp text, resp bytea, done timestamptz)"))
        await conn.execute(text(f"INSERT INTO {table} SELECT 'k'||g, 'f', 'xx'::bytea, now()"
                                " FROM generate_series(0, 99) g"))
    select = text(f"SELECT fp, resp, done, now() AS db_now FROM {table} WHERE k = :k")
    raw_select = f"SELECT fp, resp, done, now() AS db_now FROM {table} WHERE k = $1"
    cpu: dict[str, list[float]] = {}
    async with engine.connect() as conn:
        for _ in range(3):
            for mode in ("SQLAlchemy, BEGIN+read+ROLLBACK", "asyncpg, BEGIN+read+ROLLBACK", "SQLAlchemy, one read",
                         "asyncpg, one read"):
                started = time.process_time()
                for i in range(N):
                    driver = (await conn.get_raw_connection()).driver_connection
                    if mode == "SQLAlchemy, BEGIN+read+ROLLBACK":
                        await conn.begin()
                        (await conn.execute(select, {"k": f"k{i % 100}"})).first()
                        await conn.rollback()
                    elif mode == "asyncpg, BEGIN+read+ROLLBACK":
                        tx = driver.transaction()
                        await tx.start()
                        await driver.fetchrow(raw_select, f"k{i % 100}")
                        await tx.rollback()
                    elif mode == "SQLAlchemy, one read":
                        (await conn.execute(select, {"k": f"k{i % 100}"})).first()
                    else:
                        await driver.fetchrow(raw_select, f"k{i % 100}")
                cpu.setdefault(mode, []).append((time.process_time() - started) / N * 1e6)
            await conn.rollback()
        async with conn.begin():
            await conn.execute(text(f"DROP TABLE {table}"))
    await engine.dispose()
    for mode, values in cpu.items():
        print(f"{mode:34} {statistics.median(values):6.1f} us client CPU")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "postgresql+asyncpg://postgres@127.0.0.1:5432/test"))
