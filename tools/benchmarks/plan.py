"""Which runs BENCHMARKS.md quotes: each one command line of `idem-dialects`, its report's file, and what it covers.

The page's tables read the reports by the run's id (its file's stem), never by position, so a run added here and
a table added in `render` are the whole of a new measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Side = Literal["after", "before"]

# Sync store engines (catalogue names), the async store's (engine, driver) pairs, and the levels of concurrency.
SYNC_ENGINES = ("sqlite", "postgresql-18", "postgresql", "mariadb")
ASYNC_PAIRS = (("postgresql", "asyncpg"), ("postgresql", "psycopg"), ("mariadb", "asyncmy"), ("sqlite", "aiosqlite"))
LEVELS = (1, 8, 32)
LATENCY_LEVELS = (1, 8)  # the levels the page shows with latency added to each round trip (`Sizes.added_latency_ms`)
HTTP_ENGINE, HTTP_DRIVER = "postgresql", "asyncpg"
HTTP_LEVELS = (1, 8, 16, 32)  # 16: the level the replay-tail target names
TELEMETRY_ENGINE = "postgresql"
CONSUMER_ENGINES = ("sqlite", "postgresql")
MEMORY_ENGINES = SYNC_ENGINES
# Before/after: (api, engine, driver) at each of AB_LEVELS; the sync drivers are the engines' defaults.
AB_PAIRS = (("sync", "postgresql", "psycopg"), ("sync", "mariadb", "pymysql"), ("sync", "sqlite", "pysqlite"),
            ("async", "postgresql", "asyncpg"), ("async", "postgresql", "psycopg"), ("async", "mariadb", "asyncmy"),
            ("async", "sqlite", "aiosqlite"))
AB_LEVELS = (1, 8)


@dataclass(frozen=True)
class Sizes:
    """How much each run measures. The defaults are the page's; `SMOKE` checks the whole command in minutes."""

    sync_requests: int = 1000
    sync_repetitions: int = 5
    warmup: int = 100
    added_latency_ms: float = 1.0  # the sync store's pass through the counting proxy: added to each round trip
    async_requests: int = 1000
    async_repetitions: int = 5
    sleep: float = 0.2
    http_requests: int = 2000
    telemetry_requests: int = 100
    telemetry_repetitions: int = 200
    telemetry_warmup: int = 300
    consumer_messages: int = 2000
    consumer_repetitions: int = 3
    memory_requests: int = 100_000
    ab_rounds: int = 3
    ab_sync_requests: int = 1000
    ab_sync_repetitions: int = 5
    ab_async_requests: int = 2000
    ab_async_repetitions: int = 3  # where both checkouts' benches take --repetitions for --api async, else 1
    ab_sleep: float = 0.05


SMOKE = Sizes(sync_requests=40, sync_repetitions=1, warmup=4, async_requests=40, async_repetitions=2, sleep=0.01,
              http_requests=40, telemetry_requests=10, telemetry_repetitions=2, telemetry_warmup=5,
              consumer_messages=20, consumer_repetitions=1, memory_requests=400, ab_rounds=1, ab_sync_requests=40,
              ab_sync_repetitions=1, ab_async_requests=40, ab_async_repetitions=2, ab_sleep=0.01)


@dataclass(frozen=True)
class Run:
    """One invocation of the CLI (`args` after `idem-dialects`, without the report's format and file)."""

    id: str  # the report's file stem, unique in a plan
    kind: str  # sync, async, http, telemetry, consumer, memory, conformance
    engines: tuple[str, ...]
    args: tuple[str, ...]
    driver: str | None = None
    levels: tuple[int, ...] = ()
    side: Side = "after"  # which checkout runs it: this one, or the one given with --before
    round: int | None = None  # before/after: the round it belongs to
    optional: tuple[tuple[str, str], ...] = ()  # (option, value) a checkout that refuses it runs without
    pinned: bool = False  # on one CPU (measure.one_cpu): before/after runs, where placement is noise to take out

    @property
    def file(self) -> str:
        return f"{self.id}.json"

    def argv(self, dropped: frozenset[str] = frozenset()) -> list[str]:
        """The command line, its optional options but those in `dropped`, and where its JSON report goes."""
        extra = [part for option, value in self.optional if option not in dropped for part in (option, value)]
        return [*self.args, *extra, "--format", "json", "--output", self.file]


def levels(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def main_runs(sizes: Sizes, memory: bool = False, conformance: bool = False) -> list[Run]:
    """Every run of this checkout the page quotes, in the order they run."""
    s = sizes
    runs = [Run(f"sync-{engine}", "sync", (engine,), (
        "bench", engine, "--workers", levels(LEVELS), "--requests", str(s.sync_requests), "--repetitions",
        str(s.sync_repetitions), "--warmup", str(s.warmup), "--added-latency-ms", f"{s.added_latency_ms:g}"),
        levels=LEVELS) for engine in SYNC_ENGINES]
    runs += [Run(f"async-{engine}-{driver}", "async", (engine,), (
        "bench", engine, "--api", "async", "--driver", driver, "--concurrency", levels(LEVELS), "--requests",
        str(s.async_requests), "--repetitions", str(s.async_repetitions), "--sleep", str(s.sleep)), driver=driver,
        levels=LEVELS) for engine, driver in ASYNC_PAIRS]
    runs.append(Run(f"http-{HTTP_ENGINE}", "http", (HTTP_ENGINE,), (
        "bench", HTTP_ENGINE, "--api", "http", "--driver", HTTP_DRIVER, "--concurrency", levels(HTTP_LEVELS),
        "--requests", str(s.http_requests)), driver=HTTP_DRIVER, levels=HTTP_LEVELS))
    runs.append(Run(f"telemetry-{TELEMETRY_ENGINE}", "telemetry", (TELEMETRY_ENGINE,), (
        "bench", TELEMETRY_ENGINE, "--measure", "telemetry", "--requests", str(s.telemetry_requests),
        "--repetitions", str(s.telemetry_repetitions), "--warmup", str(s.telemetry_warmup))))
    runs.append(Run("consumer", "consumer", CONSUMER_ENGINES, (
        "bench", *(part for engine in CONSUMER_ENGINES for part in ("--engine", engine)), "--api", "consumer",
        "--messages", str(s.consumer_messages), "--repetitions", str(s.consumer_repetitions))))
    if memory:
        runs += [Run(f"memory-{engine}", "memory", (engine,), (
            "bench", engine, "--requests", "10" if s.memory_requests < 10_000 else "100", "--repetitions", "1",
            "--warmup", "10", "--memory-check", str(s.memory_requests))) for engine in MEMORY_ENGINES]
    if conformance:
        runs.append(Run("conformance", "conformance", SYNC_ENGINES, (
            "matrix", *(part for engine in SYNC_ENGINES for part in ("--engine", engine)), "--api", "both")))
    return runs


def ab_runs(sizes: Sizes) -> list[Run]:
    """The before/after runs: per round, each (api, engine, driver, level) on both checkouts in turn, the side that
    goes first alternating, so that drift of the machine's state falls on both alike; each on one CPU, so that where
    the scheduler places the client's threads beside the server's does not move a run's CPU per request (on two
    cores it moved a MariaDB run's at 8 workers by up to 1.8x from one repetition to the next)."""
    s = sizes
    runs: list[Run] = []
    for rnd in range(1, s.ab_rounds + 1):
        n = 0
        for api, engine, driver in AB_PAIRS:
            for level in AB_LEVELS:
                if api == "sync":
                    args: tuple[str, ...] = ("bench", engine, "--workers", str(level), "--requests",
                                             str(s.ab_sync_requests), "--repetitions", str(s.ab_sync_repetitions))
                    optional: tuple[tuple[str, str], ...] = ()
                else:
                    args = ("bench", engine, "--api", "async", "--driver", driver, "--concurrency", str(level),
                            "--requests", str(s.ab_async_requests), "--sleep", str(s.ab_sleep))
                    optional = (("--repetitions", str(s.ab_async_repetitions)),) if s.ab_async_repetitions > 1 else ()
                sides: tuple[Side, Side] = ("before", "after") if (rnd + n) % 2 else ("after", "before")
                n += 1
                for side in sides:
                    runs.append(Run(ab_id(side, rnd, api, engine, driver, level), api, (engine,), args, driver=driver,
                                    levels=(level,), side=side, round=rnd, optional=optional, pinned=True))
    return runs


def ab_id(side: str, rnd: int, api: str, engine: str, driver: str, level: int) -> str:
    return f"ab/{side}-r{rnd}-{api}-{engine}-{driver}-{level}"
