"""A network partition between one ``runjobs`` process and PostgreSQL, through a proxy the test controls.

The proxy cuts the link by no longer forwarding bytes either way while its
sockets stay open: the worker sees silence, not a refused or closed
connection. No TCP timeout can notice that silence here (the proxy's own
kernel acknowledges every byte), so the worker must notice by its clock
alone. When the link heals, the proxy either delivers what it held back
(a partition TCP rode out) or resets the connections that lived through the
cut (one that outlasted the TCP timeouts the README recommends: both ends
have given up on them by then).
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.processes import SHORT_LEASE, Runjobs, wait_for
from tests.support.tcpproxy import Proxy
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job, Worker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("VELLUM_TEST_DB") != "postgresql",
        reason="the partition runs through a TCP proxy in front of the PostgreSQL server",
    ),
]

LEASE = SHORT_LEASE  # the runjobs processes' (tests/support/processes.py)
HANDLER_SECONDS = 8.0


@pytest.fixture
def proxy():
    settings = connection.settings_dict
    proxy = Proxy((settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432)))
    yield proxy
    proxy.close()


def worker_row(process: Runjobs) -> Worker | None:
    return Worker.objects.filter(pid=process.pid).first()


def executions(job: Job) -> list[tuple[int, int]]:
    return sorted(Execution.objects.filter(job_id=job.pk).values_list("attempt", "pid"))


# A finished attempt's log line: its sentence, then its fields.
FINISHED = re.compile(r" #\d+ .* job_id=(\d+) name=(\S+) outcome=(\S+) duration=([\d.]+)s")


@pytest.mark.parametrize("reset", [False, True], ids=["held-bytes-delivered", "connections-reset"])
def test_a_worker_cut_off_from_the_database_stops_and_rejoins_and_its_late_outcomes_change_nothing(
    proxy, reset
):
    # Through the proxy, its log at INFO, failed attempts retried at once. The partition heals
    # before its calls have waited MAX_DATABASE_WAIT (a longer one makes it exit: test_silent_link).
    cut_off = Runjobs(
        "--workers",
        "2",
        env={
            "PGHOST": "127.0.0.1",
            "PGPORT": str(proxy.port),
            "VELLUM_LOG_LEVEL": "INFO",
            "VELLUM_TEST_BACKOFF": "0s",
            "VELLUM_TEST_MAX_DATABASE_WAIT": "10m",
        },
    )
    other: Runjobs | None = None
    try:
        held = jobs.polite.enqueue_many([(HANDLER_SECONDS,), (HANDLER_SECONDS,)])
        wait_for(
            lambda: all(executions(job) == [(1, cut_off.pid)] for job in held),
            what="both jobs running on the worker behind the proxy",
        )
        # Its heartbeat has a connection open (a beat renewed the leases): the cut leaves a beat hanging.
        claimed = dict(Job.objects.filter(pk__in=[j.pk for j in held]).values_list("pk", "lease_expires_at"))
        wait_for(
            lambda: all(Job.objects.get(pk=pk).lease_expires_at > lease for pk, lease in claimed.items()),
            what="a renewal",
        )
        proxy.cut()
        cut_at = time.monotonic()
        # A second worker, on a direct connection, takes the jobs over once their leases lapse.
        other = Runjobs("--workers", "4", env={"VELLUM_LOG_LEVEL": "INFO"})

        # Cut off, the worker notices by itself within a lease, and asks its handlers to stop.
        noticed = "leases about to lapse, not claiming and asking running jobs to stop"
        wait_for(lambda: noticed in cut_off.output()[1], what="the cut-off worker to notice")
        # By its own clock, before its leases lapse (a loaded machine may print the line later).
        (renewed_ago,) = re.findall(rf"{noticed}.* renewed_ago=([\d.]+)s", cut_off.output()[1])
        assert float(renewed_ago) < LEASE

        others = wait_for(lambda: worker_row(other), what="the other worker's row")
        elsewhere = jobs.record.enqueue_many([(i,) for i in range(4)])
        wait_for(
            lambda: all(executions(job) == [(1, cut_off.pid), (2, other.pid)] for job in held),
            what="the other worker running the cut-off worker's jobs",
        )
        wait_for(
            lambda: Job.objects.filter(pk__in=[j.pk for j in elsewhere], state="done").count() == 4,
            what="the other worker's own jobs",
        )
        # The partition lasts longer than a lease, however fast the other worker was.
        time.sleep(max(0.0, cut_at + LEASE + 0.5 - time.monotonic()))
        healed_at = timezone.now()
        proxy.heal(reset=reset)

        # It rejoins: a beat renews, trouble clears in its row, and its late outcomes were refused.
        def rejoined() -> bool:
            row = worker_row(cut_off)
            fresh = row is not None and row.last_heartbeat > healed_at and row.trouble == ""
            return fresh and "claiming resumes" in cut_off.output()[1]

        wait_for(rejoined, what="the cut-off worker to rejoin")
        late = {int(m[0]): m for m in FINISHED.findall(wait_for(lambda: finished_lines(cut_off, 2)))}
        assert sorted(late) == sorted(job.pk for job in held)
        for _, name, outcome, _ in late.values():
            # Its outcome refused by the fence...
            assert (name, outcome) == ("test.polite", "discarded")
        # ...and not recorded done: its handler, told its lease was lost, returned early and noted
        # why, in a write that waited for the link to heal (so its duration says nothing), or that
        # failed when the link came back reset.
        log = cut_off.output()[1]
        for job in held:
            line = rf"stale outcome discarded, .* job_id={job.pk} name=test\.polite attempt=1 outcome=(.*)"
            (label,) = re.findall(line, log)
            note = Execution.objects.get(job_id=job.pk, attempt=1).note
            if reset:
                assert (label, note) == ("retry in 0.0s", "")
            else:
                assert (label, note) == ("lease lost, queued again", "stopped: lease lost")

        wait_for(
            lambda: Job.objects.filter(pk__in=[j.pk for j in held], state="done").count() == 2,
            what="the jobs done by the other worker",
        )
        other.signal(signal.SIGTERM)
        assert other.wait() == 0

        # The cut-off worker claims again.
        after = jobs.record.enqueue_many([("after",), ("after",)])
        wait_for(
            lambda: Job.objects.filter(pk__in=[j.pk for j in after], state="done").count() == 2,
            what="the rejoined worker running new jobs",
        )
        assert {pid for job in after for _, pid in executions(job)} == {cut_off.pid}
        cut_off.signal(signal.SIGTERM)
        assert cut_off.wait() == 0
    finally:
        cut_off.stop()
        print("cut-off worker:", cut_off.output()[1][-20000:], sep="\n")  # shown if the test fails
        if other is not None:
            other.stop()
            print("other worker:", other.output()[1][-3000:], sep="\n")

    # Each job has one outcome, the one of the worker that held it last; only
    # the jobs whose lease lapsed ran twice.
    for job in Job.objects.filter(pk__in=[j.pk for j in held]):
        assert (job.state, job.result, job.attempts, job.worker_id) == ("done", "finished", 2, others.id)
    for job in elsewhere:
        assert len(executions(job)) == 1
        assert Job.objects.get(pk=job.pk).attempts == 1


def finished_lines(process: Runjobs, count: int) -> str:
    """The process's log once it holds ``count`` "job finished" lines."""
    log = process.output()[1]
    return log if len(FINISHED.findall(log)) >= count else ""
