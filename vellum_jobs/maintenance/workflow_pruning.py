"""Pruning a workflow's (or batch's) jobs together, with their edges and the workflow's row.

A step is never pruned on its own: the jobs after it read its result and its
end (``upstream()``, a batch's counts), and a retried step makes them wait
again. So plain retention leaves the jobs of a workflow alone, and here a
workflow goes whole once

- every job of it has ended (none waiting, queued or running), in states
  ``cutoffs`` prunes (a state kept forever keeps its workflows);
- its newest end is older than the cutoff of each state among its jobs:
  the longest retention of its states, counted from the workflow's end;
- no unended job of another workflow waits for one of its jobs
  (``after=`` may reach across workflows).

Workflows are walked in id order, a chunk at a time, up to the first one
created after the newest cutoff (ids grow with time), so the young ones cost
nothing. Each is checked with probes on ``vellum_job_workflow``; the one
that reads rows ("any job that ended after the cutoff") stops at the first
young job, and reads a whole workflow only when it is about to be deleted.

Deleting goes in short transactions of at most ``batch_size`` jobs, as plain
retention's do: small workflows several to a transaction, a large one over
several. Each locks its rows first and then checks again, so a step retried
or a job enqueued after a step meanwhile keeps its workflow. A workflow
larger than a batch whose step is retried between two of its transactions
keeps the jobs it has left, which go once it has ended and aged again.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, MutableMapping
from datetime import datetime

from django.db import connections
from django.db.models import Count, Exists, OuterRef, Q

from vellum_jobs.core import transitions
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency, Workflow
from vellum_jobs.store import lock_waits

UNENDED = tuple(state for state in transitions.State.values if state not in transitions.FINISHED_STATES)
# Workflows looked at per query.
CHUNK = 100


def prune(
    alias: str,
    cutoffs: Mapping[str, datetime],
    counts: MutableMapping[str, int],
    *,
    dry_run: bool,
    batch_size: int,
    deadline: float | None,
) -> bool:
    """Delete (or count, in a dry run) the jobs of the workflows that have ended before ``cutoffs``,
    adding them to ``counts`` by state; False if ``deadline`` stopped it with some left."""
    if not cutoffs:
        return True
    newest = max(cutoffs.values())
    after = 0
    while True:
        chunk = list(
            Workflow.objects.using(alias)
            .filter(pk__gt=after)
            .order_by("pk")
            .values_list("pk", "created_at")[:CHUNK]
        )
        old = [pk for pk, created in chunk if created < newest]
        ended = _ended(alias, old, cutoffs)
        if dry_run:
            _count(alias, ended, counts)
        elif not _delete(alias, ended, cutoffs, counts, batch_size, deadline):
            return False
        if len(chunk) < CHUNK or len(old) < len(chunk):
            return True  # the last workflow, or one created after the newest cutoff
        after = chunk[-1][0]


def _ended(alias: str, ids: list[int], cutoffs: Mapping[str, datetime]) -> list[int]:
    """Those of workflows ``ids`` whose jobs may all go (see the module docstring), in id order."""
    if not ids:
        return []
    steps = Job.objects.filter(workflow_id=OuterRef("pk"))
    kept = [state for state in transitions.State.values if state not in cutoffs]
    whole = Q(~Exists(steps.filter(state__in=kept)))
    # The longest retention first: a young workflow fails on its first probe.
    for state, cutoff in sorted(cutoffs.items(), key=lambda item: item[1]):
        young = steps.filter(Q(finished_at__gte=cutoff) | Q(finished_at__isnull=True))
        whole &= ~(Exists(steps.filter(state=state)) & Exists(young))
    waited_for = Dependency.objects.filter(upstream__workflow_id=OuterRef("pk"), job__state__in=UNENDED)
    rows = Workflow.objects.using(alias).filter(whole, pk__in=ids).filter(~Exists(waited_for))
    return list(rows.order_by("pk").values_list("pk", flat=True))


def _count(alias: str, workflows: list[int], counts: MutableMapping[str, int]) -> None:
    rows = Job.objects.using(alias).filter(workflow_id__in=workflows).values_list("state")
    for state, n in rows.annotate(n=Count("pk")).order_by():
        counts[state] += n


def _delete(
    alias: str,
    workflows: list[int],
    cutoffs: Mapping[str, datetime],
    counts: MutableMapping[str, int],
    batch_size: int,
    deadline: float | None,
) -> bool:
    sizes = dict(
        Job.objects.using(alias)
        .filter(workflow_id__in=workflows)
        .values_list("workflow_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    groups = list(_packed(workflows, sizes, batch_size))
    for i, group in enumerate(groups):
        while group:
            ids = list(
                Job.objects.using(alias)
                .filter(workflow_id__in=group)
                .values_list("pk", flat=True)[:batch_size]
            )
            work = functools.partial(_delete_batch, alias, group, ids, cutoffs)
            live, deleted = lock_waits.short_transaction(alias, work, what="prune workflow batch")
            for state in deleted:
                counts[state] += 1
            group = [pk for pk in group if pk not in live]
            if len(ids) < batch_size:
                break  # the group's last batch
            if _past(deadline):
                return False
        if i < len(groups) - 1 and _past(deadline):
            return False
    return True


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _packed(workflows: list[int], sizes: Mapping[int, int], batch_size: int) -> Iterator[list[int]]:
    """``workflows`` in groups of at most ``batch_size`` jobs, or one workflow larger than that."""
    group: list[int] = []
    total = 0
    for pk in workflows:
        size = sizes.get(pk, 0)
        if group and total + size > batch_size:
            yield group
            group, total = [], 0
        group.append(pk)
        total += size
    if group:
        yield group


def _delete_batch(
    alias: str,
    workflows: list[int],
    ids: list[int],
    cutoffs: Mapping[str, datetime],
) -> tuple[set[int], list[str]]:
    """Delete jobs ``ids`` of ``workflows`` and their edges, then the rows of those workflows left with
    no job, in the caller's transaction. Returns the workflows found live, which keep their jobs, and
    the states of the jobs deleted."""
    rows = Job.objects.using(alias).filter(pk__in=ids)
    if connections[alias].features.has_select_for_update:
        rows = rows.select_for_update()  # in id order: no cycle with another prune
    locked = list(rows.order_by("pk").values_list("pk", "workflow_id", "state", "finished_at"))
    # Checked after the locks: a step retried, or a job enqueued after one of these, since they were
    # found. Each statement reads what has committed by then (READ COMMITTED; SQLite's write lock).
    live = {wf for _, wf, state, at in locked if at is None or at >= cutoffs.get(state, at)}
    live |= set(
        Job.objects.using(alias)
        .filter(workflow_id__in=workflows, state__in=UNENDED)
        .values_list("workflow_id", flat=True)
        .distinct()
    )
    by_pk = {pk: wf for pk, wf, _, _ in locked}
    waited = Dependency.objects.using(alias).filter(upstream_id__in=by_pk, job__state__in=UNENDED)
    live |= {by_pk[pk] for pk in waited.values_list("upstream_id", flat=True)}
    doomed = [(pk, state) for pk, wf, state, _ in locked if wf not in live]
    pks = [pk for pk, _ in doomed]
    if pks:
        Job.objects.using(alias).filter(pk__in=pks).delete()
        # Both ways, each through its own index.
        Dependency.objects.using(alias).filter(job_id__in=pks).delete()
        Dependency.objects.using(alias).filter(upstream_id__in=pks).delete()
    empty = Workflow.objects.using(alias).filter(pk__in=[wf for wf in workflows if wf not in live])
    empty.filter(~Exists(Job.objects.filter(workflow_id=OuterRef("pk")))).delete()
    return live, [state for _, state in doomed]
