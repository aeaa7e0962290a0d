"""The randomized test's checker (``tests/support/chaos_check.py``) on records made up by hand: it finds each
violation, and excuses only what the database's history excuses."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.utils import timezone

from tests.support.chaos_check import (
    CLAIM_TWICE,
    KEY_LIMIT,
    NO_REASON,
    OVERLAP,
    PARTIAL,
    PARTIAL_LEASE_LOST,
    RATE_LIMIT,
    TWO_WAITING,
    UNFINISHED,
    Row,
    Sampler,
    check,
)
from vellum_jobs.core import history
from vellum_jobs.core.limits import Limits
from vellum_jobs.core.models import Job


def run(job: int, claim: int, start: float, last: float, how: str | None = "finished", **more: Any):
    """The lines of one attempt: its start, a tick, and its end unless ``how`` is None (cut off)."""
    line = {
        "job": job,
        "claim": claim,
        "attempt": claim,
        "pid": more.pop("pid", 100 + claim),
        "key": more.pop("key", ""),
    }
    records = [
        {
            **line,
            "e": "start",
            "t": start,
            "deadline": more.pop("deadline", None),
            "wall": more.pop("wall", None),
        }
    ]
    records.append({**line, "e": "tick", "t": last})
    if how is not None:
        records.append({**line, "e": "end", "t": last, "how": how})
    return records


NONE = Limits()


def row(
    state: str = "done", claims: int = 1, entries=(), error: str = "", limit: int = 0, limits=NONE
) -> Row:
    return Row(
        "test.chaos.sync", state, error, claims, None, limit, [dict(e) for e in entries], limits.encode()
    )


RATED = Limits(rates=(("r", 2, 1.0),))
GATED = Limits(concurrency=(("gpu", 2), ("tenant", 1)))


def entry(claim: int, outcome: str) -> dict[str, Any]:
    return {"attempt": claim, "claim": claim, "outcome": outcome, "error": "", "worker": "box:1"}


def kinds(findings) -> list[str]:
    return [v.kind for v in findings.violations]


def test_attempts_one_after_the_other_are_no_violation():
    records = run(1, 1, 0.0, 1.0, "raised") + run(1, 2, 1.5, 2.0)
    findings = check(records, {1: row(claims=2, entries=[entry(1, history.FAILED)])}, [])
    assert kinds(findings) == []
    assert findings.figures["attempts"] == 2


def test_two_attempts_of_one_job_at_once_are_a_violation():
    records = run(1, 1, 0.0, 2.0, "raised") + run(1, 2, 1.0, 3.0)
    assert kinds(check(records, {1: row(claims=2, entries=[entry(1, history.FAILED)])}, [])) == [OVERLAP]


def test_an_attempt_cut_off_counts_until_its_last_sign_of_life():
    # Handed back at a shutdown: the process exited with the handler still in it.
    records = run(1, 1, 0.0, 2.0, how=None) + run(1, 2, 1.9, 3.0)
    assert kinds(check(records, {1: row(claims=2, entries=[entry(1, history.HANDED_BACK)])}, [])) == [OVERLAP]
    records = run(1, 1, 0.0, 2.0, how=None) + run(1, 2, 2.1, 3.0)
    assert kinds(check(records, {1: row(claims=2, entries=[entry(1, history.HANDED_BACK)])}, [])) == []


def test_a_lapsed_lease_of_that_very_claim_excuses_an_overlap():
    records = run(1, 1, 0.0, 9.0) + run(1, 2, 4.0, 5.0)
    lapsed = check(records, {1: row(claims=2, entries=[entry(1, history.LOST)])}, [])
    assert kinds(lapsed) == []
    assert lapsed.figures["overlaps after a lapsed lease"] == 1
    # The history names another claim's lapse: this overlap has no excuse.
    records = run(1, 2, 0.0, 9.0) + run(1, 3, 4.0, 5.0)
    other = row(claims=3, entries=[entry(1, history.LOST), entry(2, history.HANDED_BACK)])
    assert kinds(check(records, {1: other}, [])) == [OVERLAP]


def test_a_timeout_excuses_an_overlap_only_after_the_deadline():
    timed_out = row(claims=2, entries=[entry(1, history.TIMED_OUT)])
    records = run(1, 1, 0.0, 5.0, deadline=1.0) + run(1, 2, 1.5, 2.0)
    assert kinds(check(records, {1: timed_out}, [])) == []
    records = run(1, 1, 0.0, 5.0, deadline=1.0) + run(1, 2, 0.5, 2.0)
    assert kinds(check(records, {1: timed_out}, [])) == [OVERLAP]


def test_one_claim_started_twice_is_a_violation():
    records = run(1, 1, 0.0, 1.0) + run(1, 1, 2.0, 3.0)
    assert kinds(check(records, {1: row()}, [])) == [CLAIM_TWICE]


@pytest.mark.parametrize(
    "state, error, how, found",
    [
        ("queued", "", "finished", [UNFINISHED]),
        ("running", "", "finished", [UNFINISHED]),
        ("failed", "", "raised", [NO_REASON]),
        ("cancelled", " ", "finished", [NO_REASON]),
        ("failed", "RuntimeError: boom", "raised", []),
        ("done", "", "finished", []),
        ("done", "", "stopped: shutting down", [PARTIAL]),
        ("done", "", "stopped: lease lost", [PARTIAL_LEASE_LOST]),
        ("done", "", None, [PARTIAL]),
    ],
)
def test_each_job_ends_finished_with_a_reason_and_done_only_when_its_handler_finished(
    state, error, how, found
):
    assert kinds(check(run(1, 1, 0.0, 1.0, how), {1: row(state, error=error)}, [])) == found


def test_a_done_job_whose_last_claim_never_ran_its_handler_is_a_violation():
    assert kinds(check(run(1, 1, 0.0, 1.0), {1: row(claims=2)}, [])) == [PARTIAL]


def test_a_key_over_its_limit_is_a_violation_unless_a_lease_lapsed_or_a_deadline_passed():
    rows = {pk: row(claims=1, limit=1, entries=[]) for pk in (1, 2)}
    records = run(1, 1, 0.0, 2.0, key="k") + run(2, 1, 1.0, 3.0, key="k")
    assert kinds(check(records, rows, [])) == [KEY_LIMIT]
    records = run(1, 1, 0.0, 1.0, key="k") + run(2, 1, 1.0, 3.0, key="k")
    assert kinds(check(records, rows, [])) == []  # one ends as the other starts

    rows[1] = row(claims=1, limit=1, entries=[entry(1, history.LOST)])
    records = run(1, 1, 0.0, 2.0, key="k") + run(2, 1, 1.0, 3.0, key="k")
    assert kinds(check(records, rows, [])) == []

    rows[1] = row(claims=1, limit=1, entries=[entry(1, history.TIMED_OUT)])
    records = run(1, 1, 0.0, 2.0, key="k", deadline=0.5) + run(2, 1, 1.0, 3.0, key="k")
    assert kinds(check(records, rows, [])) == []
    records = run(1, 1, 0.0, 2.0, key="k", deadline=1.5) + run(2, 1, 1.0, 3.0, key="k")
    assert kinds(check(records, rows, [])) == [KEY_LIMIT]


def test_a_key_of_limit_two_may_run_two_but_not_three():
    rows = {pk: row(limit=2) for pk in (1, 2)}
    two = run(1, 1, 0.0, 2.0, key="k") + run(2, 1, 1.0, 3.0, key="k")
    assert kinds(check(two, rows, [])) == []
    three = two + run(3, 1, 1.5, 1.7, key="k")
    assert kinds(check(three, {**rows, 3: row(limit=2)}, [])) == [KEY_LIMIT]


@pytest.mark.django_db
def test_the_sampler_reads_the_waiting_and_running_unique_jobs():
    Job.objects.create(name="test.chaos.unique", unique_key="u", unique_while="queued")
    Job.objects.create(name="test.chaos.unique", unique_key="u", state=Job.State.RUNNING)
    Job.objects.create(name="test.chaos.unique")
    sampler = Sampler(threading.Event())
    sampler.sample()
    assert (sampler.samples, sampler.seen) == (1, {})


def test_the_sampler_sees_a_unique_key_with_two_waiting_jobs():
    # The unique index keeps the table from holding two: the rows a broken one would let through.
    queued, started = Job.State.QUEUED, timezone.now()
    sampler = Sampler(threading.Event())
    sampler.look([(1, "u", "queued", queued, None), (3, "v", "queued", queued, started)])
    assert sampler.seen == {}
    sampler.look([(1, "u", "queued", queued, None), (2, "u", "queued", queued, started)])
    (found,) = sampler.seen.values()
    assert found.kind == TWO_WAITING
    assert "job 1 queued" in found.detail and "job 2 queued" in found.detail and "'u'" in found.detail


def test_a_key_of_concurrency_dict_over_its_limit_is_a_violation_each_key_on_its_own():
    rows = {1: row(limits=GATED), 3: row(limits=Limits(concurrency=(("gpu", 2),)))}
    two = run(1, 1, 0.0, 2.0) + run(3, 1, 1.0, 3.0)
    assert kinds(check(two, rows, [])) == []  # two on "gpu", one on "tenant"
    rows[2] = row(limits=GATED)
    three = two + run(2, 1, 1.5, 1.7)
    found = check(three, rows, [])
    assert kinds(found) == [KEY_LIMIT, KEY_LIMIT]  # "gpu" ran three, "tenant" two
    assert {v.detail.split(" (")[0] for v in found.violations} == {"key 'gate gpu'", "key 'gate tenant'"}
    # A lapsed lease lets the gate's slot go, as it does the claim's.
    rows[1] = row(limits=GATED, entries=[entry(1, history.LOST)])
    assert kinds(check(three, rows, [])) == []


def test_a_rate_key_with_more_starts_than_its_count_within_its_period_is_a_violation():
    rows = {pk: row(limits=RATED) for pk in (1, 2, 3)}
    spread = run(1, 1, 0.0, 0.1) + run(2, 1, 0.5, 0.6) + run(3, 1, 1.0, 1.1)
    assert kinds(check(spread, rows, [])) == []  # 0.0 and 0.5, then 0.5 and 1.0: two a second
    crowded = run(1, 1, 0.0, 0.1) + run(2, 1, 0.5, 0.6) + run(3, 1, 0.99, 1.1)
    assert kinds(check(crowded, rows, [])) == [RATE_LIMIT]


def test_a_start_its_process_was_stopped_before_excuses_the_window_it_crowds():
    rows = {pk: row(limits=RATED) for pk in (1, 2, 3)}
    crowded = run(1, 1, 0.0, 0.1) + run(2, 1, 0.5, 0.6) + run(3, 1, 0.99, 1.1, pid=7)
    found = check(crowded, rows, [], stops={7: [(0.2, 0.9)]})
    assert kinds(found) == []
    assert found.figures["rate windows over the count: a start delayed by SIGSTOP"] == 1
    assert kinds(check(crowded, rows, [], stops={7: [(-5.0, -2.0)]})) == [RATE_LIMIT]  # long before


def test_on_sqlite_rates_go_by_the_processes_wall_clocks_and_the_true_clock_is_a_figure():
    rows = {pk: row(limits=RATED) for pk in (1, 2, 3)}
    # The third ran on a process whose clock is 5 s ahead: by its clock, the slot had rested.
    skewed = (
        run(1, 1, 0.0, 0.1, wall=100.0) + run(2, 1, 0.5, 0.6, wall=100.5) + run(3, 1, 0.9, 1.0, wall=105.9)
    )
    found = check(skewed, rows, [], by_wall=True)
    assert kinds(found) == []
    assert found.figures["rate windows over the count by the true clock"] == 1
    assert kinds(check(skewed, rows, [])) == [RATE_LIMIT]
