"""The limits read model: each key's use by the gate's rules, its hold, and the jobs waiting on it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support.limit_rows import ago, hold, holder, limits, queued, rate_starts, started
from vellum_jobs.core.models import Job
from vellum_jobs.observe import limit_metrics
from vellum_jobs.observe import limits as view

pytestmark = pytest.mark.django_db


def keys(overview: view.Overview) -> dict[str, view.KeyView]:
    return {key.key: key for key in overview.keys}


def test_a_rate_limit_counts_the_starts_of_its_last_period():
    now = timezone.now()
    queued(limits(rates=[("customer:42", 3, 60)]), 2)
    # 61 s ago is out of the window and past the guard (a quarter second): free again.
    rate_starts("customer:42", 60, *ago(now, 10, 30, 61))

    (limit,) = keys(view.overview(now=now))["customer:42"].limits

    assert (limit.kind, limit.count, limit.in_use, limit.resting) == ("rate", 3, 2, 2)
    assert not limit.full and limit.next_free is None
    assert (limit.limit_text, limit.use_text, limit.waiting) == ("3 per minute", "2 of 3 per minute used", 2)


def test_a_full_rate_limit_says_when_its_next_slot_frees_guard_included():
    now = timezone.now()
    queued(limits(rates=[("mail", 2, 60)]))
    # 60.1 s ago: out of the last minute, but its slot rests a guard longer.
    rate_starts("mail", 60, *ago(now, 10, 60.1))

    key = keys(view.overview(now=now))["mail"]
    (limit,) = key.limits

    assert (limit.in_use, limit.resting, limit.full) == (1, 2, True)
    assert limit.next_free == now - timedelta(seconds=60.1) + timedelta(seconds=60.25)
    assert key.throttled  # full, with a job waiting


def test_a_full_key_with_nothing_waiting_is_shown_but_not_throttled():
    now = timezone.now()
    job = Job.objects.create(name="test.add", state=Job.State.DONE, limits=limits(rates=[("sms", 1, 1)]))
    rate_starts("sms", 1, now - timedelta(seconds=0.5), job=job)

    key = keys(view.overview(now=now))["sms"]

    # The size comes from the job the slot let start.
    assert (key.limits[0].count, key.full, key.waiting, key.throttled) == (1, True, 0, False)


def test_a_key_whose_slots_all_rest_no_more_and_that_nobody_waits_on_is_not_in_use():
    now = timezone.now()
    rate_starts("old", 60, *ago(now, 3600, 7200))

    assert "old" not in keys(view.overview(now=now))


def test_a_concurrency_slot_is_held_while_its_job_runs_under_the_claim_it_started_with():
    now = timezone.now()
    text = limits(concurrency=[("gpu", 3)])
    live = started(text, now)
    ended = started(text, now)
    Job.objects.filter(pk=ended.pk).update(state=Job.State.DONE, finished_at=now)
    reclaimed = started(text, now, claims=2)  # its lease lapsed, another worker claimed it again
    holder("gpu", 0, live)
    holder("gpu", 1, ended)
    holder("gpu", 2, reclaimed, claims=1)
    queued(text, 4)

    (limit,) = keys(view.overview(now=now))["gpu"].limits

    assert (limit.kind, limit.in_use, limit.holders, limit.count, limit.waiting) == (
        "concurrency",
        1,
        (live.pk,),
        3,
        4,
    )
    assert (limit.use_text, limit.limit_text, limit.full) == ("1 of 3 running", "3 at once", False)


def test_a_hold_counts_until_it_ends():
    now = timezone.now()
    hold("api.example.com", now, 30, "429: retry in 30 s")
    hold("api.old.com", now, -1)

    found = keys(view.overview(now=now))

    assert "api.old.com" not in found
    key = found["api.example.com"]
    assert key.hold is not None and key.hold.reason == "429: retry in 30 s"
    assert key.hold.until == now + timedelta(seconds=30)
    assert key.throttled and key.limits == []


def test_jobs_waiting_are_counted_per_limit_and_once_per_key():
    now = timezone.now()
    both = limits(rates=[("customer:7", 10, 1), ("customer:7", 500, 3600)], concurrency=[("gpu", 1)])
    queued(both, 3)
    queued(limits(rates=[("customer:7", 10, 1)]), 2)
    Job.objects.create(name="test.add", state=Job.State.DONE, limits=both)  # not waiting
    queued("", 5)  # no limits

    found = keys(view.overview(now=now))

    assert (found["customer:7"].waiting, found["gpu"].waiting) == (5, 3)
    by_period = {limit.period: limit.waiting for limit in found["customer:7"].limits}
    assert by_period == {1.0: 5, 3600.0: 3}
    assert [limit.limit_text for limit in found["customer:7"].limits] == ["10 per second", "500 per hour"]


def test_the_waiting_read_is_bounded_and_then_says_at_least(monkeypatch):
    now = timezone.now()
    monkeypatch.setattr(view, "WAITING_READ", 3)
    queued(limits(concurrency=[("gpu", 1)]), 5)

    overview = view.overview(now=now)

    assert (overview.complete, overview.waiting_read, overview.at_least) == (False, 3, "at least ")
    assert keys(overview)["gpu"].waiting == 3


def test_throttled_keys_come_first_then_the_most_waited_on():
    now = timezone.now()
    queued(limits(concurrency=[("few", 5)]), 1)
    queued(limits(concurrency=[("many", 5)]), 3)
    hold("held", now, 60)

    assert [key.key for key in view.overview(now=now).keys] == ["held", "many", "few"]


def test_nothing_in_use_is_an_empty_overview():
    overview = view.overview(now=timezone.now())
    assert (overview.keys, overview.throttled, overview.complete) == ([], [], True)


def test_the_queries_are_few_however_many_keys():
    now = timezone.now()
    for n in range(20):
        queued(limits(rates=[(f"customer:{n}", 5, 60), (f"customer:{n}", 50, 3600)]), 2)
        rate_starts(f"customer:{n}", 60, *ago(now, 1, 2))
        rate_starts(f"customer:{n}", 3600, *ago(now, 1, 2))
        hold(f"customer:{n}", now, 10)
    running = started(limits(concurrency=[("gpu", 1)]), now)
    holder("gpu", 0, running)

    with CaptureQueriesContext(connection) as queries:
        overview = view.overview(now=now)

    assert len(overview.keys) == 21
    # waiting, periods, one per period, running jobs, their slots, holds (and a savepoint or so).
    assert len(queries) <= 8, [q["sql"] for q in queries]


# -- the metrics -----------------------------------------------------------------


def scrape(client) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Each metric's samples by their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    with override_settings(VELLUM_JOBS={"LEASE": 60, "HEARTBEAT": 10}):
        response = client.get("/jobs/metrics/")
    assert response.status_code == 200, response.content
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(response.content.decode())
    }


def test_the_metrics_give_each_key_s_use_jobs_waiting_and_hold(staff):
    now = timezone.now()
    queued(limits(rates=[("mail", 10, 60)], concurrency=[("gpu", 2)]), 3)
    rate_starts("mail", 60, *ago(now, 1, 2, 3))
    running = started(limits(concurrency=[("gpu", 2)]), now)
    holder("gpu", 0, running)
    hold("api.example.com", now, 30)

    found = scrape(staff)

    assert found["vellum_jobs_limit_keys"] == {(): 3}
    assert found["vellum_jobs_limit_in_use"] == {
        (("key", "mail"), ("kind", "rate")): 3,
        (("key", "gpu"), ("kind", "concurrency")): 1,
    }
    assert found["vellum_jobs_limit_waiting"] == {
        (("key", "mail"), ("kind", "rate")): 3,
        (("key", "gpu"), ("kind", "concurrency")): 3,
    }
    assert found["vellum_jobs_limit_held"] == {
        (("key", "api.example.com"),): 1,
        (("key", "mail"),): 0,
        (("key", "gpu"),): 0,
    }


def test_the_metrics_label_the_most_waited_on_keys_and_add_up_the_rest_as_other(staff, monkeypatch):
    now = timezone.now()
    monkeypatch.setattr(limit_metrics, "LIMIT_KEYS_SHOWN", 2)
    for n, waiting in enumerate([5, 1, 4, 2]):
        queued(limits(concurrency=[(f"customer:{n}", 1)]), waiting)
    hold("customer:1", now, 30)

    found = scrape(staff)

    waiting = {dict(labels)["key"]: value for labels, value in found["vellum_jobs_limit_waiting"].items()}
    assert waiting == {"customer:0": 5, "customer:2": 4, "(other)": 3}
    assert {dict(labels)["key"]: v for labels, v in found["vellum_jobs_limit_held"].items()} == {
        "customer:0": 0,
        "customer:2": 0,
        "(other)": 1,
    }
    assert found["vellum_jobs_limit_keys"] == {(): 4}
