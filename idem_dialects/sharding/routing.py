"""Routing by scope, written once for both stores: choosing a scope's shard, `ShardedClaims` (the declared claim API,
`Claims`, whose every flow is routed to the shard of its scope, through a moving scope's old shard while the chooser
is a `Move`), and `Sharded`, what both stores share.

The vocabulary is SQLAlchemy's horizontal sharding extension's: a store has `shards` (id -> a store on one database)
and a `shard_chooser` (SQLAlchemy's takes a mapper and an instance; ours takes the key's `scope`, the owner of the key,
which is what the business data is sharded by too). A key's record must live where the effect's transaction runs, so
the effect always gets the connection of its scope's shard, and one transaction never spans two shards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy.engine import URL

from ..claims import Claims, result_of
from ..core import Request
from ..errors import ConfigurationError, IdemError, RequestMismatch, RetriesExhausted, RetryCause
from ..features import Features
from ..fingerprint import Encoder
from ..inbox import Inbox, mismatched
from ..keys import check_identifier
from ..outcomes import Claimed, Delivery, Disposition, OnMismatch, Outcome, Result
from ..retry import RetryPolicy, retrying
from ..steps import Begin, Flow, Heartbeat, transaction
from ..storebase import StoreBase
from .onshard import noting, on_shard
from .outbox import ShardedOutbox
from .placement import Move, Rendezvous, ShardChooser

T = TypeVar("T")
S = TypeVar("S", bound=StoreBase)


class UnknownShard(ConfigurationError):
    """The shard chooser named a shard the store does not have."""

    def __init__(self, scope: str, shard: object, known: list[str]) -> None:
        self.scope, self.shard, self.known = scope, shard, tuple(known)
        super().__init__(f"the shard chooser sent scope {scope!r} to shard {shard!r}, which is not one of this store's"
                         f" shards ({', '.join(known)})")


class CrossShard(IdemError):
    """A transaction that would span two shards, or a connection of one shard used for a key of another: a record must
    commit in the same transaction as its effect, on the same database."""


def choose(chooser: ShardChooser, shards: Mapping[str, object], scope: object) -> str:
    """The shard id for `scope` (validated first, as every scope is, so the chooser sees only valid ones)."""
    valid = check_identifier("scope", scope)
    shard = chooser(valid)
    if shard not in shards:
        raise UnknownShard(valid, shard, list(shards))
    return shard


class ShardedClaims:
    """`Claims`' API for adapters (the HTTP layer's request flow), each flow routed to the shard of its scope. While
    the chooser is a `Move`, a key of a moving scope is first looked up on its old shard (`forwarded`)."""

    def __init__(self, claims: Mapping[str, Claims], chooser: ShardChooser) -> None:
        self.shards = dict(claims)
        self.chooser = chooser
        self._first = next(iter(self.shards.values()))

    def shard(self, scope: object) -> str:
        return choose(self.chooser, self.shards, scope)

    def moving(self, scope: object) -> str | None:
        """The old shard of `scope` while the chooser moves it (None: not moving)."""
        if not isinstance(self.chooser, Move):
            return None
        valid = check_identifier("scope", scope)
        was = self.chooser.source(valid)
        if was is not None and was not in self.shards:
            raise UnknownShard(valid, was, list(self.shards))
        return was

    def forwarded(self, req: Request, retry: RetryPolicy | None = None) -> Flow[Outcome | None]:
        """What the old shard of a moving scope answers for the key (`Claims.forward`), in a transaction of its own
        there within that shard's retry budget; None when the key is the new shard's (or the scope is not moving)."""
        old = self.moving(req.scope)
        if old is None:
            return None
        claims = self.shards[old]
        assert isinstance(self.chooser, Move)
        hold = self.chooser.hold.total_seconds()
        return (yield from on_shard(old, claims.retrying(
            lambda: transaction(claims.forward(req, hold, fresh=True), Begin.CLAIM), retry), alone=True))

    def _after_forward(self, req: Request, then: Flow[T], answer: Callable[[Outcome], T],
                       retry: RetryPolicy | None = None) -> Flow[T]:
        outcome = yield from self.forwarded(req, retry)
        if outcome is None:
            return (yield from then)
        then.close()
        return answer(outcome)

    @property
    def features(self) -> Features:
        """The first shard's features: shards are expected to run one engine (what differs is where they are)."""
        return self._first.features

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        for claims in self.shards.values():
            cause = claims.retry_cause(exc)
            if cause is not None:
                return cause
        return None

    def retrying(self, attempt: Callable[[], Flow[T]], policy: RetryPolicy | None = None) -> Flow[T]:
        """`attempt()` re-run on the retryable errors of the shard it runs on, within that shard's retry budget (or
        `policy`), counted in that shard's `retries`; RetriesExhausted names the shard."""
        seen: list[str] = []

        def budget() -> RetryPolicy:
            return policy or (self.shards[seen[0]] if seen else self._first).core.retry

        def cause(exc: BaseException) -> RetryCause | None:
            return self.shards[seen[0]].retry_cause(exc) if seen else self.retry_cause(exc)

        def count(cause: str) -> None:
            if seen:
                self.shards[seen[0]].core.count_retry(cause)

        try:
            return (yield from retrying(budget, cause, lambda: noting(attempt(), seen), count))
        except RetriesExhausted as exc:
            if not seen:
                raise
            raise exc.on_shard(seen[0]) from exc.__cause__

    def span(self, name: str, operation: str, flow: Flow[T], describe: Callable[[T], dict[str, Any]]) -> Flow[T]:
        return self._first.span(name, operation, flow, describe)

    def request(self, scope: object, operation: object, key: object, request: object,
                lease: timedelta | None = None) -> Request:
        return self.shards[self.shard(scope)].request(scope, operation, key, request, lease)

    def claim(self, req: Request, *, wait: bool = True, fresh: bool = False) -> Flow[Outcome]:
        shard = self.shard(req.scope)
        then = on_shard(shard, self.shards[shard].claim(req, wait=wait, fresh=fresh))
        return then if self.moving(req.scope) is None else self._after_forward(req, then, lambda found: found)

    def complete(self, claimed: Claimed, response: Any, status: int = 200) -> Flow[None]:
        shard = self.shard(claimed.scope)
        return on_shard(shard, self.shards[shard].complete(claimed, response, status))

    def release(self, claimed: Claimed) -> Flow[bool]:
        shard = self.shard(claimed.scope)
        return on_shard(shard, self.shards[shard].release(claimed))

    def renew(self, claimed: Claimed, lease: float) -> Flow[bool]:
        shard = self.shard(claimed.scope)
        return on_shard(shard, self.shards[shard].renew(claimed, lease))

    def heartbeat(self, claimed: Claimed, lease: float, *, in_transaction: bool = False) -> Heartbeat | None:
        shard = self.shard(claimed.scope)
        beat = self.shards[shard].heartbeat(claimed, lease, in_transaction=in_transaction)
        if beat is None:
            return None
        inner = beat.beat
        return Heartbeat(beat.interval, lambda: on_shard(shard, inner()))

    def release_after(self, claimed: Claimed, error: BaseException) -> Flow[None]:
        shard = self.shard(claimed.scope)
        return on_shard(shard, self.shards[shard].release_after(claimed, error))

    def run(self, *, scope: str, operation: str, key: str, request: Any, status: int = 200,
            lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_effect: Callable[[Any], Any] | None = None, on_in_flight: Any = "wait") -> Flow[Result]:
        shard = self.shard(scope)
        then = on_shard(shard, self.shards[shard].run(scope=scope, operation=operation, key=key, request=request,
                                                      status=status, lease=lease, retry=retry, on_effect=on_effect,
                                                      on_in_flight=on_in_flight))  # validated before any SQL
        if self.moving(scope) is None:
            return then
        req = self.request(scope, operation, key, request, lease)
        return self._after_forward(req, then, lambda found: result_of(found, req), retry)

    def effect(self, status: int, on_effect: Callable[[Any], Any] | None = None, operation: str = "",
               heartbeat: Heartbeat | None = None) -> Flow[tuple[Any, int]]:
        return self._first.effect(status, on_effect, operation, heartbeat)


def crossing(first: str, then: str) -> CrossShard:
    return CrossShard(f"one transaction on shard {first!r} was asked to run statements on shard {then!r}: a record"
                      " and its effect commit together, on one database")


def owner(shards: Mapping[str, Any], conn: Any) -> str:
    """The shard whose engine `conn` belongs to (a caller's connection for the step-by-step API)."""
    engine = getattr(conn, "engine", None)
    for shard, store in shards.items():
        if store.engine is engine:
            return shard
    raise CrossShard(f"this connection belongs to none of the store's shards ({', '.join(shards)}): use"
                     " `store.transaction(scope=...)`, or a connection of the shard's own engine")


def from_urls(make: Callable[[str | URL], S], close: Callable[[S], object],
              urls: Mapping[str, str | URL]) -> dict[str, S]:
    """One store per URL; if one cannot be made, those made before it are closed, since no caller ever holds them."""
    made: dict[str, S] = {}
    try:
        for shard, url in urls.items():
            made[shard] = make(url)
    except BaseException:
        for store in made.values():
            close(store)
        raise
    return made


class Sharded(Generic[S]):
    """What `ShardedStore` and `AsyncShardedStore` share: the shards by id, the chooser, `claims` and `outbox` routed
    by it, the settings every shard is given, and the routing of the step-by-step API."""

    needs: ClassVar[str]  # the subject of the error for no shard: "a ShardedStore"

    def __init__(self, shards: Mapping[str, S], shard_chooser: ShardChooser | None = None) -> None:
        if not shards:
            raise ConfigurationError(f"{self.needs} needs at least one shard")
        self.shards: dict[str, S] = dict(shards)
        self.shard_chooser = Rendezvous(self.shards) if shard_chooser is None else shard_chooser
        self.claims = ShardedClaims({k: s.claims for k, s in self.shards.items()}, self.shard_chooser)
        self._inboxes = {k: Inbox(s.claims.core) for k, s in self.shards.items()}
        self.outbox = ShardedOutbox({k: s.outbox for k, s in self.shards.items()})
        self._first = next(iter(self.shards.values()))
        self._owned = False

    def shard_for(self, scope: object) -> str:
        """The shard id of `scope` (UnknownShard if the chooser names none of the store's)."""
        return choose(self.shard_chooser, self.shards, scope)

    def store_for(self, scope: object) -> S:
        return self.shards[self.shard_for(scope)]

    def _routed(self, scope: str | None, call: str) -> S:
        """The store of `scope`, for a call that names no key (a transaction, a message): on one shard none is
        needed."""
        if scope is None:
            if len(self.shards) == 1:
                return self._first
            raise IdemError(f"{call} on a sharded store needs scope=: the owner of what it writes, whose shard it"
                            " runs on")
        return self.store_for(scope)

    def _consuming(self, scope: str | None, subscriber: str, message_id: str, payload: Any, on_mismatch: OnMismatch,
                   retry: RetryPolicy | None) -> Flow[Delivery]:
        """`consume`'s flow on the shard of `scope` (validated before any SQL); for a moving scope, a message its old
        shard recorded is a duplicate (a message names no scope: it is looked up there by its id)."""
        if scope is None:
            self._routed(scope, "consume()")  # on one shard none is needed
            shard = next(iter(self.shards))
        else:
            shard = self.shard_for(scope)
        then = on_shard(shard, self._inboxes[shard].consume(subscriber=subscriber, message_id=message_id,
                                                            payload=payload, on_mismatch=on_mismatch, retry=retry))
        old = None if scope is None else self.claims.moving(scope)
        return then if old is None else self._consumed_before(old, subscriber, message_id, payload, on_mismatch,
                                                                retry, then)

    def _consumed_before(self, old: str, subscriber: str, message_id: str, payload: Any, on_mismatch: OnMismatch,
                         retry: RetryPolicy | None, then: Flow[Delivery]) -> Flow[Delivery]:
        before, core = self._inboxes[old], self.shards[old].claims.core
        try:
            found = yield from on_shard(old, core.retrying(
                lambda: transaction(before.recorded(subscriber, message_id, payload)), retry), alone=True)
        except RequestMismatch as mismatch:
            then.close()
            return mismatched(mismatch, on_mismatch)
        if not found:
            return (yield from then)
        then.close()
        return Delivery(Disposition.ACK, duplicate=True)

    def _looked_up(self, scope: str, operation: str, key: str, request: Any,
                   lease: timedelta | None) -> Flow[Outcome | None]:
        """The step-by-step `claim`'s look at a moving scope's old shard (None: claim on the caller's connection)."""
        if self.claims.moving(scope) is None:
            return None
        return (yield from self.claims.forwarded(self.claims.request(scope, operation, key, request, lease)))

    def _owner(self, conn: Any, scope: object | None = None) -> S:
        """The shard store a caller's connection belongs to (checked against `scope`'s shard where one is named)."""
        found = owner(self.shards, conn)
        if scope is not None:
            shard = self.shard_for(scope)
            if found != shard:
                raise CrossShard(f"scope {scope!r} lives on shard {shard!r}, but this connection is of shard {found!r}")
        return self.shards[found]

    @property
    def table_prefix(self) -> str:
        return self._first.table_prefix

    @property
    def features(self) -> Features:
        """The first shard's features: shards are expected to run one engine (what differs is where they are)."""
        return self._first.features

    @property
    def retries(self) -> Counter[str]:
        """Retries absorbed, by cause, on every shard since the stores were made."""
        return sum((s.retries for s in self.shards.values()), Counter())

    @property
    def retry(self) -> RetryPolicy:
        """The first shard's retry budget; setting it sets every shard's."""
        return self._first.retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        for store in self.shards.values():
            store.retry = policy

    @property
    def retention(self) -> timedelta:
        """The first shard's retention; setting it sets every shard's."""
        return self._first.retention

    @retention.setter
    def retention(self, window: timedelta) -> None:
        for store in self.shards.values():
            store.retention = window

    @property
    def encoder(self) -> Encoder | None:
        """The first shard's encoder; setting it sets every shard's."""
        return self._first.encoder

    @encoder.setter
    def encoder(self, encoder: Encoder | None) -> None:
        for store in self.shards.values():
            store.encoder = encoder

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        return self.claims.retry_cause(exc)
