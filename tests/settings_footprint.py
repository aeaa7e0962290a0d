"""Test settings of a project that uses none of vellum-jobs' optional parts (``tests.support.footprint``).

No admin, no schedules, no Tasks backend and no app with jobs: the script registers its own sync jobs.
"""

from __future__ import annotations

from tests import settings
from tests.settings import *  # noqa: F403

INSTALLED_APPS = ["django.contrib.contenttypes", "vellum_jobs"]
ROOT_URLCONF = ""  # no URLs: the system checks import none
TASKS = {}
VELLUM_JOBS = {**settings.VELLUM_JOBS, "SCHEDULES": {}}
