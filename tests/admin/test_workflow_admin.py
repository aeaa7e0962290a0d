"""The workflow admin: the list of workflows and batches with their progress, each one's page (graph,
progress, counts), its cancel and retry buttons, and who may see and use them."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.support.admin_pages import JOBS, messages_of, rows, staff_user
from tests.support.workflow_rows import batch_of, chain, step, workflow
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency, Workflow

pytestmark = pytest.mark.django_db

WAITING, QUEUED, RUNNING = Job.State.WAITING, Job.State.QUEUED, Job.State.RUNNING
DONE, FAILED, CANCELLED = Job.State.DONE, Job.State.FAILED, Job.State.CANCELLED
WORKFLOWS = reverse("admin:vellum_jobs_workflow_changelist")


def page(w: Workflow) -> str:
    return reverse("admin:vellum_jobs_workflow_change", args=[w.pk])


def act(w: Workflow) -> str:
    return reverse("admin:vellum_jobs_workflow_act", args=[w.pk])


def nodes(html: str) -> list[tuple[str, str]]:
    """The graph's boxes: (job id, state)."""
    return re.findall(r'<g class="vellum-node vellum-node-(\w+)" data-job="(\d+)"', html)


def buttons(html: str) -> list[str]:
    return re.findall(r'<button type="submit" name="action" value="(\w+)"', html)


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


def a_pipeline() -> tuple[Workflow, list[Job]]:
    """fetch (done) -> parse (failed) -> save (cancelled by parse) and report (waiting for both)."""
    w = workflow(name="import")
    fetch = step(w, "fetch", DONE, finished_at=timezone.now(), attempts=1)
    parse = step(w, "parse", FAILED, after=[fetch], finished_at=timezone.now(), attempts=3)
    save = step(w, "save", CANCELLED, after=[parse], error=f"upstream: job #{parse.pk} failed")
    report = step(w, "report", WAITING, after=[fetch, save], run_if="finished")
    return w, [fetch, parse, save, report]


# -- the list


def test_the_list_shows_each_workflow_s_kind_name_progress_and_states(admin_client):
    w, _ = a_pipeline()
    b = workflow(Workflow.Kind.BATCH, "nightly")
    batch_of(b, 3, DONE)
    html = admin_client.get(WORKFLOWS).content.decode()
    assert "3 of 3 finished" in html and "3 of 4 finished" in html
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", html, re.S) if f"/{w.pk}/change/" in r)
    assert "import" in row and ">workflow<" in row
    assert re.findall(r'vellum-badge-(\w+)">([^<]+)</span>', row) == [
        (WAITING, "1 waiting"),
        (DONE, "1 done"),
        (FAILED, "1 failed"),
        (CANCELLED, "1 cancelled"),
    ]
    assert 'name="_selected_action"' not in html  # no bulk delete: retention deletes workflows


def test_the_list_costs_the_same_queries_for_one_workflow_or_thirty(admin_client):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(WORKFLOWS).status_code == 200
        return len(captured)

    chain(workflow(), 3)
    one = queries()
    for _ in range(29):
        chain(workflow(), 3)
    assert queries() == one


def test_the_list_filters_by_kind_and_finds_a_number_as_an_id(admin_client):
    w = workflow(name="a")
    b = workflow(Workflow.Kind.BATCH, name="b")
    html = admin_client.get(WORKFLOWS, {"kind__exact": "batch"}).content.decode()
    assert f"/{b.pk}/change/" in html and f"/{w.pk}/change/" not in html
    html = admin_client.get(WORKFLOWS, {"q": str(w.pk)}).content.decode()
    assert f"/{w.pk}/change/" in html and f"/{b.pk}/change/" not in html
    html = admin_client.get(WORKFLOWS, {"q": "b"}).content.decode()
    assert f"/{b.pk}/change/" in html and f"/{w.pk}/change/" not in html


# -- a workflow's page


def test_the_page_draws_the_graph_each_job_linked_and_coloured_by_state(admin_client):
    w, (fetch, parse, save, report) = a_pipeline()
    html = admin_client.get(page(w)).content.decode()
    assert nodes(html) == [
        (DONE, str(fetch.pk)),
        (FAILED, str(parse.pk)),
        (CANCELLED, str(save.pk)),
        (WAITING, str(report.pk)),
    ]
    for job in (fetch, parse, save, report):
        assert f'href="/admin/vellum_jobs/job/{job.pk}/change/"><g class="vellum-node' in html
    arrows = re.findall(r'data-from="(\d+)" data-to="(\d+)"', html)
    assert sorted(arrows) == sorted(
        (str(e.upstream_id), str(e.job_id)) for e in Dependency.objects.filter(job__workflow=w)
    )
    assert "3 of 4 finished" in html
    assert f"#{fetch.pk} fetch" in html
    assert "<script" not in html.split('id="vellum-graph"')[1].split("</div>")[0]


def test_the_page_counts_its_jobs_by_state_each_linking_to_them_in_the_job_list(admin_client):
    w, (fetch, parse, save, report) = a_pipeline()
    workflow_other = workflow()
    step(workflow_other, state=FAILED)
    html = admin_client.get(page(w)).content.decode()
    found = dict(re.findall(r'id="vellum-state-(\w+)" data-count="(\d+)"', html))
    assert found == {WAITING: "1", QUEUED: "0", RUNNING: "0", DONE: "1", FAILED: "1", CANCELLED: "1"}
    link = re.search(rf'href="([^"]+)" class="vellum-count" id="vellum-state-{FAILED}"', html)
    assert link is not None
    listed = admin_client.get(link[1].replace("&amp;", "&")).content.decode()
    assert set(rows(listed)) == {parse.pk}
    listed = admin_client.get(JOBS, {"workflow": w.pk}).content.decode()
    assert set(rows(listed)) == {fetch.pk, parse.pk, save.pk, report.pk}
    assert admin_client.get(JOBS, {"workflow": "nope"}).status_code == 200


@pytest.mark.parametrize("kind", [Workflow.Kind.WORKFLOW, Workflow.Kind.BATCH])
def test_the_page_costs_the_same_queries_for_three_jobs_or_a_hundred(admin_client, kind):
    def queries(w: Workflow) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as captured:
            html = admin_client.get(page(w)).content.decode()
        return len(captured), len(nodes(html))

    small, big = workflow(kind), workflow(kind)
    chain(small, 3)
    chain(big, 100)
    few, drawn_few = queries(small)
    many, drawn_many = queries(big)
    assert (drawn_few, drawn_many) == (3, 100)
    assert many == few


def test_a_big_workflow_draws_its_first_jobs_and_says_how_many_are_left_out(admin_client):
    w = workflow()
    jobs = chain(w, 20) + batch_of(w, 180)
    html = admin_client.get(page(w)).content.decode()
    drawn = nodes(html)
    assert len(drawn) == 150
    assert sorted(int(pk) for _, pk in drawn) == sorted(job.pk for job in jobs)[:150]
    assert "The first 150 of its 200 jobs by id" in text(html)
    assert "50 are left out" in text(html)


def test_a_big_batch_shows_counts_and_its_callbacks_instead_of_a_graph(
    admin_client, django_assert_max_num_queries
):
    b = workflow(Workflow.Kind.BATCH, "nightly")
    scans = batch_of(b, 1_500, DONE) + batch_of(b, 500, QUEUED)
    notify = step(b, "notify", WAITING)
    Dependency.objects.bulk_create(
        [Dependency(job=notify, upstream=scan, position=i) for i, scan in enumerate(scans)]
    )
    notify.run_if = "done"
    notify.save(update_fields=["run_if"])
    with django_assert_max_num_queries(12):
        html = admin_client.get(page(b)).content.decode()
    assert nodes(html) == []
    assert 'id="vellum-graph"' not in html
    assert "A batch of 2001 jobs: too many to draw" in text(html)
    found = dict(re.findall(r'id="vellum-state-(\w+)" data-count="(\d+)"', html))
    assert (found[DONE], found[QUEUED], found[WAITING]) == ("1500", "500", "1")
    assert f'<a href="/admin/vellum_jobs/job/{notify.pk}/change/">#{notify.pk} notify</a>' in html


def test_a_workflow_without_jobs_says_so_and_an_unknown_one_is_404(admin_client):
    html = admin_client.get(page(workflow())).content.decode()
    assert "No jobs" in html and buttons(html) == []
    assert admin_client.get(reverse("admin:vellum_jobs_workflow_change", args=[10**9])).status_code == 404


# -- cancel and retry


def test_cancel_cancels_every_step_not_finished_and_asks_running_ones_to_stop(admin_client):
    w = workflow()
    done = step(w, state=DONE)
    running = step(w, state=RUNNING, started_at=timezone.now())
    queued = step(w, state=QUEUED)
    waiting = [step(w, state=WAITING, after=[running]), step(w, state=WAITING, after=[queued])]
    other = step(workflow(), state=QUEUED)
    assert buttons(admin_client.get(page(w)).content.decode()) == ["cancel"]

    response = admin_client.post(act(w), {"action": "cancel"}, follow=True)

    assert response.redirect_chain == [(page(w), 302)]
    assert messages_of(response) == [
        "Cancelled 3 steps.",
        "Asked 1 running step to stop: its handler sees should_stop() within a heartbeat.",
    ]
    states = dict(Job.objects.filter(workflow=w).values_list("pk", "state"))
    assert states == {
        done.pk: DONE,
        running.pk: RUNNING,
        queued.pk: CANCELLED,
        waiting[0].pk: CANCELLED,
        waiting[1].pk: CANCELLED,
    }
    running.refresh_from_db()
    assert running.cancel_requested_at is not None
    assert Job.objects.get(pk=other.pk).state == QUEUED
    w.refresh_from_db()
    assert w.cancelled_at is not None
    listed = admin_client.get(WORKFLOWS).content.decode()
    assert '<span class="vellum-badge vellum-badge-cancelled">cancel asked</span>' in listed
    again = admin_client.post(act(w), {"action": "cancel"}, follow=True)
    assert messages_of(again) == ["Nothing to cancel: every step has finished or was asked to stop."]


def test_retry_queues_the_steps_that_ran_and_makes_those_that_never_ran_wait_again(admin_client):
    w, (fetch, parse, save, report) = a_pipeline()
    stopped = step(w, "stopped", CANCELLED, attempts=1, finished_at=timezone.now())
    assert buttons(admin_client.get(page(w)).content.decode()) == ["cancel", "retry"]

    response = admin_client.post(act(w), {"action": "retry"}, follow=True)

    assert messages_of(response) == [
        "Retried 2 failed or cancelled steps: queued again if they had run, else waiting for the steps "
        "before them.",
    ]
    states = dict(Job.objects.filter(workflow=w).values_list("pk", "state"))
    assert states == {
        fetch.pk: DONE,
        parse.pk: QUEUED,
        save.pk: WAITING,
        report.pk: WAITING,
        stopped.pk: QUEUED,
    }


def test_retry_with_nothing_failed_says_so(admin_client):
    w = workflow()
    chain(w, 2)
    response = admin_client.post(act(w), {"action": "retry"}, follow=True)
    assert messages_of(response) == ["Nothing to retry: no step failed or was cancelled."]


def test_the_buttons_post_with_csrf_and_refuse_other_methods_and_actions(admin_user):
    w = workflow()
    queued = step(w)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    html = client.get(page(w)).content.decode()
    assert re.search(
        r'<form method="post" action="[^"]+/act/" class="vellum-buttons">'
        r'<input type="hidden" name="csrfmiddlewaretoken"',
        html,
    )
    assert client.post(act(w), {"action": "cancel"}).status_code == 403  # no token
    assert Job.objects.get(pk=queued.pk).state == QUEUED
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token is not None
    assert client.get(act(w)).status_code == 405
    assert client.post(act(w), {"action": "delete", "csrfmiddlewaretoken": token[1]}).status_code == 400
    assert client.post(page(w), {"csrfmiddlewaretoken": token[1]}).status_code == 405
    assert client.post(act(w), {"action": "cancel", "csrfmiddlewaretoken": token[1]}).status_code == 302
    assert Job.objects.get(pk=queued.pk).state == CANCELLED


# -- who may


@pytest.mark.parametrize(
    ("permissions", "sees", "may_act"),
    [
        ((), False, False),
        (("view_job",), True, False),
        (("change_job",), True, True),
        (("view_workflow",), True, False),
        (("change_workflow",), True, True),
    ],
)
def test_the_pages_follow_the_job_permissions_or_the_workflow_s_own(client, permissions, sees, may_act):
    w = workflow()
    queued = step(w)
    client.force_login(staff_user(*permissions))
    response = client.get(page(w))
    assert response.status_code == (200 if sees else 403)
    assert client.get(WORKFLOWS).status_code == (200 if sees else 403)
    if sees:
        assert buttons(response.content.decode()) == (["cancel"] if may_act else [])
    assert client.post(act(w), {"action": "cancel"}).status_code == (302 if may_act else 403)
    assert Job.objects.get(pk=queued.pk).state == (CANCELLED if may_act else QUEUED)
    assert client.get(reverse("admin:vellum_jobs_workflow_delete", args=[w.pk])).status_code == 403
    assert client.get(reverse("admin:vellum_jobs_workflow_add")).status_code == 403
