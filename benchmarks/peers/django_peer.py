"""What the Django-based peers share: a scratch database, Django set up on it, workers as commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks import database

ROOT = Path(__file__).resolve().parents[2]


def setup(settings: str, vendor: str, name: str) -> None:
    """A fresh database ``name`` with the peer's tables; Django configured on it in this process."""
    os.environ["VELLUM_BENCH_DB"] = vendor
    os.environ["VELLUM_BENCH_NAME"] = database.recreate(vendor, name)
    os.environ["DJANGO_SETTINGS_MODULE"] = settings
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def manage(*args: str) -> subprocess.Popen[bytes]:
    """A ``django-admin`` subprocess (a worker) on the same settings and database."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
    )


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
