"""Coroutine jobs: ``async def`` handlers on each worker's event loop, hundreds at once.

The process tests run real ``runjobs`` subprocesses; the others a worker in
a thread of the test process (``Background``), which runs the same loop.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from django.test import override_settings
from django.utils import timezone

from tests.support.processes import REAL_LEASE, Runjobs, wait_for
from tests.support.workers import Background
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs import testing
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.enqueueing import job_function
from vellum_jobs.execution import tracing
from vellum_jobs.worker.event_loop import EventLoop
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)


def row(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def finished(job: Job) -> bool:
    return row(job).state in Job.FINISHED_STATES


def started(job: Job) -> bool:
    return Execution.objects.filter(job_id=job.pk).exists()


def runs_per_job(job_ids: list[int]) -> Counter[int]:
    return Counter(Execution.objects.filter(job_id__in=job_ids).values_list("job_id", flat=True))


# -- registering and enqueueing ------------------------------------------------


def test_a_coroutine_job_is_registered_and_calling_it_returns_the_coroutine():
    coroutine = jobs.async_add(1, 2)
    assert inspect.iscoroutine(coroutine)
    assert asyncio.run(coroutine) == 3
    assert registry.get("test.async_add").is_async
    assert not registry.get("test.add").is_async


def test_its_jobs_are_marked_async_however_they_are_enqueued():
    one = jobs.async_add.enqueue(1, 2)
    many = jobs.async_add.enqueue_many([(3, 4), {"a": 5, "b": 6}])
    delayed = jobs.async_add.using(queue="later", priority=5, delay=60).enqueue(7, 8)
    plain = jobs.add.enqueue(1, 2)
    stored = dict(Job.objects.values_list("pk", "is_async"))
    assert [stored[job.pk] for job in (one, *many, delayed)] == [True] * 4
    assert stored[plain.pk] is False
    assert (row(delayed).queue, row(delayed).priority) == ("later", 5)


def test_an_async_generator_is_refused_with_the_reason():
    async def stream():
        yield 1

    with pytest.raises(TypeError, match="async generator function"):
        job_function.register("test.async_stream", stream)
    with pytest.raises(LookupError):
        registry.get("test.async_stream")


def test_aenqueue_stores_the_job_from_async_code():
    async def enqueue() -> tuple[Job, list[Job]]:
        return await jobs.async_add.aenqueue(2, 3), await jobs.async_add.aenqueue_many([(1, 1), (2, 2)])

    job, many = asyncio.run(enqueue())
    assert row(job).args == [2, 3] and row(job).is_async
    assert [row(j).args for j in many] == [[1, 1], [2, 2]]


def test_a_unique_coroutine_job_is_enqueued_once():
    unique = job_function.register("test.async_unique", _unique_body, unique_key="the one")
    try:
        first, second = unique.enqueue(), unique.enqueue()
        assert first.pk == second.pk
        assert Job.objects.filter(name="test.async_unique").count() == 1
    finally:
        job_function.unregister("test.async_unique")


async def _unique_body() -> str:
    return "unique"


# -- running them in tests -------------------------------------------------------


def test_run_jobs_awaits_coroutine_jobs_with_the_orm_of_the_test():
    job = jobs.async_orm.enqueue("from run_jobs")
    assert [ran.pk for ran in testing.run_jobs()] == [job.pk]
    stored = row(job)
    assert stored.state == Job.State.DONE, stored.error
    assert stored.result == {"note": "from run_jobs", "job": job.pk, "executions": 1, "count": 1}


def test_inline_mode_awaits_a_coroutine_job_when_it_is_enqueued():
    with override_settings(VELLUM_JOBS={"RUN_INLINE": True}):
        job = jobs.async_add.enqueue(20, 22)
    stored = row(job)
    assert (stored.state, stored.result) == (Job.State.DONE, 42)


# -- on a worker's event loop -------------------------------------------------------


def test_a_worker_runs_coroutine_jobs_beside_its_threads():
    worker = Background(threads=1, async_workers=10)
    try:
        coroutine, plain = jobs.async_add.enqueue(1, 2), jobs.add.enqueue(3, 4)
        wait_for(lambda: finished(coroutine) and finished(plain), what="both jobs")
        assert (row(coroutine).state, row(coroutine).result) == (Job.State.DONE, 3)
        assert (row(plain).state, row(plain).result) == (Job.State.DONE, 7)
        assert worker.worker.loop is not None and worker.worker.loop.thread is not None
        assert Worker.objects.get(pk=worker.worker.id).async_workers == 10
    finally:
        worker.stop()


@override_settings(TASKS={})  # no Django task a worker could only tell apart once it runs
def test_a_process_without_coroutine_jobs_has_no_loop(monkeypatch):
    monkeypatch.setattr(registry, "has_coroutine_handlers", lambda: False)
    worker = Background(threads=1, async_workers=10)
    try:
        plain = jobs.add.enqueue(3, 4)
        wait_for(lambda: finished(plain), what="the job")
        assert worker.worker.loop is None
        assert Worker.objects.get(pk=worker.worker.id).async_workers == 0
    finally:
        worker.stop()


def test_the_loop_starts_with_the_first_coroutine_job():
    worker = Background(threads=1, async_workers=10)
    try:
        plain = jobs.add.enqueue(3, 4)
        wait_for(lambda: finished(plain), what="the sync job")
        loop = worker.worker.loop
        assert loop is not None and loop.thread is None
        coroutine = jobs.async_add.enqueue(1, 2)
        wait_for(lambda: finished(coroutine), what="the coroutine job")
        assert loop.thread is not None and loop.thread.is_alive()
    finally:
        worker.stop()
    assert not loop.thread.is_alive()


def test_an_event_loop_whose_thread_fails_before_it_starts_is_an_error_not_a_hang(monkeypatch, caplog):
    def fails(self):
        raise ImportError("cannot import name 'trace' (an import deadlock between two threads)")

    monkeypatch.setattr(EventLoop, "_new_loop", fails)
    loop = EventLoop(10, uuid.uuid4(), threading.Event(), lambda: None)
    raised: list[BaseException] = []

    def start() -> None:
        try:
            loop._loop()
        except BaseException as exc:  # noqa: BLE001 - what the dispatcher's thread would see
            raised.append(exc)

    dispatcher = threading.Thread(target=start, daemon=True)
    dispatcher.start()
    dispatcher.join(60)
    assert not dispatcher.is_alive(), "the dispatcher waits for the loop's thread for ever"
    (error,) = raised
    assert isinstance(error, RuntimeError) and "failed before it started" in str(error)
    assert "event loop not started" in caplog.text and "import deadlock" in caplog.text


def test_opentelemetry_is_imported_before_any_thread_of_the_worker_starts(monkeypatch):
    """Two threads importing OpenTelemetry's modules for the first time at once can fail with an
    import deadlock: the worker's own thread imports them before it starts any other."""
    threads_at_prepare: list[set[threading.Thread]] = []
    prepare = tracing.prepare

    def recording() -> None:
        threads_at_prepare.append(set(threading.enumerate()))
        prepare()

    monkeypatch.setattr(tracing, "prepare", recording)
    jobs.async_add.enqueue(1, 2)
    # An earlier test's worker may leave a thread that is still on its way out (a listener
    # between two waits): only the threads that start after this one is built are its own.
    before = set(threading.enumerate())
    worker = WorkerProcess(WorkerOptions(threads=1, burst=True, async_workers=10))
    assert worker.run() == 0
    first, *_ = threads_at_prepare
    started_first = {thread.name for thread in first - before}
    assert not started_first, started_first


def test_async_workers_0_leaves_coroutine_jobs_to_other_workers():
    worker = Background(threads=1, async_workers=0)
    try:
        coroutine, plain = jobs.async_add.enqueue(1, 2), jobs.add.enqueue(3, 4)
        wait_for(lambda: finished(plain), what="the sync job")
        time.sleep(0.5)  # a few dispatcher cycles: the coroutine job must stay queued through them
        assert row(coroutine).state == Job.State.QUEUED
    finally:
        worker.stop()


def test_a_coroutine_job_uses_the_async_orm_and_sync_to_async():
    worker = Background(threads=1)
    try:
        job = jobs.async_orm.enqueue("async ORM")
        wait_for(lambda: finished(job), what="the job")
    finally:
        worker.stop()
    stored = row(job)
    assert stored.state == Job.State.DONE, stored.error
    assert stored.result == {"note": "async ORM", "job": job.pk, "executions": 1, "count": 1}


def test_progress_should_stop_and_timeouts_answer_inside_a_coroutine_job():
    worker = Background(threads=1)
    try:
        job = jobs.async_progress.enqueue(5)
        wait_for(lambda: finished(job), what="the job")
    finally:
        worker.stop()
    stored = row(job)
    assert stored.state == Job.State.DONE, stored.error
    assert stored.result == {"should_stop": False, "remaining": None}
    assert (stored.progress_done, stored.progress_total, stored.progress_message) == (5, 5, "awaited")


@pytest.mark.parametrize(
    ("how", "state", "attempts", "error"),
    [
        ("retry", Job.State.QUEUED, 0, ""),
        ("fail", Job.State.FAILED, 1, "failed by the handler: told to"),
        ("boom", Job.State.FAILED, 2, "ValueError: boom"),
    ],
)
def test_retry_fail_and_raising_end_a_coroutine_job_as_they_end_any_job(how, state, attempts, error):
    worker = Background(threads=1)
    try:
        job = jobs.async_fail.enqueue(how)
        if how == "retry":  # it asks again every time: wait for a few runs
            wait_for(lambda: row(job).claims >= 3, what="three runs")
        else:
            wait_for(lambda: finished(job), what="the job")
    finally:
        worker.stop()
    stored = row(job)
    assert (stored.state, stored.attempts) == (state, attempts)
    assert error in stored.error


def test_a_coroutine_job_s_failure_is_recorded_while_another_holds_the_thread_for_sync_code(tmp_path):
    """The tidy-up after a failure runs in asgiref's thread for sync code too: it must not stand
    between the outcome and the record while another job's sync call holds that thread."""
    release = tmp_path / "release"
    worker = Background(threads=1, async_workers=4)
    try:
        holder = jobs.async_hold_sync_thread.enqueue(str(release))
        wait_for(lambda: row(holder).state == Job.State.RUNNING, what="the job holding the sync thread")
        failing = jobs.async_fail.enqueue("boom")
        wait_for(lambda: finished(failing), what="the failing job's outcomes")
        assert not release.exists() and row(holder).state == Job.State.RUNNING
        assert (row(failing).state, row(failing).attempts) == (Job.State.FAILED, 2)
        assert "ValueError: boom" in row(failing).error
    finally:
        release.touch()
        worker.stop()
    assert row(holder).state == Job.State.DONE


def blocked_loop_warnings(
    caplog: pytest.LogCaptureFixture, enqueue: Callable[[], list[Job]]
) -> tuple[list[Job], list[str]]:
    """The jobs ``enqueue`` makes, run by a worker of this process, and its "blocked the event
    loop" warnings."""
    worker = Background(threads=1)
    try:
        with caplog.at_level(logging.WARNING, logger="vellum_jobs"):
            many = enqueue()
            wait_for(lambda: all(finished(job) for job in many), what="the jobs")
    finally:
        worker.stop()
    return many, [r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()]


def test_a_blocking_call_in_a_coroutine_job_is_reported_with_its_job(caplog):
    (job,), blocked = blocked_loop_warnings(caplog, lambda: [jobs.async_block.enqueue(0.6)])
    assert blocked, [r.getMessage() for r in caplog.records]
    assert f"job_id={job.pk} name=test.async_block" in blocked[0]
    assert "testapp/jobs.py" in blocked[0]  # the line it blocks on


# Long awaits are not stalls: only a loop that gets no turn is. (A threshold
# a loaded test machine's scheduling cannot reach, and awaits twice as long.)
@override_settings(VELLUM_JOBS={"ASYNC_BLOCKED_WARNING": 0.5})
def test_a_coroutine_job_that_never_blocks_is_not_reported(caplog):
    _, blocked = blocked_loop_warnings(
        caplog, lambda: jobs.async_record.enqueue_many([(i, 1.0) for i in range(20)])
    )
    assert not blocked


# A collection of garbage may start on the loop's thread whenever a job's
# code allocates; the pause is the collector's. (Here the job runs one itself,
# which is how a test can make one take longer than the threshold.)
@override_settings(VELLUM_JOBS={"ASYNC_BLOCKED_WARNING": 0.15})
def test_time_the_loop_spends_collecting_garbage_is_not_reported(caplog):
    (job,), blocked = blocked_loop_warnings(caplog, lambda: [jobs.async_collect.enqueue(1_000_000)])
    stored = row(job)
    assert stored.state == Job.State.DONE, stored.error
    assert stored.result > 0.15, stored.result  # the collection held the loop past the threshold
    assert not blocked


# Thread.start waits on the calling thread until the new thread runs, which
# a busy machine can make take longer than the threshold: the loop starts the
# threads for sync code before any job, so a job's first sync_to_async call
# does not wait for one on the loop. (Slowed here to make it certain.)
@override_settings(VELLUM_JOBS={"ASYNC_BLOCKED_WARNING": 0.15})
def test_a_job_s_first_sync_to_async_call_does_not_wait_on_the_loop_for_a_thread_to_start(
    caplog, monkeypatch
):
    start = threading.Thread.start

    def slow_start(thread: threading.Thread) -> None:
        if thread.name.startswith("asyncio"):  # the loop's executor, where sync_to_async runs code
            time.sleep(0.6)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    (job,), blocked = blocked_loop_warnings(caplog, lambda: [jobs.async_collect.enqueue(10)])
    assert row(job).state == Job.State.DONE, row(job).error
    assert not blocked


@pytest.mark.slow
def test_a_process_stopped_while_its_coroutine_job_awaits_reports_no_blocked_loop():
    # SIGSTOP is a machine too busy to give the process a core: every
    # thread waits, the loop in its selector as much as the watch. A late
    # turn then is not a job holding the loop. Three stops, since after
    # SIGCONT either thread may run first.
    worker = Runjobs("--workers", "1", "--async-workers", "5")
    try:
        job = jobs.async_record.enqueue("slept", 30.0)
        wait_for(lambda: started(job), what="the job to start")
        for _ in range(3):
            worker.signal(signal.SIGSTOP)
            time.sleep(0.5)  # the length of the stop, 5 x ASYNC_BLOCKED_WARNING: not a wait for a condition
            worker.signal(signal.SIGCONT)
            time.sleep(0.2)  # a turn for both threads before the next stop
        job.cancel()
        wait_for(lambda: row(job).state == Job.State.CANCELLED, what="the job cancelled")
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    assert "blocked the event loop" not in worker.output()[1]


def test_coroutine_jobs_with_a_concurrency_key_run_one_at_a_time():
    keyed = job_function.register("test.async_keyed", _keyed_body, concurrency_key="k", concurrency=1)
    worker = Background(threads=1, async_workers=20)
    try:
        many = keyed.enqueue_many([(i,) for i in range(6)])
        wait_for(lambda: all(finished(job) for job in many), what="the keyed jobs")
    finally:
        worker.stop()
        job_function.unregister("test.async_keyed")
    spans = sorted(tuple(job.result) for job in Job.objects.filter(name="test.async_keyed"))
    assert len(spans) == 6
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, spans


async def _keyed_body(i: int) -> list[float]:
    start = time.monotonic()
    await asyncio.sleep(0.05)
    return [start, time.monotonic()]


# -- real runjobs processes ------------------------------------------------------------


def most_at_once(many: list[Job]) -> int:
    """The most of ``many`` that were running at one instant, by their rows' start and finish."""
    rows = Job.objects.filter(pk__in=[job.pk for job in many]).values_list("started_at", "finished_at")
    edges = sorted(edge for started, finished in rows for edge in ((started, 1), (finished, -1)))
    return max(itertools.accumulate(step for _, step in edges))


@pytest.mark.slow
def test_a_thousand_waiting_coroutine_jobs_drain_through_one_process_at_once():
    many = jobs.async_nap.enqueue_many([(0.5,)] * 1000)
    worker = Runjobs("--burst", "--workers", "2", "--async-workers", "200", env=REAL_LEASE)
    code = worker.wait(timeout=90)
    assert code == 0, worker.output()[1][-3000:]
    assert Job.objects.filter(state=Job.State.DONE).count() == 1000
    assert set(runs_per_job([job.pk for job in many]).values()) == {1}  # each exactly once
    # At once, not one after another: counted from the jobs' own start and finish times (a
    # duration would also count how busy the machine was). One at a time, at most 1 overlaps.
    assert most_at_once(many) >= 20


@pytest.mark.runjobs
def test_a_coroutine_job_past_its_timeout_is_cancelled_and_its_next_attempt_runs():
    worker = Runjobs("--workers", "1", "--async-workers", "5")
    try:
        job = jobs.async_slow_first.enqueue()
        wait_for(lambda: finished(job), what="the retried job")
        stored = row(job)
        assert (stored.state, stored.result, stored.attempts) == (Job.State.DONE, "attempt 2", 2)
        # Within a few seconds of its start, as its worker timed it (the test's clock would also
        # count the process's start on a loaded machine).
        (first,) = stored.attempt_errors
        assert first["outcome"] == "timed out" and first["duration"] < 5, first
        assert sorted(Execution.objects.filter(job_id=job.pk).values_list("attempt", flat=True)) == [1, 2]
        # Its loop cancelled it at the deadline (not the worker's backstop for a blocked loop).
        assert f"its coroutine was cancelled job_id={job.pk}" in worker.output()[1]
        # Nothing is left behind: no stuck slot, nothing running on the loop.
        wait_for(lambda: Worker.objects.filter(async_running=0, stuck=0).exists(), what="an idle worker row")
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0


@pytest.mark.runjobs
def test_a_cancelled_coroutine_job_stops_at_once_and_runs_its_finally_block(tmp_path):
    marker = tmp_path / "finally"
    worker = Runjobs("--workers", "1")
    try:
        job = jobs.async_forever.enqueue(str(marker))
        wait_for(lambda: started(job), what="the job to start")
        assert job.cancel() is True
        wait_for(lambda: row(job).state == Job.State.CANCELLED, what="cancelled")
        assert marker.read_text() == "finally of attempt 1"
        assert "the handler stopped" in row(job).error
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0


@pytest.mark.runjobs
def test_sigterm_hands_back_sleeping_coroutine_jobs_after_the_grace_period(tmp_path):
    many = [jobs.async_forever.enqueue(str(tmp_path / f"finally-{i}"), 1 / 60) for i in range(50)]
    worker = Runjobs("--workers", "1", "--grace", "1")
    wait_for(lambda: Execution.objects.count() == 50, what="all 50 jobs to start")
    # Its heartbeat records how much of the loop is in use (the admin's worker list shows it).
    wait_for(lambda: Worker.objects.filter(async_running=50, async_workers=100).exists(), what="the row")
    stopped_at = timezone.now()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert "50 jobs handed back at shutdown, due now count=50" in worker.output()[1]
    for job in many:
        stored = row(job)
        assert (stored.state, stored.attempts) == (Job.State.QUEUED, 0), (stored.pk, stored.error)
        # Due from the moment the worker handed it back, by its clock (the database's as it
        # measured it: the test's, to a few milliseconds): after the 1 s grace, not the default
        # 30 s, nor never. The bound is loose for a host running six test cells; how long the
        # interpreter then takes to exit is not the worker's to promise.
        handed_after = (stored.run_after - stopped_at).total_seconds()
        assert 0.9 <= handed_after < 10, f"handed back {handed_after:.1f}s after SIGTERM"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"finally-{i}" for i in range(50))


@pytest.mark.slow
def test_a_job_whose_handler_still_runs_at_shutdown_is_not_run_by_another_worker_meanwhile(tmp_path):
    """A coroutine job that blocks its loop cannot be cancelled: its job is released only as its
    process exits, and no other worker starts it before then."""
    log, release = tmp_path / "runs", tmp_path / "release"
    job = jobs.async_block_logged.enqueue(str(log), str(release))
    stopping = Runjobs("--workers", "1", "--grace", "0.3", env=REAL_LEASE)
    wait_for(lambda: log.exists(), what="the first run to start")
    idle = Runjobs("--workers", "1", env=REAL_LEASE)
    try:
        wait_for(lambda: Worker.objects.filter(pid=idle.pid).exists(), what="the idle worker")
        stopping.signal(signal.SIGTERM)
        stopping.wait(timeout=30)
        exited_at = time.time()
        wait_for(lambda: len(log.read_text().splitlines()) >= 2, what="a second run to start")
        starts = [line.split() for line in log.read_text().splitlines() if line.startswith("start")]
        assert [int(pid) for _, pid, _ in starts] == [stopping.pid, idle.pid]
        second_started = float(starts[1][2])
        assert second_started > exited_at - 0.05, "the second run started while the first could still run"
        assert f"end {stopping.pid}" not in log.read_text()
        release.touch()
        wait_for(lambda: row(job).state == "done", what="the second run to finish")
    finally:
        release.touch()
        idle.stop()
        stopping.stop()
    assert row(job).claims == 2


@pytest.mark.slow
def test_sync_and_coroutine_jobs_in_one_process_each_run_exactly_once():
    plain = jobs.record.enqueue_many([(i,) for i in range(150)])
    coroutines = jobs.async_record.enqueue_many([(i, 0.01) for i in range(150)])
    worker = Runjobs("--burst", "--workers", "3", "--async-workers", "40", env=REAL_LEASE)
    assert worker.wait(timeout=60) == 0, worker.output()[1][-3000:]
    ids = [job.pk for job in plain + coroutines]
    not_done = Job.objects.filter(pk__in=ids).exclude(state=Job.State.DONE)
    assert not not_done.exists(), (
        list(not_done.values("id", "name", "state", "attempts", "run_after", "error")),
        worker.output()[1][-3000:],
    )
    runs = runs_per_job(ids)
    assert set(runs.values()) == {1} and len(runs) == 300
