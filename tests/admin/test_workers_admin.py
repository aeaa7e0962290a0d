"""The worker list and page: what each worker shows, and stopping one gracefully from the admin,
in-process and with real ``runjobs`` processes (alone, and under ``--processes``)."""

from __future__ import annotations

import re
import signal
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.support.admin_pages import JOBS, WORKERS, make, messages_of, staff_user
from tests.support.processes import Runjobs, children_of, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job, Worker

# The subprocesses' heartbeat: short, so that a stop request is seen within a test.
QUICK_BEAT = {"VELLUM_TEST_HEARTBEAT": "0.2s"}


def worker(**fields) -> Worker:
    fields.setdefault("threads", 4)
    return Worker.objects.create(
        id=uuid.uuid4(), host=fields.pop("host", "box"), pid=fields.pop("pid", 1), **fields
    )


def worker_rows(html: str) -> dict[str, str]:
    """The list's table rows by ``host:pid``."""
    found = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S):
        match = re.search(r'<th class="field-worker"><a href="[^"]*">([^<]+)<', row)
        if match:
            found[match[1]] = row
    return found


def page(row: Worker) -> str:
    return reverse("admin:vellum_jobs_worker_change", args=[row.pk])


def stop_url(row: Worker) -> str:
    return reverse("admin:vellum_jobs_worker_stop", args=[row.pk])


def stop_action(client, *rows: Worker):
    data = {"action": "stop_gracefully", "_selected_action": [str(r.pk) for r in rows], "index": 0}
    return client.post(WORKERS, data, follow=True)


# -- the list ----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_list_shows_liveness_and_the_last_beat_to_the_second_uptime_jobs_run_and_memory(admin_client):
    now = timezone.now()
    beat = now - timedelta(seconds=3)
    worker(
        host="web-1",
        pid=101,
        started_at=now - timedelta(hours=2, minutes=5),
        last_heartbeat=beat,
        jobs_run=12345,
        memory=150 * 1024 * 1024,
    )
    worker(host="web-2", pid=202, last_heartbeat=now - timedelta(minutes=10), trouble="leases not renewed")
    table = worker_rows(admin_client.get(WORKERS).content.decode())
    first, second = table["web-1:101"], table["web-2:202"]
    assert "vellum-badge-alive" in first
    assert "beat <time" in first and timezone.localtime(beat).strftime("%H:%M:%S") in first
    assert re.search(r"\((3|4|5) s ago\)", first)  # whole seconds
    assert '<td class="field-uptime"><span title="started' in first and ">2 h 5 min</span>" in first
    assert '<td class="field-jobs_run_count">12,345</td>' in first
    assert '<td class="field-memory_held">150.0\xa0MB</td>' in first
    assert "vellum-badge-stale" in second and "silent for 10 min" in second
    assert "leases not renewed" in second
    assert '<td class="field-memory_held">-</td>' in second  # an old worker's row: not measured


@pytest.mark.django_db
def test_the_list_shows_each_workers_running_jobs_with_their_progress_linked_in_a_few_queries(admin_client):
    busy, idle = worker(host="busy", pid=1, threads=4), worker(host="idle", pid=2, threads=2)
    halfway = make(
        Job.State.RUNNING, worker_id=busy.pk, name="media.encode", progress_done=5, progress_total=10
    )
    plain = make(Job.State.RUNNING, worker_id=busy.pk, started_at=timezone.now() - timedelta(seconds=90))
    more = [make(Job.State.RUNNING, worker_id=busy.pk) for _ in range(5)]
    make(Job.State.DONE, worker_id=idle.pk)
    with CaptureQueriesContext(connection) as queries:
        table = worker_rows(admin_client.get(WORKERS).content.decode())
    row = table["busy:1"]
    assert f'{JOBS}?state__exact=running&amp;worker_id={busy.pk}">7</a>' in row
    job_page = reverse("admin:vellum_jobs_job_change", args=[halfway.pk])
    assert f'<a href="{job_page}">#{halfway.pk} media.encode</a>' in row
    assert '<progress max="10" value="5">50%</progress> 5/10 (50%)' in row
    assert f"#{plain.pk} test.add</a> <span" in row and ">1 min 30 s<" in row
    assert f"#{more[2].pk} " in row and f"#{more[3].pk} " not in row  # the first five, then a count
    assert "<li>and 2 more</li>" in row
    assert ">4 / 4<" in row  # seven running jobs, four threads
    assert f'worker_id={idle.pk}">0</a>' in table["idle:2"] and "vellum-worker-jobs" not in table["idle:2"]
    before = len(queries)
    for n in range(5):
        worker(host=f"more-{n}", pid=10 + n)
        make(Job.State.RUNNING, worker_id=worker(host=f"busier-{n}", pid=20 + n).pk)
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(WORKERS)
    assert len(queries) == before  # the running jobs of a page: one query, however many workers


@pytest.mark.django_db
def test_a_worker_asked_to_stop_says_so_and_by_whom(admin_client):
    asked = worker(host="asked", stop_requested_at=timezone.now(), stop_requested_by="admin: ann")
    row = worker_rows(admin_client.get(WORKERS).content.decode())["asked:1"]
    assert "vellum-badge-stopping" in row and "by admin: ann" in row
    html = admin_client.get(page(asked)).content.decode()
    assert "by admin: ann" in html
    assert "Stop gracefully</button>" not in html  # asked already


# -- asking to stop ----------------------------------------------------------------


@pytest.mark.django_db
def test_the_stop_action_records_who_asked_once(admin_client):
    one, two = worker(host="one"), worker(host="two")
    response = stop_action(admin_client, one)
    assert messages_of(response)[0].startswith(
        "Asked 1 worker to stop: each stops claiming at its next heartbeat"
    )
    one.refresh_from_db()
    asked_at = one.stop_requested_at
    assert asked_at is not None and one.stop_requested_by == "admin: admin"
    response = stop_action(admin_client, one, two)
    assert messages_of(response)[0].endswith(" 1 had been asked already.")
    one.refresh_from_db()
    two.refresh_from_db()
    assert one.stop_requested_at == asked_at  # the first request stands
    assert two.stop_requested_at is not None


@pytest.mark.django_db
def test_the_worker_page_has_a_stop_button_for_staff_who_may_change_workers(admin_client, client):
    row = worker(host="box")
    html = admin_client.get(page(row)).content.decode()
    assert f'action="{stop_url(row)}"' in html and "Stop gracefully</button>" in html
    response = admin_client.post(stop_url(row), follow=True)
    assert response.redirect_chain[-1][0] == page(row)
    assert messages_of(response)[0].startswith("Asked 1 worker to stop")
    row.refresh_from_db()
    assert row.stop_requested_by == "admin: admin"
    assert admin_client.get(stop_url(row)).status_code == 405  # a POST only
    gone = reverse("admin:vellum_jobs_worker_stop", args=[uuid.uuid4()])
    assert admin_client.post(gone).status_code == 404  # it stopped meanwhile

    viewer, other = staff_user("view_worker"), worker(host="other", pid=2)
    client.force_login(viewer)
    html = client.get(page(other)).content.decode()
    assert "Stop gracefully" not in html
    assert client.post(stop_url(other)).status_code == 403
    assert 'value="stop_gracefully"' not in client.get(WORKERS).content.decode()
    other.refresh_from_db()
    assert other.stop_requested_at is None


# -- real runjobs processes --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_runjobs_process_stopped_from_the_admin_finishes_its_job_claims_nothing_more_and_exits_0(
    admin_client, tmp_path
):
    release = tmp_path / "release"
    running = jobs.sleep.enqueue(60, release_file=str(release))
    waiting = jobs.record.enqueue("waiting")
    process = Runjobs("--workers", "1", "--grace", "60", env=QUICK_BEAT)
    try:
        wait_for(lambda: Execution.objects.filter(job_id=running.pk).exists(), what="the job to start")
        row = Worker.objects.get(pid=process.pid)
        assert messages_of(stop_action(admin_client, row))[0].startswith("Asked 1 worker to stop")
        wait_for(
            lambda: "asked this worker to stop: it stops gracefully" in process.output()[1],
            what="the beat to see it",
        )
        release.touch()  # the running job may finish only now, after the worker stopped claiming
        assert process.wait() == 0
    finally:
        process.stop()
    err = process.output()[1]
    assert f"worker_id={row.pk} by='admin: admin' grace=60s" in err
    assert "supervisor" not in err and "handed back" not in err
    assert Job.objects.get(pk=running.pk).state == Job.State.DONE
    assert Job.objects.get(pk=waiting.pk).attempts == 0  # nothing claimed after the request
    assert not Worker.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_stopping_one_process_of_runjobs_processes_stops_the_whole_set_and_none_is_restarted(
    admin_client, tmp_path
):
    release = tmp_path / "release"
    running = jobs.sleep.enqueue(60, release_file=str(release))
    supervisor = Runjobs("--processes", "2", "--workers", "1", "--grace", "60", env=QUICK_BEAT)
    try:
        children = wait_for(
            lambda: (
                (pids := set(Worker.objects.values_list("pid", flat=True))) == children_of(supervisor.pid)
                and len(pids) == 2
                and pids
            ),
            what="two worker processes",
        )
        wait_for(lambda: Execution.objects.filter(job_id=running.pk).exists(), what="the job to start")
        holder = Worker.objects.get(pk=Job.objects.get(pk=running.pk).worker_id)
        stop_action(admin_client, holder)
        wait_for(lambda: "its processes stop too" in supervisor.output()[1], what="the beat to see it")
        release.touch()
        assert supervisor.wait() == 0
    finally:
        if supervisor.process.poll() is None:
            supervisor.signal(signal.SIGTERM)
        supervisor.stop()
    err = supervisor.output()[1]
    assert f"by='admin: admin' grace=60s supervisor_pid={supervisor.pid}" in err
    assert "restarting" not in err  # the supervisor's warning for a process it starts again
    assert Job.objects.get(pk=running.pk).state == Job.State.DONE
    assert not Worker.objects.exists()
    assert not children_of(supervisor.pid) and children
