"""The ``Job`` table that is the queue, the ``Worker`` table of live processes, queues, maintenance locks."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, models, transaction
from django.db.models import Count, Min, Q
from django.utils import timezone

from vellum_jobs.conf import conf
from vellum_jobs.core import clock, transitions
from vellum_jobs.core.indexes import PartialIndex, PartialUniqueConstraint

if TYPE_CHECKING:
    from vellum_jobs.core.attempts import Attempt
    from vellum_jobs.observe.explain import Reason

# The rows that have a unique key.
UNIQUE = Q(unique_key__isnull=False)
# The rows that hold a unique key while they wait to run, whatever brought
# them back to the queue: the condition of ``vellum_job_unique_queued``.
HOLDS_KEY = UNIQUE & Q(state="queued")
# The rows that have a concurrency key: the condition of the key indexes. A
# planner uses a partial index only for a query that states its condition,
# so every query that reads them says it too (the claim's SQL as
# ``sql.base.KEYED``).
KEYED = Q(concurrency_key__gt="")
# Queued jobs that have a turn among fair keys: the condition of the fair indexes.
FAIR = Q(state="queued", fair_at__isnull=False)


class JobQuerySet(models.QuerySet["Job"]):
    def queued(self) -> JobQuerySet:
        return self.filter(state=Job.State.QUEUED)

    def running(self) -> JobQuerySet:
        return self.filter(state=Job.State.RUNNING)

    def finished(self) -> JobQuerySet:
        return self.filter(state__in=Job.FINISHED_STATES)

    def due(self, now: Any = None) -> JobQuerySet:
        return self.queued().filter(run_after__lte=now or timezone.now())

    def delayed(self, now: Any = None) -> JobQuerySet:
        return self.queued().filter(run_after__gt=now or timezone.now())

    def retryable(self) -> JobQuerySet:
        return self.filter(transitions.retryable())

    def retry(self) -> int:
        """Queue the failed and cancelled jobs among these again, due now; returns how many.

        A unique job whose key another job holds now stays as it is. A job that
        never ran and waits for others waits again: its upstream jobs decide.
        """
        now = clock.of(self.db)
        rows = self.retryable()
        steps = list(rows.filter(workflow__isnull=False).values_list("pk", flat=True))
        again = list(rows.filter(transitions.waits_again()).values_list("pk", flat=True))
        count = self.filter(transitions.waits_again(), pk__in=again).update(**transitions.reopened())
        rows = rows.exclude(pk__in=again)
        count += rows.filter(unique_key__isnull=True).update(**transitions.orm(transitions.retried(now)))
        for job in rows.filter(unique_key__isnull=False):
            count += job.retry()
        # What their ends cancelled waits again; then those waiting again are released if ready
        # (or cancelled again at once, as their upstream jobs' ends say).
        _reopen_downstream(self.db, steps)
        _release_ready(self.db, again)
        return count

    def cancel(self) -> int:
        """Cancel the queued jobs among these and ask the running ones to stop; returns how many.

        Queued first: a job claimed between the two statements is then asked
        to stop, where the other order would miss it altogether.
        """
        now = clock.of(self.db)
        rows = self.filter(transitions.cancellable())
        steps = list(rows.filter(workflow__isnull=False).values_list("pk", flat=True))
        count = rows.update(**transitions.cancelled(now))
        _release_downstream(self.db, steps)
        return count + self.filter(transitions.stoppable()).update(**transitions.cancel_requested(now))

    def run_now(self) -> int:
        """Make the delayed queued jobs among these due now; returns how many."""
        now = clock.of(self.db)
        return self.delayed(now).update(run_after=now)

    def for_object(self, obj: models.Model) -> JobQuerySet:
        """The jobs that reference ``obj``, newest first."""
        ref_type, ref_id = reference_of(obj)
        return self.filter(ref_type=ref_type, ref_id=ref_id).order_by("-id")

    def next_run_after(self, queues: Sequence[str] = (), now: datetime | None = None) -> datetime | None:
        """When the earliest delayed job (of ``queues``, or any) becomes due.

        Due jobs are left out: one a worker did not claim waits for something
        else (a paused queue, a full concurrency key), and counting it would
        make an idle worker spin instead of sleeping.
        """
        rows = self.delayed(now)
        if queues:
            rows = rows.filter(queue__in=queues)
        value = rows.aggregate(next=Min("run_after"))["next"]
        return value if isinstance(value, datetime) else None

    def stats(self) -> dict[str, int]:
        """Job counts by state, every state present."""
        counts = dict.fromkeys(Job.State.values, 0)
        rows = self.order_by().values_list("state").annotate(n=Count("id"))
        for state, n in rows:
            counts[state] = n
        return counts


JobManager = models.Manager.from_queryset(JobQuerySet)


def _release_downstream(alias: str, cancelled: list[int]) -> None:
    """Workflow steps were cancelled: the jobs waiting for them learn it (see ``core.dependencies``)."""
    if cancelled:
        from vellum_jobs.core import dependencies  # it imports this module

        dependencies.mark(alias, dict.fromkeys(cancelled, transitions.CANCELLED))
        dependencies.release_after(alias, cancelled)


def _release_ready(alias: str, waiting: list[int]) -> None:
    """Jobs waiting again: released now if their upstream jobs' ends allow it."""
    if waiting:
        from vellum_jobs.core import dependencies  # it imports this module

        dependencies.release(alias, waiting)


def _reopen_downstream(alias: str, retried: list[int]) -> None:
    """Workflow steps were retried: the jobs their end cancelled wait again."""
    if retried:
        from vellum_jobs.core import dependencies  # it imports this module

        dependencies.reopen(alias, retried)


def reference_of(obj: models.Model) -> tuple[ContentType, str]:
    """The (content type, primary key text) pair that ``Job.ref`` stores for ``obj``."""
    if not isinstance(obj, models.Model):
        raise TypeError(f"ref must be a saved model instance, got {type(obj).__qualname__}")
    if obj.pk is None:
        raise ValueError(f"ref {obj!r} is not saved: it has no primary key yet")
    return ContentType.objects.get_for_model(obj, for_concrete_model=False), str(obj.pk)


class Job(models.Model):
    """One unit of work: a registered function name, its arguments, and its fate."""

    State = transitions.State  # its states, each documented where it is declared

    FINISHED_STATES: ClassVar[tuple[str, ...]] = transitions.FINISHED_STATES
    RETRYABLE_STATES: ClassVar[tuple[str, ...]] = transitions.RETRYABLE_STATES

    name = models.CharField(max_length=200)
    # An ``async def`` handler: runs on its worker's event loop, which claims it apart from the threads.
    is_async = models.BooleanField(
        default=False, db_default=False, help_text="an async def handler, run on the worker's event loop"
    )
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text="-100..100, higher runs first")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    attempts = models.PositiveIntegerField(default=0, help_text="runs started so far")
    max_attempts = models.PositiveIntegerField(default=5)
    timeout = models.FloatField(null=True, blank=True, help_text="seconds an attempt may run")
    run_after = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # Attempts that ended without a result, newest last, at most history.LIMIT:
    # each appended by the very write that records the attempt's end.
    attempt_errors = models.JSONField(
        default=list, blank=True, help_text="attempts that failed, timed out, were lost or handed back"
    )

    # The enqueuing trace's context (W3C ``traceparent``/``tracestate`` as a JSON
    # object) when ``vellum-jobs[otel]`` is installed and a span was current; else "".
    trace_context = models.TextField(blank=True, default="", editable=False)

    # The worker process holding the job and until when.
    worker_id = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Grows by one at every claim and is never reset, not even by retry():
    # the latest value is the fencing token every write after the claim checks.
    claims = models.PositiveBigIntegerField(default=0, db_default=0, help_text="claims so far, never reset")

    # Set by ``@job(concurrency_key=..., concurrency=N)``: at most
    # ``concurrency_limit`` jobs with the same non-empty key run at once.
    concurrency_key = models.CharField(max_length=255, blank=True, default="")
    concurrency_limit = models.PositiveIntegerField(default=0, help_text="0: no limit")
    # The job's other limits, as compact JSON (``core.limits``): its rate
    # limits and the keys of ``concurrency={...}``; "" for none. Checked when
    # a thread is about to start it (``store.limit_gate``), never by the claim.
    limits = models.TextField(blank=True, default="", db_default="")
    # Jobs with a fair key take turns with other keys' jobs of their queue:
    # ``fair_at`` is the job's turn, its ``run_after`` when it is due at once
    # (``enqueueing.fairness``); NULL for a job with no key or a delayed one.
    fair_key = models.CharField(max_length=255, blank=True, default="", db_default="")
    fair_at = models.DateTimeField(null=True, blank=True)
    # When someone asked a running job to stop (``cancel()`` on a running job).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    progress_done = models.BigIntegerField(null=True, blank=True)
    progress_total = models.BigIntegerField(null=True, blank=True)
    progress_message = models.CharField(max_length=255, blank=True, default="")

    ref_type = models.ForeignKey(
        ContentType, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    ref_id = models.CharField(max_length=64, blank=True, default="")
    ref = GenericForeignKey("ref_type", "ref_id")

    # Set for jobs enqueued through Django's Tasks framework (vellum_jobs.backends):
    # the TASKS alias that enqueued it (empty for @job jobs), and one entry per
    # run with its worker, start time and the exception it raised, which is
    # what a TaskResult reports and the Job's own columns do not keep.
    task_backend = models.CharField(
        max_length=100, blank=True, default="", help_text="the TASKS alias of a Django task; empty for @job"
    )
    task_runs = models.JSONField(default=list, blank=True, help_text="a Django task's runs, oldest first")

    # A unique job's key, and how long it holds it (see vellum_jobs.enqueueing.uniqueness):
    # "queued" while it waits in the queue (again, after a retry or a
    # hand-back), "queued_or_running" until it finishes.
    # NULL, not "", for no key: NULLs never collide in a unique index.
    unique_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    unique_while = models.CharField(max_length=20, blank=True, default="", db_default="")

    # Set on jobs a schedule enqueued: its name and the instant this run is for.
    # (The database defaults let code from before these columns keep inserting.)
    schedule = models.CharField(max_length=200, blank=True, default="", db_default="")
    scheduled_for = models.DateTimeField(null=True, blank=True)

    # Set on the jobs of a workflow or batch (``vellum_jobs.core.workflow_models``).
    workflow = models.ForeignKey(
        "vellum_jobs.Workflow",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="jobs",
    )
    # A job with upstream jobs: when it runs ("done": all ended done, the
    # default; "finished": whatever they ended as; "failed": one did not end
    # done), and what of theirs it is handed first ("result", "results",
    # "counts"); both empty for a job that waits for nothing.
    run_if = models.CharField(max_length=16, blank=True, default="", db_default="")
    upstream_arg = models.CharField(max_length=16, blank=True, default="", db_default="")

    objects = JobManager()

    class Meta:
        indexes = [
            # Mirrors the claim: WHERE state = 'queued' AND is_async = ... ORDER BY
            # priority DESC, run_after, id (threads and the event loop claim apart).
            PartialIndex(
                fields=["state", "is_async", "-priority", "run_after", "id"],
                name="vellum_job_claim",
                where=Q(state="queued"),
            ),
            # The reaper's scan for lapsed leases.
            PartialIndex(
                fields=["state", "lease_expires_at"], name="vellum_job_lease", where=Q(state="running")
            ),
            # for_object(); most jobs reference nothing and cost this index nothing.
            PartialIndex(
                fields=["ref_type", "ref_id"], name="vellum_job_ref", where=Q(ref_type__isnull=False)
            ),
            # The claim's checks on a job with a concurrency key: how many of
            # its key are running, and whether one of its key is ahead of it.
            # Only keyed jobs are in them (``KEYED``): most jobs have no key
            # and cost them no page at enqueue, claim or outcome.
            PartialIndex(
                fields=["concurrency_key", "state"],
                name="vellum_job_key_running",
                where=KEYED & Q(state="running"),
            ),
            PartialIndex(
                fields=["concurrency_key", "state", "-priority", "run_after", "id"],
                name="vellum_job_key_queued",
                where=KEYED & Q(state="queued"),
            ),
            # Pruning's scan: WHERE state = <a finished state> AND finished_at
            # < cutoff ORDER BY finished_at. Written as ORs, not IN: SQLite only
            # uses a partial index when a term of the query appears in it.
            PartialIndex(
                fields=["state", "finished_at"],
                name="vellum_job_finished",
                where=Q(state="done") | Q(state="failed") | Q(state="cancelled"),
            ),
            # The admin's list is newest first; filtered by state, name or
            # queue it walks one of these backwards and stops after a page.
            # The state one also counts a state without reading the rows.
            models.Index(fields=["state", "id"], name="vellum_job_state"),
            models.Index(fields=["name", "id"], name="vellum_job_name"),
            models.Index(fields=["queue", "id"], name="vellum_job_queue"),
            # A workflow's or batch's jobs by state: its progress, its cancel(),
            # and retention's check that it has finished.
            PartialIndex(
                fields=["workflow", "state"], name="vellum_job_workflow", where=Q(workflow__isnull=False)
            ),
            # A fair key's last turn, and the first turn in a queue (``enqueueing.fairness``):
            # only queued jobs with a turn are in them.
            # With state first: MariaDB/MySQL index every row, finished ones included.
            PartialIndex(fields=["state", "fair_key", "fair_at"], name="vellum_job_fair_key", where=FAIR),
            PartialIndex(fields=["state", "queue", "fair_at"], name="vellum_job_fair_turn", where=FAIR),
            # Finds the job that holds a unique key, to return it instead of a second one.
            PartialIndex(fields=["unique_key"], name="vellum_job_unique_key", where=UNIQUE),
        ]
        constraints = [
            # At most one job waiting to run per key (both scopes): a new one,
            # or one put back (a retry, a hand-back, a recovery, a prefetched
            # job unclaimed). And at most one queued or running per key among
            # "queued_or_running" jobs. A job put back while another waits
            # with its key ends superseded instead (``putback``).
            PartialUniqueConstraint(fields=["unique_key"], name="vellum_job_unique_queued", where=HOLDS_KEY),
            PartialUniqueConstraint(
                fields=["unique_key"],
                name="vellum_job_unique_running",
                where=UNIQUE & Q(unique_while="queued_or_running", state__in=["queued", "running"]),
            ),
            # One job per schedule and instant, however many processes enqueue it.
            PartialUniqueConstraint(
                fields=["schedule", "scheduled_for"],
                name="vellum_job_schedule_instant",
                where=Q(scheduled_for__isnull=False),
            ),
        ]

    # The attempt a worker is running this instance in (``current_job()``).
    _attempt: Attempt | None = None

    def __str__(self) -> str:
        return f"{self.name} #{self.pk} ({self.state})"

    @property
    def time_remaining(self) -> float | None:
        """Seconds left before this attempt times out, or None without a timeout."""
        return None if self._attempt is None else self._attempt.time_remaining

    def check_timeout(self) -> None:
        """Raise ``JobTimeout`` once this attempt has run past its timeout (for handlers that loop)."""
        if self._attempt is not None:
            self._attempt.check_timeout()

    def should_stop(self) -> bool:
        """Whether the handler should wrap up: cancelled, timed out, its worker is shutting down or
        could not renew its lease.

        A handler that was told so here and then returns has stopped early, and
        its value is not recorded as finished work: after a cancellation the job
        ends ``cancelled``, after a timeout the attempt fails as timed out, at a
        shutdown the job is queued again, its attempt not counted, and after a
        lost lease it is queued again as recovery would queue it.
        ``stop_reason`` says which.
        """
        return self._attempt is not None and self._attempt.should_stop()

    @property
    def stop_reason(self) -> str | None:
        """Why ``should_stop()`` is true: "cancelled", "timed out", "shutting down" or "lease lost";
        None while the handler may go on (and outside a worker)."""
        return None if self._attempt is None else self._attempt.stop_reason()

    @property
    def duration(self) -> timedelta | None:
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None

    def retry(self) -> bool:
        """Queue a failed or cancelled job again, due now, attempts starting over.

        False if it was in another state, or if it is a unique job and another
        job holds its key now. A job that never ran and waits for others waits
        again (``JobQuerySet.retry``).
        """
        changes = transitions.retried(clock.of(self._alias))
        if self.run_if:  # it may wait again instead (see JobQuerySet.retry)
            retried = bool(self._row().retry())
            self.refresh_from_db(fields=["state", "run_after", "attempts", "error", "finished_at"])
            return retried
        if self.unique_key is None:
            retried = self._transition(self._row().retryable(), changes)
        else:
            try:
                with transaction.atomic(using=self._state.db or "default"):
                    retried = self._transition(self._row().retryable(), changes)
            except IntegrityError:
                self.refresh_from_db(fields=["state", "run_after"])
                return False
        if retried and self.workflow_id is not None:
            _reopen_downstream(self._alias, [self.pk])
        return retried

    def cancel(self) -> bool:
        """Cancel a queued job, or ask a running one to stop; False if it had already finished.

        A running job's handler learns of the request through ``should_stop()``
        at its worker's next heartbeat; ``cancel_requested_at`` records it.
        """
        now = clock.of(self._alias)
        if self._transition(self._row().filter(transitions.cancellable()), transitions.cancelled(now)):
            if self.workflow_id is not None:
                _release_downstream(self._alias, [self.pk])
            return True
        if self._transition(self._row().filter(transitions.stoppable()), transitions.cancel_requested(now)):
            return True
        return self.state == Job.State.RUNNING  # asked before: the request stands

    def explain(self) -> list[Reason]:
        """Why this job has not started (or what became of it), most telling reason first."""
        from vellum_jobs.observe.explain import explain

        return explain([self])[self.pk]

    def run_now(self) -> bool:
        """Make a delayed queued job due now; False if it was not queued or already due.

        An already due job keeps its ``run_after``: moving it to now would put it
        behind jobs that became due after it.
        """
        now = clock.of(self._alias)
        return self._transition(self._row().delayed(now), {"run_after": now})

    @property
    def _alias(self) -> str:
        return self._state.db or "default"

    def _row(self) -> JobQuerySet:
        return Job.objects.using(self._alias).filter(pk=self.pk)

    def _transition(self, rows: JobQuerySet, changes: dict[str, Any]) -> bool:
        if not rows.update(**transitions.orm(changes)):
            with contextlib.suppress(Job.DoesNotExist):  # pruned meanwhile: nothing to change either
                self.refresh_from_db(fields=["state", "run_after", "cancel_requested_at"])
            return False
        transitions.apply(self, changes)
        return True


class Worker(models.Model):
    """A running ``runjobs`` process, kept alive by its heartbeat."""

    id = models.UUIDField(primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, blank=True, help_text="empty means all queues")
    threads = models.PositiveSmallIntegerField()
    async_workers = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="coroutine jobs it runs at once on its event loop (0: none)"
    )
    async_running = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="coroutine jobs running on its event loop at its last heartbeat"
    )
    connections = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text="database connections it held at its last heartbeat (at most threads + 4)",
    )
    stuck = models.PositiveSmallIntegerField(default=0, help_text="slots held by timed-out handlers")
    prefetched = models.JSONField(
        null=True,
        blank=True,
        help_text="ids of the jobs it had claimed ahead and no thread had started, at its last heartbeat",
    )
    trouble = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text="why it stopped claiming; empty while it claims",
    )
    names = models.JSONField(default=list, blank=True, help_text="job names it can run")
    # Empty (NULL) in rows of workers from before these columns.
    task_backends = models.JSONField(
        null=True, blank=True, help_text="the TASKS aliases whose Django tasks it runs"
    )
    unknown_tasks = models.JSONField(
        null=True, blank=True, help_text="Django tasks it could not import: it hands their jobs back"
    )
    clock_offset = models.FloatField(
        null=True,
        blank=True,
        help_text="seconds the database's clock is ahead of this host's (negative: behind); empty on SQLite",
    )
    jobs_run = models.PositiveBigIntegerField(
        default=0, db_default=0, help_text="attempts it has finished since it started, at its last heartbeat"
    )
    memory = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="bytes of memory its process held (resident set), at its last heartbeat",
    )
    stop_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when someone asked it to stop gracefully; it sees it at its next heartbeat",
    )
    stop_requested_by = models.CharField(
        max_length=255, blank=True, default="", db_default="", help_text="who asked it to stop"
    )
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["host", "pid"]

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    @property
    def is_alive(self) -> bool:
        return self.last_heartbeat >= clock.now() - timedelta(seconds=conf.lease)

    def knows(self, name: str, task_backend: str = "") -> bool:
        """Whether this worker can run jobs of ``name``: a name it registered, or (``task_backend``, a
        ``TASKS`` alias) a Django task of an alias it runs that it has not found unimportable."""
        if not task_backend:
            return name in (self.names or ())
        return task_backend in (self.task_backends or ()) and name not in (self.unknown_tasks or ())

    @property
    def clock_warning(self) -> str:
        """Why this host's clock is worth a look ("" while it agrees with the database's)."""
        offset = self.clock_offset
        return clock.describe(offset) if offset is not None and clock.is_off(offset) else ""


class Queue(models.Model):
    """A queue's switch: a paused queue keeps its jobs queued, and no worker claims them."""

    name = models.CharField(primary_key=True, max_length=100)
    paused_at = models.DateTimeField(null=True, blank=True, help_text="empty while the queue runs")
    paused_by = models.CharField(max_length=255, blank=True, default="", help_text="who paused it")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (paused)" if self.paused_at else self.name

    @property
    def is_paused(self) -> bool:
        return self.paused_at is not None


class QueueMinute(models.Model):
    """One queue's figures for one minute: what the dashboard's charts and the metrics draw on.

    Workers add the outcomes they wrote (``rollup``) at each heartbeat, and
    a heartbeat samples the oldest due job's age once a minute. Rows older
    than ``rollup.KEEP`` are deleted.
    """

    minute = models.DateTimeField(help_text="the minute's start")
    queue = models.CharField(max_length=200)
    done = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    cancelled = models.PositiveBigIntegerField(default=0)
    retried = models.PositiveBigIntegerField(default=0, help_text="attempts that failed and will be retried")
    lost = models.PositiveBigIntegerField(default=0, help_text="attempts lost with their worker")
    snoozed = models.PositiveBigIntegerField(
        default=0, db_default=0, help_text="attempts that asked to run again later (Retry): not failures"
    )
    oldest_due_age = models.FloatField(
        null=True, blank=True, help_text="the most seconds a due job had waited, in this minute's samples"
    )

    class Meta:
        ordering = ["minute", "queue"]
        constraints = [models.UniqueConstraint(fields=["minute", "queue"], name="vellum_minute_queue")]

    def __str__(self) -> str:
        return f"{self.queue} at {self.minute:%Y-%m-%d %H:%M}"


# The upper bounds, in seconds, of the histogram buckets ``NameMinute`` keeps of each attempt's
# duration and wait: column ``duration_<i>`` counts the attempts whose duration was above bound
# ``i - 1`` and at most bound ``i``. Fixed with the table: other bounds need new columns.
HISTOGRAM_BOUNDS: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    900,
    3600,
    float("inf"),
)


class NameMinute(models.Model):
    """One job name's figures for one minute: outcome counts, and histograms of its attempts'
    durations and waits (claim time minus due time) in the fixed buckets of ``HISTOGRAM_BOUNDS``.

    Workers add what they wrote at each heartbeat (``name_rollup``); minutes older than
    ``rollup.KEEP`` are folded into the name's row at ``rollup.BEGINNING`` and deleted.
    """

    minute = models.DateTimeField(help_text="the minute's start")
    name = models.CharField(max_length=200)
    done = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    cancelled = models.PositiveBigIntegerField(default=0)
    retried = models.PositiveBigIntegerField(default=0, help_text="attempts that failed and will be retried")
    lost = models.PositiveBigIntegerField(default=0, help_text="attempts lost with their worker")
    snoozed = models.PositiveBigIntegerField(
        default=0, help_text="attempts that asked to run again later (Retry): not failures"
    )
    duration_sum = models.FloatField(default=0.0, help_text="seconds the timed attempts ran, in all")
    wait_sum = models.FloatField(default=0.0, help_text="seconds the timed attempts waited, in all")
    duration_0 = models.PositiveBigIntegerField(default=0, help_text="duration at most 0.01 s")
    duration_1 = models.PositiveBigIntegerField(default=0, help_text="duration at most 0.05 s")
    duration_2 = models.PositiveBigIntegerField(default=0, help_text="duration at most 0.1 s")
    duration_3 = models.PositiveBigIntegerField(default=0, help_text="duration at most 0.25 s")
    duration_4 = models.PositiveBigIntegerField(default=0, help_text="duration at most 0.5 s")
    duration_5 = models.PositiveBigIntegerField(default=0, help_text="duration at most 1 s")
    duration_6 = models.PositiveBigIntegerField(default=0, help_text="duration at most 2.5 s")
    duration_7 = models.PositiveBigIntegerField(default=0, help_text="duration at most 5 s")
    duration_8 = models.PositiveBigIntegerField(default=0, help_text="duration at most 10 s")
    duration_9 = models.PositiveBigIntegerField(default=0, help_text="duration at most 30 s")
    duration_10 = models.PositiveBigIntegerField(default=0, help_text="duration at most 60 s")
    duration_11 = models.PositiveBigIntegerField(default=0, help_text="duration at most 120 s")
    duration_12 = models.PositiveBigIntegerField(default=0, help_text="duration at most 300 s")
    duration_13 = models.PositiveBigIntegerField(default=0, help_text="duration at most 900 s")
    duration_14 = models.PositiveBigIntegerField(default=0, help_text="duration at most 3600 s")
    duration_15 = models.PositiveBigIntegerField(default=0, help_text="duration more than 3600 s")
    wait_0 = models.PositiveBigIntegerField(default=0, help_text="wait at most 0.01 s")
    wait_1 = models.PositiveBigIntegerField(default=0, help_text="wait at most 0.05 s")
    wait_2 = models.PositiveBigIntegerField(default=0, help_text="wait at most 0.1 s")
    wait_3 = models.PositiveBigIntegerField(default=0, help_text="wait at most 0.25 s")
    wait_4 = models.PositiveBigIntegerField(default=0, help_text="wait at most 0.5 s")
    wait_5 = models.PositiveBigIntegerField(default=0, help_text="wait at most 1 s")
    wait_6 = models.PositiveBigIntegerField(default=0, help_text="wait at most 2.5 s")
    wait_7 = models.PositiveBigIntegerField(default=0, help_text="wait at most 5 s")
    wait_8 = models.PositiveBigIntegerField(default=0, help_text="wait at most 10 s")
    wait_9 = models.PositiveBigIntegerField(default=0, help_text="wait at most 30 s")
    wait_10 = models.PositiveBigIntegerField(default=0, help_text="wait at most 60 s")
    wait_11 = models.PositiveBigIntegerField(default=0, help_text="wait at most 120 s")
    wait_12 = models.PositiveBigIntegerField(default=0, help_text="wait at most 300 s")
    wait_13 = models.PositiveBigIntegerField(default=0, help_text="wait at most 900 s")
    wait_14 = models.PositiveBigIntegerField(default=0, help_text="wait at most 3600 s")
    wait_15 = models.PositiveBigIntegerField(default=0, help_text="wait more than 3600 s")

    class Meta:
        ordering = ["minute", "name"]
        constraints = [models.UniqueConstraint(fields=["minute", "name"], name="vellum_minute_name")]

    def __str__(self) -> str:
        return f"{self.name} at {self.minute:%Y-%m-%d %H:%M}"


class MaintenanceLock(models.Model):
    """A named lock that lets one process at a time, on any host, run a maintenance task."""

    name = models.CharField(primary_key=True, max_length=100)
    holder = models.CharField(max_length=100, help_text="the process that took it last")
    locked_until = models.DateTimeField(help_text="nobody else takes it before this time")

    def __str__(self) -> str:
        return f"{self.name} (held by {self.holder} until {self.locked_until:%Y-%m-%d %H:%M:%S})"


class UnknownName(models.Model):
    """A job name that no live worker knows, with queued jobs waiting for one: how long it has been so.

    Kept by the unknown-name duty (``vellum_jobs.maintenance.unknown_names``): time is
    counted only while some worker is alive to see it, and the row goes as
    soon as a live worker knows the name or no job of it is queued.
    """

    name = models.CharField(primary_key=True, max_length=200)
    since = models.DateTimeField(help_text="when a worker first found that no live worker knows it")
    checked_at = models.DateTimeField(help_text="when a worker last found so")
    unknown_for = models.FloatField(
        default=0, help_text="seconds it has been unknown, counted only while some worker was alive"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (unknown for {self.unknown_for:.0f}s)"


class Schedule(models.Model):
    """What the database knows of a schedule: which of its instants have been dealt with.

    The schedule itself (cron, job, arguments) is declared in code or
    settings; this row records its runs so that every process agrees.
    """

    name = models.CharField(primary_key=True, max_length=200)
    first_seen = models.DateTimeField(default=timezone.now, help_text="when a worker first saw it")
    last_instant = models.DateTimeField(
        null=True, blank=True, help_text="the latest instant dealt with: enqueued or skipped as missed"
    )
    last_run_at = models.DateTimeField(null=True, blank=True, help_text="the latest instant enqueued")
    last_job_id = models.BigIntegerField(null=True, blank=True, help_text="the job enqueued for it")
    disabled_at = models.DateTimeField(
        null=True, blank=True, help_text="when it was disabled: no worker enqueues its instants until enabled"
    )
    disabled_by = models.CharField(
        max_length=255, blank=True, default="", db_default="", help_text="who disabled it"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
