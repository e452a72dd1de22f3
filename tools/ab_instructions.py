"""Before/after by the work the client does, not by its time: the instructions (valgrind's callgrind) and the system
calls (strace -f, every thread) of the client process per first-time request and per replay, on this checkout and
another, through the public API. The bench's A/B (tools/benchmarks.sh --before) compares CPU time, which on a shared
host moves by 10-30 % between rounds of the same code; these counts repeat to well under 1 %. They are not time (a
cache miss or a syscall's cost is not in an instruction count), so they back the bench's A/B rather than replace it.

Per request by differencing: N and 4N first-time requests, then 4N first-time requests followed by 4N replays, in
fresh processes that import, connect and warm up alike, so that what is not a request cancels out. The two checkouts
run side by side (counts do not depend on timing). Each URL names a server that runs here; the tables are the run's
own (a random prefix) and dropped after it.

    .venv/bin/python tools/ab_instructions.py --before ../before [--requests 100] [URL[,async] ...]

`--before` is a checkout with its own .venv (for example `git worktree add --detach ../before <commit>`, then
`python3 -m venv .venv && .venv/bin/pip install -e '.[all]'` in it). Without URLs: the bench's A/B pairs on the
machine's PostgreSQL 15, MariaDB and a SQLite file, sync and async. Needs valgrind and strace (apt-get install
valgrind strace). About 25 minutes for the default seven paths at 100 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULT_PATHS = ("postgresql+psycopg://postgres@127.0.0.1:5432/test", "mariadb+pymysql://root@127.0.0.1:3306/test",
                 "sqlite:///{tmp}/ab.db", "postgresql+asyncpg://postgres@127.0.0.1:5432/test,async",
                 "postgresql+psycopg://postgres@127.0.0.1:5432/test,async",
                 "mariadb+asyncmy://root@127.0.0.1:3306/test,async", "sqlite+aiosqlite:///{tmp}/ab.db,async")
WARMUP = 50
# The bench's account table and debit (tools/bench): loaded from this checkout's file into either side's interpreter,
# whose library may predate the bench, so that both sides run the bench's one workload.
ACCOUNTS = Path(__file__).resolve().parent / "bench" / "idem_dialects_bench" / "accounts.py"


def bench_accounts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_accounts", ACCOUNTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workload(url: str, n: int, asynchronous: bool, replays: bool) -> None:
    """N first-time requests of the bench's debit (one account) and, with `replays`, N replays of them, after a
    warm-up."""
    import idem_dialects

    bench = bench_accounts()
    prefix = f"ab{uuid.uuid4().hex[:8]}_"
    accounts = bench.Accounts(prefix)
    keysets = [[f"w{i}" for i in range(WARMUP)], [f"k{i}" for i in range(n)]]
    keysets += [keysets[1]] if replays else []
    request = {"scope": bench.scope(1), "operation": bench.OPERATION, "request": bench.REQUEST}

    if asynchronous:
        async def main() -> None:
            async with idem_dialects.AsyncIdempotencyStore.from_url(url, table_prefix=prefix) as store:
                await store.create_tables()
                async with store.engine.begin() as conn:
                    await conn.run_sync(accounts.create, [1])

                async def effect(conn: Any) -> dict[str, int]:
                    return {"balance": await accounts.apply_async(conn, 1)}

                try:
                    for keyset in keysets:
                        for key in keyset:
                            await store.run(key=key, effect=effect, **request)
                finally:
                    async with store.engine.begin() as conn:
                        await conn.run_sync(accounts.drop)
                    await store.drop_tables()

        asyncio.run(main())
        return
    with idem_dialects.IdempotencyStore.from_url(url, table_prefix=prefix) as store:
        store.create_tables()
        with store.engine.begin() as conn:
            accounts.create(conn, [1])
        try:
            for keyset in keysets:
                for key in keyset:
                    store.run(key=key, effect=lambda conn: {"balance": accounts.apply(conn, 1)}, **request)
        finally:
            with store.engine.begin() as conn:
                accounts.drop(conn)
            store.drop_tables()


def count(tool: str, python: str, url: str, n: int, asynchronous: bool, replays: bool) -> int:
    """Instructions (`callgrind`) or system calls (`strace`) of one workload process."""
    args = [python, __file__, "--workload", url, str(n), "async" if asynchronous else "sync",
            "replays" if replays else "first"]
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        if tool == "callgrind":
            command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", f"--log-file={out.name}"]
            pattern = r"I\s+refs:\s+([\d,]+)"
        else:
            command, pattern = ["strace", "-f", "-c", "-o", out.name], r"^100\.00\s+\S+\s+\S+\s+(\d+)"
        done = subprocess.run(command + args, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"the workload failed under {tool} ({python}, {url}):\n{done.stderr[-2000:]}")
        found = re.search(pattern, out.read(), re.M)
    if found is None:
        raise SystemExit(f"{tool} printed no total for {url}")
    return int(found.group(1).replace(",", ""))


def per_request(tool: str, python: str, url: str, n: int, asynchronous: bool) -> tuple[float, float]:
    """(first-time, replay) per request by differencing runs of N and 4N requests."""
    small = count(tool, python, url, n, asynchronous, replays=False)
    large = count(tool, python, url, 4 * n, asynchronous, replays=False)
    both = count(tool, python, url, 4 * n, asynchronous, replays=True)
    return (large - small) / (3 * n), (both - large) / (4 * n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="the other checkout (with its .venv)")
    parser.add_argument("--requests", type=int, default=100, help="N: the runs hold N and 4N requests (default 100)")
    parser.add_argument("--workload", nargs=4, metavar=("URL", "N", "MODE", "PHASES"), help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", metavar="URL[,async]")
    args = parser.parse_args()
    if args.workload:
        url, n, mode, phases = args.workload
        workload(url, int(n), mode == "async", phases == "replays")
        return
    if args.before is None:
        parser.error("--before CHECKOUT is required")
    before = args.before / ".venv" / "bin" / "python"
    if not before.exists():
        parser.error(f"{before} does not exist: make the checkout's venv first (see --help)")
    missing = [tool for tool in ("valgrind", "strace") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"{' and '.join(missing)} not found: apt-get install {' '.join(missing)}")
    with tempfile.TemporaryDirectory() as tmp:
        print("| path | side | instructions, first-time | replay | system calls, first-time | replay |")
        print("|---|---|--:|--:|--:|--:|")
        for path in args.paths or DEFAULT_PATHS:
            spec, _, mode = path.format(tmp=tmp).partition(",")
            urls = {side: spec.replace("ab.db", f"ab-{side}.db") for side in ("before", "after")}
            pythons = {"before": str(before), "after": sys.executable}
            figures: dict[str, list[float]] = {}
            with ThreadPoolExecutor(2) as pool:
                jobs = {side: [pool.submit(per_request, tool, pythons[side], urls[side], args.requests,
                                           mode == "async") for tool in ("callgrind", "strace")]
                        for side in ("before", "after")}
                for side, (instructions, syscalls) in jobs.items():
                    figures[side] = [*instructions.result(), *syscalls.result()]
            for side in ("before", "after"):
                i1, i2, s1, s2 = figures[side]
                print(f"| {spec.partition('://')[0]}{' async' if mode else ''} | {side} | {i1:,.0f} | {i2:,.0f} "
                      f"| {s1:.1f} | {s2:.1f} |")
            ratios = [a / b if b else float("nan") for a, b in zip(figures["after"], figures["before"], strict=True)]
            print(f"| | after ÷ before | {ratios[0]:.3f} | {ratios[1]:.3f} | {ratios[2]:.3f} | {ratios[3]:.3f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")  # the workload's processes inherit it: dict orders alike
    main()
