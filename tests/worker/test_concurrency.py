"""Many threads and processes claiming at once: every job runs exactly once, no key past its limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.drain import drain
from tests.support.processes import ROOT, Runjobs, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution, Span
from vellum_jobs.core.models import Job, Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOBS = 1000


def assert_each_ran_exactly_once(created: list[Job]) -> None:
    counts = Counter(Execution.objects.values_list("job_id", flat=True))
    assert set(counts) == {j.pk for j in created}
    assert set(counts.values()) == {1}
    assert Job.objects.filter(state=Job.State.DONE).count() == JOBS
    assert not Job.objects.exclude(state=Job.State.DONE).exists()


def test_8_threads_run_1000_jobs_each_exactly_once():
    created = jobs.record.enqueue_many([(i,) for i in range(JOBS)])
    errors: list[BaseException] = []
    ran: list[int] = []

    def claimer() -> None:
        try:
            ran.append(drain())
        except BaseException as exc:  # noqa: BLE001 - reported below, e.g. "database is locked"
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sum(ran) == JOBS
    assert_each_ran_exactly_once(created)


def test_4_processes_run_1000_jobs_each_exactly_once():
    created = jobs.record.enqueue_many([(i,) for i in range(JOBS)])
    env = {**os.environ, "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"])}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.drain"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = finish(processes, timeout=120)
    assert [p.returncode for p in processes] == [0, 0, 0, 0], [err for _, err in results]
    assert all("locked" not in err for _, err in results)
    assert sum(int(out) for out, _ in results) == JOBS
    assert_each_ran_exactly_once(created)


def finish(processes: list[subprocess.Popen[str]], timeout: float) -> list[tuple[str, str]]:
    """Each process's output; past ``timeout``, kill them and fail saying where the queue and locks stood."""
    deadline = time.monotonic() + timeout
    try:
        return [p.communicate(timeout=max(0.1, deadline - time.monotonic())) for p in processes]
    except subprocess.TimeoutExpired:
        waits = transactions()
        for p in processes:
            p.kill()
        errors = [err[-2000:] for _, err in (p.communicate() for p in processes)]
        states = Counter(Job.objects.values_list("state", flat=True))
        pytest.fail(
            f"still running after {timeout}s; jobs by state: {dict(states)}; {waits}; stderr: {errors}"
        )


def transactions() -> str:
    """MariaDB's open transactions and what they wait for, for a failure's message."""
    if connection.vendor != "mysql":
        return "no lock report"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT trx_state, trx_started, trx_rows_locked, trx_wait_started, trx_query "
            "FROM information_schema.INNODB_TRX"
        )
        return f"transactions: {cursor.fetchall()}"


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at any moment (an end before a start at the same instant)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = current = 0
    for _, change in events:
        current += change
        most = max(most, current)
    return most


def overlapping(spans: list[tuple[str, int, int, float, float]]) -> list[tuple[str, int, int, float, float]]:
    """The spans that overlap another of their key, for a failure's message."""
    return [
        span
        for span in spans
        if any(o is not span and o[0] == span[0] and o[3] < span[4] and span[3] < o[4] for o in spans)
    ]


@pytest.mark.parametrize(("function", "limit"), [(jobs.keyed, 1), (jobs.keyed_pair, 2)])
def test_3_processes_of_4_threads_never_run_more_than_a_key_s_limit(function, limit):
    # Claiming nothing ahead, one process holds at most 4 of the 5 keys at
    # once, however late the others wake: the limits are held across processes.
    processes = [Runjobs("--workers", "4", "--prefetch", "0") for _ in range(3)]
    try:
        wait_for(lambda: Worker.objects.count() == 3, what="three workers")
        created = function.enqueue_many([(i % 5, 0.03) for i in range(200)])
        wait_for(
            lambda: not Job.objects.exclude(state=Job.State.DONE).exists(), timeout=120, what="all 200 jobs"
        )
    finally:
        for process in processes:
            process.signal(signal.SIGTERM)
        codes = [process.wait(30) for process in processes]
    assert codes == [0, 0, 0], [p.output()[1][-2000:] for p in processes]
    spans = list(Span.objects.values_list("key", "job_id", "pid", "started", "ended"))
    ran = Counter(job_id for _, job_id, _, _, _ in spans)
    attempts = dict(Job.objects.filter(attempts__gt=1).values_list("pk", "attempts"))
    assert sorted(ran) == sorted(j.pk for j in created), f"jobs run more than once: {attempts}"
    assert set(ran.values()) == {1}, ({pk: n for pk, n in ran.items() if n > 1}, attempts)
    # A process that finishes a keyed job claims the key's next one in the same
    # transaction, so a key tends to stay with one process; several took part.
    assert len({pid for _, _, pid, _, _ in spans}) >= 2, Counter(pid for _, _, pid, _, _ in spans)
    by_key: dict[str, list[tuple[float, float]]] = {}
    for key, _, _, started, ended in spans:
        by_key.setdefault(key, []).append((started, ended))
    assert len(by_key) == 5
    peaks = {key: most_at_once(intervals) for key, intervals in by_key.items()}
    assert max(peaks.values()) <= limit, (peaks, overlapping(spans))
    # Twelve threads and five keys: the limit is reached, not just respected.
    assert max(peaks.values()) == limit, peaks
    assert most_at_once([(s, e) for intervals in by_key.values() for s, e in intervals]) > limit


def test_a_key_held_by_a_killed_worker_frees_when_its_lease_lapses(tmp_path):
    release = tmp_path / "release"
    first = jobs.keyed.enqueue(1, 3600, str(release))
    holder = Runjobs("--workers", "2")
    other = None
    try:
        wait_for(lambda: Span.objects.filter(job_id=first.pk).exists(), what="the first job to start")
        second = jobs.keyed.enqueue(1, 0.01)
        other = Runjobs("--workers", "2")
        wait_for(lambda: Worker.objects.count() == 2, what="the second worker")
        holder.kill()
        # When the dead worker's lease lapses, on the spans' (monotonic) clock.
        lease_left = (Job.objects.get(pk=first.pk).lease_expires_at - timezone.now()).total_seconds()
        lapses_at = time.monotonic() + lease_left
        assert lease_left > 0.5
        release.touch()  # the first job's next attempt finishes at once
        # The dead worker's lease still holds the key: nothing of acct:1 may start.
        assert Job.objects.get(pk=second.pk).state == Job.State.QUEUED
        wait_for(lambda: Job.objects.get(pk=second.pk).state == Job.State.DONE, what="job two")
        wait_for(lambda: Job.objects.get(pk=first.pk).state == Job.State.DONE, what="job one")
        assert Job.objects.get(pk=first.pk).attempts == 2  # recovered from the dead worker, run again
        finished = Span.objects.filter(ended__isnull=False).order_by("started")
        (a_start, a_end), (b_start, _) = finished.values_list("started", "ended")
        # Both after the lease lapsed (give or take a clock tick), one at a time.
        assert a_start >= lapses_at - 0.05
        assert a_end <= b_start
    finally:
        holder.stop()
        if other is not None:
            other.signal(signal.SIGTERM)
            assert other.wait(30) == 0
