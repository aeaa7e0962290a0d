"""The job page: its state, error or result and buttons first, times to the second, a running job's
live progress, and no delete for a running job."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.admin.test_admin_browser import browser, keep, library_jobs, log_in  # noqa: F401
from tests.support.admin_pages import JOBS, job_page, make, messages_of, staff_user
from vellum_jobs.core.models import Job, Worker

pytestmark = pytest.mark.django_db

TRACEBACK = (
    'Traceback (most recent call last):\n  File "app/jobs.py", line 12, in send\n    deliver()\n'
    "smtplib.SMTPRecipientsRefused: {'a@example.org': (550, b'<no such user>')}"
)


def act(job: Job) -> str:
    return reverse("admin:vellum_jobs_job_act", args=[job.pk])


def progress_of(job: Job) -> str:
    return reverse("admin:vellum_jobs_job_progress", args=[job.pk])


def buttons(html: str) -> list[tuple[str, str]]:
    return re.findall(
        r'<button type="submit" name="action" value="(\w+)" class="button" title="[^"]*">([^<]*)<', html
    )


# -- what comes first


def test_the_page_opens_with_the_state_the_error_and_the_buttons_before_the_fields(admin_client):
    job = make(Job.State.FAILED, name="mail.send", attempts=4, max_attempts=4, error=TRACEBACK)
    job.finished_at = timezone.now() - timedelta(minutes=3)
    job.started_at = job.finished_at - timedelta(seconds=2.5)
    job.save()

    html = admin_client.get(job_page(job)).content.decode()

    head = html.index('id="vellum-summary"')
    assert head < html.index("<fieldset")
    summary = html[head : html.index("</section>", head)]
    assert '<span class="vellum-badge vellum-badge-failed">failed</span>' in summary
    assert "attempt 4 of 4, failed 3 min 0 s ago after running 2.5 s" in summary
    line = (
        "smtplib.SMTPRecipientsRefused: {&#x27;a@example.org&#x27;: (550, b&#x27;&lt;no such user&gt;&#x27;)}"
    )
    assert f'<p class="vellum-error-line">{line}</p>' in summary
    assert '<pre class="vellum-pre vellum-error">Traceback (most recent call last):' in summary
    assert buttons(summary) == [("retry", "Retry now")]
    assert html.count("Traceback (most recent call last)") == 1  # not again further down
    assert "CHANGE_FORM-action" not in html  # Django 6.1's actions menu: the buttons stand for it


def test_a_done_job_shows_its_result_first(admin_client):
    job = make(Job.State.DONE, result={"files": 3}, finished_at=timezone.now())
    html = admin_client.get(job_page(job)).content.decode()
    summary = html[html.index('id="vellum-summary"') : html.index("<fieldset")]
    assert '<pre class="vellum-pre">{\n  &quot;files&quot;: 3\n}</pre>' in summary
    assert "vellum-error" not in summary
    assert buttons(summary) == []


def test_the_page_shows_arguments_and_the_worker_read_only(admin_client):
    worker = Worker.objects.create(id=uuid.uuid4(), host="box", pid=42, threads=4)
    job = make(
        Job.State.RUNNING,
        args=[1, "two"],
        kwargs={"deep": True, "path": "/music"},  # the order PostgreSQL and MariaDB store them in
        worker_id=worker.pk,
        lease_expires_at=timezone.now() + timedelta(minutes=1),
        started_at=timezone.now(),
    )
    response = admin_client.get(job_page(job))
    html = response.content.decode()
    assert response.status_code == 200
    assert '<pre class="vellum-pre">[\n  1,\n  &quot;two&quot;\n]</pre>' in html
    kwargs = "{\n  &quot;deep&quot;: true,\n  &quot;path&quot;: &quot;/music&quot;\n}"
    assert f'<pre class="vellum-pre">{kwargs}</pre>' in html
    assert f'<a href="{reverse("admin:vellum_jobs_worker_change", args=[worker.pk])}">box:42</a>' in html
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert 'name="name"' not in html and "<textarea" not in html


def test_the_page_folds_long_json_under_its_size_and_shows_short_json_as_it_is(admin_client):
    long_list = list(range(1000))  # 1,000 lines of "  n," between [ and ]
    job = make(Job.State.DONE, args=long_list, kwargs={"short": True}, result={"rows": ["x" * 3000]})
    html = admin_client.get(job_page(job)).content.decode()
    folded = re.findall(
        r'<details class="vellum-json"><summary>(.*?)</summary><pre class="vellum-pre">', html
    )
    args_text = json.dumps(long_list, indent=2)
    result_text = json.dumps({"rows": ["x" * 3000]}, indent=2)
    assert folded == [  # the result first, at the head of the page
        f"{len(result_text):,} characters of JSON, 5 lines",
        f"{len(args_text):,} characters of JSON, 1,002 lines",
    ]
    assert f'<pre class="vellum-pre">{args_text}</pre></details>' in html  # all of it, folded
    assert '<pre class="vellum-pre">{\n  &quot;short&quot;: true\n}</pre>' in html
    assert html.count("<details") == 2


def test_times_show_seconds_and_how_long_ago(admin_client):
    now = timezone.now()
    created = now - timedelta(hours=2, seconds=7)
    job = make(Job.State.DONE, created_at=created, started_at=now - timedelta(seconds=75), finished_at=now)
    html = admin_client.get(job_page(job)).content.decode()
    for moment in (created, job.started_at, job.finished_at):
        assert f">{timezone.localtime(moment):%Y-%m-%d %H:%M:%S}</time>" in html
    assert "</time> (2 h 0 min ago)" in html
    assert "</time> (1 min 15 s ago)" in html


# -- the buttons


@pytest.mark.parametrize(
    ("state", "fields", "expected"),
    [
        (Job.State.FAILED, {}, [("retry", "Retry now")]),
        (Job.State.CANCELLED, {}, [("retry", "Retry now")]),
        (
            Job.State.QUEUED,
            {"run_after": timezone.now() + timedelta(hours=1)},
            [("run_now", "Run now"), ("cancel", "Cancel")],
        ),
        (Job.State.QUEUED, {}, [("cancel", "Cancel")]),
        (Job.State.RUNNING, {}, [("cancel", "Ask to stop")]),
        (Job.State.RUNNING, {"cancel_requested_at": timezone.now()}, []),
        (Job.State.DONE, {}, []),
    ],
)
def test_the_buttons_are_those_the_jobs_state_allows(admin_client, state, fields, expected):
    job = make(state, **fields)
    assert buttons(admin_client.get(job_page(job)).content.decode()) == expected


@pytest.mark.parametrize(
    ("state", "field", "offset", "headline"),
    [
        (
            Job.State.QUEUED,
            "run_after",
            timedelta(minutes=53, seconds=30),
            "attempt 0 of 5 so far, due in 53 min ",
        ),
        (
            Job.State.QUEUED,
            "run_after",
            -timedelta(minutes=2, seconds=30),
            "attempt 0 of 5 so far, due since 2 min ",
        ),
        (Job.State.RUNNING, "started_at", -timedelta(seconds=90), "attempt 0 of 5, running for 1 min "),
    ],
)
def test_the_head_of_the_page_says_how_far_the_job_has_come(admin_client, state, field, offset, headline):
    job = make(state, max_attempts=5, **{field: timezone.now() + offset})
    assert f'<span class="vellum-summary-line">{headline}' in admin_client.get(job_page(job)).content.decode()


@pytest.mark.parametrize(
    ("state", "fields", "action", "message", "changed"),
    [
        (
            Job.State.FAILED,
            {"attempts": 5},
            "retry",
            "Retried 1 job: queued again, due now.",
            {"state": "queued"},
        ),
        (Job.State.QUEUED, {}, "cancel", "Cancelled 1 job.", {"state": "cancelled"}),
        (
            Job.State.QUEUED,
            {"run_after": timezone.now() + timedelta(days=1)},
            "run_now",
            "Made 1 job due now.",
            {"state": "queued"},
        ),
        (
            Job.State.RUNNING,
            {},
            "cancel",
            "Asked 1 running job to stop: its handler sees should_stop() within a heartbeat.",
            {"state": "running"},
        ),
    ],
)
def test_a_button_runs_the_lists_action_on_that_job_and_returns_to_its_page(
    admin_client, state, fields, action, message, changed
):
    job, other = make(state, **fields), make(state, **fields)
    response = admin_client.post(act(job), {"action": action}, follow=True)
    assert response.redirect_chain == [(job_page(job), 302)]
    assert messages_of(response) == [message]
    job.refresh_from_db()
    assert {name: getattr(job, name) for name in changed} == changed
    if action == "run_now":
        assert job.run_after <= timezone.now()
    if state == Job.State.RUNNING:
        assert job.cancel_requested_at is not None
    other.refresh_from_db()
    assert (other.state, other.cancel_requested_at) == (state, None)  # only that job


def test_a_button_on_a_job_whose_state_changed_meanwhile_says_it_skipped_it(admin_client):
    job = make(Job.State.FAILED)
    Job.objects.filter(pk=job.pk).update(state=Job.State.DONE)
    response = admin_client.post(act(job), {"action": "retry"}, follow=True)
    assert messages_of(response) == ["Skipped 1 job that were not failed or cancelled."]
    job.refresh_from_db()
    assert job.state == Job.State.DONE


def test_buttons_need_the_change_permission(client):
    job = make(Job.State.FAILED)
    client.force_login(staff_user("view_job"))
    assert buttons(client.get(job_page(job)).content.decode()) == []
    assert client.post(act(job), {"action": "retry"}).status_code == 403
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    client.force_login(staff_user("change_job"))
    client.post(act(job), {"action": "retry"})
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


def test_the_buttons_address_takes_only_a_post_of_a_known_action(admin_client):
    job = make(Job.State.FAILED)
    assert admin_client.get(act(job)).status_code == 405
    assert admin_client.post(act(job), {"action": "delete"}).status_code == 400
    assert (
        admin_client.post(
            reverse("admin:vellum_jobs_job_act", args=[job.pk + 1]), {"action": "retry"}
        ).status_code
        == 404
    )
    job.refresh_from_db()
    assert job.state == Job.State.FAILED


# -- live progress


def test_the_progress_address_gives_done_total_rate_and_time_left(admin_client):
    job = make(
        Job.State.RUNNING,
        started_at=timezone.now() - timedelta(seconds=100),
        progress_done=50,
        progress_total=150,
        progress_message="scanned /music/a",
    )
    response = admin_client.get(progress_of(job))
    assert response["Content-Type"] == "application/json"
    figures = response.json()
    assert (figures["state"], figures["running"], figures["done"], figures["total"]) == (
        "running",
        True,
        50,
        150,
    )
    assert figures["percent"] == 33 and figures["message"] == "scanned /music/a"
    assert figures["text"] == "50 of 150 (33%)"
    # 50 in about 100 s: half a job a second, 100 left, so about 200 s.
    assert 0.49 < figures["rate"] <= 0.5
    assert 200 <= figures["remaining"] < 205
    assert figures["rate_text"] == "30.0 per minute" or figures["rate_text"].endswith(" per minute")
    assert figures["remaining_text"].startswith("about 3 min ") and figures["remaining_text"].endswith(
        " left at this rate"
    )


def test_the_progress_of_a_job_without_a_total_or_any_progress_says_what_is_unknown(admin_client):
    counted = make(Job.State.RUNNING, started_at=timezone.now() - timedelta(seconds=10), progress_done=12)
    silent = make(Job.State.RUNNING, started_at=timezone.now())
    figures = admin_client.get(progress_of(counted)).json()
    assert (figures["text"], figures["remaining"]) == ("12 so far (no total given)", None)
    assert figures["remaining_text"] == "time left unknown without a total"
    figures = admin_client.get(progress_of(silent)).json()
    assert (figures["text"], figures["rate"], figures["rate_text"]) == (
        "no progress reported yet",
        None,
        "rate unknown",
    )


def test_the_progress_address_says_when_the_job_is_no_longer_running(admin_client):
    job = make(Job.State.DONE, progress_done=3, progress_total=3)
    figures = admin_client.get(progress_of(job)).json()
    assert (figures["state"], figures["running"]) == ("done", False)
    response = admin_client.get(reverse("admin:vellum_jobs_job_progress", args=[job.pk + 1]))
    assert response.status_code == 404 and response.json()["gone"] is True


def test_the_progress_address_is_for_staff_who_may_view_jobs(client):
    job = make(Job.State.RUNNING, started_at=timezone.now(), progress_done=1)
    response = client.get(progress_of(job))
    assert response.status_code == 302 and "/login/" in response["Location"]
    client.force_login(staff_user())
    assert client.get(progress_of(job)).status_code == 403
    client.force_login(staff_user("view_job"))
    assert client.get(progress_of(job)).json()["done"] == 1


def test_a_running_jobs_page_polls_its_progress_address(admin_client):
    job = make(Job.State.RUNNING, started_at=timezone.now(), progress_done=4, progress_total=10)
    html = admin_client.get(job_page(job)).content.decode()
    assert f'id="vellum-live" data-url="{progress_of(job)}" data-every="3"' in html
    assert '<progress id="vellum-live-bar" max="10" value="4">' in html
    assert "vellum_jobs/jobs.js" in html
    done = make(Job.State.DONE)
    assert 'id="vellum-live"' not in admin_client.get(job_page(done)).content.decode()


# -- deleting


def test_a_running_job_cannot_be_deleted_from_its_page(admin_client):
    running = make(Job.State.RUNNING, started_at=timezone.now())
    delete = reverse("admin:vellum_jobs_job_delete", args=[running.pk])
    assert delete not in admin_client.get(job_page(running)).content.decode()
    assert admin_client.get(delete).status_code == 403
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Job.objects.filter(pk=running.pk).exists()


def test_a_finished_job_can_be_deleted_from_its_page(admin_client):
    done = make(Job.State.DONE)
    delete = reverse("admin:vellum_jobs_job_delete", args=[done.pk])
    assert delete in admin_client.get(job_page(done)).content.decode()
    response = admin_client.post(delete, {"post": "yes"}, follow=True)
    assert response.redirect_chain[-1][0] == JOBS
    assert not Job.objects.filter(pk=done.pk).exists()


# -- in a real browser


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [1280, 1440])
def test_a_running_jobs_progress_updates_live_on_its_page_without_a_reload(
    browser,  # noqa: F811
    live_server,
    library_jobs,  # noqa: F811
    width,
    tmp_path,
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    scan = Job.objects.get(name="scan")
    browser.set_window_size(width, 1000)
    log_in(browser, live_server, JOBS)
    browser.get(f"{live_server.url}{job_page(scan)}")
    summary = browser.find_element(By.ID, "vellum-summary")
    # The head of the page is in view at once: state, progress, and the button to stop it.
    assert summary.location["y"] + summary.size["height"] < 1000 - 100
    assert browser.find_element(By.ID, "vellum-live-text").text == "12 of 19 (63%)"
    assert [b.text for b in summary.find_elements(By.TAG_NAME, "button")] == ["Ask to stop"]
    browser.execute_script("window.vellumNotReloaded = true;")

    Job.objects.filter(pk=scan.pk).update(progress_done=17, progress_message="found 04 Arrival.flac")
    WebDriverWait(browser, 20).until(
        lambda b: b.find_element(By.ID, "vellum-live-text").text == "17 of 19 (89%)"
    )
    assert browser.find_element(By.ID, "vellum-live-bar").get_attribute("value") == "17"
    assert browser.find_element(By.ID, "vellum-live-message").text == "found 04 Arrival.flac"
    assert re.fullmatch(r"[\d.,]+ per (second|minute)", browser.find_element(By.ID, "vellum-live-rate").text)
    assert browser.find_element(By.ID, "vellum-live-remaining").text.endswith(" left at this rate")
    assert browser.execute_script("return window.vellumNotReloaded === true;")
    browser.save_screenshot(str(tmp_path / f"running-{width}.png"))

    Job.objects.filter(pk=scan.pk).update(state=Job.State.DONE, finished_at=timezone.now())
    WebDriverWait(browser, 20).until(lambda b: "done now" in b.find_element(By.ID, "vellum-live-status").text)
    print(f"screenshots: {tmp_path}")


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_failed_jobs_error_and_retry_button_are_in_view_at_once(
    browser,  # noqa: F811
    live_server,
    library_jobs,  # noqa: F811
    tmp_path,
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown

    failed = library_jobs[0]
    browser.set_window_size(1280, 800)
    wait = log_in(browser, live_server, JOBS)
    browser.get(f"{live_server.url}{job_page(failed)}")
    line = browser.find_element(By.CSS_SELECTOR, "#vellum-summary .vellum-error-line")
    assert line.text.startswith("TimeoutError: cover art service did not answer")
    assert (
        line.location["y"] < 800
        and browser.find_element(By.CSS_SELECTOR, "#vellum-summary pre").is_displayed()
    )
    browser.save_screenshot(str(tmp_path / "failed.png"))
    keep(tmp_path / "failed.png", "admin-job-page.png")
    browser.find_element(By.CSS_SELECTOR, "#vellum-summary button[value=retry]").click()
    message = wait.until(shown.presence_of_element_located((By.CSS_SELECTOR, ".messagelist .success")))
    assert message.text == "Retried 1 job: queued again, due now."
    assert browser.current_url.endswith(job_page(failed))
    failed.refresh_from_db()
    assert failed.state == Job.State.QUEUED
