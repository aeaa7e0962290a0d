"""Why a queued or waiting job has not started: the answers of ``Job.explain()`` and the admin's column.

Each answer is a ``Reason`` with a stable ``code`` and a sentence. For a page
of jobs the facts they rest on (paused queues, live workers, running jobs of
each concurrency key, the upstream jobs the waiting ones wait for) are read
once, not once per job.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.utils import timezone

from vellum_jobs.conf import conf, describe_duration
from vellum_jobs.core import clock, transitions
from vellum_jobs.core.models import KEYED, Job, Queue, UnknownName, Worker
from vellum_jobs.observe import dependencies, limit_reasons


@dataclasses.dataclass(frozen=True)
class Reason:
    """One answer: ``code`` is for programs, ``text`` (also ``str()``) for people.

    Codes of a queued job: ``delayed``, ``backoff``, ``paused``, ``no_worker``,
    ``no_loop``, ``no_handler``, ``limit_held``, ``limit_full``, ``key_full``, ``key_behind``,
    ``ready``, and after them ``limit_room`` (``limit_reasons``); of a waiting
    job: ``upstream`` (upstream jobs not ended yet) or ``release_due`` (they all have);
    of any other job, its state.
    """

    code: str
    text: str
    # The jobs it names: those holding a concurrency key, the upstream jobs waited for.
    job_ids: tuple[int, ...] = ()

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass
class _Facts:
    now: datetime
    paused: dict[str, Queue]
    workers: list[Worker]
    running: dict[str, list[int]]
    jobs: Sequence[Job]
    first_due: dict[str, list[tuple[int, int, datetime]]] = dataclasses.field(default_factory=dict)
    # How long no live worker has known each name (``UnknownName``); read when a job needs it.
    unknown_for: dict[str, float] | None = None
    # The upstream jobs each waiting job still waits for.
    waiting_for: dict[int, dependencies.WaitingFor] = dataclasses.field(default_factory=dict)
    # The queued jobs' rate and concurrency limits as they stand, and the holds on their keys.
    limits: limit_reasons.LimitFacts = dataclasses.field(
        default_factory=lambda: limit_reasons.LimitFacts({}, {}, {})
    )


def explain(jobs: Sequence[Job], now: datetime | None = None) -> dict[int, list[Reason]]:
    """The reasons for each of ``jobs``, by id, most telling first (never empty)."""
    if not jobs:
        return {}
    facts = _facts(jobs, now or clock.of(jobs[0]._state.db or "default"))
    return {job.pk: _reasons(job, facts) for job in jobs}


def _facts(jobs: Sequence[Job], now: datetime) -> _Facts:
    alias = jobs[0]._state.db or "default"
    queued = [job for job in jobs if job.state == Job.State.QUEUED]
    queues = {job.queue for job in queued}
    keys = {job.concurrency_key for job in queued if job.concurrency_key}
    paused = {}
    if queues:
        rows = Queue.objects.using(alias).filter(name__in=queues).exclude(paused_at=None)
        paused = {queue.name: queue for queue in rows}
    workers = []
    if queued:
        since = now - timedelta(seconds=conf.lease)
        alive = Worker.objects.using(alias).filter(last_heartbeat__gte=since)
        workers = list(alive.only("queues", "names", "async_workers", "task_backends", "unknown_tasks"))
    running: dict[str, list[int]] = defaultdict(list)
    if keys:
        holders = Job.objects.using(alias).running().filter(KEYED, concurrency_key__in=keys).order_by("pk")
        for key, pk in holders.values_list("concurrency_key", "pk"):
            running[str(key)].append(pk)
    return _Facts(
        now,
        paused,
        workers,
        running,
        jobs,
        waiting_for=dependencies.waiting_for(jobs),
        limits=limit_reasons.read(jobs, now),
    )


def _reasons(job: Job, facts: _Facts) -> list[Reason]:
    if job.state == Job.State.RUNNING and (reason := _prefetched(job)) is not None:
        return [reason]
    if job.state == Job.State.WAITING:
        return [_upstream(job, facts)]
    if job.state != Job.State.QUEUED:
        return [_not_waiting(job)]
    limit = _limits(job, facts)
    room = limit is not None and limit.code == "limit_room"
    reasons = [
        reason
        for reason in (
            _later(job, facts),
            _paused(job, facts),
            _served(job, facts),
            None if room else limit,
            _key(job, facts),
        )
        if reason is not None
    ]
    if not reasons:
        reasons = [_ready(job)]
    return [*reasons, limit] if room and limit is not None else reasons


def _ready(job: Job) -> Reason:
    if job.is_async:
        return Reason("ready", "due now: waiting for a free place on a worker's event loop")
    return Reason("ready", "due now: waiting for a free worker thread to claim it")


def _limits(job: Job, facts: _Facts) -> Reason | None:
    """Its rate and concurrency limits and the holds on their keys (``limit_reasons``)."""
    found = limit_reasons.reason(job, facts.limits, facts.now, _when, _in_words)
    return None if found is None else Reason(*found)


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "?"
    return (
        timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") if timezone.is_aware(moment) else str(moment)
    )


def _not_waiting(job: Job) -> Reason:
    if job.state == Job.State.RUNNING:
        attempt = f"attempt {job.attempts} of {job.max_attempts}"
        text = f"not waiting: running since {_when(job.started_at)} ({attempt})"
        if job.cancel_requested_at is not None:
            text += f"; cancellation requested at {_when(job.cancel_requested_at)}"
        return Reason(str(job.state), text)
    if _cancelled_upstream(job):
        why = job.error.removeprefix(transitions.UPSTREAM_REASON).strip()
        return Reason(
            str(job.state),
            f"not waiting: cancelled at {_when(job.finished_at)} before it ran, because of its upstream "
            f"jobs: {why}; retrying them makes it wait again",
            tuple(int(pk) for pk in re.findall(r"#(\d+)", why)),
        )
    return Reason(str(job.state), f"not waiting: {job.state} at {_when(job.finished_at)}")


def _cancelled_upstream(job: Job) -> bool:
    """Whether ``job`` was cancelled because of how its upstream jobs ended (its error says so)."""
    if job.state != Job.State.CANCELLED or "error" in job.get_deferred_fields():
        return False
    return job.error.startswith(transitions.UPSTREAM_REASON)


def _upstream(job: Job, facts: _Facts) -> Reason:
    """A waiting job: the upstream jobs it waits for, or that its release is due."""
    found = facts.waiting_for.get(job.pk)
    if found is not None:
        return Reason("upstream", f"waiting for {found.text}", found.ids)
    return Reason(
        "release_due",
        "its upstream jobs have all ended: it is queued or cancelled (as its run_if says) at once, "
        "or by a worker's release duty within a heartbeat",
    )


def _prefetched(job: Job) -> Reason | None:
    """A running job its worker claimed ahead and had not started at its last heartbeat."""
    if job.worker_id is None:
        return None
    rows = Worker.objects.using(job._state.db or "default").filter(pk=job.worker_id)
    found = rows.only("host", "pid", "prefetched", "last_heartbeat").first()
    if found is None or job.pk not in (found.prefetched or []):
        return None
    return Reason(
        "prefetched",
        f"claimed ahead by worker {found}, waiting for one of its threads (as of its heartbeat at "
        f"{_when(found.last_heartbeat)}); a job waits so at most 0.5 s before it goes back to the queue",
    )


def _later(job: Job, facts: _Facts) -> Reason | None:
    if job.run_after <= facts.now or job.pk in facts.limits.held_by:
        return None  # due, or held back by its limits until its next slot: ``_limits`` says so
    seconds = (job.run_after - facts.now).total_seconds()
    # A failed attempt leaves its error; a Retry() leaves none and refunds the attempt.
    # (The admin's list defers the error column: there the attempt count decides.)
    error = "" if "error" in job.get_deferred_fields() else job.error.strip()
    if job.attempts and (error or "error" in job.get_deferred_fields()):
        # The last line of a traceback names the exception.
        cause = f": {error.splitlines()[-1][:200]}" if error else ""
        return Reason(
            "backoff",
            f"retry backoff until {_when(job.run_after)} (in {_in_words(seconds)}) after failed attempt "
            f"{job.attempts} of {job.max_attempts}{cause}",
        )
    return Reason("delayed", f"due in {_in_words(seconds)} (at {_when(job.run_after)})")


def _in_words(seconds: float) -> str:
    """A wait as a person says it: "40 s", "53 min", "2 h 5 min", "3 d 4 h"."""
    whole = round(seconds)
    if whole < 60:
        return f"{max(whole, 1)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _paused(job: Job, facts: _Facts) -> Reason | None:
    queue = facts.paused.get(job.queue)
    if queue is None:
        return None
    by = f" by {queue.paused_by}" if queue.paused_by else ""
    return Reason("paused", f"its queue {job.queue!r} is paused (since {_when(queue.paused_at)}{by})")


def _serves(worker: Worker, queue: str) -> bool:
    return not worker.queues or queue in worker.queues


def _served(job: Job, facts: _Facts) -> Reason | None:
    if not facts.workers:
        return Reason("no_worker", "no live worker: no runjobs process has sent a heartbeat lately")
    serving = [worker for worker in facts.workers if _serves(worker, job.queue)]
    if not serving:
        served = sorted({queue for worker in facts.workers for queue in worker.queues})
        return Reason(
            "no_worker", f"no live worker serves its queue {job.queue!r} (they serve {', '.join(served)})"
        )
    if job.is_async and not any(worker.async_workers for worker in serving):
        return Reason(
            "no_loop",
            f"no live worker serving queue {job.queue!r} runs coroutine jobs (async def): each has "
            "--async-workers 0, or no async def job registered",
        )
    if any(worker.knows(job.name, job.task_backend) for worker in serving):
        return None
    what = f"the Django task {job.name!r}" if job.task_backend else f"{job.name!r} registered"
    text = (
        f"no live worker serving queue {job.queue!r} has {what} "
        "(is the code that defines it deployed to the workers?)"
    )
    if not any(worker.knows(job.name, job.task_backend) for worker in facts.workers):
        text += f"; {_fails_at(job, facts)}"
    return Reason("no_handler", text)


def _fails_at(job: Job, facts: _Facts) -> str:
    """When a job whose name no live worker knows is failed, unless a worker that knows it starts
    (and some worker stays alive to count the time: see ``unknown_names``)."""
    if facts.unknown_for is None:
        alias = job._state.db or "default"
        names = {other.name for other in facts.jobs if other.state == Job.State.QUEUED}
        rows = UnknownName.objects.using(alias).filter(name__in=names).values_list("name", "unknown_for")
        facts.unknown_for = dict(rows)
    left = max(0.0, conf.unknown_name_timeout - facts.unknown_for.get(job.name, 0.0))
    moment = max(facts.now + timedelta(seconds=left), job.run_after)
    timeout = describe_duration(conf.unknown_name_timeout)
    return (
        f"no live worker knows {job.name!r}, and unless one that does starts, it fails at about "
        f"{_when(moment)} (once no live worker has known it for UNKNOWN_NAME_TIMEOUT, {timeout})"
    )


def _key(job: Job, facts: _Facts) -> Reason | None:
    if not job.concurrency_key:
        return None
    running = facts.running.get(job.concurrency_key, [])
    if len(running) >= job.concurrency_limit:
        ids = ", ".join(f"#{pk}" for pk in running)
        return Reason(
            "key_full",
            f"its concurrency key {job.concurrency_key!r} is full: {len(running)} of "
            f"{job.concurrency_limit} running ({ids})",
            tuple(running),
        )
    if job.run_after > facts.now:
        return None
    ahead = next((row for row in _first_due(job, facts) if row[0] != job.pk), None)
    if ahead is None or (-ahead[1], ahead[2], ahead[0]) > (-job.priority, job.run_after, job.pk):
        return None
    return Reason(
        "key_behind",
        f"next of its concurrency key {job.concurrency_key!r} is #{ahead[0]}, which starts first",
        (ahead[0],),
    )


def _first_due(job: Job, facts: _Facts) -> list[tuple[int, int, datetime]]:
    """The first two due jobs of ``job``'s key in claim order, outside paused queues.

    Two, so that one of them is not ``job`` itself; read once per key for a page of jobs.
    """
    key = job.concurrency_key
    if key not in facts.first_due:
        alias = job._state.db or "default"
        paused = Queue.objects.using(alias).exclude(paused_at=None).values("name")
        rows = (
            Job.objects.using(alias)
            .due(facts.now)
            .filter(KEYED, concurrency_key=key)
            .exclude(queue__in=paused)
            .order_by("-priority", "run_after", "pk")
            .values_list("pk", "priority", "run_after")[:2]
        )
        facts.first_due[key] = list(rows)
    return facts.first_due[key]
