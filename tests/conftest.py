"""Shared fixtures: the vendor under test, and loud skips outside CI."""

from __future__ import annotations

import os

import pytest
from django.db import connection


@pytest.fixture
def vendor() -> str:
    return connection.vendor


def pytest_report_header() -> str:
    return f"vellum-jobs test database: {os.environ.get('VELLUM_TEST_DB', 'sqlite')}"


def claim_for(worker_id, limit: int = 10, queues=(), now=None):
    """Claim due jobs for ``worker_id`` on the test's connection."""
    from datetime import timedelta

    from django.utils import timezone

    from vellum_jobs.claim import ClaimRequest, claim
    from vellum_jobs.conf import conf

    now = now or timezone.now()
    request = ClaimRequest(
        worker_id=worker_id, limit=limit, now=now, lease_until=now + timedelta(seconds=conf.lease), queues=queues
    )
    return claim(connection, request)
