"""``manage.py jobstats``: the queue's figures (``observe.figures``) as a table or JSON, once or watched."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils import timezone

from vellum_jobs.core.models import Job, Worker
from vellum_jobs.observe import figures, limits

# The throttled limit keys listed at most (the admin's Limits page lists every key).
THROTTLED_SHOWN = 10


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
        parser.add_argument(
            "--watch",
            action="store_true",
            help="redraw the figures every --interval until Ctrl-C; with --json, print one JSON document "
            "per line instead",
        )
        parser.add_argument(
            "--interval", type=seconds, default=None, help="seconds between readings of --watch (default 1)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias not in connections:
            raise CommandError(f"--database {alias!r} is not in DATABASES")
        if options["interval"] is not None and not options["watch"]:
            raise CommandError("--interval is the pace of --watch: add --watch")
        if options["watch"]:
            self.watch(alias, options["interval"] or 1.0, as_json=options["json"])
        elif options["json"]:
            self.stdout.write(json.dumps(document(alias), indent=2))
        else:
            self.stdout.write("\n".join(report(alias, timezone.now())))

    def watch(self, alias: str, interval: float, as_json: bool) -> None:
        """Each ``interval``, the figures over the last ones on a terminal (else after them), until Ctrl-C."""
        on_terminal = self.stdout.isatty()
        try:
            for _ in ticks(interval):
                if as_json:
                    text = json.dumps(document(alias)) + "\n"
                else:
                    size = shutil.get_terminal_size() if on_terminal else None  # it may have been resized
                    text = redraw(frame(alias, timezone.now(), interval), size)
                self.stdout.write(text, ending="")
                self.stdout.flush()
        except KeyboardInterrupt:
            # Ctrl-C is how a watch ends: exit 0, and the shell's prompt on a line of its own.
            self.stdout.write("")


def seconds(text: str) -> float:
    """``--interval``: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def document(alias: str) -> dict[str, Any]:
    """What ``--json`` prints: the figures and the schedules."""
    return {**figures.collect(alias), "schedules": figures.schedule_figures(alias)}


def report(alias: str, now: datetime) -> list[str]:
    """The figures, the workers and the schedules as lines of text for a person."""
    workers = Worker.objects.using(alias).order_by("host", "pid")
    scheduled = figures.schedule_figures(alias, now)
    return [
        *table(figures.collect(alias, now)),
        *worker_lines(workers, now),
        *schedule_lines(scheduled),
        *limit_lines(limits.overview(alias, now)),
    ]


# -- --watch ---------------------------------------------------------------

# ANSI escapes: cursor home, erase to the end of the line, erase below the cursor.
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


def ticks(interval: float) -> Iterator[None]:
    """Forever, one every ``interval`` seconds from the start of the last; a slow one is followed at once."""
    while True:
        started = time.monotonic()
        yield
        time.sleep(max(started + interval - time.monotonic(), 0.0))


def frame(alias: str, now: datetime, interval: float) -> list[str]:
    """One reading of ``--watch``: a header with the time, then what ``jobstats`` prints."""
    # With USE_TZ = False, now is naive, in the current time zone.
    local = timezone.localtime(now) if timezone.is_aware(now) else timezone.make_aware(now)
    header = f"jobstats  {local:%Y-%m-%d %H:%M:%S %Z}  every {interval:g}s  Ctrl-C to stop"
    return [header, "", *report(alias, now)]


def redraw(lines: list[str], size: os.terminal_size | None) -> str:
    """The text that shows ``lines``: in place on a terminal of ``size``, else after the last frame.

    On a terminal each line overwrites the last frame's and what is left of
    that is erased, which does not flicker as clearing the screen first
    does; lines are cut to the screen, so that nothing scrolls.
    """
    if size is None:
        return "\n".join(lines) + "\n\n"
    shown = [line[: size.columns] + CLEAR_LINE for line in lines[: size.lines - 1]]
    return HOME + "\n".join(shown) + "\n" + CLEAR_BELOW


def table(figures: figures.Figures) -> list[str]:
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
        *(f"  warning: {off}" for off in workers["clocks_off"]),
    ]
    return lines


def worker_lines(workers: Iterable[Worker], now: datetime) -> list[str]:
    """A line per worker process, so a stale one can be traced to its host."""
    return [
        f"  {worker}  {'alive' if worker.is_alive else 'stale'}  threads {worker.threads}  "
        f"connections {worker.connections}  queues {', '.join(worker.queues) or 'all'}  "
        f"last heartbeat {duration((now - worker.last_heartbeat).total_seconds())} ago"
        + (f"  {worker.clock_warning}" if worker.clock_warning else "")
        for worker in workers
    ]


def schedule_lines(scheduled: dict[str, figures.ScheduleFigures]) -> list[str]:
    """A line per schedule: its cron, job, last and next run."""
    if not scheduled:
        return []
    lines = ["", f"schedules: {len(scheduled)}"]
    for name, schedule in scheduled.items():
        last = schedule["last_run"] or "never"
        lines.append(
            f"  {name}  {schedule['cron']} ({schedule['timezone']})  job {schedule['job']}  "
            f"last run {last}  next run {schedule['next_run']}"
        )
    return lines


def limit_lines(overview: limits.Overview) -> list[str]:
    """The limit keys in use and a line per throttled one (held, or full with jobs waiting); none
    without limits."""
    if not overview.keys:
        return []
    throttled = overview.throttled
    lines = ["", f"limit keys: {len(overview.keys)} in use, {len(throttled)} throttled"]
    for key in throttled[:THROTTLED_SHOWN]:
        why = [f"{limit.kind} {limit.use_text}" for limit in key.limits if limit.full]
        if key.hold is not None:
            until = (
                timezone.localtime(key.hold.until) if timezone.is_aware(key.hold.until) else key.hold.until
            )
            reason = f": {key.hold.reason}" if key.hold.reason else ""
            why.insert(0, f"held until {until:%Y-%m-%d %H:%M:%S}{reason}")
        lines.append(f"  {key.key}  {'; '.join(why)}  jobs waiting {overview.at_least}{key.waiting}")
    if len(throttled) > THROTTLED_SHOWN:
        lines.append(f"  and {len(throttled) - THROTTLED_SHOWN} more")
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
