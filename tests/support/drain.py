"""Claim and run jobs one at a time with the library API until none is due.

``python -m tests.support.drain`` is one OS process of the concurrency proof; the
same ``drain()`` runs in threads in-process.
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta


def drain(batch: int = 1) -> int:
    from django.db import connection, connections
    from django.utils import timezone

    from vellum_jobs.execution.inline import execute
    from vellum_jobs.store.claim import ClaimRequest, claim

    worker_id = uuid.uuid4()
    ran = 0
    try:
        while True:
            now = timezone.now()
            request = ClaimRequest(
                worker_id=worker_id, limit=batch, now=now, lease_until=now + timedelta(minutes=5)
            )
            jobs = claim(connection, request)
            if not jobs:
                return ran
            for job in jobs:
                execute(job, worker_id)
                ran += 1
    finally:
        connections.close_all()


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    print(drain())
