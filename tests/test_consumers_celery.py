"""The Celery decorator with a real worker process on the machine's RabbitMQ: a task with acks_late=True whose worker
is killed (SIGKILL) after the task's transaction committed and before the ack; the redelivered task does not apply
the effect again. And an explicit key: two publishes of one logical job apply it once."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from consumer_common import Inbox, wait_for

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

    def send(self, name: str, *args: object) -> str:
        return str(self.app.send_task(name, args=args, queue=self.queue).id)

    def returned(self) -> list[tuple[str, str, str]]:
        if not self.journal.exists():
            return []
        return [tuple(line.split(" ", 2)) for line in self.journal.read_text().splitlines()]  # type: ignore[misc]

    def left(self) -> int:
        with self.app.connection_for_write() as conn:
            return int(conn.default_channel.queue_declare(queue=self.queue, passive=True).message_count)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        with self.app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue=self.queue)
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
