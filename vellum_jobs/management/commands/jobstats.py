"""``manage.py jobstats``: print the queue's figures from ``stats.collect``, as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils import timezone

from vellum_jobs import stats
from vellum_jobs.models import Job, Worker


class Command(BaseCommand):
    help = "Show job counts by state and by name, the oldest due job's wait, and live and stale workers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="print the figures as JSON (for monitoring): states, names, oldest_queued_age, "
            "workers, schedules",
        )
        parser.add_argument("--database", default="default", help="the database alias that holds the jobs")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] not in connections:
            raise CommandError(f"--database {options['database']!r} is not in DATABASES")
        figures = stats.collect(options["database"])
        scheduled = stats.schedule_figures(options["database"])
        if options["json"]:
            self.stdout.write(json.dumps({**figures, "schedules": scheduled}, indent=2))
        else:
            workers = Worker.objects.using(options["database"]).order_by("host", "pid")
            lines = [*table(figures), *worker_lines(workers, timezone.now()), *schedule_lines(scheduled)]
            self.stdout.write("\n".join(lines))


def table(figures: stats.Figures) -> list[str]:
    """The figures as lines of text for a person."""
    states = list(Job.State.values)
    width = max([len("(all)"), *(len(name) for name in figures["names"])])
    columns = [max(len(state), 6) for state in states]

    def row(label: str, values: list[Any]) -> str:
        cells = "  ".join(f"{value!s:>{w}}" for value, w in zip(values, columns, strict=True))
        return f"{label:<{width}}  {cells}".rstrip()

    lines = [row("name", states), row("(all)", [figures["states"][s] for s in states])]
    lines += [row(name, [counts[s] for s in states]) for name, counts in figures["names"].items()]
    age = figures["oldest_queued_age"]
    workers = figures["workers"]
    lines += [
        "",
        f"oldest due job waiting: {'none' if age is None else duration(age)}",
        f"workers: {workers['alive']} alive, {workers['stale']} stale",
    ]
    return lines


def worker_lines(workers: Iterable[Worker], now: datetime) -> list[str]:
    """A line per worker process, so a stale one can be traced to its host."""
    return [
        f"  {worker}  {'alive' if worker.is_alive else 'stale'}  threads {worker.threads}  "
        f"connections {worker.connections}  queues {', '.join(worker.queues) or 'all'}  "
        f"last heartbeat {duration((now - worker.last_heartbeat).total_seconds())} ago"
        for worker in workers
    ]


def schedule_lines(scheduled: dict[str, stats.ScheduleFigures]) -> list[str]:
    """A line per schedule: its cron, job, last and next run."""
    if not scheduled:
        return []
    lines = ["", f"schedules: {len(scheduled)}"]
    for name, figures in scheduled.items():
        last = figures["last_run"] or "never"
        lines.append(
            f"  {name}  {figures['cron']} ({figures['timezone']})  job {figures['job']}  "
            f"last run {last}  next run {figures['next_run']}"
        )
    return lines


def duration(seconds: float) -> str:
    """``seconds`` the way a person reads it: "0.4s", "42s", "3m 20s", "2h 5m", "3d 4h"."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    units = ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s"))
    for big, big_unit, small, small_unit in units:
        if whole >= big:
            return f"{whole // big}{big_unit} {whole % big // small}{small_unit}"
    return f"{whole}s"
