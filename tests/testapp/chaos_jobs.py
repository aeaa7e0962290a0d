"""The jobs of the whole-system randomized test (``tests/support/chaos.py``): each records its own runs.

A handler appends one JSON line per event to the file ``VELLUM_CHAOS_LOG``
names, with ``os.write`` on an ``O_APPEND`` descriptor: one write per line,
so lines of threads and processes sharing the file never interleave, and a
line written is kept whatever befalls the process next (SIGKILL included).
The record goes around the queue on purpose: the checker compares what the
handlers did with what the database says. Times are ``time.monotonic()``,
one clock for every process on the machine, true under libfaketime
(``tests/support/faketime.py``).

Every handler does the same work, told by its arguments: ``seconds`` of it
in steps of ``STEP``, noting a ``tick`` after each step; ``behave`` says
whether it stops early when ``should_stop()`` asks (``obey``), never looks
(``ignore``), or, for a coroutine, holds its event loop while it works
(``block``); ``fail`` fails that many first attempts after the work,
``retry`` raises ``Retry`` in that many first claims, ``throttle`` raises
``Throttled(throttle_key, seconds=throttle_seconds)`` in that many first claims.

A start notes the process's wall clock too (``wall``): on SQLite, which has
no clock of its own, the gate of a rate limit goes by it (``store.limit_gate``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from vellum_jobs import Retry, Throttled, current_job, job

LOG = "VELLUM_CHAOS_LOG"
STEP = 0.05
_descriptors: dict[str, int] = {}


def note(event: str, **fields: Any) -> None:
    """Append one event of the running attempt to the log, if this process has one."""
    path = os.environ.get(LOG)
    running = current_job()
    if not path or running is None:
        return
    line = {
        "e": event,
        "job": running.pk,
        "claim": running.claims,
        "attempt": running.attempts,
        "pid": os.getpid(),
        "key": running.concurrency_key,
        "t": time.monotonic(),
        **fields,
    }
    descriptor = _descriptors.get(path)
    if descriptor is None:
        descriptor = _descriptors[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(descriptor, (json.dumps(line) + "\n").encode())


def _started() -> None:
    """Note the start, with the attempt's deadline if it has one (never later than the real one:
    the clock is read before the time remaining is)."""
    running = current_job()
    assert running is not None
    now = time.monotonic()
    remaining = running.time_remaining
    note("start", deadline=None if remaining is None else now + remaining, wall=time.time())


def _asked_to_stop() -> str | None:
    """``should_stop()``, as the documented handler asks it: None, or the reason it was given.

    The reason is read before and after: reasons only ever rise in precedence
    (a flag set, a deadline passed), so the one ``should_stop()`` gave lies
    between, and when both reads agree it is that one.
    """
    running = current_job()
    assert running is not None
    before = running.stop_reason
    if not running.should_stop():
        return None
    after = running.stop_reason
    return after if before == after else f"{before} or {after}"


def _finish(
    fail: int,
    retry: int,
    retry_delay: float,
    throttle: int = 0,
    throttle_key: str = "",
    throttle_seconds: float = 0,
) -> str:
    """Note how the work ended, and end it so: a failure, a retry, a hold on a limit's key or a result."""
    running = current_job()
    assert running is not None
    if running.claims <= throttle:
        note("end", how="throttled")
        raise Throttled(throttle_key, seconds=throttle_seconds, reason="as asked")
    if running.claims <= retry:
        note("end", how="retry")
        raise Retry(retry_delay)
    if running.attempts <= fail:
        note("end", how="raised")
        raise RuntimeError(f"attempt {running.attempts} fails, as asked")
    note("end", how="finished")
    return "finished"


def work(
    seconds: float,
    behave: str = "obey",
    fail: int = 0,
    retry: int = 0,
    retry_delay: float = 0,
    **throttle: Any,
) -> str:
    """The work of every sync chaos job."""
    _started()
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if behave == "obey" and (reason := _asked_to_stop()):
            note("end", how=f"stopped: {reason}")
            return "stopped early"
        time.sleep(min(STEP, left))
        note("tick")
    return _finish(fail, retry, retry_delay, **throttle)


async def awork(
    seconds: float,
    behave: str = "obey",
    fail: int = 0,
    retry: int = 0,
    retry_delay: float = 0,
    **throttle: Any,
) -> str:
    """The work of every coroutine chaos job; a cancellation (timeout, cancel, shutdown) ends it."""
    _started()
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            if behave == "obey" and (reason := _asked_to_stop()):
                note("end", how=f"stopped: {reason}")
                return "stopped early"
            if behave == "block":
                time.sleep(min(STEP, left))  # holds the loop: nothing else on it runs meanwhile
            else:
                await asyncio.sleep(min(STEP, left))
            note("tick")
    except asyncio.CancelledError:
        note("end", how="cancelled")
        raise
    return _finish(fail, retry, retry_delay, **throttle)


# Few attempts and short backoffs, so that retries happen within a run. A unique job waits longer
# before its retry: while it waits its key must still return it.
ATTEMPTS, BACKOFF, UNIQUE_BACKOFF = 4, 0.3, 1.0


@job("test.chaos.sync", max_attempts=ATTEMPTS, backoff=BACKOFF)
def sync(**spec: Any) -> str:
    return work(**spec)


@job("test.chaos.async", max_attempts=ATTEMPTS, backoff=BACKOFF)
async def coroutine(**spec: Any) -> str:
    return await awork(**spec)


@job(
    "test.chaos.unique",
    unique_key=lambda slot, **spec: f"chaos-unique:{slot}",
    max_attempts=ATTEMPTS,
    backoff=UNIQUE_BACKOFF,
)
def unique(slot: int, **spec: Any) -> str:
    """One waits per slot: enqueueing the slot again returns the waiting job."""
    return work(**spec)


@job(
    "test.chaos.unique_running",
    unique_key=lambda slot, **spec: f"chaos-unique-running:{slot}",
    unique_while="queued_or_running",
    max_attempts=ATTEMPTS,
    backoff=UNIQUE_BACKOFF,
)
def unique_running(slot: int, **spec: Any) -> str:
    """One waits or runs per slot."""
    return work(**spec)


@job(
    "test.chaos.keyed",
    concurrency_key=lambda account: f"chaos-one:{account}",
    concurrency=1,
    max_attempts=ATTEMPTS,
    backoff=BACKOFF,
)
def keyed(account: int, **spec: Any) -> str:
    """At most one runs per account."""
    return work(**spec)


@job(
    "test.chaos.keyed_pair",
    concurrency_key=lambda account: f"chaos-two:{account}",
    concurrency=2,
    max_attempts=ATTEMPTS,
    backoff=BACKOFF,
)
def keyed_pair(account: int, **spec: Any) -> str:
    """At most two run per account."""
    return work(**spec)


@job(
    "test.chaos.async_keyed",
    concurrency_key=lambda account: f"chaos-async-two:{account}",
    concurrency=2,
    max_attempts=ATTEMPTS,
    backoff=BACKOFF,
)
async def async_keyed(account: int, **spec: Any) -> str:
    """At most two run per account, on event loops."""
    return await awork(**spec)


# Limits checked by the gate a thread passes just before it starts the handler: a rate on one
# of two keys (accounts 0 and 2 share one), and concurrency={...} on a key all accounts share and
# one per account. A short period, so that a run sees many windows of it, and bursts past it.
RATE = "4/2s"
GATED = {"chaos-gpu": 2, "chaos-tenant:{account}": 1}


def rate_key(account: int) -> str:
    return f"chaos-rate:{account % 2}"


@job("test.chaos.rated", rate=(RATE, rate_key), max_attempts=ATTEMPTS, backoff=BACKOFF)
def rated(account: int, **spec: Any) -> str:
    """At most four start per rate key in any two seconds."""
    return work(**spec)


@job("test.chaos.gated", concurrency=GATED, max_attempts=ATTEMPTS, backoff=BACKOFF)
def gated(account: int, **spec: Any) -> str:
    """At most two run at once, one per account."""
    return work(**spec)


@job(
    "test.chaos.async_gated",
    rate=(RATE, rate_key),
    concurrency=GATED,
    max_attempts=ATTEMPTS,
    backoff=BACKOFF,
)
async def async_gated(account: int, **spec: Any) -> str:
    """Both at once, on event loops: a slot of every limit, or none."""
    return await awork(**spec)
