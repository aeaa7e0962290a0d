"""``batch()``: jobs enqueued together, with callbacks that run once, after every one has ended.

Inside the block, ``enqueue()`` and ``enqueue_many()`` put their jobs in the
batch (``Job.workflow``). On leaving it, each callback is inserted waiting
for every job of the batch (one INSERT ... SELECT of its edges, whatever the
batch's size), and the whole batch commits in the block's own transaction.
Nothing here imports a model at import time: ``from vellum_jobs import batch``
works in any ``jobs.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS, router, transaction

if TYPE_CHECKING:
    from vellum_jobs.core.workflow_models import Workflow
    from vellum_jobs.enqueueing.canvas import Step

_current: ContextVar[int | None] = ContextVar("vellum_jobs_batch", default=None)


def current_id() -> int | None:
    """The open batch's id, which jobs enqueued now join; None outside ``batch()``."""
    return _current.get()


@contextmanager
def batch(
    *, on_done: Step | None = None, on_failure: Step | None = None, name: str = ""
) -> Iterator[Workflow]:
    """Enqueue a batch: the jobs enqueued in the block, then its callbacks, in one transaction.

    When every job of the batch has ended, exactly one callback runs: ``on_done``
    if all ended done, else ``on_failure``. Each is called with the counts by
    outcome first (``{"total": 3, "done": 2, "failed": 1, "cancelled": 0}``),
    then its own arguments. An exception in the block leaves nothing behind.
    """
    from vellum_jobs.core import clock
    from vellum_jobs.core.models import Job
    from vellum_jobs.core.workflow_models import Workflow

    for label, step in (("on_done", on_done), ("on_failure", on_failure)):
        _check_step(label, step)
    alias = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    with transaction.atomic(using=alias):
        created = clock.of(alias)
        workflow = Workflow.objects.using(alias).create(
            kind=Workflow.Kind.BATCH, name=name, created_at=created
        )
        token = _current.set(workflow.pk)
        try:
            yield workflow
        finally:
            _current.reset(token)
        for step, run_if in ((on_done, "done"), (on_failure, "failed")):
            if step is not None:
                _add_callback(alias, workflow.pk, step, run_if)


def _check_step(label: str, step: object) -> None:
    from vellum_jobs.enqueueing.canvas import Step

    if step is not None and not isinstance(step, Step):
        raise TypeError(f"batch({label}=...) takes a step such as notify.s(), got {step!r}")
    if step is not None and step.function.options.unique_key is not None:
        raise ValueError(
            f"batch({label}=...): {step.function.name} is a unique job: it cannot wait for others"
        )


def _add_callback(alias: str, workflow: int, step: Step, run_if: str) -> None:
    """Insert ``step`` waiting for every job of the batch, and release it if they have all ended."""
    from vellum_jobs.core import dependencies, links, transitions, upstream
    from vellum_jobs.enqueueing.rows import enqueue_calls
    from vellum_jobs.execution import inline

    columns = {
        "state": transitions.WAITING,
        "workflow_id": workflow,
        "run_if": run_if,
        "upstream_arg": upstream.COUNTS,
    }
    (callback,) = enqueue_calls(step.function, [(step.args, step.kwargs)], columns=columns)
    links.link_members(alias, callback.pk, workflow)
    if dependencies.release(alias, [callback.pk]):
        callback.refresh_from_db(fields=["state", "run_after", "error", "finished_at"])
        if inline.enabled() and callback.state == transitions.QUEUED:
            inline.run_now([callback])
