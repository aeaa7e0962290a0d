"""Running jobs in the calling thread: due jobs on demand, or each job as it is enqueued.

No worker process and no commit: the claim and the outcome are the same
statements a worker runs, made on the caller's connection, so they see (and
stay inside) the caller's transaction, such as a Django ``TestCase``'s.
``vellum_jobs.testing`` is the public face of this module.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections, router

from vellum_jobs.conf import conf
from vellum_jobs.core import clock, transitions
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution.handler_run import run
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.execution.outcome_writes import record_many
from vellum_jobs.store import limit_gate
from vellum_jobs.store.claim import ClaimRequest, claim

# Set by run_inline(); None leaves it to VELLUM_JOBS["RUN_INLINE"].
_inline: ContextVar[bool | None] = ContextVar("vellum_jobs_run_inline", default=None)

# More jobs than this in one run_due() call is a job that keeps enqueueing itself.
RUN_LIMIT = 1000


def enabled() -> bool:
    """Whether enqueued jobs run at once, in the enqueueing thread."""
    override = _inline.get()
    return conf.run_inline if override is None else override


@contextmanager
def run_inline(enabled: bool = True) -> Iterator[None]:
    """Within the block, each job runs as soon as it is enqueued (or, with False, does not)."""
    token = _inline.set(enabled)
    try:
        yield
    finally:
        _inline.reset(token)


def run_due(
    *, queues: Sequence[str] = (), now: datetime | None = None, using: str | None = None
) -> list[Job]:
    """Run due jobs one at a time until none is left, jobs they enqueue included; returns them in order.

    ``now`` (default: the current time) decides which jobs are due, so a test
    can run delayed jobs without waiting. A failed attempt is recorded as a
    worker records it: queued again after its backoff, or failed.
    """
    alias = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
    worker_id = uuid.uuid4()
    ran: list[Job] = []
    while True:
        at = now or clock.of(alias)
        request = ClaimRequest(
            worker_id=worker_id,
            limit=1,
            now=at,
            lease_until=at + timedelta(seconds=conf.lease),
            queues=tuple(queues),
        )
        claimed = claim(connections[alias], request)
        if not claimed:
            return ran
        if len(ran) >= RUN_LIMIT:
            raise RuntimeError(
                f"ran {RUN_LIMIT} jobs and more are due: does a job keep enqueueing "
                f"itself? (next: {claimed[0].name!r} #{claimed[0].pk})"
            )
        # Limits are judged at the run's own time too, so held jobs come due.
        with limit_gate.judged_at(now):
            execute(claimed[0], worker_id)
        ran.append(claimed[0])


def run_now(jobs: Sequence[Job]) -> None:
    """Run each of these just-enqueued jobs at once, due or not (the inline mode)."""
    worker_id = uuid.uuid4()
    for job in jobs:
        if _take(job, worker_id):
            execute(job, worker_id)


def execute(job: Job, worker_id: uuid.UUID) -> Outcome:
    """Run ``job``'s handler, then record the outcome if this claim still holds the job."""
    attempt = Attempt(job, worker_id)
    outcome = run(attempt)
    record_many(job._state.db or "default", [(attempt, outcome)])
    return outcome


def _take(job: Job, worker_id: uuid.UUID) -> bool:
    """Claim this one job, as the claim would: running, attempts and claims + 1, a lease."""
    now = clock.of(job._state.db or DEFAULT_DB_ALIAS)
    changes = transitions.claimed(worker_id, now, now + timedelta(seconds=conf.lease))
    rows = Job.objects.using(job._state.db).filter(state=transitions.QUEUED, pk=job.pk)
    if not rows.update(**transitions.orm(changes)):
        return False
    transitions.apply(
        job, {name: value for name, value in changes.items() if name not in ("attempts", "claims")}
    )
    # The counters as the row has them: the instance may not know the claims before this one.
    job.refresh_from_db(fields=["attempts", "claims"])
    return True
