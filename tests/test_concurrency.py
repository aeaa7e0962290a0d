"""Every job runs exactly once when many threads and processes claim at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter

import pytest
from django.db import connection

from tests.drain import drain
from tests.processes import ROOT
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.models import Job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOBS = 2000


def assert_each_ran_exactly_once(created: list[Job]) -> None:
    counts = Counter(Execution.objects.values_list("job_id", flat=True))
    assert set(counts) == {j.pk for j in created}
    assert set(counts.values()) == {1}
    assert Job.objects.filter(state=Job.State.DONE).count() == JOBS
    assert not Job.objects.exclude(state=Job.State.DONE).exists()


def test_8_threads_run_2000_jobs_each_exactly_once():
    created = jobs.record.enqueue_many([(i,) for i in range(JOBS)])
    errors: list[BaseException] = []
    ran: list[int] = []

    def claimer() -> None:
        try:
            ran.append(drain())
        except BaseException as exc:  # noqa: BLE001 - reported below, e.g. "database is locked"
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sum(ran) == JOBS
    assert_each_ran_exactly_once(created)


def test_4_processes_run_2000_jobs_each_exactly_once():
    created = jobs.record.enqueue_many([(i,) for i in range(JOBS)])
    env = {**os.environ, "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"])}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.drain"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], [err for _, err in results]
    assert all("locked" not in err for _, err in results)
    assert sum(int(out) for out, _ in results) == JOBS
    assert_each_ran_exactly_once(created)
