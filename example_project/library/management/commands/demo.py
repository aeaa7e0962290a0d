"""``manage.py demo``: scan the sample media with a real ``runjobs``, watch it, and show what happened.

It makes an admin user (password printed, or taken from
``VELLUM_DEMO_PASSWORD``), starts from an empty queue, enqueues a scan of
``example_project/sample_media`` and one of a disk that is not there, runs
``manage.py runjobs`` in a subprocess until no job is queued or running,
printing progress twice a second, stops it with SIGTERM, and prints a table
of jobs by name and state.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.db.models import Count

from example_project.library.jobs import scan_library
from example_project.library.models import Item, Library
from vellum_jobs.core.models import Job

ROOT = Path(settings.BASE_DIR).parent
SAMPLE_MEDIA = Path(settings.BASE_DIR) / "sample_media"
PASSWORD_VARIABLE = "VELLUM_DEMO_PASSWORD"


class Command(BaseCommand):
    help = "Scan the sample media with runjobs, show progress, and print jobs by name and state."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--folder", default=str(SAMPLE_MEDIA), help="the folder to scan")
        parser.add_argument("--workers", type=int, default=4, help="runjobs threads")
        parser.add_argument(
            "--timeout", type=float, default=120, help="seconds to wait for the queue to empty"
        )
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        password = self._admin_user(options["username"])
        # Each run starts from an empty queue, so the table below is this run's.
        Job.objects.all().delete()
        Library.objects.all().delete()
        libraries = [
            Library.objects.create(name="Sample media", path=options["folder"]),
            Library.objects.create(name="Unplugged disk", path="/mnt/unplugged-disk"),
        ]
        for library in libraries:
            job = scan_library.using(ref=library).enqueue(library.pk)
            self.stdout.write(f"Enqueued scan #{job.pk} of {library.name!r} ({library.path})")
        self._show_transactional_enqueue()
        self._run_until_empty(options["workers"], options["timeout"])
        self._summary(libraries)
        self._how_to_look(options["username"], password)

    def _admin_user(self, username: str) -> str:
        """Create or reset the demo superuser; returns its password."""
        password = os.environ.get(PASSWORD_VARIABLE) or secrets.token_urlsafe(9)
        User = get_user_model()
        user = User.objects.filter(username=username).first() or User(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        return password

    def _show_transactional_enqueue(self) -> None:
        class Undo(Exception):
            pass

        try:
            with transaction.atomic():
                library = Library.objects.create(name="Never saved", path="/tmp")
                doomed = scan_library.using(ref=library).enqueue(library.pk)
                raise Undo
        except Undo:
            pass
        exists = Job.objects.filter(pk=doomed.pk).exists()
        self.stdout.write(f"A scan enqueued in a rolled-back transaction exists afterwards: {exists}")
        self.stdout.write("")

    def _run_until_empty(self, workers: int, timeout: float) -> None:
        command = [sys.executable, str(ROOT / "manage.py"), "runjobs", "--workers", str(workers)]
        self.stdout.write(f"$ manage.py runjobs --workers {workers}")
        self.stdout.flush()
        worker = subprocess.Popen(command, cwd=ROOT)
        started = time.monotonic()
        try:
            while True:
                time.sleep(0.5)
                busy = self._progress_line(time.monotonic() - started)
                if not busy:
                    break
                if worker.poll() is not None:
                    raise CommandError(f"runjobs exited with {worker.returncode} before the queue was empty")
                if time.monotonic() - started > timeout:
                    raise CommandError(f"jobs still queued or running after {timeout:.0f} s")
        finally:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(60)
        self.stdout.write(
            f"The queue is empty; runjobs stopped on SIGTERM with exit code {worker.returncode}."
        )
        self.stdout.write("")

    def _progress_line(self, elapsed: float) -> int:
        """Print one line of progress; returns how many jobs are still queued or running."""
        stats = Job.objects.stats()
        line = f"{elapsed:5.1f}s  " + "  ".join(f"{state} {n:>3}" for state, n in stats.items())
        scan = Job.objects.running().filter(name="scan", progress_total__isnull=False).first()
        if scan is not None:
            line += f"  | scan #{scan.pk}: {scan.progress_done}/{scan.progress_total} {scan.progress_message}"
        self.stdout.write(line)
        self.stdout.flush()
        return stats["queued"] + stats["running"]

    def _summary(self, libraries: list[Library]) -> None:
        states = list(Job.State.values)
        table: dict[str, dict[str, int]] = {}
        for name, state, n in (
            Job.objects.values_list("name", "state").annotate(n=Count("id")).order_by("name")
        ):
            table.setdefault(name, dict.fromkeys(states, 0))[state] = n
        self.stdout.write("Jobs by name and state:")
        self.stdout.write(f"  {'name':<15}" + "".join(f"{s:>11}" for s in states))
        for name, row in table.items():
            self.stdout.write(f"  {name:<15}" + "".join(f"{row[s]:>11}" for s in states))
        totals = Job.objects.stats()
        self.stdout.write(f"  {'all':<15}" + "".join(f"{totals[s]:>11}" for s in states))
        retried = Job.objects.filter(name="fetch_artwork", state=Job.State.DONE, attempts__gt=1).count()
        self.stdout.write(f"\n{retried} artwork fetches failed once and succeeded on a retry.")
        for library in libraries:
            job = Job.objects.for_object(library).first()
            if job is None:
                continue
            if job.state == Job.State.DONE and isinstance(job.result, dict):
                items = Item.objects.filter(library=library).count()
                outcome = f"{job.result['files']} files, {items} items"
            else:
                lines = job.error.strip().splitlines()
                outcome = f"{job.state} after {job.attempts} attempts: {lines[-1] if lines else ''}"
            self.stdout.write(f"Scan of {library.name!r}: {outcome}")

    def _how_to_look(self, username: str, password: str) -> None:
        python = Path(sys.executable)
        shown = os.path.relpath(python, ROOT) if python.is_relative_to(ROOT) else "python"
        source = f"from {PASSWORD_VARIABLE}" if os.environ.get(PASSWORD_VARIABLE) else "new for this run"
        self.stdout.write(
            "\nSee every job, its arguments, progress, result or traceback in the admin:\n"
            f"  {shown} manage.py runserver\n"
            "  http://127.0.0.1:8000/admin/vellum_jobs/job/\n"
            f"  user {username!r}, password {password!r} ({source})"
        )
