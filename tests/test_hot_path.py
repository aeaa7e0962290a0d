"""The number of SQL statements a job costs a worker, pinned per vendor.

A change that adds a query per job (a SELECT to reload the row, a second
UPDATE) fails here without timing anything.
"""

from __future__ import annotations

import pytest
from django.db import connection

from tests.testapp import jobs
from vellum_jobs.models import Job
from vellum_jobs.worker import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 20

# With one slot, each job is one dispatcher cycle: write the previous job's
# outcome and claim the next in one transaction.
PER_JOB = {
    "sqlite": 4,  # BEGIN IMMEDIATE, UPDATE (outcome), UPDATE ... RETURNING (claim), COMMIT
    "postgresql": 4,  # BEGIN, UPDATE (outcome), WITH ... UPDATE ... RETURNING (claim), COMMIT
    "mysql": 4,  # UPDATE (outcome); SELECT ... FOR UPDATE SKIP LOCKED, UPDATE, SELECT (claim)
}
# Outside the per-job loop: register and remove the worker row (Django's
# delete opens its transaction with a statement on SQLite), the first claim,
# and the last outcome with its claim that finds nothing.
FIXED = {"sqlite": 1 + 2 + 1 + 4, "postgresql": 1 + 1 + 1 + 4, "mysql": 1 + 1 + 3 + 2}


def test_statements_per_job_on_the_dispatcher_s_connection():
    jobs.add.enqueue_many([(i, i) for i in range(JOBS)])
    statements: list[str] = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    worker = WorkerProcess(WorkerOptions(threads=1, burst=True))
    with connection.execute_wrapper(count):
        worker.run()
    assert Job.objects.filter(state=Job.State.DONE).count() == JOBS
    vendor = connection.vendor
    expected = FIXED[vendor] + PER_JOB[vendor] * (JOBS - 1)
    assert len(statements) == expected, "\n".join(statements)
