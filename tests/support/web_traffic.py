"""A stand-in for web requests sharing the database with workers.

``python -m tests.support.web_traffic SECONDS`` runs read-then-write transactions
(the shape of a form view: read, then insert, then enqueue a job) until the
time is up, and prints one JSON line: requests served, jobs enqueued, and
every error a caller would have seen.
"""

from __future__ import annotations

import json
import os
import sys
import time


def serve(seconds: float) -> dict[str, object]:
    from django.db import transaction

    from tests.testapp import jobs
    from tests.testapp.models import Library

    served, enqueued, errors = 0, [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with transaction.atomic():
                count = Library.objects.count()
                library = Library.objects.create(name=f"library {count}")
                enqueued.append(jobs.record.using(ref=library).enqueue(f"web {count}").pk)
            served += 1
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on any
            errors.append(repr(exc))
        time.sleep(0.002)
    return {"served": served, "enqueued": enqueued, "errors": errors}


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    print(json.dumps(serve(float(sys.argv[1]))))
