"""``manage.py demo``: enqueue real scans, run them in a real ``runjobs``, show what happened."""

from __future__ import annotations

import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import django
from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from example_project.library.jobs import scan_library
from example_project.library.models import Library
from vellum_jobs.models import Job


class Command(BaseCommand):
    help = "Enqueue library scans, run them with runjobs, and print the outcome."

    def handle(self, *args: Any, **options: Any) -> None:
        # Each run starts from an empty queue, so the counts below are this run's.
        Job.objects.all().delete()
        Library.objects.all().delete()
        libraries = [
            Library.objects.create(name="Django source", path=str(Path(django.__file__).parent)),
            Library.objects.create(name="Python stdlib", path=sysconfig.get_paths()["stdlib"]),
            Library.objects.create(name="Unplugged disk", path="/mnt/unplugged-disk"),
        ]
        jobs = [scan_library.using(ref=library).enqueue(library.pk) for library in libraries]
        self.stdout.write(f"Enqueued {len(jobs)} scans: " + ", ".join(f"#{j.pk}" for j in jobs))
        self._show_transactional_enqueue()
        self._run_worker_until_settled(jobs)
        self._report(libraries)

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

    def _run_worker_until_settled(self, jobs: list[Job]) -> None:
        self.stdout.write("\nStarting `manage.py runjobs -v 2` (the unplugged disk fails and is retried):\n")
        manage = Path(settings.BASE_DIR).parent / "manage.py"
        worker = subprocess.Popen([sys.executable, str(manage), "runjobs", "-v", "2"])
        ids = [j.pk for j in jobs]
        deadline = time.monotonic() + 60
        try:
            while Job.objects.filter(pk__in=ids, state__in=[Job.State.QUEUED, Job.State.RUNNING]).exists():
                if time.monotonic() > deadline or worker.poll() is not None:
                    break
                time.sleep(0.2)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
        self.stdout.write(f"\nrunjobs stopped on SIGTERM with exit code {worker.returncode}.\n")

    def _report(self, libraries: list[Library]) -> None:
        self.stdout.write(f"{'job':>5}  {'library':<16} {'state':<8} {'tries':<5} outcome")
        for library in libraries:
            job = Job.objects.for_object(library).first()
            assert job is not None
            if job.state == Job.State.DONE and isinstance(job.result, dict):
                found = job.result
                outcome = (
                    f"{found['files']} files, {found['bytes'] / 1e6:.1f} MB, top {found['top_extensions']}"
                )
            else:
                lines = job.error.strip().splitlines()
                outcome = lines[-1] if lines else ""
            tries = f"{job.attempts}/{job.max_attempts}"
            self.stdout.write(f"{job.pk:>5}  {library.name:<16} {job.state:<8} {tries:<5} {outcome}")
        self.stdout.write(f"\nAll jobs by state: {Job.objects.stats()}")
        self.stdout.write(
            "See them in the admin: python manage.py createsuperuser && python manage.py runserver"
        )
