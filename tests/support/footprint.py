"""A ``runjobs --burst`` in a project that uses no optional part of vellum-jobs: what it imported, as JSON.

``python -m tests.support.footprint`` sets up ``tests.settings_footprint``
(vellum-jobs alone: no admin, schedules, Tasks backend or ``async def``
job), registers two sync jobs, one that returns and one that raises,
enqueues them on the test database (``VELLUM_TEST_DB_NAME``), runs
``runjobs --burst --workers 4`` in this process as the command line does
(system checks included), and prints the jobs' states and which of the
modules that only an optional part needs got imported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# Modules (and their submodules) a worker needs only for a part this project does not use.
OPTIONAL = (
    "opentelemetry",  # tracing: only once something imported the API to set a tracer provider
    "croniter",  # schedules
    "dateutil",  # croniter's
    "prometheus_client",  # the metrics view
    "django.tasks",  # the Tasks backend: imported by the first job that is a task
    "vellum_jobs.backends.backend",
    "vellum_jobs.backends.execution",
    "vellum_jobs.backends.results",
    "vellum_jobs.admin",
    "vellum_jobs.observe",  # the read side: metrics, health, stats
)


def main() -> dict[str, Any]:
    from django.core.management import execute_from_command_line

    from vellum_jobs import Fail, job
    from vellum_jobs.core.models import Job

    @job("footprint.add")
    def add(a: int, b: int) -> int:
        return a + b

    @job("footprint.fail")
    def fail() -> None:
        raise Fail("on purpose")

    enqueued = [add.enqueue(2, 3), *add.enqueue_many([(1, 1), (2, 2)]), fail.enqueue()]
    execute_from_command_line(["django", "runjobs", "--burst", "--workers", "4", "--verbosity", "0"])
    rows = Job.objects.filter(pk__in=[job.pk for job in enqueued]).order_by("pk")
    return {
        "jobs": [[row.name, row.state, row.result] for row in rows],
        "imported": sorted(
            name for name in sys.modules if any(name == o or name.startswith(f"{o}.") for o in OPTIONAL)
        ),
    }


if __name__ == "__main__":
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings_footprint"
    import django

    django.setup()
    print(json.dumps(main()))
