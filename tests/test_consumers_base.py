"""The policy every broker adapter shares (idem_dialects.consumers.base): which disposition a failure gets, with real
errors of a real store. No broker needed."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from consumer_common import Inbox

from idem_dialects import Disposition, IdempotencyStore, RetryPolicy
from idem_dialects.consumers import ConsumerBase, DeadLetter, header


def _policy(**options: Any) -> ConsumerBase:
    settings: dict[str, Any] = {"subscriber": "billing", "on_mismatch": Disposition.DEAD_LETTER,
                                "max_deliveries": 3, "retry_delay": 0.0, "compare_payload": True}
    return ConsumerBase(**(settings | options))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_failing_handler_is_retried_until_max_deliveries_then_dead_lettered(inbox: Inbox) -> None:
    policy = _policy()

    def fails(conn: Any) -> None:
        raise ValueError("cannot parse")

    outcomes = [policy.process(inbox.store, "m", b"p", fails, deliveries) for deliveries in (1, 2, 3)]
    assert outcomes == [Disposition.RETRY, Disposition.RETRY, Disposition.DEAD_LETTER]
    assert _policy(max_deliveries=None).process(inbox.store, "m", b"p", fails, 99) is Disposition.RETRY


def test_dead_letter_invalid_ids_and_missing_ids_go_at_once(inbox: Inbox) -> None:
    policy = _policy()

    def refuses(conn: Any) -> None:
        raise DeadLetter("account closed")

    assert policy.process(inbox.store, "m", b"p", refuses, 1) is Disposition.DEAD_LETTER
    assert policy.process(inbox.store, "bad\x00id", b"p", lambda conn: None, 1) is Disposition.DEAD_LETTER
    assert policy.process(inbox.store, None, b"p", lambda conn: None, 1) is Disposition.DEAD_LETTER
    assert policy.process(inbox.store, b"\xff", b"p", lambda conn: None, 1) is Disposition.DEAD_LETTER  # not UTF-8
    assert policy.counts["no id"] == 2 and inbox.applied() == {}


def test_an_unreachable_database_is_retried_however_often_the_message_came(tmp_path: Path) -> None:
    """Never a reason to dead-letter: the message is fine, the database is not (a real CannotConnect, retries
    exhausted)."""
    store = IdempotencyStore.from_url(f"postgresql+psycopg://nobody@127.0.0.1:{_closed_port()}/none",
                                      retry=RetryPolicy(total=0.05, initial=0.01, max_wait=0.02))
    try:
        assert _policy().process(store, "m", b"p", lambda conn: None, 50) is Disposition.RETRY
    finally:
        store.close()


def test_duplicates_and_mismatches_are_settled_as_consume_says(inbox: Inbox) -> None:
    policy = _policy(on_mismatch=Disposition.ACK)
    runs: list[str] = []
    assert policy.process(inbox.store, "m", b"p", lambda conn: runs.append("m"), 1) is Disposition.ACK
    assert policy.process(inbox.store, "m", b"p", lambda conn: runs.append("m"), 2) is Disposition.ACK
    assert policy.process(inbox.store, "m", b"q", lambda conn: runs.append("m"), 1) is Disposition.ACK
    assert runs == ["m"] and policy.counts == {"processed": 1, "duplicate": 1, "mismatch": 1, "ack": 3}
    ignoring = _policy(compare_payload=False)
    assert ignoring.process(inbox.store, "m", b"other", lambda conn: runs.append("m"), 1) is Disposition.ACK
    assert ignoring.counts["duplicate"] == 1 and runs == ["m"]


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="max_deliveries"):
        _policy(max_deliveries=0)
    with pytest.raises(ValueError, match="retry_delay"):
        _policy(retry_delay=-1)

    class Message:
        headers = {"x-id": b"o-1"}

    assert header("x-id")(Message()) == b"o-1" and header("other")(Message()) is None
