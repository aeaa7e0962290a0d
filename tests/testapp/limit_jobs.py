"""Jobs under rate and concurrency limits (tests/limits): each handler notes its start in ``Span``."""

from __future__ import annotations

import os
import time

from tests.testapp.models import Span
from vellum_jobs import Throttled, job


def _started(key: str) -> None:
    from vellum_jobs.execution.context import current_job

    Span.objects.create(key=key, job_id=current_job().pk, pid=os.getpid(), started=time.monotonic())


@job("test.limits.call_api", rate=("3/2s", "api:{account}"))
def call_api(account: str) -> None:
    _started(f"api:{account}")


@job("test.limits.render", concurrency={"customer:{customer}": 2, "gpu": 1})
def render(customer: str, seconds: float = 0.0) -> None:
    _started(f"render:{customer}")
    time.sleep(seconds)


@job("test.limits.charge", rate=[("5/s", "payments"), ("100/h", "customer:{customer}")])
def charge(customer: str) -> None:
    _started(f"charge:{customer}")


@job("test.limits.fetch", rate=("1000/s", "partner"))
def fetch(page: int, throttle_for: float = 0.0) -> None:
    if throttle_for:
        raise Throttled("partner", seconds=throttle_for, reason="429 Too Many Requests")
    _started("partner")
