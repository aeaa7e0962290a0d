"""A job with a fair key per tenant: each run notes its tenant and sequence in an ``Execution``."""

from __future__ import annotations

import os

from tests.testapp.models import Execution
from vellum_jobs import current_job, job


@job("test.fair", fair_key="tenant:{tenant}", queue="fair")
def fair(tenant: str, seq: int) -> None:
    # One autocommit INSERT as the handler starts: Execution ids are the order of starts.
    running = current_job()
    assert running is not None
    Execution.objects.create(
        job_id=running.pk, attempt=running.attempts, pid=os.getpid(), note=f"{tenant}:{seq}"
    )
