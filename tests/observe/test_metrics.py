"""The metrics view: what each metric counts, who may scrape it, its answers without a database or client."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.support import bigtable
from tests.support.admin_pages import staff_user
from tests.support.processes import ROOT
from vellum_jobs import queues
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job, NameMinute, QueueMinute, Worker
from vellum_jobs.observe import metrics
from vellum_jobs.store import name_rollup, rollup

pytestmark = pytest.mark.django_db

URL = "/jobs/metrics/"
STATES = list(Job.State.values)


def settings(**health):
    return override_settings(VELLUM_JOBS={"LEASE": 60, "HEARTBEAT": 10, "HEALTH": health})


@pytest.fixture(autouse=True)
def empty_tally():
    rollup.TALLY.take()  # what in-process runs of other tests counted
    name_rollup.TALLY.take()
    yield
    rollup.TALLY.take()
    name_rollup.TALLY.take()


def scrape(client) -> dict[str, Metric]:
    with settings():
        response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {family.name: family for family in text_string_to_metric_families(response.content.decode())}


def value(families: dict[str, Metric], name: str, /, **labels: str) -> float:
    """The one sample of ``name`` with exactly these labels."""
    (found,) = [s.value for s in families[name].samples if s.labels == labels]
    return found


def job(queue: str, state: str = Job.State.QUEUED, **fields) -> Job:
    return Job.objects.create(name="test.add", queue=queue, state=state, **fields)


def worker(**fields) -> Worker:
    fields = {"host": "web", "pid": 1, "threads": 4, "last_heartbeat": timezone.now(), **fields}
    return Worker.objects.create(id=uuid.uuid4(), **fields)


# -- what the metrics count --------------------------------------------------


def test_jobs_are_counted_by_queue_and_state(staff):
    now = timezone.now()
    job("mail")
    job("mail", run_after=now + timedelta(hours=1))  # delayed: still queued
    job("mail", Job.State.DONE, finished_at=now)
    job("media", Job.State.RUNNING, started_at=now)
    for _ in range(3):
        job("media", Job.State.FAILED, finished_at=now)
    worker(queues=["mail"])
    families = scrape(staff)
    expected = {
        "mail": {"waiting": 0, "queued": 2, "running": 0, "done": 1, "failed": 0, "cancelled": 0},
        "media": {"waiting": 0, "queued": 0, "running": 1, "done": 0, "failed": 3, "cancelled": 0},
    }
    for queue, by_state in expected.items():
        assert {s: value(families, "vellum_jobs_jobs", queue=queue, state=s) for s in STATES} == by_state
    assert families["vellum_jobs_jobs"].type == "gauge"


def test_waiting_jobs_have_their_own_state_label(staff):
    job("mail", Job.State.WAITING)
    job("mail", Job.State.WAITING)
    job("mail")
    families = scrape(staff)
    assert value(families, "vellum_jobs_jobs", queue="mail", state="waiting") == 2
    assert value(families, "vellum_jobs_jobs", queue="mail", state="queued") == 1


def test_the_queues_are_those_of_jobs_workers_paused_queues_outcomes_and_due_or_running_jobs(staff):
    job("nobody-knows")  # due: found by the oldest-due query
    job("nobody-else-knows", Job.State.RUNNING, started_at=timezone.now())
    worker(queues=["served"])
    queues.pause("paused")
    rollup.count(timezone.now(), "finished-once", rollup.DONE)
    rollup.flush("default", timezone.now())
    job("only-delayed", run_after=timezone.now() + timedelta(hours=1))
    families = scrape(staff)
    listed = {s.labels["queue"] for s in families["vellum_jobs_jobs"].samples}
    assert {"default", "media", "served", "paused", "finished-once"} <= listed  # media: a registered job's
    assert {"nobody-knows", "nobody-else-knows"} <= listed
    assert "only-delayed" not in listed  # see the module docstring: no table scan for queue names
    assert value(families, "vellum_jobs_jobs", queue="nobody-knows", state="queued") == 1
    assert value(families, "vellum_jobs_jobs", queue="nobody-else-knows", state="running") == 1


def test_a_count_past_the_limit_is_the_estimate_or_the_lower_bound(staff, vendor):
    worker(queues=["bulk"])
    bigtable.fill(10_001, queue="bulk", state=Job.State.DONE)
    if vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Job._meta.db_table}")
    families = scrape(staff)
    done = value(families, "vellum_jobs_jobs", queue="bulk", state="done")
    if vendor == "sqlite":  # no statistics: the lower bound
        assert done == 10_000
    else:  # the planner's estimate when it is past the limit, else the lower bound
        assert 10_000 <= done <= 12_000
    assert "10,000" in families["vellum_jobs_jobs"].documentation


def test_the_oldest_due_age_is_per_queue_and_zero_when_none_is_due(staff):
    now = timezone.now()
    job("mail", run_after=now - timedelta(seconds=90))
    job("mail", run_after=now - timedelta(seconds=10))
    job("media", run_after=now + timedelta(hours=1))
    families = scrape(staff)
    assert 90 <= value(families, "vellum_jobs_oldest_due_age_seconds", queue="mail") < 120
    assert value(families, "vellum_jobs_oldest_due_age_seconds", queue="media") == 0


def test_workers_by_liveness_with_their_slots_and_the_running_jobs_they_hold(staff):
    now = timezone.now()
    live = worker(threads=4, async_workers=10, stuck=1)
    stale = worker(threads=8, async_workers=5, stuck=2, last_heartbeat=now - timedelta(minutes=5))
    job("default", Job.State.RUNNING, worker_id=live.pk, started_at=now)
    job("default", Job.State.RUNNING, worker_id=live.pk, started_at=now, is_async=True)
    job("default", Job.State.RUNNING, worker_id=live.pk, started_at=now, is_async=True)
    job("default", Job.State.RUNNING, worker_id=stale.pk, started_at=now)
    families = scrape(staff)
    assert value(families, "vellum_jobs_workers", state="alive") == 1
    assert value(families, "vellum_jobs_workers", state="stale") == 1
    assert value(families, "vellum_jobs_worker_slots", kind="threads") == 4
    assert value(families, "vellum_jobs_worker_slots", kind="async") == 10
    assert value(families, "vellum_jobs_worker_busy_slots", kind="threads") == 1
    assert value(families, "vellum_jobs_worker_busy_slots", kind="async") == 2
    assert value(families, "vellum_jobs_worker_stuck_slots") == 1


def test_outcomes_are_counters_since_the_rollup_began_folded_minutes_included(staff):
    now = timezone.now()
    rollup.count(now, "mail", rollup.DONE, 5)
    rollup.count(now, "mail", rollup.RETRIED, 2)
    rollup.count(now - timedelta(minutes=3), "mail", rollup.FAILED)
    rollup.flush("default", now)
    QueueMinute.objects.create(minute=rollup.BEGINNING, queue="mail", done=100, lost=1)
    families = scrape(staff)
    assert families["vellum_jobs_outcomes"].type == "counter"
    found = {
        s.labels["outcome"]: s.value
        for s in families["vellum_jobs_outcomes"].samples
        if s.labels["queue"] == "mail" and s.name == "vellum_jobs_outcomes_total"
    }
    assert found == {"done": 105, "failed": 1, "cancelled": 0, "retried": 2, "lost": 1, "snoozed": 0}


def test_a_paused_queue_is_one_and_a_running_one_zero(staff):
    queues.pause("mail")
    job("media")
    families = scrape(staff)
    assert value(families, "vellum_jobs_queue_paused", queue="mail") == 1
    assert value(families, "vellum_jobs_queue_paused", queue="media") == 0


def test_every_metric_is_prefixed_and_says_how_it_is_counted(staff):
    families = scrape(staff)
    assert sorted(families) == [
        "vellum_jobs_job_duration_seconds",
        "vellum_jobs_job_failure_ratio",
        "vellum_jobs_job_finished_per_minute",
        "vellum_jobs_job_last_hour_duration_seconds",
        "vellum_jobs_job_last_hour_wait_seconds",
        "vellum_jobs_job_outcomes",
        "vellum_jobs_job_wait_seconds",
        "vellum_jobs_jobs",
        "vellum_jobs_limit_held",
        "vellum_jobs_limit_in_use",
        "vellum_jobs_limit_keys",
        "vellum_jobs_limit_waiting",
        "vellum_jobs_oldest_due_age_seconds",
        "vellum_jobs_outcomes",
        "vellum_jobs_queue_paused",
        "vellum_jobs_worker_busy_slots",
        "vellum_jobs_worker_slots",
        "vellum_jobs_worker_stuck_slots",
        "vellum_jobs_workers",
    ]
    assert all(len(family.documentation) > 40 for family in families.values())


def samples(families: dict[str, Metric], family: str, sample: str, **labels: str) -> dict[str, float]:
    """The values of ``sample`` in ``family`` with these labels, by their other labels' values."""
    found = {}
    for s in families[family].samples:
        if s.name == sample and labels.items() <= s.labels.items():
            rest = [v for k, v in s.labels.items() if k not in labels]
            found[",".join(rest)] = s.value
    return found


def test_each_job_name_has_outcome_counters_folded_minutes_included(staff):
    now = timezone.now()
    rollup.count(now, "mail", rollup.DONE, 3, name="mail.send", duration=0.2, wait=1.0)
    rollup.count(now, "mail", rollup.SNOOZED, name="mail.send", duration=0.01, wait=0.0)
    rollup.count_name(now, "mail.send", rollup.FAILED, 2)
    rollup.flush("default", now)
    NameMinute.objects.create(minute=rollup.BEGINNING, name="mail.send", done=100, lost=1)
    families = scrape(staff)
    assert families["vellum_jobs_job_outcomes"].type == "counter"
    found = samples(families, "vellum_jobs_job_outcomes", "vellum_jobs_job_outcomes_total", name="mail.send")
    assert found == {"done": 103, "failed": 2, "cancelled": 0, "retried": 0, "lost": 1, "snoozed": 1}
    # A registered name that never ran has its counters, at zero.
    never_ran = samples(
        families, "vellum_jobs_job_outcomes", "vellum_jobs_job_outcomes_total", name="test.add"
    )
    assert never_ran == dict.fromkeys(rollup.OUTCOMES, 0)


def test_durations_and_waits_are_prometheus_histograms_by_name(staff):
    now = timezone.now()
    for duration, wait in ((0.004, 0.5), (0.3, 2.0), (0.3, 2.0), (7200.0, 40.0)):
        rollup.count(now, "default", rollup.DONE, name="test.add", duration=duration, wait=wait)
    rollup.flush("default", now)
    families = scrape(staff)
    assert families["vellum_jobs_job_duration_seconds"].type == "histogram"
    buckets = samples(
        families,
        "vellum_jobs_job_duration_seconds",
        "vellum_jobs_job_duration_seconds_bucket",
        name="test.add",
    )
    assert (buckets["0.01"], buckets["0.25"], buckets["0.5"], buckets["3600.0"], buckets["+Inf"]) == (
        1,
        1,
        3,
        3,
        4,
    )
    assert list(buckets) == [*(repr(float(b)) for b in name_rollup.BOUNDS[:-1]), "+Inf"]
    total = samples(
        families, "vellum_jobs_job_duration_seconds", "vellum_jobs_job_duration_seconds_sum", name="test.add"
    )
    count = samples(
        families,
        "vellum_jobs_job_duration_seconds",
        "vellum_jobs_job_duration_seconds_count",
        name="test.add",
    )
    assert (total[""], count[""]) == (pytest.approx(7200.604), 4)
    waits = samples(
        families, "vellum_jobs_job_wait_seconds", "vellum_jobs_job_wait_seconds_bucket", name="test.add"
    )
    assert (waits["0.5"], waits["1.0"], waits["2.5"], waits["30.0"], waits["60.0"]) == (1, 1, 3, 3, 4)


def test_the_last_hour_s_failure_ratio_quantiles_and_finishes_per_minute_by_name(staff):
    now = timezone.now()
    rollup.count(now, "default", rollup.DONE, 6, name="test.add", duration=0.3, wait=0.1)
    rollup.count(now, "default", rollup.RETRIED, 3, name="test.add", duration=0.3, wait=0.1)
    rollup.count(now, "default", rollup.FAILED, 1, name="test.add", duration=20.0, wait=0.1)
    rollup.count(now, "default", rollup.SNOOZED, 50, name="test.add")  # not a failure
    rollup.count(now - timedelta(hours=2), "default", rollup.FAILED, 90, name="test.add")  # an hour ago
    rollup.flush("default", now)
    families = scrape(staff)
    assert value(families, "vellum_jobs_job_failure_ratio", name="test.add") == pytest.approx(0.4)
    per_minute = samples(
        families,
        "vellum_jobs_job_finished_per_minute",
        "vellum_jobs_job_finished_per_minute",
        name="test.add",
    )
    assert per_minute["done"] == pytest.approx(0.1) and per_minute["snoozed"] == pytest.approx(50 / 60)
    p50 = value(families, "vellum_jobs_job_last_hour_duration_seconds", name="test.add", quantile="0.5")
    p95 = value(families, "vellum_jobs_job_last_hour_duration_seconds", name="test.add", quantile="0.95")
    assert 0.25 < p50 <= 0.5 and 10 < p95 <= 30
    assert value(families, "vellum_jobs_job_last_hour_wait_seconds", name="test.add", quantile="0.95") <= 0.25


def test_the_name_label_is_bounded_the_names_past_it_added_up_as_other(staff):
    now = timezone.now()
    unregistered = [f"task.n{i:02}" for i in range(metrics.MAX_OTHER_NAMES + 5)]
    for name in unregistered:
        rollup.count(now, "default", rollup.DONE, 2, name=name, duration=1.0, wait=1.0)
    rollup.count(now, "default", rollup.DONE, name="test.add", duration=1.0, wait=1.0)
    rollup.flush("default", now)
    families = scrape(staff)
    done = samples(families, "vellum_jobs_job_outcomes", "vellum_jobs_job_outcomes_total", outcome="done")
    assert set(unregistered[: metrics.MAX_OTHER_NAMES]) <= set(done)
    assert not set(unregistered[metrics.MAX_OTHER_NAMES :]) & set(done)
    assert done["other"] == 10 and done["test.add"] == 1
    counts = samples(families, "vellum_jobs_job_duration_seconds", "vellum_jobs_job_duration_seconds_count")
    assert counts["other"] == 10
    labels = set(metrics.name_labels(set(unregistered), set(registry.names())).values())
    assert set(done) == labels and len(labels) <= len(registry.names()) + metrics.MAX_OTHER_NAMES + 1


# -- who may scrape it, and how ------------------------------------------------


def test_anonymous_callers_are_refused_unless_public(client):
    with settings():
        response = client.get(URL)
    assert response.status_code == 403
    assert "vellum_jobs.view_job" in response.content.decode() and "PUBLIC" in response.content.decode()
    with settings(PUBLIC=True):
        assert client.get(URL).status_code == 200


def test_staff_without_the_view_job_permission_are_refused(client):
    client.force_login(staff_user("view_worker", "view_queue"))
    with settings():
        assert client.get(URL).status_code == 403


@pytest.mark.parametrize("codename", ["view_job", "change_job"])
def test_staff_who_may_see_the_job_list_in_the_admin_may_scrape_it(client, codename):
    client.force_login(staff_user(codename))
    with settings():
        assert client.get(URL).status_code == 200


def test_only_get_and_head_are_allowed_and_nothing_is_cached(staff):
    with settings():
        assert staff.post(URL).status_code == 405
        assert staff.head(URL).status_code == 200
        response = staff.get(URL)
    assert "no-cache" in response["Cache-Control"] and "max-age=0" in response["Cache-Control"]
    assert reverse("vellum_jobs:metrics") == URL


@contextlib.contextmanager
def unreachable_database() -> Iterator[None]:
    """The default alias pointed at a database that does not exist: a real connection error."""
    missing = "/nonexistent/vellum.sqlite3" if connection.vendor == "sqlite" else "vellum_no_such_database"
    saved = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = missing
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["NAME"] = saved


@pytest.mark.django_db(transaction=True)
def test_a_database_that_does_not_answer_is_503_and_the_error_goes_to_the_log(client, caplog):
    with settings(PUBLIC=True), unreachable_database():
        response = client.get(URL)
    assert response.status_code == 503
    assert response.content.decode() == "the jobs database did not answer (OperationalError)\n"
    assert "metrics could not read the queue error=" in caplog.text


# In a fresh process, prometheus_client cannot be imported: the URLs still
# load without it, and the view says how to install it.
WITHOUT_CLIENT = textwrap.dedent(
    """
    import sys

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "prometheus_client":
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, Blocker())
    import django
    django.setup()
    from django.test import Client, override_settings
    import vellum_jobs.urls
    assert "prometheus_client" not in sys.modules
    with override_settings(VELLUM_JOBS={"HEALTH": {"PUBLIC": True}}, ALLOWED_HOSTS=["testserver"]):
        response = Client().get("/jobs/metrics/")
    print(response.status_code, response.content.decode().strip())
    """
)


def test_without_prometheus_client_the_view_says_how_to_install_it():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_CLIENT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        '501 the metrics need prometheus_client: pip install "vellum-jobs[prometheus]"'
    )
