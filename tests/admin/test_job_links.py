"""The job page along a workflow: its workflow, its upstream and downstream jobs with their states,
and a waiting job's head ("waiting for #12 and #13"), its reason in the list, and cancelling it."""

from __future__ import annotations

import html as markup
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.admin_pages import JOBS, job_page, messages_of, post_action, rows
from tests.support.workflow_rows import batch_of, step, workflow
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Workflow

pytestmark = pytest.mark.django_db

WAITING, QUEUED, RUNNING = Job.State.WAITING, Job.State.QUEUED, Job.State.RUNNING
DONE, FAILED, CANCELLED = Job.State.DONE, Job.State.FAILED, Job.State.CANCELLED


def summary(html: str) -> str:
    start = html.index('id="vellum-summary"')
    return html[start : html.index("</section>", start)]


def text(html: str) -> str:
    return markup.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip())


def part(html: str, id: str) -> str:
    start = html.index(f'id="{id}"')
    return html[start : html.index("</ul>", start)]


def test_a_waiting_job_s_head_says_which_jobs_it_waits_for_each_linked(admin_client):
    w = workflow()
    a, b, c = step(w, "a", DONE), step(w, "b", RUNNING), step(w, "c", QUEUED)
    merge = step(w, "merge", WAITING, after=[a, b, c])
    head = summary(admin_client.get(job_page(merge)).content.decode())
    line = re.search(r'<span class="vellum-summary-line">(.*?)</span>\s*<form', head, re.S)
    assert line is not None
    assert text(line[1]) == f"waiting for #{b.pk} and #{c.pk}"
    assert f'<a href="{job_page(b)}">#{b.pk}</a>' in line[1]
    assert '<span class="vellum-badge vellum-badge-waiting">waiting</span>' in head
    assert re.findall(r'name="action" value="(\w+)"', head) == ["cancel"]


def test_past_five_the_head_counts_the_rest(admin_client):
    w = workflow()
    ups = batch_of(w, 8, QUEUED)
    job = step(w, state=WAITING, after=ups)
    head = text(summary(admin_client.get(job_page(job)).content.decode()))
    named = ", ".join(f"#{up.pk}" for up in ups[:5])
    assert f"waiting for {named} and 3 more" in head


def test_a_waiting_job_whose_upstream_jobs_ended_says_it_is_about_to_be_released(admin_client):
    w = workflow()
    job = step(w, state=WAITING, after=[step(w, state=DONE)])
    head = text(summary(admin_client.get(job_page(job)).content.decode()))
    assert "waiting: its upstream jobs have all ended, so it is about to be queued or cancelled" in head


def test_the_page_links_to_its_workflow_and_its_upstream_and_downstream_jobs_with_states(admin_client):
    w = workflow(name="import")
    fetch = step(w, "fetch", DONE)
    parse = step(w, "parse", RUNNING, after=[fetch], run_if="finished")
    parse.upstream_arg = "result"
    parse.save(update_fields=["upstream_arg"])
    save = step(w, "save", WAITING, after=[parse])
    html = admin_client.get(job_page(parse)).content.decode()
    head = summary(html)
    workflow_url = reverse("admin:vellum_jobs_workflow_change", args=[w.pk])
    assert f'A step of <a href="{workflow_url}">workflow #{w.pk} import</a>: 1 of 3 finished.' in head
    upstream = part(head, "vellum-upstream")
    assert f'<a href="{job_page(fetch)}">#{fetch.pk} fetch</a>' in upstream
    assert '<span class="vellum-badge vellum-badge-done">done</span>' in upstream
    downstream = part(head, "vellum-downstream")
    assert f'<a href="{job_page(save)}">#{save.pk} save</a>' in downstream
    assert '<span class="vellum-badge vellum-badge-waiting">waiting</span>' in downstream
    assert text(head).count("runs once they have all ended, whatever they ended as") == 1
    assert "; handed its upstream job's result as its first argument." in text(head)


def test_a_callback_behind_many_jobs_lists_ten_and_counts_the_rest_by_state(
    admin_client, django_assert_max_num_queries
):
    b = workflow(Workflow.Kind.BATCH)
    ups = batch_of(b, 30, DONE) + batch_of(b, 20, FAILED)
    notify = step(b, "notify", WAITING, after=ups, run_if="failed")
    with django_assert_max_num_queries(20):
        html = admin_client.get(job_page(notify)).content.decode()
    upstream = part(summary(html), "vellum-upstream")
    assert upstream.count('class="vellum-badge') == 10
    assert "and 40 more: of them all, 30 done, 20 failed" in text(upstream)
    assert text(summary(html)).count(f"A step of batch #{b.pk}: 50 of 51 finished") == 1


def test_a_job_outside_any_workflow_has_no_links_part(admin_client):
    job = step(None)
    assert 'id="vellum-links"' not in admin_client.get(job_page(job)).content.decode()


def test_a_job_enqueued_after_another_outside_a_workflow_links_both_ways(admin_client):
    first = step(None, "first", DONE)
    then = step(None, "then", WAITING, after=[first])
    html = admin_client.get(job_page(first)).content.decode()
    assert "A step of" not in html
    assert f'<a href="{job_page(then)}">#{then.pk} then</a>' in part(html, "vellum-downstream")


def test_a_job_cancelled_by_its_upstream_job_says_why(admin_client):
    w = workflow()
    failed = step(w, state=FAILED)
    job = step(
        w,
        state=CANCELLED,
        after=[failed],
        finished_at=timezone.now(),
        error=f"upstream: job #{failed.pk} failed",
    )
    head = summary(admin_client.get(job_page(job)).content.decode())
    assert f'<p class="vellum-error-line">upstream: job #{failed.pk} failed</p>' in head
    # Its retry waits again for the job before it, and says so.
    assert re.findall(r'name="action" value="(\w+)"', head) == ["retry"]
    assert "wait again for the jobs before it" in head
    assert re.findall(
        r'name="action" value="(\w+)"', summary(admin_client.get(job_page(failed)).content.decode())
    ) == ["retry"]


def test_the_job_list_shows_what_each_waiting_job_waits_for_and_filters_them(admin_client):
    w = workflow()
    up = step(w, state=RUNNING)
    waiting = step(w, state=WAITING, after=[up])
    step(w, state=QUEUED)
    html = admin_client.get(JOBS, {"state__exact": WAITING}).content.decode()
    found = rows(html)
    assert set(found) == {waiting.pk}
    assert f"waiting for #{up.pk}" in found[waiting.pk]
    assert 'href="?state__exact=waiting"' in html


def test_the_list_s_cancel_action_cancels_waiting_jobs_too(admin_client):
    w = workflow()
    waiting = step(w, state=WAITING, after=[step(w, state=RUNNING)])
    response = post_action(admin_client, "cancel", [waiting])
    assert messages_of(response) == ["Cancelled 1 job."]
    assert Job.objects.get(pk=waiting.pk).state == CANCELLED
