"""How a job is enqueued and run: the options of ``@job`` and ``using()``, checked when given.

Nothing here touches the database or the app registry, so options can be
built while a ``jobs.py`` module is imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from django.db import models

from vellum_jobs.conf import parse_duration
from vellum_jobs.core import limits

# A concurrency key: a fixed string, or a function of (some of) the job's
# arguments, by name, that returns one.
ConcurrencyKey = str | Callable[..., str]
MAX_KEY_LENGTH = 255

MIN_PRIORITY, MAX_PRIORITY = -100, 100

# How long a unique job holds its key, and what enqueueing does while it does.
UNIQUE_WHILE = ("queued", "queued_or_running")
ON_CONFLICT = ("keep", "replace", "debounce")

UniqueKey = str | Callable[..., str | None]

# When a job with upstream jobs runs: all ended done (else it is cancelled at
# once), whatever they ended as, or only if one did not end done.
RUN_IF = ("done", "finished", "failed")


def upstream_ids(after: Iterable[object]) -> tuple[int, ...]:
    """``after=`` as job ids: each a saved ``Job`` or a positive id; ``ValueError`` naming a bad one."""
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise ValueError(f"after must be a list of jobs or job ids, got {after!r}")
    ids = []
    for item in after:
        pk = getattr(item, "pk", item)
        if not isinstance(pk, int) or isinstance(pk, bool) or pk < 1:
            raise ValueError(f"after: {item!r} is neither a saved job nor a job id")
        ids.append(pk)
    return tuple(dict.fromkeys(ids))


@dataclasses.dataclass(frozen=True)
class Options:
    """How a job is enqueued; ``JobFunction.using`` returns a copy with some changed."""

    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None
    backoff: float | timedelta | None = None
    run_after: datetime | None = None
    delay: float | timedelta | None = None
    ref: models.Model | None = None
    timeout: float | timedelta | str | None = None
    unique_key: UniqueKey | None = None
    unique_while: str = "queued"
    on_conflict: str = "keep"
    concurrency_key: ConcurrencyKey | None = None
    concurrency: int | None = None
    # Upstream jobs (ids) a job waits for, and when it runs then (``RUN_IF``).
    after: tuple[int, ...] = ()
    run_if: str = "done"
    # Limits checked when a thread is about to start the job (``core.limits``):
    # rate limits, and ``concurrency={key: limit}`` (``concurrency`` stays the
    # one ``concurrency_key``'s limit, which the claim itself checks).
    rate: tuple[limits.Rate, ...] = ()
    concurrency_limits: tuple[limits.Concurrency, ...] = ()
    # ``using(rate_key=...)``: the key of every rate limit, for these jobs.
    rate_key: str | None = None
    # Jobs with a fair key take turns with other keys' jobs of their queue
    # (``enqueueing.fairness``); a weight of 3 takes three turns to another's one.
    fair_key: limits.KeyTemplate | None = None
    fair_weight: int = 1

    def __post_init__(self) -> None:
        check_priority(self.priority)
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError(f"queue must be a non-empty string, got {self.queue!r}")
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or self.max_attempts < 1
        ):
            raise ValueError(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        if self.run_after is not None and self.delay is not None:
            raise ValueError("pass run_after or delay, not both")
        if self.timeout is not None and seconds("timeout", self.timeout) <= 0:
            raise ValueError(f"timeout must be longer than zero, got {self.timeout!r}")
        if self.backoff is not None:
            seconds("backoff", self.backoff)
        if self.delay is not None:
            seconds("delay", self.delay)
        if self.unique_key is not None and not (
            (isinstance(self.unique_key, str) and 0 < len(self.unique_key) <= 255)
            or callable(self.unique_key)
        ):
            raise ValueError(
                "unique_key must be a string of 1 to 255 characters or a function of the job's "
                f"arguments that returns one, got {self.unique_key!r}"
            )
        if self.unique_while not in UNIQUE_WHILE:
            raise ValueError(
                f"unique_while must be one of {', '.join(UNIQUE_WHILE)}, got {self.unique_while!r}"
            )
        if self.on_conflict not in ON_CONFLICT:
            raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, got {self.on_conflict!r}")
        if self.concurrency is not None and (
            not isinstance(self.concurrency, int)
            or isinstance(self.concurrency, bool)
            or self.concurrency < 1
        ):
            raise ValueError(f"concurrency must be an integer >= 1, got {self.concurrency!r}")
        self._check_after()
        self._check_limits()
        key = self.concurrency_key
        if key is not None and not callable(key) and not (isinstance(key, str) and key):
            raise ValueError(f"concurrency_key must be a non-empty string or a callable, got {key!r}")

    def _check_after(self) -> None:
        if self.run_if not in RUN_IF:
            raise ValueError(f"run_if must be one of {', '.join(RUN_IF)}, got {self.run_if!r}")
        if self.after and self.unique_key is not None:
            # A waiting job does not hold its key, so two could wait with one.
            raise ValueError("a unique job cannot wait for others: pass after= or unique_key, not both")

    def _check_limits(self) -> None:
        key = self.rate_key
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= limits.MAX_KEY_LENGTH):
            raise ValueError(f"rate_key must be a string of 1 to 255 characters, got {key!r}")
        if key is not None and not self.rate:
            raise ValueError("rate_key is the key of the job's rate limits, and it has none: pass rate= too")
        weight = self.fair_weight
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise ValueError(f"fair_weight must be an integer from 1 to 100, got {weight!r}")

    @property
    def gated(self) -> bool:
        """Whether its jobs have limits a thread checks before it starts them (``core.limits``)."""
        return bool(self.rate or self.concurrency_limits)

    @property
    def limited(self) -> bool:
        """Whether jobs of this function count against a concurrency limit."""
        return self.concurrency_key is not None or self.concurrency is not None


def seconds(option: str, value: float | timedelta | str) -> float:
    """The seconds of a duration ``option``; ``ValueError`` naming the option and the value."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def check_priority(priority: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {priority}")
