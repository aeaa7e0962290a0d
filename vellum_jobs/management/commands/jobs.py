"""``manage.py jobs``: pause and resume queues, cancel jobs, and say why a job waits."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from vellum_jobs import queues
from vellum_jobs.core.models import Job, Queue
from vellum_jobs.observe.explain import explain


class Command(BaseCommand):
    help = "Control the flow of jobs: pause or resume a queue, cancel a job, explain why a job waits."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default", help="the database alias that holds the jobs")
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        pause = actions.add_parser("pause", help="stop workers from claiming the queue's jobs")
        pause.add_argument("queues", nargs="+", metavar="QUEUE")
        resume = actions.add_parser("resume", help="let workers claim the queue's jobs again")
        resume.add_argument("queues", nargs="+", metavar="QUEUE")
        actions.add_parser("queues", help="list paused queues")
        cancel = actions.add_parser("cancel", help="cancel queued jobs, ask running ones to stop")
        cancel.add_argument("ids", nargs="+", type=int, metavar="ID")
        why = actions.add_parser("explain", help="why a job has not started")
        why.add_argument("ids", nargs="+", type=int, metavar="ID")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias not in connections:
            raise CommandError(f"--database {alias!r} is not in DATABASES")
        getattr(self, f"_{options['action']}")(alias, options)

    def _pause(self, alias: str, options: dict[str, Any]) -> None:
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

    def _jobs(self, alias: str, ids: list[int]) -> list[Job]:
        found = {job.pk: job for job in Job.objects.using(alias).filter(pk__in=ids)}
        missing = [pk for pk in ids if pk not in found]
        if missing:
            raise CommandError(f"no job with id {', '.join(map(str, missing))}")
        return [found[pk] for pk in ids]

    def _cancel(self, alias: str, options: dict[str, Any]) -> None:
        for job in self._jobs(alias, options["ids"]):
            was = job.state
            if not job.cancel():
                self.stdout.write(f"Job #{job.pk} is {job.state}: nothing to cancel.")
            elif was == Job.State.QUEUED or job.state == Job.State.CANCELLED:
                self.stdout.write(f"Cancelled job #{job.pk}.")
            else:
                self.stdout.write(f"Asked running job #{job.pk} to stop (its handler sees should_stop()).")

    def _explain(self, alias: str, options: dict[str, Any]) -> None:
        jobs = self._jobs(alias, options["ids"])
        for job in jobs:
            reasons = explain([job])[job.pk]
            self.stdout.write(f"#{job.pk} {job.name} ({job.state}):")
            for reason in reasons:
                self.stdout.write(f"  - {reason}")
