"""The admin in a real headless Chromium: retry failed jobs, pause a queue, read the schedules.

Chromium and its chromedriver are Debian's (``apt-get install chromium
chromium-driver``; ``make test`` installs them). Without them the test is
skipped with a banner, except under ``CI=true``, where that is a failure.
Screenshots of the list before and after the retry are saved in the test's
temporary folder, whose path the test prints.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.contenttypes.models import ContentType
from django.utils import timezone

from example_project.library.models import Item, Library
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job, Queue, QueueMinute

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
]


def require_browser() -> None:
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not path]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip)")
    if not missing:
        return
    message = f"BROWSER TEST SKIPPED: {', '.join(missing)} missing; apt-get install chromium chromium-driver"
    if sys.__stderr__ is not None:  # past pytest's capture, so it shows in every run's output
        sys.__stderr__.write(f"\n{'!' * 72}\n  {message}\n{'!' * 72}\n")
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


@pytest.fixture
def browser(tmp_path):
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture
def library_jobs(monkeypatch):
    """A media library's jobs in every state, three of them failed artwork fetches."""
    # The screenshots show the example project's jobs (the README uses one);
    # the test app's dozen throwaway names would crowd the name filter.
    names = registry.names()
    monkeypatch.setattr(registry, "names", lambda: [n for n in names if not n.startswith("test.")])
    now = timezone.now()
    library = Library.objects.create(name="Sample media", path="/srv/media")
    items = [
        Item.objects.create(library=library, path=f"music/Harbour Lights/0{i} Track.flac", kind="audio")
        for i in range(1, 7)
    ]
    item_type = ContentType.objects.get_for_model(Item)

    def finished(state, name, item, seconds, **fields):
        return Job.objects.create(
            name=name,
            state=state,
            queue="media",
            attempts=fields.pop("attempts", 1),
            max_attempts=3,
            started_at=now - timedelta(seconds=seconds + 60),
            finished_at=now - timedelta(seconds=60),
            ref_type=item_type,
            ref_id=str(item.pk),
            **fields,
        )

    failed = []
    for item in items:
        finished(Job.State.DONE, "index_item", item, 0.4, result={"sha256": "9f2c01d4"})
    for item in items[:3]:
        error = (
            "Traceback (most recent call last):\n"
            '  File "example_project/library/jobs.py", line 118, in fetch_artwork\n'
            f"TimeoutError: cover art service did not answer for '{item.path}' (attempt 3)"
        )
        failed.append(finished(Job.State.FAILED, "fetch_artwork", item, 2.5, attempts=3, error=error))
    finished(Job.State.DONE, "fetch_artwork", items[3], 1.2, attempts=2)
    finished(Job.State.CANCELLED, "fetch_artwork", items[4], 0)
    Job.objects.create(
        name="scan",
        state=Job.State.RUNNING,
        queue="media",
        attempts=1,
        started_at=now - timedelta(seconds=14),
        progress_done=12,
        progress_total=19,
        progress_message="found music/Harbour Lights/Night Ferry/04 Arrival.flac",
        ref_type=ContentType.objects.get_for_model(Library),
        ref_id=str(library.pk),
    )
    Job.objects.create(
        name="fetch_artwork", queue="default", run_after=now + timedelta(minutes=2), attempts=1
    )
    Job.objects.create(name="index_item", queue="media", ref_type=item_type, ref_id=str(items[5].pk))
    return failed


def keep(screenshot: Path, name: str) -> None:
    """Copy ``screenshot`` to ``$VELLUM_SCREENSHOTS`` as ``name`` (``make screenshots``: the README's)."""
    folder = os.environ.get("VELLUM_SCREENSHOTS")
    if folder:
        (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(folder) / name)


def log_in(browser, live_server, page: str):
    """Log in as a new superuser and open ``page``, a changelist; the driver's wait."""
    from django.contrib.auth.models import User
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    User.objects.create_superuser("admin", password="browser-test")
    wait = WebDriverWait(browser, 15)
    browser.get(f"{live_server.url}/admin/login/?next={page}")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("browser-test")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(shown.presence_of_element_located((By.ID, "result_list")))
    return wait


def test_an_admin_logs_in_filters_failed_jobs_and_retries_them(browser, live_server, library_jobs, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import Select

    wait = log_in(browser, live_server, "/admin/vellum_jobs/job/")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 14
    assert browser.find_element(By.CSS_SELECTOR, ".vellum-progress progress").get_attribute("value") == "12"
    browser.save_screenshot(str(tmp_path / "jobs.png"))

    browser.find_element(
        By.CSS_SELECTOR, "#changelist-filter details[data-filter-title=state] summary"
    ).click()
    browser.find_element(By.CSS_SELECTOR, "#changelist-filter a[href='?state__exact=failed']").click()
    wait.until(lambda b: "state__exact=failed" in b.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 3 and all("failed" in row.text for row in rows)

    browser.find_element(By.ID, "action-toggle").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    message = wait.until(shown.presence_of_element_located((By.CSS_SELECTOR, ".messagelist .success")))
    assert message.text == "Retried 3 jobs: queued again, due now."
    browser.save_screenshot(str(tmp_path / "retried.png"))

    assert set(Job.objects.filter(pk__in=[j.pk for j in library_jobs]).values_list("state", flat=True)) == {
        Job.State.QUEUED
    }
    for name in ("jobs.png", "retried.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep(tmp_path / "jobs.png", "admin-changelist.png")
    print(f"screenshots: {tmp_path / 'jobs.png'} {tmp_path / 'retried.png'}")


def test_an_admin_pauses_a_queue_and_reads_the_schedules(
    browser, live_server, library_jobs, settings, tmp_path
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import Select

    settings.VELLUM_JOBS = {
        "SCHEDULES": {"nightly-scan": {"job": "scan", "cron": "0 3 * * *", "args": [1], "timezone": "UTC"}}
    }
    wait = log_in(browser, live_server, "/admin/vellum_jobs/queue/")
    rows = {
        row.text.split()[0]: row for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    assert {"default", "media"} <= set(rows)
    rows["media"].find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("pause")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    message = wait.until(shown.presence_of_element_located((By.CSS_SELECTOR, ".messagelist .success")))
    assert message.text == "Paused 1: media. Running jobs finish."
    media = next(
        row for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr") if "media" in row.text
    )
    assert media.find_elements(By.CSS_SELECTOR, ".vellum-badge-paused")
    assert Queue.objects.get(name="media").is_paused
    browser.save_screenshot(str(tmp_path / "queues.png"))

    browser.get(f"{live_server.url}/admin/vellum_jobs/schedule/")
    row = wait.until(shown.presence_of_element_located((By.CSS_SELECTOR, "#result_list tbody tr")))
    assert "nightly-scan" in row.text and "0 3 * * *" in row.text and "UTC" in row.text
    browser.save_screenshot(str(tmp_path / "schedules.png"))
    for name in ("queues.png", "schedules.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshots: {tmp_path / 'queues.png'} {tmp_path / 'schedules.png'}")


# The dashboard's figures read in one go: the page swaps its body every few
# seconds, and an element found before a swap is gone after it.
DASHBOARD_FIGURES = """
const count = (element) => element.getAttribute("data-count");
return {
  hour_bars: [...document.querySelectorAll("#vellum-chart-hour rect.vellum-bar")].map(
    (rect) => rect.dataset.outcome
  ),
  day_bars: document.querySelectorAll("#vellum-chart-day rect.vellum-bar").length,
  finished_last_hour: count(document.getElementById("vellum-finished-hour")),
  states: Object.fromEntries(
    [...document.querySelectorAll("a[id^='vellum-state-']")].map((a) => [a.id.slice(13), count(a)])
  ),
  alive: document.getElementById("vellum-workers-alive").textContent,
};
"""


@pytest.mark.slow  # a browser and a runjobs drain, then a wait for the page's own refresh
def test_the_dashboard_charts_a_drain_matches_jobstats_and_refreshes_in_place(browser, live_server, tmp_path):
    import json
    from io import StringIO

    from django.core.management import call_command
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.support.processes import REAL_LEASE, Runjobs
    from tests.testapp import jobs as test_jobs
    from vellum_jobs.store import rollup

    rollup.TALLY.take()
    # A day of earlier figures (before the last hour), as workers' heartbeats would have left them,
    # so the 24-hour charts have a shape; then a real drain by runjobs.
    now = timezone.now()
    for minutes_ago in range(70, 24 * 60, 10):
        busy = 40 + (minutes_ago // 10) % 7 * 9
        rollup.count(now - timedelta(minutes=minutes_ago), "media", rollup.DONE, busy)
        rollup.count(now - timedelta(minutes=minutes_ago), "media", rollup.RETRIED, busy // 12)
    rollup.flush("default", now)
    for i, minute in enumerate(QueueMinute.objects.filter(queue="media").order_by("minute")):
        QueueMinute.objects.filter(pk=minute.pk).update(oldest_due_age=0.4 + (i % 12) * (i % 5) * 1.5)
    test_jobs.add.enqueue_many([(i, i) for i in range(30)])
    test_jobs.raise_error.enqueue_many([("cover art server did not answer",)] * 2)
    assert Runjobs("--burst", "--workers", "2", env=REAL_LEASE).wait() == 0
    test_jobs.add.using(run_after=now + timedelta(hours=1)).enqueue(1, 1)  # delayed

    wait = log_in(browser, live_server, "/admin/vellum_jobs/job/")
    browser.find_element(By.ID, "vellum-dashboard-link").click()
    wait.until(lambda b: b.find_elements(By.ID, "vellum-queues"))
    shown = browser.execute_script(DASHBOARD_FIGURES)
    assert set(shown["hour_bars"]) == {"done", "retried", "failed"}
    assert shown["day_bars"] > 0
    assert shown["finished_last_hour"] == str(
        30 + 2 * 3
    )  # 30 done; 2 jobs of 3 attempts: 2 retried, 1 failed

    out = StringIO()
    call_command("jobstats", json=True, stdout=out)
    figures = json.loads(out.getvalue())
    assert shown["states"] == {state: str(n) for state, n in figures["states"].items()}
    assert shown["alive"] == str(figures["workers"]["alive"])
    browser.save_screenshot(str(tmp_path / "dashboard.png"))

    browser.execute_script("window.vellumNotReloaded = true;")
    test_jobs.add.enqueue_many([(i, i) for i in range(3)])
    queued = str(figures["states"]["queued"] + 3)
    WebDriverWait(browser, 20).until(
        lambda b: b.execute_script(DASHBOARD_FIGURES)["states"]["queued"] == queued
    )
    assert browser.execute_script("return window.vellumNotReloaded === true;")
    assert (tmp_path / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep(tmp_path / "dashboard.png", "admin-dashboard.png")
    print(f"screenshot: {tmp_path / 'dashboard.png'}")


# Each admin page an operator opens, at the widths of a laptop, with Django's nav sidebar open.
LAPTOP_WIDTHS = (1280, 1440)
PAGE_FITS = """
const wide = [...document.querySelectorAll("#content *")].filter(
  (element) => element.getBoundingClientRect().right > window.innerWidth + 1
);
// A box that scrolls sideways hides what it holds just as well as the page would.
const scrolls = [...document.querySelectorAll("#content *")].filter(
  (element) => element.scrollWidth > element.clientWidth + 1 &&
    ["auto", "scroll"].includes(getComputedStyle(element).overflowX)
);
const rows = [...document.querySelectorAll("#result_list tbody tr")].map((row) => row.offsetHeight);
return {
  sidebar: !!document.querySelector("#nav-sidebar") && document.querySelector("#nav-sidebar").offsetWidth > 0,
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  wide: wide.slice(0, 5).map((element) => element.tagName + "." + element.className),
  scrolls: scrolls.slice(0, 5).map(
    (element) => `${element.tagName}.${element.className} by ${element.scrollWidth - element.clientWidth} px`
  ),
  columns: [...document.querySelectorAll("#result_list thead th")].map(
    (th) => `${th.className.split(" ")[0]} ${th.offsetWidth}`
  ),
  rows: rows,
};
"""


@pytest.fixture
def operator_pages(library_jobs):
    """The pages of every admin screen, with a live worker running the scan and a schedule."""
    import uuid

    from vellum_jobs.core.models import Worker

    worker = Worker.objects.create(
        id=uuid.uuid4(),
        host="media-1.internal",
        pid=4242,
        threads=4,
        queues=["media"],
        names=registry.names(),
        jobs_run=1873,
        memory=182 * 1024 * 1024,
        started_at=timezone.now() - timedelta(hours=3, minutes=12),
    )
    running = Job.objects.get(state=Job.State.RUNNING)
    Job.objects.filter(pk=running.pk).update(
        worker_id=worker.id, lease_expires_at=timezone.now() + timedelta(minutes=1)
    )
    return {
        "jobs": "/admin/vellum_jobs/job/",
        "failed": "/admin/vellum_jobs/job/?state__exact=failed",
        "failures": "/admin/vellum_jobs/job/failures/?of=failed",
        "failed-job": f"/admin/vellum_jobs/job/{library_jobs[0].pk}/change/",
        "running-job": f"/admin/vellum_jobs/job/{running.pk}/change/",
        "dashboard": "/admin/vellum_jobs/job/dashboard/",
        "workers": "/admin/vellum_jobs/worker/",
        "queues": "/admin/vellum_jobs/queue/",
        "schedules": "/admin/vellum_jobs/schedule/",
    }


@pytest.mark.parametrize("width", LAPTOP_WIDTHS)
def test_every_admin_page_fits_a_laptop_with_the_nav_sidebar_open(
    browser, live_server, operator_pages, settings, tmp_path, width
):
    settings.VELLUM_JOBS = {
        "SCHEDULES": {"nightly-scan": {"job": "scan", "cron": "0 3 * * *", "args": [1], "timezone": "UTC"}}
    }
    log_in(browser, live_server, operator_pages["jobs"])
    browser.set_window_size(width, 900)
    inner = browser.execute_script("return window.innerWidth;")
    browser.set_window_size(2 * width - inner, 900)  # the viewport, not the window, is `width` wide
    assert browser.execute_script("return window.innerWidth;") == width
    for page, path in operator_pages.items():
        browser.get(f"{live_server.url}{path}")
        fit = browser.execute_script(PAGE_FITS)
        assert fit["sidebar"], f"{page}: the nav sidebar is closed"
        assert fit["overflow"] <= 0 and not fit["wide"] and not fit["scrolls"], f"{page} at {width} px: {fit}"
        if fit["rows"]:
            assert max(fit["rows"]) <= 1.6 * min(fit["rows"]), (
                f"{page} at {width} px: uneven rows {fit['rows']}"
            )
        shot = tmp_path / f"admin-{page}-{width}.png"
        browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        keep(shot, f"screenshots/{shot.name}")
    print(f"screenshots: {tmp_path}")
