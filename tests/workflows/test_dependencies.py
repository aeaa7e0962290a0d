"""Jobs that wait for others: after=, run_if, chains, groups, named graphs and batches, run in the
calling thread (``run_due``) on the test database."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.utils import timezone

from tests.testapp import jobs
from vellum_jobs import batch, chain, group, upstream, workflow
from vellum_jobs.core import dependencies
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency, Workflow
from vellum_jobs.execution import handler_run
from vellum_jobs.execution.inline import run_due, run_inline, run_now

pytestmark = pytest.mark.django_db

WAITING, QUEUED, DONE = Job.State.WAITING, Job.State.QUEUED, Job.State.DONE
FAILED, CANCELLED = Job.State.FAILED, Job.State.CANCELLED


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def test_a_job_after_others_waits_until_all_have_ended_done():
    a, b = jobs.add.enqueue(1, 2), jobs.add.enqueue(3, 4)
    merged = jobs.upstream_outcomes.using(after=[a, b.pk]).enqueue()
    assert merged.state == WAITING
    assert Job.objects.due().filter(pk=merged.pk).count() == 0
    ran = run_due()
    assert [job.pk for job in ran] == [a.pk, b.pk, merged.pk]
    merged.refresh_from_db()
    assert merged.state == DONE
    assert merged.result == [[a.pk, "test.add", "done", 3], [b.pk, "test.add", "done", 7]]
    assert merged.workflow_id == Job.objects.get(pk=a.pk).workflow_id is not None


def test_a_failed_upstream_job_cancels_its_dependent_at_once_naming_it():
    bad = jobs.fail_now.enqueue()
    slow = jobs.add.using(delay=3600).enqueue(1, 1)
    dependent = jobs.add.using(after=[slow, bad]).enqueue(5, 6)
    run_due()
    dependent.refresh_from_db()
    assert dependent.state == CANCELLED
    assert dependent.error == f"upstream: job #{bad.pk} ended failed, so this job will not run"
    assert state(slow) == QUEUED  # not waited for: the dependent will not run anyway


def test_run_if_finished_runs_whatever_the_upstream_jobs_ended_as_and_reads_them():
    bad = jobs.fail_now.enqueue()
    good = jobs.add.enqueue(1, 1)
    anyway = jobs.upstream_outcomes.using(after=[bad, good], run_if="finished").enqueue()
    run_due()
    anyway.refresh_from_db()
    assert anyway.state == DONE
    assert anyway.result == [[bad.pk, "test.fail", "failed", None], [good.pk, "test.add", "done", 2]]


def test_an_upstream_job_that_does_not_exist_is_refused_and_nothing_is_written():
    a = jobs.add.enqueue(1, 1)
    before = Job.objects.count()
    with pytest.raises(ValueError, match=r"after: no job #999999; a job can only wait for jobs that exist"):
        jobs.add.using(after=[a, 999999]).enqueue(1, 2)
    assert Job.objects.count() == before
    assert not Dependency.objects.exists()


@pytest.mark.parametrize("bad", [["x"], "12", [0], [True], 5])
def test_after_takes_jobs_or_ids_and_names_anything_else(bad):
    with pytest.raises(ValueError, match="after"):
        jobs.add.using(after=bad)


def test_run_if_is_checked_when_given():
    with pytest.raises(ValueError, match="run_if must be one of done, finished, failed, got 'always'"):
        jobs.add.using(after=[1], run_if="always")


def test_a_job_after_jobs_that_already_ended_is_queued_at_once():
    a = jobs.add.enqueue(1, 1)
    run_due()
    later = jobs.add.using(after=[a]).enqueue(2, 2)
    assert later.state == QUEUED
    assert state(later) == QUEUED


def test_a_chain_hands_each_step_the_result_before_it():
    flow = chain(jobs.add.s(1, 2), jobs.double.s(), jobs.double.s()).enqueue(name="pipeline")
    assert isinstance(flow, Workflow) and flow.name == "pipeline"
    steps = list(flow.steps())
    assert [s.state for s in steps] == [QUEUED, WAITING, WAITING]
    run_due()
    assert [s.result for s in flow.steps()] == [3, 6, 12]
    assert flow.progress() == (3, 3)


def test_a_group_then_a_step_hands_it_every_result_in_order():
    flow = group(jobs.double.s(i) for i in range(5)).then(jobs.total.s(extra=100)).enqueue()
    run_due()
    gather = flow.steps().get(name="wf.total")
    assert gather.result == 0 + 2 + 4 + 6 + 8 + 100
    assert list(Dependency.objects.filter(job=gather).values_list("position", flat=True)) == [0, 1, 2, 3, 4]


def test_a_chain_with_a_group_in_it_fans_out_and_gathers():
    flow = chain(jobs.add.s(1, 1), group(jobs.double.s(), jobs.double.s()), jobs.total.s()).enqueue()
    run_due()
    assert [s.result for s in flow.steps()] == [2, 4, 4, 8]


def test_si_runs_a_step_with_its_own_arguments_only():
    flow = chain(jobs.add.s(1, 1), jobs.add.si(10, 20)).enqueue()
    run_due()
    assert [s.result for s in flow.steps()] == [2, 30]


def test_a_named_workflow_runs_its_graph():
    flow = (
        workflow("nightly")
        .add("b", jobs.upstream_outcomes.s(), after=["a"])
        .add("a", jobs.add.s(2, 2))
        .add("c", jobs.upstream_outcomes.s(), after=["a", "b"])
        .enqueue()
    )
    run_due()
    a, b, c = flow.steps().order_by("pk")
    assert (a.name, a.state) == ("test.add", DONE)
    assert c.result == [
        [a.pk, "test.add", "done", 4],
        [b.pk, "wf.upstream", "done", [[a.pk, "test.add", "done", 4]]],
    ]


def test_a_cycle_or_an_unknown_step_is_refused_before_anything_is_written():
    looped = workflow("w").add("a", jobs.add.s(1, 1), after=["c"]).add("b", jobs.add.s(1, 1), after=["a"])
    looped.add("c", jobs.add.s(1, 1), after=["b"])
    with pytest.raises(ValueError, match=r"workflow 'w': the steps .* form a cycle"):
        looped.enqueue()
    unknown = workflow("w").add("a", jobs.add.s(1, 1), after=["nope"])
    with pytest.raises(ValueError, match="workflow 'w': step 'a' waits for 'nope', which it does not have"):
        unknown.enqueue()
    assert not Job.objects.exists() and not Workflow.objects.exists()


def test_a_workflow_in_a_transaction_that_rolls_back_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        chain(jobs.add.s(1, 1), jobs.double.s()).enqueue()
        raise RuntimeError("rolled back")
    assert not Job.objects.exists() and not Dependency.objects.exists() and not Workflow.objects.exists()


def test_a_batch_runs_on_done_once_with_the_counts():
    with batch(on_done=jobs.counts.s(label="all good"), on_failure=jobs.counts.s(label="bad")) as b:
        for i in range(3):
            jobs.add.enqueue(i, i)
        jobs.add.enqueue_many([[5, 5], [6, 6]])
    assert b.kind == Workflow.Kind.BATCH
    assert b.progress() == (0, 7)
    run_due()
    callbacks = {job.result["label"]: job for job in b.steps().filter(name="wf.counts", state=DONE)}
    assert list(callbacks) == ["all good"]
    assert callbacks["all good"].result == {
        "label": "all good",
        "total": 5,
        "done": 5,
        "failed": 0,
        "cancelled": 0,
    }
    bad = b.steps().get(name="wf.counts", state=CANCELLED)
    assert bad.error.startswith("upstream: every upstream job ended done")


def test_a_batch_with_a_failure_runs_on_failure_once():
    with batch(on_done=jobs.counts.s(label="ok"), on_failure=jobs.counts.s(label="bad")) as b:
        jobs.add.enqueue(1, 1)
        jobs.fail_now.enqueue()
    run_due()
    done = b.steps().get(name="wf.counts", state=DONE)
    assert done.result == {"label": "bad", "total": 2, "done": 1, "failed": 1, "cancelled": 0}
    assert b.steps().get(name="wf.counts", state=CANCELLED).error.startswith("upstream: job #")


def test_an_exception_in_a_batch_block_leaves_nothing():
    with pytest.raises(KeyError), batch(on_done=jobs.counts.s()):
        jobs.add.enqueue(1, 1)
        raise KeyError("oops")
    assert not Job.objects.exists() and not Workflow.objects.exists()


def test_cancelling_a_workflow_cancels_every_step_not_ended():
    flow = chain(jobs.add.s(1, 1), jobs.double.s(), jobs.double.s()).enqueue()
    assert flow.cancel() == 3
    assert set(flow.steps().values_list("state", flat=True)) == {CANCELLED}
    assert run_due() == []


def test_retrying_a_failed_step_resumes_the_workflow_from_there():
    flow = chain(jobs.flaky.s(2), jobs.double.s(), jobs.double.s()).enqueue()
    first = flow.steps().first()
    Job.objects.filter(pk=first.pk).update(max_attempts=1)
    run_due()
    assert list(flow.steps().values_list("state", flat=True)) == [FAILED, CANCELLED, CANCELLED]
    Job.objects.filter(pk=first.pk).update(max_attempts=2)  # flaky: its second attempt succeeds
    assert flow.retry() == 1
    assert list(flow.steps().values_list("state", flat=True)) == [QUEUED, WAITING, WAITING]
    run_due()
    assert [s.result for s in flow.steps()] == [2, 4, 8]


def test_in_inline_mode_a_workflow_runs_to_its_end_as_it_is_enqueued():
    with run_inline():
        flow = chain(jobs.add.s(1, 2), jobs.double.s()).enqueue()
        with batch(on_done=jobs.counts.s(label="inline")) as b:
            jobs.add.enqueue(1, 1)
    assert [s.result for s in flow.steps()] == [3, 6]
    assert b.steps().get(name="wf.counts").result == {
        "label": "inline",
        "total": 1,
        "done": 1,
        "failed": 0,
        "cancelled": 0,
    }


def test_upstream_outside_a_job_is_empty():
    assert upstream() == []


@pytest.mark.django_db(transaction=True)
def test_a_coroutine_step_on_the_event_loop_is_handed_its_upstream_result():
    flow = chain(jobs.add.s(1, 2), jobs.async_add.s(10)).enqueue()
    first, second = flow.steps()
    run_now([first])
    second.refresh_from_db()
    assert second.state == QUEUED
    outcome = asyncio.run(handler_run.arun_handler(second))
    asyncio.run(sync_to_async(connections.close_all)())  # the thread for sync code read the upstream jobs
    assert outcome.columns["result"] == 13


def test_retrying_one_failed_step_makes_the_steps_its_end_cancelled_wait_again():
    first = jobs.fail_now.enqueue()
    second = jobs.add.using(after=[first]).enqueue(1, 1)
    third = jobs.add.using(after=[second]).enqueue(2, 2)
    run_due()
    assert [state(j) for j in (first, second, third)] == [FAILED, CANCELLED, CANCELLED]
    first.refresh_from_db()
    assert first.retry()
    assert [state(j) for j in (first, second, third)] == [QUEUED, WAITING, WAITING]
    assert set(Dependency.objects.values_list("upstream_state", flat=True)) == {""}


def test_cancelling_a_waiting_step_cancels_what_waits_for_it_and_nothing_upstream():
    first = jobs.add.enqueue(1, 1)
    second = jobs.add.using(after=[first]).enqueue(1, 1)
    third = jobs.add.using(after=[second]).enqueue(2, 2)
    assert second.cancel()
    assert [state(j) for j in (first, second, third)] == [QUEUED, CANCELLED, CANCELLED]
    third.refresh_from_db()
    assert third.error == f"upstream: job #{second.pk} ended cancelled, so this job will not run"
    assert [job.pk for job in run_due()] == [first.pk]


def test_retrying_a_step_that_never_ran_makes_it_wait_again_for_its_upstream_jobs():
    first = jobs.fail_now.enqueue()
    second = jobs.add.using(after=[first]).enqueue(1, 1)
    run_due()
    second.refresh_from_db()
    assert second.retry()  # it waits again, and its upstream job's failure cancels it again at once
    assert (second.state, second.error) == (
        CANCELLED,
        f"upstream: job #{first.pk} ended failed, so this job will not run",
    )
    cancelled_by_hand = jobs.add.using(after=[jobs.add.enqueue(2, 2)]).enqueue(3, 3)
    assert cancelled_by_hand.cancel()
    assert cancelled_by_hand.retry()
    assert cancelled_by_hand.state == WAITING
    run_due()
    assert state(cancelled_by_hand) == DONE


def test_the_release_duty_releases_a_job_whose_upstream_ended_without_its_edges_saying_so():
    first = jobs.add.enqueue(1, 1)
    second = jobs.add.using(after=[first]).enqueue(1, 1)
    Job.objects.filter(pk=first.pk).update(state=DONE)  # as a worker of an older version records it
    assert state(second) == WAITING
    assert dependencies.sweep("default") == 1
    assert state(second) == QUEUED
    assert dependencies.sweep("default") == 0


def test_the_release_duty_counts_a_deleted_upstream_job_as_cancelled():
    first = jobs.add.enqueue(1, 1)
    second = jobs.add.using(after=[first]).enqueue(1, 1)
    Job.objects.filter(pk=first.pk).delete()
    dependencies.sweep("default")
    second.refresh_from_db()
    assert (second.state, second.error) == (
        CANCELLED,
        f"upstream: job #{first.pk} ended cancelled, so this job will not run",
    )


def test_a_step_enqueued_with_a_delay_keeps_it_when_released_earlier():
    later = timezone.now() + timedelta(hours=1)
    flow = chain(jobs.add.s(1, 1), jobs.double.using(run_after=later).s()).enqueue()
    run_due()
    second = flow.steps().last()
    assert (second.state, second.run_after) == (QUEUED, later)


def test_a_unique_job_cannot_be_a_step_or_a_callback():
    with pytest.raises(ValueError, match=r"test\.scan is a unique job: it cannot wait for others"):
        chain(jobs.add.s(1, 1), jobs.scan.s()).enqueue()
    with (
        pytest.raises(ValueError, match=r"batch\(on_done=...\): test\.scan is a unique job"),
        batch(on_done=jobs.scan.s(1)),
    ):
        pass
    assert not Job.objects.exists()


def test_the_release_duty_releases_what_ends_written_another_way_left_waiting():
    # Ends written by no worker (recovery, an admin's cancel, an old worker): the edges stay unended.
    a, b, c = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2), jobs.add.enqueue(3, 3)
    after_ab = jobs.add.using(after=[a, b]).enqueue(0, 0)
    after_c = jobs.add.using(after=[c]).enqueue(0, 0)
    Job.objects.filter(pk__in=[a.pk, b.pk]).update(state=DONE)
    Job.objects.filter(pk=c.pk).update(state=FAILED)
    assert (state(after_ab), state(after_c)) == (WAITING, WAITING)
    assert dependencies.sweep("default") == 2
    assert (state(after_ab), state(after_c)) == (QUEUED, CANCELLED)
    assert Job.objects.get(pk=after_c.pk).error.startswith(f"upstream: job #{c.pk} ended failed")
    assert dependencies.sweep("default") == 0  # nothing left to move
