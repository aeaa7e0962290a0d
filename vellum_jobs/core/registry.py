"""The registry: job names to handlers, each the function that runs a job with its registered options.

This is the table a worker looks a job's name up in, with the resolvers
asked for names no ``@job`` registered. It knows nothing of enqueueing, so
running a job can use it without importing the enqueue side
(``vellum_jobs.enqueueing.job_function`` builds on it: ``JobFunction`` is a
``Handler`` that can also enqueue itself).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured

from vellum_jobs.core import limits
from vellum_jobs.core.options import MAX_KEY_LENGTH, Options
from vellum_jobs.exceptions import UnknownJob

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job

P = ParamSpec("P")
R = TypeVar("R")


class Handler(Generic[P, R]):
    """A function registered under a name, with its options; calling it calls the function."""

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
        # The schedule declared with @job(schedule=...); see vellum_jobs.maintenance.schedules.
        self.schedule = schedule
        self.signature = inspect.signature(func)
        # An ``async def``: its jobs run on a worker's event loop (``vellum_jobs.worker.event_loop``).
        self.is_async = inspect.iscoroutinefunction(func)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {describe(self.func)}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

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

    def limits_for(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> limits.Limits:
        """The limits (``core.limits``) a job with these arguments is started under."""
        options = self.options
        return limits.resolve(
            self.name, self.signature, args, kwargs,
            options.rate, options.concurrency_limits, options.rate_key,
        )  # fmt: skip


def _accepted(func: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    parameters = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(arguments)
    return {name: value for name, value in arguments.items() if name in parameters}


def describe(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


_handlers: dict[str, Handler[Any, Any]] = {}
_lock = threading.Lock()

# Jobs that no @job registered, such as Django tasks stored under their
# module path, are resolved by hooks: vellum_jobs.backends installs one for
# the jobs it enqueues. A resolver returns None for a job that is not its own,
# and raises ``Unresolvable`` for one of its own that this process cannot run.
Resolver = Callable[["Job"], "Handler[Any, Any] | None"]
_resolvers: list[Resolver] = []
# Names a resolver found unresolvable here: the worker row reports them
# (``Worker.unknown_tasks``), so that the unknown-name duty knows which
# live workers do not know them.
_unresolved: set[str] = set()


class Unresolvable(UnknownJob):
    """A resolver's job that this process cannot run: the code it names is not here (an older deploy)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name)
        self.reason = reason


def add(handler: Handler[Any, Any]) -> None:
    """Put ``handler`` under its name; ``ImproperlyConfigured`` if a different function has it."""
    with _lock:
        taken = _handlers.get(handler.name)
        # A module imported twice (autodiscovery, reloads) registers an equal
        # function again; only a different function is a conflict.
        if taken is not None and describe(taken.func) != describe(handler.func):
            raise ImproperlyConfigured(
                f"job name {handler.name!r} is already registered to {describe(taken.func)}; "
                f"cannot register {describe(handler.func)} under it too"
            )
        _handlers[handler.name] = handler


def remove(name: str) -> None:
    """Forget ``name`` (for tests that register throwaway jobs)."""
    with _lock:
        _handlers.pop(name, None)


def get(name: str) -> Handler[Any, Any]:
    """The handler registered under ``name``; ``UnknownJob`` if there is none."""
    try:
        return _handlers[name]
    except KeyError:
        raise UnknownJob(name) from None


def is_registered(name: str) -> bool:
    """Whether a ``@job`` registered ``name`` (no resolver asked)."""
    return name in _handlers


def add_resolver(resolver: Resolver) -> None:
    """Let ``resolver`` supply the handler of jobs whose name no @job registered."""
    with _lock:
        if resolver not in _resolvers:
            _resolvers.append(resolver)


def for_job(job: Job) -> Handler[Any, Any]:
    """The handler that runs ``job``: the one registered under its name, else a resolver's.

    ``UnknownJob`` if there is neither (``Unresolvable`` if a resolver owns
    it but cannot run it here). Registered names come first, so a ``@job``
    costs no more than a dictionary lookup.
    """
    try:
        return _handlers[job.name]
    except KeyError:
        pass
    for resolver in list(_resolvers):
        try:
            handler = resolver(job)
        except Unresolvable:
            with _lock:
                _unresolved.add(job.name)
            raise
        if handler is not None:
            if job.name in _unresolved:  # an import that failed once can succeed later
                with _lock:
                    _unresolved.discard(job.name)
            return handler
    raise UnknownJob(job.name)


def unresolved() -> list[str]:
    """The names of jobs a resolver found it cannot run in this process, sorted."""
    with _lock:
        return sorted(_unresolved)


def names() -> list[str]:
    """Every registered name, sorted."""
    return sorted(_handlers)


def registered() -> list[Handler[Any, Any]]:
    """Every registered handler, by name."""
    with _lock:
        return [_handlers[name] for name in sorted(_handlers)]


def has_concurrency_limits() -> bool:
    """Whether any registered job counts against a concurrency limit."""
    return any(handler.options.limited for handler in list(_handlers.values()))


def has_gated_jobs() -> bool:
    """Whether any registered job has limits a thread checks before it starts one (``core.limits``)."""
    return any(handler.options.gated for handler in list(_handlers.values()))


def has_coroutine_handlers() -> bool:
    """Whether any registered job is an ``async def``."""
    return any(handler.is_async for handler in list(_handlers.values()))
