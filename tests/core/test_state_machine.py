"""A model of the job lifecycle, checked against the database after every step of random interleavings.

Simulated workers claim jobs, some ahead of a free thread and taken back
unstarted, some of old code that does not know every job's name; their
handlers return, raise, ask to be retried or fail; attempts time out and
their handlers come back late; leases lapse and are recovered; workers shut
down (their handlers stopping early, or still running and handed back for
later) or vanish; a job whose name no live worker knows waits, and is
failed once none has known it for ``UNKNOWN_NAME_TIMEOUT``; jobs with a
unique key keep it through every way back to the queue, or yield to a newer
job that waits with it; code retries, cancels, runs now and prunes. Jobs
wait for others (``after=`` with each ``run_if``, and batches with their
callbacks): the model records on each edge the end its paths would write
(the worker's eager release after an outcome, a cancel, the release duty's
sweep) and releases as the library must.
Hypothesis picks the order. After each step the rows must match the model
and keep the fence's promises: one live claim per running job, no write by a
stale token, finished rows touched only by ``retry()`` and pruning, counters
that only move the way they should, one waiting job per unique key. And for
dependencies: a job is released only once its upstream jobs have ended as its
``run_if`` asks, and never goes back to waiting but by an upstream job's
retry; after the duty's sweep no waiting job could move; a batch releases at
most one callback (one more per retry of its jobs); no edge outlives its jobs.

The library stamps some columns with the wall clock (a retry's
``run_after``, ``finished_at``), so the model's clock runs an hour ahead of
it, plus whatever the test advanced: what the wall clock made due is due for
the model. A lease lapses when recovery's watch, on the model's clock, has
seen it unchanged for a lease: no wall clock decides it.

``make test`` runs forty examples, ``make stress`` a thousand longer
ones (the hypothesis profiles are in ``conftest``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from hypothesis import settings as examples
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from vellum_jobs import Fail, Retry, Throttled, batch, current_job, registry, set_progress
from vellum_jobs.core import clock, dependencies, limit_rules
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.limit_models import CONCURRENCY, RATE, LimitHold, LimitSlot
from vellum_jobs.core.limits import Limits, guard
from vellum_jobs.core.models import Job, UnknownName, Worker
from vellum_jobs.core.transitions import (
    CANCELLED,
    DONE,
    FAILED,
    FINISHED_STATES,
    HELD_BACK_QUEUED,
    QUEUED,
    RUNNING,
    WAITING,
)
from vellum_jobs.core.upstream import COUNTS
from vellum_jobs.core.workflow_models import Dependency, Workflow
from vellum_jobs.execution import cancellation, handler_run, outcome_writes, retry_policy
from vellum_jobs.execution.outcome import Outcome, held_back, unstarted
from vellum_jobs.maintenance import recovery, retention, unknown_names
from vellum_jobs.store import leases, limit_gate
from vellum_jobs.store.claim import ClaimRequest, claim

ALIAS = "default"
WORKERS = 3
LEASE = timedelta(minutes=10)
# How far the model's clock starts ahead of the wall clock.
AHEAD = timedelta(hours=1)
# A Retry's delay, and an enqueue's: far past anything the model's clock reaches.
LATER = timedelta(days=365)
SHUTDOWN = "handed back at shutdown"

# What one attempt's handler does. A job's script names one per claim, in turn.
BEHAVIOURS = ("return", "progress", "polite", "raise", "retry", "retry_later", "fail")
MAX_ATTEMPTS = (1, 2, 3)
# The unique keys jobs may have (most have none).
KEYS = ("k1", "k2")
# How long no live worker may have known a name before its due jobs fail: a minute, so that one
# check after another a minute and a bit later (a gap counts up to two minutes and a lease) does it.
UNKNOWN_NAME_TIMEOUT = timedelta(minutes=1)


def name_for(max_attempts: int) -> str:
    return f"lifecycle.max_attempts_{max_attempts}"


# A batch's callbacks: handed the counts, then they act as their script says.
CALLBACK = "lifecycle.callback"
CALLBACK_ATTEMPTS = 2
RUN_IF = ("done", "finished", "failed")
BAD = (FAILED, CANCELLED)

# Jobs with limits, checked by the gate a thread passes just before it starts one
# (``store.limit_gate``): a rate limit on "api", or concurrency={...} on "gpu" (two at once) and
# on their tenant's key (one at once), or both. A period of a minute, a hold of 100 s: the
# moments the model's clock moves on by (``a_moment_passes``, and the other rules' steps) add up
# to sums far enough from a slot's rest and a hold's end that the wall clock's few seconds within
# an example do not decide them.
LIMITED = "lifecycle.limited"
LIMITED_ATTEMPTS = 2
RATE_KEY, RATE_SPEC = "api", "2/m"
GPU = "gpu"
TENANTS = ("a", "b", "c")
CONCURRENCY_LIMITS = {GPU: 2, "tenant:{tenant}": 1}
LIMIT_KINDS = ("rate", "concurrency", "both")
THROTTLE = timedelta(seconds=100)
MOMENTS = (timedelta(seconds=25), timedelta(seconds=40))

# What a worker of older code knows: every modelled name but the newest kind's.
NEW_KIND = name_for(3)
OLD_NAMES = [name_for(n) for n in MAX_ATTEMPTS if name_for(n) != NEW_KIND] + [CALLBACK, LIMITED]


def behaviour(script: Sequence[str], token: int) -> str:
    return script[(token - 1) % len(script)]


def act(script: list[str]) -> object:
    """The handler of every modelled job: what its script says for this claim."""
    job = current_job()
    assert job is not None
    does = behaviour(script, job.claims)
    if does == "progress":
        set_progress(1, 1, "all of it")
    elif does == "polite" and job.should_stop():
        return "stopped early"
    elif does == "raise":
        raise ValueError(f"claim {job.claims} raises")
    elif does == "retry":
        raise Retry(0)
    elif does == "retry_later":
        raise Retry(LATER)
    elif does == "fail":
        raise Fail(f"claim {job.claims} fails")
    return {"claim": job.claims}


def act_limited(script: list[str], tenant: str, key: str) -> object:
    """A job with limits: "throttle" tells ``key``, its first limit's, to slow down (``Throttled``)."""
    job = current_job()
    assert job is not None
    if behaviour(script, job.claims) == "throttle":
        raise Throttled(key, seconds=THROTTLE, reason="429")
    return act(script)


def act_on_counts(counts: dict[str, int], script: list[str]) -> object:
    """A batch's callback: handed its batch's counts by outcome first."""
    assert counts["total"] == counts["done"] + counts["failed"] + counts["cancelled"] + counts.get("", 0)
    return act(script)


@pytest.fixture
def lifecycle_jobs():
    """The modelled job names, one per max_attempts, and the callback's, registered for the test only."""
    for n in MAX_ATTEMPTS:
        registry.register(name_for(n), act, max_attempts=n, backoff=0, timeout=60)
    registry.register(CALLBACK, act_on_counts, max_attempts=CALLBACK_ATTEMPTS, backoff=0, timeout=60)
    registry.register(LIMITED, act_limited, max_attempts=LIMITED_ATTEMPTS, backoff=0, timeout=60)
    yield
    for n in MAX_ATTEMPTS:
        registry.unregister(name_for(n))
    registry.unregister(CALLBACK)
    registry.unregister(LIMITED)


@dataclasses.dataclass(eq=False)
class Modelled:
    """What the model expects of one job's row."""

    pk: int
    max_attempts: int
    script: tuple[str, ...]
    key: str | None = None
    state: str = QUEUED
    attempts: int = 0
    claims: int = 0
    # When run_after falls: "now" (by the wall clock), "ahead" (by the model's
    # clock, which is ahead of the wall's), "later" (never, for the model).
    due: str = "now"
    worker_id: uuid.UUID | None = None
    lease_until: datetime | None = None
    cancel_requested: bool = False
    # The lease (claim token, end) the heartbeat's watch last saw running, and since when.
    watched: tuple[int, datetime | None] | None = None
    watched_since: timedelta = timedelta(0)
    # Its workflow or batch; the jobs it waits for, in order, and when it runs (after=, run_if).
    workflow: int | None = None
    upstream: tuple[int, ...] = ()
    run_if: str = ""
    # The end each edge records ("" until then): what release reads, as the library's paths write it.
    marks: dict[int, str] = dataclasses.field(default_factory=dict)
    upstream_cancelled: bool = False  # cancelled by release: an upstream job's retry reopens it
    releases: int = 0  # times released (waiting -> queued)
    retried: bool = False  # retry() queued it
    reopens: int = 0  # times reopened (cancelled -> waiting)
    callback: bool = False  # a batch's callback
    # What the gate checks before its handler starts (none for most).
    limits: Limits = dataclasses.field(default_factory=Limits)
    # Its due time when ``due`` is "at": a limit held it back, or its handler was throttled.
    due_at: datetime | None = None

    @property
    def name(self) -> str:
        if self.limits:
            return LIMITED
        return CALLBACK if self.callback else name_for(self.max_attempts)


@dataclasses.dataclass(eq=False)
class Process:
    """A simulated worker process: the attempts its slots hold, and which of them timed out."""

    id: uuid.UUID = dataclasses.field(default_factory=uuid.uuid4)
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    timed_out: set[Attempt] = dataclasses.field(default_factory=set)
    # Attempts of jobs with limits whose thread passed the gate: their handlers run.
    started: set[Attempt] = dataclasses.field(default_factory=set)

    def returnable(self) -> list[Attempt]:
        return [a for a in self.attempts if a not in self.timed_out]

    def unstarted(self) -> list[Attempt]:
        """Attempts the dispatcher may take back, as no thread may have started them yet: a job with
        limits not past the gate, or any other."""
        return [a for a in self.returnable() if a not in self.started]

    def ran(self, attempt: Attempt) -> bool:
        """Whether a thread may have started ``attempt``: past the gate, or a job with no limits."""
        return attempt in self.started or not gated(attempt)

    def gate_next(self) -> list[Attempt]:
        """Attempts of jobs with limits that a thread may start next: the gate decides."""
        return [a for a in self.returnable() if gated(a) and a not in self.started]

    def drop(self, attempt: Attempt) -> None:
        self.attempts.remove(attempt)
        self.timed_out.discard(attempt)
        self.started.discard(attempt)


def gated(attempt: Attempt) -> bool:
    return bool(attempt.job.limits)


def limits_of(attempt: Attempt) -> Limits:
    return Limits.decode(attempt.job.limits)


def past_the_gate(attempt: Attempt) -> Outcome:
    """``handler_run.run`` for an attempt whose thread passed the gate already (``starts``): the
    same path, the job's limits out of its way, as one start must not take two slots."""
    job = attempt.job
    limits, job.limits = job.limits, ""
    try:
        return handler_run.run(attempt)
    finally:
        job.limits = limits


Row = dict[str, Any]
T = TypeVar("T")
PICK = st.integers(min_value=0, max_value=15)
# A job to enqueue: its max_attempts, script, priority, and whether it is delayed.
SCRIPTS = st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=3)
# A job with limits: which, its tenant, and its script (which may throttle).
LIMITED_JOBS = st.tuples(
    st.sampled_from(LIMIT_KINDS),
    st.sampled_from(TENANTS),
    st.lists(st.sampled_from((*BEHAVIOURS, "throttle")), min_size=1, max_size=3),
)
PRIORITIES = st.integers(-1, 1)


def choose(items: Sequence[T], pick: int) -> T:
    return items[pick % len(items)]


COLUMNS = [field.attname for field in Job._meta.concrete_fields]


def rows() -> dict[int, Row]:
    return {row["id"]: row for row in Job.objects.using(ALIAS).values(*COLUMNS)}


def assert_unchanged(before: dict[int, Row], after: dict[int, Row], but: Iterable[int] = ()) -> None:
    """Every row of ``before`` except those in ``but`` is still there, exactly as it was."""
    allowed = set(but)
    for pk, row in before.items():
        if pk not in allowed:
            assert after.get(pk) == row, f"job {pk} changed: {row} -> {after.get(pk)}"


class JobLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Each example starts from empty tables.
        Job.objects.using(ALIAS).all().delete()
        Dependency.objects.using(ALIAS).all().delete()
        Workflow.objects.using(ALIAS).all().delete()
        UnknownName.objects.using(ALIAS).all().delete()
        Worker.objects.using(ALIAS).all().delete()  # one a failed example left
        LimitSlot.objects.using(ALIAS).all().delete()
        LimitHold.objects.using(ALIAS).all().delete()
        self.started = timezone.now()
        self.offset = AHEAD
        # Recovery's watch, on the model's clock: a lease lapses once seen unchanged for LEASE.
        self.watch = recovery.LapseWatch(
            clock=lambda: self.offset.total_seconds(), lease=LEASE.total_seconds()
        )
        self.jobs: dict[int, Modelled] = {}
        self.processes = [Process() for _ in range(WORKERS)]
        self.gone: set[uuid.UUID] = set()  # ids of processes that shut down or vanished
        self.let_go: set[tuple[int, int]] = (
            set()
        )  # (job, token) claims dropped unstarted, left to their lease
        self.previous: dict[int, Row] = {}  # the rows after the last step
        self.reopened: set[int] = set()  # finished rows this step may change: retried or pruned
        self.released_now: set[int] = set()  # jobs this step released
        self.waiting_again: set[int] = set()  # jobs this step reopened (an upstream job retried)
        self.with_workflow: set[tuple[int, int]] = set()  # (job, token) claimed as a workflow's step
        self.retries_in: Counter[int] = Counter()  # retry() calls that applied, by workflow
        # The limits: every start the gate let through, (job, token, when, keys), by the gate's
        # clock; the rate limits and concurrency limits seen, by key; the holds set, as
        # (key, from, until), and the last one per key.
        self.starts: list[tuple[int, int, datetime, tuple[str, ...]]] = []
        self.rates: dict[str, tuple[int, float]] = {}
        self.concurrency: dict[str, int] = {}
        self.holds: list[tuple[str, datetime, datetime]] = []
        self.held_until: dict[str, datetime] = {}

    def now(self) -> datetime:
        return timezone.now() + self.offset

    @contextlib.contextmanager
    def database_clock(self) -> Iterator[None]:
        """As in a worker whose heartbeat found the database's clock ``offset`` ahead of its own
        (``clock.measure``): the gate, a hold and a handler's outcome go by the model's clock.

        What such a worker stamps "now" (a retry due at once) is due by the
        model's clock, not the wall's: "ahead" for the model."""
        saved = clock._offset, clock._measured_at
        clock._offset, clock._measured_at = self.offset.total_seconds(), time.monotonic()
        try:
            yield
        finally:
            clock._offset, clock._measured_at = saved

    # -- what the model expects ----------------------------------------------

    def live(self, attempt: Attempt) -> bool:
        """Whether ``attempt``'s claim still holds its job (the fence would let it write)."""
        job = self.jobs.get(attempt.job.pk)
        return job is not None and job.state == RUNNING and job.claims == attempt.token

    def outcome_of(self, attempt: Attempt, outcome: Outcome) -> tuple[str, int, str, datetime | None]:
        """(state, change of attempts, due, due time) that a live attempt's handler (or the gate
        before it) leaves its job in."""
        job = self.jobs[attempt.job.pk]
        does = behaviour(job.script, attempt.token)
        if outcome.step == HELD_BACK_QUEUED:  # a limit held it back: its handler did not run
            return QUEUED, -1, "at", outcome.columns["run_after"]
        delivered = attempt.cancel.is_set()
        stopping = attempt.shutdown is not None and attempt.shutdown.is_set()
        outcomes = {
            "return": (DONE, 0, ""),
            "progress": (DONE, 0, ""),
            # It saw the cancellation through should_stop(): cancelled. At a shutdown it stopped
            # early: queued again, its attempt not counted.
            "polite": (CANCELLED, 0, "") if delivered else (QUEUED, -1, "now") if stopping else (DONE, 0, ""),
            "raise": (FAILED, 0, "") if job.attempts >= job.max_attempts else (QUEUED, 0, "now"),
            "retry": (QUEUED, -1, "now"),
            "retry_later": (QUEUED, -1, "later"),
            "fail": (FAILED, 0, ""),
            # Its key held; the job comes back when the hold ends, the attempt not counted.
            "throttle": (QUEUED, -1, "at"),
        }
        state, change, due = outcomes[does]
        if state == QUEUED and job.cancel_requested:
            return CANCELLED, 0, "", None  # a job asked to stop is never queued again
        if due == "now" and job.limits:
            due = "ahead"  # run by the model's clock (``database_clock``)
        return state, change, due, outcome.columns["run_after"] if due == "at" else None

    def waiting_with(self, key: str | None, but: int | None = None) -> Modelled | None:
        """The queued job that holds unique ``key``, if one does (other than job ``but``)."""
        if key is None:
            return None
        held = [job for job in self.jobs.values() if job.key == key and job.state == QUEUED and job.pk != but]
        assert len(held) <= 1, held
        return held[0] if held else None

    def moves(
        self, pk: int, state: str, change: int = 0, due: str = "", due_at: datetime | None = None
    ) -> None:
        """The model's job ``pk`` leaves running (or queued) for ``state``. A job going back to the
        queue while another waits with its unique key is superseded: it ends cancelled."""
        job = self.jobs[pk]
        if state == QUEUED and self.waiting_with(job.key, but=pk) is not None:
            state = CANCELLED
        job.state, job.attempts = state, job.attempts + change
        job.lease_until = None
        if state == QUEUED:
            job.due, job.worker_id = due, None
            if due_at is not None:  # else taken back unstarted: due as it was
                job.due_at = due_at

    def pick(self, pick: int, anyone: bool, applies: Callable[[Modelled], bool]) -> Modelled:
        """A job the operation applies to, or any job (so it is tried where it must refuse too)."""
        jobs = sorted(self.jobs.values(), key=lambda job: job.pk)
        fitting = [job for job in jobs if applies(job)]
        return choose(jobs if anyone or not fitting else fitting, pick)

    # -- what the model expects of dependencies --------------------------------

    def downstream(self, ended: Iterable[int]) -> list[int]:
        ended = set(ended)
        return sorted(job.pk for job in self.jobs.values() if ended & set(job.upstream))

    def mark(self, ended: dict[int, str]) -> None:
        """Record ``ended`` (job: the state it ended in) on their edges, while they are still in it."""
        for job in self.jobs.values():
            for up in job.upstream:
                if up in ended and up in self.jobs and self.jobs[up].state == ended[up]:
                    job.marks[up] = ended[up]

    def verdict(self, job: Modelled) -> str | None:
        """Where release takes waiting ``job``, by its edges: queued, cancelled, or nowhere yet."""
        marks = [job.marks.get(up, "") for up in job.upstream]
        unended, bad = "" in marks, any(mark in BAD for mark in marks)
        if job.run_if == "done" and bad:
            return CANCELLED
        if unended:
            return None
        if job.run_if == "failed":
            return QUEUED if bad else CANCELLED
        return QUEUED

    def release(self, candidates: Iterable[int]) -> set[int]:
        """Release the waiting ``candidates`` that may move, then those after a job it cancelled."""
        moved: set[int] = set()
        pending = sorted(set(candidates))
        while pending:
            cancelled = []
            for pk in pending:
                job = self.jobs.get(pk)
                if job is None or job.state != WAITING:
                    continue
                verdict = self.verdict(job)
                if verdict == QUEUED:
                    job.state, job.due, job.releases = QUEUED, "now", job.releases + 1
                    self.released_now.add(pk)
                elif verdict == CANCELLED:
                    job.state, job.upstream_cancelled = CANCELLED, True
                    cancelled.append(pk)
                if verdict is not None:
                    moved.add(pk)
            self.mark(dict.fromkeys(cancelled, CANCELLED))
            pending = self.downstream(cancelled)
        return moved

    def ended_with_workflow(self, ended: dict[int, str]) -> set[int]:
        """The worker's eager path: ``ended`` (a workflow's steps) recorded on their edges, then their
        waiting jobs released. Returns the jobs that moved."""
        if not ended:
            return set()
        self.mark(ended)
        return self.release(self.downstream(ended))

    def reopen(self, retried: int) -> set[int]:
        """``retried``'s edges are unended; the jobs its end cancelled wait again, all the way down."""
        pending, reopened = [retried], set()
        while pending:
            for job in self.jobs.values():
                for up in job.upstream:
                    if up in pending:
                        job.marks[up] = ""
            pending = [
                pk
                for pk in self.downstream(pending)
                if self.jobs[pk].state == CANCELLED and self.jobs[pk].upstream_cancelled
            ]
            for pk in pending:
                job = self.jobs[pk]
                job.state, job.upstream_cancelled, job.reopens = WAITING, False, job.reopens + 1
            reopened |= set(pending)
        self.waiting_again |= reopened
        return reopened

    # -- rules ---------------------------------------------------------------

    @initialize(
        jobs=st.lists(
            st.tuples(
                st.sampled_from(MAX_ATTEMPTS),
                SCRIPTS,
                PRIORITIES,
                st.booleans(),
                st.none() | st.sampled_from(KEYS),
            ),
            min_size=1,
            max_size=4,
        ),
        waits=st.lists(
            st.tuples(
                st.sampled_from(MAX_ATTEMPTS), SCRIPTS, st.sampled_from(RUN_IF), st.lists(PICK, max_size=3)
            ),
            max_size=2,
        ),
        limited=st.lists(st.tuples(LIMITED_JOBS, st.integers(0, 1)), max_size=4),
        claims=st.lists(st.integers(0, 3), min_size=WORKERS, max_size=WORKERS),
    )
    def some_jobs_are_enqueued_and_claimed(
        self,
        jobs: list[tuple[Any, ...]],
        waits: list[tuple[Any, ...]],
        limited: list[tuple[Any, ...]],
        claims: list[int],
    ) -> None:
        """Every example starts with work in progress, whichever rules hypothesis leaves out of it:
        some of it waiting for the rest, some under limits."""
        for spec in jobs:
            self.enqueue(*spec)
        for (kind, tenant, script), priority in limited:
            self.enqueue_limited(kind, tenant, script, priority, False)
        for max_attempts, script, run_if, picks in waits:
            self.enqueue_after(max_attempts, script, run_if, [0, *picks])
        for process, limit in enumerate(claims):
            if limit:
                self.claim(process, limit)

    @rule(
        max_attempts=st.sampled_from(MAX_ATTEMPTS),
        script=SCRIPTS,
        priority=PRIORITIES,
        delayed=st.booleans(),
        key=st.none() | st.sampled_from(KEYS),
    )
    def enqueue(
        self, max_attempts: int, script: list[str], priority: int, delayed: bool, key: str | None
    ) -> None:
        """A new job; with a unique key that a queued job holds, that job is returned and nothing written."""
        function = registry.get(name_for(max_attempts)).using(priority=priority, unique_key=key)
        if delayed:
            function = function.using(delay=LATER)
        holder = self.waiting_with(key)
        before = rows()
        job = function.enqueue(script)
        assert_unchanged(before, rows())
        if holder is not None:
            assert job.pk == holder.pk, "a waiting job's key returns it"
            return
        assert job.pk not in self.jobs
        due = "later" if delayed else "now"
        self.jobs[job.pk] = Modelled(job.pk, max_attempts, tuple(script), key=key, due=due)

    @rule(job=LIMITED_JOBS, priority=PRIORITIES, delayed=st.booleans())
    def a_job_with_limits_is_enqueued(
        self, job: tuple[str, str, list[str]], priority: int, delayed: bool
    ) -> None:
        """A new job under limits: a rate, concurrency={...}, or both."""
        kind, tenant, script = job
        self.enqueue_limited(kind, tenant, script, priority, delayed)

    def enqueue_limited(
        self, kind: str, tenant: str, script: list[str], priority: int, delayed: bool
    ) -> None:
        """A job under a rate limit, or concurrency={...}, or both: its row names them, keys made."""
        function = registry.get(LIMITED).using(priority=priority)
        if kind in ("rate", "both"):
            function = function.using(rate=(RATE_SPEC, RATE_KEY))
        if kind in ("concurrency", "both"):
            function = function.using(concurrency=CONCURRENCY_LIMITS)
        if delayed:
            function = function.using(delay=LATER)
        before = rows()
        job = function.enqueue(script, tenant, RATE_KEY if kind != "concurrency" else GPU)
        assert_unchanged(before, rows())
        limits = Limits.decode(job.limits)
        assert [key for key, _, _ in limits.rates] == ([RATE_KEY] if kind != "concurrency" else [])
        assert [key for key, _ in limits.concurrency] == ([GPU, f"tenant:{tenant}"] if kind != "rate" else [])
        self.rates.update((key, (count, period)) for key, count, period in limits.rates)
        self.concurrency.update(limits.concurrency)
        due = "later" if delayed else "now"
        self.jobs[job.pk] = Modelled(job.pk, LIMITED_ATTEMPTS, tuple(script), due=due, limits=limits)

    @precondition(lambda self: self.jobs)
    @rule(
        max_attempts=st.sampled_from(MAX_ATTEMPTS),
        script=SCRIPTS,
        run_if=st.sampled_from(RUN_IF),
        picks=st.lists(PICK, min_size=1, max_size=3),
    )
    def enqueue_after(self, max_attempts: int, script: list[str], run_if: str, picks: list[int]) -> None:
        """A new job waiting for some jobs (``after=``), in whatever state they are; it joins the first
        one's workflow (or a new one, which the others without one join), and is released at once if
        they have ended as its ``run_if`` asks."""
        jobs = sorted(self.jobs.values(), key=lambda job: job.pk)
        upstream = list(dict.fromkeys(choose(jobs, pick).pk for pick in picks))
        before = rows()
        job = registry.get(name_for(max_attempts)).using(after=upstream, run_if=run_if).enqueue(script)
        assert job.pk not in self.jobs
        joined = next((self.jobs[up].workflow for up in upstream if self.jobs[up].workflow is not None), None)
        if joined is not None:
            assert job.workflow_id == joined
        else:
            assert job.workflow_id not in {other.workflow for other in jobs}
        loose = {up for up in upstream if self.jobs[up].workflow is None}
        for up in loose:
            self.jobs[up].workflow = job.workflow_id
        modelled = Modelled(job.pk, max_attempts, tuple(script), state=WAITING, workflow=job.workflow_id)
        modelled.upstream, modelled.run_if = tuple(upstream), run_if
        modelled.marks = {up: self.ended(up) for up in upstream}
        self.jobs[job.pk] = modelled
        self.release([job.pk])
        assert job.state == modelled.state
        assert_unchanged(before, rows(), but=loose)  # they joined its workflow
        self.reopened = loose

    def ended(self, pk: int) -> str:
        state = self.jobs[pk].state
        return state if state in FINISHED_STATES else ""

    @rule(
        members=st.lists(st.tuples(st.sampled_from(MAX_ATTEMPTS), SCRIPTS), min_size=1, max_size=3),
        callbacks=st.sampled_from(["on_done", "on_failure", "both"]),
        script=SCRIPTS,
    )
    def a_batch_is_enqueued(
        self, members: list[tuple[int, list[str]]], callbacks: str, script: list[str]
    ) -> None:
        """Jobs enqueued in ``batch()``, with its callbacks: each waits for every job of the batch."""
        step = registry.get(CALLBACK).s(script)
        on_done = step if callbacks in ("on_done", "both") else None
        on_failure = step if callbacks in ("on_failure", "both") else None
        before = rows()
        with batch(on_done=on_done, on_failure=on_failure) as flow:
            created = [registry.get(name_for(n)).enqueue(member) for n, member in members]
        assert_unchanged(before, rows())
        for job, (n, member) in zip(created, members, strict=True):
            self.jobs[job.pk] = Modelled(job.pk, n, tuple(member), workflow=flow.pk)
        upstream = tuple(job.pk for job in created)
        found = Job.objects.using(ALIAS).filter(workflow_id=flow.pk, upstream_arg=COUNTS)
        expected = [run_if for run_if, step in (("done", on_done), ("failed", on_failure)) if step]
        rows_found = list(found.order_by("pk").values_list("pk", "run_if"))
        assert [run_if for _, run_if in rows_found] == expected
        for pk, run_if in rows_found:
            callback = Modelled(pk, CALLBACK_ATTEMPTS, tuple(script), state=WAITING, workflow=flow.pk)
            callback.upstream, callback.run_if, callback.callback = upstream, run_if, True
            callback.marks = dict.fromkeys(upstream, "")
            self.jobs[pk] = callback

    @precondition(lambda self: any(job.state == WAITING for job in self.jobs.values()))
    @rule()
    def the_release_duty_runs(self) -> None:
        """One worker's duty: mark the ends the eager path missed (recovery, shutdown, the unknown-name
        check, a step that joined its workflow after its claim), then release what may move. After it,
        no waiting job could move."""
        before = rows()
        moved = dependencies.sweep(ALIAS)
        waiting = [job for job in self.jobs.values() if job.state == WAITING]
        assert all(up in self.jobs for job in waiting for up in job.upstream), "a waited-for job is kept"
        self.mark(
            {
                up: self.jobs[up].state
                for job in waiting
                for up in job.upstream
                if not job.marks.get(up) and self.ended(up)
            }
        )
        expected = self.release([job.pk for job in waiting if self.verdict(job) is not None])
        assert moved == len(expected)
        assert_unchanged(before, rows(), but=expected)
        self.check_nothing_left_to_release(rows())

    def due(self, now: datetime | None = None) -> list[Modelled]:
        now = now or self.now()
        return [
            job
            for job in self.jobs.values()
            if job.state == QUEUED
            and (
                job.due in ("now", "ahead")
                or (job.due == "at" and job.due_at is not None and job.due_at <= now)
            )
        ]

    @precondition(lambda self: self.due())
    @rule(process=st.integers(0, WORKERS - 1), limit=st.integers(1, 3), old_code=st.booleans())
    def claim(self, process: int, limit: int, old_code: bool = False) -> None:
        """A worker claims up to ``limit`` due jobs; one of older code only jobs whose names it knows."""
        worker = self.processes[process]
        now = self.now()
        before = rows()
        due = [job for job in self.due(now) if not (old_code and job.name == NEW_KIND)]
        due.sort(key=lambda job: (-before[job.pk]["priority"], before[job.pk]["run_after"], job.pk))
        expected = [job.pk for job in due[:limit]]
        request = ClaimRequest(worker.id, limit, now, now + LEASE)
        if old_code:
            request = dataclasses.replace(request, names=OLD_NAMES)
        claimed = claim(connection, request)
        assert [job.pk for job in claimed] == expected
        assert_unchanged(before, rows(), but=expected)
        for job in claimed:
            modelled = self.jobs[job.pk]
            assert job.claims == modelled.claims + 1, "a claim's token is the next one"
            if modelled.workflow is not None:
                self.with_workflow.add((job.pk, job.claims))
            # Only release (checked there: its upstream jobs had ended) or retry() queues a waiting job.
            assert not modelled.upstream or modelled.releases or modelled.retried, modelled
            modelled.state, modelled.attempts, modelled.claims = RUNNING, modelled.attempts + 1, job.claims
            modelled.worker_id, modelled.lease_until = worker.id, now + LEASE
            worker.attempts.append(Attempt(job, worker.id))

    def held(self) -> list[tuple[Process, Attempt]]:
        return [(worker, a) for worker in self.processes for a in worker.attempts]

    @precondition(lambda self: self.held())
    @rule(pick=PICK, times_out=st.booleans(), refill=st.booleans())
    def an_attempt_ends(self, pick: int, times_out: bool, refill: bool) -> None:
        """Its handler returns; or its worker records a timeout, and the handler comes back late later.

        With ``refill`` the worker claims again in the same cycle, as its
        dispatcher does: the job it just requeued may be the one it gets.
        """
        worker, attempt = choose(self.held(), pick)
        if attempt in worker.timed_out:
            self.returns_late(worker, attempt)
        elif times_out and worker.ran(attempt):  # no deadline before a thread starts it
            self.times_out(worker, attempt)
        else:
            self.record(worker, [attempt])
        if refill and self.due():
            self.claim(self.processes.index(worker), 1)

    @precondition(lambda self: any(worker.unstarted() for worker in self.processes))
    @rule(pick=PICK)
    def a_prefetched_attempt_is_taken_back(self, pick: int) -> None:
        """The dispatcher takes back an attempt no thread started (it waited past the prefetch window,
        or the process stops): queued again as it was, the attempt not counted. A job asked to cancel
        meanwhile is left running, to its lease, which recovery then cancels."""
        worker = choose([w for w in self.processes if w.unstarted()], pick)
        attempt = choose(worker.unstarted(), pick)
        job = self.jobs.get(attempt.job.pk)
        back = self.live(attempt) and job is not None and not job.cancel_requested
        before = rows()
        outcome = unstarted()
        outcome_writes.record_many(ALIAS, [(attempt, outcome)])
        assert outcome.applied == back
        moved: set[int] = set()
        if back and job is not None:
            self.moves(job.pk, QUEUED, -1, job.due)
            moved = self.released_after([attempt])  # superseded: it ended cancelled
        elif self.live(attempt):
            self.let_go.add((attempt.job.pk, attempt.token))
        worker.drop(attempt)
        assert_unchanged(before, rows(), but={attempt.job.pk, *moved} if back else set())

    @precondition(lambda self: any(len(worker.returnable()) > 1 for worker in self.processes))
    @rule(pick=PICK)
    def handlers_return_together(self, pick: int) -> None:
        """Several of one worker's handlers return and their outcomes are written in one transaction."""
        worker = choose([w for w in self.processes if len(w.returnable()) > 1], pick)
        self.record(worker, worker.returnable())

    def record(self, worker: Process, attempts: list[Attempt]) -> None:
        before = rows()
        finished = [(attempt, self.run(worker, attempt)) for attempt in attempts]
        expected = {}
        for attempt, outcome in finished:
            if not self.live(attempt):
                continue
            if outcome.step == HELD_BACK_QUEUED and self.jobs[attempt.job.pk].cancel_requested:
                # Not put back while a cancellation is asked, as a prefetched attempt: left to its lease.
                self.let_go.add((attempt.job.pk, attempt.token))
                continue
            expected[attempt] = self.outcome_of(attempt, outcome)
        outcome_writes.record_many(ALIAS, finished)
        # In id order, as they are written: of two jobs with one key, the first keeps it.
        for attempt, outcome in sorted(finished, key=lambda pair: pair[0].job.pk):
            assert outcome.applied == (attempt in expected), (attempt, outcome)
            worker.drop(attempt)
            if attempt in expected:
                self.moves(attempt.job.pk, *expected[attempt])
        moved = self.released_after(expected)
        # A stale attempt's progress and outcome change nothing.
        assert_unchanged(before, rows(), but={a.job.pk for a in expected} | moved)

    def released_after(self, written: Iterable[Attempt]) -> set[int]:
        """After the outcomes commit, the worker releases what waited for the steps among them that
        ended: a step its claim knew as one (a job that joined a workflow later is the duty's)."""
        ended = {
            a.job.pk: self.jobs[a.job.pk].state
            for a in written
            if (a.job.pk, a.token) in self.with_workflow and self.jobs[a.job.pk].state in FINISHED_STATES
        }
        return self.ended_with_workflow(ended)

    def run(self, worker: Process, attempt: Attempt) -> Outcome:
        """A thread runs the attempt's handler (``handler_run.run``); a job with limits by the
        model's clock, through the gate unless its thread passed it already."""
        if not gated(attempt):
            return handler_run.run(attempt)
        with self.database_clock():
            if attempt in worker.started:
                outcome = past_the_gate(attempt)
            else:
                before = self.now()
                outcome = handler_run.run(attempt)
                held = None
                if outcome.step == HELD_BACK_QUEUED:
                    held = limit_rules.Held(outcome.columns["run_after"], outcome.columns["error"])
                self.judge_gate(attempt, held, before, self.now())
        self.note_holds()
        if outcome.label.startswith("throttled"):  # due when the hold on its key ends
            key = limits_of(attempt).keys()[0]
            assert outcome.columns["run_after"] == self.held_until[key], (outcome, self.holds)
        return outcome

    def times_out(self, worker: Process, attempt: Attempt) -> None:
        """The worker records a timeout; the handler keeps running, its slot still held."""
        expected: tuple[str, int, str] | None = None
        if self.live(attempt):
            job = self.jobs[attempt.job.pk]
            if job.attempts >= job.max_attempts:
                expected = (FAILED, 0, "")
            elif job.cancel_requested:
                expected = (CANCELLED, 0, "")
            else:
                expected = (QUEUED, 0, "now")
        attempt.stop.set()
        worker.timed_out.add(attempt)
        outcome = retry_policy.timed_out(attempt.job)
        before = rows()
        outcome_writes.record_many(ALIAS, [(attempt, outcome)])
        assert outcome.applied == (expected is not None)
        moved: set[int] = set()
        if expected:
            self.moves(attempt.job.pk, *expected)
            moved = self.released_after([attempt])
        assert_unchanged(before, rows(), but=({attempt.job.pk} | moved) if expected else set())

    def returns_late(self, worker: Process, attempt: Attempt) -> None:
        """Whatever a timed-out handler returns changes nothing, its progress included."""
        assert not self.live(attempt)
        before = rows()
        outcome = self.run(worker, attempt)
        outcome.late = True
        outcome_writes.record_many(ALIAS, [(attempt, outcome)])
        assert not outcome.applied
        assert_unchanged(before, rows())
        worker.drop(attempt)

    # -- limits ----------------------------------------------------------------

    @precondition(lambda self: any(worker.gate_next() for worker in self.processes))
    @rule(pick=PICK)
    def a_thread_starts_a_job_with_limits(self, pick: int) -> None:
        """A thread is about to start a claimed job with limits: the gate takes a slot of each, and
        the handler runs on (its job running, its concurrency slots held); or one has no room and
        the job goes back to the queue, due when it may have room, the attempt not counted. A job
        asked to cancel meanwhile is left running, to its lease, as a prefetched one would be."""
        worker = choose([w for w in self.processes if w.gate_next()], pick)
        attempt = choose(worker.gate_next(), pick)
        before_rows = rows()
        with self.database_clock():
            before = self.now()
            held = limit_gate.check(attempt.job)
            after = self.now()
        self.judge_gate(attempt, held, before, after)
        if held is None:
            worker.started.add(attempt)
            assert_unchanged(before_rows, rows())
            return
        job = self.jobs.get(attempt.job.pk)
        back = self.live(attempt) and job is not None and not job.cancel_requested
        outcome = held_back(held.until, held.reason)
        outcome_writes.record_many(ALIAS, [(attempt, outcome)])
        assert outcome.applied == back
        if back:
            self.moves(attempt.job.pk, QUEUED, -1, "at", held.until)
        elif self.live(attempt):
            self.let_go.add((attempt.job.pk, attempt.token))
        worker.drop(attempt)
        assert_unchanged(before_rows, rows(), but={attempt.job.pk} if back else set())

    @rule(by=st.sampled_from(MOMENTS))
    def a_moment_passes(self, by: timedelta) -> None:
        """The clock moves on by less than a lease: a rate slot rests, a hold ends, a job held back
        comes due."""
        self.offset += by

    def judge_gate(
        self, attempt: Attempt, held: limit_rules.Held | None, before: datetime, after: datetime
    ) -> None:
        """The gate looked at some moment between ``before`` and ``after``: it starts the job if every
        limit had room before, holds it if one had none after (either way between), as the model
        has the slots. A start takes one slot of each limit, at that moment; a hold takes none and
        says when to come back: never before it was held, nor before its limits may have room."""
        limits = limits_of(attempt)
        pk, token = attempt.job.pk, attempt.token
        slots = LimitSlot.objects.using(ALIAS).filter(job_id=pk, claim=token)
        taken = list(slots.values_list("key", "kind", "taken_at"))
        # A gate whose every stamp came back late holds its job back with its slots spent: for the
        # limits, a start (``_stamp_late_start``; only on a database slower than the guard).
        spent = held is not None and held.reason.startswith(limit_gate.SLOW_STAMPS)
        if not self.blocked(limits, before):
            assert held is None or spent, (held, limits, self.starts, self.holds)
        if self.blocked(limits, after):
            assert held is not None and not spent, (limits, self.starts, self.holds)
        if held is None or spent:
            wanted = [(key, RATE) for key, _, _ in limits.rates] + [
                (key, CONCURRENCY) for key, _ in limits.concurrency
            ]
            assert sorted((key, kind) for key, kind, _ in taken) == sorted(wanted), (taken, limits)
            # One stamp for all its slots, or, from a gate slower than half a guard, its rate
            # slots stamped again later, with a time after its commit (``_stamp_late_start``):
            # the time the stamp's statement should come back by, by the last one's, no further
            # ahead of the gate's return than the gate took.
            stamps = [at for _, _, at in taken if at is not None]
            latest = after + (after - before)
            assert len(stamps) == len(taken) and all(before <= at <= latest for at in stamps), taken
            when = max(stamps)
            self.starts.append((pk, token, when, tuple(limits.keys())))
            return
        assert not taken, taken
        assert held.reason.startswith(limit_rules.HELD_PREFIX), held
        assert held.until >= before, held
        # Due no earlier than its limits can have room, less the lead a job held back by a rate
        # is given to be claimed by then (half the guard; its thread waits out the rest).
        lead = timedelta(seconds=max((guard(period) for _, _, period in limits.rates), default=0) / 2)
        floors = self.blocked(limits, after).values()
        assert all(held.until >= floor - lead for floor in floors), (held, floors)

    def blocked(self, limits: Limits, now: datetime) -> dict[str, datetime]:
        """The limits with no room at ``now``, by key, each with the earliest time it may have room
        (``now`` for a concurrency limit: it has room once a job of its key ends)."""
        limit_keys = limits.keys()
        full = {key: until for key in limit_keys if (until := self.held_until.get(key)) and until > now}
        for key, count, period in limits.rates:
            rest = timedelta(seconds=period + guard(period))
            times = sorted(when for _, _, when, keys in self.starts if key in keys)
            if sum(1 for when in times if when + rest > now) >= count:
                full[key] = max(full.get(key, now), times[-count] + rest)
        for key, count in limits.concurrency:
            if len(self.holding(key)) >= count:
                full[key] = max(full.get(key, now), now)
        return full

    def holding(self, key: str) -> set[tuple[int, int]]:
        """The (job, token) started under concurrency ``key`` whose job still runs under that claim."""
        return {
            (pk, token)
            for pk, token, _, keys in self.starts
            if key in keys
            and (job := self.jobs.get(pk)) is not None
            and (job.state, job.claims) == (RUNNING, token)
        }

    def note_holds(self) -> None:
        """The holds a handler set (``Throttled``), as the model keeps them: each from when until when."""
        for key, since, until in LimitHold.objects.using(ALIAS).values_list("key", "set_at", "until"):
            if self.held_until.get(key) != until:
                self.held_until[key] = until
                self.holds.append((key, since, until))

    def busy(self) -> list[int]:
        return [i for i, worker in enumerate(self.processes) if worker.attempts]

    @precondition(lambda self: self.busy())
    @rule(pick=PICK)
    def heartbeat(self, pick: int) -> None:
        """A worker renews the leases it holds and learns of cancellation requests."""
        worker = self.processes[choose(self.busy(), pick)]
        now = self.now()
        held = [a.job.pk for a in worker.attempts]
        running = {pk for pk in held if pk in self.jobs and self.jobs[pk].state == RUNNING}
        renewing = {pk for pk in running if self.jobs[pk].worker_id == worker.id}
        asked = {pk for pk in running if self.jobs[pk].cancel_requested}
        before = rows()
        assert leases.renew(ALIAS, worker.id, held, now + LEASE) == len(renewing)
        requests = cancellation.requested(ALIAS, held)
        cancellation.deliver(worker.attempts, requests)
        assert set(requests) == asked
        assert_unchanged(before, rows(), but=renewing)
        for pk in renewing:
            self.jobs[pk].lease_until = now + LEASE

    @rule(
        by=st.sampled_from([LEASE / 2, LEASE + timedelta(seconds=1)]),
        claimer=st.none() | st.integers(0, WORKERS - 1),
    )
    def time_passes_and_lapsed_leases_are_recovered(self, by: timedelta, claimer: int | None) -> None:
        """The clock moves on by half a lease or past one, and a heartbeat recovers the lapsed leases.

        The heartbeat wakes its dispatcher, which may claim the recovered jobs at once.
        """
        self.offset += by
        now = self.now()
        expected = {}
        for job in sorted(self.jobs.values(), key=lambda job: job.pk):
            if self.watch_sees_unchanged_for_a_lease(job, now):
                if job.cancel_requested:
                    expected[job.pk] = CANCELLED
                elif job.attempts >= job.max_attempts:
                    expected[job.pk] = FAILED
                else:
                    expected[job.pk] = QUEUED
        before = rows()
        recovered = recovery.recover_expired(ALIAS, now, self.watch)
        assert len(recovered) == len(expected)
        for pk, state in expected.items():  # in id order, as recovery writes them
            self.moves(pk, state, due="ahead")
        assert dict(recovered) == {pk: self.jobs[pk].state for pk in expected}
        assert_unchanged(before, rows(), but=expected)
        if claimer is not None and self.due():
            self.claim(claimer, 3)

    def watch_sees_unchanged_for_a_lease(self, job: Modelled, now: datetime) -> bool:
        """Whether the watch, looking ``now``, has seen ``job``'s lease unchanged for a lease, and its
        end passed. It watches running jobs whose lease ends within its horizon, and forgets others."""
        if job.state != RUNNING or job.lease_until is None or job.lease_until >= self.watch.horizon(now):
            job.watched = None
            return False
        if job.watched != (job.claims, job.lease_until):
            job.watched, job.watched_since = (job.claims, job.lease_until), self.offset
        return self.offset - job.watched_since >= LEASE and job.lease_until < now

    @precondition(lambda self: self.jobs)
    @rule(method=st.sampled_from(["retry", "run_now"]), pick=PICK, anyone=st.booleans())
    def code_calls(self, method: str, pick: int, anyone: bool) -> None:
        """``retry()`` or ``run_now()`` on a job it applies to, or on any job."""
        applies = {
            "retry": lambda job: job.state in (FAILED, CANCELLED),
            "run_now": lambda job: job.state == QUEUED and job.due != "now",
        }
        job = self.pick(pick, anyone, applies[method])
        getattr(self, f"calls_{method}")(job)

    @precondition(lambda self: self.jobs)
    @rule(pick=PICK, anyone=st.booleans())
    def code_cancels(self, pick: int, anyone: bool) -> None:
        """``cancel()`` on a running job (what its worker then does is the point), or on any job."""
        job = self.pick(pick, anyone, lambda job: job.state == RUNNING)
        changes = job.state in (WAITING, QUEUED) or (job.state == RUNNING and not job.cancel_requested)
        before = rows()
        assert Job.objects.using(ALIAS).get(pk=job.pk).cancel() is (job.state in (WAITING, QUEUED, RUNNING))
        moved: set[int] = set()
        if job.state in (WAITING, QUEUED):
            job.state = CANCELLED
            if job.workflow is not None:  # its waiting jobs learn it at once
                moved = self.ended_with_workflow({job.pk: CANCELLED})
        elif job.state == RUNNING:
            job.cancel_requested = True
        assert_unchanged(before, rows(), but={job.pk, *moved} if changes else set())

    def calls_retry(self, job: Modelled) -> None:
        # A job whose unique key another waiting job holds stays as it is.
        retryable = job.state in (FAILED, CANCELLED) and self.waiting_with(job.key, but=job.pk) is None
        before = rows()
        assert Job.objects.using(ALIAS).get(pk=job.pk).retry() is retryable
        reopened: set[int] = set()
        again = retryable and bool(job.upstream) and job.attempts == 0
        if again:  # never ran, and waits for others: it waits for them again
            job.state, job.reopens = WAITING, job.reopens + 1
            self.waiting_again.add(job.pk)
        elif retryable:
            job.state, job.attempts, job.due, job.worker_id = QUEUED, 0, "now", None
            job.retried = True
        if retryable:
            job.cancel_requested = job.upstream_cancelled = False
            if job.workflow is not None:  # the jobs its end cancelled wait again
                reopened = self.reopen(job.pk)
                self.retries_in[job.workflow] += 1
            if again:  # then it is released, or cancelled again, as its edges say
                reopened |= self.release([job.pk])
            self.reopened = {job.pk, *reopened}
        assert_unchanged(before, rows(), but={job.pk, *reopened} if retryable else set())

    def calls_run_now(self, job: Modelled) -> None:
        # "ahead" is past the wall clock, which run_now() goes by.
        delayed = job.state == QUEUED and job.due != "now"
        before = rows()
        assert Job.objects.using(ALIAS).get(pk=job.pk).run_now() is delayed
        assert_unchanged(before, rows(), but=[job.pk] if delayed else [])
        if delayed:
            job.due = "now"

    @precondition(lambda self: any(job.state in FINISHED_STATES for job in self.jobs.values()))
    @rule(states=st.sets(st.sampled_from(FINISHED_STATES), min_size=1), everything=st.booleans())
    def finished_jobs_are_pruned(self, states: set[str], everything: bool) -> None:
        """Pruning with a cutoff past every finish (or before any)."""
        cutoff = self.now() + timedelta(days=1) if everything else self.started - timedelta(days=1)
        gone = self.prunable(states) if everything else set()
        before = rows()
        pruned = retention.prune(ALIAS, dict.fromkeys(sorted(states), cutoff))
        after = rows()
        assert pruned.counts == {s: sum(self.jobs[pk].state == s for pk in gone) for s in states}
        assert set(after) == set(before) - gone
        assert_unchanged(before, after, but=gone)
        workflows = {wf for pk in gone if (wf := self.jobs[pk].workflow) is not None}
        for pk in gone:
            del self.jobs[pk]
        for job in self.jobs.values():  # their edges went with them
            job.upstream = tuple(up for up in job.upstream if up not in gone)
            job.marks = {up: mark for up, mark in job.marks.items() if up not in gone}
        emptied = workflows - {job.workflow for job in self.jobs.values()}
        assert not Workflow.objects.using(ALIAS).filter(pk__in=emptied).exists(), (
            "a pruned workflow's row goes"
        )
        self.reopened = gone

    def prunable(self, states: set[str]) -> set[int]:
        """Jobs of no workflow in ``states``; a workflow's jobs together, once all are in ``states``
        and no unended job waits for one of them."""
        gone = {pk for pk, job in self.jobs.items() if job.workflow is None and job.state in states}
        unended = [job for job in self.jobs.values() if job.state not in FINISHED_STATES]
        for workflow in {job.workflow for job in self.jobs.values()} - {None}:
            steps = {pk for pk, job in self.jobs.items() if job.workflow == workflow}
            ended = all(self.jobs[pk].state in states for pk in steps)
            if ended and not any(steps & set(job.upstream) for job in unended):
                gone |= steps
        return gone

    @precondition(lambda self: self.busy())
    @rule(pick=PICK, gracefully=st.booleans())
    def a_worker_stops(self, pick: int, gracefully: bool) -> None:
        """It shuts down, handing back every attempt it holds (timed out or not) after the grace period;
        or it dies (kill -9) and its jobs stay running until their leases lapse."""
        process = choose(self.busy(), pick)
        worker = self.processes[process]
        if gracefully:
            live = {a.job.pk for a in worker.attempts if self.live(a)}
            before = rows()
            assert leases.hand_back(ALIAS, worker.attempts, SHUTDOWN) == len(live)
            assert_unchanged(before, rows(), but=live)
            for pk in live:
                if self.jobs[pk].cancel_requested:
                    self.moves(pk, CANCELLED)
                else:
                    self.moves(pk, QUEUED, -1, "now")
        self.replace(process)

    @precondition(lambda self: self.busy())
    @rule(pick=PICK, returning=st.integers(0, 2**6 - 1))
    def a_worker_shuts_down(self, pick: int, returning: int) -> None:
        """SIGTERM. The handlers ``returning`` picks come back within the grace period (a polite one
        early, as should_stop() says the worker is shutting down: queued again, its attempt not
        counted). The others still run at its end: their jobs are handed back due later (after
        ``RELEASE_MARGIN``, when the process has exited; the model's "ahead"), attempt refunded,
        and a timed-out one's job is no longer its to hand back."""
        process = choose(self.busy(), pick)
        worker = self.processes[process]
        shutdown = threading.Event()
        shutdown.set()
        for attempt in worker.attempts:
            attempt.shutdown = shutdown
        back = [a for i, a in enumerate(worker.returnable()) if returning >> i & 1 and worker.ran(a)]
        if back:
            self.record(worker, back)
        still = list(worker.attempts)
        live = sorted(a.job.pk for a in still if self.live(a))
        later = timezone.now() + timedelta(minutes=30)  # past the wall clock, before the model's
        before = rows()
        assert leases.hand_back(ALIAS, still, SHUTDOWN, due=lambda attempt: later) == len(live)
        assert_unchanged(before, rows(), but=live)
        for pk in live:
            if self.jobs[pk].cancel_requested:
                self.moves(pk, CANCELLED)
            else:
                self.moves(pk, QUEUED, -1, "ahead")
        self.replace(process)

    @rule(known=st.booleans())
    def the_unknown_name_check_runs(self, known: bool) -> None:
        """A live worker's heartbeat counts how long no live worker has known each queued job's name
        (``unknown_names``). The worker is of old code (not ``known``: it lacks the newest kind) or
        new. Checked again past ``UNKNOWN_NAME_TIMEOUT``, the due jobs of a name no live worker
        knows fail with the reason; delayed ones wait, and so does everything a live worker knows."""
        now = self.now()
        names = [*(name_for(n) for n in MAX_ATTEMPTS), CALLBACK, LIMITED] if known else OLD_NAMES
        worker = Worker.objects.using(ALIAS).create(
            id=uuid.uuid4(), host="model", pid=1, threads=1, names=names, last_heartbeat=now
        )
        timeout = {**settings.VELLUM_JOBS, "UNKNOWN_NAME_TIMEOUT": UNKNOWN_NAME_TIMEOUT.total_seconds()}
        with override_settings(VELLUM_JOBS=timeout):
            before = rows()
            assert unknown_names.check(ALIAS, now) == []
            assert_unchanged(before, rows())
            self.offset += UNKNOWN_NAME_TIMEOUT + timedelta(seconds=1)
            later = self.now()
            Worker.objects.using(ALIAS).filter(pk=worker.pk).update(last_heartbeat=later)
            expected = sorted(
                pk
                for pk, job in self.jobs.items()
                if not known and job.name == NEW_KIND and job.state == QUEUED and job.due != "later"
            )
            before = rows()
            assert sorted(unknown_names.check(ALIAS, later)) == expected
            assert_unchanged(before, rows(), but=expected)
        for pk in expected:
            assert rows()[pk]["error"].startswith(f"no handler registered for {NEW_KIND!r}")
            self.moves(pk, FAILED)
        worker.delete()
        UnknownName.objects.using(ALIAS).all().delete()

    def replace(self, process: int) -> None:
        self.gone.add(self.processes[process].id)
        self.processes[process] = Process()

    # -- invariants ----------------------------------------------------------

    @invariant()
    def the_rows_keep_the_models_promises(self) -> None:
        current = rows()
        assert set(current) == set(self.jobs), "rows appear only by enqueue and go only by pruning"
        for pk, row in current.items():
            self.check_row_matches_the_model(row, self.jobs[pk])
            self.check_every_state_has_its_reason(row, self.jobs[pk])
        self.check_one_live_claim_per_running_job(current)
        self.check_one_waiting_job_per_unique_key(current)
        self.check_counters_and_finished_rows(current)
        self.check_dependencies(current)
        self.check_limits(current)
        self.previous, self.reopened = current, set()
        self.released_now, self.waiting_again = set(), set()

    def check_row_matches_the_model(self, row: Row, job: Modelled) -> None:
        found = (row["state"], row["attempts"], row["claims"], row["cancel_requested_at"] is not None)
        assert found == (job.state, job.attempts, job.claims, job.cancel_requested), (row, job)
        if job.state == RUNNING:
            assert (row["worker_id"], row["lease_expires_at"]) == (job.worker_id, job.lease_until)
        if job.state == QUEUED and job.due == "at":
            assert row["run_after"] == job.due_at, (row, job)
        elif job.state == QUEUED:
            assert (row["run_after"] <= self.now()) == (job.due != "later"), (row, job)
            assert (row["run_after"] <= timezone.now()) == (job.due == "now"), (row, job)

    def check_every_state_has_its_reason(self, row: Row, job: Modelled) -> None:
        """Queued jobs are free, running ones held, finished ones say when, failures and cancellations why."""
        if row["state"] in (WAITING, QUEUED):
            assert row["worker_id"] is None and row["lease_expires_at"] is None, row
            assert row["cancel_requested_at"] is None, "a job asked to stop is never queued again"
            if row["state"] == WAITING:
                assert row["finished_at"] is None and job.upstream and row["run_if"] == job.run_if, row
        elif row["state"] == RUNNING:
            assert row["worker_id"] and row["lease_expires_at"] and row["started_at"], row
        else:
            assert row["state"] in FINISHED_STATES and row["finished_at"] is not None, row
            assert row["lease_expires_at"] is None, row
            if row["state"] in (FAILED, CANCELLED):
                assert row["error"], row

    def check_one_live_claim_per_running_job(self, current: dict[int, Row]) -> None:
        """A claim's token is unique; a running row is held by one attempt (none if its worker vanished,
        or let it go to its lease)."""
        attempts = [(a.job.pk, a.token) for worker in self.processes for a in worker.attempts]
        assert all(n == 1 for n in Counter(attempts).values()), attempts
        for pk, row in current.items():
            if row["state"] == RUNNING:
                holders = attempts.count((pk, row["claims"]))
                let_go = row["worker_id"] in self.gone or (pk, row["claims"]) in self.let_go
                assert holders == (0 if let_go else 1), (row, attempts)

    def check_one_waiting_job_per_unique_key(self, current: dict[int, Row]) -> None:
        waiting = Counter(row["unique_key"] for row in current.values() if row["state"] == QUEUED)
        assert all(n == 1 for key, n in waiting.items() if key is not None), waiting

    def check_counters_and_finished_rows(self, current: dict[int, Row]) -> None:
        """Attempts within max_attempts, claims never lower, finished rows changed by retry or pruning."""
        for pk, row in current.items():
            assert 0 <= row["attempts"] <= row["max_attempts"], row
            old = self.previous.get(pk)
            if old is None:
                continue
            assert row["claims"] >= old["claims"], (old, row)
            if old["state"] in FINISHED_STATES and pk not in self.reopened:
                assert row == old, (old, row)
        for pk, old in self.previous.items():
            if pk not in current:
                assert old["state"] in FINISHED_STATES and pk in self.reopened, old

    def check_dependencies(self, current: dict[int, Row]) -> None:
        """Edges as the model has them, with the ends its paths wrote; a job released only once its
        upstream jobs ended as its run_if asks; waiting again only by an upstream job's retry; a
        batch's callbacks released once between them, once more per retry of one of its jobs."""
        edges = dict(
            ((job, up), state)
            for job, up, state in Dependency.objects.using(ALIAS).values_list(
                "job_id", "upstream_id", "upstream_state"
            )
        )
        modelled = {(job.pk, up): job.marks.get(up, "") for job in self.jobs.values() for up in job.upstream}
        assert edges == modelled, "no edge outlives its jobs, and each records the end written"
        for pk in self.released_now:
            job = self.jobs[pk]
            ends = [current[up]["state"] for up in job.upstream]
            assert all(state in FINISHED_STATES for state in ends), (job, ends)
            assert job.run_if != "done" or all(state == DONE for state in ends), (job, ends)
            assert job.run_if != "failed" or any(state in BAD for state in ends), (job, ends)
        for pk, row in current.items():
            old = self.previous.get(pk)
            if row["state"] == WAITING and old is not None and old["state"] != WAITING:
                assert pk in self.waiting_again and old["state"] in (CANCELLED, FAILED), (old, row)
            job = self.jobs[pk]
            assert job.releases <= 1 + job.reopens, job
        for workflow in {job.workflow for job in self.jobs.values() if job.callback and job.workflow}:
            callbacks = [job for job in self.jobs.values() if job.callback and job.workflow == workflow]
            assert sum(job.releases for job in callbacks) <= 1 + self.retries_in[workflow], callbacks

    def check_limits(self, current: dict[int, Row]) -> None:
        """No window of a rate's period (by the gate's clock) saw more starts than its count; no
        concurrency key has more jobs running under the claim that started them than its limit, and
        its slots say which; no job started under a key while a hold on it lasted."""
        for key, (count, period) in self.rates.items():
            times = sorted(when for _, _, when, keys in self.starts if key in keys)
            for i, first in enumerate(times):
                within = [when for when in times[i:] if when < first + timedelta(seconds=period)]
                assert len(within) <= count, (key, within)
        if self.concurrency:
            running = {(pk, row["claims"]) for pk, row in current.items() if row["state"] == RUNNING}
            slots = (
                LimitSlot.objects.using(ALIAS).filter(kind=CONCURRENCY).values_list("key", "job_id", "claim")
            )
            for key, count in self.concurrency.items():
                held = {(job, claim) for slot, job, claim in slots if slot == key and (job, claim) in running}
                assert held == self.holding(key) and len(held) <= count, (key, held, self.holding(key))
        for pk, token, when, keys in self.starts:
            during = [
                (key, since, until)
                for key, since, until in self.holds
                if key in keys and since <= when < until
            ]
            assert not during, (pk, token, when, during)

    def check_nothing_left_to_release(self, current: dict[int, Row]) -> None:
        """Read from the rows alone: every waiting job still waits for an upstream job, or for all of
        them (run_if "failed"), and none of a run_if "done" job's upstream jobs ended badly."""
        waits: dict[int, list[str]] = {}
        for job, up in Dependency.objects.using(ALIAS).values_list("job_id", "upstream_id"):
            waits.setdefault(job, []).append(current[up]["state"] if up in current else CANCELLED)
        for pk, row in current.items():
            if row["state"] != WAITING:
                continue
            ends = waits.get(pk, [])
            assert not all(state in FINISHED_STATES for state in ends), (row, ends)
            assert row["run_if"] != "done" or not any(state in BAD for state in ends), (row, ends)


# Each example is some hundreds of statements on the real database: `make test` runs 40 per
# database, new ones each run; `make stress` (the stress profile) runs 1,000.
IN_MAKE_TEST = os.environ.get("VELLUM_HYPOTHESIS_PROFILE", "tests") == "tests"
EXAMPLES = examples(max_examples=40) if IN_MAKE_TEST else None


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # a minute or so of examples: once per database (tests/conftest.py)
def test_the_job_lifecycle_keeps_its_invariants_in_any_interleaving(lifecycle_jobs):
    run_state_machine_as_test(JobLifecycle, settings=EXAMPLES)


@pytest.mark.django_db
def test_cancelling_a_queued_job_records_why(lifecycle_jobs):
    job = registry.get(name_for(1)).enqueue(["return"])
    assert job.cancel()
    job.refresh_from_db()
    assert job.state == CANCELLED
    assert job.error.startswith("cancelled while queued")
