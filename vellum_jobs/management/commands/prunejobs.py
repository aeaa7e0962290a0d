"""``manage.py prunejobs``: parse options, delete finished jobs through ``retention.prune``."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils import timezone

from vellum_jobs.conf import RETENTION_STATES, parse_duration
from vellum_jobs.maintenance import retention

_SECONDS = re.compile(r"^\s*\d+(\.\d+)?\s*$")


class Command(BaseCommand):
    help = "Delete jobs that finished longer ago than --older-than, in small batches; never queued or running"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="DURATION",
            help='delete jobs that finished longer ago than this: seconds or "90s", "15m", "12h", "7d"',
        )
        parser.add_argument(
            "--state",
            action="append",
            default=[],
            dest="states",
            metavar="STATE",
            help=f"a state to prune (repeatable; default {', '.join(RETENTION_STATES)})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count the jobs it would delete, delete none"
        )
        parser.add_argument("--database", default="default", help="the database alias that holds the jobs")

    def handle(self, *args: Any, **options: Any) -> None:
        age = _older_than(options["older_than"])
        states = _states(options["states"])
        if options["database"] not in connections:
            raise CommandError(f"--database {options['database']!r} is not in DATABASES")
        cutoff = timezone.now() - timedelta(seconds=age)  # at most MAX_DURATION: no overflow
        pruned = retention.prune(
            options["database"], dict.fromkeys(states, cutoff), dry_run=options["dry_run"]
        )
        if options["verbosity"] < 1:
            return
        verb = "Would delete" if options["dry_run"] else "Deleted"
        by_state = ", ".join(f"{state} {n}" for state, n in pruned.counts.items())
        self.stdout.write(
            f"{verb} {pruned.total} {'job' if pruned.total == 1 else 'jobs'} "
            f"that finished more than {_human(age)} ago ({by_state})."
        )


def _older_than(value: object) -> float:
    # On the command line a bare number is seconds, as an int is in settings.
    if isinstance(value, str) and _SECONDS.match(value):
        value = float(value)
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise CommandError(f"--older-than {exc}") from None


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _states(given: list[str]) -> list[str]:
    for state in given:
        if state not in RETENTION_STATES:
            never = " (queued and running jobs are never pruned)" if state in ("queued", "running") else ""
            raise CommandError(
                f"--state {state!r} cannot be pruned: use {', '.join(RETENTION_STATES)}{never}"
            )
    # Repeats collapse; the order is the states' own.
    return [state for state in RETENTION_STATES if state in given] or list(RETENTION_STATES)
