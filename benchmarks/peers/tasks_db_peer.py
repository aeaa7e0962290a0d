"""django-tasks-db, Django's Tasks framework on its ORM backend: ``python -m benchmarks.peers.tasks_db_peer``.

Workers are ``db_worker`` processes (one task at a time each) with their
default 1-second poll; a drain runs 4 of them with ``--batch``. Throughput and
latency come from the results' own ``enqueued_at``/``started_at``/``finished_at``.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import common
from benchmarks.peers import django_peer

SYSTEM = "django-tasks-db"


def reset() -> None:
    from django_tasks_db.models import DBTaskResult

    DBTaskResult.objects.all().delete()


def drain(count: int) -> dict[str, Any]:
    from django.db.models import Max, Min
    from django_tasks_db.models import DBTaskResult

    from benchmarks.peers.tasks import noop

    reset()
    for i in range(count):
        noop.enqueue(i)
    workers = [django_peer.manage("db_worker", "--batch", "--no-startup-delay") for _ in range(4)]
    for worker in workers:
        worker.wait(600)
    done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
    if done != count:
        raise RuntimeError(f"{done} of {count} tasks successful")
    span = DBTaskResult.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return common.rate(count, (span["last"] - span["first"]).total_seconds())


def latency(samples: int) -> dict[str, Any]:
    from django_tasks_db.models import DBTaskResult

    from benchmarks.peers.tasks import noop

    reset()
    worker = django_peer.manage("db_worker")
    try:
        time.sleep(3)  # start-up, then settle into the idle poll
        delays = []
        for i in range(samples):
            result = noop.enqueue(i)
            row = DBTaskResult.objects.filter(pk=result.id, status="SUCCESSFUL")
            common.until(row.exists, 30, "the task done", pause=0.005)
            got = row.get()
            delays.append((got.started_at - got.enqueued_at).total_seconds() * 1000)
            common.gap()
    finally:
        django_peer.stop([worker])
    return common.latency(delays)


def enqueue_one(count: int) -> dict[str, Any]:
    from benchmarks.peers.tasks import noop

    reset()
    return common.enqueue_rate(noop.enqueue, count)


FIGURES: dict[str, common.Figure] = {
    "drain": lambda a: drain(a.jobs),
    "latency": lambda a: latency(a.samples),
    "enqueue_one": lambda a: enqueue_one(max(a.jobs // 10, 100)),
}
LACKS = {"enqueue_many": "Django's Tasks framework has no bulk enqueue"}


def main() -> None:
    args = common.parser(__doc__, FIGURES).parse_args()
    django_peer.setup("benchmarks.peers.tasks_db_settings", args.db, "tasks_db_bench")
    common.run_figures(SYSTEM, args, FIGURES, LACKS)


if __name__ == "__main__":
    main()
