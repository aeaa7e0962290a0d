"""The heartbeat: beats, and the worker row."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from vellum_jobs import heartbeat
from vellum_jobs.models import Worker

pytestmark = pytest.mark.django_db(transaction=True)
ALIAS = "default"


# -- the worker row ----------------------------------------------------------------


def test_record_recreates_a_missing_worker_row_and_forgets_long_dead_workers():
    now = timezone.now()
    gone = Worker.objects.create(
        id=uuid.uuid4(), host="old", pid=1, threads=1, last_heartbeat=now - timedelta(hours=2)
    )
    me = Worker(id=uuid.uuid4(), host="here", pid=2, threads=4)
    heartbeat.record(ALIAS, me, now)
    assert Worker.objects.get(pk=me.pk).last_heartbeat == now
    assert not Worker.objects.filter(pk=gone.pk).exists()
