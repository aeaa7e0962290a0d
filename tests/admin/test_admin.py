"""The job and worker admin through Django's test client.

Every column, filter, action and permission, plus search, the counts above
the list and the paginator that does not count the whole table.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from example_project.library.models import Library
from tests.support.admin_pages import (
    JOBS,
    WORKERS,
    job_page,
    make,
    messages_of,
    post_action,
    rows,
    staff_user,
)
from tests.testapp import models as testapp
from vellum_jobs.admin import pagination
from vellum_jobs.admin.jobs import JobAdmin
from vellum_jobs.core.models import Job, Queue, Worker
from vellum_jobs.observe import figures

pytestmark = pytest.mark.django_db


# -- columns


def test_a_running_job_that_never_reported_progress_has_no_bar(admin_client):
    job = make(Job.State.RUNNING, started_at=timezone.now())
    assert "<progress" not in rows(admin_client.get(JOBS).content.decode())[job.pk]


def test_progress_without_a_total_shows_the_count(admin_client):
    job = make(Job.State.RUNNING, started_at=timezone.now(), progress_done=12)
    row = rows(admin_client.get(JOBS).content.decode())[job.pk]
    assert "<progress></progress> 12" in row


@pytest.mark.parametrize(
    ("target", "permission", "expected"),
    [
        ("unregistered", "testapp.view_library", "library: Library object ({pk})"),
        ("deleted", "library.view_library", "library #{pk} (deleted)"),
    ],
)
def test_a_reference_is_plain_text_without_an_admin_page_to_open(client, target, permission, expected):
    if target == "unregistered":
        obj = testapp.Library.objects.create(name="Jazz")
    else:
        obj = Library.objects.create(name="Music", path="/music")
    job = make(ref_type=ContentType.objects.get_for_model(obj), ref_id=str(obj.pk))
    pk = obj.pk
    if target == "deleted":
        obj.delete()
    client.force_login(staff_user("view_job", permission))
    row = rows(client.get(JOBS).content.decode())[job.pk]
    assert expected.format(pk=pk) in row
    assert "/admin/library/" not in row


@pytest.mark.parametrize("permission", ["library.view_library", "library.change_library"])
def test_a_reference_shows_the_object_to_a_user_who_may_view_its_model(client, permission):
    library = Library.objects.create(name="Music", path="/music")
    job = make(ref_type=ContentType.objects.get_for_model(library), ref_id=str(library.pk))
    client.force_login(staff_user("view_job", permission))
    link = reverse("admin:library_library_change", args=[library.pk])
    shown = f'<a class="vellum-cut" href="{link}" title="library: Music">library: Music</a>'
    assert shown in rows(client.get(JOBS).content.decode())[job.pk]
    assert shown in client.get(job_page(job)).content.decode()


def test_a_reference_shows_only_its_model_and_id_to_a_user_who_may_not_view_that_model(client):
    music = Library.objects.create(name="Music", path="/music")
    jazz = testapp.Library.objects.create(name="Jazz")
    gone = Library.objects.create(name="Gone", path="/gone")
    jobs = {
        f"library.Library #{music.pk}": make(
            ref_type=ContentType.objects.get_for_model(music), ref_id=music.pk
        ),
        f"testapp.Library #{jazz.pk}": make(ref_type=ContentType.objects.get_for_model(jazz), ref_id=jazz.pk),
        f"library.Library #{gone.pk}": make(ref_type=ContentType.objects.get_for_model(gone), ref_id=gone.pk),
    }
    gone.delete()
    client.force_login(staff_user("view_job"))
    with CaptureQueriesContext(connection) as captured:
        by_id = rows(client.get(JOBS).content.decode())
    for label, job in jobs.items():
        assert (
            f'<td class="field-reference"><span class="vellum-cut" title="{label}">{label}</span></td>'
            in (by_id[job.pk])
        )
        page = client.get(job_page(job)).content.decode()
        assert label in page
        assert "Music" not in page and "Jazz" not in page and "deleted" not in page
    assert "Music" not in "".join(by_id.values()) and "Jazz" not in "".join(by_id.values())
    assert "/admin/library/" not in "".join(by_id.values())
    # The objects are not even read.
    tables = (Library._meta.db_table, testapp.Library._meta.db_table)
    assert not [q["sql"] for q in captured if any(table in q["sql"] for table in tables)]


def test_a_reference_to_a_model_that_is_gone_is_described_not_fetched(admin_client):
    gone = ContentType.objects.create(app_label="attic", model="record")
    job = make(ref_type=gone, ref_id="7")
    assert "attic.record #7 (model gone)" in rows(admin_client.get(JOBS).content.decode())[job.pk]


def test_references_cost_one_query_per_model_whatever_the_page_size(admin_client, measured_clock):
    def queries_for(n: int) -> int:
        Job.objects.all().delete()
        for i in range(n):
            library = Library.objects.create(name=f"L{i}", path="/")
            document = testapp.Document.objects.create(title=f"D{i}")
            for obj in (library, document):
                make(ref_type=ContentType.objects.get_for_model(obj), ref_id=str(obj.pk))
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(JOBS).status_code == 200
        return len(captured)

    assert queries_for(2) == queries_for(30)


# -- filters


def test_state_filter_lists_jobs_of_that_state(admin_client):
    failed, done = make(Job.State.FAILED), make(Job.State.DONE)
    listed = rows(admin_client.get(JOBS, {"state__exact": "failed"}).content.decode())
    assert set(listed) == {failed.pk}
    assert done.pk not in listed


def test_name_and_queue_filters_list_jobs_with_that_value(admin_client):
    scan = make(name="scan", queue="media")
    make(name="test.add", queue="default")
    assert set(rows(admin_client.get(JOBS, {"name": "scan"}).content.decode())) == {scan.pk}
    assert set(rows(admin_client.get(JOBS, {"queue": "media"}).content.decode())) == {scan.pk}


def test_filter_choices_come_from_the_registry_and_workers_without_reading_jobs(admin_client):
    Worker.objects.create(id=uuid.uuid4(), host="h", pid=1, threads=1, queues=["thumbnails"])
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(JOBS)
    html = response.content.decode()
    assert '<a href="?name=test.add">test.add</a>' in html
    assert '<a href="?name=scan">scan</a>' in html
    assert '<a href="?queue=media">media</a>' in html  # the example's scan job
    assert '<a href="?queue=thumbnails">thumbnails</a>' in html  # a worker's
    assert not [q["sql"] for q in captured if "DISTINCT" in q["sql"].upper()]


def test_a_value_in_the_url_that_is_not_registered_still_filters_and_shows(admin_client):
    orphan = make(name="retired.job", queue="old")
    response = admin_client.get(JOBS, {"name": "retired.job"})
    assert set(rows(response.content.decode())) == {orphan.pk}
    assert "retired.job</a>" in response.content.decode()


# -- search


def test_search_by_id_finds_that_job_with_one_primary_key_lookup(admin_client):
    jobs = [make(error=f"failed at step {i}") for i in range(3)]
    for term in (str(jobs[1].pk), f"#{jobs[1].pk}", f"{'0' * 30}{jobs[1].pk}"):
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(JOBS, {"q": term})
        assert set(rows(response.content.decode())) == {jobs[1].pk}
        assert not [q for q in captured if "LIKE" in q["sql"].upper()]


def test_search_by_text_matches_names_and_errors(admin_client):
    by_name = make(name="library.scan")
    by_error = make(Job.State.FAILED, error="Traceback ...\nTimeoutError: cover art server")
    make(name="test.add", error="")
    assert set(rows(admin_client.get(JOBS, {"q": "scan"}).content.decode())) == {by_name.pk}
    assert set(rows(admin_client.get(JOBS, {"q": "timeouterror"}).content.decode())) == {by_error.pk}
    assert set(rows(admin_client.get(JOBS, {"q": '"cover art"'}).content.decode())) == {by_error.pk}


def test_a_words_search_reads_the_newest_jobs_and_links_to_a_search_of_all(admin_client, monkeypatch):
    """On a big table a word few jobs hold would read every row; by default the newest ids only."""
    monkeypatch.setattr(JobAdmin, "search_window", 3)
    old = make(Job.State.FAILED, error="KeyError: needle")
    make(), make()
    recent = make(Job.State.FAILED, error="KeyError: needle again")
    make()
    response = admin_client.get(JOBS, {"q": "needle"})
    page = response.content.decode()
    assert set(rows(page)) == {recent.pk}
    assert "Searched the newest 3 jobs." in page
    link = re.search(r'<a href="([^"]+)">Search all jobs</a>', page)
    assert link is not None
    every = admin_client.get(JOBS + link[1].replace("&amp;", "&"))
    assert every.status_code == 200
    assert set(rows(every.content.decode())) == {recent.pk, old.pk}
    assert "Searched the newest" not in every.content.decode()


def test_a_words_search_of_a_table_within_the_window_says_nothing_of_it(admin_client, monkeypatch):
    monkeypatch.setattr(JobAdmin, "search_window", 3)
    jobs = [make(Job.State.FAILED, error="KeyError: needle") for _ in range(3)]
    page = admin_client.get(JOBS, {"q": "needle"}).content.decode()
    assert set(rows(page)) == {job.pk for job in jobs}
    assert "Searched the newest" not in page


def test_a_search_by_id_and_the_filters_see_every_job_whatever_the_window(admin_client, monkeypatch):
    monkeypatch.setattr(JobAdmin, "search_window", 1)
    old = make(Job.State.FAILED, error="KeyError: needle")
    make(), make()
    assert set(rows(admin_client.get(JOBS, {"q": str(old.pk)}).content.decode())) == {old.pk}
    filtered = admin_client.get(JOBS, {"state__exact": "failed", "search_all": "1"})
    assert filtered.status_code == 200
    assert set(rows(filtered.content.decode())) == {old.pk}


@pytest.mark.parametrize(
    "term",
    ["9" * 30, "99999999999999999999999", str(2**63), "#" + "9" * 20, "9" * 5000, "#" + "9" * 4301],
    ids=["30 digits", "23 digits", "2**63", "#20 digits", "5000 digits", "#4301 digits"],
)
def test_search_for_a_number_too_big_for_an_id_finds_no_id_and_searches_the_text(admin_client, term):
    """Past 4,300 digits int() refuses the number (Python's limit on int digits): it is never read as one."""
    make(error="ValueError: 9")
    mentioned = make(Job.State.FAILED, error=f"LookupError: order {term} not found")
    response = admin_client.get(JOBS, {"q": term})
    assert response.status_code == 200
    assert set(rows(response.content.decode())) == {mentioned.pk}


@pytest.mark.parametrize("term", ["²", "#²", "1²", "½", "Ⅻ"])
def test_search_for_a_digit_that_is_not_a_decimal_number_searches_the_text(admin_client, term):
    plain = make(name="test.add")
    squared = make(Job.State.FAILED, error=f"ValueError: x{term} is not allowed")
    response = admin_client.get(JOBS, {"q": term})
    assert response.status_code == 200
    assert set(rows(response.content.decode())) == {squared.pk}
    assert plain.pk not in rows(response.content.decode())


def test_search_for_decimal_digits_of_another_script_finds_that_id(admin_client):
    job = make()
    arabic_indic = str(job.pk).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    response = admin_client.get(JOBS, {"q": arabic_indic})
    assert response.status_code == 200
    assert set(rows(response.content.decode())) == {job.pk}


@pytest.mark.parametrize("param", ["name", "queue", "state__exact"])
def test_a_filter_value_with_a_nul_character_is_a_bad_filter_not_an_error(admin_client, param):
    make()
    response = admin_client.get(JOBS, {param: "test\x00add"})
    # What Django's admin answers for any filter it cannot apply.
    assert (response.status_code, response["Location"]) == (302, f"{JOBS}?e=1")
    assert admin_client.get(response["Location"]).status_code == 200


# -- counts and pagination


def test_counts_by_state_above_the_list_link_to_their_filter(admin_client):
    for state, n in [("queued", 3), ("failed", 2), ("done", 1)]:
        for _ in range(n):
            make(state)
    html = admin_client.get(JOBS, {"state__exact": "failed"}).content.decode()
    bar = html[
        html.index('class="vellum-counts"') : html.index("</nav>", html.index('class="vellum-counts"'))
    ]
    for state, n in [("queued", 3), ("running", 0), ("done", 1), ("failed", 2), ("cancelled", 0)]:
        link = re.search(rf'<a href="\?state__exact={state}" class="([^"]*)"[^>]*>(.*?)</a>', bar, re.S)
        assert link, state
        assert f"vellum-badge-{state}" in link[2] and link[2].strip().endswith(str(n))
        assert ("selected" in link[1]) == (state == "failed")


# Where the database keeps statistics, a state past the limit is the planner's estimate.
ESTIMATES = {"sqlite": "more than", "postgresql": "about", "mysql": "about"}


def test_a_state_past_the_count_limit_is_estimated_or_a_lower_bound(vendor):
    for _ in range(30):
        make(Job.State.DONE)
    make(Job.State.FAILED)
    if vendor == "postgresql":
        # MariaDB estimates from the index itself; its ANALYZE TABLE would
        # also commit the test's transaction.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Job._meta.db_table}")
    found = {c.state: c for c in figures.by_state(Job.objects.all(), limit=10)}
    assert (found["failed"].count, found["failed"].precision, found["failed"].text) == (1, "exact", "1")
    assert found["done"].precision == ESTIMATES[vendor]
    if ESTIMATES[vendor] == "about":
        assert 20 <= found["done"].count <= 40
    else:
        assert found["done"].text == "more than 10"


@pytest.fixture
def small_pages(monkeypatch):
    """Two jobs a page, counting stops at ten rows (and never less than two pages ahead)."""
    monkeypatch.setattr(JobAdmin, "list_per_page", 2)
    monkeypatch.setattr(pagination, "COUNT_LIMIT", 10)
    monkeypatch.setattr(pagination, "PAGES_AHEAD", 2)


def test_a_long_list_is_counted_only_a_few_pages_ahead(admin_client, small_pages):
    for _ in range(30):
        make()
    with CaptureQueriesContext(connection) as captured:
        html = admin_client.get(JOBS).content.decode()
    job_counts = [
        q["sql"] for q in captured if "COUNT(" in q["sql"].upper() and Job._meta.db_table in q["sql"]
    ]
    assert job_counts and all("LIMIT" in sql.upper() for sql in job_counts)
    assert "10+ jobs" in html
    assert "Select all 10+ jobs" in html
    assert "All matching jobs selected" in html
    assert '?p=6"' in html and '?p=7"' not in html


def test_a_page_past_the_count_limit_opens_and_counts_further(admin_client, small_pages):
    jobs = [make() for _ in range(30)]
    response = admin_client.get(JOBS, {"p": 6})
    assert response.status_code == 200
    assert set(rows(response.content.decode())) == {jobs[-11].pk, jobs[-12].pk}
    assert "16+ jobs" in response.content.decode()


@pytest.mark.parametrize("page", ["100000000000000000000", str(2**63), "9" * 40])
def test_a_page_past_any_range_is_a_page_out_of_range_not_an_error(admin_client, small_pages, page):
    for _ in range(30):
        make()
    response = admin_client.get(JOBS, {"p": page})
    # Django's admin sends any page out of range back to the list with ?e=1.
    assert (response.status_code, response["Location"]) == (302, f"{JOBS}?e=1")
    assert admin_client.get(response["Location"]).status_code == 200
    just_past_the_end = admin_client.get(JOBS, {"p": 16})
    assert (just_past_the_end.status_code, just_past_the_end["Location"]) == (302, f"{JOBS}?e=1")


def test_a_page_past_any_range_of_a_one_page_list_shows_that_page(admin_client):
    job = make()
    response = admin_client.get(JOBS, {"p": "100000000000000000000"})
    assert response.status_code == 200
    assert set(rows(response.content.decode())) == {job.pk}


def test_a_short_list_shows_its_exact_count(admin_client):
    for _ in range(3):
        make()
    assert "3 jobs" in admin_client.get(JOBS).content.decode()


# -- the job page


def test_json_up_to_the_fold_is_not_folded(admin_client):
    # '"' + 1,998 characters + '"' is exactly 2,000 characters of JSON.
    job = make(Job.State.DONE, result="x" * 1998)
    html = admin_client.get(job_page(job)).content.decode()
    assert '<details class="vellum-json">' not in html
    assert f'<pre class="vellum-pre">&quot;{"x" * 1998}&quot;</pre>' in html
    job = make(Job.State.DONE, result="x" * 1999)
    assert '<details class="vellum-json">' in admin_client.get(job_page(job)).content.decode()


def test_the_job_page_refuses_a_save(admin_client):
    job = make(name="keep")
    response = admin_client.post(job_page(job), {"name": "changed", "state": "done"})
    assert response.status_code == 403
    job.refresh_from_db()
    assert (job.name, job.state) == ("keep", Job.State.QUEUED)


def test_jobs_cannot_be_added_in_the_admin(admin_client):
    assert admin_client.get(reverse("admin:vellum_jobs_job_add")).status_code == 403
    assert reverse("admin:vellum_jobs_job_add") not in admin_client.get(JOBS).content.decode()


# -- actions


def test_retry_queues_failed_and_cancelled_jobs_due_now_and_skips_the_rest(admin_client):
    later = timezone.now() + timedelta(days=1)
    failed = make(Job.State.FAILED, attempts=5, run_after=later, finished_at=timezone.now(), error="boom")
    cancelled = make(Job.State.CANCELLED, run_after=later, finished_at=timezone.now())
    done = make(Job.State.DONE, attempts=1, finished_at=timezone.now())
    response = post_action(admin_client, "retry", [failed, cancelled, done])
    assert messages_of(response) == [
        "Retried 2 jobs: queued again, due now.",
        "Skipped 1 job that were not failed or cancelled.",
    ]
    for job in (failed, cancelled):
        job.refresh_from_db()
        assert (job.state, job.attempts, job.finished_at) == (Job.State.QUEUED, 0, None)
        assert job.run_after <= timezone.now()
    done.refresh_from_db()
    assert done.state == Job.State.DONE


def test_cancel_cancels_queued_jobs_asks_running_ones_to_stop_and_skips_the_rest(admin_client):
    queued, running, done = make(), make(Job.State.RUNNING), make(Job.State.DONE)
    response = post_action(admin_client, "cancel", [queued, running, done])
    assert messages_of(response) == [
        "Cancelled 1 job.",
        "Asked 1 running job to stop: its handler sees should_stop() within a heartbeat.",
        "Skipped 1 job that was finished or already asked to stop.",
    ]
    for job in (queued, running, done):
        job.refresh_from_db()
    assert (queued.state, running.state, done.state) == (
        Job.State.CANCELLED,
        Job.State.RUNNING,
        Job.State.DONE,
    )
    assert queued.finished_at is not None
    assert running.cancel_requested_at is not None
    assert done.cancel_requested_at is None


def test_pause_and_resume_the_queues_of_selected_jobs(admin_client):
    from vellum_jobs import queues

    media, mail = make(queue="media"), make(queue="mail")
    response = post_action(admin_client, "pause_queues", [media, mail])
    assert messages_of(response) == ["Paused mail, media. Running jobs finish; no new ones start."]
    assert queues.paused() == ["mail", "media"]
    assert Queue.objects.get(name="media").paused_by == "admin: admin"
    response = post_action(admin_client, "resume_queues", [media])
    assert messages_of(response) == ["Resumed media."]
    assert queues.paused() == ["mail"]


def test_the_queue_list_shows_known_queues_and_pauses_and_resumes_them(admin_client):
    url = reverse("admin:vellum_jobs_queue_changelist")
    response = admin_client.get(url)
    assert response.status_code == 200
    assert "default" in set(Queue.objects.values_list("name", flat=True))
    assert "vellum-badge-running" in response.content.decode()
    data = {"action": "pause", "_selected_action": ["default"], "index": 0}
    response = admin_client.post(url, data, follow=True)
    assert messages_of(response) == ["Paused 1: default. Running jobs finish."]
    assert Queue.objects.get(name="default").is_paused
    assert "vellum-badge-paused" in admin_client.get(url).content.decode()
    data = {"action": "resume", "_selected_action": ["default"], "index": 0}
    admin_client.post(url, data, follow=True)
    assert not Queue.objects.get(name="default").is_paused


def test_adding_a_queue_pauses_it(admin_client):
    # A name nobody used needs "create" (tests/admin/test_queues_schedules_admin.py).
    data = {"name": "imports", "create": "on"}
    response = admin_client.post(reverse("admin:vellum_jobs_queue_add"), data, follow=True)
    assert response.status_code == 200
    queue = Queue.objects.get(name="imports")
    assert queue.is_paused
    assert queue.paused_by == "admin: admin"


def test_run_now_makes_delayed_jobs_due_and_leaves_due_ones_their_place(admin_client):
    delayed = make(run_after=timezone.now() + timedelta(hours=1))
    due_since = timezone.now() - timedelta(minutes=5)
    due = make(run_after=due_since)
    response = post_action(admin_client, "run_now", [delayed, due])
    assert messages_of(response) == [
        "Made 1 job due now.",
        "Skipped 1 job that were not waiting for a later time.",
    ]
    delayed.refresh_from_db()
    due.refresh_from_db()
    assert delayed.run_after <= timezone.now()
    assert due.run_after == due_since


def test_an_action_that_changes_nothing_says_so(admin_client):
    response = post_action(admin_client, "retry", [make(Job.State.DONE)])
    assert messages_of(response) == ["Skipped 1 job that were not failed or cancelled."]


def test_an_action_skips_a_job_a_worker_claimed_after_the_page_was_shown(admin_client):
    job = make(run_after=timezone.now() + timedelta(hours=1))
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)  # a worker's claim
    response = post_action(admin_client, "run_now", [job])
    assert messages_of(response) == ["Skipped 1 job that were not waiting for a later time."]
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def test_cancelling_a_job_a_worker_claimed_after_the_page_was_shown_asks_it_to_stop(admin_client):
    job = make()
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)  # a worker's claim
    post_action(admin_client, "cancel", [job])
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
    assert job.cancel_requested_at is not None


def test_an_action_on_every_matching_job_updates_them_all(admin_client, small_pages):
    failed = [make(Job.State.FAILED) for _ in range(25)]
    make(Job.State.DONE)
    data = {"action": "retry", "select_across": 1, "index": 0, "_selected_action": [failed[-1].pk]}
    response = admin_client.post(JOBS + "?state__exact=failed", data, follow=True)
    assert messages_of(response) == ["Retried 25 jobs: queued again, due now."]
    assert Job.objects.queued().count() == 25


# -- permissions


def test_view_permission_shows_the_list_and_pages_but_no_actions(client):
    job = make(Job.State.FAILED)
    client.force_login(staff_user("view_job"))
    response = client.get(JOBS)
    assert response.status_code == 200
    assert 'name="action"' not in response.content.decode()
    assert client.get(job_page(job)).status_code == 200
    post_action(client, "retry", [job])
    job.refresh_from_db()
    assert job.state == Job.State.FAILED


def test_change_permission_allows_the_actions(client):
    job = make(Job.State.FAILED)
    client.force_login(staff_user("change_job"))
    html = client.get(JOBS).content.decode()
    assert '<option value="retry">' in html and '<option value="delete_selected">' not in html
    post_action(client, "retry", [job])
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


def test_delete_permission_allows_deleting(client):
    job = make(Job.State.DONE)
    client.force_login(staff_user("view_job", "delete_job"))
    assert '<option value="delete_selected">' in client.get(JOBS).content.decode()
    client.post(reverse("admin:vellum_jobs_job_delete", args=[job.pk]), {"post": "yes"})
    assert not Job.objects.filter(pk=job.pk).exists()


def test_staff_without_job_permissions_cannot_see_jobs(client):
    job = make()
    client.force_login(staff_user())
    assert client.get(JOBS).status_code == 403
    assert client.get(job_page(job)).status_code == 403
    assert client.get(WORKERS).status_code == 403


# -- workers


def test_the_worker_list_shows_liveness_and_what_each_worker_runs(admin_client):
    now = timezone.now()
    alive = Worker.objects.create(
        id=uuid.uuid4(),
        host="web-1",
        pid=101,
        threads=4,
        connections=6,
        queues=[],
        started_at=now - timedelta(hours=1),
    )
    Worker.objects.create(
        id=uuid.uuid4(),
        host="web-2",
        pid=202,
        threads=2,
        queues=["media", "slow"],
        last_heartbeat=now - timedelta(minutes=10),
        trouble="leases not renewed for 55.0s (no beat got through)",
    )
    make(Job.State.RUNNING, worker_id=alive.pk)
    make(Job.State.RUNNING, worker_id=alive.pk)
    make(Job.State.DONE, worker_id=alive.pk)

    html = admin_client.get(WORKERS).content.decode()
    table = {
        host: row
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S)
        for host in ("web-1", "web-2")
        if host in row
    }
    assert "web-1:101" in table["web-1"] and "queues: all<" in table["web-1"]
    assert ">2 / 4<" in table["web-1"]  # threads running a job, of its threads
    assert '<span class="vellum-badge vellum-badge-alive">alive</span>' in table["web-1"]
    running_link = f'{JOBS}?state__exact=running&amp;worker_id={alive.pk}">2</a>'
    assert running_link in table["web-1"]
    assert "queues: media, slow<" in table["web-2"] and ">0 / 2<" in table["web-2"]
    assert '<span class="vellum-badge vellum-badge-stale">stale</span> silent for 10 min' in table["web-2"]
    assert ">leases not renewed for 55.0s (no beat got through)<" in table["web-2"]

    listed = rows(
        admin_client.get(JOBS, {"state__exact": "running", "worker_id": str(alive.pk)}).content.decode()
    )
    assert len(listed) == 2


def test_workers_are_read_only_and_cannot_be_added(admin_client):
    worker = Worker.objects.create(id=uuid.uuid4(), host="box", pid=7, threads=1)
    page = reverse("admin:vellum_jobs_worker_change", args=[worker.pk])
    assert admin_client.get(page).status_code == 200
    assert admin_client.post(page, {"host": "other"}).status_code == 403
    assert admin_client.get(reverse("admin:vellum_jobs_worker_add")).status_code == 403


# -- schedules

SCHEDULES = reverse("admin:vellum_jobs_schedule_changelist")


def test_the_schedule_list_shows_each_declared_schedule_with_its_last_and_next_run(admin_client, settings):
    from vellum_jobs.core.models import Schedule
    from vellum_jobs.maintenance import schedules

    settings.VELLUM_JOBS = {
        "SCHEDULES": {
            "nightly": {"job": "test.add", "cron": "0 3 * * *", "args": [1, 2], "timezone": "UTC"},
            "reports": {
                "job": "test.record",
                "cron": "30 6 * * 1-5",
                "timezone": "Europe/Paris",
                "missed": "skip",
            },
        }
    }
    Schedule.objects.create(name="retired", first_seen=timezone.now())  # no longer declared
    now = timezone.now()
    schedules.tick("default", now - timedelta(days=2))
    [job] = [j for j in schedules.tick("default", now) if j.schedule == "nightly"]
    Schedule.objects.filter(name="reports").delete()  # as if no worker had seen it yet
    html = admin_client.get(SCHEDULES).content.decode()
    assert "retired" not in html
    nightly = re.search(r"<tr>(?:(?!</tr>).)*nightly.*?</tr>", html, re.S)[0]
    assert "<code>0 3 * * *</code>" in nightly
    assert "run once" in nightly
    assert f'href="{job_page(job)}">#{job.pk}</a>' in nightly
    next_run = schedules.definitions()[0].next(timezone.now())
    assert display_moment(next_run) in nightly
    reports = re.search(r"<tr>(?:(?!</tr>).)*reports.*?</tr>", html, re.S)[0]
    assert "Europe/Paris" in reports and "skip" in reports
    # A schedule no worker has seen yet gets its row on the first visit.
    assert Schedule.objects.filter(name="reports").exists()


def test_schedules_cannot_be_added_changed_or_deleted(admin_client):
    assert admin_client.get(reverse("admin:vellum_jobs_schedule_add")).status_code == 403


def display_moment(value):
    from vellum_jobs.admin.display import moment

    return moment(value)
