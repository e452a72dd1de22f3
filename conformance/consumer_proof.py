"""The consumer proof: on a real broker and a real database, publish messages with duplicates, consume them with
worker processes running the broker's adapter, kill those workers (SIGKILL) at random points, and count: every
distinct message id applied exactly once, none lost, none twice, nothing left on the broker, nothing dead-lettered.

Kills land at random points of three kinds: ``mid-handler`` (the effect written, not committed), ``after-commit``
(committed, not acknowledged: the broker delivers it again) and ``anywhere`` (a SIGKILL from outside at a random
moment: fetching, handling, acknowledging or starting up). A killed worker is started again at once.
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import URL

from idem_dialects.store import IdempotencyStore

from .brokers import BATCH, OPERATIONS, Kill, Worker, applied_table

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


def kill_plan(kills: int, total: int, workers: int, rng: random.Random) -> list[Kill | float]:
    """Each planned kill: a `Kill` at a point of the handler/ack path, or a delay (seconds after the worker
    started) for a SIGKILL from outside. Message positions are kept early enough that every kill happens."""
    reach = max(2, total // (workers * (kills + 1)))
    plan: list[Kill | float] = []
    for _ in range(kills):
        point = rng.choice(KILL_POINTS)
        plan.append(rng.uniform(1.5, 4.0) if point == "anywhere" else Kill(point, rng.randint(1, reach)))
    return plan


class _Slot:
    """One worker position: its current process, the kill it carries, when it started."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.proc: subprocess.Popen[bytes] | None = None
        self.kill: Kill | float | None = None
        self.started = 0.0


class Proof:
    """One run; `run()` returns its ProofResult. The broker's queue/stream and the tables are its own (a random
    name), removed at the end."""

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
        self.directory = Path(tempfile.mkdtemp(prefix="idem-proof-"))

    def run(self) -> ProofResult:
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
            shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, store: IdempotencyStore) -> ProofResult:
        batch, distinct = messages(self.total, self.duplicate_share, self.rng)
        plan = kill_plan(self.kills, self.total, self.workers, self.rng)
        result = ProofResult(self.broker, self.engine, len(batch), distinct, [])
        started = time.monotonic()
        self.ops["publish"](self.broker_url, self.name, batch)
        self.log(f"published {len(batch)} messages ({distinct} distinct) in {time.monotonic() - started:.1f}s")
        slots = [_Slot(n) for n in range(self.workers)]
        deadline = started + self.timeout
        try:
            self._consume_with_kills(store, slots, plan, distinct, result, deadline)
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

    def _consume_with_kills(self, store: IdempotencyStore, slots: list[_Slot], plan: list[Kill | float],
                            distinct: int, result: ProofResult, deadline: float) -> None:
        for slot in slots:
            self._start(slot, plan.pop(0) if plan else None)
        while True:
            for slot in slots:
                assert slot.proc is not None
                if isinstance(slot.kill, float) and time.monotonic() - slot.started > slot.kill:
                    slot.proc.send_signal(signal.SIGKILL)
                    slot.proc.wait()
                if slot.proc.poll() is not None:
                    if slot.proc.returncode != -signal.SIGKILL:
                        raise RuntimeError(f"worker {slot.number} exited with {slot.proc.returncode}:"
                                           f" {self._log_of(slot)}")
                    point = slot.kill.point if isinstance(slot.kill, Kill) else "anywhere"
                    result.kills.append(point)
                    self.log(f"worker {slot.number} killed ({point}); {self._applied(store)} of {distinct} applied")
                    self._start(slot, plan.pop(0) if plan else None)
            if not plan and all(s.kill is None for s in slots) and self._applied(store) >= distinct:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self._applied(store)} of {distinct} applied, {len(plan)} kills pending"
                                   f" after {self.timeout:.0f}s")
            time.sleep(0.1)

    def _drain(self, store: IdempotencyStore, distinct: int, deadline: float) -> None:
        """With every worker stopped cleanly, what is left on the broker (messages returned unacknowledged) is
        consumed by a worker that is not killed, until the broker holds nothing after a clean stop."""
        for _ in range(5):
            left, _dead = self.ops["left"](self.broker_url, self.name)
            if not left:
                return
            self.log(f"{left} left on the broker after a clean stop: draining them")
            slot = _Slot(self.workers)
            self._start(slot, None)
            while self.ops["left"](self.broker_url, self.name)[0] and time.monotonic() < deadline:
                time.sleep(0.2)
            self._stop(slot)

    def _start(self, slot: _Slot, kill: Kill | float | None) -> None:
        slot.kill, slot.started = kill, time.monotonic()
        worker = Worker(self.broker, self.broker_url, self.name, self.db_url.render_as_string(hide_password=False),
                        self.prefix, slot.number, str(self.directory / f"journal-{slot.number}"),
                        kill if isinstance(kill, Kill) else None)
        spec = asdict(worker)
        with open(self.directory / f"worker-{slot.number}.log", "ab") as out:
            slot.proc = subprocess.Popen([sys.executable, "-m", "idem_dialects.conformance.consumer_worker",
                                          json.dumps(spec)], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def _stop(self, slot: _Slot) -> None:
        if slot.proc is None or slot.proc.poll() is not None:
            return
        slot.proc.send_signal(signal.SIGTERM)
        try:
            slot.proc.wait(30)
        except subprocess.TimeoutExpired:
            slot.proc.kill()
            slot.proc.wait()
            raise RuntimeError(f"worker {slot.number} did not stop within 30 s: {self._log_of(slot)}") from None
        if slot.proc.returncode != 0:
            raise RuntimeError(f"worker {slot.number} exited with {slot.proc.returncode}: {self._log_of(slot)}")

    def _log_of(self, slot: _Slot) -> str:
        text = (self.directory / f"worker-{slot.number}.log").read_text(errors="replace").strip()
        return " | ".join(text.splitlines()[-6:]) or "(no output)"

    def _applied(self, store: IdempotencyStore) -> int:
        table = store.tables.metadata.tables[f"{self.prefix}applied"]
        with store.engine.connect() as conn:
            return int(conn.execute(select(func.count(table.c.message_id.distinct()))).scalar_one())

    def _count(self, store: IdempotencyStore, result: ProofResult) -> None:
        table = store.tables.metadata.tables[f"{self.prefix}applied"]
        with store.engine.connect() as conn:
            rows = conn.execute(select(table.c.message_id, func.count()).group_by(table.c.message_id)).all()
        per_id: dict[str, int] = {str(mid): int(n) for mid, n in rows}
        result.effects = sum(per_id.values())
        result.applied = len(per_id)
        result.twice = sum(1 for n in per_id.values() if n > 1)
        result.lost = result.distinct - result.applied
        result.left, result.dead_lettered = self.ops["left"](self.broker_url, self.name)
        for journal in self.directory.glob("journal-*"):
            result.counts.update(journal.read_text().split())


HEADER = ("broker", "engine", "published", "distinct", "dup. published", "kills (m/c/a)", "handler runs",
          "duplicates acked", "acked", "dead-lettered", "effects", "lost", "twice", "left", "seconds", "result")


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
    return {**asdict(result), "ok": result.ok, "batch": BATCH}
