"""Jobs the tests enqueue. Each records its runs in ``Execution`` so a test can count them."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from pathlib import Path

from asgiref.sync import sync_to_async

# Registers the randomized test's jobs, and the limits and fair-shares tests'.
from tests.testapp import chaos_jobs, fair_jobs, limit_jobs  # noqa: F401
from tests.testapp.models import Execution
from vellum_jobs import Fail, Retry, aset_progress, current_job, job, registry, set_progress, upstream


def _start(note: str = "") -> Execution:
    running = current_job()
    assert running is not None
    return Execution.objects.create(job_id=running.pk, attempt=running.attempts, pid=os.getpid(), note=note)


@job("test.record")
def record(value: object = None) -> object:
    execution = _start()
    Execution.objects.filter(pk=execution.pk).update(finished=True)
    return value


# Words of the reason the reaper leaves in a job whose lease lapsed (vellum_jobs.store.leases).
LEASE_LAPSED = ("worker lost", "lease expired")


@job("test.record_patiently", max_attempts=20, backoff=0)
def record_patiently(value: object = None) -> object:
    """``record`` with attempts to spare and no backoff; notes a run that follows a lapsed lease.

    The reaper leaves its reason in ``error`` when it requeues a job, and a
    claim does not clear it: a run that finds it there runs because the
    previous attempt's lease lapsed.
    """
    running = current_job()
    assert running is not None
    lapsed = any(words in (running.error or "").lower() for words in LEASE_LAPSED)
    execution = _start("after a lapsed lease" if lapsed else "")
    Execution.objects.filter(pk=execution.pk).update(finished=True)
    return value


@job("test.add")
def add(a: int, b: int) -> int:
    return a + b


@job("test.new_kind")
def new_kind(value: object = None) -> object:
    """A kind of job added in the latest release: a process of older code does not have it."""
    execution = _start()
    Execution.objects.filter(pk=execution.pk).update(finished=True)
    return value


# A runjobs of the code before ``test.new_kind`` was added (test_rolling_deploy).
if os.environ.get("VELLUM_TEST_OLD_CODE"):
    registry.unregister(new_kind.name)


@job("test.sleep")
def sleep(seconds: float, result: str = "slept", release_file: str = "") -> str:
    """Sleeps, or until ``release_file`` exists; records start and finish."""
    execution = _start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if release_file and Path(release_file).exists():
            break
        time.sleep(0.02)
    Execution.objects.filter(pk=execution.pk).update(finished=True)
    return result


@job("test.raise", max_attempts=3, backoff=0)
def raise_error(message: str = "boom") -> None:
    _start()
    raise ValueError(message)


@job("test.flaky", backoff=0)
def flaky(succeed_on: int) -> int:
    running = current_job()
    assert running is not None
    _start()
    if running.attempts < succeed_on:
        raise RuntimeError(f"attempt {running.attempts} fails")
    return running.attempts


@job("test.nonjson")
def nonjson() -> object:
    return {1, 2, 3}


def circular() -> list[object]:
    """A list that holds itself."""
    value: list[object] = []
    value.append(value)
    return value


def nested(levels: int) -> object:
    """A value of ``levels`` lists, one inside the other, around a number."""
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@job("test.unjsonable", max_attempts=2, backoff=0)
def unjsonable(how: str) -> object:
    """Returns a value JSON cannot hold: ``circular``, or lists nested ``how`` levels deep."""
    _start()
    return circular() if how == "circular" else nested(int(how))


@job("test.exit", max_attempts=1)
def exit_() -> None:
    sys.exit(3)


@job("test.interrupt", max_attempts=1)
def interrupt() -> None:
    raise KeyboardInterrupt


@job("test.retry")
def retry_me(delay: float = 60) -> None:
    _start()
    raise Retry(delay)


@job("test.fail")
def fail_now(reason: str = "bad input") -> None:
    raise Fail(reason)


@job("test.progress")
def progress(total: int) -> int:
    for i in range(1, total + 1):
        set_progress(i, total, f"step {i}")
    return total


@job("test.crash", max_attempts=3)
def crash() -> None:
    """Kills its own process, the way a segfault or the OOM killer would."""
    _start()
    os._exit(9)


@job("test.boom")
def boom() -> None:
    """Fails every time, with the default attempts and backoff."""
    raise RuntimeError("boom")


@job("test.cooperative", timeout=0.5, max_attempts=2, backoff=0)
def cooperative(seconds: float = 30) -> str:
    """Loops until its timeout, checking it like a well-behaved handler."""
    running = current_job()
    assert running is not None
    _start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        running.check_timeout()
        time.sleep(0.01)
    return "finished"


@job("test.stubborn", max_attempts=1)
def stubborn(seconds: float = 3600, release_file: str = "") -> str:
    """Ignores its timeout (set per call with .using(timeout=...)); stops early if ``release_file`` exists."""
    execution = _start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (release_file and Path(release_file).exists()):
        time.sleep(0.02)
    Execution.objects.filter(pk=execution.pk).update(finished=True)
    return "late"


@job("test.polite", max_attempts=2, backoff=0)
def polite(seconds: float = 30) -> str:
    """Stops early when its worker asks it to, noting why (``stop_reason``) in its execution."""
    running = current_job()
    assert running is not None
    execution = _start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if running.should_stop():
            Execution.objects.filter(pk=execution.pk).update(note=f"stopped: {running.stop_reason}")
            return "stopped early"
        time.sleep(0.01)
    return "finished"


@job("test.until_stopped", max_attempts=2, backoff=0)
def until_stopped(query: bool, seconds: float = 600) -> str:
    """The first attempt runs until its worker asks it to stop (``seconds`` at most); with ``query``
    it queries at every turn, so it may be inside an ORM call, where no request to stop reaches it,
    when its link to the database goes silent. A later attempt returns at once."""
    running = current_job()
    assert running is not None
    execution = _start()
    deadline = time.monotonic() + seconds
    while running.attempts == 1 and time.monotonic() < deadline:
        if running.should_stop():
            return "stopped early"
        if query:
            Execution.objects.filter(pk=execution.pk).exists()
        time.sleep(0.01)
    return "finished"


@job("test.stuck_first", timeout=0.5, max_attempts=2, backoff=0)
def stuck_first(release_file: str, seconds: float = 4) -> str:
    """Attempt 1 ignores its timeout until ``release_file`` exists; attempt 2 creates it, then
    ignores its own timeout for ``seconds`` (more than a lease in the tests)."""
    running = current_job()
    assert running is not None
    execution = _start()
    if running.attempts == 1:
        while not Path(release_file).exists():
            time.sleep(0.02)
    else:
        Path(release_file).touch()
        time.sleep(seconds)
    Execution.objects.filter(pk=execution.pk).update(finished=True)
    return f"attempt {running.attempts}"


@job("test.slow_to_stop", timeout=0.5, max_attempts=2, backoff=0)
def slow_to_stop(cleanup: float = 0.5) -> str:
    """Attempt 1 waits for its timeout, then takes ``cleanup`` seconds to come back (its worker has
    recorded the timeout by then); attempt 2 returns at once."""
    running = current_job()
    assert running is not None
    _start()
    if running.attempts == 1:
        while not running.should_stop():
            time.sleep(0.01)
        time.sleep(cleanup)
    return f"attempt {running.attempts}"


@job("test.unstorable_progress", max_attempts=3)
def unstorable_progress() -> str:
    """Leaves a progress figure no database column holds on its job (set_progress would refuse it)."""
    running = current_job()
    assert running is not None
    running.progress_done = 2**70
    return "returned"


@job("test.nul_result", max_attempts=3)
def nul_result() -> dict[str, str]:
    """Returns JSON with a NUL character, which PostgreSQL's jsonb would refuse."""
    return {"text": "a\x00b"}


@job("test.ugly_error", backoff=0)
def ugly_error(size: int) -> None:
    """Raises an error of ``size`` characters that ends with a NUL and a lone surrogate."""
    raise RuntimeError("x" * size + "\x00\udc80 the end")


@job("test.scan", unique_key=lambda library_id, note="": f"scan:{library_id}")
def scan(library_id: int, note: str = "") -> int:
    """A unique job: one scan per library waits at a time."""
    _start(note)
    return library_id


@job("test.chain")
def chain(a: int, b: int) -> str:
    """Enqueues a follow-up job, the way a scan enqueues per-item jobs."""
    follow_up = add.enqueue(a, b)
    return f"enqueued {follow_up.pk}"


def _span(key: str, seconds: float, release_file: str = "") -> None:
    from tests.testapp.models import Span

    running = current_job()
    assert running is not None
    span = Span.objects.create(key=key, job_id=running.pk, pid=os.getpid(), started=time.monotonic())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (release_file and Path(release_file).exists()):
        time.sleep(0.005)
    Span.objects.filter(pk=span.pk).update(ended=time.monotonic())


@job("test.keyed", concurrency_key=lambda account: f"acct:{account}", concurrency=1)
def keyed(account: int, seconds: float = 0.02, release_file: str = "") -> None:
    """At most one at a time per account; records when it ran."""
    _span(f"acct:{account}", seconds, release_file)


@job("test.keyed_pair", concurrency_key=lambda account: f"pair:{account}", concurrency=2)
def keyed_pair(account: int, seconds: float = 0.02) -> None:
    """At most two at a time per account; records when it ran."""
    _span(f"pair:{account}", seconds)


@job("test.wait_then_fail", backoff=0)
def wait_then_fail(release_file: str) -> None:
    """Waits for ``release_file``, ignoring should_stop(), then raises."""
    _start()
    while not Path(release_file).exists():
        time.sleep(0.01)
    raise RuntimeError("failed after the wait")


# -- coroutine jobs (run on the worker's event loop) --------------------------


async def _astart(note: str = "") -> Execution:
    running = current_job()
    assert running is not None
    return await Execution.objects.acreate(
        job_id=running.pk, attempt=running.attempts, pid=os.getpid(), note=note
    )


@job("test.async_add")
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@job("test.async_record")
async def async_record(value: object = None, seconds: float = 0.0) -> object:
    """Notes its run with the async ORM, awaits ``seconds``, and notes that it finished."""
    execution = await _astart()
    await asyncio.sleep(seconds)
    await Execution.objects.filter(pk=execution.pk).aupdate(finished=True)
    return value


@job("test.async_nap")
async def async_nap(seconds: float) -> None:
    """Awaits ``seconds``, then notes its run: one write per job, however many run at once."""
    await asyncio.sleep(seconds)
    await _astart()


@job("test.async_forever", max_attempts=3, backoff=0)
async def async_forever(marker: str, hours: float = 1.0) -> None:
    """Awaits for ``hours``; its ``finally:`` block writes ``marker``, so a test sees it was stopped."""
    await _astart()
    try:
        await asyncio.sleep(hours * 3600)
    finally:
        Path(marker).write_text(f"finally of attempt {current_job().attempts}")  # type: ignore[union-attr]


@job("test.async_collect")
async def async_collect(objects: int) -> float:
    """Collects ``objects`` unreachable cycles, each with a ``__del__``, on the loop (built off it);
    returns how long the collection took. Finalizers are Python code: the collector lets other
    threads run between them, as when it finalizes a lost database connection."""
    heap = await sync_to_async(_cycles, thread_sensitive=False)(objects)
    # No automatic collection, in any thread, between the clear and this one's: it would
    # take the garbage first (allocating a million objects makes one due).
    gc.disable()
    try:
        heap.clear()  # garbage now, which only a collection frees
        started = time.monotonic()
        gc.collect()
        return time.monotonic() - started
    finally:
        gc.enable()


class _Cycle:
    __slots__ = ("me",)

    def __init__(self) -> None:
        self.me: object = self

    def __del__(self) -> None:
        self.me = sum(range(30))  # a finalizer with some work in it, as a connection's has


def _cycles(count: int) -> list[_Cycle]:
    return [_Cycle() for _ in range(count)]


@job("test.async_slow_first", timeout=1, max_attempts=3, backoff=0)
async def async_slow_first() -> str:
    """Its first attempt awaits an hour (the timeout cancels it); the next returns at once."""
    running = current_job()
    assert running is not None
    await _astart()
    if running.attempts == 1:
        await asyncio.sleep(3600)
    return f"attempt {running.attempts}"


@job("test.async_orm")
async def async_orm(note: str) -> dict[str, object]:
    """Writes with the async ORM and reads back in sync ORM code under ``sync_to_async``."""
    execution = await _astart(note)

    def read_back() -> dict[str, object]:
        # Sync code still sees the running job: the context travels with sync_to_async.
        running = current_job()
        assert running is not None
        row = Execution.objects.get(pk=execution.pk)
        return {"note": row.note, "job": running.pk, "executions": Execution.objects.count()}

    seen = await sync_to_async(read_back)()
    seen["count"] = await Execution.objects.filter(job_id=execution.job_id).acount()
    return seen


@job("test.async_progress")
async def async_progress(steps: int) -> dict[str, object]:
    """Reports progress both ways and what its job says about stopping and time."""
    running = current_job()
    assert running is not None
    set_progress(1, steps, "set from the loop")
    await asyncio.sleep(0)
    await aset_progress(steps, steps, "awaited")
    running.check_timeout()
    return {"should_stop": running.should_stop(), "remaining": running.time_remaining}


@job("test.async_block")
async def async_block(seconds: float) -> str:
    """Blocks the event loop (a sync sleep in a coroutine): what a worker must report."""
    time.sleep(seconds)
    return "blocked"


@job("test.async_hold_sync_thread")
async def async_hold_sync_thread(release_file: str) -> str:
    """Holds asgiref's one thread for sync code (the async ORM's, shared by every coroutine job)
    until ``release_file`` exists, or a minute has passed."""

    def wait() -> None:
        deadline = time.monotonic() + 60
        while not Path(release_file).exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    await sync_to_async(wait)()
    return "released"


@job("test.async_block_logged")
async def async_block_logged(log_file: str, release_file: str) -> str:
    """Blocks the event loop (nothing can cancel it) until ``release_file`` exists, noting in
    ``log_file`` when each run starts and ends, with its pid: a test sees whether two runs
    overlapped. Two minutes at most, so that a failed test leaves no run behind for long."""
    with open(log_file, "a") as log:
        log.write(f"start {os.getpid()} {time.time()}\n")
    deadline = time.monotonic() + 120
    while not os.path.exists(release_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(log_file, "a") as log:
        log.write(f"end {os.getpid()} {time.time()}\n")
    return "blocked"


@job("test.async_fail", max_attempts=2, backoff=0)
async def async_fail(how: str) -> None:
    await asyncio.sleep(0)
    if how == "retry":
        raise Retry(delay=0)
    if how == "fail":
        raise Fail("told to")
    raise ValueError(how)


# -- workflows and batches ---------------------------------------------------


@job("wf.double")
def double(x: int) -> int:
    return x * 2


@job("wf.total")
def total(values: list[int], extra: int = 0) -> int:
    return sum(values) + extra


@job("wf.counts")
def counts(outcomes: dict[str, int], label: str = "") -> dict[str, object]:
    return {"label": label, **outcomes}


@job("wf.upstream")
def upstream_outcomes() -> list[list[object]]:
    return [[up.id, up.name, up.state, up.result] for up in upstream()]


# Workflow steps that note when their handler ran on the host's monotonic clock (``Span``), so a
# test run by several processes can order a step's start against its upstream steps' ends.


@job("wf.hold")
def hold(release_file: str, seconds: float = 60) -> str:
    """Runs until ``release_file`` exists (``seconds`` at most): many of them end at one instant."""
    _span("hold", seconds, release_file)
    return "held"


@job("wf.note")
def note(key: str, fail: bool = False) -> None:
    """Notes its run under ``key``; fails (no retry) if asked to."""
    _span(key, 0)
    if fail:
        raise Fail("told to")


@job("wf.gather")
def gather(results: list[object], key: str) -> int:
    """A step after a group: notes its run, returns how many results it was handed."""
    _span(key, 0)
    return len(results)


@job("wf.tally")
def tally(outcomes: dict[str, int], label: str) -> dict[str, object]:
    """A batch callback that notes its run."""
    _span(f"tally:{label}", 0)
    return {"label": label, **outcomes}
