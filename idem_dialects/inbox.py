"""Processed messages (the idempotent consumer): `(subscriber, message_id)` accepted once, in the transaction of the
handler's effect, its payload fingerprint compared on redelivery. Flows, run by the sync and async loops alike."""

from __future__ import annotations

from typing import Any

from .claims import call_effect
from .core import NO_PAYLOAD, ROUNDS, Core
from .errors import ClaimRaced, InvalidPayload, RequestMismatch
from .ids import MESSAGE, MESSAGE_OPERATION, Origin
from .outcomes import Delivery, Disposition, OnMismatch
from .retry import RetryPolicy
from .schema import MESSAGE_KEY_COLUMNS
from .steps import Flow, transaction


class Inbox:
    """The processed-message flows on one store's `Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def accept_message(self, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> Flow[bool]:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery.
        A redelivery whose payload differs from the first one's raises RequestMismatch. Validates eagerly."""
        ident, fp = self.core.message(subscriber, message_id, payload)
        return self.core.telemetry.message(ident["subscriber"], self._accept(ident, fp))

    def _accept(self, ident: dict[str, str], fp: str | None) -> Flow[bool]:
        t, backend = self.core.tables.messages, self.core.backend
        for _ in range(ROUNDS):
            if (yield from backend.insert_if_absent(t, dict(ident, fingerprint=fp), {"processed_at": 0.0})):
                return True
            row = yield from self._read(ident)
            if row is None:
                continue  # purged or rolled back in between
            _compare(row, ident, fp)
            return False
        raise ClaimRaced(f"message {ident['message_id']!r} of {ident['subscriber']!r} changed under"
                         f" {ROUNDS} attempts")

    def recorded(self, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> Flow[bool]:
        """Whether the message was processed here, recording nothing (RequestMismatch if with another payload): a
        sharded store's look at a moving scope's old shard. Validates eagerly."""
        ident, fp = self.core.message(subscriber, message_id, payload)
        return self._recorded(ident, fp)

    def _recorded(self, ident: dict[str, str], fp: str | None) -> Flow[bool]:
        row = yield from self._read(ident)
        if row is not None:
            _compare(row, ident, fp)
        return row is not None

    def _read(self, ident: dict[str, str]) -> Flow[Any]:
        key = {name: ident[name] for name in MESSAGE_KEY_COLUMNS}
        return (yield from self.core.backend.read(self.core.tables.messages, key))

    def consume(self, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD,
                on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None) -> Flow[Delivery]:
        """Run the handler (an `Effect` step) and record the message in one transaction, re-run on the backend's
        retryable errors like `run`; a message processed before is acknowledged without running the handler, and
        one whose payload differs from the first one's gets the disposition `on_mismatch` chooses (a Disposition,
        or a function of the RequestMismatch that returns one). The handler's own error reaches the caller
        unchanged. Validates eagerly: bad input raises here, before the flow runs."""
        ident, fp = self.core.message(subscriber, message_id, payload)
        if not (isinstance(on_mismatch, Disposition) or callable(on_mismatch)):
            raise InvalidPayload("on_mismatch", f"must be a Disposition or a function returning one, got"
                                                f" {type(on_mismatch).__name__}")
        return self._consumed(ident, fp, on_mismatch, retry)

    def _consumed(self, ident: dict[str, str], fp: str | None, on_mismatch: OnMismatch,
                  retry: RetryPolicy | None) -> Flow[Delivery]:
        delivery = yield from self.core.retrying(lambda: transaction(self._consume(ident, fp)), retry)
        # The one place a message's fate is known: accepted (handler ran), duplicate, or mismatched.
        return delivery if delivery.mismatch is None else mismatched(delivery.mismatch, on_mismatch)

    def _consume(self, ident: dict[str, str], fp: str | None) -> Flow[Delivery]:
        try:  # counted as accepted, duplicate or mismatch where every consumer form is counted
            accepted = yield from self.core.telemetry.message(ident["subscriber"], self._accept(ident, fp))
        except RequestMismatch as mismatch:
            return Delivery(Disposition.DEAD_LETTER, mismatch=mismatch)  # its disposition is the caller's choice
        if not accepted:
            return Delivery(Disposition.ACK, duplicate=True)
        origin = Origin(ident["subscriber"], MESSAGE_OPERATION, ident["message_id"], MESSAGE)
        return Delivery(Disposition.ACK, value=(yield from call_effect(self.core, operation=ident["subscriber"],
                                                                       origin=origin)))


def _compare(row: Any, ident: dict[str, str], fp: str | None) -> None:
    """RequestMismatch if the message was recorded with another payload (where both have one)."""
    if fp is not None and row.fingerprint is not None and row.fingerprint != fp:
        raise RequestMismatch(ident["subscriber"], "message", ident["message_id"], row.fingerprint, fp)


def mismatched(mismatch: RequestMismatch, on_mismatch: OnMismatch) -> Delivery:
    """The delivery of a message processed before with another payload: the disposition `on_mismatch` chooses."""
    return Delivery(Disposition(on_mismatch(mismatch) if callable(on_mismatch) else on_mismatch), mismatch=mismatch)
