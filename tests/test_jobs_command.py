"""``manage.py jobs``: listing, showing, retrying and cancelling jobs from the command line."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.testapp import jobs
from vellum_jobs.core.models import Job
from vellum_jobs.management.commands.jobs import Command

pytestmark = pytest.mark.django_db

TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError: bad address\n'


class Terminal(io.StringIO):
    """An operator at a terminal, who types ``answer``."""

    def isatty(self) -> bool:
        return True


def run(*args: str, stdin: io.StringIO | None = None) -> str:
    out = io.StringIO()
    call_command("jobs", *args, stdout=out, stdin=stdin or io.StringIO())
    return out.getvalue()


def failed(job: Job, error: str = TRACEBACK) -> Job:
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.FAILED, error=error, attempts=job.max_attempts, finished_at=timezone.now()
    )
    return Job.objects.get(pk=job.pk)


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def test_every_subcommand_has_a_help_line_that_jobs_help_lists():
    text = Command().create_parser("manage.py", "jobs").format_help()
    for sub in ("list", "show", "retry", "cancel", "pause", "resume", "queues", "explain"):
        (line,) = [line for line in text.splitlines() if line.strip().startswith(f"{sub} ")]
        assert len(line.split()) > 3, line


def test_list_shows_the_newest_jobs_first_with_their_state_attempts_time_and_error_headline():
    sent = jobs.add.enqueue(1, 2)
    broken = failed(jobs.boom.using(queue="mail").enqueue())
    later = jobs.add.using(delay=600).enqueue(3, 4)
    lines = run("list").splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "QUEUE", "ATTEMPTS", "DUE", "/", "FINISHED", "ERROR"]
    assert [int(line.split()[0]) for line in lines[1:]] == [later.pk, broken.pk, sent.pk]
    row = lines[2].split()
    assert row[1:5] == ["test.boom", "failed", "mail", f"{broken.max_attempts}/{broken.max_attempts}"]
    assert row[5] == "failed"
    # The traceback's exception line, not its first line.
    assert lines[2].endswith("ValueError: bad address")
    assert lines[1].split()[5] == "due"


def test_list_filters_by_state_name_and_queue_as_the_admin_does():
    a = failed(jobs.boom.using(queue="mail").enqueue())
    b = failed(jobs.boom.enqueue())
    c = jobs.add.using(queue="mail").enqueue(1, 1)

    def ids(*args: str) -> list[int]:
        return [row["id"] for row in json.loads(run("list", "--json", *args))]

    assert ids("--state", "failed") == [b.pk, a.pk]
    assert ids("--queue", "mail") == [c.pk, a.pk]
    assert ids("--state", "failed", "--queue", "mail") == [a.pk]
    assert ids("--name", "test.add", "--name", "test.boom", "--state", "queued") == [c.pk]
    assert ids("--name", "nothing.here") == []
    assert run("list", "--name", "nothing.here") == "No job matches (name nothing.here).\n"


def test_list_shows_a_bounded_number_of_rows_and_says_when_more_match():
    made = jobs.add.enqueue_many([(i, i) for i in range(5)])
    out = run("list", "--limit", "3").splitlines()
    assert [int(line.split()[0]) for line in out[1:4]] == [job.pk for job in made[:1:-1]]
    assert out[4] == "Showing the newest 3; more jobs match (raise --limit to see them)."
    assert "more jobs match" not in run("list", "--limit", "5")
    with pytest.raises(CommandError, match="--limit must be at least 1"):
        run("list", "--limit", "0")


def test_list_json_gives_each_job_its_fields():
    job = failed(jobs.boom.enqueue(), error="SMTPRecipientsRefused: nobody\nmore detail")
    (row,) = json.loads(run("list", "--json"))
    assert row["id"] == job.pk and row["name"] == "test.boom" and row["state"] == "failed"
    assert row["attempts"] == row["max_attempts"] == job.max_attempts
    assert row["error"] == "SMTPRecipientsRefused: nobody"
    assert row["finished_at"] == job.finished_at.isoformat()


def test_show_prints_state_error_attempts_reasons_and_result():
    broken = failed(jobs.boom.enqueue())
    later = jobs.add.using(delay=600).enqueue(3, 4)
    done = jobs.add.enqueue(1, 1)
    Job.objects.filter(pk=done.pk).update(state=Job.State.DONE, result={"sum": 2}, finished_at=timezone.now())
    out = run("show", str(broken.pk), str(later.pk), str(done.pk))
    first, second, third = out.split("\n\n")
    assert first.splitlines()[:2] == [
        f"Job #{broken.pk} test.boom: failed",
        "  error:     ValueError: bad address",
    ]
    assert f"  attempts:  {broken.max_attempts} of {broken.max_attempts}" in first
    assert "Error:\n  Traceback (most recent call last):" in first
    assert second.startswith(f"Job #{later.pk} test.add: queued")
    assert "Why:\n  - due in " in second
    assert 'Result:\n  {\n    "sum": 2\n  }' in third
    with pytest.raises(CommandError, match="no job with id 999999"):
        run("show", "999999")


def test_retry_by_id_requeues_failed_jobs_and_says_why_it_skips_others():
    broken, fine = failed(jobs.boom.enqueue()), jobs.add.enqueue(1, 1)
    out = run("retry", str(broken.pk), str(fine.pk)).splitlines()
    assert out == [
        f"Retried job #{broken.pk} test.boom: queued again, due now.",
        f"Job #{fine.pk} is queued: only failed or cancelled jobs are retried.",
    ]
    job = Job.objects.get(pk=broken.pk)
    assert (job.state, job.attempts) == (Job.State.QUEUED, 0)


def test_acting_by_filter_without_a_terminal_is_refused_unless_told_yes():
    a, b = failed(jobs.boom.enqueue()), failed(jobs.boom.using(queue="mail").enqueue())
    with pytest.raises(CommandError, match="no terminal to ask on; add --yes"):
        run("retry", "--state", "failed")
    assert (state(a), state(b)) == ("failed", "failed")
    out = run("retry", "--state", "failed", "--queue", "mail", "--yes").splitlines()
    assert out == ["1 job to retry (state failed, queue mail).", "Retried 1 job: queued again, due now."]
    assert (state(a), state(b)) == ("failed", "queued")
    assert (
        run("retry", "--state", "failed", "--no-input").splitlines()[-1]
        == "Retried 1 job: queued again, due now."
    )
    assert state(a) == "queued"


def test_acting_by_filter_at_a_terminal_asks_first():
    queued = jobs.add.enqueue_many([(i, i) for i in range(3)])
    other = jobs.add.using(queue="mail").enqueue(1, 1)
    out = run("cancel", "--queue", "default", stdin=Terminal("n\n"))
    assert out == "3 jobs to cancel (queue default).\nCancel them? [y/N] Nothing changed.\n"
    assert {state(job) for job in queued} == {"queued"}
    out = run("cancel", "--queue", "default", stdin=Terminal("y\n"))
    assert out.endswith("Cancel them? [y/N] Cancelled 3 jobs.\n")
    assert {state(job) for job in queued} == {"cancelled"} and state(other) == "queued"


def test_cancel_by_filter_asks_running_jobs_to_stop_and_counts_only_jobs_it_can_change():
    queued, running = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2)
    done = jobs.add.enqueue(3, 3)
    Job.objects.filter(pk=running.pk).update(state=Job.State.RUNNING, started_at=timezone.now())
    Job.objects.filter(pk=done.pk).update(state=Job.State.DONE, finished_at=timezone.now())
    out = run("cancel", "--name", "test.add", "--yes").splitlines()
    assert out == [
        "2 jobs to cancel (name test.add).",
        "Cancelled 1 job.",
        "Asked 1 running job to stop: its handler sees should_stop() within a heartbeat.",
    ]
    assert state(queued) == "cancelled" and state(done) == "done"
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    out = run("cancel", "--name", "test.add", "--yes")
    assert out == (
        "No job to cancel (name test.add): none of the 3 matching jobs is queued,"
        " or running and not asked to stop yet.\n"
    )


def test_retry_and_cancel_want_ids_or_filters_but_not_both():
    job = jobs.add.enqueue(1, 1)
    with pytest.raises(CommandError, match="give job ids, or filters"):
        run("retry")
    with pytest.raises(CommandError, match=r"give job ids or filters .*, not both"):
        run("cancel", str(job.pk), "--state", "queued")
    assert state(job) == "queued"


def test_a_delayed_job_is_listed_with_its_due_time():
    job = jobs.add.using(delay=timedelta(hours=1)).enqueue(1, 1)
    due = timezone.localtime(job.run_after).strftime("%Y-%m-%d %H:%M:%S")
    (row,) = run("list").splitlines()[1:]
    assert f"due {due}" in row
