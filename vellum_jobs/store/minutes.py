"""What the two per-minute rollups share: the outcomes they count, their minutes, how long they keep them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, models, transaction

from vellum_jobs.conf import conf

# What an attempt's end counts as, and the column it adds to. A snoozed attempt is
# queued again without using an attempt (the handler raised ``Retry``, or handed the
# job back): not a failure.
DONE, FAILED, CANCELLED, RETRIED, LOST, SNOOZED = "done", "failed", "cancelled", "retried", "lost", "snoozed"
OUTCOMES = (DONE, FAILED, CANCELLED, RETRIED, LOST, SNOOZED)
# The outcomes that are failed attempts, for failure rates.
FAILURES = (FAILED, RETRIED, LOST)

# Rows older than this are deleted: the longest chart spans a day.
KEEP = timedelta(hours=25)
# The minute of the row that holds the counts of minutes deleted.
BEGINNING = datetime(2000, 1, 1, tzinfo=UTC)


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def stored(moment: datetime) -> datetime:
    """``moment`` (in UTC) as Django stores datetimes: naive with ``USE_TZ = False``, whose
    ``TIME_ZONE`` is UTC (check E019); SQLite and MySQL refuse an aware one then."""
    return moment if conf.use_tz else moment.replace(tzinfo=None)


def upsert(
    model: type[models.Model], alias: str, key: dict[str, Any], update: dict[str, Any], insert: dict[str, Any]
) -> None:
    """Apply ``update`` to the row of ``model`` at ``key``, or create it with ``insert`` if there is none
    (an UPDATE first: after a minute's first write every later one is a single statement)."""
    rows = model._default_manager.using(alias).filter(**key)
    if rows.update(**update):
        return
    try:
        with transaction.atomic(using=alias):
            model._default_manager.using(alias).create(**key, **insert)
    except IntegrityError:  # another process inserted the row first
        rows.update(**update)


@dataclasses.dataclass
class Bucket:
    """The figures of one step of a chart: outcome counts, and the largest oldest-due age sampled."""

    start: datetime
    counts: dict[str, int]
    oldest_due_age: float | None = None
