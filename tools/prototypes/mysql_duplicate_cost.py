"""Client CPU of a duplicate INSERT (error 1062, caught) beside a locking SELECT, through SQLAlchemy on a store's
engine, so the store's error hooks run too (BENCHMARKS.md, "What the missed targets need, measured").

    .venv/bin/python tools/prototypes/mysql_duplicate_cost.py [mysql+pymysql://...]

Creates a table prof_<random>_t and drops it.
"""

import secrets
import sys
import time

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from idem_dialects import IdempotencyStore

N = 3000


def main(url: str) -> None:
    p = f"prof_{secrets.token_hex(3)}_"
    with IdempotencyStore.from_url(url, table_prefix=p) as store:
        engine = store.engine
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE {p}t (id INT PRIMARY KEY, v INT)"))
            conn.execute(text(f"INSERT INTO {p}t VALUES (1, 0)"))
        duplicate = text(f"INSERT INTO {p}t VALUES (1, 0)")
        locking_read = text(f"SELECT v FROM {p}t WHERE id = 1 LOCK IN SHARE MODE")
        with engine.connect() as conn:
            for label, stmt in (("duplicate INSERT", duplicate), ("locking SELECT", locking_read)) * 2:
                started = time.process_time()
                for _ in range(N):
                    try:
                        conn.execute(stmt).close()
                    except IntegrityError:
                        pass
                print(f"{label:18} {(time.process_time() - started) / N * 1e6:6.1f} us client CPU")
            conn.rollback()
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {p}t"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mysql+pymysql://root@127.0.0.1:3306/test")
