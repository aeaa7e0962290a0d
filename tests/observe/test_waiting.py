"""The read side of workflows: what a waiting job waits for (``explain``), a job's upstream and
downstream jobs, and a workflow's progress and steps."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support.workflow_rows import batch_of, chain, step, workflow
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency, Workflow
from vellum_jobs.observe import dependencies, workflows
from vellum_jobs.observe.explain import explain

pytestmark = pytest.mark.django_db

WAITING, QUEUED, RUNNING = Job.State.WAITING, Job.State.QUEUED, Job.State.RUNNING
DONE, FAILED, CANCELLED = Job.State.DONE, Job.State.FAILED, Job.State.CANCELLED


# -- explain()


def test_a_waiting_job_says_which_upstream_jobs_have_not_ended():
    w = workflow()
    done, running, queued = step(w, state=DONE), step(w, state=RUNNING), step(w, state=QUEUED)
    merge = step(w, "merge", WAITING, after=[done, running, queued])
    (reason,) = merge.explain()
    assert reason.code == "upstream"
    assert reason.text == f"waiting for #{running.pk} and #{queued.pk}"
    assert reason.job_ids == (running.pk, queued.pk)


def test_one_upstream_job_is_named_alone_and_past_five_the_rest_are_counted():
    w = workflow()
    first = step(w)
    assert str(step(w, state=WAITING, after=[first]).explain()[0]) == f"waiting for #{first.pk}"
    many = [step(w) for _ in range(8)]
    (reason,) = step(w, state=WAITING, after=many).explain()
    named = ", ".join(f"#{job.pk}" for job in many[:5])
    assert reason.text == f"waiting for {named} and 3 more"
    assert reason.job_ids == tuple(job.pk for job in many[:5])


def test_an_upstream_job_that_ended_before_its_end_was_recorded_is_not_waited_for():
    w = workflow()
    ended, running = step(w), step(w, state=RUNNING)
    job = step(w, state=WAITING, after=[ended, running])
    # Cancelled in the admin: its edge says '' until the release duty writes the end.
    Job.objects.filter(pk=ended.pk).update(state=CANCELLED)
    assert Dependency.objects.get(job=job, upstream=ended).upstream_state == ""
    assert str(job.explain()[0]) == f"waiting for #{running.pk}"


def test_a_waiting_job_whose_upstream_jobs_all_ended_says_its_release_is_due():
    w = workflow()
    job = step(w, state=WAITING, after=[step(w, state=DONE), step(w, state=FAILED)])
    (reason,) = job.explain()
    assert reason.code == "release_due"
    assert reason.text.startswith("its upstream jobs have all ended: it is queued or cancelled")


def test_a_job_cancelled_because_of_its_upstream_jobs_says_why():
    w = workflow()
    failed = step(w, state=FAILED)
    job = step(
        w,
        state=CANCELLED,
        after=[failed],
        finished_at=timezone.now(),
        error=f"upstream: job #{failed.pk} failed",
    )
    (reason,) = job.explain()
    assert reason.code == "cancelled"
    assert reason.text.startswith("not waiting: cancelled at ")
    assert reason.text.endswith(
        f"before it ran, because of its upstream jobs: job #{failed.pk} failed; "
        "retrying them makes it wait again"
    )
    assert reason.job_ids == (failed.pk,)
    person = step(w, state=CANCELLED, finished_at=timezone.now(), error="cancelled while queued")
    assert "upstream" not in str(person.explain()[0])


def test_a_page_of_waiting_jobs_is_explained_in_one_query_however_many_they_wait_for():
    w = workflow()
    ups = [step(w) for _ in range(30)]
    waiting = [step(w, state=WAITING, after=ups[i : i + 10]) for i in range(20)]
    rows = list(Job.objects.filter(pk__in=[job.pk for job in waiting]))
    now = timezone.now()  # else PostgreSQL and MariaDB ask the database's clock
    with CaptureQueriesContext(connection) as queries:
        reasons = explain(rows, now)
    assert len(queries) == 1
    assert all(found[0].code == "upstream" and len(found[0].job_ids) == 5 for found in reasons.values())
    assert reasons[waiting[0].pk][0].text.endswith("and 5 more")


@pytest.mark.parametrize(
    ("items", "total", "text"),
    [
        (["#1"], 1, "#1"),
        (["#1", "#2"], 2, "#1 and #2"),
        (["#1", "#2", "#3"], 3, "#1, #2 and #3"),
        (["#1", "#2"], 9, "#1, #2 and 7 more"),
        ([], 0, ""),
    ],
)
def test_ids_are_listed_as_a_sentence_says_them(items, total, text):
    assert dependencies.listed(items, total) == text


# -- a job's upstream and downstream jobs


def test_upstream_jobs_come_in_the_order_of_their_results_with_their_states():
    w = workflow()
    a, b = step(w, "a", DONE), step(w, "b", RUNNING)
    job = step(w, "gather", WAITING, after=[b, a])  # b's result first
    links = dependencies.upstream_of(job)
    assert [(j.id, j.name, j.state, j.ended_as) for j in links.shown] == [
        (b.pk, "b", RUNNING, ""),
        (a.pk, "a", DONE, DONE),
    ]
    assert (links.total, links.more, links.by_state) == (2, 0, {})
    assert [j.id for j in dependencies.downstream_of(a).shown] == [job.pk]


def test_a_deleted_upstream_job_is_shown_as_deleted_with_its_recorded_end():
    w = workflow()
    gone = step(w, state=FAILED)
    job = step(w, state=CANCELLED, after=[gone])
    Job.objects.filter(pk=gone.pk).delete()
    (linked,) = dependencies.upstream_of(job).shown
    assert (linked.id, linked.deleted, linked.ended_as) == (gone.pk, True, FAILED)


def test_past_the_limit_the_other_jobs_are_counted_by_state_in_a_few_queries():
    w = workflow()
    ups = batch_of(w, 25, DONE) + batch_of(w, 5, FAILED)
    callback = step(w, "notify", WAITING, after=ups)
    with CaptureQueriesContext(connection) as queries:
        links = dependencies.upstream_of(callback, limit=10)
    assert len(queries) == 4  # the edges, their jobs, the count by state, the count
    assert [j.id for j in links.shown] == [job.pk for job in ups[:10]]
    assert (links.total, links.more) == (30, 20)
    assert links.by_state == {**dict.fromkeys(Job.State.values, 0), DONE: 25, FAILED: 5}


# -- a workflow's progress and steps


def test_the_progress_of_a_page_of_workflows_is_one_query():
    first, second, empty = workflow(), workflow(Workflow.Kind.BATCH), workflow()
    chain(first, 3, DONE)
    step(first, state=WAITING)
    batch_of(second, 4, FAILED)
    with CaptureQueriesContext(connection) as queries:
        found = workflows.progress([first.pk, second.pk, empty.pk])
    assert len(queries) == 1
    assert (found[first.pk].finished, found[first.pk].total) == (3, 4)
    assert found[first.pk].text == "3 of 4 finished"
    assert found[first.pk].present == [(WAITING, 1), (DONE, 3)]
    assert (found[second.pk].finished, found[second.pk].is_finished) == (4, True)
    assert (found[empty.pk].total, found[empty.pk].text) == (0, "0 of 0 finished")


def test_the_steps_drawn_are_the_first_by_id_with_the_edges_between_them():
    w = workflow()
    jobs = chain(w, 6)
    steps, edges = workflows.steps(w, limit=4)
    assert [s.id for s in steps] == [job.pk for job in jobs[:4]]
    assert [(e.upstream, e.job) for e in edges] == [(jobs[i].pk, jobs[i + 1].pk) for i in range(3)]
    assert {e.upstream_state for e in edges} == {DONE}
    assert workflows.steps(workflow(), limit=4) == ([], [])
