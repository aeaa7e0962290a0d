"""The job list as an on-call operator reads it: one line per job, each failure's error line, the
jobs waiting to retry, failures grouped by job and error, and a bulk delete that spares running jobs."""

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
from tests.admin.test_admin_browser import browser, keep, library_jobs, log_in  # noqa: F401
from tests.support.admin_pages import JOBS, job_page, make, messages_of, post_action, rows
from vellum_jobs.admin import failures
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job, Worker

pytestmark = pytest.mark.django_db

FAILURES = reverse("admin:vellum_jobs_job_failures")


def traceback(line: str, padding: int = 0) -> str:
    """An error as a failed attempt leaves it: a traceback whose last line names the exception."""
    frames = '  File "app/jobs.py", line 12, in handler\n    do_it()\n' * (1 + padding)
    return f"Traceback (most recent call last):\n{frames}{line}\n"


def live_worker() -> Worker:
    """A worker row as ``runjobs`` writes it: serving every queue, knowing every registered name."""
    return Worker.objects.create(
        id=uuid.uuid4(), host="test", pid=1, threads=1, names=registry.names(), last_heartbeat=timezone.now()
    )


def cell(row: str, column: str) -> str:
    match = re.search(rf'<td class="field-{column}">(.*?)</td>', row, re.S)
    assert match, f"no {column} cell in {row}"
    return match[1]


# -- columns


def test_the_list_shows_every_column_on_one_line_each(admin_client):
    now = timezone.now()
    library = Library.objects.create(name="Music", path="/music")
    done = make(
        Job.State.DONE,
        name="scan",
        queue="media",
        priority=7,
        attempts=2,
        max_attempts=5,
        started_at=now - timedelta(seconds=3),
        finished_at=now - timedelta(seconds=1.5),
        ref_type=ContentType.objects.get_for_model(Library),
        ref_id=str(library.pk),
    )
    running = make(
        Job.State.RUNNING,
        name="scan",
        attempts=1,
        started_at=now - timedelta(minutes=2),
        progress_done=40,
        progress_total=100,
        progress_message="scanned /music/a",
    )
    delayed = make(run_after=now + timedelta(hours=2, seconds=30))

    html = admin_client.get(JOBS).content.decode()
    by_id = rows(html)

    row = by_id[done.pk]
    assert f">{done.pk}</a>" in row
    assert '<span class="vellum-cut" title="scan">scan</span></a>' in cell(row, "name_and_handler")
    assert cell(row, "state_badge") == (
        '<span class="vellum-badge vellum-badge-done">done</span> '
        '<span class="vellum-quiet" title="attempt 2 of 5">2/5</span>'
    )
    assert (
        cell(row, "queue_and_priority")
        == '<span class="vellum-cut" title="queue media, priority 7">media (7)</span>'
    )
    finished = timezone.localtime(done.finished_at)
    assert cell(row, "when") == (
        f'<time class="vellum-when" datetime="{finished.isoformat()}" title="finished '
        f'{finished:%Y-%m-%d %H:%M:%S}">{finished:%H:%M:%S}</time>'
    ) or f">{finished:%b %d %H:%M}</time>" in cell(row, "when")  # a list shown just after midnight
    assert cell(row, "duration_text") == "1.5 s"
    link = reverse("admin:library_library_change", args=[library.pk])
    assert (
        cell(row, "reference")
        == f'<a class="vellum-cut" href="{link}" title="library: Music">library: Music</a>'
    )

    row = by_id[running.pk]
    assert '<progress max="100" value="40">40%</progress> 40/100 (40%)' in cell(row, "detail")
    assert 'title="scanned /music/a"' in cell(row, "detail")
    assert 'title="started ' in cell(row, "when")
    assert cell(row, "duration_text") == '<span title="running for 2 min 0 s so far">2 min 0 s</span>'

    row = by_id[delayed.pk]
    assert '<span class="vellum-badge vellum-badge-queued">queued</span>' in row
    assert ">in 2 h 0 min</time>" in cell(row, "when")
    assert "<progress" not in row
    # The due time is in the "when" column; the detail does not say it again.
    assert (
        cell(row, "detail") == '<span class="vellum-cut vellum-quiet" title="not due yet">not due yet</span>'
    )
    # The columns an operator needs, and no others (progress, reasons and errors share one).
    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert headers == [
        "id",
        "name_and_handler",
        "state_badge",
        "queue_and_priority",
        "when",
        "duration_text",
        "detail",
        "reference",
    ]


def test_long_texts_are_cut_to_one_line_with_the_whole_text_in_a_tooltip(admin_client):
    name = "reports.build_" + "a_very_long_name_" * 8
    long_line = "ValueError: " + "the row was not what we expected; " * 8
    job = make(Job.State.FAILED, name=name, queue="q" * 90, error=traceback(long_line))
    row = rows(admin_client.get(JOBS).content.decode())[job.pk]
    assert f'<span class="vellum-cut" title="{name}">{name}</span>' in row
    assert f'<span class="vellum-cut" title="{"q" * 90}">{"q" * 90}</span>' in row
    assert f'<span class="vellum-cut vellum-error-line" title="{long_line.strip()}">' in row


def test_the_failed_view_shows_each_jobs_error_line(admin_client):
    smtp = "smtplib.SMTPRecipientsRefused: {'a@example.org': (550, b'no such user')}"
    first = make(Job.State.FAILED, name="mail.send", attempts=4, error=traceback(smtp))
    # A traceback far longer than what the list reads of it: its last line is still found.
    second = make(Job.State.FAILED, name="scan", error=traceback("TimeoutError: disk did not answer", 2000))
    timed_out = make(
        Job.State.FAILED, name="scan", error="timed out after 30s: the handler was still running"
    )
    done = make(Job.State.DONE)

    html = admin_client.get(JOBS, {"state__exact": "failed"}).content.decode()
    by_id = rows(html)

    assert set(by_id) == {first.pk, second.pk, timed_out.pk}
    assert (
        ">smtplib.SMTPRecipientsRefused: {&#x27;a@example.org&#x27;: (550, b&#x27;no such user&#x27;)}<"
        in (cell(by_id[first.pk], "detail"))
    )
    assert ">TimeoutError: disk did not answer<" in cell(by_id[second.pk], "detail")
    assert ">timed out after 30s: the handler was still running<" in cell(by_id[timed_out.pk], "detail")
    assert 'File "app/jobs.py"' not in html  # the tracebacks stay on the job pages
    assert done.pk not in by_id


def test_the_error_lines_of_a_page_cost_one_query_whatever_its_size(admin_client, measured_clock):
    live_worker()

    def queries_for(n: int) -> int:
        Job.objects.all().delete()
        for i in range(n):
            make(Job.State.FAILED, error=traceback(f"ValueError: {i}"))
            make(Job.State.QUEUED, attempts=1, error=traceback(f"KeyError: {i}"))
        with CaptureQueriesContext(connection) as captured:
            html = admin_client.get(JOBS).content.decode()
        assert f">ValueError: {n - 1}<" in html and f">KeyError: {n - 1}<" in html
        return len(captured)

    assert queries_for(2) == queries_for(30)


def test_the_retrying_view_lists_the_jobs_waiting_to_retry_after_a_failed_attempt(admin_client):
    live_worker()
    later = timezone.now() + timedelta(minutes=53, seconds=30)
    retrying = make(attempts=2, max_attempts=4, run_after=later, error=traceback("ConnectionError: refused"))
    due_again = make(attempts=1, error=traceback("ConnectionError: reset"))
    snoozed = make(attempts=1, run_after=later)  # Retry(): no error, its attempt given back
    fresh = make()
    failed = make(Job.State.FAILED, attempts=4, error=traceback("ConnectionError: refused"))

    html = admin_client.get(JOBS, {"retrying": "yes"}).content.decode()
    by_id = rows(html)

    assert set(by_id) == {retrying.pk, due_again.pk}
    assert ">ConnectionError: refused<" in cell(by_id[retrying.pk], "detail")
    assert ">in 53 min 30 s</time>" in cell(by_id[retrying.pk], "when")
    assert ">ConnectionError: reset<" in cell(by_id[due_again.pk], "detail")
    assert not {snoozed.pk, fresh.pk, failed.pk} & set(by_id)
    assert 'id="vellum-retrying-link"' in html


def test_a_queued_job_shows_why_it_waits_before_its_last_error(admin_client):
    from vellum_jobs import queues

    queues.pause("media", by="ops")
    job = make(queue="media", attempts=1, error=traceback("ConnectionError: refused"))
    detail = cell(rows(admin_client.get(JOBS).content.decode())[job.pk], "detail")
    assert "its queue &#x27;media&#x27; is paused" in detail
    assert "ConnectionError" not in detail


def test_the_list_and_the_job_page_say_why_a_queued_job_waits(admin_client):
    from vellum_jobs import queues

    queues.pause("media")
    waiting = make(queue="media")
    later = make(run_after=timezone.now() + timedelta(seconds=3184.5))
    done = make(Job.State.DONE)
    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(JOBS).content.decode()
    found = rows(html)
    assert "its queue &#x27;media&#x27; is paused" in found[waiting.pk]
    assert ">in 53 min 4 s</time>" in found[later.pk]
    assert "vellum-why" not in found[done.pk]
    assert "3184" not in html
    # The reasons of a whole page cost a few queries, not a few per job.
    assert len(queries) < 20
    page = admin_client.get(job_page(waiting)).content.decode()
    assert "its queue &#x27;media&#x27; is paused" in page
    assert "no live worker" in page
    page = admin_client.get(job_page(later)).content.decode()
    assert "due in 53 min (at " in page


# -- failures by job and error


def failing(name: str, line: str, n: int, state: str = Job.State.FAILED, **fields) -> list[Job]:
    return [make(state, name=name, attempts=1, error=traceback(line), **fields) for _ in range(n)]


def groups(html: str) -> list[tuple[int, str, str]]:
    """The grouping's table: (count, "name: kind", link) per group, in order."""
    found = re.findall(
        r'<td class="vellum-number">(\d+)</td>\s*<td><a href="([^"]*)" title="[^"]*">'
        r"<strong>([^<]*)</strong>: ([^<]*)</a>",
        html,
    )
    return [(int(count), f"{name}: {kind}", link.replace("&amp;", "&")) for count, link, name, kind in found]


def test_failures_are_grouped_by_job_name_and_error_with_counts(admin_client):
    refused = failing("mail.send", "smtplib.SMTPRecipientsRefused: {'a@example.org': (550, b'x')}", 3)
    failing("mail.send", "TimeoutError: smtp.example.org did not answer", 1)
    failing("scan", "ValueError: no such folder", 2)
    failing("scan", "timed out after 30s: the handler was still running", 1)
    failing("mail.send", "smtplib.SMTPRecipientsRefused: x", 1, Job.State.QUEUED)  # retrying, not failed
    make(Job.State.DONE, name="mail.send")

    html = admin_client.get(FAILURES).content.decode()

    found = groups(html)
    assert [(count, label) for count, label, _ in found] == [
        (3, "mail.send: smtplib.SMTPRecipientsRefused"),
        (2, "scan: ValueError"),
        (1, "scan: timed out after 30s"),
        (1, "mail.send: TimeoutError"),
    ]
    assert "All 7 failed jobs, grouped by job name and error." in html
    # A group's link lists exactly its jobs.
    link = found[0][2]
    assert link.startswith(JOBS + "?")
    listed = rows(admin_client.get(link).content.decode())
    assert set(listed) == {job.pk for job in refused}


def test_the_jobs_waiting_to_retry_are_grouped_too(admin_client):
    waiting = failing("mail.send", "ConnectionRefusedError: [Errno 111]", 2, Job.State.QUEUED)
    failing("mail.send", "ConnectionRefusedError: [Errno 111]", 1)  # failed for good

    html = admin_client.get(FAILURES, {"of": "retrying"}).content.decode()

    found = groups(html)
    assert [(count, label) for count, label, _ in found] == [(2, "mail.send: ConnectionRefusedError")]
    assert set(rows(admin_client.get(found[0][2]).content.decode())) == {job.pk for job in waiting}


def test_grouping_reads_only_the_latest_failures_and_says_so(admin_client, monkeypatch):
    monkeypatch.setattr(failures, "GROUP_LIMIT", 3)
    failing("scan", "ValueError: old", 2)
    failing("mail.send", "TimeoutError: new", 3)

    with CaptureQueriesContext(connection) as captured:
        html = admin_client.get(FAILURES).content.decode()

    assert [(count, label) for count, label, _ in groups(html)] == [(3, "mail.send: TimeoutError")]
    assert "The latest 3 failed jobs (newest first, read through an index)" in html
    assert "older ones are not counted here" in html
    (grouping,) = [q["sql"] for q in captured if "LIMIT 3" in q["sql"]]
    assert "ORDER BY" in grouping


def test_the_failed_and_retrying_views_link_to_their_grouping_keeping_the_queue(admin_client):
    failing("scan", "ValueError: x", 1, queue="media")
    html = admin_client.get(JOBS, {"state__exact": "failed", "queue": "media"}).content.decode()
    assert f'href="{FAILURES}?of=failed&amp;queue=media"' in html
    html = admin_client.get(JOBS, {"retrying": "yes"}).content.decode()
    assert f'href="{FAILURES}?of=retrying"' in html
    assert 'id="vellum-failures-link"' not in admin_client.get(JOBS).content.decode()
    grouped = admin_client.get(FAILURES, {"queue": "media"}).content.decode()
    assert [(count, label) for count, label, _ in groups(grouped)] == [(1, "scan: ValueError")]
    assert groups(grouped)[0][2].endswith("&queue=media") or "queue=media&" in groups(grouped)[0][2]
    assert not groups(admin_client.get(FAILURES, {"queue": "mail"}).content.decode())


def test_the_error_filter_shows_only_while_it_filters(admin_client):
    failing("scan", "ValueError: x", 1)
    assert "By error" not in admin_client.get(JOBS).content.decode()
    html = admin_client.get(JOBS, {"error": "ValueError"}).content.decode()
    assert "By error" in html and "ValueError" in html


def test_the_grouping_needs_the_view_permission(client):
    from tests.support.admin_pages import staff_user

    client.force_login(staff_user())
    assert client.get(FAILURES).status_code == 403
    client.force_login(staff_user("view_job"))
    assert client.get(FAILURES).status_code == 200


# -- deleting


def test_bulk_delete_refuses_a_selection_with_a_running_job_and_deletes_nothing(admin_client):
    running, done = make(Job.State.RUNNING), make(Job.State.DONE)
    response = post_action(admin_client, "delete_selected", [running, done])
    assert messages_of(response) == [
        "Deleted nothing: 1 selected job is running. Cancel it and delete it once it has stopped."
    ]
    assert set(Job.objects.values_list("pk", flat=True)) == {running.pk, done.pk}
    # Confirming (as the confirmation page would post) is refused the same way.
    response = post_action(admin_client, "delete_selected", [running, done], post="yes")
    assert set(Job.objects.values_list("pk", flat=True)) == {running.pk, done.pk}


def test_bulk_delete_deletes_finished_and_queued_jobs_after_confirmation(admin_client):
    done, queued = make(Job.State.DONE), make()
    response = post_action(admin_client, "delete_selected", [done, queued])
    assert 'name="post" value="yes"' in response.content.decode()  # the confirmation page
    response = post_action(admin_client, "delete_selected", [done, queued], post="yes")
    assert messages_of(response) == ["Successfully deleted 2 jobs."]
    assert not Job.objects.exists()


# -- in a real browser, on a laptop's screen

# The list's table and the page: how wide, how tall each row, and where each column header ends.
MEASURE = """
const results = document.querySelector("#changelist-form .results");
const rows = [...document.querySelectorAll("#result_list tbody tr")];
return {
  tableScroll: results.scrollWidth, tableWidth: results.clientWidth,
  pageScroll: document.documentElement.scrollWidth, pageWidth: document.documentElement.clientWidth,
  sidebarOpen: !!document.querySelector(".main.shifted"),
  rowHeights: [...new Set(rows.map((row) => Math.round(row.getBoundingClientRect().height)))],
  headerRights: [...document.querySelectorAll("#result_list thead th")].map(
    (th) => Math.round(th.getBoundingClientRect().right)
  ),
};
"""


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [1280, 1440])
def test_the_list_fits_a_laptop_beside_the_nav_sidebar(browser, live_server, library_jobs, width, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    name = "reports.build_" + "a_very_long_name_" * 6
    now = timezone.now()
    line = "ValueError: " + "the row was not what we expected; " * 8
    ended = {"started_at": now - timedelta(seconds=42), "finished_at": now - timedelta(seconds=30)}
    failing(name, line, 2, queue="reports-" * 10, **ended)
    browser.set_window_size(width, 1000)
    wait = log_in(browser, live_server, JOBS)

    shown = browser.execute_script(MEASURE)
    browser.save_screenshot(str(tmp_path / f"jobs-{width}.png"))
    if width == 1280:
        keep(tmp_path / "jobs-1280.png", "admin-job-list.png")
    assert shown["sidebarOpen"]
    assert shown["tableScroll"] <= shown["tableWidth"], "the table scrolls sideways"
    assert shown["pageScroll"] <= shown["pageWidth"], "the page scrolls sideways"
    assert max(shown["headerRights"]) <= shown["pageWidth"]
    assert len(shown["rowHeights"]) == 1, f"rows of uneven heights: {shown['rowHeights']}"

    # The filters are a row of menus: "By state" opens, and its "failed" filters the list.
    state_menu = browser.find_element(
        By.CSS_SELECTOR, "#changelist-filter details[data-filter-title='state']"
    )
    state_menu.find_element(By.TAG_NAME, "summary").click()
    state_menu.find_element(By.CSS_SELECTOR, "a[href='?state__exact=failed']").click()
    wait.until(lambda b: "state__exact=failed" in b.current_url)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 5
    assert "By state: failed" in browser.find_element(By.ID, "changelist-filter").text
    shown = browser.execute_script(MEASURE)
    assert shown["tableScroll"] <= shown["tableWidth"] and len(shown["rowHeights"]) == 1
    errors = [
        e.text
        for e in browser.find_elements(By.CSS_SELECTOR, "#result_list .field-detail .vellum-error-line")
    ]
    assert len(errors) == 5 and all(
        e.startswith(("ValueError: the row", "TimeoutError: cover art")) for e in errors
    )

    browser.find_element(By.ID, "vellum-failures-link").click()
    wait.until(lambda b: b.find_elements(By.ID, "vellum-failures"))
    groups_shown = [
        [td.text for td in row.find_elements(By.TAG_NAME, "td")[:2]]
        for row in browser.find_elements(By.CSS_SELECTOR, "#vellum-failures tbody tr")
    ]
    assert groups_shown == [["3", "fetch_artwork: TimeoutError"], ["2", f"{name}: ValueError"]]
    browser.save_screenshot(str(tmp_path / f"failures-{width}.png"))
    if width == 1280:
        keep(tmp_path / "failures-1280.png", "admin-failures.png")
    print(f"screenshots: {tmp_path}")


def test_the_grouping_has_the_breadcrumbs_of_its_django_version(admin_client):
    import django

    html = admin_client.get(FAILURES).content.decode()
    crumbs = '<ol class="breadcrumbs">' if django.VERSION >= (6, 0) else '<div class="breadcrumbs">'
    assert crumbs in html
    assert f'<a href="{JOBS}">Jobs</a>' in html


# What each vendor's plan says of the grouping's read: an index walked in id order, no sort
# step (a sort would read every failed job before keeping the newest).
GROUPING_PLAN = {
    "sqlite": (r"USING (COVERING )?INDEX vellum_job_state|USING INTEGER PRIMARY KEY", "TEMP B-TREE"),
    "postgresql": (r"Index (Only )?Scan (Backward )?using", "Sort"),
    "mysql": (r"(vellum_job_state|PRIMARY) \d+ ", "filesort"),  # the chosen key and its length
}


# A transaction test: MySQL's ANALYZE TABLE commits implicitly. The plan is the database's, so
# `slow`: once per database.
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["failed", "retrying"])
def test_the_grouping_reads_the_newest_jobs_through_an_index_without_sorting(kind):
    Job.objects.bulk_create(
        Job(name="test.add", state=state, attempts=1, error="ValueError: x" if state != "done" else "")
        for _ in range(3000)
        for state in ("done", "failed", "queued")
    )
    with connection.cursor() as cursor:
        cursor.execute(
            {"sqlite": "ANALYZE", "postgresql": "ANALYZE", "mysql": "ANALYZE TABLE vellum_jobs_job"}[
                connection.vendor
            ]
        )
        if connection.vendor == "mysql":
            cursor.fetchall()
        sql, params = failures.latest(Job.objects.all(), kind, 1000).query.sql_with_params()
        explain = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
        cursor.execute(f"{explain} {sql}", params)
        plan = "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())
    uses_index, sort_step = GROUPING_PLAN[connection.vendor]
    assert re.search(uses_index, plan), plan
    assert sort_step not in plan, plan
