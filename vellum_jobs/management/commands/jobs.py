"""``manage.py jobs``: list, show, retry and cancel jobs; pause and resume queues; say why a job waits."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.db.models import Q
from django.utils.translation import ngettext

from vellum_jobs import queues
from vellum_jobs.core import transitions
from vellum_jobs.core.models import Job, JobQuerySet, Queue
from vellum_jobs.management import job_text, selection
from vellum_jobs.observe.explain import explain


class Command(BaseCommand):
    help = (
        "Look into jobs and act on them: list and show jobs, retry or cancel them by id or by filter,"
        " pause or resume a queue, explain why a job waits."
    )
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default", help="the database alias that holds the jobs")
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        listing = actions.add_parser("list", help="list jobs, newest first, with the error's headline")
        selection.add_filters(listing)
        listing.add_argument("--limit", type=int, default=50, help="show at most this many jobs (default 50)")
        listing.add_argument("--json", action="store_true", help="print the jobs as a JSON list")

        show = actions.add_parser("show", help="show a job: state, error, attempts, why it waits, result")
        show.add_argument("ids", nargs="+", type=int, metavar="ID", help="a job's id")

        for name, help_text in (
            ("retry", "queue failed or cancelled jobs again, due now, attempts starting over"),
            ("cancel", "cancel queued jobs, ask running ones to stop"),
        ):
            act = actions.add_parser(name, help=f"{help_text}; by id or by filter")
            act.add_argument("ids", nargs="*", type=int, metavar="ID", help="a job's id")
            selection.add_filters(act)
            act.add_argument(
                "--yes",
                "-y",
                "--no-input",
                "--noinput",
                action="store_true",
                dest="yes",
                help="act on the jobs a filter chooses without asking first (required without a terminal)",
            )

        pause = actions.add_parser("pause", help="stop workers from claiming the queue's jobs")
        pause.add_argument("queues", nargs="+", metavar="QUEUE", help="a queue's name")
        pause.add_argument(
            "--create",
            action="store_true",
            help="pause a queue no job has used yet (without it, an unknown name is refused: a likely typo)",
        )
        resume = actions.add_parser("resume", help="let workers claim the queue's jobs again")
        resume.add_argument("queues", nargs="+", metavar="QUEUE", help="a queue's name")
        actions.add_parser("queues", help="list paused queues")
        why = actions.add_parser("explain", help="why a job has not started")
        why.add_argument("ids", nargs="+", type=int, metavar="ID", help="a job's id")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias not in connections:
            raise CommandError(f"--database {alias!r} is not in DATABASES")
        self.stdin: TextIO = options.get("stdin") or sys.stdin
        getattr(self, f"_{options['action']}")(alias, options)

    def _list(self, alias: str, options: dict[str, Any]) -> None:
        limit = options["limit"]
        if limit < 1:
            raise CommandError(f"--limit must be at least 1, got {limit}")
        rows = list(selection.filtered(alias, options)[: limit + 1])
        more, rows = len(rows) > limit, rows[:limit]
        if options["json"]:
            self.stdout.write(json.dumps([job_text.as_json(job) for job in rows], indent=2))
            return
        if not rows:
            self.stdout.write(f"No job matches ({selection.described(options)}).")
            return
        self.stdout.write(job_text.table(rows, shutil.get_terminal_size((120, 24)).columns))
        if more:
            self.stdout.write(f"Showing the newest {limit}; more jobs match (raise --limit to see them).")

    def _show(self, alias: str, options: dict[str, Any]) -> None:
        jobs = selection.by_id(alias, options["ids"])
        reasons = explain(jobs)
        self.stdout.write("\n\n".join(job_text.page(job, reasons[job.pk]) for job in jobs))

    def _retry(self, alias: str, options: dict[str, Any]) -> None:
        if not self._by_filter(options):
            for job in selection.by_id(alias, options["ids"]):
                if job.retry():
                    self.stdout.write(f"Retried job #{job.pk} {job.name}: queued again, due now.")
                elif job.state in Job.RETRYABLE_STATES:
                    self.stdout.write(f"Job #{job.pk} not retried: another job holds its unique key now.")
                else:
                    self.stdout.write(
                        f"Job #{job.pk} is {job.state}: only failed or cancelled jobs are retried."
                    )
            return
        jobs = selection.filtered(alias, options).order_by()
        count = jobs.retryable().count()
        if not self._confirmed(count, "retry", options, jobs, "failed or cancelled"):
            return
        retried = jobs.retry()
        self.stdout.write(
            ngettext(
                "Retried %d job: queued again, due now.", "Retried %d jobs: queued again, due now.", retried
            )
            % retried
        )
        if retried < count:
            self.stdout.write(
                f"Skipped {count - retried}: changed meanwhile, or another job holds the unique key."
            )

    def _cancel(self, alias: str, options: dict[str, Any]) -> None:
        if not self._by_filter(options):
            for job in selection.by_id(alias, options["ids"]):
                was = job.state
                if not job.cancel():
                    self.stdout.write(f"Job #{job.pk} is {job.state}: nothing to cancel.")
                elif was == Job.State.QUEUED or job.state == Job.State.CANCELLED:
                    self.stdout.write(f"Cancelled job #{job.pk}.")
                else:
                    self.stdout.write(
                        f"Asked running job #{job.pk} to stop (its handler sees should_stop())."
                    )
            return
        jobs = selection.filtered(alias, options).order_by()
        count = jobs.filter(Q(transitions.cancellable()) | Q(transitions.stoppable())).count()
        if not self._confirmed(
            count, "cancel", options, jobs, "queued, or running and not asked to stop yet"
        ):
            return
        cancelled = jobs.queued().cancel()
        asked = jobs.running().cancel()
        self.stdout.write(ngettext("Cancelled %d job.", "Cancelled %d jobs.", cancelled) % cancelled)
        if asked:
            self.stdout.write(
                ngettext(
                    "Asked %d running job to stop: its handler sees should_stop() within a heartbeat.",
                    "Asked %d running jobs to stop: their handlers see should_stop() within a heartbeat.",
                    asked,
                )
                % asked
            )

    def _by_filter(self, options: dict[str, Any]) -> bool:
        """Whether the jobs are chosen by a filter (else by id); a ``CommandError`` for both or neither."""
        action = options["action"]
        if options["ids"] and selection.has_filter(options):
            raise CommandError(f"jobs {action}: give job ids or filters (--state, --name, --queue), not both")
        if not options["ids"] and not selection.has_filter(options):
            raise CommandError(
                f"jobs {action}: give job ids, or filters (--state, --name, --queue) to choose the jobs"
            )
        return not options["ids"]

    def _confirmed(
        self, count: int, verb: str, options: dict[str, Any], jobs: JobQuerySet, which: str
    ) -> bool:
        """Print how many jobs the filter chooses and ask whether to go on; refuse without a terminal."""
        chosen = selection.described(options)
        if not count:
            total = jobs.count()
            self.stdout.write(f"No job to {verb} ({chosen}): none of the {total} matching jobs is {which}.")
            return False
        self.stdout.write(f"{count} {'job' if count == 1 else 'jobs'} to {verb} ({chosen}).")
        if options["yes"]:
            return True
        if not self.stdin.isatty():
            raise CommandError(
                f"not confirmed: {verb} by filter asks first, and there is no terminal to ask on; "
                "add --yes to go ahead"
            )
        self.stdout.write(f"{verb.capitalize()} them? [y/N] ", ending="")
        self.stdout.flush()
        if self.stdin.readline().strip().lower() not in ("y", "yes"):
            self.stdout.write("Nothing changed.")
            return False
        return True

    def _pause(self, alias: str, options: dict[str, Any]) -> None:
        if not options["create"]:
            unknown = [name for name in options["queues"] if not queues.ever_used(name, using=alias)]
            if unknown:
                names = " ".join(unknown)
                raise CommandError(
                    f"no job, worker or registered job has ever used queue {', '.join(map(repr, unknown))}: "
                    f"a typo? Nothing was paused. To pause it before any job uses it: "
                    f"manage.py jobs pause --create {names}"
                )
        for name in options["queues"]:
            changed = queues.pause(name, by="manage.py jobs pause", using=alias)
            self.stdout.write(f"Paused queue {name!r}." if changed else f"Queue {name!r} was already paused.")

    def _resume(self, alias: str, options: dict[str, Any]) -> None:
        for name in options["queues"]:
            changed = queues.resume(name, using=alias)
            self.stdout.write(f"Resumed queue {name!r}." if changed else f"Queue {name!r} was not paused.")

    def _queues(self, alias: str, options: dict[str, Any]) -> None:
        paused = Queue.objects.using(alias).exclude(paused_at=None)
        if not paused:
            self.stdout.write("No queue is paused.")
        for queue in paused:
            by = f" by {queue.paused_by}" if queue.paused_by else ""
            self.stdout.write(f"{queue.name}  paused since {queue.paused_at:%Y-%m-%d %H:%M:%S}{by}")

    def _explain(self, alias: str, options: dict[str, Any]) -> None:
        jobs = selection.by_id(alias, options["ids"])
        reasons = explain(jobs)
        for job in jobs:
            self.stdout.write(f"#{job.pk} {job.name} ({job.state}):")
            for reason in reasons[job.pk]:
                self.stdout.write(f"  - {reason}")
