"""django-q2 with its ORM broker: ``python -m benchmarks.peers.q2_peer --db sqlite``.

A ``qcluster`` with 4 worker processes runs the tasks; it has no "exit when
empty" mode, so the benchmark waits for the last success and stops it.
django-q2 stamps ``started`` at enqueue, so throughput is timed from the first
success's ``stopped`` to the last's (one job fewer than drained), and the
latency task returns the time a worker started it.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import common
from benchmarks.peers import django_peer

SYSTEM = "django-q2"
NOOP = "benchmarks.peers.q2_tasks.noop"
STAMP = "benchmarks.peers.q2_tasks.stamp"


def reset() -> None:
    from django_q.models import OrmQ, Task

    OrmQ.objects.all().delete()
    Task.objects.all().delete()


def drain(count: int) -> dict[str, Any]:
    from django.db.models import Max, Min
    from django_q.models import Success
    from django_q.tasks import async_task

    reset()
    for i in range(count):
        async_task(NOOP, i)
    cluster = django_peer.manage("qcluster")
    try:
        common.until(lambda: Success.objects.count() >= count, 600, "every task done", pause=0.2)
    finally:
        django_peer.stop([cluster])
    span = Success.objects.aggregate(first=Min("stopped"), last=Max("stopped"))
    return common.rate(count - 1, (span["last"] - span["first"]).total_seconds())


def latency(samples: int) -> dict[str, Any]:
    from django_q.models import Success
    from django_q.tasks import async_task

    reset()
    cluster = django_peer.manage("qcluster")
    try:
        time.sleep(5)  # start-up of the cluster's processes
        delays = []
        for _ in range(samples):
            enqueued = time.time()
            done = Success.objects.filter(id=async_task(STAMP))
            common.until(done.exists, 30, "the task done", pause=0.005)
            delays.append((done.get().result - enqueued) * 1000)
            common.gap()
    finally:
        django_peer.stop([cluster])
    return common.latency(delays)


def enqueue_one(count: int) -> dict[str, Any]:
    from django_q.tasks import async_task

    reset()
    return common.enqueue_rate(lambda i: async_task(NOOP, i), count)


FIGURES: dict[str, common.Figure] = {
    "drain": lambda a: drain(a.jobs),
    "latency": lambda a: latency(a.samples),
    "enqueue_one": lambda a: enqueue_one(max(a.jobs // 10, 100)),
}
LACKS = {"enqueue_many": "no bulk enqueue"}


def main() -> None:
    args = common.parser(__doc__, FIGURES).parse_args()
    django_peer.setup("benchmarks.peers.q2_settings", args.db, "q2_bench")
    common.run_figures(SYSTEM, args, FIGURES, LACKS)


if __name__ == "__main__":
    main()
