"""The core installed alone: Django and croniter, no database driver, no optional extra, ``DEBUG=False``.

``pip install vellum-jobs`` on SQLite is the default install. A fresh process
here cannot import psycopg, psycopg2, mysqlclient, OpenTelemetry or
prometheus_client, and still enqueues, runs jobs (a chain and a batch too)
and reports on them. The tox cell ``py311-dj52-sqlite`` installs the package without extras and runs
the whole SQLite suite that way (``VELLUM_BARE_INSTALL``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.support.processes import ROOT

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="the bare install's database is SQLite")

# The packages the core must not need: the drivers of the other databases and the optional extras.
OPTIONAL = ("psycopg", "psycopg2", "MySQLdb", "opentelemetry", "prometheus_client")

WITHOUT_OPTIONAL_PACKAGES = textwrap.dedent(
    """
    import json, sys

    OPTIONAL = {optional!r}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in OPTIONAL:
                raise ModuleNotFoundError(f"No module named {{name!r}}")

    sys.meta_path.insert(0, Blocker())
    import django
    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from vellum_jobs import batch, chain, enqueue
    from vellum_jobs.core.models import Job
    from tests.testapp import jobs

    assert settings.DEBUG is False
    call_command("migrate", verbosity=0)
    one = jobs.add.enqueue(2, 3)
    many = jobs.add.enqueue_many([{{"a": i, "b": i}} for i in range(3)])
    by_name = enqueue("test.add", 4, 5)
    flow = chain(jobs.add.s(2, 3), jobs.double.s()).enqueue()
    with batch(on_done=jobs.counts.s(label="bare")) as nightly:
        jobs.add.enqueue_many([[1, 1], [2, 2]])
    call_command("runjobs", "--burst", "--workers", "2", verbosity=0)
    call_command("jobstats", "--json", stdout=open("/dev/null", "w"))
    ids = [one.pk, by_name.pk, *(j.pk for j in many)]
    print(json.dumps({{
        "jobs": list(Job.objects.filter(pk__in=ids).order_by("pk").values_list("state", "result")),
        "chain": [j.result for j in flow.steps()],
        "batch": nightly.steps().get(name="wf.counts").result,
        "imported": sorted({{m.partition(".")[0] for m in sys.modules}} & set(OPTIONAL)),
    }}))
    """
)


def test_enqueue_and_runjobs_work_with_no_driver_or_extra_installed(tmp_path: Path):
    """On today's SQLite default, an enqueue must not import Django's PostgreSQL module (and so psycopg)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "VELLUM_TEST_DB": "sqlite",
        "VELLUM_TEST_DB_NAME": str(tmp_path / "bare.sqlite3"),
    }
    code = WITHOUT_OPTIONAL_PACKAGES.format(optional=OPTIONAL)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["imported"] == []
    assert report["jobs"] == [["done", 5], ["done", 0], ["done", 2], ["done", 4], ["done", 9]]
    assert report["chain"] == [5, 10]
    assert report["batch"] == {"label": "bare", "total": 2, "done": 2, "failed": 0, "cancelled": 0}


@pytest.mark.skipif(not os.environ.get("VELLUM_BARE_INSTALL"), reason="only the bare cell lacks the extras")
def test_the_bare_cell_really_has_no_driver_or_extra():
    """The cell that proves the bare install must not regain a driver through some other dependency."""
    assert [name for name in OPTIONAL if importlib.util.find_spec(name) is not None] == []
    assert settings.DEBUG is False
