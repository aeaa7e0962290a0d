"""The limits read model: each key's use by the gate's rules, its hold, and the jobs waiting on it."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support.limit_rows import ago, hold, holder, limits, queued, rate_starts, started
from tests.testapp import jobs  # noqa: F401 (registers test.add, the name of the rows' jobs)
from vellum_jobs.core import registry
from vellum_jobs.core.limit_models import LimitSlot
from vellum_jobs.core.models import Job, Worker
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


# -- explain() -------------------------------------------------------------------


def live_worker() -> Worker:
    """A worker row as ``runjobs`` writes it: serving every queue and knowing every registered name."""
    fields = {"host": "test", "pid": 1, "threads": 1, "queues": [], "names": registry.names()}
    return Worker.objects.create(id=uuid.uuid4(), last_heartbeat=timezone.now(), **fields)


def reasons(job: Job) -> list[tuple[str, str]]:
    return [(reason.code, reason.text) for reason in Job.objects.get(pk=job.pk).explain()]


def test_a_job_whose_limits_have_room_starts_under_them():
    live_worker()
    now = timezone.now()
    (job,) = queued(limits(rates=[("k", 100, 60)], concurrency=[("gpu", 2)]))
    rate_starts("k", 60, *ago(now, 1, 2, 3))

    assert reasons(job) == [
        ("ready", "due now: waiting for a free worker thread to claim it"),
        (
            "limit_room",
            "its limits have room: rate 'k': 3 of 100 per minute used; concurrency 'gpu': 0 of 2 running",
        ),
    ]


def test_a_full_rate_limit_holds_a_due_job_until_its_next_slot():
    live_worker()
    now = timezone.now()
    (job,) = queued(limits(rates=[("mail", 2, 60)]))
    rate_starts("mail", 60, *ago(now, 1, 2))

    ((code, text),) = reasons(job)

    assert code == "limit_full"
    assert re.fullmatch(
        r"held back by its limits: rate 'mail' is full: 2 of 2 per minute used, "
        r"next slot at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(in \d\d s\)",
        text,
    ), text


def test_a_job_the_worker_held_back_says_what_it_was_told_and_when_it_is_tried_again():
    live_worker()
    now = timezone.now()
    said = "held by rate limit 'customer:42' (100 per minute): next slot at 2026-12-07 01:02:03 UTC"
    # A job that had failed an attempt before: the wait is its next slot, not a retry backoff.
    (job,) = queued(
        limits(rates=[("customer:42", 100, 60)]),
        run_after=now + timedelta(seconds=40.5),
        attempts=1,
        error=said + "\n",
    )

    ((code, text),) = reasons(job)

    assert code == "limit_full"
    assert text.startswith(f"{said}; it is tried again at ")
    assert re.search(r" \(in \d\d s\); now: rate 'customer:42': 0 of 100 per minute used$", text), text


def test_a_held_key_holds_its_jobs_and_says_until_when_and_why():
    live_worker()
    now = timezone.now()
    (job,) = queued(limits(concurrency=[("api.example.com", 10)]))
    hold("api.example.com", now, 30.5, "429: retry in 30 s")

    ((code, text),) = reasons(job)

    assert code == "limit_held"
    assert re.fullmatch(
        r"held back by its limits: 'api.example.com' is held until [\d: -]+ \(in \d\d s\): "
        r"429: retry in 30 s; "
        r"concurrency 'api.example.com': 0 of 10 running",
        text,
    ), text


def test_a_full_concurrency_limit_names_the_jobs_that_hold_it():
    live_worker()
    now = timezone.now()
    text = limits(concurrency=[("gpu", 1)])
    running = started(text, now)
    holder("gpu", 0, running)
    (job,) = queued(text)

    (reason,) = Job.objects.get(pk=job.pk).explain()

    assert (reason.code, reason.job_ids) == ("limit_full", (running.pk,))
    assert (
        reason.text == f"held back by its limits: concurrency 'gpu' is full: 1 of 1 running (#{running.pk})"
    )


def test_a_page_of_jobs_under_limits_costs_the_queries_of_one():
    from vellum_jobs.observe.explain import explain

    live_worker()
    now = timezone.now()

    def queries(n: int) -> int:
        Job.objects.all().delete()
        LimitSlot.objects.all().delete()
        for k in range(n):
            queued(limits(rates=[(f"customer:{k}", 5, 60)], concurrency=[(f"gpu:{k}", 1)]))
            rate_starts(f"customer:{k}", 60, *ago(now, 1))
        page = list(Job.objects.order_by("pk"))
        with CaptureQueriesContext(connection) as captured:
            explain(page, now)
        return len(captured)

    assert queries(12) == queries(1)


# -- jobstats --------------------------------------------------------------------


def test_jobstats_lists_the_throttled_keys_and_nothing_without_limits():
    from io import StringIO

    from django.core.management import call_command

    def jobstats() -> list[str]:
        out = StringIO()
        call_command("jobstats", stdout=out)
        return out.getvalue().splitlines()

    assert not any(line.startswith("limit keys") for line in jobstats())
    now = timezone.now()
    queued(limits(rates=[("mail", 1, 60)]), 2)
    rate_starts("mail", 60, now)
    hold("api.example.com", now, 60, "429")
    queued(limits(concurrency=[("roomy", 5)]))

    lines = jobstats()

    start = lines.index("limit keys: 3 in use, 2 throttled")
    assert lines[start + 1] == "  mail  rate 1 of 1 per minute used  jobs waiting 2"
    assert re.fullmatch(r"  api\.example\.com  held until [\d: -]+: 429  jobs waiting 0", lines[start + 2])
    assert len(lines) == start + 3
