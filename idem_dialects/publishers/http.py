"""An HTTP endpoint, through the standard library: each command sent as a request whose body is the payload and
whose ``Idempotency-Key`` header is the command id (as draft-ietf-httpapi-idempotency-key-header spells it: a quoted
string), so a receiver behind `idem_dialects.http` (or any service honouring the header) acts once however often
the relay sends it::

    relay = Relay(store, {"billing": HttpPublisher("https://billing.internal/commands/{destination}")})

A 2xx answer is success; 409 (the first send still in flight), 425, 429 and 5xx are retried; any other 4xx
dead-letters the command (`Rejected`); a refused or timed-out connection is `Unreachable`.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping

from ..outbox import Command
from ..relay import Rejected, Unreachable

__all__ = ["HttpPublisher", "RetryableStatus"]

_RETRIED = {408, 409, 425, 429}


class RetryableStatus(Exception):
    """The endpoint answered with a status worth retrying (counted as an attempt)."""


class HttpPublisher:
    """Sends each command to `url` (``{destination}`` in it becomes the command's destination) with `method`."""

    def __init__(self, url: str, *, method: str = "POST", headers: Mapping[str, str] | None = None,
                 timeout: float = 10.0) -> None:
        self.url, self.method, self.headers, self.timeout = url, method, dict(headers or {}), timeout

    def publish(self, command: Command) -> None:
        headers = {**self.headers, **command.headers, "Content-Type": command.content_type,
                   "Idempotency-Key": f'"{command.id}"'}
        request = urllib.request.Request(self.url.replace("{destination}", command.destination),
                                         data=command.payload, method=self.method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in _RETRIED or exc.code >= 500:
                raise RetryableStatus(f"HTTP {exc.code}") from None
            raise Rejected(f"HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise Unreachable(f"HTTP: {type(exc).__name__}: {exc}") from exc
