"""Enqueue one unique key from 8 threads at once and print the job ids they got back.

``python -m tests.support.enqueue_race KEY START`` is one OS process of the race in
``test_uniqueness``; every thread waits for the wall-clock time START so
that all processes' threads enqueue together.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

THREADS = 8
ENQUEUES = 5


def race(key: str, start: float) -> list[int]:
    from django.db import connections

    from tests.testapp import jobs

    ids: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def enqueuer() -> None:
        try:
            barrier.wait()
            time.sleep(max(0.0, start - time.time()))
            for _ in range(ENQUEUES):
                ids.append(jobs.add.using(unique_key=key).enqueue(1, 2).pk)
        except BaseException as exc:  # noqa: BLE001 - reported to the test through the exit code
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueuer) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return ids


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    print(json.dumps(race(sys.argv[1], float(sys.argv[2]))))
