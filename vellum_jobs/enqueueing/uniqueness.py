"""Unique jobs: while one job holds a key, enqueueing another with that key returns it instead.

The database decides, not Python: ``Job.Meta.constraints`` has partial
unique indexes on ``unique_key`` (on MySQL/MariaDB, unique indexes on
generated columns; see ``PartialUniqueConstraint``). An enqueue tries its
INSERT, on its own outside a transaction (one statement, the usual case
of a free key costs no more than any enqueue), in a savepoint inside the
caller's; of any number of concurrent inserts with one key, exactly one
gets in. The others fail with an ``IntegrityError``, find the job that
holds the key, and apply the conflict policy to it: keep it as it is
(a plain SELECT), replace its arguments, or push its ``run_after`` later
(debounce; both under a row lock, in a transaction). If the holder
started or finished in between, the key is free and the insert is tried
again. Jobs without a key never come here.

A queued job holds its key however it came back to the queue (a retry, a
hand-back, a recovery): one put back while another waits with its key ends
superseded instead (``putback``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Q

from vellum_jobs.core.models import HOLDS_KEY, Job
from vellum_jobs.core.options import Options
from vellum_jobs.store import transient_errors

logger = logging.getLogger("vellum_jobs")

# Inserts tried before giving up; each retry means the holder left in between.
ATTEMPTS = 5


def key_for(options: Options, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """The unique key of one call: the string given, or what the key function returns for it."""
    key = options.unique_key
    if callable(key):
        key = key(*args, **kwargs)
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= 255):
        raise ValueError(f"unique_key must give a string of 1 to 255 characters or None, got {key!r}")
    return key


def holding(key: str, unique_while: str) -> Q:
    """The jobs whose key would stop a new job with ``unique_while`` (the indexes' conditions)."""
    waiting = HOLDS_KEY
    if unique_while == "queued_or_running":
        waiting |= Q(unique_while="queued_or_running", state__in=[Job.State.QUEUED, Job.State.RUNNING])
    return Q(unique_key=key) & waiting


def enqueue(
    alias: str,
    insert_one: Callable[[], Job],
    *,
    key: str,
    options: Options,
    args: list[Any],
    kwargs: dict[str, Any],
    run_after: datetime,
) -> tuple[Job, bool]:
    """Insert the job with ``insert_one``, or apply the conflict policy to the job holding ``key``.

    Returns the job and whether it is new.
    """

    def attempt() -> tuple[Job, bool]:
        with transaction.atomic(using=alias):
            return _insert_or_resolve(alias, insert_one, key, options, args, kwargs, run_after)

    if connections[alias].in_atomic_block:
        # Inside the caller's transaction a deadlock rolls it all back: retrying is theirs to do.
        return attempt()

    def alone() -> tuple[Job, bool]:
        # In autocommit the INSERT is its own transaction; if it fails, nothing is left to undo.
        try:
            return insert_one(), True
        except IntegrityError:
            pass
        # Only changing the holder needs its row locked, in a transaction.
        with transaction.atomic(using=alias) if options.on_conflict != "keep" else nullcontext():
            return _insert_or_resolve(alias, insert_one, key, options, args, kwargs, run_after, tried=True)

    # Alone, a MySQL deadlock with a claim of the holder (or a busy SQLite) is worth riding out.
    return transient_errors.retry(alone, what="enqueue unique job", alias=alias, give_up_after=10)


def _insert_or_resolve(
    alias: str,
    insert_one: Callable[[], Job],
    key: str,
    options: Options,
    args: list[Any],
    kwargs: dict[str, Any],
    run_after: datetime,
    *,
    tried: bool = False,
) -> tuple[Job, bool]:
    """The new job, or the holder of its key with the policy applied (``tried``: the INSERT just failed)."""
    for attempt in range(ATTEMPTS):
        if attempt or not tried:
            try:
                with transaction.atomic(using=alias):
                    return insert_one(), True
            except IntegrityError:
                if attempt == ATTEMPTS - 1:
                    raise
        rows = Job.objects.using(alias).filter(holding(key, options.unique_while)).order_by("id")
        if options.on_conflict != "keep":
            rows = rows.select_for_update()
        holder = rows.first()
        if holder is not None:
            _resolve(holder, options.on_conflict, args, kwargs, run_after)
            logger.debug(
                "%s #%s already holds the unique key; no new job enqueued job_id=%s name=%s key=%s policy=%s",
                holder.name,
                holder.pk,
                holder.pk,
                holder.name,
                key,
                options.on_conflict,
            )
            return holder, False
    raise AssertionError("unreachable")  # pragma: no cover


def _resolve(
    holder: Job, on_conflict: str, args: list[Any], kwargs: dict[str, Any], run_after: datetime
) -> None:
    """Apply the conflict policy to the job holding the key (locked by the caller)."""
    if holder.state != Job.State.QUEUED:
        return  # a running job's arguments and time are its own
    rows = Job.objects.using(holder._state.db).filter(pk=holder.pk, state=Job.State.QUEUED)
    if on_conflict == "replace" and (holder.args, holder.kwargs) != (args, kwargs):
        rows.update(args=args, kwargs=kwargs)
        holder.args, holder.kwargs = args, kwargs
    elif on_conflict == "debounce" and holder.run_after < run_after:
        rows.update(run_after=run_after)
        holder.run_after = run_after
