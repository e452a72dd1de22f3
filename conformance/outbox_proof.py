"""The outbox proof, end to end: HTTP requests with duplicates (the project's WSGI middleware, atomic mode) each write
an order (the business write), its record and one outbox command in one transaction; relay processes publish the
commands to a real broker; consumer processes (the project's adapters, the consumer proof's workers) apply each
command's effect through their inbox. Meanwhile relays and consumers are killed (SIGKILL from outside, at random
moments of the run) and started again, and the database server is restarted. Then everything is counted: every
request answered, each order written once, every command published, each command's downstream effect applied
exactly once (0 lost, 0 doubled), nothing left on the broker, nothing dead-lettered.

It reuses the consumer proof's machinery (`consumer_proof.Proof`: worker processes, their start/stop, the broker's
queue, the drain and the count of applied effects); what it adds is the HTTP front, the relays and the restarts.
"""

from __future__ import annotations

import http.client
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.engines import Server, started
from idem_dialects.engines.local import stop_process
from idem_dialects.http import IdempotencyPolicy
from idem_dialects.http.wsgi import CONNECTION_KEY, IdempotencyMiddleware
from idem_dialects.schema import DEAD, PENDING, PUBLISHED

from .consumer_proof import Proof, _Slot
from .once import tally

ACCOUNTS = 50  # scopes: the relays keep each one's order


@dataclass
class OutboxProofResult:
    broker: str
    engine: str
    requests: int  # sent, duplicates included
    distinct: int
    relay_kills: int = 0
    consumer_kills: int = 0
    restarts: int = 0
    answered: int = 0
    replayed: int = 0  # answers marked Idempotent-Replayed
    retried_requests: int = 0  # client retries after an error answer or a lost connection
    orders_doubled: int = 0
    commands: int = 0
    published: int = 0
    pending: int = 0
    dead: int = 0
    effects: int = 0
    applied: int = 0
    lost: int = 0
    twice: int = 0
    left: int = 0
    dead_lettered: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.answered == self.requests and self.commands == self.distinct == self.published == self.applied
                == self.effects and not (self.lost or self.twice or self.orders_doubled or self.pending or self.dead
                                         or self.left or self.dead_lettered))


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Threaded(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class OutboxProof(Proof):
    """One run on `broker` x the database `server` (restarted `restarts` times if it can be); `run()` returns an
    OutboxProofResult."""

    id_header = "Nats-Msg-Id"  # the relays publish the command id where JetStream's deduplication reads it

    def __init__(self, broker: str, broker_url: str, engine: str, server: Server, *, requests: int = 10_000,
                 duplicate_share: float = 0.2, kills: int = 20, restarts: int = 2, relays: int = 2,
                 workers: int = 2, clients: int = 8, lease: float = 3.0, seed: int | None = None,
                 timeout: float = 1800.0, log: Any = lambda line: None) -> None:
        super().__init__(broker, broker_url, engine, server.url, total=requests, duplicate_share=duplicate_share,
                         kills=kills, workers=workers, seed=seed, timeout=timeout, log=log)
        self.server, self.restarts, self.relays, self.clients, self.lease = server, restarts, relays, clients, lease
        if restarts and server.restart is None:
            raise ValueError(f"{engine}: the proof cannot restart this server (not one it started)")

    def run(self) -> OutboxProofResult:  # type: ignore[override]
        with started.temp_dir("idem-proof-") as directory:
            self.directory = Path(directory)
            store = IdempotencyStore.from_url(self.db_url, table_prefix=self.prefix, retry=RetryPolicy(total=60))
            metadata = MetaData()
            orders = Table(f"{self.prefix}orders", metadata, Column("idem_key", String(64), nullable=False),
                           Column("account", Integer, nullable=False))
            from .brokers import applied_table

            applied_table(self.prefix, store.tables.metadata)
            store.create_tables()
            with store.engine.begin() as conn:
                metadata.create_all(conn)
            self.ops["setup"](self.broker_url, self.name)
            try:
                return self._run_all(store, orders)
            finally:
                self.ops["teardown"](self.broker_url, self.name)
                with store.engine.begin() as conn:
                    metadata.drop_all(conn)
                store.drop_tables()
                store.close()

    # --- the HTTP front --------------------------------------------------------------------------------------------

    def _app(self, store: IdempotencyStore, orders: Table) -> Any:
        def handler(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            conn = environ[CONNECTION_KEY]
            body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
            conn.execute(insert(orders).values(idem_key=body["order"], account=body["account"]))
            command = store.add_command(conn, self.name, {"order": body["order"], "account": body["account"]})
            start_response("201 Created", [("Content-Type", "application/json")])
            return [json.dumps({"command": command}).encode()]

        policy = IdempotencyPolicy(scope=lambda req: req.header("x-account"), operation="order:v1")
        return IdempotencyMiddleware(handler, store, policy)

    def _client(self, port: int, work: queue.Queue[tuple[str, int] | None], result: OutboxProofResult,
                lock: threading.Lock, deadline: float) -> None:
        while (item := work.get()) is not None:
            key, account = item
            body = json.dumps({"order": key, "account": account})
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError("a request was never answered")
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                    conn.request("POST", "/orders", body, {"Idempotency-Key": f'"{key}"',
                                                           "X-Account": str(account),
                                                           "Content-Type": "application/json"})
                    answer = conn.getresponse()
                    answer.read()
                    conn.close()
                except (OSError, http.client.HTTPException):
                    status, replayed = 0, False
                else:
                    status, replayed = answer.status, answer.getheader("Idempotent-Replayed") == "true"
                if status == 201:
                    with lock:
                        result.answered += 1
                        result.replayed += replayed
                    break
                with lock:
                    result.retried_requests += 1
                time.sleep(0.2)  # the database restarting, a request in flight: the client retries, same key

    # --- the run ---------------------------------------------------------------------------------------------------

    def _run_all(self, store: IdempotencyStore, orders: Table) -> OutboxProofResult:
        requests, distinct = self._requests()
        result = OutboxProofResult(self.broker, self.engine, len(requests), distinct)
        started = time.monotonic()
        deadline = started + self.timeout
        server = make_server("127.0.0.1", 0, self._app(store, orders), server_class=_Threaded,
                             handler_class=_Quiet)
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        consumers = [_Slot(n, self.directory) for n in range(self.workers)]
        relays: list[subprocess.Popen[bytes] | None] = [None] * self.relays
        try:
            for slot in consumers:
                self._start(slot, None)
            for n in range(self.relays):
                relays[n] = self._start_relay(n)
            self._wait(lambda: all(s.is_ready() for s in consumers), deadline, "the consumers to start")
            work: queue.Queue[tuple[str, int] | None] = queue.Queue()
            for item in requests:
                work.put(item)
            lock = threading.Lock()
            threads = [threading.Thread(target=self._client, args=(server.server_port, work, result, lock,
                                                                    deadline)) for _ in range(self.clients)]
            for thread in threads:
                work.put(None)
                thread.start()
            self._chaos(result, consumers, relays, len(requests), deadline)
            for thread in threads:
                thread.join(max(1.0, deadline - time.monotonic()))
            self._wait(lambda: self._applied(store) >= distinct, deadline, "every command applied")
            # A relay killed between its publish and its mark leaves the command to be published again once the
            # lease ends: the relays stop only when nothing is pending, so no copy reaches the broker after the drain
            # has found it empty.
            self._wait(lambda: self._pending(store) == 0, deadline, "every command published")
            _stop_relays(relays)
            for slot in consumers:
                self._stop(slot)
            self._drain(store, distinct, deadline)
        finally:
            _stop_relays(relays)
            for slot in consumers:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
                    slot.proc.wait()
            server.shutdown()
            server.server_close()
        result.seconds = time.monotonic() - started
        self._tally(store, orders, result)
        return result

    def _requests(self) -> tuple[list[tuple[str, int]], int]:
        distinct = self.total - round(self.total * self.duplicate_share)
        keys = [(f"order-{n:06d}", n % ACCOUNTS) for n in range(distinct)]
        chosen = keys + self.rng.choices(keys, k=self.total - distinct)
        self.rng.shuffle(chosen)
        return chosen, distinct

    def _chaos(self, result: OutboxProofResult, consumers: list[_Slot], relays: list[Any], total: int,
               deadline: float) -> None:
        """The kills and restarts, each once the answered requests pass a random share of the run (5-95 %): a kill
        SIGKILLs a relay or a consumer (alternately) and starts it again; a restart stops the database server
        cleanly, keeps it down 2 s and starts it."""
        events = ["relay" if n % 2 else "consumer" for n in range(self.kills)] + ["restart"] * self.restarts
        marks = sorted((self.rng.uniform(0.05, 0.95) * total, event) for event in events)
        for mark, event in marks:
            self._wait(partial(_reached, result, mark), deadline, f"{mark:.0f} answered requests")
            if event == "restart":
                assert self.server.restart is not None
                self.log(f"restarting the database ({result.answered} answered)")
                self.server.restart(2.0)
                result.restarts += 1
            elif event == "relay":
                n = self.rng.randrange(len(relays))
                relays[n].send_signal(signal.SIGKILL)
                relays[n].wait()
                relays[n] = self._start_relay(n)
                result.relay_kills += 1
                self.log(f"relay {n} killed ({result.answered} answered)")
            else:
                slot = consumers[self.rng.randrange(len(consumers))]
                if slot.proc is not None:
                    slot.proc.send_signal(signal.SIGKILL)
                    slot.proc.wait()
                self._start(slot, None)
                result.consumer_kills += 1
                self.log(f"consumer {slot.number} killed ({result.answered} answered)")

    def _start_relay(self, n: int) -> subprocess.Popen[bytes]:
        spec = {"db_url": self.db_url.render_as_string(hide_password=False), "prefix": self.prefix,
                "broker": self.broker, "broker_url": self.broker_url, "name": self.name,
                "ready": str(self.directory / f"relay-ready-{n}"), "lease": self.lease}
        with open(self.directory / f"relay-{n}.log", "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "idem_dialects.conformance.relay_worker",
                                     json.dumps(spec)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _pending(self, store: IdempotencyStore) -> int:
        t = store.tables.outbox
        return int(self._read(store, select(func.count()).select_from(t).where(t.c.state == PENDING))[0][0])

    def _tally(self, store: IdempotencyStore, orders: Table, result: OutboxProofResult) -> None:
        t = store.tables.outbox
        per_order = self._read(store, select(orders.c.idem_key, func.count()).group_by(orders.c.idem_key))
        states = Counter({int(s): int(n) for s, n in self._read(store, select(t.c.state, func.count())
                                                                 .group_by(t.c.state))})
        result.orders_doubled = tally({key: int(n) for key, n in per_order}, result.distinct).twice
        result.commands = sum(states.values())
        result.published, result.pending, result.dead = states[PUBLISHED], states[PENDING], states[DEAD]
        self._count(store, result)  # type: ignore[arg-type]  # the consumer proof's count: the same fields


def _stop_relays(relays: list[subprocess.Popen[bytes] | None]) -> None:
    for proc in relays:
        if proc is not None:
            stop_process(proc)


def _reached(result: OutboxProofResult, mark: float) -> bool:
    return result.answered >= mark


HEADER = ("broker", "engine", "requests", "distinct", "replayed", "client retries", "relay kills", "consumer kills",
          "db restarts", "commands", "published", "effects", "lost", "twice", "orders doubled", "left", "seconds",
          "result")


def table(results: list[OutboxProofResult]) -> str:
    """The results as a Markdown table."""
    rows = [HEADER, tuple("---" for _ in HEADER)]
    for r in results:
        rows.append((r.broker, r.engine, str(r.requests), str(r.distinct), str(r.replayed), str(r.retried_requests),
                     str(r.relay_kills), str(r.consumer_kills), str(r.restarts), str(r.commands), str(r.published),
                     str(r.effects), str(r.lost), str(r.twice), str(r.orders_doubled), str(r.left),
                     f"{r.seconds:.1f}", "ok" if r.ok else "FAILED"))
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)

