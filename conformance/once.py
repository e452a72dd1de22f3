"""Exactly-once, counted: how many times each key's effect ran, as the database shows it, against how many times it
should have. The one check behind the consumer and outbox proofs and every benchmark (the harness imports it):
none lost, none applied twice, no effect more or less than expected."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Tally:
    effects: int  # effects that ran, in all
    expected: int  # effects that should have
    applied: int  # keys whose effect ran at least once
    lost: int  # keys whose effect ran fewer times than expected (for a key expected once: never)
    twice: int  # keys whose effect ran more times than expected

    @property
    def ok(self) -> bool:
        return self.effects == self.expected and not self.lost and not self.twice

    def __str__(self) -> str:
        return f"{self.effects} effects where {self.expected} were expected ({self.lost} keys short, {self.twice} over)"


def tally(ran: Mapping[K, int], expected: Mapping[K, int] | int) -> Tally:
    """`ran`: the effects per key, counted in the database; `expected`: the effects each key should have, or how
    many distinct keys were sent, each to run once (when the keys themselves are not known here)."""
    applied = sum(1 for n in ran.values() if n)
    if isinstance(expected, int):
        short = max(0, expected - applied)
        return Tally(sum(ran.values()), expected, applied, short, sum(1 for n in ran.values() if n > 1))
    keys = set(ran) | set(expected)
    short = sum(1 for k in keys if ran.get(k, 0) < expected.get(k, 0))
    over = sum(1 for k in keys if ran.get(k, 0) > expected.get(k, 0))
    return Tally(sum(ran.values()), sum(expected.values()), applied, short, over)
