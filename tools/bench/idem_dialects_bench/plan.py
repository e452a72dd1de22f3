"""The sync store benchmark's plan: its configuration and, per mode and repetition, which requests each worker sends."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

IDEM_MODES = ("first", "replay", "contention")
PLPGSQL_MODES = ("plpgsql_first", "plpgsql_replay")
MODES = ("bare", *IDEM_MODES, *PLPGSQL_MODES)
# Account ids: one block per workload, one account per worker (or per key class in `contention`).
ACCOUNT_BASE = {"bare": 1000, "first": 2000, "replay": 2000, "contention": 3000, "plpgsql_first": 4000,
                "plpgsql_replay": 4000, "memory": 5000}
MAX_WORKERS = 999


@dataclass(frozen=True)
class Config:
    workers: int = 1
    requests: int = 1000
    duplicates: float = 0.5
    repetitions: int = 5
    warmup: int = 100
    memory_check: int = 0
    profile: str | None = None
    added_latency_ms: float = 0.0  # added to each round trip of the pass through the counting proxy

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1-{MAX_WORKERS}")
        if self.requests < self.workers:
            raise ValueError("requests (per slice) must be at least the number of workers")
        if not 0.0 <= self.duplicates < 1.0:
            raise ValueError("duplicates must be a ratio in [0, 1)")
        if self.repetitions < 1 or self.warmup < 0 or self.memory_check < 0 or self.added_latency_ms < 0:
            raise ValueError("repetitions must be >= 1; warmup, memory_check and added_latency_ms >= 0")


Task = tuple[int, str]  # (account, key)


@dataclass
class Slice:
    """One mode's slice in one repetition: what each worker sends, and what the database must show after."""

    mode: str
    per_worker: list[list[Task]]
    expect_applied: int  # requests whose effect must run (the rest must replay)
    debits: Counter[int]  # account -> effects this slice must add
    new_keys: Counter[int]  # account -> distinct keys (records) this slice adds

    @property
    def size(self) -> int:
        return sum(len(w) for w in self.per_worker)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def plan(mode: str, tag: str, cfg: Config, first_keys: dict[str, dict[str, list[list[Task]]]]) -> Slice:
    """The requests of one slice. `first_keys` remembers each `first` slice so `replay` can resend it."""
    n, base = cfg.workers, ACCOUNT_BASE[mode]
    debits: Counter[int] = Counter()
    keys: Counter[int] = Counter()
    if mode == "contention":
        size = cfg.warmup if tag == "warmup" else cfg.requests
        distinct = max(1, size - round(size * cfg.duplicates))
        copies = [1] * distinct
        for j in range(size - distinct):
            copies[j % distinct] += 1
        # Copies of a key are consecutive, dealt round-robin: they reach different workers at the same moment.
        sequence = [k for k in range(distinct) for _ in range(copies[k])]
        per_worker: list[list[Task]] = [[] for _ in range(n)]
        for i, k in enumerate(sequence):
            per_worker[i % n].append((base + k % n, f"c{tag}-{k}"))
        for k in range(distinct):
            debits[base + k % n] += 1
            keys[base + k % n] += 1
        return Slice(mode, per_worker, distinct, debits, keys)
    if mode in ("replay", "plpgsql_replay"):
        source = first_keys["first" if mode == "replay" else "plpgsql_first"]
        per_worker = [list(tasks) for tasks in source[tag]] if tag in source else []
        return Slice(mode, per_worker, 0, debits, keys)
    per_worker = []
    for w, count in enumerate(_split(cfg.requests if tag != "warmup" else cfg.warmup, n)):
        acct = base + w
        per_worker.append([(acct, f"{mode[0]}{tag}-{w}-{i}") for i in range(count)])
        debits[acct] += count
        if mode != "bare":
            keys[acct] += count
    if mode in ("first", "plpgsql_first"):
        first_keys.setdefault(mode, {})[tag] = per_worker
    return Slice(mode, per_worker, sum(debits.values()), debits, keys)
