"""The registry of job functions by name, the ``@job`` decorator, and autodiscovery.

Names, not module paths, identify a job: moving or renaming a function keeps
its queued jobs runnable as long as it is registered under the same name.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import models

from vellum_jobs.conf import parse_duration
from vellum_jobs.exceptions import UnknownJob

if TYPE_CHECKING:
    from vellum_jobs.models import Job

P = ParamSpec("P")
R = TypeVar("R")

# A concurrency key: a fixed string, or a function of (some of) the job's
# arguments, by name, that returns one.
ConcurrencyKey = str | Callable[..., str]
MAX_KEY_LENGTH = 255

MIN_PRIORITY, MAX_PRIORITY = -100, 100

# How long a unique job holds its key, and what enqueueing does while it does.
UNIQUE_WHILE = ("queued", "queued_or_running")
ON_CONFLICT = ("keep", "replace", "debounce")

UniqueKey = str | Callable[..., str | None]

_registry: dict[str, JobFunction[Any, Any]] = {}
_lock = threading.Lock()

# Jobs that no @job registered, such as Django tasks stored under their
# module path, are resolved by hooks: vellum_jobs.backends installs one for
# the jobs it enqueues. A resolver returns None for a job that is not its own.
Resolver = Callable[["Job"], "JobFunction[Any, Any] | None"]
_resolvers: list[Resolver] = []


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
        if self.timeout is not None and timeout_seconds(self.timeout) <= 0:
            raise ValueError(f"timeout must be longer than zero, got {self.timeout!r}")
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
        key = self.concurrency_key
        if key is not None and not callable(key) and not (isinstance(key, str) and key):
            raise ValueError(f"concurrency_key must be a non-empty string or a callable, got {key!r}")

    @property
    def limited(self) -> bool:
        """Whether jobs of this function count against a concurrency limit."""
        return self.concurrency_key is not None or self.concurrency is not None


def timeout_seconds(timeout: float | timedelta | str) -> float:
    try:
        return parse_duration(timeout)
    except ValueError as exc:
        raise ValueError(f"timeout: {exc}") from None


def check_priority(priority: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {priority}")


class JobFunction(Generic[P, R]):
    """A registered function: call it to run inline, ``enqueue`` it to run in a worker."""

    def __init__(
        self,
        name: str,
        func: Callable[P, R],
        options: Options,
        schedule: str | Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.func = func
        self.options = options
        # The schedule declared with @job(schedule=...); see vellum_jobs.schedules.
        self.schedule = schedule
        self.signature = inspect.signature(func)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<JobFunction {self.name!r} {describe(self.func)}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

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
    ) -> JobFunction[P, R]:
        """A copy that enqueues with these options instead of the registered ones."""
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
        }
        changes = {key: value for key, value in given.items() if value is not None}
        # The later of two using() calls decides when the job runs.
        if run_after is not None or delay is not None:
            changes.update(run_after=run_after, delay=delay)
        return JobFunction(self.name, self.func, dataclasses.replace(self.options, **changes), self.schedule)

    def concurrency_for(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, int]:
        """The (key, limit) a job with these arguments counts against; ("", 0) when unlimited.

        A callable key receives the job's arguments by name, only those it
        accepts (all of them if it takes ``**kwargs``), defaults filled in.
        """
        options = self.options
        if not options.limited:
            return "", 0
        limit = options.concurrency or 1
        key = options.concurrency_key
        if key is None:
            return self.name, limit
        if isinstance(key, str):
            return key, limit
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        value = key(**_accepted(key, bound.arguments))
        if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
            raise ValueError(
                f"concurrency_key of job {self.name!r} must return a non-empty string of up to "
                f"{MAX_KEY_LENGTH} characters, got {value!r}"
            )
        return value, limit

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store a job that calls this function with these arguments; returns the queued ``Job``."""
        from vellum_jobs.enqueueing import enqueue_calls

        return enqueue_calls(self, [(args, kwargs)])[0]

    def enqueue_many(self, calls: Iterable[Mapping[str, Any] | Sequence[Any]]) -> list[Job]:
        """Store one job per call in a single bulk insert.

        Each call is a dict of keyword arguments or a list/tuple of positional ones.
        """
        from vellum_jobs.enqueueing import enqueue_calls

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
        return enqueue_calls(self, pairs)


def _accepted(func: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    parameters = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(arguments)
    return {name: value for name, value in arguments.items() if name in parameters}


def describe(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


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
    concurrency: int | None = None,
) -> JobFunction[P, R]:
    """Register ``func`` under ``name`` and return its ``JobFunction``."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError(f"a job name must be a non-empty string of up to 200 characters, got {name!r}")
    if isinstance(func, JobFunction):
        func = func.func
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
        concurrency=concurrency,
    )
    wrapper = JobFunction(name, func, options, schedule)
    with _lock:
        taken = _registry.get(name)
        # A module imported twice (autodiscovery, reloads) registers an equal
        # function again; only a different function is a conflict.
        if taken is not None and describe(taken.func) != describe(func):
            raise ImproperlyConfigured(
                f"job name {name!r} is already registered to {describe(taken.func)}; "
                f"cannot register {describe(func)} under it too"
            )
        _registry[name] = wrapper
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
    concurrency: int | None = None,
) -> Callable[[Callable[P, R]], JobFunction[P, R]]:
    """Register the decorated function as the job ``name``.

    ``timeout`` (seconds, a timedelta or "15m") bounds each attempt; see ``Job.check_timeout``.
    ``unique_key`` (a string, or a function of the job's arguments) makes it a unique job;
    see ``vellum_jobs.uniqueness``. ``schedule`` (a cron expression, or a dict like a
    ``SCHEDULES`` entry without "job") runs it on a schedule; see ``vellum_jobs.schedules``.
    ``concurrency`` (default 1 when a key is given) jobs with the same
    ``concurrency_key`` (a string, or a function of the job's arguments; by
    default the job's name) run at once, across all workers.
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
        )

    return decorate


def get(name: str) -> JobFunction[Any, Any]:
    """The job function registered under ``name``; ``UnknownJob`` if there is none."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownJob(name) from None


def add_resolver(resolver: Resolver) -> None:
    """Let ``resolver`` supply the function of jobs whose name no @job registered."""
    with _lock:
        if resolver not in _resolvers:
            _resolvers.append(resolver)


def for_job(job: Job) -> JobFunction[Any, Any]:
    """The function that runs ``job``: the one registered under its name, else a resolver's.

    ``UnknownJob`` if there is neither. Registered names come first, so a
    ``@job`` costs no more than a dictionary lookup.
    """
    try:
        return _registry[job.name]
    except KeyError:
        pass
    for resolver in list(_resolvers):
        function = resolver(job)
        if function is not None:
            return function
    raise UnknownJob(job.name)


def names() -> list[str]:
    return sorted(_registry)


def functions() -> list[JobFunction[Any, Any]]:
    """Every registered job function, by name."""
    return [_registry[name] for name in sorted(_registry)]


def has_concurrency_limits() -> bool:
    """Whether any registered job counts against a concurrency limit."""
    return any(function.options.limited for function in list(_registry.values()))


def unregister(name: str) -> None:
    """Forget ``name`` (for tests that register throwaway jobs)."""
    with _lock:
        _registry.pop(name, None)


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module so its decorators run."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
