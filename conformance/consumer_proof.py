"""The consumer proof: on a real broker and a real database, publish messages with duplicates, consume them with
worker processes running the broker's adapter, kill those workers (SIGKILL) at random points, and count: every
distinct message id applied exactly once, none lost, none twice, nothing left on the broker, nothing dead-lettered.

Kills land at random points of three kinds: ``mid-handler`` (the effect written, not committed), ``after-commit``
(committed, not acknowledged: the broker delivers it again) and ``anywhere`` (a SIGKILL from outside at a random
moment: fetching, handling, acknowledging). The messages are published in one chunk per kill, each once the worker
that carries the chunk's kill is consuming, and the kill falls at a random position of its chunk, so the kills are
spread over the whole run and each falls while messages are in hand; a killed worker is started again at once.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from idem_dialects.engines import started
from idem_dialects.engines.local import stop_process
from idem_dialects.store import IdempotencyStore

from .brokers import BATCH, OPERATIONS, Kill, Worker, applied_table
from .once import tally

KILL_POINTS = ("mid-handler", "after-commit", "anywhere")
BROKER_ORDER = ("rabbitmq", "nats", "redis")


@dataclass
class ProofResult:
    """What one broker x engine run counted."""

    broker: str
    engine: str
    published: int
    distinct: int
    kills: list[str]  # the points the workers were killed at, in order
    effects: int = 0  # rows the handlers committed
    applied: int = 0  # distinct message ids among them
    lost: int = 0  # distinct ids never applied
    twice: int = 0  # ids applied more than once
    left: int = 0  # messages still on the broker after the run
    dead_lettered: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # what the workers' adapters tallied
    seconds: float = 0.0

    @property
    def duplicates_published(self) -> int:
        return self.published - self.distinct

    @property
    def ok(self) -> bool:
        return (self.applied == self.effects == self.distinct and not self.lost and not self.twice and not self.left
                and not self.dead_lettered)


def messages(total: int, duplicate_share: float, rng: random.Random) -> tuple[list[tuple[str, bytes]], int]:
    """`total` messages, a `duplicate_share` of them a second publish of an earlier one (same id and body),
    shuffled; and how many distinct ids there are."""
    distinct = total - round(total * duplicate_share)
    ids = [f"m-{n:06d}" for n in range(distinct)]
    chosen = ids + rng.choices(ids, k=total - distinct)
    rng.shuffle(chosen)
    return [(mid, json.dumps({"id": mid, "amount": int(mid[2:]) % 97 + 1}).encode()) for mid in chosen], distinct


@dataclass(frozen=True)
class Outside:
    """A SIGKILL from outside once `applied` distinct messages are in the database: a random moment of the run."""

    applied: int


def kill_points(kills: int, rng: random.Random) -> list[str]:
    """The point of each planned kill: every kind when there are that many kills, the others drawn at random, in
    random order."""
    points = list(KILL_POINTS[:kills]) + [rng.choice(KILL_POINTS) for _ in range(kills - len(KILL_POINTS))]
    rng.shuffle(points)
    return points


class _Slot:
    """One worker position: its current process, the kill it carries, and the file it creates once consuming."""

    def __init__(self, number: int, directory: Path) -> None:
        self.number = number
        self.proc: subprocess.Popen[bytes] | None = None
        self.kill: Kill | Outside | None = None
        self.ready = directory / f"ready-{number}"

    def is_ready(self) -> bool:
        return self.ready.exists()


def _all_ready(slots: list[_Slot]) -> bool:
    return all(slot.is_ready() for slot in slots)


class Proof:
    """One run; `run()` returns its ProofResult. The broker's queue/stream and the tables are its own (a random
    name), removed at the end."""

    id_header = "Proof-Id"  # where a NATS message carries its id (Worker.id_header)

    def __init__(self, broker: str, broker_url: str, engine: str, db_url: URL, *, total: int = 10_000,
                 duplicate_share: float = 0.2, kills: int = 5, workers: int = 2, seed: int | None = None,
                 timeout: float = 900.0, log: Callable[[str], None] = lambda line: None) -> None:
        self.broker, self.broker_url, self.engine, self.db_url = broker, broker_url, engine, db_url
        self.total, self.duplicate_share, self.kills, self.workers = total, duplicate_share, kills, workers
        self.rng = random.Random(seed)
        self.timeout, self.log = timeout, log
        token = secrets.token_hex(4)
        self.name, self.prefix = f"proof_{token}", f"proof_{token}_"
        self.ops = OPERATIONS[broker]
        self.directory = Path()  # the run's own temp dir (journals, logs), for as long as `run` lasts

    def run(self) -> ProofResult:
        with started.temp_dir("idem-proof-") as directory:
            self.directory = Path(directory)
            store = IdempotencyStore.from_url(self.db_url, table_prefix=self.prefix)
            table = applied_table(self.prefix, store.tables.metadata)
            store.create_tables()
            self.ops["setup"](self.broker_url, self.name)
            try:
                return self._run(store)
            finally:
                self.ops["teardown"](self.broker_url, self.name)
                store.drop_tables()
                store.close()
                del table

    def _run(self, store: IdempotencyStore) -> ProofResult:
        batch, distinct = messages(self.total, self.duplicate_share, self.rng)
        plan = kill_points(self.kills, self.rng)
        result = ProofResult(self.broker, self.engine, len(batch), distinct, [])
        started = time.monotonic()
        slots = [_Slot(n, self.directory) for n in range(self.workers)]
        deadline = started + self.timeout
        try:
            self._consume_with_kills(store, slots, batch, plan, result, deadline)
            for slot in slots:
                self._stop(slot)
            self._drain(store, distinct, deadline)
        finally:
            for slot in slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
                    slot.proc.wait()
        result.seconds = time.monotonic() - started
        self._count(store, result)
        return result

    def _consume_with_kills(self, store: IdempotencyStore, slots: list[_Slot], batch: list[tuple[str, bytes]],
                            plan: list[str], result: ProofResult, deadline: float) -> None:
        """Publish the messages in one chunk per kill (and a last one), each once the worker that carries the chunk's
        kill is consuming; the kill falls at a random position of the chunk: the worker's n-th handler run or ack
        (mid-handler, after-commit) or a random number of messages applied (anywhere, from outside). The chunk of a
        point kill (mid-handler, after-commit) is consumed by its carrier alone, the other workers stopped cleanly
        meanwhile: shared, the broker may hand the carrier fewer messages than its point needs (seen with NATS on
        SQLite), and the point would never be exercised. Should a carrier still end its chunk short of its point, it
        is killed from outside (counted as 'anywhere')."""
        chunks = [batch[i::len(plan) + 1] for i in range(len(plan) + 1)]
        for slot in slots:
            self._start(slot, None)
        published: set[str] = set()
        for n, chunk in enumerate(chunks):
            carrier = slots[n % len(slots)]
            alone = n < len(plan) and plan[n] != "anywhere"
            running, restarted = ([carrier], slots) if alone else (slots, [carrier])
            fresh = len({mid for mid, _ in chunk} - published)
            if n < len(plan):
                share = max(1, len(chunk) // (2 * len(slots)))
                kill = (Outside(len(published) + self.rng.randint(1, max(1, fresh * 3 // 4)))
                        if plan[n] == "anywhere" else Kill(plan[n], self.rng.randint(1, share)))
                for slot in restarted:
                    self._stop(slot)
                self._start(carrier, kill)
            self._wait(partial(_all_ready, running), deadline, "the workers to start consuming")
            self.ops["publish"](self.broker_url, self.name, chunk)
            published.update(mid for mid, _ in chunk)
            if n < len(plan):
                point = self._await_kill(store, carrier, len(published), deadline)
                result.kills.append(point)
                self.log(f"worker {carrier.number} killed ({point}); {self._applied(store)} applied so far")
                for slot in restarted:
                    self._start(slot, None)
        self._wait(lambda: self._applied(store) >= result.distinct, deadline, "every message applied")

    def _await_kill(self, store: IdempotencyStore, slot: _Slot, published: int, deadline: float) -> str:
        """Wait for `slot`'s planned kill (`published`: distinct ids published so far); the point it died at."""
        assert slot.proc is not None
        idle_since: float | None = None
        while slot.proc.poll() is None:
            now, applied = time.monotonic(), self._applied(store)
            if isinstance(slot.kill, Outside) and applied >= slot.kill.applied:
                slot.proc.send_signal(signal.SIGKILL)
            elif applied >= published:
                idle_since = idle_since or now
                if now - idle_since > 2.0:  # its chunk is done and it never got to its point: kill it from outside
                    slot.kill = None
                    slot.proc.send_signal(signal.SIGKILL)
            if now > deadline:
                raise TimeoutError(f"worker {slot.number} was not killed as planned within {self.timeout:.0f}s")
            time.sleep(0.05)
        slot.proc.wait()
        if slot.proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"worker {slot.number} exited with {slot.proc.returncode}: {self._log_of(slot)}")
        return slot.kill.point if isinstance(slot.kill, Kill) else "anywhere"

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waiting for {what} took over {self.timeout:.0f}s")
            time.sleep(0.05)

    def _drain(self, store: IdempotencyStore, distinct: int, deadline: float) -> None:
        """With every worker stopped cleanly, what is left on the broker (messages returned unacknowledged) is
        consumed by a worker that is not killed, until the broker holds nothing after a clean stop."""
        for _ in range(5):
            left, _dead = self.ops["left"](self.broker_url, self.name)
            if not left:
                return
            self.log(f"{left} left on the broker after a clean stop: draining them")
            slot = _Slot(self.workers, self.directory)
            self._start(slot, None)
            while self.ops["left"](self.broker_url, self.name)[0] and time.monotonic() < deadline:
                time.sleep(0.2)
            self._stop(slot)

    def _start(self, slot: _Slot, kill: Kill | Outside | None) -> None:
        slot.kill = kill
        slot.ready.unlink(missing_ok=True)
        worker = Worker(self.broker, self.broker_url, self.name, self.db_url.render_as_string(hide_password=False),
                        self.prefix, slot.number, str(self.directory / f"journal-{slot.number}"), str(slot.ready),
                        kill if isinstance(kill, Kill) else None, self.id_header)
        spec = asdict(worker)
        with open(self.directory / f"worker-{slot.number}.log", "ab") as out:
            slot.proc = subprocess.Popen([sys.executable, "-m", "idem_dialects.conformance.consumer_worker",
                                          json.dumps(spec)], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def _stop(self, slot: _Slot) -> None:
        """SIGTERM: a consuming worker settles what it holds and exits 0; one still starting up (before its
        handler is installed) simply ends, holding nothing."""
        if slot.proc is None or slot.proc.poll() is not None:
            return
        consuming = slot.is_ready()
        if not stop_process(slot.proc):
            raise RuntimeError(f"worker {slot.number} did not stop within 30 s: {self._log_of(slot)}")
        if slot.proc.returncode != 0 and (consuming or slot.proc.returncode != -signal.SIGTERM):
            raise RuntimeError(f"worker {slot.number} exited with {slot.proc.returncode}: {self._log_of(slot)}")

    def _log_of(self, slot: _Slot) -> str:
        text = (self.directory / f"worker-{slot.number}.log").read_text(errors="replace").strip()
        return " | ".join(text.splitlines()[-6:]) or "(no output)"

    def _read(self, store: IdempotencyStore, query: Select[Any]) -> Sequence[Any]:
        """What the database shows, read by the proof itself: again on what `run` would retry (a restart of the
        database, the outbox proof's, leaves the pool's idle connections dead, and the server down meanwhile)."""
        for attempt in itertools.count(1):
            try:
                with store.engine.connect() as conn:
                    return conn.execute(query).all()
            except DBAPIError as exc:
                if store.retry_cause(exc) is None or attempt == 100:
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def _applied(self, store: IdempotencyStore) -> int:
        table = store.tables.metadata.tables[f"{self.prefix}applied"]
        return int(self._read(store, select(func.count(table.c.message_id.distinct())))[0][0])

    def _count(self, store: IdempotencyStore, result: ProofResult) -> None:
        table = store.tables.metadata.tables[f"{self.prefix}applied"]
        rows = self._read(store, select(table.c.message_id, func.count()).group_by(table.c.message_id))
        counted = tally({str(mid): int(n) for mid, n in rows}, result.distinct)
        result.effects, result.applied, result.lost, result.twice = (counted.effects, counted.applied, counted.lost,
                                                                     counted.twice)
        result.left, result.dead_lettered = self.ops["left"](self.broker_url, self.name)
        for journal in self.directory.glob("journal-*"):
            result.counts.update(journal.read_text().split())


# The workers' tallies (processed, duplicates, acks) are written as they happen: a SIGKILL loses the tally of the
# messages a worker had committed but not yet tallied, so they are lower bounds; the database columns (effects, lost,
# twice) and the broker's (left, dead-lettered) are the proof.
HEADER = ("broker", "engine", "published", "distinct", "dup. published", "kills (m/c/a)", "processed*",
          "duplicates*", "acks*", "dead-lettered", "effects", "lost", "twice", "left", "seconds", "result")


def table(results: list[ProofResult]) -> str:
    """The results as a Markdown table."""
    rows = [HEADER, tuple("---" for _ in HEADER)]
    for r in results:
        kills = Counter(r.kills)
        rows.append((r.broker, r.engine, str(r.published), str(r.distinct), str(r.duplicates_published),
                     f"{len(r.kills)} ({kills['mid-handler']}/{kills['after-commit']}/{kills['anywhere']})",
                     str(r.counts["processed"]), str(r.counts["duplicate"]), str(r.counts["ack"]),
                     str(r.dead_lettered), str(r.effects), str(r.lost), str(r.twice), str(r.left),
                     f"{r.seconds:.1f}", "ok" if r.ok else "FAILED"))
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def describe(result: ProofResult) -> dict[str, Any]:
    """The result as JSON-ready data (asdict would turn the Counter's items into keys)."""
    return {**asdict(result), "counts": dict(result.counts), "ok": result.ok, "batch": BATCH}
