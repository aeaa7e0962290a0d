"""Enqueues and a worker's runs in a process that cannot import OpenTelemetry, reported as JSON.

``python -m tests.support.untraced`` is a project without ``vellum-jobs[otel]``: a
finder refuses every ``opentelemetry`` module before Django sets up. It
enqueues on the test database (``VELLUM_TEST_DB_NAME``), runs
``runjobs --burst`` in this process, and prints each job's state, result
and trace context, and the ``opentelemetry`` modules that got imported.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.machinery import ModuleSpec
from typing import Any


class NoOpenTelemetry:
    """A ``sys.meta_path`` finder that refuses ``opentelemetry`` and its modules, as if not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> dict[str, Any]:
    from django.core.management import call_command

    from tests.testapp import jobs
    from vellum_jobs.core.models import Job
    from vellum_jobs.execution import tracing

    enqueued = [
        jobs.add.enqueue(2, 3),
        *jobs.add.enqueue_many([(1, 1), (2, 2)]),
        jobs.async_add.enqueue(4, 5),
        jobs.boom.enqueue(),  # raises: queued again for its backoff
    ]
    call_command("runjobs", "--burst", verbosity=0)
    rows = Job.objects.filter(pk__in=[job.pk for job in enqueued]).order_by("pk")
    return {
        "enabled": tracing.enabled,
        "jobs": [[row.name, row.state, row.result, row.trace_context] for row in rows],
        "imported": sorted(name for name in sys.modules if name.startswith("opentelemetry")),
    }


if __name__ == "__main__":
    sys.meta_path.insert(0, NoOpenTelemetry())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    print(json.dumps(main()))
