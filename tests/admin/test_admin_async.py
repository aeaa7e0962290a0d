"""The admin on async jobs and event loops: the async badge, the handler filter, the worker column."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from tests.support.admin_pages import JOBS, WORKERS, job_page, make, rows
from vellum_jobs.core.models import Job, Worker

pytestmark = pytest.mark.django_db

ASYNC_BADGE = '<span class="vellum-badge vellum-badge-async">async</span>'


def worker_rows(html: str) -> dict[str, str]:
    """The worker list's table rows by host."""
    found = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S):
        match = re.search(r'<th class="field-worker"><a href="[^"]*">([^<:]+):', row)
        if match:
            found[match[1]] = row
    return found


def test_the_list_badges_async_jobs_next_to_their_name_and_only_them(admin_client):
    coroutine = make(name="fetch_feed", is_async=True)
    plain = make(name="fetch_feed")
    running = make(Job.State.RUNNING, name="crawl", is_async=True)

    by_id = rows(admin_client.get(JOBS).content.decode())

    assert (
        f'<td class="field-name_and_handler"><a href="{job_page(coroutine)}">{ASYNC_BADGE} '
        '<span class="vellum-cut" title="fetch_feed">fetch_feed</span></a>' in (by_id[coroutine.pk])
    )
    assert f'{ASYNC_BADGE} <span class="vellum-cut" title="crawl">crawl</span></a>' in by_id[running.pk]
    assert '<span class="vellum-cut" title="fetch_feed">fetch_feed</span></a>' in by_id[plain.pk]
    assert "vellum-badge-async" not in by_id[plain.pk]


def test_the_badge_escapes_the_name_beside_it(admin_client):
    job = make(name="<b>x</b>", is_async=True)
    shown = (
        f'{ASYNC_BADGE} <span class="vellum-cut" title="&lt;b&gt;x&lt;/b&gt;">&lt;b&gt;x&lt;/b&gt;</span></a>'
    )
    assert shown in rows(admin_client.get(JOBS).content.decode())[job.pk]


@pytest.mark.parametrize(("value", "kept"), [("async", {"coroutine"}), ("sync", {"plain", "finished"})])
def test_the_handler_filter_keeps_only_async_or_only_sync_jobs(admin_client, value, kept):
    jobs = {
        "coroutine": make(is_async=True),
        "plain": make(),
        "finished": make(Job.State.DONE),
    }
    listed = rows(admin_client.get(JOBS, {"handler": value}).content.decode())
    assert set(listed) == {jobs[label].pk for label in kept}


def test_the_handler_filter_offers_async_and_sync(admin_client):
    html = admin_client.get(JOBS, {"handler": "async"}).content.decode()
    assert '<a href="?handler=async">async</a>' in html
    assert '<a href="?handler=sync">sync</a>' in html


def test_a_handler_value_it_does_not_know_lists_every_job(admin_client):
    jobs = {make(is_async=True).pk, make().pk}
    assert set(rows(admin_client.get(JOBS, {"handler": "threaded"}).content.decode())) == jobs


@pytest.mark.parametrize(
    ("is_async", "shown"),
    [
        (True, f"{ASYNC_BADGE} async def, on the worker's event loop"),
        (False, "sync, on a worker thread"),
    ],
)
def test_the_job_page_says_which_handler_runs_the_job(admin_client, is_async, shown):
    html = admin_client.get(job_page(make(is_async=is_async))).content.decode()
    field = re.search(r'field-handler\b.*?<div class="readonly">(.*?)</div>', html, re.S)
    assert field, "no handler field on the job page"
    assert field[1] == shown


def test_the_worker_list_shows_async_jobs_running_of_capacity_or_off(admin_client):
    Worker.objects.create(
        id=uuid.uuid4(), host="loop-1", pid=1, threads=4, async_workers=200, async_running=37
    )
    Worker.objects.create(id=uuid.uuid4(), host="idle-loop", pid=2, threads=4, async_workers=50)
    Worker.objects.create(id=uuid.uuid4(), host="threads-only", pid=3, threads=4)

    table = worker_rows(admin_client.get(WORKERS).content.decode())

    assert '<td class="field-async_in_use">37 / 200</td>' in table["loop-1"]
    assert '<td class="field-async_in_use">0 / 50</td>' in table["idle-loop"]
    assert '<td class="field-async_in_use">off</td>' in table["threads-only"]
    assert '<th scope="col" class="column-async_in_use">' in admin_client.get(WORKERS).content.decode()


def test_the_worker_page_shows_its_async_capacity_and_use_read_only(admin_client):
    worker = Worker.objects.create(
        id=uuid.uuid4(), host="loop-1", pid=1, threads=4, async_workers=200, async_running=37
    )
    html = admin_client.get(reverse("admin:vellum_jobs_worker_change", args=[worker.pk])).content.decode()
    for field, value in (("async_workers", "200"), ("async_running", "37")):
        found = re.search(rf'field-{field}\b.*?<div class="readonly">(.*?)</div>', html, re.S)
        assert found, field
        assert found[1] == value
    assert 'name="async_workers"' not in html and 'name="async_running"' not in html
