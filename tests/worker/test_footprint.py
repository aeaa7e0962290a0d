"""What a ``runjobs`` process imports: what its project uses, not every optional part of vellum-jobs.

Each optional part (tracing, schedules, metrics, the admin, the Tasks
backend) is imported where it is used, so a worker of a project without
it spends neither the memory of its modules nor their import time. Sizes
are the benchmark's (``benchmarks/vellum.py``, ``footprint`` and
``idle``); this test names the modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.support.processes import ROOT

pytestmark = [pytest.mark.runjobs, pytest.mark.django_db(transaction=True)]


def test_a_worker_imports_no_optional_part_its_project_does_not_use():
    env = {
        **os.environ,
        "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "VELLUM_TEST_LEASE": "60s",
    }
    env.pop("VELLUM_TEST_SPANS", None)
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    command = [sys.executable, "-m", "tests.support.footprint"]
    process = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    report = json.loads(process.stdout.splitlines()[-1])
    assert report["jobs"] == [
        ["footprint.add", "done", 5],
        ["footprint.add", "done", 2],
        ["footprint.add", "done", 4],
        ["footprint.fail", "failed", None],
    ]
    assert report["imported"] == []
