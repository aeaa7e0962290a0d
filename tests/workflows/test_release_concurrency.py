"""Releasing waiting jobs exactly once, with real ``runjobs`` processes: upstream jobs that end at
the same instant in two processes, a process killed between an outcome's commit and its release,
a workflow step whose worker dies, and ends written by a worker of older code.

The steps (``wf.hold``, ``wf.note``, ``wf.gather``, ``wf.tally``) note each run of their handler
in a ``Span`` on the host's monotonic clock, which every process shares: a step's start is
compared with its upstream steps' ends on one clock. The jobs' own timestamps come from each
process's reckoning of the database's clock, which may differ by a round trip between processes.
"""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from tests.support.processes import REAL_LEASE, Runjobs, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution, Span
from vellum_jobs import batch, chain, group
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAITING, QUEUED, DONE = Job.State.WAITING, Job.State.QUEUED, Job.State.DONE
FAILED, CANCELLED = Job.State.FAILED, Job.State.CANCELLED
ENDED = (DONE, FAILED, CANCELLED)

PROCESSES, THREADS = 3, 4
# Claims only for free threads: the held jobs spread over the processes, THREADS each.
WORKER_ARGS = ("--workers", str(THREADS), "--prefetch", "0")


def stop(workers: list[Runjobs]) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    codes = [worker.wait() for worker in workers]
    assert codes == [0] * len(workers), [worker.output()[1][-3000:] for worker in workers]


def spans_by_job() -> dict[int, list[tuple[float, float | None, int]]]:
    """Each job's handler runs: (started, ended, pid)."""
    runs = defaultdict(list)
    for job_id, started, ended, pid in Span.objects.values_list("job_id", "started", "ended", "pid"):
        runs[job_id].append((started, ended, pid))
    return runs


def settled() -> bool:
    return not Job.objects.exclude(state__in=ENDED).exists()


def hold_round(gate: Path) -> tuple[list[Job], int]:
    """A held job for every thread, and a dependent for every pair of them and for some triples,
    enqueued together; once the held jobs all run, the dependents and how many of them wait for
    jobs in two processes or more.

    Enqueued in one transaction, so that a worker claims each held job as a workflow step: a job
    claimed before something waited for it is released by the release duty, not by the worker
    that records its end (``outcome_writes._release_downstream``).
    """
    with transaction.atomic():
        held = sorted(job.pk for job in jobs.hold.enqueue_many([(str(gate),)] * (PROCESSES * THREADS)))
        ups = [*combinations(held, 2), *list(combinations(held, 3))[::5]]
        fan_ins = [jobs.note.using(after=list(group)).enqueue("fan-in") for group in ups]

    def running() -> dict[int, int]:
        where = dict(Span.objects.filter(job_id__in=held).values_list("job_id", "pid"))
        return where if len(where) == len(held) else {}

    where = wait_for(running, what="a held job on every thread")
    assert sorted(Counter(where.values()).values()) == [THREADS] * PROCESSES
    return fan_ins, sum(len({where[pk] for pk in group}) > 1 for group in ups)


# Without the release duty, the workers' releases after their commits must release every job alone.
DUTY = {"eager release alone": {"VELLUM_TEST_NO_RELEASE_DUTY": "1"}, "with the release duty": {}}


@pytest.mark.parametrize("duty", list(DUTY))
def test_dependents_and_batch_callbacks_are_released_once_when_their_last_upstream_jobs_end_together(
    tmp_path, duty
):
    workers = [Runjobs(*WORKER_ARGS, env={**REAL_LEASE, **DUTY[duty]}) for _ in range(PROCESSES)]
    try:
        gate = tmp_path / "gate-0"
        fan_ins, across = hold_round(gate)
        # Meanwhile, small fan-ins and two batches drain through the same threads.
        groups = [
            group(jobs.note.s(f"g{i}") for _ in range(3)).then(jobs.gather.s("gather")) for i in range(40)
        ]
        gathered = [g.enqueue() for g in groups]
        with batch(on_done=jobs.tally.s("ok:done"), on_failure=jobs.tally.s("ok:failure")) as good:
            jobs.note.enqueue_many([("member",)] * 200)
        with batch(on_done=jobs.tally.s("bad:done"), on_failure=jobs.tally.s("bad:failure")) as bad:
            jobs.note.enqueue_many([("member",)] * 95)
            jobs.note.enqueue_many([{"key": "member", "fail": True}] * 5)
        assert all(job.state == WAITING for job in fan_ins)
        gate.touch()  # every held job ends now
        wait_for(
            lambda: Job.objects.filter(pk__in=[j.pk for j in fan_ins], state=DONE).count() == len(fan_ins),
            what="the first round's fan-ins",
        )
        gate = tmp_path / "gate-1"
        more, more_across = hold_round(gate)
        fan_ins, across = fan_ins + more, across + more_across
        gate.touch()
        wait_for(settled, timeout=120, what="every job to end")
    finally:
        stop(workers)

    runs = spans_by_job()
    rows = dict(Job.objects.values_list("pk", "state"))
    assert not [pk for pk, state in rows.items() if state not in ENDED], "left waiting or queued"
    # Every job that ended done ran once; no other ran at all.
    assert {pk: len(runs[pk]) for pk, state in rows.items() if state == DONE} == {
        pk: 1 for pk, state in rows.items() if state == DONE
    }
    assert set(Job.objects.filter(state=DONE).values_list("attempts", flat=True)) == {1}
    assert {pk for pk in runs if rows[pk] != DONE} == set(
        Job.objects.filter(name="wf.note", state=FAILED).values_list("pk", flat=True)
    )
    # No job started before every job it waited for had ended.
    edges = list(Dependency.objects.values_list("job_id", "upstream_id"))
    early = [
        (job_id, upstream_id)
        for job_id, upstream_id in edges
        if job_id in runs and runs[job_id][0][0] <= runs[upstream_id][0][1]
    ]
    assert not early
    assert all(rows[job.pk] == DONE for job in fan_ins)
    # Most fan-ins' upstream jobs ended at one instant in two or three processes: every pair of
    # held jobs in two of them (3 x 4 x 4 a round), and most triples.
    assert across > 2 * 48
    for flow in gathered:
        assert [step.state for step in flow.steps()] == [DONE] * 4
        assert flow.steps().get(name="wf.gather").result == 3
    # Each batch ran one callback, once, with its counts; the other was cancelled without running.
    for flow, label, counts in (
        (good, "ok:done", {"total": 200, "done": 200, "failed": 0, "cancelled": 0}),
        (bad, "bad:failure", {"total": 100, "done": 95, "failed": 5, "cancelled": 0}),
    ):
        callbacks = Job.objects.filter(workflow=flow, name="wf.tally")
        (ran,) = callbacks.filter(state=DONE)
        assert ran.result == {"label": label, **counts}
        assert len(runs[ran.pk]) == 1
        (other,) = callbacks.exclude(pk=ran.pk)
        assert other.state == CANCELLED and other.error.startswith("upstream: ")
        assert flow.progress() == (counts["total"] + 2, counts["total"] + 2)


# -- a process that dies between an outcome's commit and its release ---------------------------

EAGER = "vellum_jobs.execution.outcome_writes._release_downstream"
KILL_POINTS = {
    # The edges say the upstream job ended (written with its outcome), and the dependent still
    # waits. An end that never reached the edges is the rolling deploy's case, below.
    "before the release": f"{EAGER},vellum_jobs.core.dependencies._queue_ready",
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_dependent_is_released_once_by_another_worker_when_the_process_dies_before_releasing_it(point):
    upstream = jobs.note.using(queue="doomed").enqueue("upstream")
    dependent = jobs.note.using(after=[upstream]).enqueue("dependent")
    doomed = Runjobs(
        "--workers",
        "1",
        "--queue",
        "doomed",
        env={**REAL_LEASE, "VELLUM_TEST_KILL_INSIDE": KILL_POINTS[point]},
    )
    try:
        assert doomed.wait(60) == -signal.SIGKILL
    finally:
        doomed.stop()
    assert "faultinjection: killed inside" in doomed.output()[1]
    # The outcome committed; nothing released the dependent.
    assert Job.objects.get(pk=upstream.pk).state == DONE
    assert Job.objects.get(pk=dependent.pk).state == WAITING
    assert Dependency.objects.get(job=dependent).upstream_state == DONE

    rescuer = Runjobs("--workers", "1", env=REAL_LEASE)
    try:
        # The release duty runs once per 5 s, by whichever worker holds its lock.
        wait_for(lambda: Job.objects.get(pk=dependent.pk).state == DONE, what="the release duty")
    finally:
        stop([rescuer])
    runs = spans_by_job()
    ((started, _, pid),) = runs[dependent.pk]
    assert pid == rescuer.pid
    assert started > runs[upstream.pk][0][1]
    assert Job.objects.get(pk=dependent.pk).attempts == 1
    assert Dependency.objects.get(job=dependent).upstream_state == DONE


def test_a_workflow_goes_on_after_its_step_s_worker_dies_mid_run(tmp_path):
    gate = tmp_path / "gate"
    # A step with attempts left runs again and its chain goes on; one on its last attempt is
    # failed by recovery, and the release duty cancels the step after it.
    goes_on = chain(jobs.sleep.s(60, release_file=str(gate)), jobs.record.s()).enqueue()
    stops = chain(jobs.stubborn.s(60, release_file=str(gate)), jobs.record.s()).enqueue()
    first, after_first = goes_on.steps()
    last, after_last = stops.steps()
    # Short leases (the default here): the killed worker's jobs are recovered within seconds.
    dying = Runjobs("--workers", "2", "--prefetch", "0")
    try:
        wait_for(
            lambda: Execution.objects.filter(job_id__in=[first.pk, last.pk]).count() == 2,
            what="both steps running",
        )
    finally:
        dying.kill()
    gate.touch()  # a second run ends at once
    rescuer = Runjobs("--workers", "2")
    try:
        wait_for(lambda: goes_on.progress() == (2, 2) and stops.progress() == (2, 2), what="both workflows")
    finally:
        stop([rescuer])

    runs = list(Execution.objects.filter(job_id=first.pk).order_by("attempt").values_list("attempt", "pid"))
    assert runs == [(1, dying.pid), (2, rescuer.pid)]
    assert [(s.state, s.result) for s in goes_on.steps()] == [(DONE, "slept"), (DONE, "slept")]
    assert Execution.objects.filter(job_id=after_first.pk).count() == 1
    lost, cancelled = stops.steps()
    assert lost.state == FAILED and "worker lost" in lost.error
    assert cancelled.state == CANCELLED
    assert cancelled.error == f"upstream: job #{lost.pk} ended failed, so this job will not run"
    assert not Execution.objects.filter(job_id=after_last.pk).exists()


def test_a_job_that_waits_for_one_already_running_is_released_by_the_release_duty(tmp_path):
    # Claimed before anything waited for it, the running job is no workflow step to its worker,
    # which records its end without looking for jobs waiting for it (without the release duty,
    # the dependent would wait for ever).
    gate = tmp_path / "gate"
    running = jobs.hold.enqueue(str(gate))
    worker = Runjobs("--workers", "1", env=REAL_LEASE)
    try:
        wait_for(lambda: Span.objects.filter(job_id=running.pk).exists(), what="the upstream job to run")
        dependent = jobs.note.using(after=[running]).enqueue("dependent")
        assert dependent.state == WAITING
        gate.touch()
        wait_for(lambda: Job.objects.get(pk=dependent.pk).state == DONE, what="the release duty")
    finally:
        stop([worker])
    runs = spans_by_job()
    assert len(runs[dependent.pk]) == 1
    assert runs[dependent.pk][0][0] > runs[running.pk][0][1]


# -- a worker of older code: ends written without the edges --------------------------------


def test_the_release_duty_releases_what_waits_for_ends_an_older_worker_wrote():
    done_up, failed_up = jobs.note.enqueue("old done"), jobs.note.enqueue("old failed")
    after_done = jobs.note.using(after=[done_up]).enqueue("after done")
    after_failed = jobs.note.using(after=[failed_up]).enqueue("after failed")
    anyway = jobs.note.using(after=[done_up, failed_up], run_if="finished").enqueue("anyway")
    # What a worker of the code before workflows writes: the job's row, and nothing else.
    now = timezone.now()
    Job.objects.filter(pk=done_up.pk).update(state=DONE, attempts=1, finished_at=now)
    Job.objects.filter(pk=failed_up.pk).update(state=FAILED, attempts=1, finished_at=now, error="old")
    assert set(Dependency.objects.values_list("upstream_state", flat=True)) == {""}
    worker = Runjobs("--workers", "1", env=REAL_LEASE)
    try:
        wait_for(
            lambda: Job.objects.filter(pk__in=[after_done.pk, anyway.pk], state=DONE).count() == 2,
            what="the release duty",
        )
    finally:
        stop([worker])
    assert Job.objects.get(pk=after_failed.pk).state == CANCELLED
    assert Job.objects.get(pk=after_failed.pk).error == (
        f"upstream: job #{failed_up.pk} ended failed, so this job will not run"
    )
    runs = spans_by_job()
    assert sorted(len(runs[pk]) for pk in (after_done.pk, anyway.pk)) == [1, 1]
    assert after_failed.pk not in runs
    assert dict(Dependency.objects.filter(job=anyway).values_list("upstream_id", "upstream_state")) == {
        done_up.pk: DONE,
        failed_up.pk: FAILED,
    }
