"""Two workers drain jobs while a few percent of their database statements fail (support.faultinjection).

Replay a run with ``VELLUM_TEST_FAULTS_SEED=<seed>``, and narrow the errors
with ``VELLUM_TEST_FAULTS_ERRORS=OperationalError,InterfaceError`` (both pass
through to the workers); the summary printed at the end names the seed, what
was injected where, and how the jobs ended.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.utils import timezone

from tests.support.faultinjection import read_log
from tests.support.processes import Runjobs, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.conf import conf
from vellum_jobs.core.models import Job, Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOBS = 1000
RATE = "0.05"
SEED = os.environ.get("VELLUM_TEST_FAULTS_SEED", "1")
DRAIN_DEADLINE = 150.0  # a loaded CI machine runs the 1,000 jobs in 15-45 s; a quiet one in 8
LAPSED_NOTE = "after a lapsed lease"  # what jobs.record_patiently notes

# (job id, attempt, finished, note): one handler run, from its Execution row.
Run = tuple[int, int, bool, str]


def test_workers_ride_out_injected_database_errors(tmp_path):
    log = str(tmp_path / "faults.jsonl")
    created = jobs.record_patiently.enqueue_many([(i,) for i in range(JOBS)])
    ids = {j.pk for j in created}
    started = time.monotonic()
    workers = [
        Runjobs(
            "--workers",
            "4",
            # Django's system checks query the database too (SQLite's JSON
            # support): an error there is the start failing, not the worker.
            "--skip-checks",
            env={
                "VELLUM_TEST_FAULTS": RATE,
                "VELLUM_TEST_FAULTS_SEED": f"{SEED}-{i}",
                "VELLUM_TEST_FAULTS_LOG": log,
                # An error around a handler (not in it) retries with the
                # default backoff, not the job's.
                "VELLUM_TEST_BACKOFF": "0s",
            },
        )
        for i in range(2)
    ]
    exit_codes: list[int | None] = [None, None]
    try:
        wait_for(lambda: drained(workers, ids), timeout=DRAIN_DEADLINE, what=f"{JOBS} jobs to finish")
        print(f"drained in {time.monotonic() - started:.1f}s")
        # A heartbeat thread that died would leave its process up, its leases unrenewed.
        fresh = timezone.now() - timedelta(seconds=conf.lease)
        beating = set(Worker.objects.filter(last_heartbeat__gte=fresh).values_list("pid", flat=True))
        assert beating >= {w.pid for w in workers}, f"a worker stopped beating: {report(workers)}"
    finally:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        try:
            exit_codes = [w.wait(30) for w in workers]
        finally:
            print(summary(workers, log, ids))
    assert exit_codes == [0, 0], report(workers)
    assert not [w for w in workers if "Exception in thread" in w.output()[1]], report(workers)

    states = Counter(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert set(states) <= {Job.State.DONE, Job.State.FAILED}, states
    assert not Job.objects.filter(pk__in=ids, state=Job.State.FAILED, error="").exists()
    expected = {j.pk: j.args[0] for j in created}
    results = Job.objects.filter(pk__in=ids, state=Job.State.DONE).values_list("pk", "result")
    assert [(pk, result) for pk, result in results if result != expected[pk]] == []

    runs = handler_runs(ids)
    # Every claim counts an attempt, and no job is handed back here (the
    # workers stop once all are finished): two runs of one attempt mean two
    # workers ran the job at once.
    per_attempt = Counter((job_id, attempt) for job_id, attempt, _, _ in runs)
    assert [run for run, n in per_attempt.items() if n > 1] == [], "an attempt ran twice"
    hit = injected_into_handlers(log)
    unexplained = unexplained_reruns(runs, hit)
    assert unexplained == [], (
        "jobs ran again after an attempt that succeeded, and not because its lease lapsed:\n"
        + history(unexplained[:5], runs, log, workers)
    )


def drained(workers: list[Runjobs], ids: set[int]) -> bool:
    """Whether every job has finished; fails the test at once if a worker process is gone."""
    gone = [w for w in workers if w.process.poll() is not None]
    assert not gone, f"runjobs exited during the drain (pids {[w.pid for w in gone]}): {report(gone)}"
    return not Job.objects.filter(pk__in=ids, state__in=[Job.State.QUEUED, Job.State.RUNNING]).exists()


def handler_runs(ids: set[int]) -> list[Run]:
    return list(Execution.objects.filter(job_id__in=ids).values_list("job_id", "attempt", "finished", "note"))


def injected_into_handlers(log: str) -> set[tuple[int, int]]:
    """The (job id, attempt) pairs whose handler met an injected error."""
    return {(e["job"], e["attempt"]) for e in read_log(log) if e.get("job") is not None}


def unexplained_reruns(runs: list[Run], hit: set[tuple[int, int]]) -> list[int]:
    """Jobs that ran again after an attempt that succeeded, with no sign that its lease lapsed.

    An attempt whose handler met an injected error failed, even if its last
    write had applied, and is retried. One that finished without any
    returned: the job is done, unless its outcome was never recorded and its
    lease lapsed. The reaper then leaves its reason in the job's error,
    which the next run notes. So the next attempt that left a trace decides:
    a run that noted the lapse, or one that met an injected error (it may
    have failed before it could note anything), is explained; a plain run
    is not. An attempt that left no trace was claimed and lost unrun.
    """
    by_job: dict[int, dict[int, Run]] = {}
    for run in runs:
        by_job.setdefault(run[0], {})[run[1]] = run
    unexplained = set()
    for job_id, attempts in by_job.items():
        traced = sorted(set(attempts) | {attempt for pk, attempt in hit if pk == job_id})
        for earlier, later in pairwise(traced):
            first = attempts.get(earlier)
            succeeded = first is not None and first[2] and (job_id, earlier) not in hit
            if not succeeded or (job_id, later) in hit:
                continue
            if attempts[later][3] != LAPSED_NOTE:
                unexplained.add(job_id)
    return sorted(unexplained)


def history(job_ids: list[int], runs: list[Run], log: str, workers: list[Runjobs]) -> str:
    """What each job went through: its runs, the errors injected into them, the workers' log lines on it."""
    lines = []
    for job_id in job_ids:
        row = Job.objects.get(pk=job_id)
        lines.append(f"job {job_id}: {row.state}, attempts {row.attempts}, error {row.error[:200]!r}")
        mine = sorted((attempt, finished, note) for pk, attempt, finished, note in runs if pk == job_id)
        lines.append(f"  runs (attempt, finished, note): {mine}")
        lines += [f"  injected: {e}" for e in read_log(log) if e.get("job") == job_id]
        for w in workers:
            mentions = re.findall(rf"^.*job_id={job_id}\b.*$", w.output()[1], re.MULTILINE)
            lines += [f"  pid {w.pid}: {line}" for line in mentions]
    return "\n".join(lines)


def report(workers: list[Runjobs]) -> str:
    parts = [f"seed {SEED}"]
    for w in workers:
        stderr = w.output()[1]
        parts.append(f"--- runjobs pid {w.pid}, exit {w.process.poll()}, stderr tail:\n{stderr[-3000:]}")
    return "\n".join(parts)


def summary(workers: list[Runjobs], log: str, ids: set[int]) -> str:
    """What was injected where, and how the jobs and the workers came out of it."""
    entries = read_log(log)
    injected = [e for e in entries if "error" in e]
    statements = sum(e["statements"] for e in entries if "statements" in e)
    states = Counter(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
    attempts = Counter(Job.objects.filter(pk__in=ids).values_list("attempts", flat=True))
    runs = handler_runs(ids)

    def count(key: str) -> dict[Any, int]:
        return dict(Counter(e[key] for e in injected).most_common())

    lines = [
        f"fault injection: seed={SEED} rate={RATE} jobs={len(ids)} "
        f"errors={os.environ.get('VELLUM_TEST_FAULTS_ERRORS') or 'all'}",
        f"  jobs by state: {dict(states)}; by attempts: {dict(sorted(attempts.items()))}",
        f"  injected {len(injected)} errors into {statements or '?'} statements "
        f"({sum(e['job'] is not None for e in injected)} inside handlers)",
        f"    by error: {count('error')}",
        f"    by when: {count('when')}",
        f"    by statement: {count('verb')}",
        f"    by thread: {count('thread')}",
        f"  handler runs: {len(runs)}, {sum(r[3] == LAPSED_NOTE for r in runs)} after a lapsed lease",
    ]
    for w in workers:
        stderr = w.output()[1]
        lines.append(
            f"  runjobs pid {w.pid}: exit {w.process.poll()}, "
            f"'outcomes not recorded' x{stderr.count('outcomes not recorded')}, "
            f"'stale outcome discarded' x{stderr.count('stale outcome discarded')}, "
            f"'recovered job' x{stderr.count('recovered job')}, "
            f"tracebacks x{stderr.count('Traceback')}"
        )
    return "\n".join(lines)
