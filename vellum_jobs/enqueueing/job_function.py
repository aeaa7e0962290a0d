"""The ``@job`` decorator, ``register``, the ``JobFunction`` wrapper they return, and autodiscovery.

Names, not module paths, identify a job: moving or renaming a function keeps
its queued jobs runnable as long as it is registered under the same name.
The registry itself, names to handlers, is ``vellum_jobs.core.registry``;
this module puts ``JobFunction``s in it and adds what enqueues. It imports
no model at import time, so ``from vellum_jobs import job`` works before the
app registry is ready: ``JobFunction.enqueue`` imports
``vellum_jobs.enqueueing.rows``, which needs the models, when first called.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from asgiref.sync import sync_to_async
from django.db import models

from vellum_jobs.core import limits, registry
from vellum_jobs.core.options import ConcurrencyKey, Options, UniqueKey, upstream_ids
from vellum_jobs.core.registry import Handler
from vellum_jobs.enqueueing.canvas import Step

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job

__all__ = ["JobFunction", "autodiscover", "functions", "get", "job", "register", "unregister"]

P = ParamSpec("P")
R = TypeVar("R")

# ``rate=``: one (rate, key) pair, like ("100/m", "customer:{customer_id}"), or a list of them.
RateOption = tuple[Any, limits.KeyTemplate] | Sequence[tuple[Any, limits.KeyTemplate]] | None


class JobFunction(Handler[P, R]):
    """A registered function: call it to run inline, ``enqueue`` it to run in a worker."""

    def using(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_after: datetime | None = None,
        delay: float | timedelta | None = None,
        ref: models.Model | None = None,
        timeout: float | timedelta | str | None = None,
        unique_key: UniqueKey | None = None,
        unique_while: str | None = None,
        on_conflict: str | None = None,
        after: Iterable[models.Model | int] | None = None,
        run_if: str | None = None,
        rate: RateOption = None,
        rate_key: str | None = None,
        concurrency: Mapping[Any, int] | None = None,
        fair_key: limits.KeyTemplate | None = None,
        fair_weight: int | None = None,
    ) -> JobFunction[P, R]:
        """A copy that enqueues with these options instead of the registered ones.

        ``after`` (jobs or ids) makes each job wait until they have ended, and
        ``run_if`` says when it runs then: "done" (the default: all ended done;
        it is cancelled as soon as one fails or is cancelled), "finished"
        (whatever they ended as) or "failed" (only if one did not end done).

        ``rate``, ``concurrency`` (a dict), ``fair_key`` and ``fair_weight`` replace
        the registered ones (see ``job``); ``rate_key`` is the key of every rate
        limit, for these jobs.

        ``delay`` and ``timeout`` are durations (seconds, a timedelta or "15m") of
        at most 100 years; any other raises ``ValueError`` naming it, here.
        """
        if run_after is not None and delay is not None:
            raise ValueError("pass run_after or delay, not both")
        given: dict[str, Any] = {
            "queue": queue,
            "priority": priority,
            "ref": ref,
            "timeout": timeout,
            "unique_key": unique_key,
            "unique_while": unique_while,
            "on_conflict": on_conflict,
            "after": None if after is None else upstream_ids(after),
            "run_if": run_if,
            "rate": None if rate is None else limits.rates(rate),
            "rate_key": rate_key,
            "concurrency_limits": None if concurrency is None else limits.concurrency(concurrency),
            "fair_key": None if fair_key is None else limits.fair_key(fair_key),
            "fair_weight": fair_weight,
        }
        changes = {key: value for key, value in given.items() if value is not None}
        # The later of two using() calls decides when the job runs.
        if run_after is not None or delay is not None:
            changes.update(run_after=run_after, delay=delay)
        return JobFunction(self.name, self.func, dataclasses.replace(self.options, **changes), self.schedule)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store a job that calls this function with these arguments; returns the queued ``Job``
        (waiting, with ``after=``)."""
        return self._enqueue([(args, kwargs)])[0]

    def s(self, *args: Any, **kwargs: Any) -> Step:
        """A step of a chain, group, workflow or batch callback: this function with these arguments,
        handed its upstream steps' results first."""
        return Step(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Step:
        """A step run with these arguments only, whatever its upstream steps returned."""
        return Step(self, args, kwargs, takes_result=False)

    def _enqueue(self, calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Job]:
        # Both need the models: see the module docstring.
        from vellum_jobs.enqueueing.rows import enqueue_calls
        from vellum_jobs.enqueueing.waiting import enqueue_after

        if self.options.after:
            return enqueue_after(self, calls, after=self.options.after, run_if=self.options.run_if)
        return enqueue_calls(self, calls)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """``enqueue`` for async code: the insert runs in Django's thread for sync code.

        As with the async ORM, no ``atomic()`` block is open there, so the job
        commits on its own when this returns. To enqueue in one transaction
        with other writes, put them and ``enqueue()`` in one sync function
        under ``atomic()`` and await it through ``sync_to_async``.
        """
        return await sync_to_async(self.enqueue)(*args, **kwargs)

    async def aenqueue_many(self, calls: Iterable[Mapping[str, Any] | Sequence[Any]]) -> list[Job]:
        """``enqueue_many`` for async code, committed on its own as ``aenqueue`` is."""
        return await sync_to_async(self.enqueue_many)(calls)

    def enqueue_many(self, calls: Iterable[Mapping[str, Any] | Sequence[Any]]) -> list[Job]:
        """Store one job per call in a single bulk insert.

        Each call is a dict of keyword arguments or a list/tuple of positional ones.
        """
        pairs: list[tuple[Sequence[Any], Mapping[str, Any]]] = []
        for i, call in enumerate(calls):
            if isinstance(call, Mapping):
                pairs.append(((), call))
            elif isinstance(call, (list, tuple)):
                pairs.append((call, {}))
            else:
                raise TypeError(
                    f"enqueue_many: call {i} is a {type(call).__qualname__}; "
                    "pass a dict of keyword arguments or a list/tuple of positional ones"
                )
        return self._enqueue(pairs)


def register(
    name: str,
    func: Callable[P, R],
    *,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int | None = None,
    backoff: float | timedelta | None = None,
    timeout: float | timedelta | str | None = None,
    unique_key: UniqueKey | None = None,
    unique_while: str = "queued",
    on_conflict: str = "keep",
    schedule: str | Mapping[str, Any] | None = None,
    concurrency_key: ConcurrencyKey | None = None,
    concurrency: int | Mapping[Any, int] | None = None,
    rate: RateOption = None,
    fair_key: limits.KeyTemplate | None = None,
    fair_weight: int = 1,
) -> JobFunction[P, R]:
    """Register ``func`` under ``name`` and return its ``JobFunction``."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError(f"a job name must be a non-empty string of up to 200 characters, got {name!r}")
    if isinstance(func, JobFunction):
        func = func.func
    if inspect.isasyncgenfunction(func):
        # A worker would get an async generator back and never run the body.
        raise TypeError(
            f"job {name!r}: {registry.describe(func)} is an async generator function; a job handler "
            "is a function or an async def that returns its result"
        )
    options = Options(
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        backoff=backoff,
        timeout=timeout,
        unique_key=unique_key,
        unique_while=unique_while,
        on_conflict=on_conflict,
        concurrency_key=concurrency_key,
        concurrency=None if isinstance(concurrency, Mapping) else concurrency,
        concurrency_limits=limits.concurrency(concurrency) if isinstance(concurrency, Mapping) else (),
        rate=limits.rates(rate),
        fair_key=None if fair_key is None else limits.fair_key(fair_key),
        fair_weight=fair_weight,
    )
    if options.concurrency_limits and concurrency_key is not None:
        raise ValueError(
            f"job {name!r}: concurrency_key names one key, concurrency={{...}} several; pass one or the other"
        )
    wrapper = JobFunction(name, func, options, schedule)
    registry.add(wrapper)
    return wrapper


def job(
    name: str,
    *,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int | None = None,
    backoff: float | timedelta | None = None,
    timeout: float | timedelta | str | None = None,
    unique_key: UniqueKey | None = None,
    unique_while: str = "queued",
    on_conflict: str = "keep",
    schedule: str | Mapping[str, Any] | None = None,
    concurrency_key: ConcurrencyKey | None = None,
    concurrency: int | Mapping[Any, int] | None = None,
    rate: RateOption = None,
    fair_key: limits.KeyTemplate | None = None,
    fair_weight: int = 1,
) -> Callable[[Callable[P, R]], JobFunction[P, R]]:
    """Register the decorated function as the job ``name``.

    ``timeout`` (seconds, a timedelta or "15m") bounds each attempt; see ``Job.check_timeout``.
    ``backoff`` (a duration too) is the first retry's delay, doubled per attempt. Durations are
    at most 100 years; any other raises ``ValueError`` naming it when the function is decorated.
    ``unique_key`` (a string, or a function of the job's arguments) makes it a unique job;
    see ``vellum_jobs.enqueueing.uniqueness``. ``schedule`` (a cron expression, or a dict like a
    ``SCHEDULES`` entry without "job") runs it on a schedule; see ``vellum_jobs.maintenance.schedules``.
    ``concurrency`` (default 1 when a key is given) jobs with the same
    ``concurrency_key`` (a string, or a function of the job's arguments; by
    default the job's name) run at once, across all workers. ``concurrency`` may
    instead be a dict of keys to limits, ``{"customer:{customer_id}": 2, "gpu": 1}``:
    a job then starts only while every one of its keys has room.
    ``rate`` is a ``(rate, key)`` pair, or a list of them: at most so many starts per
    period per key, across all workers, like ``("100/m", "customer:{customer_id}")``.
    A key is a string formatted with the job's arguments by name, or a function of them.
    Jobs over a limit wait; they never fail and never use an attempt. See
    ``vellum_jobs.core.limits``. Jobs with a ``fair_key`` (a key like those) take
    turns with other keys' jobs of their queue, ``fair_weight`` turns at a time.
    """

    def decorate(func: Callable[P, R]) -> JobFunction[P, R]:
        return register(
            name,
            func,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
            unique_key=unique_key,
            unique_while=unique_while,
            on_conflict=on_conflict,
            schedule=schedule,
            concurrency_key=concurrency_key,
            concurrency=concurrency,
            rate=rate,
            fair_key=fair_key,
            fair_weight=fair_weight,
        )

    return decorate


def get(name: str) -> JobFunction[Any, Any]:
    """The job function registered under ``name``; ``UnknownJob`` if there is none."""
    # register() is the only writer of the table, and it puts JobFunctions there.
    return cast("JobFunction[Any, Any]", registry.get(name))


def functions() -> list[JobFunction[Any, Any]]:
    """Every registered job function, by name."""
    return cast("list[JobFunction[Any, Any]]", registry.registered())


def unregister(name: str) -> None:
    """Forget ``name`` (for tests that register throwaway jobs)."""
    registry.remove(name)


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module so its decorators run."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
