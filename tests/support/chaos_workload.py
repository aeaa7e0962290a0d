"""What the randomized test asks of the queue while faults strike: a seeded stream of enqueues and cancels.

A ``Client`` thread enqueues batches of the jobs of
``tests/testapp/chaos_jobs.py`` at random: quick ones in bulk (so that
workers claim ahead), longer ones that stop when asked or ignore the
request, coroutine ones, some that hold their event loop, failures,
``Retry``, timeouts, delays, unique keys enqueued again while their job
waits, keyed jobs over their limit, jobs under a rate limit or
``concurrency={...}`` (or both), some of which tell their key to slow down
(``Throttled``). Now and then it cancels a recent job.
A database that is down (a restart) fails the call: the client counts it
and goes on; a call whose reply was lost may still have written its job,
which is why the checker reads the jobs from the table, not from here.
"""

from __future__ import annotations

import functools
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connection

from tests.testapp import chaos_jobs
from vellum_jobs.core.models import Job
from vellum_jobs.registry import JobFunction

Spec = dict[str, Any]
Function = JobFunction[Any, Any]

# The plain jobs, a sync and a coroutine one; the unique ones; the keyed ones.
PLAIN: list[Function] = [chaos_jobs.sync, chaos_jobs.coroutine]
UNIQUE: list[Function] = [chaos_jobs.unique, chaos_jobs.unique_running]
KEYED: list[Function] = [chaos_jobs.keyed, chaos_jobs.keyed_pair, chaos_jobs.async_keyed]
# The jobs the gate checks before they start (a rate, concurrency={...}, both).
GATED: list[Function] = [chaos_jobs.rated, chaos_jobs.gated, chaos_jobs.async_gated]
# How long a handler that raises ``Throttled`` holds its key, seconds.
THROTTLE = (0.3, 1.5)


class Client(threading.Thread):
    """Enqueues and cancels jobs until ``stop`` is set."""

    def __init__(self, rng: random.Random, stop: threading.Event) -> None:
        super().__init__(name="chaos-client", daemon=True)
        self.rng = rng
        self.stop = stop
        self.counts: Counter[str] = Counter()  # calls by kind, and the failed ones
        self.recent: list[int] = []  # ids of jobs enqueued lately: what a cancel picks from
        self.error: BaseException | None = None

    def run(self) -> None:
        kinds = list(KINDS)
        weights = [KINDS[kind][0] for kind in kinds]
        try:
            while not self.stop.wait(self.rng.uniform(0.02, 0.3)):
                if self.rng.random() < 0.03:
                    self._call("cancel", self._cancel)
                    continue
                kind = self.rng.choices(kinds, weights)[0]
                self._call(kind, functools.partial(KINDS[kind][1], self))
        except BaseException as exc:  # noqa: BLE001 - reported by the run, which then fails
            self.error = exc
        finally:
            connection.close()

    def _call(self, kind: str, call: Callable[[], list[Job]]) -> None:
        try:
            created = call()
        except DatabaseError:
            self.counts[f"{kind} (database error)"] += 1
            connection.close()  # a restart broke it; the next call opens another
            return
        self.counts[kind] += 1
        self.recent = (self.recent + [job.pk for job in created])[-50:]

    def _cancel(self) -> list[Job]:
        if self.recent:
            Job.objects.filter(pk=self.rng.choice(self.recent)).cancel()
        return []

    # -- what each job does ------------------------------------------------

    def spec(self, low: float, high: float, behaviours: tuple[str, ...] = ("obey", "ignore")) -> Spec:
        """Work of ``low`` to ``high`` seconds; sometimes failing its first attempts (or all four)."""
        spec: Spec = {"seconds": round(self.rng.uniform(low, high), 3), "behave": self.rng.choice(behaviours)}
        fail = self.rng.choices([0, 1, 2, chaos_jobs.ATTEMPTS], [14, 3, 2, 1])[0]
        if fail:
            spec["fail"] = fail
        return spec

    def options(self, function: Function) -> Function:
        """``function``, sometimes delayed a little."""
        if self.rng.random() < 0.15:
            return function.using(delay=round(self.rng.uniform(0.3, 5), 2))
        return function

    def quick(self) -> list[Job]:
        function = self.rng.choice(PLAIN)
        calls = [{"seconds": round(self.rng.uniform(0, 0.01), 4)} for _ in range(self.rng.randint(5, 30))]
        return self.options(function).enqueue_many(calls)

    def medium(self) -> list[Job]:
        return [self.options(chaos_jobs.sync).enqueue(**self.spec(0.1, 1.0))]

    def long(self) -> list[Job]:
        spec = self.spec(1.0, 4.0)
        spec["behave"] = self.rng.choices(["obey", "ignore"], [1, 3])[0]
        return [self.options(chaos_jobs.sync).enqueue(**spec)]

    def coroutine(self) -> list[Job]:
        if self.rng.random() < 0.25:  # holding the loop: briefly, or every coroutine job waits
            return [chaos_jobs.coroutine.enqueue(**self.spec(0.02, 0.3, ("block",)))]
        return [self.options(chaos_jobs.coroutine).enqueue(**self.spec(0.1, 2.5, ("obey",)))]

    def timed(self) -> list[Job]:
        timeout = round(self.rng.uniform(0.3, 1.0), 2)
        function = self.rng.choice(PLAIN)
        spec = self.spec(timeout * 0.5, timeout * 3)
        if function.is_async:
            spec["behave"] = "obey"
        return [function.using(timeout=timeout).enqueue(**spec)]

    def retrying(self) -> list[Job]:
        spec = self.spec(0.0, 0.3)
        spec.update(retry=self.rng.randint(1, 2), retry_delay=round(self.rng.uniform(0, 1), 2))
        function = self.rng.choice(PLAIN)
        if function.is_async:
            spec["behave"] = "obey"
        return [self.options(function).enqueue(**spec)]

    def unique(self) -> list[Job]:
        """The same slot enqueued a few times in a row: one job waits, the others return it."""
        function = self.rng.choices(UNIQUE, [2, 1])[0]
        slot = self.rng.randrange(5 if function is chaos_jobs.unique else 3)
        return [
            self.options(function).enqueue(slot, **self.spec(0.0, 0.6)) for _ in range(self.rng.randint(1, 4))
        ]

    def keyed(self) -> list[Job]:
        function = self.rng.choice(KEYED)
        behaviours = ("obey",) if function.is_async else ("obey", "ignore")
        account = self.rng.randrange(3)
        return [
            self.options(function).enqueue(account, **self.spec(0.05, 0.6, behaviours))
            for _ in range(self.rng.randint(1, 4))
        ]

    def limited(self) -> list[Job]:
        """A few jobs of one account under its limits; a sync one sometimes holds its first key a moment."""
        function = self.rng.choice(GATED)
        behaviours = ("obey",) if function.is_async else ("obey", "ignore")
        account = self.rng.randrange(3)
        calls = []
        for _ in range(self.rng.randint(1, 5)):  # bursts past the rate, now and then
            spec = self.spec(0.05, 0.6, behaviours)
            if not function.is_async and self.rng.random() < 0.1:
                key = chaos_jobs.rate_key(account) if function is chaos_jobs.rated else "chaos-gpu"
                spec.update(
                    throttle=1, throttle_key=key, throttle_seconds=round(self.rng.uniform(*THROTTLE), 2)
                )
            calls.append(self.options(function).enqueue(account, **spec))
        return calls


# Each kind of call, with its weight.
KINDS: dict[str, tuple[int, Callable[[Client], list[Job]]]] = {
    "quick": (4, Client.quick),
    "medium": (4, Client.medium),
    "long": (2, Client.long),
    "coroutine": (3, Client.coroutine),
    "timed": (1, Client.timed),
    "retrying": (1, Client.retrying),
    "unique": (3, Client.unique),
    "keyed": (3, Client.keyed),
    "limited": (2, Client.limited),
}
