"""Choosing jobs on the command line: by id, or by state, name and queue as the admin's filters do."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError

from vellum_jobs.core.models import Job, JobQuerySet


def add_filters(parser: argparse.ArgumentParser) -> None:
    """The filters ``list``, ``retry`` and ``cancel`` share: each repeatable, values of one OR-ed."""
    parser.add_argument(
        "--state",
        action="append",
        default=[],
        choices=Job.State.values,
        help="only jobs in this state (repeatable)",
    )
    parser.add_argument("--name", action="append", default=[], help="only jobs of this name (repeatable)")
    parser.add_argument("--queue", action="append", default=[], help="only jobs of this queue (repeatable)")


def filtered(alias: str, options: dict[str, Any]) -> JobQuerySet:
    """The jobs the filters in ``options`` choose, newest first."""
    jobs = Job.objects.using(alias).all()
    if options["state"]:
        jobs = jobs.filter(state__in=options["state"])
    if options["name"]:
        jobs = jobs.filter(name__in=options["name"])
    if options["queue"]:
        jobs = jobs.filter(queue__in=options["queue"])
    return jobs.order_by("-id")


def has_filter(options: dict[str, Any]) -> bool:
    return bool(options["state"] or options["name"] or options["queue"])


def described(options: dict[str, Any]) -> str:
    """The filters in words: ``state failed, name mail.send``; ``every job`` when none is given."""
    parts = [f"{key} {' or '.join(options[key])}" for key in ("state", "name", "queue") if options[key]]
    return ", ".join(parts) or "every job"


def by_id(alias: str, ids: list[int]) -> list[Job]:
    """The jobs with these ids, in that order; a ``CommandError`` naming the ids no job has."""
    found = {job.pk: job for job in Job.objects.using(alias).filter(pk__in=ids)}
    missing = [pk for pk in ids if pk not in found]
    if missing:
        raise CommandError(f"no job with id {', '.join(map(str, missing))}")
    return [found[pk] for pk in ids]
