"""The Celery decorator with a real worker process on the machine's RabbitMQ: a task with acks_late=True whose worker
is killed (SIGKILL) after the task's transaction committed and before the ack; the redelivered task does not apply
the effect again. An explicit key: two publishes of one logical job apply it once. Arguments the broker carries
(64-bit ids) run; a message refused before its task ran is dead-lettered, never acknowledged."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from consumer_common import Inbox, dead_lettered, wait_for

from idem_dialects.engines.local import stop_process

celery = pytest.importorskip("celery", reason="celery is not installed (pip install 'idem-dialects[celery]')")

TESTS = Path(__file__).resolve().parent


class Workers:
    """Celery worker processes (solo pool) on one queue of their own, configured through the environment."""

    def __init__(self, url: str, inbox: Inbox, tmp_path: Path) -> None:
        self.queue = f"idem-celery-{secrets.token_hex(4)}"
        self.journal = tmp_path / "journal"
        self.env = {**os.environ, "IDEM_CELERY_BROKER": url, "IDEM_CELERY_QUEUE": self.queue,
                    "IDEM_CELERY_DB": inbox.url, "IDEM_CELERY_PREFIX": inbox.prefix,
                    "IDEM_CELERY_JOURNAL": str(self.journal),
                    "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        self.app = celery.Celery("idem_test_client", broker=url)
        self.app.conf.task_queues = [dead_lettered(self.queue)]  # declared as the workers declare it
        with self.app.connection_for_write() as conn:
            conn.default_channel.queue_declare(queue=f"{self.queue}.dead")
        self.logs = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        with open(self.logs / f"worker-{n}.log", "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=solo",
                                     "-Q", self.queue, "-n", f"idem{n}-{self.queue}@localhost", "--without-gossip",
                                     "--without-mingle", "--without-heartbeat", "-l", "warning"],
                                    env={**self.env, **env}, cwd=TESTS, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def send(self, name: str, *args: object, task_id: str | None = None) -> str:
        return str(self.app.send_task(name, args=args, queue=self.queue, task_id=task_id).id)

    def returned(self) -> list[tuple[str, str, str]]:
        if not self.journal.exists():
            return []
        return [tuple(line.split(" ", 2)) for line in self.journal.read_text().splitlines()]  # type: ignore[misc]

    def left(self, queue: str | None = None) -> int:
        with self.app.connection_for_write() as conn:
            return int(conn.default_channel.queue_declare(queue=queue or self.queue, passive=True).message_count)

    def dead(self) -> int:
        """Messages rejected without requeue (dead-lettered), never acknowledged."""
        return self.left(f"{self.queue}.dead")

    def close(self) -> None:
        for proc in self.procs:
            stop_process(proc)
        with self.app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue=self.queue)
            conn.default_channel.queue_delete(queue=f"{self.queue}.dead")
        self.app.close()

    def log(self, n: int) -> str:
        return (self.logs / f"worker-{n}.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def workers(broker: Callable[..., str], inbox: Inbox, tmp_path: Path) -> Iterator[Workers]:
    made = Workers(broker("rabbitmq", client="celery"), inbox, tmp_path)
    yield made
    made.close()


def test_worker_killed_after_commit_does_not_apply_the_redelivered_task_again(workers: Workers, inbox: Inbox,
                                                                             tmp_path: Path) -> None:
    task_id = workers.send("idem_test.record", "o-1")
    first = workers.start(IDEM_CELERY_KILL_AFTER_FIRST=str(tmp_path / "killed"))
    assert first.wait(60) == -signal.SIGKILL, workers.log(0)
    assert inbox.applied() == {"o-1": 1}  # the effect committed before the kill...
    assert workers.returned() == [("idem_test.record", task_id, "o-1")]  # ...and the task returned, unacked
    workers.start()
    wait_for(lambda: len(workers.returned()) == 2, timeout=60, what="the redelivered task")
    assert workers.returned()[1] == ("idem_test.record", task_id, "None")  # the redelivery: not run again
    assert inbox.applied() == {"o-1": 1}
    wait_for(lambda: workers.left() == 0, timeout=30, what="the redelivery acknowledged")


def test_an_explicit_key_applies_two_publishes_of_one_job_once(workers: Workers, inbox: Inbox) -> None:
    """Two publishes of one job (two task ids, one key) apply it once; the key with other arguments is rejected
    without requeue (dead-lettered) and applies nothing."""
    first, second = workers.send("idem_test.charge", "o-9", 500), workers.send("idem_test.charge", "o-9", 500)
    changed = workers.send("idem_test.charge", "o-9", 700)
    workers.start()
    wait_for(lambda: len(workers.returned()) == 3, timeout=60, what="the three tasks")
    returned = {task_id: value for _, task_id, value in workers.returned()}
    assert returned[first] == "500" and returned[second] == "None"
    assert "processed before with other arguments" in returned[changed]  # Reject(requeue=False)
    assert inbox.applied() == {"charge:o-9": 1}
    wait_for(lambda: workers.left() == 0, timeout=30, what="every message settled")


def test_a_task_with_64_bit_integer_arguments_runs_exactly_once(workers: Workers, inbox: Inbox) -> None:
    """2**60 and -2**63 travel exactly in Celery's JSON: the task runs, and a second delivery of its message (the
    same task id) is compared with the first by those arguments and not run again."""
    number, signed = 2**60, -(2**63)
    task_id = workers.send("idem_test.big", number, signed)
    workers.send("idem_test.big", number, signed, task_id=task_id)
    workers.start()
    wait_for(lambda: len(workers.returned()) == 2, timeout=60, what="both deliveries")
    assert [value for _, _, value in workers.returned()] == [str(number), "None"], workers.log(0)
    assert inbox.applied() == {f"big:{number}:{signed}": 1}
    wait_for(lambda: workers.left() == 0, timeout=30, what="both deliveries acknowledged")
    assert workers.dead() == 0


def test_a_message_refused_before_its_task_ran_is_dead_lettered_not_acknowledged(workers: Workers,
                                                                                inbox: Inbox) -> None:
    """The key function gives an id the store refuses (empty): the task never ran, so the message goes to the
    queue's dead-letter queue, where it can be found and replayed, instead of being acknowledged as done."""
    workers.send("idem_test.keyed", "")
    done = workers.send("idem_test.keyed", "o-7")
    workers.start()
    wait_for(lambda: done in {task_id for _, task_id, _ in workers.returned()}, timeout=60, what="the good task")
    wait_for(lambda: workers.dead() == 1, timeout=30, what="the refused message dead-lettered")
    assert inbox.applied() == {"keyed:o-7": 1}
    assert workers.left() == 0
