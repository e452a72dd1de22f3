"""What a publisher raises when its destination refuses the credentials in its URL."""

from __future__ import annotations

from ..relay import Unreachable


class CredentialsRefused(Unreachable):
    """The destination refused the publisher's credentials (a wrong user or password in its URL). As with
    `Unreachable`, nothing was sent and the command costs no attempt; but no pause fixes it, so `idem-dialects relay`
    says so, and with ``--once`` exits non-zero."""
