"""One idempotent request on its way through a driver: what `driver` (sync) and `adriver` (async) decide alike.

The drivers differ only in how they do I/O (calling or awaiting the store and the handler); what the store is asked,
how a handler's response is stored or answered, and which errors become problems is decided here, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import IdemError
from ..outcomes import Outcome, Result
from ..store import Reply
from .core import (
    Call,
    HandlerErrors,
    IdempotencyPolicy,
    NotStored,
    ResponseTooLarge,
    _connection,
    encode_stored,
    outcome_response,
    replay_response,
)
from .problems import HttpResponse


@dataclass
class Exchange:
    """A prepared call under a policy, with what its handler raised and (atomic mode) the response it stored."""

    policy: IdempotencyPolicy
    call: Call
    errors: HandlerErrors = field(default_factory=HandlerErrors)
    _stored: list[HttpResponse] = field(default_factory=list)

    @property
    def identity(self) -> dict[str, Any]:
        """The keyword arguments that name the record to the store's `run` and `claim`."""
        return {"scope": self.call.scope, "operation": self.call.operation, "key": self.call.key,
                "request": self.call.request}

    @contextmanager
    def handling(self, conn: Any = None) -> Iterator[None]:
        """Around one call of the handler: its own exceptions are noted, so `answer` re-raises them unchanged; in
        atomic mode `conn`, the record's transaction, is its `current_connection()` meanwhile."""
        token = None if conn is None else _connection.set(conn)
        try:
            yield
        except BaseException as exc:
            self.errors.note(exc)
            raise
        finally:
            if token is not None:
                _connection.reset(token)

    def answer(self, exc: ResponseTooLarge | IdemError) -> HttpResponse:
        """The problem for an error of the layer or the store; re-raises the handler's own."""
        return self.errors.answer(self.policy, exc)

    # --- atomic mode: claim, handler and record in one `run` ---------------------------------------------------

    def stored(self, resp: HttpResponse) -> Reply:
        """What the effect returns to `run` for the handler's response; NotStored rolls a status not stored back."""
        if not self.policy.store_status(resp.status):
            raise NotStored(resp)
        self._stored[:] = [resp]
        return Reply(encode_stored(self.policy, resp), resp.status)

    def ran(self, result: Result) -> HttpResponse:
        """The answer once `run` returned: a replay, or the response this request's handler stored."""
        if result.replayed:
            return replay_response(self.policy, self.call, result.response, result.status)
        return self._stored[0]

    # --- external-call mode: claim, handler outside any transaction, then complete or release -------------------

    def unclaimed(self, outcome: Outcome) -> HttpResponse:
        """The answer for a claim that was not won: a replay, a 422 or a 409."""
        answer = outcome_response(self.policy, self.call, outcome)
        assert answer is not None, "a claim that was won has no answer yet"
        return answer

    def to_store(self, resp: HttpResponse) -> bytes | None:
        """The record for the handler's response, or None when its status is not stored (the claim is released)."""
        return encode_stored(self.policy, resp) if self.policy.store_status(resp.status) else None
