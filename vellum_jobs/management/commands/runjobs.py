"""``manage.py runjobs``: parse options, start a ``WorkerProcess`` (or a ``Supervisor``), report on it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from vellum_jobs import queues
from vellum_jobs.conf import MAX_ASYNC_WORKERS, MAX_DURATION, conf
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job
from vellum_jobs.execution import outcome_text
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.management.run_summary import RunSummary
from vellum_jobs.store import transient_errors
from vellum_jobs.worker import command_line
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess
from vellum_jobs.worker.supervisor import Supervisor, supervised, watch_lifeline


class Command(BaseCommand):
    help = "Run queued jobs: N threads claim and run them until SIGTERM/SIGINT."
    argv: list[str] | None = None  # the command line, when there is one (not under call_command)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers", type=int, default=None, help="threads (default VELLUM_JOBS['WORKERS'], 4)"
        )
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            dest="queues",
            help="a queue to serve (repeatable; default all)",
        )
        parser.add_argument(
            "--async-workers",
            type=int,
            default=None,
            help="coroutine (async def) jobs run at once on the process's event loop"
            " (default VELLUM_JOBS['ASYNC_WORKERS'], 100; 0: none)",
        )
        parser.add_argument(
            "--burst", action="store_true", help="exit 0 once no due job is left and no handler is running"
        )
        parser.add_argument("--max-jobs", type=int, default=None, help="exit 0 after running this many jobs")
        parser.add_argument(
            "--grace",
            type=float,
            default=30.0,
            help="seconds to let running jobs finish on SIGTERM (default 30)",
        )
        parser.add_argument(
            "--max-stuck",
            type=int,
            default=None,
            help="exit (status 3) once this many threads are stuck in handlers past their timeout",
        )
        parser.add_argument(
            "--prefetch",
            type=int,
            default=None,
            help="jobs claimed ahead of free threads while jobs are short (default 32 x --workers; 0: none)",
        )
        parser.add_argument("--database", default="default", help="the database alias that holds the jobs")
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            help="run this many runjobs processes, each with --workers threads, under a supervisor"
            " that restarts them (default 1: no supervisor)",
        )
        parser.epilog = (
            "Verbosity 2 prints a line per finished job; 3 adds the worker's log events. --burst and"
            " --max-jobs print, on exit, how many jobs ran, by name and outcome. Exit status: 0"
            " after a graceful stop, or once --burst or --max-jobs is done; 1 after a second signal; 3"
            " for --max-stuck; 4 when the --processes supervisor gave up restarting its processes; 5"
            " when one of the worker's own database calls got no answer for MAX_DATABASE_WAIT (its"
            " network path went silent). 3 and 5 ask the process manager for a restart."
        )

    def run_from_argv(self, argv: list[str]) -> None:
        self.argv = argv
        super().run_from_argv(argv)

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks, run once the database answers.

        On MySQL and MariaDB the field checks ask the server for its version.
        A worker started while the database is down (a process manager's
        restart during an outage) waits for it, as a running worker does,
        instead of exiting with a traceback; told to stop meanwhile, it stops
        cleanly, as it holds nothing yet.
        """
        with _stop_cleanly_on_signal():
            transient_errors.retry(lambda: super(Command, self).check(*args, **kwargs), what="system checks")

    def handle(self, *args: Any, **options: Any) -> None:
        threads = options["workers"] if options["workers"] is not None else conf.workers
        if options["processes"] < 1:
            raise CommandError(f"--processes must be at least 1, got {options['processes']}")
        if threads < 1:
            raise CommandError(f"--workers must be at least 1, got {threads}")
        if options["max_jobs"] is not None and options["max_jobs"] < 1:
            raise CommandError(f"--max-jobs must be at least 1, got {options['max_jobs']}")
        if options["max_stuck"] is not None and options["max_stuck"] < 1:
            raise CommandError(f"--max-stuck must be at least 1, got {options['max_stuck']}")
        if options["async_workers"] is not None and not 0 <= options["async_workers"] <= MAX_ASYNC_WORKERS:
            raise CommandError(
                f"--async-workers must be 0 to {MAX_ASYNC_WORKERS}, got {options['async_workers']}"
            )
        if options["prefetch"] is not None and options["prefetch"] < 0:
            raise CommandError(f"--prefetch must not be negative, got {options['prefetch']}")
        longest = MAX_DURATION.total_seconds()
        if not 0 <= options["grace"] <= longest:  # NaN fails it too
            raise CommandError(
                f"--grace must be a number of seconds from 0 to {longest:g}, got {options['grace']}"
            )
        if options["database"] not in connections:
            raise CommandError(f"--database {options['database']!r} is not in DATABASES")
        _log_to_console(options["verbosity"])
        if options["processes"] > 1:
            self._warn_of_unknown_queues(options["queues"], options["database"])
            self._supervise(
                options["processes"], threads, options["burst"] or options["max_jobs"] is not None
            )
            return
        if not supervised():
            self._warn_of_unknown_queues(options["queues"], options["database"])
        finite = options["burst"] or options["max_jobs"] is not None
        summary = RunSummary() if finite else None
        worker = WorkerProcess(
            WorkerOptions(
                threads=threads,
                queues=options["queues"],
                burst=options["burst"],
                max_jobs=options["max_jobs"],
                grace=options["grace"],
                max_stuck=options["max_stuck"],
                alias=options["database"],
                prefetch=options["prefetch"],
                async_workers=options["async_workers"],
            ),
            report=self._reporter(options["verbosity"] >= 2, summary),
        )
        worker.install_signal_handlers()
        watch_lifeline(worker.request_stop)
        self._banner(worker)
        code = worker.run()
        if summary is not None:
            self.stdout.write(summary.text())
            self.stdout.flush()
        if worker.abandoned_threads or code:
            # Handlers of handed-back or timed-out jobs are still running in
            # threads nothing can stop: leave without waiting for them.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _supervise(self, processes: int, threads: int, finite: bool) -> None:
        if self.argv is None:
            raise CommandError("--processes starts processes from its command line; call_command() has none")
        if supervised():
            raise CommandError("--processes in a process that a supervisor started: that recurses")
        command = command_line.command(self.argv, without="--processes")
        supervisor = Supervisor(command, processes, finite=finite)
        # The system checks may have connected (SQLite's JSONField check
        # does): the supervisor itself holds no connection.
        connections.close_all()
        self.stdout.write(
            f"vellum-jobs supervisor pid {os.getpid()}: {processes} runjobs processes x {threads} threads"
        )
        self.stdout.flush()
        code = supervisor.run()
        if code:
            sys.exit(code)

    def _banner(self, worker: WorkerProcess) -> None:
        connection = connections[worker.alias]
        names = registry.names()
        self.stdout.write(
            f"vellum-jobs worker {worker.id} pid {os.getpid()}\n"
            f"  database: {connection.vendor} ({connection.settings_dict['NAME']})\n"
            f"  queues:   {', '.join(worker.options.queues) or 'all'}\n"
            f"  threads:  {worker.options.threads} (claiming up to {worker.dispatcher.prefetch} ahead)\n"
            f"  async:    {_async_line(worker.slots.async_capacity)}\n"
            f"  jobs:     {', '.join(names) if names else '(none registered)'}"
        )
        self.stdout.flush()

    def _warn_of_unknown_queues(self, names: list[str], alias: str) -> None:
        """Warn of each ``--queue`` no job has ever used: most likely a typo, and the worker would idle."""
        try:
            unknown = [name for name in names if not queues.ever_used(name, using=alias)]
        except transient_errors.TRANSIENT:
            return  # the worker rides out the outage; the warning is not worth waiting for
        for name in unknown:
            self.stderr.write(
                f"Warning: no job has ever used queue {name!r} (a typo?). This worker serves it anyway,"
                " and runs its jobs once some are enqueued."
            )
        self.stderr.flush()

    def _reporter(self, print_each: bool, summary: RunSummary | None) -> Any:
        if not print_each and summary is None:
            return None
        lock = threading.Lock()

        def report(job: Job, outcome: Outcome) -> None:
            if summary is not None:
                summary.add(job, outcome)
            if print_each:
                with lock:
                    self.stdout.write(outcome_text.sentence(job, outcome))
                    self.stdout.flush()

        return report


@contextlib.contextmanager
def _stop_cleanly_on_signal() -> Iterator[None]:
    """SIGTERM or SIGINT before the worker exists ends the process with status 0.

    Nothing is claimed or recorded yet, so there is nothing to hand back; the
    worker installs its own handlers once it exists.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; another has none to replace
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        os.write(2, f"vellum-jobs: {name} during the system checks: stopped before it started\n".encode())
        raise SystemExit(0)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _async_line(capacity: int) -> str:
    if not capacity:
        return "off (no async def jobs, or --async-workers 0)"
    return f"up to {capacity} coroutine jobs at once on an event loop"


def _log_to_console(verbosity: int) -> None:
    """Show worker events on stderr unless the project configured the logger itself."""
    logger = logging.getLogger("vellum_jobs")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbosity >= 3 else logging.WARNING)
