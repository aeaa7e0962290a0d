"""``manage.py prunejobs``: its options, its output and its errors."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.testapp import jobs as testjobs
from vellum_jobs import chain
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency, Workflow
from vellum_jobs.execution.inline import run_due

pytestmark = pytest.mark.django_db


def finished(state: str, ago: timedelta, name: str = "test.add") -> Job:
    now = timezone.now()
    return Job.objects.create(name=name, state=state, finished_at=now - ago, run_after=now - ago)


def prunejobs(*args: str, **options) -> str:
    out = StringIO()
    call_command("prunejobs", *args, stdout=out, **options)
    return out.getvalue()


def left() -> set[int]:
    return set(Job.objects.values_list("pk", flat=True))


OLD, NEW = timedelta(days=8), timedelta(days=6)


def test_deletes_finished_jobs_older_than_the_age_and_says_how_many():
    old = [finished(state, OLD).pk for state in ("done", "done", "failed", "cancelled")]
    recent = [finished(state, NEW).pk for state in ("done", "failed", "cancelled")]
    out = prunejobs("--older-than", "7d")
    assert out == "Deleted 4 jobs that finished more than 7d ago (done 2, failed 1, cancelled 1).\n"
    assert left() == set(recent)
    assert not left() & set(old)


def test_never_touches_queued_or_running_jobs_whatever_their_finished_at():
    # A retried job can carry an old finished_at until the worker writes a new one.
    queued = finished(Job.State.QUEUED, OLD)
    running = finished(Job.State.RUNNING, OLD)
    never_finished = Job.objects.create(name="test.add", state=Job.State.DONE, finished_at=None)
    assert "Deleted 0 jobs" in prunejobs("--older-than", "0s")
    assert left() == {queued.pk, running.pk, never_finished.pk}


def test_state_limits_pruning_to_that_state_and_repeats():
    done, _, cancelled = (finished(s, OLD) for s in ("done", "failed", "cancelled"))
    assert prunejobs("--older-than", "7d", "--state", "failed") == (
        "Deleted 1 job that finished more than 7d ago (failed 1).\n"
    )
    assert left() == {done.pk, cancelled.pk}
    out = prunejobs("--older-than", "7d", "--state", "cancelled", "--state", "done", "--state", "done")
    assert out == "Deleted 2 jobs that finished more than 7d ago (done 1, cancelled 1).\n"
    assert left() == set()


def test_a_workflow_goes_whole_once_all_its_jobs_ended_long_ago_and_only_with_all_its_states():
    finished_flow = chain(testjobs.add.s(1, 1), testjobs.fail_now.s()).enqueue()
    running_flow = chain(testjobs.add.s(2, 2), testjobs.double.s()).enqueue()
    run_due()
    Job.objects.filter(workflow=running_flow, name="wf.double").update(state=Job.State.RUNNING)
    Job.objects.update(finished_at=timezone.now() - OLD)
    Workflow.objects.update(created_at=timezone.now() - OLD)
    assert [j.state for j in finished_flow.steps()] == ["done", "failed"]
    kept = set(running_flow.steps().values_list("pk", flat=True))
    assert "Deleted 0 jobs" in prunejobs("--older-than", "7d", "--state", "failed")  # it has a done job
    out = prunejobs("--older-than", "7d")
    assert out == "Deleted 2 jobs that finished more than 7d ago (done 1, failed 1, cancelled 0).\n"
    assert left() == kept
    assert list(Workflow.objects.values_list("pk", flat=True)) == [running_flow.pk]
    assert set(Dependency.objects.values_list("job__workflow", flat=True)) == {running_flow.pk}


def test_dry_run_counts_and_deletes_nothing():
    jobs = {finished("done", OLD).pk, finished("failed", OLD).pk, finished("failed", NEW).pk}
    out = prunejobs("--older-than", "7d", "--dry-run")
    assert out == "Would delete 2 jobs that finished more than 7d ago (done 1, failed 1, cancelled 0).\n"
    assert left() == jobs


@pytest.mark.parametrize(
    ("given", "seconds", "shown"),
    [
        ("90s", 90, "90s"),
        ("15m", 900, "15m"),
        ("12h", 43200, "12h"),
        ("7d", 604800, "7d"),
        ("3600", 3600, "1h"),
        ("1.5h", 5400, "90m"),
    ],
)
def test_durations_in_seconds_or_with_a_unit(given, seconds, shown):
    older = finished("done", timedelta(seconds=seconds + 30))
    younger = finished("done", timedelta(seconds=seconds - 30))
    assert prunejobs("--older-than", given) == (
        f"Deleted 1 job that finished more than {shown} ago (done 1, failed 0, cancelled 0).\n"
    )
    assert left() == {younger.pk}
    assert older.pk not in left()


def test_verbosity_0_prints_nothing():
    finished("done", OLD)
    assert prunejobs("--older-than", "7d", verbosity=0) == ""
    assert left() == set()


def test_database_option_names_the_alias():
    finished("done", OLD)
    assert "Deleted 1 job" in prunejobs("--older-than", "7d", "--database", "default")


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        ((), {}, "the following arguments are required: --older-than"),
        (("--older-than", "7 days"), {}, r"--older-than '7 days' is not a duration: use seconds .* \"7d\""),
        (("--older-than", "7w"), {}, "'7w' is not a duration"),
        (("--older-than=-5s",), {}, "'-5s' is not a duration"),
        ((), {"older_than": -5}, "-5 is not a duration: it is negative"),
        (("--older-than", "99999999d"), {}, "'99999999d' is not a duration: it is longer than 100 years"),
        (("--older-than", "7d", "--state", "running"), {},
         r"--state .running. cannot be pruned: use done, failed, cancelled \(queued and running jobs are"),
        (("--older-than", "7d", "--state", "queued"), {}, "never pruned"),
        (("--older-than", "7d", "--state", "finished"), {}, "--state 'finished' cannot be pruned: use done"),
        (("--older-than", "7d", "--database", "nope"), {}, "--database 'nope' is not in DATABASES"),
    ],
)  # fmt: skip
def test_bad_options_are_command_errors_that_say_what_is_accepted(args, options, message):
    kept = finished("done", OLD)
    with pytest.raises(CommandError, match=message):
        prunejobs(*args, **options)
    assert left() == {kept.pk}
